#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {
constexpr int kMaxTokens = 8;
constexpr int kRowsPerBlock = 4;  // one warp per row

// Lane l's part of the dot products of one weight row with T <= kMaxTokens
// rows of x: it dequantizes sub-blocks l, l+32, ... once and uses them for
// every token. acc[t] += the lane's share (summed across the warp later).
__device__ __forceinline__ void row_partials(const uint8_t* wr, TensorType type, int n_in, const float* x, int T,
                                             int lane, float* acc) {
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
}

// One warp per output row.
__global__ void matvec_kernel(const uint8_t* w, TensorType type, size_t row_bytes, int n_in, int n_out,
                              const float* x, int T, float* out) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_out) return;
  float acc[kMaxTokens];
  for (int t = 0; t < kMaxTokens; t++) acc[t] = 0.f;
  row_partials(w + static_cast<size_t>(row) * row_bytes, type, n_in, x, T, lane, acc);
  for (int t = 0; t < T; t++) {
    const float r = warp_sum(acc[t]);
    if (lane == 0) out[static_cast<size_t>(t) * n_out + row] = r;
  }
}

// Up to three matrices with the same input in one launch (Q, K and V):
// the warps take the rows of a, then b, then c.
__global__ void matvec3_kernel(MatvecOut a, MatvecOut b, MatvecOut c, int n_in, const float* x, int T) {
  int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  MatvecOut m = a;
  if (row >= a.n_out) {
    row -= a.n_out;
    m = b;
    if (row >= b.n_out) {
      row -= b.n_out;
      m = c;
      if (row >= c.n_out) return;
    }
  }
  float acc[kMaxTokens];
  for (int t = 0; t < kMaxTokens; t++) acc[t] = 0.f;
  row_partials(m.w + static_cast<size_t>(row) * m.row_bytes, m.type, n_in, x, T, lane, acc);
  for (int t = 0; t < T; t++) {
    const float r = warp_sum(acc[t]);
    if (lane == 0) m.out[static_cast<size_t>(t) * m.n_out + row] = r;
  }
}

// The gate and up rows r of a gated feed-forward in one warp:
// out[t, r] = act(gate_r . x_t) * (up_r . x_t).
__global__ void gated_matvec_kernel(const uint8_t* wg, TensorType tg, size_t rbg, const uint8_t* wu, TensorType tu,
                                    size_t rbu, int n_in, int n_out, const float* x, int T, bool gelu, float* out) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_out) return;
  float ag[kMaxTokens], au[kMaxTokens];
  for (int t = 0; t < kMaxTokens; t++) ag[t] = au[t] = 0.f;
  row_partials(wg + static_cast<size_t>(row) * rbg, tg, n_in, x, T, lane, ag);
  row_partials(wu + static_cast<size_t>(row) * rbu, tu, n_in, x, T, lane, au);
  for (int t = 0; t < T; t++) {
    const float g = warp_sum(ag[t]), u = warp_sum(au[t]);
    if (lane == 0) out[static_cast<size_t>(t) * n_out + row] = (gelu ? gelu_tanh(g) : silu(g)) * u;
  }
}
}  // namespace

cudaError_t launch_matvec(const uint8_t* w, TensorType type, size_t row_bytes, int n_in, int n_out, const float* x,
                          int T, float* out, cudaStream_t s) {
  const unsigned blocks = (n_out + kRowsPerBlock - 1) / kRowsPerBlock;
  for (int t0 = 0; t0 < T; t0 += kMaxTokens) {
    const int n = T - t0 < kMaxTokens ? T - t0 : kMaxTokens;
    PHASELAB_LAUNCH(matvec_kernel, blocks, 32 * kRowsPerBlock, 0, s)(w, type, row_bytes, n_in, n_out, x + static_cast<size_t>(t0) * n_in,
                                                        n, out + static_cast<size_t>(t0) * n_out);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t launch_matvec3(MatvecOut a, MatvecOut b, MatvecOut c, int n_in, const float* x, int T, cudaStream_t s) {
  const int rows = a.n_out + b.n_out + c.n_out;
  const unsigned blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  for (int t0 = 0; t0 < T; t0 += kMaxTokens) {
    const int n = T - t0 < kMaxTokens ? T - t0 : kMaxTokens;
    MatvecOut a2 = a, b2 = b, c2 = c;
    a2.out += static_cast<size_t>(t0) * a.n_out;
    b2.out += static_cast<size_t>(t0) * b.n_out;
    c2.out += static_cast<size_t>(t0) * c.n_out;
    PHASELAB_LAUNCH(matvec3_kernel, blocks, 32 * kRowsPerBlock, 0, s)(a2, b2, c2, n_in, x + static_cast<size_t>(t0) * n_in, n);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t launch_matvec_gated(const uint8_t* w_gate, TensorType gate_type, size_t gate_row_bytes, const uint8_t* w_up,
                                TensorType up_type, size_t up_row_bytes, int n_in, int n_out, const float* x, int T,
                                bool gelu, float* out, cudaStream_t s) {
  const unsigned blocks = (n_out + kRowsPerBlock - 1) / kRowsPerBlock;
  for (int t0 = 0; t0 < T; t0 += kMaxTokens) {
    const int n = T - t0 < kMaxTokens ? T - t0 : kMaxTokens;
    PHASELAB_LAUNCH(gated_matvec_kernel, blocks, 32 * kRowsPerBlock, 0, s)(w_gate, gate_type, gate_row_bytes, w_up, up_type,
                                                              up_row_bytes, n_in, n_out,
                                                              x + static_cast<size_t>(t0) * n_in, n, gelu,
                                                              out + static_cast<size_t>(t0) * n_out);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace phaselab::cuda
