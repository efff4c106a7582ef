// The vocabulary passes for any x86-64 CPU (SSE2; plain comparisons
// elsewhere), and the choice among the builds (vocab_passes.h).
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "vocab_passes_std.h"

namespace phaselab::vocab::baseline {
namespace {
inline uint32_t ge_bits16(const float* p, float c) {
  uint32_t bits = 0;
#if defined(__SSE2__)
  const __m128 cv = _mm_set1_ps(c);
  for (int q = 0; q < 4; q++)  // (cmpge: ordered, false for NaN)
    bits |= static_cast<uint32_t>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(p + 4 * q), cv))) << (4 * q);
#else
  for (int l = 0; l < 16; l++) bits |= static_cast<uint32_t>(p[l] >= c) << l;
#endif
  return bits;
}
}  // namespace
}  // namespace phaselab::vocab::baseline

#define PHASELAB_VOCAB_NS baseline
#include "vocab_passes.inc"

namespace phaselab::vocab {

#if defined(__x86_64__) && defined(PHASELAB_VOCAB_X86_BUILDS)
namespace avx2 {
extern const Passes kPasses;
}
namespace avx512 {
extern const Passes kPasses;
}
#endif

const Passes* passes_for(Isa isa) {
  switch (isa) {
    case Isa::baseline:
      return &baseline::kPasses;
#if defined(__x86_64__) && defined(PHASELAB_VOCAB_X86_BUILDS)
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") ? &avx2::kPasses : nullptr;
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") ? &avx512::kPasses : nullptr;
#else
    default:
      return nullptr;
#endif
  }
  return nullptr;
}

const Passes& best_passes() {
  static const Passes* const best = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();  // (in case this runs before the runtime's own initialisation)
#endif
    for (Isa isa : {Isa::avx512, Isa::avx2})
      if (const Passes* p = passes_for(isa)) return p;
    return passes_for(Isa::baseline);
  }();
  return *best;
}

}  // namespace phaselab::vocab
