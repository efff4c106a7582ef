// The x86 kernels built for AVX-512 (F, BW, VL) with VNNI: the repacked
// groups' dot products run on 64-byte vectors, the rest as in the AVX-VNNI
// build (bitwise equal results).
#define PHASELAB_X86_NS avx512_impl
#define PHASELAB_X86_ISA "avx512-vnni"
#define PHASELAB_X86_VNNI 1
#define PHASELAB_X86_AVX512 1
#include "kernels_x86.inc"

namespace phaselab::cpu {

const Kernels* avx512_kernels() {
  static const Kernels k = avx512_impl::make_kernels();
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512vnni"))
    return &k;
  return nullptr;
}

}  // namespace phaselab::cpu
