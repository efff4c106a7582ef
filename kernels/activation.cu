#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {
__global__ void gated_act_kernel(float* g, const float* u, size_t n, bool gelu) {
  grid_dependency_sync();
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  g[i] = (gelu ? gelu_tanh(g[i]) : silu(g[i])) * u[i];
}
__global__ void add_bias_kernel(float* x, const float* b, int n, size_t total) {
  grid_dependency_sync();
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < total) x[i] += b[i % n];
}
__global__ void softcap_kernel(float* y, size_t n, float cap) {
  grid_dependency_sync();
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = cap * tanhf(y[i] / cap);
}
unsigned blocks_for(size_t n) { return static_cast<unsigned>((n + 255) / 256); }
}  // namespace

cudaError_t launch_gated_act(float* g, const float* u, size_t n, bool gelu, cudaStream_t s) {
  PHASELAB_LAUNCH(gated_act_kernel, blocks_for(n), 256, 0, s)(g, u, n, gelu);
  return cudaGetLastError();
}
cudaError_t launch_add_bias(float* x, const float* b, int T, int n, cudaStream_t s) {
  const size_t total = static_cast<size_t>(T) * n;
  PHASELAB_LAUNCH(add_bias_kernel, blocks_for(total), 256, 0, s)(x, b, n, total);
  return cudaGetLastError();
}
cudaError_t launch_softcap(float* y, size_t n, float cap, cudaStream_t s) {
  PHASELAB_LAUNCH(softcap_kernel, blocks_for(n), 256, 0, s)(y, n, cap);
  return cudaGetLastError();
}

}  // namespace phaselab::cuda
