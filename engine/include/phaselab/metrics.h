// What a measured rate means on this machine: the work of one token, which
// compute peak a backend is held against, and the fraction of a peak a phase
// reaches. The engine decides all of it; bench, the batch sweep and the
// phase meter only display the results (each had computed its own copy).
#pragma once

#include <cstdint>
#include <string_view>

#include "phaselab/model.h"

namespace phaselab {

// ---- The two phases of a request ----

// Where a request is: its prompt being computed, its answer being decoded,
// or finished. to_string: "prefill" | "decode" | "done".
enum class Phase { prefill, decode, done };
const char* to_string(Phase p);

// ---- The work of a token ----

// Every element of the file's tensors: the parameter count a model card quotes.
uint64_t parameter_count(const Model& model);
// 2 operations per weight of the blocks' matrices: the work of one prompt
// token (only a prompt's last token goes through the output matrix).
double prefill_ops_per_token(const Model& model);
// A decoded token's work: the blocks' matrices and the output matrix (every
// decoded token needs its logits; with a 262k vocabulary that is most of it).
double decode_ops_per_token(const Model& model);

// ---- The compute peak a backend is held against ----

// The fast CPU backends multiply 8-bit activations by the quantized weights
// in integers; cpu-reference computes in FP32, and CUDA (BF16 GEMMs, FP32
// warp sums) is held against FP32 too.
bool multiplies_in_int8(std::string_view backend_name);

struct ComputePeak {
  double ops_per_s = 0;  // 0: not measured
  bool int8 = false;     // 8-bit integer multiply-adds (2 ops each); else FP32 FMAs (2 FLOPs each)
  const char* name() const { return int8 ? "int8" : "FP32"; }
  const char* unit() const { return int8 ? "GOP/s" : "GFLOP/s"; }  // of ops_per_s / 1e9
  const char* op() const { return int8 ? "OP" : "FLOP"; }
};
// The integer peak when the backend's kernels multiply in int8 and it was
// measured, else the FP32 peak. int8_or_fp32_peak takes the kernels' kind
// where the backend's name is gone (the phase meter keeps only that).
ComputePeak compute_peak(std::string_view backend_name, double int8_ops_per_s, double fp32_flops);
ComputePeak int8_or_fp32_peak(bool int8_kernels, double int8_ops_per_s, double fp32_flops);

// ---- A phase against its limit ----

// A measured rate over the peak it is divided by.
struct PhaseLoad {
  double achieved = 0;   // bytes/s (memory-bound) or ops/s (compute-bound)
  double peak = 0;       // what it is divided by; 0: unknown
  double fraction = 0;   // achieved / peak, 0 when the peak is unknown; above 1 means cache hits or a low peak
  bool compute = false;  // divided by a compute peak (else by read bandwidth)
  bool int8 = false;     // that compute peak is the int8 one
};
// Decode with the KV cache reads every weight (and the K/V it attends to)
// once per token: bytes_per_token x tokens/s over the read bandwidth.
PhaseLoad decode_load(double bytes_per_token, double tokens_per_s, double read_bytes_per_s);
// Decode without the KV cache recomputes every position at each step:
// ops_per_token x positions x tokens/s over the compute peak.
PhaseLoad recompute_load(double ops_per_token, double positions, double tokens_per_s, const ComputePeak& peak);
// The positions those steps recompute: step k of an answer recomputes
// n_prompt + k, so the latest step's count for a recent rate, and the
// average over the answer (n_prompt + n_generated / 2) for a finished one.
double recomputed_positions(int n_prompt, int n_generated, bool finished);
// Prefill reuses each weight row for a batch of tokens, so it is
// compute-bound: ops_per_token x tokens/s over the compute peak.
PhaseLoad prefill_load(double ops_per_token, double tokens_per_s, const ComputePeak& peak);

}  // namespace phaselab
