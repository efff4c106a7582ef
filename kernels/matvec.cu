#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {
constexpr int kMaxTokens = 8;
constexpr int kRowsPerBlock = 4;  // one warp per row

// Lane l dequantizes sub-blocks l, l+32, ... of its warp's row once and uses
// them for every token of the chunk.
__global__ void matvec_kernel(const uint8_t* w, TensorType type, size_t row_bytes, int n_in, int n_out,
                              const float* x, int T, float* out) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_out) return;
  const uint8_t* wr = w + static_cast<size_t>(row) * row_bytes;
  float acc[kMaxTokens];
  for (int t = 0; t < kMaxTokens; t++) acc[t] = 0.f;
  float v[32];
  for (int sb = lane; sb < n_in / 32; sb += 32) {
    dequant_sub32(type, wr, sb, v);
    for (int t = 0; t < T; t++) {
      const float* xt = x + static_cast<size_t>(t) * n_in + sb * 32;
      float s = 0.f;
      for (int i = 0; i < 32; i++) s += v[i] * xt[i];
      acc[t] += s;
    }
  }
  // Float rows (F32/F16/BF16) may end in n_in % 32 values outside any
  // sub-block (block formats never do).
  for (int i = n_in / 32 * 32 + lane; i < n_in; i += 32) {
    const float wv = load_float_weight(type, wr, i);
    for (int t = 0; t < T; t++) acc[t] += wv * x[static_cast<size_t>(t) * n_in + i];
  }
  for (int t = 0; t < T; t++) {
    const float r = warp_sum(acc[t]);
    if (lane == 0) out[static_cast<size_t>(t) * n_out + row] = r;
  }
}
}  // namespace

cudaError_t launch_matvec(const uint8_t* w, TensorType type, size_t row_bytes, int n_in, int n_out, const float* x,
                          int T, float* out, cudaStream_t s) {
  const unsigned blocks = (n_out + kRowsPerBlock - 1) / kRowsPerBlock;
  for (int t0 = 0; t0 < T; t0 += kMaxTokens) {
    const int n = T - t0 < kMaxTokens ? T - t0 : kMaxTokens;
    matvec_kernel<<<blocks, 32 * kRowsPerBlock, 0, s>>>(w, type, row_bytes, n_in, n_out, x + static_cast<size_t>(t0) * n_in,
                                                        n, out + static_cast<size_t>(t0) * n_out);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace phaselab::cuda
