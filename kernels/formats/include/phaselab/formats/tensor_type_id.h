// The GGUF tensor type ids (the ggml type ids as stored in the file).
//
// Why this lives in kernels/formats/ rather than in engine/: the CUDA kernels
// (kernels/) dispatch on these ids and read these bytes, yet must not depend
// on the engine (kernels/ is built into its own library and cannot see
// engine/include). Both include this header-only directory instead:
// engine/include/phaselab/tensor_type.h adds the traits (names, block
// geometry as data) on top of it.
#pragma once

#include <cstdint>

namespace phaselab {

enum class TensorType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
  MXFP4 = 39,  // OCP microscaling FP4 (gpt-oss's experts)
};

}  // namespace phaselab
