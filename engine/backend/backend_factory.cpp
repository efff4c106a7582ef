#include <algorithm>

#include "phaselab/backend.h"
#include "phaselab/machine.h"

namespace phaselab {

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
    b = make_cuda_backend(model, opt.max_batch);
    if (!b && opt.fallback) {
      c.fallback_reason = b.status().message();
      b = make_cpu_backend(std::move(model), threads, opt.max_batch);
    }
  } else if (opt.kind == "cpu-reference") {
    b = make_cpu_reference_backend(std::move(model), threads, opt.max_batch);
  } else {
    b = make_cpu_backend(std::move(model), threads, opt.max_batch, opt.kind == "cpu-portable");
  }
  if (!b) return b.status();
  c.backend = std::move(*b);
  return c;
}

}  // namespace phaselab
