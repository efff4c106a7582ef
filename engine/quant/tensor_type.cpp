#include "phaselab/tensor_type.h"

#include <array>

namespace phaselab {
namespace {

constexpr std::array<TensorTypeTraits, 21> kTraits = {{
    {TensorType::F32, "F32", 1, 4, true},
    {TensorType::F16, "F16", 1, 2, true},
    {TensorType::Q4_0, "Q4_0", 32, 18, true},
    {TensorType::Q4_1, "Q4_1", 32, 20, true},
    {TensorType::Q5_0, "Q5_0", 32, 22, true},
    {TensorType::Q5_1, "Q5_1", 32, 24, true},
    {TensorType::Q8_0, "Q8_0", 32, 34, true},
    {TensorType::Q8_1, "Q8_1", 32, 36, false},
    {TensorType::Q2_K, "Q2_K", 256, 84, false},
    {TensorType::Q3_K, "Q3_K", 256, 110, false},
    {TensorType::Q4_K, "Q4_K", 256, 144, true},
    {TensorType::Q5_K, "Q5_K", 256, 176, true},
    {TensorType::Q6_K, "Q6_K", 256, 210, true},
    {TensorType::Q8_K, "Q8_K", 256, 292, false},
    {TensorType::I8, "I8", 1, 1, false},
    {TensorType::I16, "I16", 1, 2, false},
    {TensorType::I32, "I32", 1, 4, false},
    {TensorType::I64, "I64", 1, 8, false},
    {TensorType::F64, "F64", 1, 8, false},
    {TensorType::BF16, "BF16", 1, 2, true},
    {TensorType::MXFP4, "MXFP4", 32, 17, true},
}};

}  // namespace

std::optional<TensorTypeTraits> tensor_type_traits(uint32_t type_id) {
  for (const auto& t : kTraits)
    if (static_cast<uint32_t>(t.type) == type_id) return t;
  return std::nullopt;
}

const TensorTypeTraits& traits_of(TensorType type) {
  for (const auto& t : kTraits)
    if (t.type == type) return t;
  return kTraits[0];  // unreachable for values of the enum
}

std::string_view tensor_type_name(TensorType t) { return traits_of(t).name; }

}  // namespace phaselab
