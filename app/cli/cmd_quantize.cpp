// phaselab-cli quantize IN OUT TYPE: rewrites a GGUF with its matrices in
// another type (dequantized to F32 and quantized again with PhaseLab's
// reference quantizers). Norms, biases and 1-D tensors keep their type.
#include <cstdio>

#include "cli_util.h"
#include "commands.h"
#include "phaselab/gguf.h"
#include "phaselab/quant.h"

namespace phaselab::cli {

namespace {

GgufWriteValue convert_scalar(const GgufValue& v, GgufValueType t, uint64_t k) {
  switch (t) {
    case GgufValueType::UINT8: return GgufWriteValue::u8(static_cast<uint8_t>(v.int_at(k)));
    case GgufValueType::INT8: return GgufWriteValue::i8(static_cast<int8_t>(v.int_at(k)));
    case GgufValueType::UINT16: return GgufWriteValue::u16(static_cast<uint16_t>(v.int_at(k)));
    case GgufValueType::INT16: return GgufWriteValue::i16(static_cast<int16_t>(v.int_at(k)));
    case GgufValueType::UINT32: return GgufWriteValue::u32(static_cast<uint32_t>(v.int_at(k)));
    case GgufValueType::INT32: return GgufWriteValue::i32(static_cast<int32_t>(v.int_at(k)));
    case GgufValueType::UINT64: return GgufWriteValue::u64(static_cast<uint64_t>(v.int_at(k)));
    case GgufValueType::INT64: return GgufWriteValue::i64(v.int_at(k));
    case GgufValueType::FLOAT32: return GgufWriteValue::f32(static_cast<float>(v.float_at(k)));
    case GgufValueType::FLOAT64: return GgufWriteValue::f64(v.float_at(k));
    case GgufValueType::BOOL: return GgufWriteValue::boolean(v.int_at(k) != 0);
    default: return GgufWriteValue::u8(0);
  }
}

GgufWriteValue convert(const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::STRING: return GgufWriteValue::string(std::string(v.str));
    case GgufValueType::ARRAY: {
      std::vector<GgufWriteValue> items;
      items.reserve(v.count);
      if (v.elem_type == GgufValueType::STRING)
        for (auto s : v.strings) items.push_back(GgufWriteValue::string(std::string(s)));
      else if (v.elem_type == GgufValueType::ARRAY)
        for (const auto& it : v.items) items.push_back(convert(it));
      else
        for (uint64_t k = 0; k < v.count; k++) items.push_back(convert_scalar(v, v.elem_type, k));
      return GgufWriteValue::array(v.elem_type, std::move(items));
    }
    case GgufValueType::FLOAT32: return GgufWriteValue::f32(static_cast<float>(v.f));
    case GgufValueType::FLOAT64: return GgufWriteValue::f64(v.f);
    case GgufValueType::BOOL: return GgufWriteValue::boolean(v.u != 0);
    case GgufValueType::UINT8: return GgufWriteValue::u8(static_cast<uint8_t>(v.u));
    case GgufValueType::INT8: return GgufWriteValue::i8(static_cast<int8_t>(v.i));
    case GgufValueType::UINT16: return GgufWriteValue::u16(static_cast<uint16_t>(v.u));
    case GgufValueType::INT16: return GgufWriteValue::i16(static_cast<int16_t>(v.i));
    case GgufValueType::UINT32: return GgufWriteValue::u32(static_cast<uint32_t>(v.u));
    case GgufValueType::INT32: return GgufWriteValue::i32(static_cast<int32_t>(v.i));
    case GgufValueType::UINT64: return GgufWriteValue::u64(v.u);
    case GgufValueType::INT64: return GgufWriteValue::i64(v.i);
  }
  return GgufWriteValue::u8(0);
}

}  // namespace

int cmd_quantize(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {{"--help", "-h", false}});
  if (!args) return report(args.status());
  if (args->has("--help") || args->positional().size() != 3) {
    std::fprintf(args->has("--help") ? stdout : stderr,
                 "usage: phaselab-cli quantize IN.gguf OUT.gguf TYPE\n"
                 "  TYPE: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K (matrices only)\n");
    return args->has("--help") ? kExitOk : kExitBadInput;
  }
  const auto& pos = args->positional();
  std::optional<TensorType> type;
  for (uint32_t id = 0; id < 40; id++)
    if (auto tr = tensor_type_traits(id); tr && tr->can_dequantize && tr->name == pos[2]) type = tr->type;
  if (!type) return usage_error("unknown or unsupported type '" + pos[2] + "'");
  auto in = GgufFile::open(pos[0]);
  if (!in) return report(in.status());
  const GgufFile& f = **in;
  GgufWriter w(3, static_cast<uint32_t>(f.alignment()));
  for (const auto& [key, value] : f.metadata())
    if (key != "general.alignment") w.set(key, convert(value));
  int converted = 0;
  std::vector<float> row;
  for (const auto& t : f.tensors()) {
    const bool matrix = t.n_dims >= 2 && t.ne[0] % traits_of(*type).block_size == 0 && traits_of(t.type).can_dequantize;
    std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    if (!matrix || t.type == *type) {
      if (Status st = w.add_tensor(t.name, t.type, shape, t.data, t.n_bytes); !st) return report(st);
      continue;
    }
    const int64_t n0 = t.ne[0];
    const int64_t rows = static_cast<int64_t>(t.n_elements) / n0;
    std::vector<uint8_t> out(row_size(*type, n0) * rows);
    row.resize(n0);
    for (int64_t r = 0; r < rows; r++) {
      if (Status st = dequantize_row(t.type, t.data + r * row_size(t.type, n0), row.data(), n0); !st) return report(st);
      if (Status st = quantize_row(*type, row.data(), out.data() + r * row_size(*type, n0), n0); !st) return report(st);
    }
    if (Status st = w.add_tensor(t.name, *type, shape, out.data(), out.size()); !st) return report(st);
    converted++;
  }
  if (Status st = w.write(pos[1]); !st) return report(st);
  std::fprintf(stderr, "quantize: %d matrices converted to %s, written to %s\n", converted, pos[2].c_str(), pos[1].c_str());
  return kExitOk;
}

}  // namespace phaselab::cli
