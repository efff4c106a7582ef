// make_backend: a kind and its switches -> a backend, with the CUDA-to-CPU
// fallback decided here for every front end. backend_options_from_environment
// is the only reader of the backends' PHASELAB_* variables.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "phaselab/backend.h"
#include "phaselab/machine.h"

namespace phaselab {

namespace {

// The variable's value; null when unset.
const char* env(const char* name) { return std::getenv(name); }

// Set to anything but "0": on; "0": off; unset: fallback.
bool env_flag(const char* name, bool fallback) {
  const char* v = env(name);
  return v ? std::strcmp(v, "0") != 0 : fallback;
}

}  // namespace

BackendOptions backend_options_from_environment() {
  BackendOptions o;
  if (const char* v = env("PHASELAB_CPU_ISA")) o.cpu.isa_cap = v;
  o.cpu.repack = env_flag("PHASELAB_CPU_REPACK", o.cpu.repack);
  o.cuda.graphs = env_flag("PHASELAB_CUDA_GRAPHS", o.cuda.graphs);
  o.cuda.tiled_attention = env_flag("PHASELAB_CUDA_ATTN_TILED", o.cuda.tiled_attention);
  // A positive number of rows; anything else keeps the default.
  if (const char* v = env("PHASELAB_CUDA_GEMM_MIN"); v && std::atoi(v) > 0) o.cuda.gemm_min_rows = std::atoi(v);
  // PHASELAB_CUDA_PROFILE=1 turns profiling on (unset or "0": off).
  o.cuda.profile = env_flag("PHASELAB_CUDA_PROFILE", false);
  if (const char* v = env("PHASELAB_CUDA_LIB"); v && *v) o.cuda.library = v;
  return o;
}

const std::vector<std::string>& backend_kinds() {
  static const std::vector<std::string> kinds = {"cpu", "cpu-portable", "cpu-reference", "cuda"};
  return kinds;
}

Result<BackendChoice> make_backend(std::shared_ptr<const Model> model, const BackendOptions& opt) {
  const auto& kinds = backend_kinds();
  if (std::find(kinds.begin(), kinds.end(), opt.kind) == kinds.end())
    return invalid_argument("unknown backend '" + opt.kind + "' (available: cpu, cpu-portable, cpu-reference, cuda)");
  const int threads = opt.n_threads > 0 ? opt.n_threads : default_thread_count();
  BackendChoice c;
  Result<std::unique_ptr<Backend>> b = invalid_argument("no backend");
  if (opt.kind == "cuda") {
    b = make_cuda_backend(model, opt.max_batch);  // TODO(merge): pass opt.cuda
    if (!b && opt.fallback) {
      c.fallback_reason = b.status().message();
      b = make_cpu_backend(std::move(model), threads, opt.max_batch, false, opt.cpu);
    }
  } else if (opt.kind == "cpu-reference") {
    b = make_cpu_reference_backend(std::move(model), threads, opt.max_batch);
  } else {
    b = make_cpu_backend(std::move(model), threads, opt.max_batch, opt.kind == "cpu-portable", opt.cpu);
  }
  if (!b) return b.status();
  c.backend = std::move(*b);
  return c;
}

}  // namespace phaselab
