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
// The parameters a token uses: of a mixture of experts' 3-D expert tensors
// only the n_expert_used experts' share ("30B-A3B": 3B active); the
// parameter count for a dense model.
uint64_t active_parameter_count(const Model& model);
// 2 operations per weight of the blocks' matrices, of the experts only the
// used ones': the work of one prompt token (only a prompt's last token goes
// through the output matrix).
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
  // The tokens of one pass the rate was counted in: for decode the tokens a
  // target pass yields (1 without speculation), for prefill the prompt
  // tokens of a pass (on average, where the prompt took several).
  double tokens_per_pass = 1;
  // Prefill: the tokens per pass from which a pass is compute-bound on this
  // machine (the machine balance, prefill_balance_tokens); 0: a peak is unknown.
  double balance_tokens = 0;
};

// Target passes per second: tokens/s over the tokens each pass yields
// (RequestMetrics::tokens_per_pass). Below 1 (not counted yet, or no
// speculation) a pass is one token: every pass yields at least one.
double target_passes_per_s(double tokens_per_s, double tokens_per_pass);
// Decode with the KV cache reads every weight (and the K/V it attends to)
// once per target pass, whatever the pass yields: bytes_per_pass x passes/s
// over the read bandwidth. Without speculation a pass yields one token; with
// speculative decoding (prompt lookup, a draft model) one pass verifies the
// drafts and yields tokens_per_pass tokens, so counting tokens instead would
// put a run of 3.67 tokens per pass at 3.67 times the bandwidth it used.
PhaseLoad decode_load(double bytes_per_pass, double tokens_per_s, double tokens_per_pass, double read_bytes_per_s);
// Decode without the KV cache recomputes every position at each step:
// ops_per_token x positions x tokens/s over the compute peak.
PhaseLoad recompute_load(double ops_per_token, double positions, double tokens_per_s, const ComputePeak& peak);
// The positions those steps recompute: step k of an answer recomputes
// n_prompt + k, so the latest step's count for a recent rate, and the
// average over the answer (n_prompt + n_generated / 2) for a finished one.
double recomputed_positions(int n_prompt, int n_generated, bool finished);

// ---- Prefill's roofline ----

// A pass of n prompt tokens reads every weight once and does n x
// ops_per_token of work, so it takes at least
//   max(weight_bytes / read bandwidth, n x ops_per_token / compute peak).
// The two are equal at the machine balance: passes of fewer tokens are
// memory-bound (a short prompt cannot reach the compute peak), longer ones
// compute-bound. 0 when a figure is unknown.
double prefill_balance_tokens(double weight_bytes, double ops_per_token, double read_bytes_per_s,
                              const ComputePeak& peak);

// One prefill as measured.
struct PrefillRun {
  double ops_per_token = 0;  // prefill_ops_per_token()
  double weight_bytes = 0;   // Model::active_weight_bytes(): read once by every pass
  int n_tokens = 0;          // prompt tokens computed (reused ones excluded); 0: unknown
  int max_pass_tokens = 0;   // the backend's max_batch(): a longer prompt takes several passes; 0: one pass
  double tokens_per_s = 0;   // the measured rate (RequestMetrics::prefill_tps)
};
// The tokens of each pass, on average: n_tokens over ceil(n_tokens / max_pass_tokens).
double prefill_tokens_per_pass(const PrefillRun& run);
// The prefill against the bound that applies to its passes: below the
// balance the weights read per second (weight_bytes x passes/s) over the
// read bandwidth, from it on ops_per_token x tokens/s over the compute peak.
// So the fraction is of the rate this machine can reach for passes of this
// length, not of a compute peak an 11-token prompt never could. Without a
// bandwidth (or a token count) it is held against the compute peak, as
// before the roofline was known. tokens_per_pass and balance_tokens say
// what was divided.
PhaseLoad prefill_load(const PrefillRun& run, const ComputePeak& peak, double read_bytes_per_s);

}  // namespace phaselab
