#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kMaxTopK = 64;

// The larger of two (value, index) pairs; ties go to the lower index.
__device__ __forceinline__ void keep_max(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

// Block-wide argmax over the x[i] of [0, n) that come after (below_v,
// below_i) in the order "larger value first, then lower index" (pass
// +inf, -1 for all of them): the k-th call finds the k-th largest.
__device__ void block_argmax(const float* x, int n, float below_v, int below_i, float* sv, int* si, float* v_out,
                             int* i_out) {
  float v = -INFINITY;
  int idx = n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float xi = x[i];
    if (xi < below_v || (xi == below_v && i > below_i)) keep_max(v, idx, xi, i);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    keep_max(v, idx, v2, i2);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? sv[lane] : -INFINITY;
    idx = lane < static_cast<int>(blockDim.x / 32) ? si[lane] : n;
    for (int o = 16; o > 0; o >>= 1) {
      const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
      const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
      keep_max(v, idx, v2, i2);
    }
    if (lane == 0) {
      *v_out = v;
      *i_out = idx;
    }
  }
  __syncthreads();
}

// One block per row of n values.
__global__ void argmax_kernel(const float* x, int n, int* out) {
  grid_dependency_sync();
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ float bv;
  __shared__ int bi;
  block_argmax(x + static_cast<size_t>(blockIdx.x) * n, n, INFINITY, -1, sv, si, &bv, &bi);
  if (threadIdx.x == 0) out[blockIdx.x] = bi < n ? bi : 0;  // all NaN: token 0, as on the CPU
}

// k passes of the block argmax (k is small), then the draw on one thread.
__global__ void top_k_kernel(const float* x, int n, int k, float temperature, float u, int* out) {
  grid_dependency_sync();
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ float top_v[kMaxTopK];
  __shared__ int top_i[kMaxTopK];
  for (int r = 0; r < k; r++)
    block_argmax(x, n, r ? top_v[r - 1] : INFINITY, r ? top_i[r - 1] : -1, sv, si, &top_v[r], &top_i[r]);
  if (threadIdx.x != 0) return;
  if (!(top_v[0] > -INFINITY)) {  // nothing finite to sample from
    *out = top_i[0] < n ? top_i[0] : 0;
    return;
  }
  const float inv_t = 1.f / fmaxf(temperature, 1e-6f);
  float sum = 0.f;
  for (int r = 0; r < k; r++) sum += expf((top_v[r] - top_v[0]) * inv_t);
  float c = 0.f;
  int pick = top_i[k - 1];
  for (int r = 0; r < k; r++) {
    c += expf((top_v[r] - top_v[0]) * inv_t) / sum;
    if (u < c) {
      pick = top_i[r];
      break;
    }
  }
  *out = pick;
}

}  // namespace

cudaError_t launch_argmax(const float* x, int n, int* out, cudaStream_t s) { return launch_argmax_rows(x, 1, n, out, s); }

cudaError_t launch_argmax_rows(const float* x, int n_rows, int n, int* out, cudaStream_t s) {
  if (n_rows < 1) return cudaSuccess;
  PHASELAB_LAUNCH(argmax_kernel, n_rows, kThreads, 0, s)(x, n, out);
  return cudaGetLastError();
}

cudaError_t launch_sample_top_k(const float* x, int n, int k, float temperature, float u, int* out, cudaStream_t s) {
  if (k < 1 || k > kMaxTopK || k > n) return cudaErrorInvalidValue;
  PHASELAB_LAUNCH(top_k_kernel, 1, kThreads, 0, s)(x, n, k, temperature, u, out);
  return cudaGetLastError();
}

}  // namespace phaselab::cuda
