// Small statistics shared by the engine and its front ends.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace phaselab {

// The value at fraction (0..1) of sorted values, interpolated linearly
// between the closest ranks (the definition llama-perplexity prints its
// percentiles with); 0 for no values.
template <class T>
double percentile(const std::vector<T>& sorted, double fraction) {
  if (sorted.empty()) return 0;
  if (fraction <= 0) return static_cast<double>(sorted.front());
  if (fraction >= 1) return static_cast<double>(sorted.back());
  const double p = fraction * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(p);
  const size_t j = std::min(i + 1, sorted.size() - 1);
  const double f = p - static_cast<double>(i);
  return (1 - f) * static_cast<double>(sorted[i]) + f * static_cast<double>(sorted[j]);
}

}  // namespace phaselab
