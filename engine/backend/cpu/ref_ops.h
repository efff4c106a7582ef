// Element-wise and reduction ops of the reference path, in plain C++.
#pragma once

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

inline float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// cos/sin of the rotation angles of one position: cs[2i] = cos, cs[2i+1] =
// sin of pos * base^(-2i/n_rot) (divided by freq_factors[i] when given),
// both times mscale (phi3's rope.scaling.attn_factor; 1 elsewhere).
// Shared by every head of the position.
inline void rope_angles(float* cs, int n_rot, int pos, float base, const float* freq_factors, float mscale = 1.f) {
  for (int i = 0; i < n_rot / 2; i++) {
    double freq = std::pow(static_cast<double>(base), -2.0 * i / n_rot);
    if (freq_factors) freq /= freq_factors[i];
    const double theta = pos * freq;
    cs[2 * i] = static_cast<float>(std::cos(theta)) * mscale;
    cs[2 * i + 1] = static_cast<float>(std::sin(theta)) * mscale;
  }
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
