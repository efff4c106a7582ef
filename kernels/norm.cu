#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {
__global__ void rmsnorm_kernel(const float* x, const float* w, float* out, int n, float eps) {
  __shared__ float shared[32];
  const float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  float* orow = out + static_cast<size_t>(blockIdx.x) * n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, shared);
  const float scale = rsqrtf(ss / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) orow[i] = xr[i] * scale * w[i];
}
}  // namespace

cudaError_t launch_rmsnorm(const float* x, const float* w, float* out, int rows, int n, float eps, cudaStream_t s) {
  rmsnorm_kernel<<<rows, 256, 0, s>>>(x, w, out, n, eps);
  return cudaGetLastError();
}

}  // namespace phaselab::cuda
