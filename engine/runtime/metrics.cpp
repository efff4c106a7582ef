#include "phaselab/metrics.h"

#include <algorithm>

namespace phaselab {

const char* to_string(Phase p) {
  switch (p) {
    case Phase::prefill: return "prefill";
    case Phase::decode: return "decode";
    case Phase::done: return "done";
  }
  return "done";
}

uint64_t parameter_count(const Model& model) {
  uint64_t n = 0;
  for (const auto& t : model.file().tensors()) n += t.n_elements;
  return n;
}

double prefill_ops_per_token(const Model& model) {
  double ops = 0;
  const ModelConfig& c = model.config();
  for (const auto& t : model.file().tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    // Matrices only (gpt-oss's expert biases are 2-D too: [width, n_expert]).
    if (t.name.size() < 7 || t.name.compare(t.name.size() - 7, 7, ".weight") != 0) continue;
    if (t.n_dims == 2) ops += 2.0 * static_cast<double>(t.n_elements);
    // A 3-D expert tensor: a token runs n_expert_used of its n_expert slices.
    if (t.n_dims == 3 && c.n_expert > 0)
      ops += 2.0 * static_cast<double>(t.n_elements) * c.n_expert_used / c.n_expert;
  }
  return ops;
}

uint64_t active_parameter_count(const Model& model) {
  const ModelConfig& c = model.config();
  uint64_t n = 0;
  for (const auto& t : model.file().tensors()) {
    // Per expert: the 3-D expert matrices and gpt-oss's expert biases ([width, n_expert]).
    const bool per_expert = c.n_expert > 0 && (t.n_dims == 3 || t.name.find("_exps.bias") != std::string::npos);
    n += per_expert ? t.n_elements / c.n_expert * c.n_expert_used : t.n_elements;
  }
  return n;
}

double decode_ops_per_token(const Model& model) {
  const ModelConfig& c = model.config();
  return prefill_ops_per_token(model) + 2.0 * static_cast<double>(c.n_vocab) * c.n_embd;
}

bool multiplies_in_int8(std::string_view backend_name) {
  return backend_name.rfind("cpu", 0) == 0 && backend_name != "cpu-reference";
}

ComputePeak int8_or_fp32_peak(bool int8_kernels, double int8_ops_per_s, double fp32_flops) {
  ComputePeak p;
  p.int8 = int8_kernels && int8_ops_per_s > 0;
  p.ops_per_s = p.int8 ? int8_ops_per_s : fp32_flops;
  return p;
}

ComputePeak compute_peak(std::string_view backend_name, double int8_ops_per_s, double fp32_flops) {
  return int8_or_fp32_peak(multiplies_in_int8(backend_name), int8_ops_per_s, fp32_flops);
}

namespace {
PhaseLoad divided(double achieved, double peak, bool compute, bool int8) {
  PhaseLoad l;
  l.achieved = achieved;
  l.peak = peak;
  l.fraction = peak > 0 ? achieved / peak : 0.0;
  l.compute = compute;
  l.int8 = int8;
  return l;
}
}  // namespace

double target_passes_per_s(double tokens_per_s, double tokens_per_pass) {
  return tokens_per_s / std::max(tokens_per_pass, 1.0);
}

PhaseLoad decode_load(double bytes_per_pass, double tokens_per_s, double tokens_per_pass, double read_bytes_per_s) {
  PhaseLoad l = divided(bytes_per_pass * target_passes_per_s(tokens_per_s, tokens_per_pass), read_bytes_per_s, false, false);
  l.tokens_per_pass = std::max(tokens_per_pass, 1.0);
  return l;
}

PhaseLoad recompute_load(double ops_per_token, double positions, double tokens_per_s, const ComputePeak& peak) {
  return divided(ops_per_token * positions * tokens_per_s, peak.ops_per_s, true, peak.int8);
}

double recomputed_positions(int n_prompt, int n_generated, bool finished) {
  return n_prompt + (finished ? n_generated / 2.0 : n_generated);
}

double prefill_balance_tokens(double weight_bytes, double ops_per_token, double read_bytes_per_s,
                              const ComputePeak& peak) {
  if (weight_bytes <= 0 || ops_per_token <= 0 || read_bytes_per_s <= 0 || peak.ops_per_s <= 0) return 0;
  // weight_bytes / bandwidth = n x ops_per_token / compute peak
  return weight_bytes / read_bytes_per_s * peak.ops_per_s / ops_per_token;
}

double prefill_tokens_per_pass(const PrefillRun& run) {
  if (run.n_tokens <= 0) return 0;
  if (run.max_pass_tokens <= 0 || run.n_tokens <= run.max_pass_tokens) return run.n_tokens;
  const int passes = (run.n_tokens + run.max_pass_tokens - 1) / run.max_pass_tokens;
  return static_cast<double>(run.n_tokens) / passes;
}

PhaseLoad prefill_load(const PrefillRun& run, const ComputePeak& peak, double read_bytes_per_s) {
  const double balance = prefill_balance_tokens(run.weight_bytes, run.ops_per_token, read_bytes_per_s, peak);
  const double per_pass = prefill_tokens_per_pass(run);
  // Passes of equal length are exact; unequal ones (a shorter last pass) are
  // held to passes of the mean length, which bounds their time from below
  // all the same (the maximum of two costs is convex in the tokens).
  const bool memory_bound = balance > 0 && per_pass > 0 && per_pass < balance;
  PhaseLoad l = memory_bound
                    ? divided(run.weight_bytes * run.tokens_per_s / per_pass, read_bytes_per_s, false, false)
                    : divided(run.ops_per_token * run.tokens_per_s, peak.ops_per_s, true, peak.int8);
  l.tokens_per_pass = per_pass;
  l.balance_tokens = balance;
  return l;
}

}  // namespace phaselab
