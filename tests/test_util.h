// Small helpers shared by the numeric tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace phaselab::testing {

// n normally distributed values (mean 0, standard deviation scale), the same
// for the same seed.
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Normalized mean squared error of x against ref: sum (ref - x)^2 / sum ref^2
// (the plain sum of squares when ref is all zeros).
inline double nmse(const std::vector<float>& ref, const std::vector<float>& x) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    const double d = static_cast<double>(ref[i]) - x[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? num / den : num;
}

}  // namespace phaselab::testing
