// The rules every generation request meets, in one place for Session, the
// Scheduler and the benchmark: what a request must be (validate_request) and
// whether the machine's memory can hold the engine that runs it
// (check_engine_memory).
#pragma once

#include <cstdint>
#include <vector>

#include "phaselab/backend.h"
#include "phaselab/memory.h"
#include "phaselab/model.h"
#include "phaselab/session.h"
#include "phaselab/status.h"

namespace phaselab {

// The context a request may use: n_ctx <= 0 takes the model's trained
// context, capped at 4096; more than the model was trained for is refused.
Result<int> resolve_context(const ModelConfig& c, int n_ctx);

// A request the loop can run: a non-empty prompt of ids in the vocabulary
// that leaves room for at least one token in n_ctx, a token limit of at
// least 1, valid sampling parameters, logprobs in range and not with a
// draft (speculative verification does not compute them).
Status validate_request(const ModelConfig& c, int n_ctx, const std::vector<int32_t>& prompt, const GenerateOptions& opt);

// The memory an engine needs, refused with the numbers (check_memory)
// before anything large is allocated: the weights, kv_bytes of K/V (from
// KvPool::bytes_for or KvCache::bytes_for), and the work buffers of a pass
// of backend.max_batch() tokens plus one logits row per sequence.
Status check_engine_memory(const Model& model, const Backend& backend, uint64_t kv_bytes, int max_seqs);
// What check_engine_memory counts, from the numbers alone (the Get Models
// estimate has a model's header, not a loaded model): weight_bytes as
// Model::weight_bytes(), passes of max_batch tokens.
MemoryNeed engine_memory_need(const ModelConfig& c, uint64_t weight_bytes, uint64_t kv_bytes, int max_batch,
                              int max_seqs);

}  // namespace phaselab
