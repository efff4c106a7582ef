#include "phaselab/metrics.h"

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
  for (const auto& t : model.file().tensors())
    if (t.name.rfind("blk.", 0) == 0 && t.n_dims == 2) ops += 2.0 * static_cast<double>(t.n_elements);
  return ops;
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
  return {achieved, peak, peak > 0 ? achieved / peak : 0.0, compute, int8};
}
}  // namespace

PhaseLoad decode_load(double bytes_per_token, double tokens_per_s, double read_bytes_per_s) {
  return divided(bytes_per_token * tokens_per_s, read_bytes_per_s, false, false);
}

PhaseLoad recompute_load(double ops_per_token, double positions, double tokens_per_s, const ComputePeak& peak) {
  return divided(ops_per_token * positions * tokens_per_s, peak.ops_per_s, true, peak.int8);
}

double recomputed_positions(int n_prompt, int n_generated, bool finished) {
  return n_prompt + (finished ? n_generated / 2.0 : n_generated);
}

PhaseLoad prefill_load(double ops_per_token, double tokens_per_s, const ComputePeak& peak) {
  return divided(ops_per_token * tokens_per_s, peak.ops_per_s, true, peak.int8);
}

}  // namespace phaselab
