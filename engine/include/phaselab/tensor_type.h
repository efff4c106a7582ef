// GGUF tensor types (the ids: phaselab/formats/tensor_type_id.h, shared with
// the CUDA kernels) and their block geometry. A row of n values of a block
// type takes n / block_size blocks of type_size bytes each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "phaselab/formats/tensor_type_id.h"

namespace phaselab {

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
