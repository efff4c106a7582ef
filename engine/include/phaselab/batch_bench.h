// Throughput against batch size, llama-batched-bench style: B sequences of
// n_prompt random tokens are prefilled together, then decode n_gen tokens
// each, all B in every pass. Aggregate tokens/s rises with B while decode
// reads the weights once per pass for all B tokens, until the pass turns
// compute-bound; each sequence's time per token grows meanwhile.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "phaselab/backend.h"
#include "phaselab/kv_cache.h"
#include "phaselab/metrics.h"
#include "phaselab/model.h"
#include "phaselab/status.h"

namespace phaselab {

struct BatchBenchPoint {
  int batch = 0, n_prompt = 0, n_gen = 0;
  double prefill_ms = 0, decode_ms = 0;
  double pp_tps = 0;   // aggregate prefill tokens/s: batch * n_prompt / prefill time
  double tg_tps = 0;   // aggregate decode tokens/s: batch * n_gen / decode time
  double tpot_ms = 0;  // each sequence's time per output token: decode time / n_gen
  double kv_mib = 0;   // the pool the run used
};

// Runs one batch size on backend (its max_batch() bounds the tokens of one
// pass: prefill goes in passes of up to that many tokens, so batch must be at
// most max_batch()). Random prompts from seed; greedy decoding.
Result<BatchBenchPoint> bench_batch(Backend& backend, const Model& model, int batch, int n_prompt, int n_gen,
                                    uint64_t seed = 42, const std::atomic<bool>* cancel = nullptr,
                                    KvType kv_type = KvType::f16);

// The batch size where decode stops being bandwidth-bound (the roofline's
// ridge): reading the weights once takes weight_bytes / read_bytes_per_s; B
// tokens of compute take B * ops_per_token / ops_per_s. 0 when a figure is
// missing.
double decode_ridge_batch(double weight_bytes, double read_bytes_per_s, double ops_per_token, double ops_per_s);

// Batched decode's roofline on a machine: the weights are read once per
// pass, each token costs decode_ops_per_token (phaselab/metrics.h) at the
// compute peak compute_peak() chooses for the backend.
struct DecodeRoofline {
  double weight_bytes = 0, ops_per_token = 0;
  double read_bytes_per_s = 0, ops_per_s = 0;
  bool int8 = false;
  double ridge_batch = 0;  // 0: a peak is unknown (e.g. on CUDA)
  // Aggregate decode tokens/s at batch b if reading the weights once per pass
  // were the only cost, capped by the compute roof.
  double ceiling_tps(double b) const;
  double compute_ceiling_tps() const { return ops_per_token > 0 ? ops_per_s / ops_per_token : 0; }
  ComputePeak peak() const { return {ops_per_s, int8}; }  // its name and units
  // The bandwidth of reading the weights once per pass at this time per
  // output token (GB/s).
  double weights_gbps(double tpot_ms) const { return tpot_ms > 0 ? 1000.0 / tpot_ms * weight_bytes / 1e9 : 0; }
};
DecodeRoofline decode_roofline(const Model& model, const std::string& backend_name, double read_bytes_per_s,
                               double int8_ops_per_s, double fp32_flops);

// "1,2,4,8": batch sizes from 1 to 4096, sorted, each once; the error says
// what a list looks like.
Result<std::vector<int>> parse_batch_sizes(std::string_view text);

}  // namespace phaselab
