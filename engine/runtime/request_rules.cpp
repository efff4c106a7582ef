#include "request_rules.h"

#include <algorithm>
#include <string>

#include "phaselab/memory.h"

namespace phaselab {

Result<int> resolve_context(const ModelConfig& c, int n_ctx) {
  if (n_ctx <= 0) n_ctx = std::min(c.n_ctx_train, 4096);
  if (n_ctx > c.n_ctx_train)
    return invalid_argument("context size " + std::to_string(n_ctx) + " exceeds the " + std::to_string(c.n_ctx_train) +
                            " tokens the model was trained for");
  return n_ctx;
}

Status validate_request(const ModelConfig& c, int n_ctx, const std::vector<int32_t>& prompt, const GenerateOptions& opt) {
  if (prompt.empty()) return invalid_argument("the prompt is empty (nothing to continue from)");
  if (opt.n_predict < 1) return invalid_argument("the token limit must be at least 1");
  PHASELAB_TRY(opt.sampling.validate(c.n_vocab));
  if (opt.logprobs < -1 || opt.logprobs > kMaxTopLogprobs)
    return invalid_argument("logprobs must be -1 (none) or from 0 to " + std::to_string(kMaxTopLogprobs) +
                            " alternatives (got " + std::to_string(opt.logprobs) + ")");
  // Verification picks tokens from rows of a multi-token pass; their
  // log-probabilities are not wired through it.
  if (opt.logprobs >= 0 && opt.draft && opt.use_kv_cache)
    return invalid_argument("logprobs are not computed with speculative decoding: turn the draft off");
  const int n_prompt = static_cast<int>(prompt.size());
  if (n_prompt >= n_ctx)
    return Status(StatusCode::context_full, "the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                                                std::to_string(n_ctx) + ": shorten it or raise the context size");
  for (int32_t t : prompt)
    if (t < 0 || t >= c.n_vocab) return invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary");
  return Status::ok();
}

MemoryNeed engine_memory_need(const ModelConfig& c, uint64_t weight_bytes, uint64_t kv_bytes, int max_batch,
                              int max_seqs) {
  MemoryNeed need;
  need.weights = weight_bytes;
  need.kv = kv_bytes;
  // A pass's activations (hidden states, FFN, attention scratch) for
  // max_batch rows; the logits of the rows that want them, a sequence's
  // last row or a verified draft's k + 1 (kMaxSpecK + 1 at most; perplexity
  // checks its own); and per sequence kSamplingRows vocabulary-long rows
  // for sampling (its logits, the sampler's (logit, id) candidates).
  constexpr uint64_t kSamplingRows = 3;
  const uint64_t logit_rows =
      std::min<uint64_t>(static_cast<uint64_t>(max_batch), static_cast<uint64_t>(max_seqs) * (kMaxSpecK + 1));
  need.work = static_cast<uint64_t>(max_batch) * (4ull * c.n_ff + 8ull * c.n_embd) * sizeof(float) +
              (logit_rows + kSamplingRows * static_cast<uint64_t>(max_seqs)) * c.n_vocab * sizeof(float);
  return need;
}

Status check_engine_memory(const Model& model, const Backend& backend, uint64_t kv_bytes, int max_seqs) {
  return check_memory(engine_memory_need(model.config(), model.weight_bytes(), kv_bytes, backend.max_batch(), max_seqs),
                      available_memory_bytes());
}

}  // namespace phaselab
