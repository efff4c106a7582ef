// GGUF tensor types (the ggml type ids as stored in the file) and their block
// geometry. A row of n values of a block type takes n / block_size blocks of
// type_size bytes each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

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
};

struct TensorTypeTraits {
  TensorType type;
  std::string_view name;
  uint32_t block_size;  // values per block
  uint32_t type_size;   // bytes per block
  bool can_dequantize;  // PhaseLab has a dequantizer (and so can compute with it)
};

// Traits of a type id read from a file; nullopt for ids PhaseLab does not know
// (e.g. the IQ* families), which the reader refuses with a message.
std::optional<TensorTypeTraits> tensor_type_traits(uint32_t type_id);
const TensorTypeTraits& traits_of(TensorType t);
std::string_view tensor_type_name(TensorType t);

// Bytes taken by a row of n values; n must be a multiple of the block size.
inline size_t row_size(TensorType t, int64_t n) {
  const auto& tr = traits_of(t);
  return static_cast<size_t>(n / tr.block_size) * tr.type_size;
}

}  // namespace phaselab
