// The vocabulary passes for AVX-512 (see vocab_passes.inc).
#include <immintrin.h>

#include "vocab_passes_std.h"

#pragma GCC target("avx2,avx512f")

namespace phaselab::vocab::avx512 {
namespace {
inline uint32_t ge_bits16(const float* p, float c) {
  return _mm512_cmp_ps_mask(_mm512_loadu_ps(p), _mm512_set1_ps(c), _CMP_GE_OQ);
}
}  // namespace
}  // namespace phaselab::vocab::avx512

#define PHASELAB_VOCAB_NS avx512
#include "vocab_passes.inc"
