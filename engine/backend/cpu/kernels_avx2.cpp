// The x86 kernels built for AVX2 + FMA + F16C (compile flags set in CMake).
#define PHASELAB_X86_NS avx2_impl
#define PHASELAB_X86_ISA "avx2"
#include "kernels_x86.inc"

namespace phaselab::cpu {

const Kernels* avx2_kernels() {
  static const Kernels k = avx2_impl::make_kernels();
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return &k;
  return nullptr;
}

}  // namespace phaselab::cpu
