// Element-wise and reduction ops of the reference path, in plain C++.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace phaselab::ref {

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

inline void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

// out = x / sqrt(mean(x^2) + eps) * w (out may alias x)
inline void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
  for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

inline float silu(float x) { return x / (1.f + std::exp(-x)); }

// gpt-oss's gated activation of gate g and up u: both clamped at 7 (u also
// at -7), g * sigmoid(1.702 g) * (u + 1).
inline float swiglu_oai(float g, float u) {
  constexpr float kAlpha = 1.702f, kLimit = 7.f;
  const float x = std::min(g, kLimit);
  const float y = std::clamp(u, -kLimit, kLimit);
  return x / (1.f + std::exp(kAlpha * (-x))) * (y + 1.f);
}

inline float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// RoPE scaling (ModelConfig::rope_freq_scale, yarn_*): none by default.
struct RopeScaling {
  float freq_scale = 1.f;  // linear: every angle times this
  float ext_factor = 0.f;  // YaRN (1) or not (0)
  float beta_fast = 32.f, beta_slow = 1.f;
  int n_ctx_orig = 0;
};

// The rotation pairs [lo, hi] over which YaRN ramps from keeping its angle
// to interpolating: the pairs that turn beta_fast and beta_slow times over
// n_ctx_orig positions (in float, as llama.cpp computes them).
inline void yarn_ramp_dims(int n_rot, int n_ctx_orig, float base, float beta_fast, float beta_slow, float* lo, float* hi) {
  constexpr float kPi = 3.14159265358979323846f;
  auto dim = [&](float beta) {
    return n_rot * std::log(static_cast<float>(n_ctx_orig) / (beta * 2 * kPi)) / (2 * std::log(base));
  };
  *lo = std::max(0.f, std::floor(dim(beta_fast)));
  *hi = std::min(static_cast<float>(n_rot - 1), std::ceil(dim(beta_slow)));
}

// The angle of each rotation pair per position, with scaling: pair i turns
// base^(-2i/n_rot) per position (divided by freq_factors[i] when given);
// with scaling (rs) times freq_scale, under YaRN only past the ramp (pair i
// mixes the scaled and the kept angle by 1 - clamp((i - lo) / (hi - lo), 0,
// 1)). mscale: what cos and sin are multiplied by (rope.scaling.attn_factor,
// 1 for most models; under YaRN also times 1 + 0.1 ln(1 / freq_scale)).
struct RopePairs {
  RopePairs(int n_rot_, float base_, const float* freq_factors, float mscale_, const RopeScaling* rs_)
      : n_rot(n_rot_), base(base_), ff(freq_factors), rs(rs_), mscale(mscale_) {
    yarn = rs && rs->ext_factor != 0.f;
    if (yarn) {
      yarn_ramp_dims(n_rot, rs->n_ctx_orig, base, rs->beta_fast, rs->beta_slow, &lo, &hi);
      mscale *= 1.0f + 0.1f * std::log(1.0f / rs->freq_scale);
    }
  }
  double freq(int i) const {
    double f = std::pow(static_cast<double>(base), -2.0 * i / n_rot);
    if (ff) f /= ff[i];
    if (!rs) return f;
    if (!yarn) return f * rs->freq_scale;
    const float y = (i - lo) / std::max(0.001f, hi - lo);
    const double mix = (1 - std::min(1.f, std::max(0.f, y))) * rs->ext_factor;
    return f * (rs->freq_scale * (1 - mix) + mix);
  }
  int n_rot;
  float base;
  const float* ff;
  const RopeScaling* rs;
  bool yarn = false;
  float lo = 0, hi = 0;
  float mscale;
};

// cos/sin of the rotation angles of one position: cs[2i] = cos, cs[2i+1] =
// sin of pos times pair i's angle (RopePairs), both times its mscale.
// Shared by every head of the position.
inline void rope_angles(float* cs, int n_rot, int pos, float base, const float* freq_factors, float mscale = 1.f,
                        const RopeScaling* rs = nullptr) {
  const RopePairs pairs(n_rot, base, freq_factors, mscale, rs);
  for (int i = 0; i < n_rot / 2; i++) {
    const double theta = pos * pairs.freq(i);
    cs[2 * i] = static_cast<float>(std::cos(theta)) * pairs.mscale;
    cs[2 * i + 1] = static_cast<float>(std::sin(theta)) * pairs.mscale;
  }
}

// rope_angles's angles as a table a device computes them from: out[i] (n_rot
// / 2) pair i's angle per position (theta = pos * out[i]); returns what cos
// and sin are multiplied by.
inline float rope_pair_freqs(double* out, int n_rot, float base, const float* freq_factors, float mscale = 1.f,
                             const RopeScaling* rs = nullptr) {
  const RopePairs pairs(n_rot, base, freq_factors, mscale, rs);
  for (int i = 0; i < n_rot / 2; i++) out[i] = pairs.freq(i);
  return pairs.mscale;
}

// Applies precomputed angles (rope_angles) to one head.
inline void rope_apply(float* x, int n_rot, const float* cs, bool neox) {
  const int half = n_rot / 2;
  for (int i = 0; i < half; i++) {
    const float c = cs[2 * i], s = cs[2 * i + 1];
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
}

}  // namespace phaselab::ref
