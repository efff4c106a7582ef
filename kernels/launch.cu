// Whether the kernels' launches let each one start before the previous one
// ends (programmatic dependent launch: common.cuh, grid_dependency_sync).

#include <cstdlib>
#include <cstring>

#include "common.cuh"

namespace phaselab::cuda {

namespace {
// Compiled like every kernel of the library: its binary's version is the
// one the GPU runs (an sm_90 build's griddepcontrol, or PTX of an older
// architecture, which has none).
__global__ void dependent_launch_probe_kernel() {}
}  // namespace

// Only where the kernels the GPU runs wait (code built for 9.0 or later:
// a build for older architectures alone, run on Hopper, has no
// griddepcontrol.wait, and its kernels would race with their predecessors)
// and the runtime and driver take the attribute in graphs (12.3 or later).
bool dependent_launch_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("PHASELAB_CUDA_PDL");
    if (env && std::strcmp(env, "0") == 0) return false;
    int dev = 0, major = 0, runtime = 0, driver = 0;
    cudaFuncAttributes fa{};
    const bool ok = cudaGetDevice(&dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaRuntimeGetVersion(&runtime) == cudaSuccess && cudaDriverGetVersion(&driver) == cudaSuccess &&
                    cudaFuncGetAttributes(&fa, dependent_launch_probe_kernel) == cudaSuccess;
    if (!ok) {
      (void)cudaGetLastError();  // (not a launch's error)
      return false;
    }
    return major >= 9 && fa.binaryVersion >= 90 && runtime >= 12030 && driver >= 12030;
  }();
  return enabled;
}

}  // namespace phaselab::cuda
