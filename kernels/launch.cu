// Whether the kernels' launches let each one start before the previous one
// ends (programmatic dependent launch: common.cuh, grid_dependency_sync).

#include <cstdlib>
#include <cstring>

#include "common.cuh"

namespace phaselab::cuda {

bool dependent_launch_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("PHASELAB_CUDA_PDL");
    if (env && std::strcmp(env, "0") == 0) return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      (void)cudaGetLastError();  // (not this launch's error)
      return false;
    }
    return major >= 9;
  }();
  return enabled;
}

}  // namespace phaselab::cuda
