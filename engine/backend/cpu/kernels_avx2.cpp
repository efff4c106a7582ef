// AVX2 (+FMA, F16C) kernels. This file alone is compiled with those
// instruction sets; avx2_kernels() returns them only when the CPU has them.
// Unsigned weight quants times signed activations go through
// _mm256_maddubs_epi16 (pairs of u8*s8 summed to s16; every format here keeps
// those pairs within int16), then _mm256_madd_epi16 with ones to int32.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "cpu_kernels.h"
#include "phaselab/quant.h"

namespace phaselab::cpu {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

// 8 int32 sums of u8 * s8 over 32 bytes.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// 32 nibbles of 16 bytes: low nibbles first (values 0..15), then high.
inline __m256i nibbles_16(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

// Byte i = 0x10 if bit i of the 32-bit word at p is set, else 0.
inline __m256i fifth_bits(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bits = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(w)), shuf), bits);
  return _mm256_and_si256(_mm256_cmpeq_epi8(v, bits), _mm256_set1_epi8(0x10));
}

inline __m256i load_act(const ActQ8& a) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs)); }
inline int asum(const ActQ8& a) { return a.s[0] + a.s[1]; }

void quantize_act(const float* x, ActQ8* out, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < n / 32; b++, x += 32) {
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float mx = _mm_cvtss_f32(m);
    const float d = mx / 127.f;
    const __m256 id = _mm256_set1_ps(d > 0 ? 1.f / d : 0.f);
    __m256i q[4];
    for (int k = 0; k < 4; k++)
      q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // Pack 32 int32 -> 32 int8 in order (packs work per 128-bit lane: fix up).
    const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
    __m256i p = _mm256_packs_epi16(p01, p23);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    ActQ8& a = out[b];
    a.d = d;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.qs), p);
    // Sums of each 16-value half.
    const __m256i s16 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.qs))),
                                          _mm256_set1_epi16(1));
    const __m256i t16 = _mm256_madd_epi16(
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.qs + 16))), _mm256_set1_epi16(1));
    auto hsum_i = [](__m256i v) {
      __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
      return _mm_cvtsi128_si32(s);
    };
    a.s[0] = static_cast<int16_t>(hsum_i(s16));
    a.s[1] = static_cast<int16_t>(hsum_i(t16));
  }
}

// Each format's kernel takes N activation rows (a + j * as, j < N) against
// one weight row: the weight blocks are unpacked once for all N. Every row's
// sequence of float operations is the same for any N, so the N = 4 kernel
// gives bitwise the results of four N = 1 calls (batched prefill stays equal
// to token-by-token decoding).

template <int N>
void dot_q8_0_n(const uint8_t* w, const ActQ8* a, int64_t as, int64_t n, float* out) {
  const auto* x = reinterpret_cast<const BlockQ8_0*>(w);
  __m256 acc[N];
  for (int j = 0; j < N; j++) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; b++) {
    const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    const __m256i wabs = _mm256_sign_epi8(wq, wq);
    const float wd = h2f(x[b].d);
    for (int j = 0; j < N; j++) {
      const ActQ8& ab = a[j * as + b];
      const __m256i p = dot_u8s8(wabs, _mm256_sign_epi8(load_act(ab), wq));
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(wd * ab.d), acc[j]);
    }
  }
  for (int j = 0; j < N; j++) out[j] = hsum(acc[j]);
}

// Q4_0 / Q5_0 (kSub = 8 / 16 subtracted from every quant) and Q4_1 / Q5_1
// (a min m added): unsigned quants q, value = d * (q - kSub) or d * q + m.
template <typename Block, bool kFive, int kSub, int N>
void dot_q45_n(const uint8_t* w, const ActQ8* a, int64_t as, int64_t n, float* out) {
  const auto* x = reinterpret_cast<const Block*>(w);
  __m256 acc[N];
  float off[N];
  for (int j = 0; j < N; j++) {
    acc[j] = _mm256_setzero_ps();
    off[j] = 0;
  }
  for (int64_t b = 0; b < n / 32; b++) {
    __m256i q = nibbles_16(x[b].qs);
    if constexpr (kFive) q = _mm256_or_si256(q, fifth_bits(x[b].qh));
    const float wd = h2f(x[b].d);
    for (int j = 0; j < N; j++) {
      const ActQ8& ab = a[j * as + b];
      const float s = wd * ab.d;
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(q, load_act(ab))), _mm256_set1_ps(s), acc[j]);
      if constexpr (kSub > 0) {
        off[j] += s * static_cast<float>(kSub * asum(ab));
      } else {
        off[j] -= h2f(x[b].m) * ab.d * static_cast<float>(asum(ab));
      }
    }
  }
  for (int j = 0; j < N; j++) out[j] = hsum(acc[j]) - off[j];
}

template <bool kFive, int N>
void dot_qk45_n(const uint8_t* w, const ActQ8* a, int64_t as, int64_t n, float* out) {
  using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  const auto* x = reinterpret_cast<const Block*>(w);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i b16 = _mm256_set1_epi8(0x10);
  __m256 acc[N];
  float mins[N];
  for (int j = 0; j < N; j++) {
    acc[j] = _mm256_setzero_ps();
    mins[j] = 0;
  }
  for (int64_t b = 0; b < n / QK_K; b++) {
    const float d = h2f(x[b].d), dmin = h2f(x[b].dmin);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qh));
    for (int g = 0; g < 4; g++) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs + 32 * g));
      uint8_t sc0, m0, sc1, m1;
      get_scale_min_k4(2 * g, x[b].scales, &sc0, &m0);
      get_scale_min_k4(2 * g + 1, x[b].scales, &sc1, &m1);
      __m256i q0 = _mm256_and_si256(bytes, m4);
      __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4);
      if constexpr (kFive) {
        // Bit j of qh[i] is the fifth bit of value i of sub-block j: move it to 0x10.
        q0 = _mm256_or_si256(q0, _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * g), 4), b16));
        q1 = _mm256_or_si256(q1, _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * g + 1), 4), b16));
      }
      for (int j = 0; j < N; j++) {
        const ActQ8* ab = a + j * as + 8 * b;
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(q0, load_act(ab[2 * g]))), _mm256_set1_ps(d * sc0 * ab[2 * g].d), acc[j]);
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(q1, load_act(ab[2 * g + 1]))),
                                 _mm256_set1_ps(d * sc1 * ab[2 * g + 1].d), acc[j]);
        mins[j] += dmin * (m0 * ab[2 * g].d * static_cast<float>(asum(ab[2 * g])) +
                           m1 * ab[2 * g + 1].d * static_cast<float>(asum(ab[2 * g + 1])));
      }
    }
  }
  for (int j = 0; j < N; j++) out[j] = hsum(acc[j]) - mins[j];
}

template <int N>
void dot_q6_k_n(const uint8_t* w, const ActQ8* a, int64_t as, int64_t n, float* out) {
  const auto* x = reinterpret_cast<const BlockQ6_K*>(w);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m3 = _mm256_set1_epi8(0x03);
  __m256 acc[N];
  float off[N];
  for (int j = 0; j < N; j++) {
    acc[j] = _mm256_setzero_ps();
    off[j] = 0;
  }
  for (int64_t b = 0; b < n / QK_K; b++) {
    const float d = h2f(x[b].d);
    for (int h = 0; h < 2; h++) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].ql + 64 * h));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].ql + 64 * h + 32));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qh + 32 * h));
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4)),
          _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4)),
      };
      for (int r = 0; r < 4; r++) {
        const int8_t* sc = x[b].scales + 8 * h + 2 * r;
        // Lanes 0-3 hold the first 16 values' sums, lanes 4-7 the second's.
        const __m256i scv = _mm256_setr_epi32(sc[0], sc[0], sc[0], sc[0], sc[1], sc[1], sc[1], sc[1]);
        for (int j = 0; j < N; j++) {
          const ActQ8& ab = a[j * as + 8 * b + 4 * h + r];
          const __m256i p = _mm256_mullo_epi32(dot_u8s8(q[r], load_act(ab)), scv);
          const float s = d * ab.d;
          acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s), acc[j]);
          off[j] += s * static_cast<float>(32 * (sc[0] * ab.s[0] + sc[1] * ab.s[1]));
        }
      }
    }
  }
  for (int j = 0; j < N; j++) out[j] = hsum(acc[j]) - off[j];
}

// The one-row entry points are the N = 1 instances of the same code.
template <void (*F)(const uint8_t*, const ActQ8*, int64_t, int64_t, float*)>
float one(const uint8_t* w, const ActQ8* a, int64_t n) {
  float r;
  F(w, a, 0, n, &r);
  return r;
}

float dot_f32(const uint8_t* w, const float* x, int64_t n) {
  const auto* f = reinterpret_cast<const float*>(w);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(f + i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(f + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
  }
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; i++) s += f[i] * x[i];
  return s;
}

float dot_f16(const uint8_t* w, const float* x, int64_t n) {
  const auto* h = reinterpret_cast<const uint16_t*>(w);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))), _mm256_loadu_ps(x + i), acc);
  float s = hsum(acc);
  for (; i < n; i++) s += h2f(h[i]) * x[i];
  return s;
}

float dot_bf16(const uint8_t* w, const float* x, int64_t n) {
  const auto* h = reinterpret_cast<const uint16_t*>(w);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))), 16);
    acc = _mm256_fmadd_ps(_mm256_castsi256_ps(v), _mm256_loadu_ps(x + i), acc);
  }
  float s = hsum(acc);
  for (; i < n; i++) s += bf16_to_fp32(h[i]) * x[i];
  return s;
}

float dot(const float* a, const float* b, int64_t n) { return dot_f32(reinterpret_cast<const uint8_t*>(a), b, n); }

void axpy(float* y, float s, const float* x, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vs, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] += s * x[i];
}

Kernels make_avx2() {
  Kernels k;
  k.isa = "avx2";
  k.quantize_act = quantize_act;
  auto set = [&](TensorType t, DotQ8Fn one_fn, DotQ8x4Fn four_fn) {
    k.dot_q8[static_cast<int>(t)] = one_fn;
    k.dot_q8_x4[static_cast<int>(t)] = four_fn;
  };
  set(TensorType::Q8_0, one<dot_q8_0_n<1>>, dot_q8_0_n<4>);
  set(TensorType::Q4_0, one<dot_q45_n<BlockQ4_0, false, 8, 1>>, dot_q45_n<BlockQ4_0, false, 8, 4>);
  set(TensorType::Q4_1, one<dot_q45_n<BlockQ4_1, false, 0, 1>>, dot_q45_n<BlockQ4_1, false, 0, 4>);
  set(TensorType::Q5_0, one<dot_q45_n<BlockQ5_0, true, 16, 1>>, dot_q45_n<BlockQ5_0, true, 16, 4>);
  set(TensorType::Q5_1, one<dot_q45_n<BlockQ5_1, true, 0, 1>>, dot_q45_n<BlockQ5_1, true, 0, 4>);
  set(TensorType::Q4_K, one<dot_qk45_n<false, 1>>, dot_qk45_n<false, 4>);
  set(TensorType::Q5_K, one<dot_qk45_n<true, 1>>, dot_qk45_n<true, 4>);
  set(TensorType::Q6_K, one<dot_q6_k_n<1>>, dot_q6_k_n<4>);
  k.dot_f32[static_cast<int>(TensorType::F32)] = dot_f32;
  k.dot_f32[static_cast<int>(TensorType::F16)] = dot_f16;
  k.dot_f32[static_cast<int>(TensorType::BF16)] = dot_bf16;
  k.dot = dot;
  k.axpy = axpy;
  return k;
}

}  // namespace

const Kernels* avx2_kernels() {
  static const Kernels k = make_avx2();
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return &k;
  return nullptr;
}

#else

const Kernels* avx2_kernels() { return nullptr; }

#endif

}  // namespace phaselab::cpu
