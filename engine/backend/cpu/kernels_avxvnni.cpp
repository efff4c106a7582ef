// The x86 kernels built for AVX2 + AVX-VNNI (dpbusd for the u8*s8 sums).
#define PHASELAB_X86_NS avxvnni_impl
#define PHASELAB_X86_ISA "avx-vnni"
#define PHASELAB_X86_VNNI 1
#include "kernels_x86.inc"

namespace phaselab::cpu {

const Kernels* avxvnni_kernels() {
  static const Kernels k = avxvnni_impl::make_kernels();
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
      __builtin_cpu_supports("avxvnni"))
    return &k;
  return nullptr;
}

}  // namespace phaselab::cpu
