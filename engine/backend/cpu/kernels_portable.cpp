// Portable kernels: the integer dot products of every weight block format
// against 8-bit activations, in plain C++. Integer sums are exact, so the SIMD
// kernels must agree with these up to float rounding of the per-block scales.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cpu_kernels.h"
#include "phaselab/quant.h"

namespace phaselab::cpu {

namespace {

void quantize_act(const float* x, ActQ8* out, int64_t n) {
  for (int64_t b = 0; b < n / 32; b++, x += 32) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = std::fmax(amax, std::fabs(x[i]));
    const float d = amax / 127.f;
    const float id = d > 0 ? 1.f / d : 0.f;
    ActQ8& a = out[b];
    a.d = d;
    int s0 = 0, s1 = 0;
    for (int i = 0; i < 32; i++) {
      const int q = static_cast<int>(std::nearbyint(x[i] * id));
      a.qs[i] = static_cast<int8_t>(q);
      (i < 16 ? s0 : s1) += q;
    }
    a.s[0] = static_cast<int16_t>(s0);
    a.s[1] = static_cast<int16_t>(s1);
  }
}

inline int asum(const ActQ8& a) { return a.s[0] + a.s[1]; }

float dot_q8_0(const uint8_t* w, const ActQ8* a, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ8_0*>(w);
  float acc = 0;
  for (int64_t b = 0; b < n / 32; b++) {
    int isum = 0;
    for (int i = 0; i < 32; i++) isum += x[b].qs[i] * a[b].qs[i];
    acc += static_cast<float>(isum) * (fp16_to_fp32(x[b].d) * a[b].d);
  }
  return acc;
}

float dot_mxfp4(const uint8_t* w, const ActQ8* a, int64_t n) {
  const auto* x = reinterpret_cast<const BlockMXFP4*>(w);
  float acc = 0;
  for (int64_t b = 0; b < n / 32; b++) {
    int isum = 0;
    for (int i = 0; i < 16; i++)
      isum += kMxfp4Values[x[b].qs[i] & 0xF] * a[b].qs[i] + kMxfp4Values[x[b].qs[i] >> 4] * a[b].qs[i + 16];
    acc += static_cast<float>(isum) * (mxfp4_half_scale(x[b].e) * a[b].d);
  }
  return acc;
}

float dot_q4_0(const uint8_t* w, const ActQ8* a, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ4_0*>(w);
  float acc = 0;
  for (int64_t b = 0; b < n / 32; b++) {
    int isum = 0;
    for (int i = 0; i < 16; i++) isum += (x[b].qs[i] & 0xF) * a[b].qs[i] + (x[b].qs[i] >> 4) * a[b].qs[i + 16];
    isum -= 8 * asum(a[b]);
    acc += static_cast<float>(isum) * (fp16_to_fp32(x[b].d) * a[b].d);
  }
  return acc;
}

float dot_q4_1(const uint8_t* w, const ActQ8* a, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ4_1*>(w);
  float acc = 0;
  for (int64_t b = 0; b < n / 32; b++) {
    int isum = 0;
    for (int i = 0; i < 16; i++) isum += (x[b].qs[i] & 0xF) * a[b].qs[i] + (x[b].qs[i] >> 4) * a[b].qs[i + 16];
    acc += static_cast<float>(isum) * (fp16_to_fp32(x[b].d) * a[b].d) + fp16_to_fp32(x[b].m) * a[b].d * asum(a[b]);
  }
  return acc;
}

template <typename Block>
int q5_isum(const Block& x, const ActQ8& a) {
  uint32_t qh;
  std::memcpy(&qh, x.qh, 4);
  int isum = 0;
  for (int i = 0; i < 16; i++) {
    const int lo = (x.qs[i] & 0xF) | (((qh >> i) & 1) << 4);
    const int hi = (x.qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4);
    isum += lo * a.qs[i] + hi * a.qs[i + 16];
  }
  return isum;
}

float dot_q5_0(const uint8_t* w, const ActQ8* a, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ5_0*>(w);
  float acc = 0;
  for (int64_t b = 0; b < n / 32; b++) {
    const int isum = q5_isum(x[b], a[b]) - 16 * asum(a[b]);
    acc += static_cast<float>(isum) * (fp16_to_fp32(x[b].d) * a[b].d);
  }
  return acc;
}

float dot_q5_1(const uint8_t* w, const ActQ8* a, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ5_1*>(w);
  float acc = 0;
  for (int64_t b = 0; b < n / 32; b++)
    acc += static_cast<float>(q5_isum(x[b], a[b])) * (fp16_to_fp32(x[b].d) * a[b].d) +
           fp16_to_fp32(x[b].m) * a[b].d * asum(a[b]);
  return acc;
}

// Q4_K / Q5_K: sub-block j (32 values) lines up with activation block j;
// Q5_K adds the fifth bit of value i of sub-block j from bit j of qh[i].
template <bool kFive>
float dot_qk45(const uint8_t* w, const ActQ8* a, int64_t n) {
  using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  const auto* x = reinterpret_cast<const Block*>(w);
  float acc = 0;
  for (int64_t b = 0; b < n / QK_K; b++, a += 8) {
    const float d = fp16_to_fp32(x[b].d), dmin = fp16_to_fp32(x[b].dmin);
    for (int j = 0; j < 8; j++) {
      uint8_t sc, m;
      get_scale_min_k4(j, x[b].scales, &sc, &m);
      const uint8_t* q = x[b].qs + 32 * (j / 2);
      const int shift = (j % 2) * 4;
      int isum = 0;
      for (int i = 0; i < 32; i++) {
        int v = (q[i] >> shift) & 0xF;
        if constexpr (kFive) v |= ((x[b].qh[i] >> j) & 1) << 4;
        isum += v * a[j].qs[i];
      }
      acc += a[j].d * (d * sc * static_cast<float>(isum) - dmin * m * static_cast<float>(asum(a[j])));
    }
  }
  return acc;
}

// Q6_K: activation block 4h + r holds run r of half h; its two 16-value
// halves have scales sc[8h + 2r] and sc[8h + 2r + 1].
float dot_q6_k(const uint8_t* w, const ActQ8* a, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ6_K*>(w);
  float acc = 0;
  for (int64_t b = 0; b < n / QK_K; b++, a += 8) {
    const float d = fp16_to_fp32(x[b].d);
    for (int h = 0; h < 2; h++) {
      const uint8_t* ql = x[b].ql + 64 * h;
      const uint8_t* qh = x[b].qh + 32 * h;
      for (int r = 0; r < 4; r++) {
        const ActQ8& ab = a[4 * h + r];
        int isum[2] = {0, 0};
        for (int i = 0; i < 32; i++) {
          const uint8_t lq = ql[i + 32 * (r & 1)];
          const int q = ((r < 2 ? lq & 0xF : lq >> 4) | (((qh[i] >> (2 * r)) & 3) << 4)) - 32;
          isum[i / 16] += q * ab.qs[i];
        }
        const int8_t* sc = x[b].scales + 8 * h + 2 * r;
        acc += d * ab.d * static_cast<float>(sc[0] * isum[0] + sc[1] * isum[1]);
      }
    }
  }
  return acc;
}

float dot_f32(const uint8_t* w, const float* x, int64_t n) {
  const auto* f = reinterpret_cast<const float*>(w);
  float acc = 0;
  for (int64_t i = 0; i < n; i++) acc += f[i] * x[i];
  return acc;
}

float dot_f16(const uint8_t* w, const float* x, int64_t n) {
  const auto* h = reinterpret_cast<const uint16_t*>(w);
  float acc = 0;
  for (int64_t i = 0; i < n; i++) acc += fp16_to_fp32(h[i]) * x[i];
  return acc;
}

float dot_bf16(const uint8_t* w, const float* x, int64_t n) {
  const auto* h = reinterpret_cast<const uint16_t*>(w);
  float acc = 0;
  for (int64_t i = 0; i < n; i++) acc += bf16_to_fp32(h[i]) * x[i];
  return acc;
}

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0;
  for (int64_t i = 0; i < n; i++) acc += a[i] * b[i];
  return acc;
}

void axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void gelu_mul(const float* g, float* u, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < n; i++) {
    const float x = g[i];
    u[i] = 0.5f * x * (1.f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x))) * u[i];
  }
}

void silu_mul(const float* g, float* u, int64_t n) {
  for (int64_t i = 0; i < n; i++) u[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

float exp_sum(float* x, int64_t n, float mx) {
  float sum = 0;
  for (int64_t i = 0; i < n; i++) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  return sum;
}

void rms_norm(float* out, const float* x, const float* w, int64_t n, float eps) {
  double lanes[kRmsLanes] = {};
  for (int64_t i = 0; i < n; i++) lanes[i % kRmsLanes] += static_cast<double>(x[i]) * x[i];
  const float scale = rms_scale(lanes, n, eps);
  for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void weighted_sum(float* out, int out_stride, int G, const float* p, int p_stride, const float* const* v, int n, int HD) {
  for (int g = 0; g < G; g++)
    for (int k = 0; k < n; k++) axpy(out + g * out_stride, p[g * p_stride + k], v[k], HD);
}

void scores(float* s, int s_stride, int G, const float* q, const float* const* k, int n, int HD, float scale) {
  for (int g = 0; g < G; g++)
    for (int j = 0; j < n; j++) s[g * s_stride + j] = dot(q + g * HD, k[j], HD) * scale;
}

// The attention kernels over 16-bit K/V rows, widened by Widen (IEEE half
// or bfloat16).
template <float (*Widen)(uint16_t)>
void weighted_sum16(float* out, int out_stride, int G, const float* p, int p_stride, const uint16_t* const* v, int n,
                    int HD) {
  for (int g = 0; g < G; g++)
    for (int k = 0; k < n; k++) {
      const float a = p[g * p_stride + k];
      for (int i = 0; i < HD; i++) out[g * out_stride + i] += a * Widen(v[k][i]);
    }
}

template <float (*Widen)(uint16_t)>
void scores16(float* s, int s_stride, int G, const float* q, const uint16_t* const* k, int n, int HD, float scale) {
  for (int g = 0; g < G; g++)
    for (int j = 0; j < n; j++) {
      float acc = 0;
      for (int i = 0; i < HD; i++) acc += q[g * HD + i] * Widen(k[j][i]);
      s[g * s_stride + j] = acc * scale;
    }
}

void to_f16(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = fp32_to_fp16(x[i]);
}

// A Q8_0 cache: per block of 32, the int8 sum scaled once.
void scores_q8_0(float* s, int s_stride, int G, const float* q, const uint8_t* const* k, int n, int HD, float scale) {
  for (int g = 0; g < G; g++)
    for (int j = 0; j < n; j++) {
      const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(k[j]);
      float acc = 0;
      for (int ib = 0; ib < HD / QK8_0; ib++) {
        float sb = 0;
        for (int i = 0; i < QK8_0; i++) sb += q[g * HD + ib * QK8_0 + i] * b[ib].qs[i];
        acc += fp16_to_fp32(b[ib].d) * sb;
      }
      s[g * s_stride + j] = acc * scale;
    }
}
void weighted_sum_q8_0(float* out, int out_stride, int G, const float* p, int p_stride, const uint8_t* const* v, int n,
                       int HD) {
  for (int g = 0; g < G; g++)
    for (int j = 0; j < n; j++) {
      const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(v[j]);
      for (int ib = 0; ib < HD / QK8_0; ib++) {
        const float d = fp16_to_fp32(b[ib].d);
        for (int i = 0; i < QK8_0; i++) out[g * out_stride + ib * QK8_0 + i] += p[g * p_stride + j] * (d * b[ib].qs[i]);
      }
    }
}

void to_bf16(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = fp32_to_bf16(x[i]);
}

Kernels make_portable() {
  Kernels k;
  k.isa = "portable";
  k.quantize_act = quantize_act;
  k.dot_q8[static_cast<int>(TensorType::Q8_0)] = dot_q8_0;
  k.dot_q8[static_cast<int>(TensorType::Q4_0)] = dot_q4_0;
  k.dot_q8[static_cast<int>(TensorType::Q4_1)] = dot_q4_1;
  k.dot_q8[static_cast<int>(TensorType::Q5_0)] = dot_q5_0;
  k.dot_q8[static_cast<int>(TensorType::Q5_1)] = dot_q5_1;
  k.dot_q8[static_cast<int>(TensorType::Q4_K)] = dot_qk45<false>;
  k.dot_q8[static_cast<int>(TensorType::Q5_K)] = dot_qk45<true>;
  k.dot_q8[static_cast<int>(TensorType::Q6_K)] = dot_q6_k;
  k.dot_q8[static_cast<int>(TensorType::MXFP4)] = dot_mxfp4;
  k.dot_f32[static_cast<int>(TensorType::F32)] = dot_f32;
  k.dot_f32[static_cast<int>(TensorType::F16)] = dot_f16;
  k.dot_f32[static_cast<int>(TensorType::BF16)] = dot_bf16;
  k.dot = dot;
  k.axpy = axpy;
  k.gelu_mul = gelu_mul;
  k.silu_mul = silu_mul;
  k.exp_sum = exp_sum;
  k.rms_norm = rms_norm;
  k.weighted_sum = weighted_sum;
  k.scores = scores;
  k.weighted_sum_f16 = weighted_sum16<fp16_to_fp32>;
  k.scores_f16 = scores16<fp16_to_fp32>;
  k.to_f16 = to_f16;
  k.weighted_sum_bf16 = weighted_sum16<bf16_to_fp32>;
  k.scores_bf16 = scores16<bf16_to_fp32>;
  k.to_bf16 = to_bf16;
  k.weighted_sum_q8_0 = weighted_sum_q8_0;
  k.scores_q8_0 = scores_q8_0;
  return k;
}

}  // namespace

namespace {

// The half group of 4 blocks at b (layout in cpu_kernels.h); value(block, j)
// gives value j of a block as an unsigned byte.
template <typename Block, typename Value>
uint8_t* write_half_group(const Block* b, uint8_t* dst, Value value) {
  for (int i = 0; i < 4; i++) {
    std::memcpy(dst + 2 * i, &b[i].d, 2);
    for (int k = 0; k < 4; k++)
      for (int h = 0; h < 2; h++)
        for (int l = 0; l < 4; l++) dst[8 + 32 * k + 16 * h + 4 * i + l] = value(b[i], 8 * k + 4 * h + l);
  }
  return dst + kHalfGroupBytes;
}

// After the full groups: the half group if there is one, then the remaining
// blocks as in the file.
template <typename Block, typename Value>
void write_row_tail(const Block* x, int64_t nb, uint8_t* dst, Value value) {
  int64_t b = nb / kGroupBlocks * kGroupBlocks;
  if (half_groups(nb)) {
    dst = write_half_group(x + b, dst, value);
    b += 4;
  }
  std::memcpy(dst, x + b, static_cast<size_t>(nb - b) * sizeof(Block));
}

uint8_t q5_0_value(const BlockQ5_0& b, int j) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  const int nib = j < 16 ? (b.qs[j] & 0xF) : (b.qs[j - 16] >> 4);
  return static_cast<uint8_t>(nib | (((qh >> j) & 1) << 4));
}
uint8_t q8_0_value(const BlockQ8_0& b, int j) { return static_cast<uint8_t>(b.qs[j] + 128); }
uint8_t q4_0_value(const BlockQ4_0& b, int j) { return static_cast<uint8_t>(j < 16 ? (b.qs[j] & 0xF) : (b.qs[j - 16] >> 4)); }

}  // namespace

void repack_q5_0_u8_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ5_0*>(src);
  const int64_t nb = n / 32, ng = nb / kGroupBlocks;
  for (int64_t g = 0; g < ng; g++, dst += kGroupBytesQ5_0U8) {
    const BlockQ5_0* b = x + g * kGroupBlocks;
    for (int i = 0; i < kGroupBlocks; i++) {
      std::memcpy(dst + 2 * i, &b[i].d, 2);
      for (int v = 0; v < 8; v++)
        for (int l = 0; l < 4; l++) dst[16 + 32 * v + 4 * i + l] = q5_0_value(b[i], 4 * v + l);
    }
  }
  write_row_tail(x, nb, dst, q5_0_value);
}

namespace {
// The 64-byte chunks of byte quants u[0..nc) (values below 16 << bits) as
// nibbles (two chunks a 64-byte run: chunk k low, chunk k + nc / 2 high),
// then for each chunk k, bits 64-bit words: word b holds bit 4 + b of each
// of its bytes. kGroupBytesQ5_0P's (bits 1) and kGroupBytesQ6_KP's (bits 2)
// quants.
void pack_chunks(const uint8_t* u, int nc, int bits, uint8_t* dst) {
  const int half = nc / 2;
  for (int k = 0; k < half; k++)
    for (int j = 0; j < 64; j++)
      dst[64 * k + j] = static_cast<uint8_t>((u[64 * k + j] & 0xF) | ((u[64 * (k + half) + j] & 0xF) << 4));
  for (int k = 0; k < nc; k++)
    for (int b = 0; b < bits; b++) {
      uint64_t word = 0;
      for (int j = 0; j < 64; j++) word |= static_cast<uint64_t>((u[64 * k + j] >> (4 + b)) & 1) << j;
      std::memcpy(dst + 32 * nc + 8 * (bits * k + b), &word, 8);
    }
}
void unpack_chunks(const uint8_t* src, int nc, int bits, uint8_t* u) {
  const int half = nc / 2;
  for (int k = 0; k < nc; k++)
    for (int j = 0; j < 64; j++) {
      const uint8_t nib = src[64 * (k % half) + j];
      int v = k < half ? nib & 0xF : nib >> 4;
      for (int b = 0; b < bits; b++) {
        uint64_t word;
        std::memcpy(&word, src + 32 * nc + 8 * (bits * k + b), 8);
        v |= static_cast<int>((word >> j) & 1) << (4 + b);
      }
      u[64 * k + j] = static_cast<uint8_t>(v);
    }
}
}  // namespace

void repack_q5_0_packed_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  const int64_t nb = n / 32, ng = nb / kGroupBlocks, nh = half_groups(nb);
  uint8_t u[kGroupBytesQ5_0U8];
  for (int64_t g = 0; g < ng; g++, src += kGroupBlocks * sizeof(BlockQ5_0), dst += kGroupBytesQ5_0P) {
    repack_q5_0_u8_row(src, u, 32 * kGroupBlocks);  // one group: its byte layout
    std::memcpy(dst, u, 16);
    pack_chunks(u + 16, 4, 1, dst + 16);
  }
  if (nh) {
    repack_q5_0_u8_row(src, u, 32 * 4);  // four blocks: a half group
    std::memcpy(dst, u, 8);
    pack_chunks(u + 8, 2, 1, dst + 8);
    src += 4 * sizeof(BlockQ5_0);
    dst += kHalfGroupBytesQ5_0P;
  }
  std::memcpy(dst, src, static_cast<size_t>(nb - ng * kGroupBlocks - 4 * nh) * sizeof(BlockQ5_0));
}

void unpack_q5_0_packed_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  const int64_t nb = n / 32, ng = nb / kGroupBlocks, nh = half_groups(nb);
  for (int64_t g = 0; g < ng; g++, src += kGroupBytesQ5_0P, dst += kGroupBytesQ5_0U8) {
    std::memcpy(dst, src, 16);
    unpack_chunks(src + 16, 4, 1, dst + 16);
  }
  if (nh) {
    std::memcpy(dst, src, 8);
    unpack_chunks(src + 8, 2, 1, dst + 8);
    src += kHalfGroupBytesQ5_0P;
    dst += kHalfGroupBytes;
  }
  std::memcpy(dst, src, static_cast<size_t>(nb - ng * kGroupBlocks - 4 * nh) * sizeof(BlockQ5_0));
}

void repack_q8_0_u8_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ8_0*>(src);
  const int64_t nb = n / 32, ng = nb / kGroupBlocks;
  for (int64_t g = 0; g < ng; g++, dst += kGroupBytesQ8_0U8) {
    const BlockQ8_0* b = x + g * kGroupBlocks;
    for (int i = 0; i < kGroupBlocks; i++) {
      std::memcpy(dst + 2 * i, &b[i].d, 2);
      for (int v = 0; v < 8; v++)
        for (int l = 0; l < 4; l++) dst[16 + 32 * v + 4 * i + l] = q8_0_value(b[i], 4 * v + l);
    }
  }
  write_row_tail(x, nb, dst, q8_0_value);
}

void dequantize_q8_0_u8_row(const uint8_t* src, float* out, int64_t n) {
  const int64_t nb = n / 32, ng = nb / kGroupBlocks;
  auto scale = [&](int i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    return fp16_to_fp32(h);
  };
  auto value = [](uint8_t u) { return static_cast<float>(static_cast<int>(u) - 128); };
  for (int64_t g = 0; g < ng; g++, src += kGroupBytesQ8_0U8, out += 32 * kGroupBlocks)
    for (int i = 0; i < kGroupBlocks; i++) {
      const float d = scale(i);
      for (int v = 0; v < 8; v++)
        for (int l = 0; l < 4; l++) out[32 * i + 4 * v + l] = value(src[16 + 32 * v + 4 * i + l]) * d;
    }
  int64_t b = ng * kGroupBlocks;
  if (half_groups(nb)) {  // write_half_group's layout
    for (int i = 0; i < 4; i++) {
      const float d = scale(i);
      for (int k = 0; k < 4; k++)
        for (int h = 0; h < 2; h++)
          for (int l = 0; l < 4; l++) out[32 * i + 8 * k + 4 * h + l] = value(src[8 + 32 * k + 16 * h + 4 * i + l]) * d;
    }
    src += kHalfGroupBytes;
    out += 4 * 32;
    b += 4;
  }
  if (nb > b) (void)dequantize_row(TensorType::Q8_0, src, out, (nb - b) * 32);  // the file's blocks
}

void repack_q4_0_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ4_0*>(src);
  const int64_t nb = n / 32, ng = nb / kGroupBlocks;
  for (int64_t g = 0; g < ng; g++, dst += kGroupBytesQ4_0) {
    const BlockQ4_0* b = x + g * kGroupBlocks;
    for (int i = 0; i < kGroupBlocks; i++) {
      std::memcpy(dst + 2 * i, &b[i].d, 2);
      // qs[j] holds value j (low nibble) and value 16 + j (high nibble).
      for (int k = 0; k < 4; k++) std::memcpy(dst + 16 + 32 * k + 4 * i, b[i].qs + 4 * k, 4);
    }
  }
  write_row_tail(x, nb, dst, q4_0_value);
}

void repack_mxfp4_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  const auto* x = reinterpret_cast<const BlockMXFP4*>(src);
  const int64_t nb = n / 32, ng = nb / kGroupBlocks;
  for (int64_t g = 0; g < ng; g++, dst += kGroupBytesMXFP4) {
    const BlockMXFP4* b = x + g * kGroupBlocks;
    for (int i = 0; i < kGroupBlocks; i++) {
      dst[i] = b[i].e;
      for (int k = 0; k < 4; k++) std::memcpy(dst + 8 + 32 * k + 4 * i, b[i].qs + 4 * k, 4);  // Q4_0's order
    }
  }
  int64_t b = ng * kGroupBlocks;
  if (half_groups(nb)) {  // write_half_group's layout, exponent bytes for the scales
    std::memset(dst, 0, 8);
    for (int i = 0; i < 4; i++) {
      const BlockMXFP4& blk = x[b + i];
      dst[i] = blk.e;
      for (int k = 0; k < 4; k++)
        for (int h = 0; h < 2; h++)
          for (int l = 0; l < 4; l++) {
            const int j = 8 * k + 4 * h + l;
            const int nib = j < 16 ? (blk.qs[j] & 0xF) : (blk.qs[j - 16] >> 4);
            dst[8 + 32 * k + 16 * h + 4 * i + l] = kMxfp4Unsigned[nib];
          }
    }
    dst += kHalfGroupBytes;
    b += 4;
  }
  std::memcpy(dst, x + b, static_cast<size_t>(nb - b) * sizeof(BlockMXFP4));
}

void repack_q4_k_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ4_K*>(src);
  for (int64_t b = 0; b < n / QK_K; b++, dst += kGroupBytesQ4_K) {
    std::memset(dst, 0, kGroupBytesQ4_K);
    std::memcpy(dst, &x[b].d, 2);
    std::memcpy(dst + 2, &x[b].dmin, 2);
    uint8_t q[QK_K];  // the 256 4-bit values in order, sub-block by sub-block
    for (int j = 0; j < 8; j++) {
      uint8_t sc, m;
      get_scale_min_k4(j, x[b].scales, &sc, &m);
      dst[4 + j] = sc;
      dst[12 + j] = m;
      const uint8_t* qs = x[b].qs + 32 * (j / 2);
      for (int l = 0; l < 32; l++) q[32 * j + l] = (qs[l] >> (4 * (j % 2))) & 0xF;
    }
    // Vector k, byte 4i+l: value 4k+l of sub-block i (low nibble) and value
    // 16+4k+l (high nibble).
    for (int k = 0; k < 4; k++)
      for (int i = 0; i < 8; i++)
        for (int l = 0; l < 4; l++)
          dst[32 + 32 * k + 4 * i + l] = static_cast<uint8_t>(q[32 * i + 4 * k + l] | (q[32 * i + 16 + 4 * k + l] << 4));
  }
}

void repack_q4_k_compact_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ4_K*>(src);
  for (int64_t b = 0; b < n / QK_K; b++, dst += kGroupBytesQ4_KC) {
    std::memcpy(dst, &x[b].d, 2);
    std::memcpy(dst + 2, &x[b].dmin, 2);
    std::memcpy(dst + 4, x[b].scales, 12);  // the file's packed scales and mins
    // repack_q4_k_row's nibbles, four at a time: sub-blocks 2r and 2r + 1
    // are the low and high nibbles of the file's bytes 32r..32r+31, and
    // vector k's 4 bytes of sub-block i pair values 4k.. with 16+4k.. .
    constexpr uint32_t lo = 0x0F0F0F0F;
    for (int r = 0; r < 4; r++)
      for (int k = 0; k < 4; k++) {
        uint32_t a, c;  // the file's bytes 32r+4k.. and 32r+16+4k..
        std::memcpy(&a, x[b].qs + 32 * r + 4 * k, 4);
        std::memcpy(&c, x[b].qs + 32 * r + 16 + 4 * k, 4);
        const uint32_t even = (a & lo) | ((c & lo) << 4), odd = ((a >> 4) & lo) | (c & ~lo);
        std::memcpy(dst + 16 + 32 * k + 4 * (2 * r), &even, 4);
        std::memcpy(dst + 16 + 32 * k + 4 * (2 * r + 1), &odd, 4);
      }
  }
}

void repack_q5_k_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ5_K*>(src);
  for (int64_t b = 0; b < n / QK_K; b++, dst += kGroupBytesQ5_K) {
    std::memset(dst, 0, 32);
    std::memcpy(dst, &x[b].d, 2);
    std::memcpy(dst + 2, &x[b].dmin, 2);
    for (int j = 0; j < 8; j++) {  // sub-block j: nibbles of qs[32 (j / 2) ..], fifth bit j of qh
      uint8_t sc, m;
      get_scale_min_k4(j, x[b].scales, &sc, &m);
      dst[4 + j] = sc;
      dst[12 + j] = m;
      const uint8_t* qs = x[b].qs + 32 * (j / 2);
      for (int l = 0; l < 32; l++) {
        const int q = ((qs[l] >> (4 * (j % 2))) & 0xF) | (((x[b].qh[l] >> j) & 1) << 4);
        dst[32 + 32 * (l / 4) + 4 * j + (l % 4)] = static_cast<uint8_t>(q);
      }
    }
  }
}

void repack_q6_k_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ6_K*>(src);
  for (int64_t b = 0; b < n / QK_K; b++, dst += kGroupBytesQ6_K) {
    std::memset(dst, 0, 32);
    std::memcpy(dst, &x[b].d, 2);
    for (int i = 0; i < 8; i++) {
      dst[4 + i] = static_cast<uint8_t>(x[b].scales[2 * i]);
      dst[12 + i] = static_cast<uint8_t>(x[b].scales[2 * i + 1]);
    }
    // Unit i = half i / 4, run i % 4 (32 consecutive values).
    for (int i = 0; i < 8; i++) {
      const int h = i / 4, r = i % 4;
      const uint8_t* ql = x[b].ql + 64 * h + 32 * (r & 1);
      const uint8_t* qh = x[b].qh + 32 * h;
      for (int l = 0; l < 32; l++) {
        const int q = (r < 2 ? ql[l] & 0xF : ql[l] >> 4) | (((qh[l] >> (2 * r)) & 3) << 4);
        dst[32 + 32 * (l / 4) + 4 * i + (l % 4)] = static_cast<uint8_t>(q);
      }
    }
  }
}

void repack_q5_k_packed_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  const auto* x = reinterpret_cast<const BlockQ5_K*>(src);
  uint8_t full[kGroupBytesQ5_K];
  for (int64_t b = 0; b < n / QK_K; b++, dst += kGroupBytesQ5_KP) {
    repack_q5_k_row(reinterpret_cast<const uint8_t*>(x + b), full, QK_K);
    std::memcpy(dst, full, 4);              // d, dmin
    std::memcpy(dst + 4, x[b].scales, 12);  // the file's packed scales and mins
    pack_chunks(full + 32, 4, 1, dst + 16);
  }
}

void unpack_q5_k_packed_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; b++, src += kGroupBytesQ5_KP, dst += kGroupBytesQ5_K) {
    uint64_t scales, mins;
    q4_k_scales_mins(src + 4, scales, mins);
    std::memset(dst, 0, 32);
    std::memcpy(dst, src, 4);
    std::memcpy(dst + 4, &scales, 8);
    std::memcpy(dst + 12, &mins, 8);
    unpack_chunks(src + 16, 4, 1, dst + 32);
  }
}

void repack_q6_k_packed_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  uint8_t full[kGroupBytesQ6_K];
  for (int64_t b = 0; b < n / QK_K; b++, src += sizeof(BlockQ6_K), dst += kGroupBytesQ6_KP) {
    repack_q6_k_row(src, full, QK_K);
    std::memcpy(dst, full, 2);            // d
    std::memcpy(dst + 2, full + 4, 16);   // the scales
    pack_chunks(full + 32, 4, 2, dst + 18);
  }
}

void unpack_q6_k_packed_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; b++, src += kGroupBytesQ6_KP, dst += kGroupBytesQ6_K) {
    std::memset(dst, 0, 32);
    std::memcpy(dst, src, 2);
    std::memcpy(dst + 4, src + 2, 16);
    unpack_chunks(src + 18, 4, 2, dst + 32);
  }
}

RepackedFormat repacked_format(const Kernels& k, TensorType t, int64_t n) {
  RepackedFormat f;
  const int ti = static_cast<int>(t);
  const size_t super_blocks = static_cast<size_t>(n / QK_K);
  switch (t) {
    case TensorType::Q5_0:
    case TensorType::Q8_0:
    case TensorType::Q4_0:
    case TensorType::MXFP4:
      if (!k.dot_grouped_x1[ti] || grouped_row_bytes(t, n) == 0) return {};
      if (t == TensorType::Q5_0 && k.dot_q5_0_packed_x1 && k.unpack_q5_0_packed) {
        f = {repack_q5_0_packed_row, q5_0_packed_row_bytes(n), k.dot_q5_0_packed_x1, k.dot_grouped_x4[ti],
             k.dot_grouped_tile[ti], k.dot_grouped_tile4[ti], k.dot_grouped_tile_pairs[ti], k.unpack_q5_0_packed,
             grouped_row_bytes(t, n)};
        f.dot1_rows = k.dot_q5_0_packed_x1_rows;
        f.dot1_rows2 = k.dot_q5_0_packed_x1_rows2;
        break;
      }
      f = {t == TensorType::Q5_0   ? repack_q5_0_u8_row
           : t == TensorType::Q8_0 ? repack_q8_0_u8_row
           : t == TensorType::Q4_0 ? repack_q4_0_row
                                   : repack_mxfp4_row,
           grouped_row_bytes(t, n), k.dot_grouped_x1[ti], k.dot_grouped_x4[ti], k.dot_grouped_tile[ti], k.dot_grouped_tile4[ti],
           k.dot_grouped_tile_pairs[ti]};
      f.dot1_rows = k.dot_grouped_x1_rows[ti];
      f.dot1_rows2 = k.dot_grouped_x1_rows2[ti];
      break;
    case TensorType::Q4_K:
      f = {repack_q4_k_compact_row, super_blocks * kGroupBytesQ4_KC, k.dot_q4_k_r8_x1, k.dot_q4_k_r8_x4, k.dot_q4_k_r8_tile,
           k.dot_q4_k_r8_tile4, k.dot_q4_k_r8_tile_pairs};
      f.dot1_rows = k.dot_q4_k_r8_x1_rows;
      break;
    case TensorType::Q5_K:
      if (k.dot_q5_k_packed_x1 && k.unpack_q5_k_packed) {
        f = {repack_q5_k_packed_row, super_blocks * kGroupBytesQ5_KP, k.dot_q5_k_packed_x1, k.dot_q5_k_r8_x4,
             k.dot_q5_k_r8_tile, k.dot_q5_k_r8_tile4, k.dot_q5_k_r8_tile_pairs, k.unpack_q5_k_packed,
             super_blocks * kGroupBytesQ5_K};
        f.dot1_rows = k.dot_q5_k_packed_x1_rows;
        break;
      }
      f = {repack_q5_k_row, super_blocks * kGroupBytesQ5_K, k.dot_q5_k_r8_x1, k.dot_q5_k_r8_x4, k.dot_q5_k_r8_tile,
           k.dot_q5_k_r8_tile4, k.dot_q5_k_r8_tile_pairs};
      f.dot1_rows = k.dot_q5_k_r8_x1_rows;
      break;
    case TensorType::Q6_K:
      if (k.dot_q6_k_packed_x1 && k.unpack_q6_k_packed) {
        f = {repack_q6_k_packed_row, super_blocks * kGroupBytesQ6_KP, k.dot_q6_k_packed_x1, k.dot_q6_k_r8_x4,
             k.dot_q6_k_r8_tile, k.dot_q6_k_r8_tile4, k.dot_q6_k_r8_tile_pairs, k.unpack_q6_k_packed,
             super_blocks * kGroupBytesQ6_K};
        f.dot1_rows = k.dot_q6_k_packed_x1_rows;
        break;
      }
      f = {repack_q6_k_row, super_blocks * kGroupBytesQ6_K, k.dot_q6_k_r8_x1, k.dot_q6_k_r8_x4, k.dot_q6_k_r8_tile,
           k.dot_q6_k_r8_tile4, k.dot_q6_k_r8_tile_pairs};
      f.dot1_rows = k.dot_q6_k_r8_x1_rows;
      break;
    default:
      return {};
  }
  // Row tiles for the 32-value formats in (or unpacked to) the byte
  // layout, when every block is in a group or the half group.
  if ((t == TensorType::Q5_0 || t == TensorType::Q8_0) && k.tile_rows[ti] && k.dot_row_tile[ti] && n % 128 == 0 &&
      ((f.unpack && f.unpack == k.unpack_q5_0_packed) || f.repack == repack_q5_0_u8_row ||
       f.repack == repack_q8_0_u8_row)) {
    f.tile_rows = k.tile_rows[ti];
    f.dot_row_tile = k.dot_row_tile[ti];
  }
  return f.dot1 ? f : RepackedFormat{};
}

void group_act(const ActQ8* a, ActGroup* g, int64_t nb) {
  const int64_t ng = nb / kGroupBlocks;
  for (int64_t gi = 0; gi < ng; gi++) {
    const ActQ8* b = a + gi * kGroupBlocks;
    for (int i = 0; i < kGroupBlocks; i++) {
      for (int v = 0; v < 8; v++) std::memcpy(&g[gi].qs[v][4 * i], b[i].qs + 4 * v, 4);
      g[gi].d[i] = b[i].d;
      g[gi].off[i] = 16 * (b[i].s[0] + b[i].s[1]);
      g[gi].half_lo[i] = b[i].s[0];
    }
  }
  if (half_groups(nb)) {
    ActGroup& h = g[ng];
    std::memset(&h, 0, sizeof h);
    const ActQ8* b = a + ng * kGroupBlocks;
    for (int i = 0; i < 4; i++) {
      for (int k = 0; k < 4; k++)  // chunk k of 32 bytes is h.qs[k]
        for (int hh = 0; hh < 2; hh++) std::memcpy(&h.qs[k][16 * hh + 4 * i], b[i].qs + 8 * k + 4 * hh, 4);
      h.d[i] = b[i].d;
      h.off[i] = 16 * (b[i].s[0] + b[i].s[1]);
      h.half_lo[i] = b[i].s[0];
    }
  }
}

void pair_groups(const ActGroup* g0, const ActGroup* g1, ActPair* out, int64_t n) {
  for (int64_t g = 0; g < n; g++) {
    ActPair& p = out[g];
    for (int v = 0; v < 8; v++) {
      std::memcpy(p.qs[v], g0[g].qs[v], 32);
      std::memcpy(p.qs[v] + 32, g1[g].qs[v], 32);
    }
    std::memcpy(p.off, g0[g].off, sizeof g0[g].off);
    std::memcpy(p.off + 8, g1[g].off, sizeof g1[g].off);
    std::memcpy(p.d, g0[g].d, sizeof g0[g].d);
    std::memcpy(p.d + 8, g1[g].d, sizeof g1[g].d);
    std::memcpy(p.half_lo, g0[g].half_lo, sizeof g0[g].half_lo);
    std::memcpy(p.half_lo + 8, g1[g].half_lo, sizeof g1[g].half_lo);
  }
}

const Kernels& portable_kernels() {
  static const Kernels k = make_portable();
  return k;
}

std::vector<const Kernels*> simd_kernels() {
  std::vector<const Kernels*> out;
  for (const Kernels* k : {avx2_kernels(), avxvnni_kernels(), avx512_kernels()})
    if (k) out.push_back(k);
  return out;
}

const Kernels& best_kernels(const std::string& cap) {
  if (cap == "portable") return portable_kernels();
  const bool no_vnni = cap == "avx2";
  const bool no_avx512 = no_vnni || cap == "avx-vnni";
  if (const Kernels* k = avx512_kernels(); k && !no_avx512) return *k;
  if (const Kernels* k = avxvnni_kernels(); k && !no_vnni) return *k;
  if (const Kernels* k = avx2_kernels()) return *k;
  return portable_kernels();
}

}  // namespace phaselab::cpu
