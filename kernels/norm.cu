#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {
__global__ void rmsnorm_kernel(const float* x, const float* w, float* out, int n, float eps, int8_t* q8, float* q8d) {
  grid_dependency_sync();
  __shared__ float shared[32];
  const float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  float* orow = out + static_cast<size_t>(blockIdx.x) * n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, shared);
  const float scale = rsqrtf(ss / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float o = xr[i] * scale * w[i];
    orow[i] = o;
    if (q8) q8_store(o, q8, q8d, static_cast<size_t>(blockIdx.x) * n + i);  // (n % 32 == 0: whole warps)
  }
}

// x += y' (y' = rmsnorm(y) * post_w, or y itself without post_w), then
// out = rmsnorm(x) * w. Each thread reads back only the x values it wrote.
__global__ void add_rmsnorm_kernel(float* x, const float* y, const float* post_w, const float* w, float* out, int n,
                                   float eps, int8_t* q8, float* q8d) {
  grid_dependency_sync();
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
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float o = xr[i] * scale * w[i];
    orow[i] = o;
    if (q8) q8_store(o, q8, q8d, static_cast<size_t>(blockIdx.x) * n + i);  // (n % 32 == 0: whole warps)
  }
}

// The same two kernels with the row in registers (kPer values per thread,
// n <= kPer * blockDim): every load of the row issued at the start, so that
// a decoded token's norm waits on memory once rather than once per phase
// (the loop kernels above took 6.3-6.9 us for Gemma 3 270M's 640 values on
// an H200; the row's math is nothing).
template <int kPer>
__global__ void add_rmsnorm_reg_kernel(float* x, const float* y, const float* post_w, const float* w, float* out,
                                       int n, float eps, int8_t* q8, float* q8d) {
  grid_dependency_sync();
  __shared__ float shared[32];
  const size_t off = static_cast<size_t>(blockIdx.x) * n;
  add_rmsnorm_row<kPer>(x + off, y + off, post_w, w, out + off, n, eps, q8, q8d, off, shared);
}

template <int kPer>
__global__ void rmsnorm_reg_kernel(const float* x, const float* w, float* out, int n, float eps, int8_t* q8,
                                   float* q8d) {
  grid_dependency_sync();
  __shared__ float shared[32];
  const float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  float* orow = out + static_cast<size_t>(blockIdx.x) * n;
  float xv[kPer], wv[kPer];
#pragma unroll
  for (int k = 0; k < kPer; k++) {
    const int i = threadIdx.x + k * blockDim.x;
    xv[k] = i < n ? xr[i] : 0.f;
    wv[k] = i < n ? w[i] : 0.f;
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; k++) ss += xv[k] * xv[k];
  const float scale = rsqrtf(block_sum(ss, shared) / n + eps);
#pragma unroll
  for (int k = 0; k < kPer; k++) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i >= n) break;
    const float o = xv[k] * scale * wv[k];
    orow[i] = o;
    if (q8) q8_store(o, q8, q8d, static_cast<size_t>(blockIdx.x) * n + i);
  }
}

constexpr int kRegPer = 8;        // values per thread in the register kernels
// Their block: rows of up to 1024 values take 128 threads, as a matrix-
// vector product's tail does (matvec.cu: the same values, bitwise, whether
// a decoded token's norm is a tail or not, so that batched passes equal solo
// ones); up to 2048, 256.
constexpr int kRegThreadsNarrow = 128;
constexpr int kRegThreads = 256;
constexpr int kRegThreadsWide = 1024;  // ... or of up to 8192

// The 8-bit copy's arguments, or null ones (none wanted); false where it
// cannot be made.
bool q8_args(Q8Act q8, int rows, int n, int8_t** q, float** d) {
  *q = nullptr;
  *d = nullptr;
  if (!q8.q) return true;
  if (n % 32 != 0 || static_cast<size_t>(rows) * n > q8.cap) return false;
  *q = q8.q;
  *d = q8.d;
  return true;
}
}  // namespace

cudaError_t launch_add_rmsnorm(float* x, const float* y, const float* post_w, const float* w, float* out, int rows,
                               int n, float eps, cudaStream_t s, Q8Act q8_out) {
  int8_t* q;
  float* d;
  if (!q8_args(q8_out, rows, n, &q, &d)) return cudaErrorInvalidValue;
  if (n <= kRegPer * kRegThreadsWide) {
    const int threads = n <= kRegPer * kRegThreadsNarrow ? kRegThreadsNarrow
                        : n <= kRegPer * kRegThreads     ? kRegThreads
                                                         : kRegThreadsWide;
    PHASELAB_LAUNCH(add_rmsnorm_reg_kernel<kRegPer>, rows, threads, 0, s)(x, y, post_w, w, out, n, eps, q, d);
  } else {
    PHASELAB_LAUNCH(add_rmsnorm_kernel, rows, 256, 0, s)(x, y, post_w, w, out, n, eps, q, d);
  }
  return cudaGetLastError();
}

cudaError_t launch_rmsnorm(const float* x, const float* w, float* out, int rows, int n, float eps, cudaStream_t s,
                           Q8Act q8_out) {
  int8_t* q;
  float* d;
  if (!q8_args(q8_out, rows, n, &q, &d)) return cudaErrorInvalidValue;
  if (n <= kRegPer * kRegThreadsWide) {
    const int threads = n <= kRegPer * kRegThreads ? kRegThreads : kRegThreadsWide;
    PHASELAB_LAUNCH(rmsnorm_reg_kernel<kRegPer>, rows, threads, 0, s)(x, w, out, n, eps, q, d);
  } else {
    PHASELAB_LAUNCH(rmsnorm_kernel, rows, 256, 0, s)(x, w, out, n, eps, q, d);
  }
  return cudaGetLastError();
}

}  // namespace phaselab::cuda
