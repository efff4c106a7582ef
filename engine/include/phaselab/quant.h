// Block formats of the GGUF quantized types, reference dequantization and
// reference quantization. These are the definitions the fast kernels (CPU SIMD,
// CUDA) are tested against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "phaselab/formats/quant_blocks.h"
#include "phaselab/status.h"
#include "phaselab/tensor_type.h"

namespace phaselab {

// ---- half precision helpers ------------------------------------------------
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);  // round to nearest even
inline float bf16_to_fp32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t fp32_to_bf16(float f);  // round to nearest even, NaN kept NaN

// ---- block layouts: phaselab/formats/quant_blocks.h (shared with the CUDA kernels)

// Unpacks the j-th 6-bit (scale, min) pair of a Q4_K/Q5_K scales array.
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Dequantizes n values (a multiple of the type's block size) from src to dst.
// Returns unsupported for types without a dequantizer.
Status dequantize_row(TensorType type, const void* src, float* dst, int64_t n);

// Quantizes n values (a multiple of the block size) into dst, which must hold
// row_size(type, n) bytes. Reference quantizers: simple and deterministic, for
// tests, the GGUF writer and the quantize command.
Status quantize_row(TensorType type, const float* src, void* dst, int64_t n);

}  // namespace phaselab
