// Block formats of the GGUF quantized types, reference dequantization and
// reference quantization. These are the definitions the fast kernels (CPU SIMD,
// CUDA) are tested against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

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

// ---- block layouts (byte-exact with the file format) -----------------------
constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32;
constexpr int QK_K = 256;
constexpr int K_SCALE_SIZE = 12;

#pragma pack(push, 1)
struct BlockQ4_0 { uint16_t d; uint8_t qs[QK4_0 / 2]; };                 // 18 bytes
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[QK4_1 / 2]; };              // 20 bytes
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };  // 22 bytes
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };  // 24 bytes
struct BlockQ8_0 { uint16_t d; int8_t qs[QK8_0]; };                      // 34 bytes
// Super-blocks of 256 values in 8 sub-blocks of 32, with 6-bit scales and mins.
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };  // 144
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};  // 176
// 16 sub-blocks of 16 values, 8-bit scales, 6-bit quants.
struct BlockQ6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };  // 210
struct BlockQ2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; };  // 84
struct BlockQ3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };  // 110
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);

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
