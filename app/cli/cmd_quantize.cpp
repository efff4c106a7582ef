// phaselab-cli quantize IN OUT TYPE: rewrites a GGUF with its matrices in
// another type (dequantized to F32 and quantized again with PhaseLab's
// reference quantizers). Norms, biases and 1-D tensors keep their type.
#include <cstdio>

#include "cli_util.h"
#include "commands.h"
#include "phaselab/gguf.h"
#include "phaselab/quant.h"

namespace phaselab::cli {


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
    if (key != "general.alignment") w.set(key, GgufWriteValue::copy_of(value));
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
