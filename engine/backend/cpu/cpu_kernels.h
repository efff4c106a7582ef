// Kernels of the fast CPU backend: activations quantized to 8 bits per block
// of 32, integer dot products against the weights' own block formats, picked
// at run time for the CPU (AVX2 when present, else portable C++).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "phaselab/tensor_type.h"

namespace phaselab::cpu {

// One block of 32 activations: x[i] ~= d * qs[i]. s[h] = sum of qs over
// half h (values 16h .. 16h+15), for the offset and min terms of the weight
// formats (Q4_0's -8, Q4_1's m, Q6_K's -32, ...).
struct ActQ8 {
  float d;
  int16_t s[2];
  int8_t qs[32];
};
static_assert(sizeof(ActQ8) == 40);

// dot(weight row of n values in its block format, n quantized activations)
using DotQ8Fn = float (*)(const uint8_t* w_row, const ActQ8* a, int64_t n);
// The same for 4 activation rows at once (row j at a + j * a_stride blocks),
// bitwise equal to 4 calls of the one-row kernel.
using DotQ8x4Fn = void (*)(const uint8_t* w_row, const ActQ8* a, int64_t a_stride, int64_t n, float* out4);
// dot(weight row of n values in F32/F16/BF16, n float activations)
using DotF32Fn = float (*)(const uint8_t* w_row, const float* x, int64_t n);
using QuantizeActFn = void (*)(const float* x, ActQ8* out, int64_t n);
using DotF32F32Fn = float (*)(const float* a, const float* b, int64_t n);
using AxpyFn = void (*)(float* y, float a, const float* x, int64_t n);  // y += a * x
using GatedActFn = void (*)(const float* g, float* u, int64_t n);  // u = act(g) * u
using ExpSumFn = float (*)(float* x, int64_t n, float mx);  // x = exp(x - mx); returns the sum
// out = x / sqrt(mean(x^2) + eps) * w (out may alias x): ref::rmsnorm, with
// its sum of squares in kRmsLanes double lanes (value i in lane i %
// kRmsLanes) folded by rms_scale, so that every kernel set gives bitwise the
// same result (each square is exact in double; only the order of the sum
// differs from ref::rmsnorm's one running sum, which is a chain of dependent
// adds: 0.6 us for a 640-wide row, 18 layers x 4 rows + 5 heads per token).
using RmsNormFn = void (*)(float* out, const float* x, const float* w, int64_t n, float eps);
constexpr int kRmsLanes = 16;
// The lanes' sum (halves added pairwise: lane l + lane l + h, h = 8, 4, 2,
// 1), then ref::rmsnorm's scale from it. Overwrites lanes. (Always inlined:
// the files that include this are built for different instruction sets.)
[[gnu::always_inline]] inline float rms_scale(double* lanes, int64_t n, float eps) {
  for (int h = kRmsLanes / 2; h >= 1; h /= 2)
    for (int l = 0; l < h; l++) lanes[l] += lanes[l + h];
  return static_cast<float>(1.0 / std::sqrt(lanes[0] / static_cast<double>(n) + eps));
}
// out[g, :] += sum_k p[g * p_stride + k] * v[k][:] for g < G (out rows
// out_stride apart, HD values each): the attention output of G query heads
// that share the value rows v[0..n).
using WeightedSumFn = void (*)(float* out, int out_stride, int G, const float* p, int p_stride,
                               const float* const* v, int n, int HD);
// s[g * s_stride + j] = scale * dot(q + g * HD, k[j]) for g < G, j < n: the
// attention scores of G query heads that share the key rows k[0..n). Each
// key row is loaded once for all G heads.
using ScoresFn = void (*)(float* s, int s_stride, int G, const float* q, const float* const* k, int n, int HD,
                          float scale);
// The same two with the K/V rows in IEEE half precision (an F16 KV cache).
using WeightedSumF16Fn = void (*)(float* out, int out_stride, int G, const float* p, int p_stride,
                                  const uint16_t* const* v, int n, int HD);
using ScoresF16Fn = void (*)(float* s, int s_stride, int G, const float* q, const uint16_t* const* k, int n, int HD,
                             float scale);
// The same two over a Q8_0 cache: each row's HD values are HD / 32
// BlockQ8_0 (an F16 scale and 32 int8), HD a multiple of 32.
using WeightedSumQ8Fn = void (*)(float* out, int out_stride, int G, const float* p, int p_stride,
                                 const uint8_t* const* v, int n, int HD);
using ScoresQ8Fn = void (*)(float* s, int s_stride, int G, const float* q, const uint8_t* const* k, int n, int HD,
                            float scale);
// Rounds floats to IEEE half (to nearest even): K/V rows into an F16 cache
// (the BF16 cache's rounding has the same shape).
using ToF16Fn = void (*)(const float* x, uint16_t* out, int64_t n);

// ---- weights repacked at load for prefill -------------------------------
// Groups of 8 blocks of 32 values laid out so that one 32-byte vector of
// quants holds four values of each of the 8 blocks: one dpbusd then advances
// 8 block sums side by side, and the float work (conversion, scales) is paid
// once per group rather than once per block.
constexpr int kGroupBlocks = 8;

// Q5_0 with the quants unpacked to bytes (0..31): per group [8 fp16 scales |
// 8 x 32 bytes, vector v holding values 4v..4v+3 of block i at bytes
// 4i..4i+3] = 272 bytes, then the row's last nb % 8 blocks unchanged. 55%
// more bytes than the file's layout, and no unpacking in the kernel: the
// layout the tile kernels read. The AVX2 and AVX-VNNI sets store it so
// (the packed layouts below, with the fifth bits expanded by shuffles and
// compares for want of mask registers, measured 6% slower decode with the
// AVX2 set on Zen 5, 6 alternating rounds); the AVX-512 set stores the
// packed layout below and unpacks it for them.
constexpr int kGroupBytesQ5_0U8 = 272;
void repack_q5_0_u8_row(const uint8_t* src, uint8_t* dst, int64_t n);
// Q5_0 at the file's size (22 bytes a block), as the AVX-512 kernels store
// it: the byte layout above with each group's 256 bytes of quants u (u0..u3
// its four 64-byte chunks) as [u0 | u2 << 4 (64 bytes of nibbles) | u1 | u3
// << 4 | 4 x 8 bytes: the fifth bits of u0..u3, bit j of chunk k's word for
// its byte j] = 176 bytes; a half group [4 fp16 scales | u0 | u1 << 4 | 2 x
// 8 bytes of fifth bits] = 88 bytes; the last blocks as in the file. Decode
// is bound by the bytes it reads: Gemma 3 270M reads 24 MB less per token
// than with byte quants, and its decode kernels unpack in registers (a
// load of each mask word and a masked add per 64 bytes). Passes of 4 tokens
// or more unpack rows into the byte layout (Kernels::unpack_q5_0_packed,
// bitwise unpack_q5_0_packed_row's bytes) for the tile kernels.
constexpr int kGroupBytesQ5_0P = 176;
constexpr int kHalfGroupBytesQ5_0P = 88;
void repack_q5_0_packed_row(const uint8_t* src, uint8_t* dst, int64_t n);
// A packed Q5_0 row back to repack_q5_0_u8_row's bytes (the portable
// reference of Kernels::unpack_q5_0_packed).
void unpack_q5_0_packed_row(const uint8_t* src, uint8_t* dst, int64_t n);
inline size_t q5_0_packed_row_bytes(int64_t n) { return static_cast<size_t>(n / 32) * 22; }
// Q8_0: [8 fp16 scales | 8 x 32 bytes of q + 128] = 272 bytes, as the file.
constexpr int kGroupBytesQ8_0U8 = 272;
void repack_q8_0_u8_row(const uint8_t* src, uint8_t* dst, int64_t n);
// A repacked Q8_0 row back to n floats, bitwise what dequantize_row gives
// for the file's row: a tied token embedding is looked up in the output
// matrix's repacked copy, so that the file's copy is not read again.
void dequantize_q8_0_u8_row(const uint8_t* src, float* out, int64_t n);
// Q4_0: [8 fp16 scales | 4 x 32 bytes of nibbles, vector k holding values
// 4k..4k+3 (low nibbles) and 16+4k..16+4k+3 (high) of block i at bytes
// 4i..4i+3] = 144 bytes, as the file.
constexpr int kGroupBytesQ4_0 = 144;
void repack_q4_0_row(const uint8_t* src, uint8_t* dst, int64_t n);
// MXFP4: [8 E8M0 exponents | 4 x 32 bytes of nibbles in Q4_0's order] = 136
// bytes, as the file (17 per block); the kernel maps each nibble to its
// E2M1 value plus 12 (0..24, unsigned) with one byte shuffle per vector.
constexpr int kGroupBytesMXFP4 = 136;
void repack_mxfp4_row(const uint8_t* src, uint8_t* dst, int64_t n);
// The unsigned value of each MXFP4 nibble in the grouped kernels: twice its
// E2M1 value plus 12 (so the offset term is 12 times the activation sum).
inline constexpr uint8_t kMxfp4Unsigned[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
// When a row's last nb % 8 blocks are 4 or more, their first 4 form a half
// group (for all four formats): [4 fp16 scales (MXFP4: 4 exponent bytes and
// 4 zero bytes) | 4 x 32 bytes of unsigned quants (Q5_0: 0..31, Q8_0: q +
// 128, Q4_0: 0..15, MXFP4: kMxfp4Unsigned), chunk k holding values
// 8k+4h..8k+4h+3 of block i at bytes 16h+4i..16h+4i+3] = 136 bytes. Four
// dpbusd then cover 4 blocks, where block by block would take 4 dot products
// plus 4 conversions and scalings. The last nb % 4 blocks stay as in the file.
constexpr int kHalfGroupBytes = 136;
inline int64_t half_groups(int64_t nb) { return nb % kGroupBlocks >= 4 ? 1 : 0; }
// Bytes of a repacked row of n values: the groups, the half group, then the
// remaining blocks.
inline size_t grouped_row_bytes(TensorType t, int64_t n) {
  const int64_t nb = n / 32, ng = nb / kGroupBlocks, nh = half_groups(nb), rest = nb - ng * kGroupBlocks - 4 * nh;
  const auto per = [&](size_t group_bytes, size_t block_bytes) {
    return static_cast<size_t>(ng) * group_bytes + static_cast<size_t>(nh) * kHalfGroupBytes +
           static_cast<size_t>(rest) * block_bytes;
  };
  switch (t) {
    case TensorType::Q5_0: return per(kGroupBytesQ5_0U8, 22);
    case TensorType::Q8_0: return per(kGroupBytesQ8_0U8, 34);
    case TensorType::Q4_0: return per(kGroupBytesQ4_0, 18);
    case TensorType::MXFP4: return per(kGroupBytesMXFP4, 17);
    default: return 0;
  }
}

// Q4_K: a super-block already is 8 sub-blocks of 32; rewritten (160 bytes):
// [d fp16 | dmin fp16 | 8 scales u8 | 8 mins u8 | 12 zero bytes | 4 x 32
// bytes of nibbles in the same interleaved order as Q5_0's]. The kernels
// read the compact form below; this one, written value by value, is its
// reference in the tests, and Q5_K's layout starts with its header.
constexpr int kGroupBytesQ4_K = 160;
void repack_q4_k_row(const uint8_t* src, uint8_t* dst, int64_t n);
// Q4_K as the kernels read it: at the file's size (144 bytes), [d fp16 |
// dmin fp16 | the file's 12 bytes of 6-bit scales and mins | the nibbles as
// above]; the kernels expand the scales themselves (a few integer operations
// a super-block and row, beside the vector work). Decode reads 10% less of
// every Q4_K matrix than with kGroupBytesQ4_K's byte scales and padding.
constexpr int kGroupBytesQ4_KC = 144;
void repack_q4_k_compact_row(const uint8_t* src, uint8_t* dst, int64_t n);
// The 8 scales and 8 mins of a Q4_K super-block (6 bits each, packed in 12
// bytes as in the file) as 8 bytes each, scale j / min j in byte j.
inline void q4_k_scales_mins(const uint8_t* s12, uint64_t& scales, uint64_t& mins) {
  uint32_t a, b, c;  // the file's bytes 0..3, 4..7, 8..11
  std::memcpy(&a, s12, 4);
  std::memcpy(&b, s12 + 4, 4);
  std::memcpy(&c, s12 + 8, 4);
  constexpr uint32_t k6 = 0x3F3F3F3F, k4 = 0x0F0F0F0F, k2 = 0x03030303;
  // j < 4: the low 6 bits of byte j (scales) and byte 4 + j (mins); j >= 4:
  // the low (scale) or high (min) nibble of byte 4 + j, with the top 2 bits
  // of byte j - 4 (scale) or byte j (min) above it.
  scales = (a & k6) | static_cast<uint64_t>((c & k4) | (((a >> 6) & k2) << 4)) << 32;
  mins = (b & k6) | static_cast<uint64_t>(((c >> 4) & k4) | (((b >> 6) & k2) << 4)) << 32;
}
// Q5_K: the same header, then the 256 quants (0..31) as bytes in the grouped
// order (8 x 32 bytes) = 288 bytes; the Q4_K kernel with byte quants.
constexpr int kGroupBytesQ5_K = 288;
void repack_q5_k_row(const uint8_t* src, uint8_t* dst, int64_t n);
// Q5_K at the file's size (176 bytes), as the AVX-512 kernels store it: [d
// fp16 | dmin fp16 | the file's 12 bytes of 6-bit scales and mins | the byte
// quants packed as kGroupBytesQ5_0P's: 128 bytes of nibbles, 4 words of
// fifth bits]. The one-token kernel reads it (36% fewer bytes than the byte
// layout); passes of 4 tokens or more unpack it to kGroupBytesQ5_K's
// (Kernels::unpack_q5_k_packed, bitwise unpack_q5_k_packed_row's).
constexpr int kGroupBytesQ5_KP = 176;
void repack_q5_k_packed_row(const uint8_t* src, uint8_t* dst, int64_t n);
void unpack_q5_k_packed_row(const uint8_t* src, uint8_t* dst, int64_t n);

// Q6_K: a super-block is 8 units of 32 values, each two 16-value halves with
// their own int8 scale. Repacked (288 bytes): [d fp16 | 2 zero bytes | the 8
// first-half scales | the 8 second-half scales | 12 zero bytes | 8 x 32 bytes
// of quants 0..63 in the grouped order].
constexpr int kGroupBytesQ6_K = 288;
void repack_q6_k_row(const uint8_t* src, uint8_t* dst, int64_t n);
// Q6_K at the file's size (210 bytes), as the AVX-512 kernels store it: [d
// fp16 | the 8 first-half scales | the 8 second-half scales | the 256 byte
// quants u (chunks u0..u3 of 64 bytes) as [u0 | u2 << 4 | u1 | u3 << 4]
// (their low 4 bits, 128 bytes) | for each chunk k, a 64-bit word of bit 4
// then one of bit 5 of its bytes (64 bytes)]. The one-token kernel adds the
// high bits back with two masked adds per 64 bytes; passes of 4 tokens or
// more unpack the rows into kGroupBytesQ6_K's layout (Kernels::
// unpack_q6_k_packed, bitwise unpack_q6_k_packed_row's) for the tile kernels.
// Decode reads 27% less of every Q6_K matrix than with byte quants.
constexpr int kGroupBytesQ6_KP = 210;
void repack_q6_k_packed_row(const uint8_t* src, uint8_t* dst, int64_t n);
void unpack_q6_k_packed_row(const uint8_t* src, uint8_t* dst, int64_t n);

// Activations of one group of 8 blocks in the matching layout: qs[v] holds,
// for block i, its values 4v..4v+3 at bytes 4i..4i+3. A half group (4
// blocks) uses the first 128 bytes of qs in the half-group weight order and
// the first 4 entries of d, off and half_lo.
// Aligned to a cache line (352 bytes of data, 384 with the padding): a
// 64-byte load that crosses a line takes two load slots, and the AVX-512
// kernels read qs as 64-byte operands of dpbusd (at half the rate when
// every other group straddled a line: measured 4.1 against 8.1 G dpbusd/s
// on a Zen 5 core).
struct alignas(64) ActGroup {
  int8_t qs[8][32];
  float d[8];
  int32_t off[8];      // 16 * (sum of block i's quants): Q5_0's -16 offset
  int32_t half_lo[8];  // sum of block i's first 16 quants (Q6_K's halves)
};
// Groups (full, then half) of a row of nb blocks.
inline int64_t act_groups(int64_t nb) { return nb / kGroupBlocks + half_groups(nb); }
// Builds the act_groups(nb) groups of one token's nb blocks of activations.
void group_act(const ActQ8* a, ActGroup* g, int64_t nb);

// The groups of two tokens side by side, for kernels that put two tokens in
// one 64-byte vector (the weights' 32 bytes duplicated in both halves): qs[v]
// is token 0's ActGroup::qs[v] then token 1's, off and d token 0's 8 entries
// then token 1's. Each dpbusd lane then holds one (block, token) sum, with
// no folding of lanes afterwards. 704 bytes (the 640 before half_lo, which
// only Q6_K reads: 320 per token, where an ActGroup takes 384).
struct alignas(64) ActPair {
  int8_t qs[8][64];
  int32_t off[16];
  float d[16];
  int32_t half_lo[16];
};
// out[g] = groups g0[g] and g1[g] side by side, for g < n.
void pair_groups(const ActGroup* g0, const ActGroup* g1, ActPair* out, int64_t n);

// dot of N rows of activations with one repacked row: token j's groups
// at g + j * g_stride, its plain blocks (for the tail) at a + j * a_stride.
using DotR8Fn = void (*)(const uint8_t* w_row, const ActGroup* g, int64_t g_stride, const ActQ8* a, int64_t a_stride,
                         int64_t n, float* out);
// The same for Kernels::repacked_rows rows (row r at w_row0 + r * row_bytes)
// and Kernels::repacked_tokens tokens: out[r * repacked_tokens + j], bitwise
// equal to the one-row kernels.
using DotR8RowsFn = void (*)(const uint8_t* w_row0, size_t row_bytes, const ActGroup* g, int64_t g_stride,
                             const ActQ8* a, int64_t a_stride, int64_t n, float* out);
// Where a decode rows kernel asks for the rows ahead (CpuSwitches::
// decode_prefetch_l2): prefetchnta, or prefetcht1 (on a Zen 4 core into L2,
// not L1).
enum class PrefetchHint : uint8_t { nta, t1 };
// The hint as __builtin_prefetch's locality (a constant there: one
// instance per hint): prefetcht1 is 2, prefetchnta 0.
constexpr int prefetch_locality(PrefetchHint h) { return h == PrefetchHint::t1 ? 2 : 0; }
// Decode rows: kDecodeRows rows (row r at w_row0 + r * row_bytes, read as
// stored, as the one-token kernel reads them) times one token: out[r],
// bitwise the one-token kernel's. ahead > 0: the stretch ahead bytes past
// the rows (not past end) is prefetched in address order with hint, a
// share before each group (or super-block) of the call, so that the
// requests are spread over the call.
using DotRowsPfFn = void (*)(const uint8_t* w_row0, size_t row_bytes, const ActGroup* g, const ActQ8* a, int64_t n,
                             float* out, size_t ahead, const uint8_t* end, PrefetchHint hint);
// Refined decode rows (a DotRowsPfFn too): the same rows times two
// activation rows, a token's and its residual's (matmul_fast's precise
// products), stored one after the other: groups at g and g +
// act_groups(n / 32) (at least 1), blocks at a and a + n / 32. out[r * 2 +
// j], each bitwise the decode rows kernel's: the weights' quants are loaded
// and unpacked once for both.

// The tile kernels (DotR8RowsFn) on paired activations: token pair p's
// groups at pairs + p * p_stride (tokens 2p and 2p + 1), its plain blocks
// still at a + j * a_stride; written straight into the product's (token,
// row) layout: out[j * out_stride + r] = the sum (add: out[j * out_stride +
// r] + the sum), each sum bitwise the one-row kernels'.
using DotPairsFn = void (*)(const uint8_t* w_row0, size_t row_bytes, const ActPair* pairs, int64_t p_stride,
                            const ActQ8* a, int64_t a_stride, int64_t n, float* out, int64_t out_stride, bool add);
// Row tiles (AVX-512, prefill): kRowTile rows of a 32-value format in the
// byte layout (kGroupBytesQ5_0U8's, or Q8_0's), rewritten block by block so
// that lane r of every 64-byte vector is row r: per block, the 16 rows'
// scales as floats (64 bytes), then for v = 0..7 the rows' values 4v..4v+3
// (8 x 64 bytes). A dpbusd of one such vector against a token's 4 values
// broadcast gives 16 rows' partial sums at once, and a token's results come
// out as one 64-byte store, with no lanes to fold. The kernel keeps the
// one-token kernel's float operations per (row, token): block i of each
// group is summed in its lane i, the lanes in hsum8's tree, so its results
// are bitwise dot1's. Rows of n values with nb % 4 != 0 (blocks outside
// the groups) have no row-tile kernel.
constexpr int kRowTile = 16;
constexpr int kRowTileBlockBytes = 64 + 8 * 64;
inline size_t row_tile_bytes(int64_t n) { return static_cast<size_t>(n / 32) * kRowTileBlockBytes; }
// tile = kRowTile rows of n values (row r at rows + r * row_bytes, in the byte layout).
using TileRowsFn = void (*)(const uint8_t* rows, size_t row_bytes, int64_t n, uint8_t* tile);
// out[j * out_stride + r] (r < kRowTile) = row r of tile · token j's n
// activations (at a + j * a_stride), for j < tokens (any number: 4 a
// kernel call, then the last 1 to 3); add: added to what is there.
using DotRowTileFn = void (*)(const uint8_t* tile, const ActQ8* a, int64_t a_stride, int64_t n, int tokens, float* out,
                              int64_t out_stride, bool add);
// Rewrites a stored row of n values into the layout the tile kernels read.
using UnpackRowFn = void (*)(const uint8_t* src, uint8_t* dst, int64_t n);

// Rows per call of the decode kernels (Kernels::dot_grouped_x1_rows and
// the like): one call's chains of several rows overlap, and their sums
// share one tree.
constexpr int kDecodeRows = 4;

// Slots of the per-type kernel tables: every TensorType id (MXFP4 = 39) fits.
constexpr int kTypeSlots = 40;

struct Kernels {
  const char* isa = "portable";
  QuantizeActFn quantize_act = nullptr;
  DotQ8Fn dot_q8[kTypeSlots] = {};    // by TensorType id; null: not a block type
  DotQ8x4Fn dot_q8_x4[kTypeSlots] = {};  // null: use dot_q8 four times
  DotF32Fn dot_f32[kTypeSlots] = {};  // F32, F16, BF16 weights
  DotF32F32Fn dot = nullptr;  // attention scores
  AxpyFn axpy = nullptr;      // attention output
  GatedActFn gelu_mul = nullptr;  // GELU (tanh approximation) gate
  GatedActFn silu_mul = nullptr;  // SiLU gate
  ExpSumFn exp_sum = nullptr;     // softmax numerators
  RmsNormFn rms_norm = nullptr;   // RMS norm (bitwise the same in every set)
  WeightedSumFn weighted_sum = nullptr;  // attention output
  ScoresFn scores = nullptr;             // attention scores
  WeightedSumF16Fn weighted_sum_f16 = nullptr;  // the same over an F16 cache
  ScoresF16Fn scores_f16 = nullptr;
  ToF16Fn to_f16 = nullptr;
  WeightedSumF16Fn weighted_sum_bf16 = nullptr;  // the same over a BF16 cache (rows of bfloat16 bits)
  ScoresF16Fn scores_bf16 = nullptr;
  ToF16Fn to_bf16 = nullptr;  // rounds to bfloat16, to nearest even (fp32_to_bf16)
  WeightedSumQ8Fn weighted_sum_q8_0 = nullptr;  // the same over a Q8_0 cache (rows quantized as quantize_row's Q8_0)
  ScoresQ8Fn scores_q8_0 = nullptr;
  DotR8Fn dot_grouped_x1[kTypeSlots] = {};  // repacked 32-value formats, by TensorType id
  DotR8Fn dot_grouped_x4[kTypeSlots] = {};
  // Decode rows (DotRowsPfFn; null: the kernel set has none).
  DotRowsPfFn dot_grouped_x1_rows[kTypeSlots] = {};
  DotRowsPfFn dot_grouped_x1_rows2[kTypeSlots] = {};  // refined decode rows (null: none)
  DotRowsPfFn dot_q4_k_r8_x1_rows = nullptr;
  DotRowsPfFn dot_q5_k_r8_x1_rows = nullptr;
  DotRowsPfFn dot_q6_k_r8_x1_rows = nullptr;
  DotR8Fn dot_q4_k_r8_x1 = nullptr;  // repacked Q4_K (null: not repacked)
  DotR8Fn dot_q4_k_r8_x4 = nullptr;
  DotR8Fn dot_q5_k_r8_x1 = nullptr;  // repacked Q5_K (null: not repacked)
  DotR8Fn dot_q5_k_r8_x4 = nullptr;
  DotR8Fn dot_q6_k_r8_x1 = nullptr;  // repacked Q6_K (null: not repacked)
  DotR8Fn dot_q6_k_r8_x4 = nullptr;
  int repacked_rows = 1;    // rows per call of the *_tile kernels (2 where registers allow)
  int repacked_tokens = 4;  // tokens per call of the *_tile kernels (8 with AVX-512)
  DotR8RowsFn dot_grouped_tile[kTypeSlots] = {};
  // repacked_rows rows x repacked_tokens tokens on paired activations
  // (null: the kernel set has none; dot_grouped_tile then).
  DotPairsFn dot_grouped_tile_pairs[kTypeSlots] = {};
  // Q5_0 stored packed (repack_q5_0_packed_row; null: stored as bytes):
  // its decode kernels (one token; the refined rows' two) read the packed
  // rows, the others the bytes that unpack_q5_0_packed gives.
  DotR8Fn dot_q5_0_packed_x1 = nullptr;
  DotRowsPfFn dot_q5_0_packed_x1_rows = nullptr;  // decode rows of packed rows
  DotRowsPfFn dot_q5_0_packed_x1_rows2 = nullptr;  // refined decode rows of packed rows
  UnpackRowFn unpack_q5_0_packed = nullptr;
  // The same for Q5_K and Q6_K (repack_q5_k_packed_row,
  // repack_q6_k_packed_row; null: stored as bytes).
  DotR8Fn dot_q5_k_packed_x1 = nullptr;
  DotRowsPfFn dot_q5_k_packed_x1_rows = nullptr;
  UnpackRowFn unpack_q5_k_packed = nullptr;
  DotR8Fn dot_q6_k_packed_x1 = nullptr;
  DotRowsPfFn dot_q6_k_packed_x1_rows = nullptr;
  UnpackRowFn unpack_q6_k_packed = nullptr;
  // Row tiles of the byte layout (kRowTile; null: the kernel set has none).
  TileRowsFn tile_rows[kTypeSlots] = {};
  DotRowTileFn dot_row_tile[kTypeSlots] = {};
  DotPairsFn dot_q4_k_r8_tile_pairs = nullptr;
  DotPairsFn dot_q5_k_r8_tile_pairs = nullptr;
  DotPairsFn dot_q6_k_r8_tile_pairs = nullptr;
  DotR8RowsFn dot_q4_k_r8_tile = nullptr;
  DotR8RowsFn dot_q5_k_r8_tile = nullptr;
  DotR8RowsFn dot_q6_k_r8_tile = nullptr;
  // The same for repacked_rows rows x 4 tokens (a tile's last 4 to 7 tokens,
  // decode batches of 4 to 7): out[r * 4 + j].
  DotR8RowsFn dot_grouped_tile4[kTypeSlots] = {};
  DotR8RowsFn dot_q4_k_r8_tile4 = nullptr;
  DotR8RowsFn dot_q5_k_r8_tile4 = nullptr;
  DotR8RowsFn dot_q6_k_r8_tile4 = nullptr;
};

// How a block format is repacked at load and multiplied afterwards by the
// kernels k: the row rewrite, the bytes of a repacked row of n values and the
// dot products. repack == nullptr: k has no repacked form of t (or of rows
// of n values).
struct RepackedFormat {
  void (*repack)(const uint8_t* src, uint8_t* dst, int64_t n) = nullptr;
  size_t row_bytes = 0;
  DotR8Fn dot1 = nullptr, dot4 = nullptr;
  DotR8RowsFn dot_tile = nullptr;   // k.repacked_rows rows x k.repacked_tokens tokens
  DotR8RowsFn dot_tile4 = nullptr;  // k.repacked_rows rows x 4 tokens
  DotPairsFn dot_tile_pairs = nullptr;  // dot_tile's work on paired activations, where k has it
  // Where rows are stored packed (Q5_0 on AVX-512): dot1 reads the stored
  // row; dot4, dot_tile, dot_tile4 and dot_tile_pairs read it rewritten by
  // unpack (unpacked_row_bytes a row). Null: every kernel reads the stored row.
  UnpackRowFn unpack = nullptr;
  size_t unpacked_row_bytes = 0;
  // Prefill's row tiles (kRowTile rows of the byte layout: the stored rows,
  // or unpack's), where k has them for rows of n values; null: none.
  TileRowsFn tile_rows = nullptr;
  DotRowTileFn dot_row_tile = nullptr;
  // Decode rows (DotRowsPfFn: kDecodeRows rows x one token, reading the
  // stored rows as dot1 does); null: dot1 row by row.
  DotRowsPfFn dot1_rows = nullptr;
  // Refined decode rows (two activation rows; see DotRowsPfFn); null: dot1_rows twice.
  DotRowsPfFn dot1_rows2 = nullptr;
};
RepackedFormat repacked_format(const Kernels& k, TensorType t, int64_t n);

// The portable kernels (always available; the oracle for the SIMD ones).
const Kernels& portable_kernels();
// The AVX2 (+FMA, F16C) kernels, or nullptr when the CPU lacks them.
const Kernels* avx2_kernels();
// The same with AVX-VNNI dot products (bitwise equal results), or nullptr.
const Kernels* avxvnni_kernels();
// The same with the repacked groups' sums on AVX-512 VNNI (bitwise equal), or
// nullptr.
const Kernels* avx512_kernels();
// Every SIMD kernel set this CPU runs, best last (for tests).
std::vector<const Kernels*> simd_kernels();
// The best kernels this CPU runs, at most cap (CpuSwitches::isa_cap:
// "portable", "avx2" or "avx-vnni"; "" or another value: no cap), for
// comparisons.
const Kernels& best_kernels(const std::string& cap = "");

inline bool uses_q8_activations(TensorType t) {
  return t != TensorType::F32 && t != TensorType::F16 && t != TensorType::BF16;
}

}  // namespace phaselab::cpu
