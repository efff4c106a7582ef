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

// x += y' (y' = rmsnorm(y) * post_w, or y itself without post_w), then
// out = rmsnorm(x) * w. Each thread reads back only the x values it wrote.
__global__ void add_rmsnorm_kernel(float* x, const float* y, const float* post_w, const float* w, float* out, int n,
                                   float eps) {
  __shared__ float shared[32];
  float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  const float* yr = y + static_cast<size_t>(blockIdx.x) * n;
  float* orow = out + static_cast<size_t>(blockIdx.x) * n;
  float ys = 1.f;
  if (post_w) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += yr[i] * yr[i];
    ys = rsqrtf(block_sum(ss, shared) / n + eps);
  }
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float xi = xr[i] + (post_w ? yr[i] * ys * post_w[i] : yr[i]);
    xr[i] = xi;
    ss += xi * xi;
  }
  const float scale = rsqrtf(block_sum(ss, shared) / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) orow[i] = xr[i] * scale * w[i];
}
}  // namespace

cudaError_t launch_add_rmsnorm(float* x, const float* y, const float* post_w, const float* w, float* out, int rows,
                               int n, float eps, cudaStream_t s) {
  PHASELAB_LAUNCH(add_rmsnorm_kernel, rows, 256, 0, s)(x, y, post_w, w, out, n, eps);
  return cudaGetLastError();
}

cudaError_t launch_rmsnorm(const float* x, const float* w, float* out, int rows, int n, float eps, cudaStream_t s) {
  PHASELAB_LAUNCH(rmsnorm_kernel, rows, 256, 0, s)(x, w, out, n, eps);
  return cudaGetLastError();
}

}  // namespace phaselab::cuda
