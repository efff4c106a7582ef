#include "phaselab/quant.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace phaselab {

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        e++;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3FF) << 13);
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t absx = x & 0x7FFFFFFF;
  if (absx >= 0x7F800000) return static_cast<uint16_t>(sign | 0x7C00 | (absx > 0x7F800000 ? 0x200 : 0));
  if (absx >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // overflow -> inf
  if (absx < 0x38800000) {  // subnormal or zero in half
    if (absx < 0x33000000) return static_cast<uint16_t>(sign);
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // 14 + (113 - e)
    uint32_t half = m >> (shift);
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) half++;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((absx >> 13) - (112u << 10));
  const uint32_t rem = absx & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
  return static_cast<uint16_t>(sign | half);
}

uint16_t fp32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

namespace {

void dequant_q4_0(const BlockQ4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < QK4_0 / 2; j++) {
      y[i * QK4_0 + j] = ((x[i].qs[j] & 0x0F) - 8) * d;
      y[i * QK4_0 + j + QK4_0 / 2] = ((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const BlockQ4_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = fp16_to_fp32(x[i].d), m = fp16_to_fp32(x[i].m);
    for (int j = 0; j < QK4_1 / 2; j++) {
      y[i * QK4_1 + j] = (x[i].qs[j] & 0x0F) * d + m;
      y[i * QK4_1 + j + QK4_1 / 2] = (x[i].qs[j] >> 4) * d + m;
    }
  }
}

// Q5: the fifth bit of value j is bit j of qh (j in 0..31).
void dequant_q5_0(const BlockQ5_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = fp16_to_fp32(x[i].d);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, 4);
    for (int j = 0; j < QK5_0 / 2; j++) {
      const int h0 = ((qh >> j) << 4) & 0x10;
      const int h1 = (qh >> (j + 12)) & 0x10;
      y[i * QK5_0 + j] = (((x[i].qs[j] & 0x0F) | h0) - 16) * d;
      y[i * QK5_0 + j + QK5_0 / 2] = (((x[i].qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

void dequant_q5_1(const BlockQ5_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = fp16_to_fp32(x[i].d), m = fp16_to_fp32(x[i].m);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, 4);
    for (int j = 0; j < QK5_1 / 2; j++) {
      const int h0 = ((qh >> j) << 4) & 0x10;
      const int h1 = (qh >> (j + 12)) & 0x10;
      y[i * QK5_1 + j] = ((x[i].qs[j] & 0x0F) | h0) * d + m;
      y[i * QK5_1 + j + QK5_1 / 2] = ((x[i].qs[j] >> 4) | h1) * d + m;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < QK8_0; j++) y[i * QK8_0 + j] = x[i].qs[j] * d;
  }
}

void dequant_mxfp4(const BlockMXFP4* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = mxfp4_half_scale(x[i].e);
    for (int j = 0; j < QK_MXFP4 / 2; j++) {
      y[i * QK_MXFP4 + j] = kMxfp4Values[x[i].qs[j] & 0x0F] * d;
      y[i * QK_MXFP4 + j + QK_MXFP4 / 2] = kMxfp4Values[x[i].qs[j] >> 4] * d;
    }
  }
}

// Q4_K: 4 groups of 64 values; each group is 32 low nibbles (sub-block 2g)
// then 32 high nibbles (sub-block 2g+1) of the same 32 bytes.
void dequant_q4_k(const BlockQ4_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = fp16_to_fp32(x[i].d), dmin = fp16_to_fp32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    int is = 0;
    for (int j = 0; j < QK_K; j += 64) {
      uint8_t sc, m;
      get_scale_min_k4(is, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

void dequant_q5_k(const BlockQ5_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = fp16_to_fp32(x[i].d), dmin = fp16_to_fp32(x[i].dmin);
    const uint8_t* ql = x[i].qs;
    const uint8_t* qh = x[i].qh;
    int is = 0;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < QK_K; j += 64) {
      uint8_t sc, m;
      get_scale_min_k4(is, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 <<= 2;
      u2 <<= 2;
    }
  }
}

// Q6_K: 2 halves of 128 values; in each, ql holds 64 bytes of low nibbles and
// qh 32 bytes of 2-bit high parts for four interleaved runs of 32.
void dequant_q6_k(const BlockQ6_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int n = 0; n < QK_K; n += 128) {
      for (int l = 0; l < 32; l++) {
        const int is = l / 16;
        const int q1 = static_cast<int>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = static_cast<int>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = static_cast<int>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = static_cast<int>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// ---- reference quantizers ---------------------------------------------------

void quant_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    float amax = 0;
    for (int j = 0; j < QK8_0; j++) amax = std::max(amax, std::fabs(x[i * QK8_0 + j]));
    const float d = amax / 127.f;
    const float id = d ? 1.f / d : 0.f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < QK8_0; j++) y[i].qs[j] = static_cast<int8_t>(std::lround(x[i * QK8_0 + j] * id));
  }
}

// MXFP4: the block's scale is 2^(floor(log2(amax)) - 2), so the largest
// value is 4 to 8 times it (E2M1 reaches 6: beyond that it clips); each value
// becomes the nearest of the 16 (the first on ties: +0 over -0). The bytes
// equal llama.cpp's reference quantizer's.
void quant_mxfp4(const float* x, BlockMXFP4* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    float amax = 0;
    for (int j = 0; j < QK_MXFP4; j++) amax = std::max(amax, std::fabs(x[i * QK_MXFP4 + j]));
    // (A non-finite block takes the largest scale rather than an undefined cast.)
    const int e = !std::isfinite(amax) ? 254
                  : amax > 0           ? std::clamp(static_cast<int>(std::floor(std::log2(amax))) - 2 + 127, 0, 254)
                                       : 0;
    y[i].e = static_cast<uint8_t>(e);
    const float d = mxfp4_half_scale(y[i].e);
    auto nearest = [&](float v) {
      int best = 0;
      float err = std::fabs(kMxfp4Values[0] * d - v);
      for (int k = 1; k < 16; k++)
        if (const float e2 = std::fabs(kMxfp4Values[k] * d - v); e2 < err) best = k, err = e2;
      return static_cast<uint8_t>(best);
    };
    for (int j = 0; j < QK_MXFP4 / 2; j++)
      y[i].qs[j] = static_cast<uint8_t>(nearest(x[i * QK_MXFP4 + j]) | (nearest(x[i * QK_MXFP4 + j + QK_MXFP4 / 2]) << 4));
  }
}

// Symmetric 4/5-bit: the value of largest magnitude maps to -8 (-16).
template <int kLevels>
float symmetric_scale(const float* x, int n) {
  float amax = 0, max = 0;
  for (int j = 0; j < n; j++)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  return max / -static_cast<float>(kLevels);
}

void quant_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += QK4_0) {
    const float d = symmetric_scale<8>(x, QK4_0), id = d ? 1.f / d : 0.f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < QK4_0 / 2; j++) {
      const int a = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      const int b = std::min(15, static_cast<int>(x[j + QK4_0 / 2] * id + 8.5f));
      y[i].qs[j] = static_cast<uint8_t>(a | (b << 4));
    }
  }
}

void quant_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += QK4_1) {
    const float mn = *std::min_element(x, x + QK4_1), mx = *std::max_element(x, x + QK4_1);
    const float d = (mx - mn) / 15.f, id = d ? 1.f / d : 0.f;
    y[i].d = fp32_to_fp16(d);
    y[i].m = fp32_to_fp16(mn);
    for (int j = 0; j < QK4_1 / 2; j++) {
      const int a = std::min(15, static_cast<int>((x[j] - mn) * id + 0.5f));
      const int b = std::min(15, static_cast<int>((x[j + QK4_1 / 2] - mn) * id + 0.5f));
      y[i].qs[j] = static_cast<uint8_t>(a | (b << 4));
    }
  }
}

void quant_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += QK5_0) {
    const float d = symmetric_scale<16>(x, QK5_0), id = d ? 1.f / d : 0.f;
    y[i].d = fp32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_0 / 2; j++) {
      const int a = std::min(31, static_cast<int>(x[j] * id + 16.5f));
      const int b = std::min(31, static_cast<int>(x[j + QK5_0 / 2] * id + 16.5f));
      y[i].qs[j] = static_cast<uint8_t>((a & 0xF) | ((b & 0xF) << 4));
      qh |= ((a & 0x10u) >> 4) << j;
      qh |= ((b & 0x10u) >> 4) << (j + QK5_0 / 2);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

void quant_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += QK5_1) {
    const float mn = *std::min_element(x, x + QK5_1), mx = *std::max_element(x, x + QK5_1);
    const float d = (mx - mn) / 31.f, id = d ? 1.f / d : 0.f;
    y[i].d = fp32_to_fp16(d);
    y[i].m = fp32_to_fp16(mn);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_1 / 2; j++) {
      const int a = std::min(31, static_cast<int>((x[j] - mn) * id + 0.5f));
      const int b = std::min(31, static_cast<int>((x[j + QK5_1 / 2] - mn) * id + 0.5f));
      y[i].qs[j] = static_cast<uint8_t>((a & 0xF) | ((b & 0xF) << 4));
      qh |= ((a & 0x10u) >> 4) << j;
      qh |= ((b & 0x10u) >> 4) << (j + QK5_1 / 2);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

// Packs 8 6-bit scales and 8 6-bit mins into the 12-byte Q4_K/Q5_K layout
// (the inverse of get_scale_min_k4).
void pack_scales_k4(const uint8_t sc[8], const uint8_t mn[8], uint8_t out[12]) {
  for (int j = 0; j < 4; j++) {
    out[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
}

// Round to nearest (ties to even) for |v| < 2^22 without a libm call
// (nearbyint is one without SSE4.1): adding 1.5 * 2^23 leaves no fraction
// bits. Larger values come out large and are clamped by the callers.
inline float round_even(float v) {
  constexpr float kBig = 12582912.f;
  return (v + kBig) - kBig;
}

// Best (scale, offset) for n values on levels 0..kMaxQ, x ~= s*q + b with
// b <= 0 (the formats store the offset as a non-negative "min" subtracted).
// Tries a grid of step sizes around (max - min) / kMaxQ; for each, rounds
// to levels and solves the least-squares fit of s and b for those levels;
// keeps the fit of least squared error (expanded from the sums, so each
// candidate is one pass). Plain min/max scaling wastes part of the range on
// the single extreme value.
template <int kMaxQ>
void fit_asym(const float* x, int n, float* s_out, float* m_out) {
  const float mn = std::min(0.f, *std::min_element(x, x + n)), mx = *std::max_element(x, x + n);
  *s_out = (mx - mn) / kMaxQ;
  *m_out = -mn;
  if (mx <= mn) return;
  double sx = 0, sxx = 0;
  for (int i = 0; i < n; i++) {
    sx += x[i];
    sxx += static_cast<double>(x[i]) * x[i];
  }
  double best = -1;
  for (int k = -12; k <= 12; k++) {
    const float inv = (kMaxQ + 0.1f * k) / (mx - mn);
    // Eight partial sums per quantity (n is a multiple of 8), so that the
    // compiler can keep them in vector registers.
    float aq[8] = {}, aqq[8] = {}, aqx[8] = {};
    for (int i = 0; i < n; i += 8)
      for (int j = 0; j < 8; j++) {
        const float q = std::min(std::max(round_even((x[i + j] - mn) * inv), 0.f), static_cast<float>(kMaxQ));
        aq[j] += q;
        aqq[j] += q * q;
        aqx[j] += q * x[i + j];
      }
    float sq = 0, sqq = 0, sqx = 0;
    for (int j = 0; j < 8; j++) {
      sq += aq[j];
      sqq += aqq[j];
      sqx += aqx[j];
    }
    const double det = static_cast<double>(n) * sqq - static_cast<double>(sq) * sq;
    if (det <= 0) continue;
    double s = (n * static_cast<double>(sqx) - sq * sx) / det, b = (sx - s * sq) / n;
    if (b > 0) {  // the offset cannot be positive: fit the scale alone
      b = 0;
      s = sqx / sqq;
    }
    if (s <= 0) continue;
    // sum((s*q + b - x)^2) from the sums
    const double e = s * s * sqq + 2 * s * b * sq + n * b * b - 2 * s * sqx - 2 * b * sx + sxx;
    if (best < 0 || e < best) {
      best = e;
      *s_out = static_cast<float>(s);
      *m_out = static_cast<float>(-b);
    }
  }
}

// Asymmetric K-quant of one super-block: per sub-block of 32 a scale and a
// min (value = d*sc*q - dmin*m), both 6-bit relative to the super-block's.
template <int kMaxQ>
void quant_k_asym(const float* x, float* d_out, float* dmin_out, uint8_t sc_q[8], uint8_t m_q[8],
                  uint8_t q[QK_K]) {
  float scales[8], mins[8];
  float max_scale = 0, max_min = 0;
  for (int s = 0; s < 8; s++) {
    fit_asym<kMaxQ>(x + 32 * s, 32, &scales[s], &mins[s]);
    max_scale = std::max(max_scale, scales[s]);
    max_min = std::max(max_min, mins[s]);
  }
  const float d = max_scale / 63.f, dmin = max_min / 63.f;
  *d_out = fp16_to_fp32(fp32_to_fp16(d));
  *dmin_out = fp16_to_fp32(fp32_to_fp16(dmin));
  for (int s = 0; s < 8; s++) {
    sc_q[s] = static_cast<uint8_t>(*d_out ? std::min(63L, std::lround(scales[s] / *d_out)) : 0);
    m_q[s] = static_cast<uint8_t>(*dmin_out ? std::min(63L, std::lround(mins[s] / *dmin_out)) : 0);
    const float ds = *d_out * sc_q[s], ms = *dmin_out * m_q[s];
    for (int l = 0; l < 32; l++) {
      const long v = ds ? std::lround((x[32 * s + l] + ms) / ds) : 0;
      q[32 * s + l] = static_cast<uint8_t>(std::clamp(v, 0L, static_cast<long>(kMaxQ)));
    }
  }
}

void quant_q4_k(const float* x, BlockQ4_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += QK_K) {
    float d, dmin;
    uint8_t sc[8], mn[8], q[QK_K];
    quant_k_asym<15>(x, &d, &dmin, sc, mn, q);
    y[i].d = fp32_to_fp16(d);
    y[i].dmin = fp32_to_fp16(dmin);
    pack_scales_k4(sc, mn, y[i].scales);
    for (int g = 0; g < 4; g++)
      for (int l = 0; l < 32; l++)
        y[i].qs[32 * g + l] = static_cast<uint8_t>(q[64 * g + l] | (q[64 * g + 32 + l] << 4));
  }
}

void quant_q5_k(const float* x, BlockQ5_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += QK_K) {
    float d, dmin;
    uint8_t sc[8], mn[8], q[QK_K];
    quant_k_asym<31>(x, &d, &dmin, sc, mn, q);
    y[i].d = fp32_to_fp16(d);
    y[i].dmin = fp32_to_fp16(dmin);
    pack_scales_k4(sc, mn, y[i].scales);
    std::memset(y[i].qh, 0, sizeof(y[i].qh));
    for (int g = 0; g < 4; g++)
      for (int l = 0; l < 32; l++) {
        const uint8_t lo = q[64 * g + l], hi = q[64 * g + 32 + l];
        y[i].qs[32 * g + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
        if (lo & 16) y[i].qh[l] |= static_cast<uint8_t>(1u << (2 * g));
        if (hi & 16) y[i].qh[l] |= static_cast<uint8_t>(2u << (2 * g));
      }
  }
}

// Q6_K's sub-block scale: levels -32..31 with the value of largest
// magnitude on -32 to start; then a grid of slightly smaller and larger
// steps, each refit by least squares (s = sum(q*x) / sum(q*q), whose error
// is sum(x^2) - sum(q*x)^2 / sum(q*q)), keeping the best. The sign follows
// symmetric_scale's.
float fit_symmetric_q6(const float* x, int n) {
  const float s0 = symmetric_scale<32>(x, n);
  if (s0 == 0) return 0;
  float best_s = s0;
  double best_gain = -1;
  for (int k = -12; k <= 12; k++) {
    const float inv = (32.f + 0.1f * k) / (32.f * s0);
    float aqq[8] = {}, aqx[8] = {};  // as in fit_asym
    for (int i = 0; i < n; i += 8)
      for (int j = 0; j < 8; j++) {
        const float q = std::min(std::max(round_even(x[i + j] * inv), -32.f), 31.f);
        aqq[j] += q * q;
        aqx[j] += q * x[i + j];
      }
    float sqq = 0, sqx = 0;
    for (int j = 0; j < 8; j++) {
      sqq += aqq[j];
      sqx += aqx[j];
    }
    if (sqq <= 0) continue;
    const float s = sqx / sqq;
    if (s == 0 || (s > 0) != (s0 > 0)) continue;
    const double gain = static_cast<double>(sqx) * sqx / sqq;
    if (gain > best_gain) {
      best_gain = gain;
      best_s = s;
    }
  }
  return best_s;
}

void quant_q6_k(const float* x, BlockQ6_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += QK_K) {
    float scales[16], max_abs_scale = 0, max_scale = 0;
    for (int s = 0; s < 16; s++) {
      scales[s] = fit_symmetric_q6(x + 16 * s, 16);
      if (std::fabs(scales[s]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[s]);
        max_scale = scales[s];
      }
    }
    const float d = max_scale / -128.f;
    const float dq = fp16_to_fp32(fp32_to_fp16(d));
    y[i].d = fp32_to_fp16(d);
    uint8_t q[QK_K];
    for (int s = 0; s < 16; s++) {
      const long sq = dq ? std::clamp(std::lround(scales[s] / dq), -128L, 127L) : 0;
      y[i].scales[s] = static_cast<int8_t>(sq);
      const float ds = dq * static_cast<float>(sq);
      for (int l = 0; l < 16; l++) {
        const long v = ds ? std::lround(x[16 * s + l] / ds) : 0;
        q[16 * s + l] = static_cast<uint8_t>(std::clamp(v, -32L, 31L) + 32);
      }
    }
    for (int h = 0; h < 2; h++) {
      uint8_t* ql = y[i].ql + 64 * h;
      uint8_t* qh = y[i].qh + 32 * h;
      const uint8_t* qq = q + 128 * h;
      for (int l = 0; l < 32; l++) {
        ql[l] = static_cast<uint8_t>((qq[l] & 0xF) | ((qq[l + 64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((qq[l + 32] & 0xF) | ((qq[l + 96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                                     ((qq[l + 96] >> 4) << 6));
      }
    }
  }
}

Status check_multiple(TensorType type, int64_t n) {
  const auto& tr = traits_of(type);
  if (n % tr.block_size != 0)
    return invalid_argument("row of " + std::to_string(n) + " values is not a multiple of the " +
                            std::string(tr.name) + " block size " + std::to_string(tr.block_size));
  return Status::ok();
}

}  // namespace

Status dequantize_row(TensorType type, const void* src, float* dst, int64_t n) {
  PHASELAB_TRY(check_multiple(type, n));
  const int64_t nb = n / traits_of(type).block_size;
  switch (type) {
    case TensorType::F32: std::memcpy(dst, src, n * 4); return Status::ok();
    case TensorType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_fp32(s[i]);
      return Status::ok();
    }
    case TensorType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32(s[i]);
      return Status::ok();
    }
    case TensorType::Q4_0: dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb); return Status::ok();
    case TensorType::Q4_1: dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb); return Status::ok();
    case TensorType::Q5_0: dequant_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb); return Status::ok();
    case TensorType::Q5_1: dequant_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb); return Status::ok();
    case TensorType::Q8_0: dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb); return Status::ok();
    case TensorType::Q4_K: dequant_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb); return Status::ok();
    case TensorType::Q5_K: dequant_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb); return Status::ok();
    case TensorType::Q6_K: dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb); return Status::ok();
    case TensorType::MXFP4: dequant_mxfp4(static_cast<const BlockMXFP4*>(src), dst, nb); return Status::ok();
    default:
      return unsupported("no dequantizer for tensor type " + std::string(tensor_type_name(type)));
  }
}

Status quantize_row(TensorType type, const float* src, void* dst, int64_t n) {
  PHASELAB_TRY(check_multiple(type, n));
  const int64_t nb = n / traits_of(type).block_size;
  switch (type) {
    case TensorType::F32: std::memcpy(dst, src, n * 4); return Status::ok();
    case TensorType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; i++) d[i] = fp32_to_fp16(src[i]);
      return Status::ok();
    }
    case TensorType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; i++) d[i] = fp32_to_bf16(src[i]);
      return Status::ok();
    }
    case TensorType::Q4_0: quant_q4_0(src, static_cast<BlockQ4_0*>(dst), nb); return Status::ok();
    case TensorType::Q4_1: quant_q4_1(src, static_cast<BlockQ4_1*>(dst), nb); return Status::ok();
    case TensorType::Q5_0: quant_q5_0(src, static_cast<BlockQ5_0*>(dst), nb); return Status::ok();
    case TensorType::Q5_1: quant_q5_1(src, static_cast<BlockQ5_1*>(dst), nb); return Status::ok();
    case TensorType::Q8_0: quant_q8_0(src, static_cast<BlockQ8_0*>(dst), nb); return Status::ok();
    case TensorType::Q4_K: quant_q4_k(src, static_cast<BlockQ4_K*>(dst), nb); return Status::ok();
    case TensorType::Q5_K: quant_q5_k(src, static_cast<BlockQ5_K*>(dst), nb); return Status::ok();
    case TensorType::Q6_K: quant_q6_k(src, static_cast<BlockQ6_K*>(dst), nb); return Status::ok();
    case TensorType::MXFP4: quant_mxfp4(src, static_cast<BlockMXFP4*>(dst), nb); return Status::ok();
    default:
      return unsupported("no quantizer for tensor type " + std::string(tensor_type_name(type)));
  }
}

}  // namespace phaselab
