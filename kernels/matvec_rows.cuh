// The matrix-vector kernels' row products (matvec.cu, moe.cu): one warp
// per weight row, its dot products with up to 8 input rows, by the float
// path (each 32-value sub-block dequantized to registers) or the integer
// path (Q8Act: dp4a on 8-bit inputs). Private to the kernels.
#pragma once

#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {
namespace {

constexpr int kMaxTokens = 8;

// Lane l's part of the dot products of one weight row with T <= kMaxTokens
// rows of x: it dequantizes sub-blocks l, l+32, ... once and uses them for
// every token. acc[t] += the lane's share (summed across the warp later).
template <typename RowOf>
__device__ __forceinline__ void row_partials(const uint8_t* wr, TensorType type, int n_in, const float* x, int T,
                                             int lane, float* acc, RowOf row_of) {
  float v[32];
  for (int sb = lane; sb < n_in / 32; sb += 32) {
    dequant_sub32(type, wr, sb, v);
    for (int t = 0; t < T; t++) {
      const float* xt = x + static_cast<size_t>(row_of(t)) * n_in + sb * 32;
      float s = 0.f;
      for (int i = 0; i < 32; i++) s += v[i] * xt[i];
      acc[t] += s;
    }
  }
  // Float rows (F32/F16/BF16) may end in n_in % 32 values outside any
  // sub-block (block formats never do).
  for (int i = n_in / 32 * 32 + lane; i < n_in; i += 32) {
    const float wv = load_float_weight(type, wr, i);
    for (int t = 0; t < T; t++) acc[t] += wv * x[static_cast<size_t>(row_of(t)) * n_in + i];
  }
}

// ---- the integer path (Q8Act) ------------------------------------------------
// A row is cut into units of 8 values (unit u: values 8u .. 8u + 7, inside
// one 32-value block of x's scales). A unit of any supported format comes
// out as 8 small integers in two words (w0: values 0-3, w1: 4-7, one byte
// each) and two scales: the unit's dot product with x's quants q is
// d_x * (a * sum(w q) + b * sum(q)), b carrying the formats' offsets and
// mins. Each lane takes units lane, lane + 32, ...: a warp reads a row's
// bytes in order.
struct WeightUnit {
  int w0, w1;
  float a, b;
};

// 4 bytes from a 2-byte aligned address (blocks of 18, 22, 34 and 210 bytes).
__device__ __forceinline__ int load_u16x2(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<int>(h[0] | (static_cast<uint32_t>(h[1]) << 16));
}
__device__ __forceinline__ int load_u32(const uint8_t* p) { return *reinterpret_cast<const int*>(p); }
// Bits 0-3 of b to bit 4 of bytes 0-3.
__device__ __forceinline__ int high_bits_to_bytes(uint32_t b) {
  return static_cast<int>(((b & 1) << 4) | ((b & 2) << 11) | ((b & 4) << 18) | ((b & 8) << 25));
}

__device__ __forceinline__ WeightUnit load_unit(TensorType type, const uint8_t* wr, int u) {
  WeightUnit r{0, 0, 0.f, 0.f};
  switch (type) {
    case TensorType::Q8_0: {  // 34 bytes: d, 32 int8
      const uint8_t* b = wr + static_cast<size_t>(u / 4) * sizeof(BlockQ8_0);
      const uint8_t* q = b + 2 + 8 * (u % 4);
      r.w0 = load_u16x2(q);
      r.w1 = load_u16x2(q + 4);
      r.a = h2f(*reinterpret_cast<const uint16_t*>(b));
      return r;
    }
    case TensorType::Q4_0:    // 18 bytes: d, 16 bytes of nibbles (values i and i + 16 in byte i)
    case TensorType::Q5_0: {  // 22 bytes: d, 32 high bits, the same nibbles
      const bool five = type == TensorType::Q5_0;
      const uint8_t* b = wr + static_cast<size_t>(u / 4) * (five ? sizeof(BlockQ5_0) : sizeof(BlockQ4_0));
      const int k = u % 4;  // values 8k .. 8k + 7: low nibbles of bytes 8(k&1).. for k < 2, high ones after
      const uint8_t* q = b + (five ? 6 : 2) + 8 * (k & 1);
      const int shift = 4 * (k >> 1);
      r.w0 = (load_u16x2(q) >> shift) & 0x0F0F0F0F;
      r.w1 = (load_u16x2(q + 4) >> shift) & 0x0F0F0F0F;
      const float d = h2f(*reinterpret_cast<const uint16_t*>(b));
      if (five) {
        const uint32_t qh = static_cast<uint32_t>(load_u16x2(b + 2)) >> (8 * k);
        r.w0 |= high_bits_to_bytes(qh & 0xF);
        r.w1 |= high_bits_to_bytes((qh >> 4) & 0xF);
      }
      r.a = d;
      r.b = five ? -16.f * d : -8.f * d;
      return r;
    }
    case TensorType::Q4_K: {  // 144 bytes per 256: d, dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
      const uint8_t* b = wr + static_cast<size_t>(u / 32) * sizeof(BlockQ4_K);
      const int j = (u % 32) / 4, k = u % 4;  // sub-block j, its values 8k ..
      const uint8_t* q = b + 16 + 32 * (j / 2) + 8 * k;
      const int shift = 4 * (j % 2);
      r.w0 = (load_u32(q) >> shift) & 0x0F0F0F0F;
      r.w1 = (load_u32(q + 4) >> shift) & 0x0F0F0F0F;
      int sc, m;
      scale_min_k4(j, b + 4, &sc, &m);
      r.a = h2f(*reinterpret_cast<const uint16_t*>(b)) * sc;
      r.b = -h2f(*reinterpret_cast<const uint16_t*>(b + 2)) * m;
      return r;
    }
    case TensorType::Q6_K: {  // 210 bytes per 256: ql[128], qh[64], 16 int8 scales, d
      const uint8_t* b = wr + static_cast<size_t>(u / 32) * sizeof(BlockQ6_K);
      const int sb = (u % 32) / 4, k = u % 4;
      const int h = sb / 4, rr = sb % 4;
      const uint8_t* ql = b + 64 * h + 32 * (rr & 1) + 8 * k;
      const uint8_t* qh = b + 128 + 32 * h + 8 * k;
      const int shift = rr < 2 ? 0 : 4;
      r.w0 = ((load_u16x2(ql) >> shift) & 0x0F0F0F0F) | (((load_u16x2(qh) >> (2 * rr)) & 0x03030303) << 4);
      r.w1 = ((load_u16x2(ql + 4) >> shift) & 0x0F0F0F0F) | (((load_u16x2(qh + 4) >> (2 * rr)) & 0x03030303) << 4);
      const float d = h2f(*reinterpret_cast<const uint16_t*>(b + 208));
      const int8_t sc = static_cast<int8_t>(b[192 + 8 * h + 2 * rr + k / 2]);
      r.a = d * sc;
      r.b = -32.f * d * sc;
      return r;
    }
    case TensorType::MXFP4: {  // 17 bytes: E8M0 exponent, Q4_0's nibble order (values i and i + 16 in byte i)
      const uint8_t* b = wr + static_cast<size_t>(u / 4) * sizeof(BlockMXFP4);
      const int k = u % 4;
      const uint8_t* q = b + 1 + 8 * (k & 1);
      const int shift = 4 * (k >> 1);
      r.w0 = mxfp4_bytes((load_bytes4(q) >> shift) & 0x0F0F0F0Fu);
      r.w1 = mxfp4_bytes((load_bytes4(q + 4) >> shift) & 0x0F0F0F0Fu);
      r.a = mxfp4_half_scale_dev(b[0]);
      return r;
    }
    default: return r;
  }
}

__device__ __forceinline__ bool q8_type(TensorType t) {
  return t == TensorType::Q8_0 || t == TensorType::Q4_0 || t == TensorType::Q5_0 || t == TensorType::Q4_K ||
         t == TensorType::Q6_K || t == TensorType::MXFP4;
}

// The integer path's row_partials: kUnroll units per lane loaded before any
// is used (loads in flight, the point of a bandwidth-bound kernel).
template <int kUnroll = 4, typename RowOf>
__device__ __forceinline__ void row_partials_q8(const uint8_t* wr, TensorType type, int n_in, const int8_t* xq,
                                                const float* xd, int T, int lane, float* acc, RowOf row_of) {
  const int n_units = n_in / 8;
  for (int u0 = lane; u0 < n_units; u0 += 32 * kUnroll) {
    WeightUnit wu[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; k++)
      if (u0 + 32 * k < n_units) wu[k] = load_unit(type, wr, u0 + 32 * k);
#pragma unroll
    for (int k = 0; k < kUnroll; k++) {
      const int u = u0 + 32 * k;
      if (u >= n_units) break;
      for (int t = 0; t < T; t++) {
        const size_t r = static_cast<size_t>(row_of(t));
        const int8_t* xt = xq + r * n_in + 8 * u;
        const int x0 = load_u32(reinterpret_cast<const uint8_t*>(xt));
        const int x1 = load_u32(reinterpret_cast<const uint8_t*>(xt + 4));
        const int dot = __dp4a(wu[k].w0, x0, __dp4a(wu[k].w1, x1, 0));
        const int sum = __dp4a(0x01010101, x0, __dp4a(0x01010101, x1, 0));
        acc[t] += xd[r * (n_in / 32) + u / 4] * (wu[k].a * static_cast<float>(dot) +
                                                                      wu[k].b * static_cast<float>(sum));
      }
    }
  }
}

// Either path for one row (xq null: the float path); input row t of the
// T is row row_of(t) of x (and of xq, xd).
template <typename RowOf>
__device__ __forceinline__ void row_dot_rows(const uint8_t* wr, TensorType type, int n_in, const float* x,
                                             const int8_t* xq, const float* xd, int T, int lane, float* acc,
                                             RowOf row_of) {
  if (xq && q8_type(type)) row_partials_q8(wr, type, n_in, xq, xd, T, lane, acc, row_of);
  else row_partials(wr, type, n_in, x, T, lane, acc, row_of);
}
struct IdentityRows {
  __device__ __forceinline__ int operator()(int t) const { return t; }
};
// Input row t is row t of x.
__device__ __forceinline__ void row_dot(const uint8_t* wr, TensorType type, int n_in, const float* x,
                                        const int8_t* xq, const float* xd, int T, int lane, float* acc) {
  row_dot_rows(wr, type, n_in, x, xq, xd, T, lane, acc, IdentityRows{});
}

// The integer path's input for a launch over T rows of n_in: quantized
// here, once for all its matrices, when one of them can use it.
struct Q8Input {
  const int8_t* q = nullptr;
  const float* d = nullptr;
};
inline Q8Input quantize_for(Q8Act q8, bool wanted, const float* x, int T, int n_in, cudaStream_t s, cudaError_t* err) {
  *err = cudaSuccess;
  if (!wanted || !q8.q || n_in % 32 != 0 || static_cast<size_t>(T) * n_in > q8.cap) return {};
  if (q8.ready) return Q8Input{q8.q, q8.d};  // the kernel that wrote x quantized it
  *err = launch_quantize_q8(x, T, n_in, q8, s);
  return Q8Input{q8.q, q8.d};
}

}  // namespace
}  // namespace phaselab::cuda
