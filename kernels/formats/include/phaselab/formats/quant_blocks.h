// Block layouts of the GGUF quantized types, byte-exact with the file format.
//
// Why this lives in kernels/formats/ rather than in engine/: the CPU reference
// (engine/quant/quant.cpp, through engine/include/phaselab/quant.h) and the
// CUDA kernels (kernels/common.cuh) both read these blocks, and kernels/ must
// not depend on the engine. Plain structs and constants only: nothing here
// needs a .cpp, so both sides include it as it is.
#pragma once

#include <cstdint>

namespace phaselab {

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
// MXFP4 (OCP microscaling): 32 FP4 (E2M1) values sharing a power-of-two scale
// 2^(e - 127) (E8M0). Value j is nibble j of qs (low nibbles: values 0..15,
// high: 16..31), read as kMxfp4Values[nibble] * 2^(e - 128): the table holds
// twice the E2M1 values so that they are integers.
constexpr int QK_MXFP4 = 32;
struct BlockMXFP4 { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; };  // 17 bytes
#pragma pack(pop)

inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// 2^(e - 128) as a float (the block's scale, halved to match kMxfp4Values);
// e = 0 and 1 give the subnormals 2^-128 and 2^-127.
inline float mxfp4_half_scale(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockMXFP4) == 17);

}  // namespace phaselab
