// The vocabulary passes for AVX2 (see vocab_passes.inc).
#include <immintrin.h>

#include "vocab_passes_std.h"

#pragma GCC target("avx2")

namespace phaselab::vocab::avx2 {
namespace {
inline uint32_t ge_bits16(const float* p, float c) {
  const __m256 cv = _mm256_set1_ps(c);
  const auto lo = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p), cv, _CMP_GE_OQ)));
  const auto hi = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p + 8), cv, _CMP_GE_OQ)));
  return lo | hi << 8;
}
}  // namespace
}  // namespace phaselab::vocab::avx2

#define PHASELAB_VOCAB_NS avx2
#include "vocab_passes.inc"
