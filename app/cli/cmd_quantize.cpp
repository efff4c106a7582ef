// phaselab-cli quantize IN OUT TYPE: rewrites a GGUF with its matrices in
// another type (dequantized to F32 and quantized again with PhaseLab's
// reference quantizers). Norms, biases and 1-D tensors keep their type.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_util.h"
#include "commands.h"
#include "phaselab/gguf.h"
#include "phaselab/quant.h"

namespace phaselab::cli {

namespace {

// The output must not be the input (same file, through a symlink or a hard
// link too) and must not replace an existing file unless --force.
Status check_output(const std::string& in, const std::string& out, bool force) {
  struct stat si{}, so{};
  if (::stat(in.c_str(), &si) != 0) return io_error(in + ": cannot open");
  if (::stat(out.c_str(), &so) != 0) return {};  // a new file
  if (si.st_dev == so.st_dev && si.st_ino == so.st_ino)
    return invalid_argument(out + " is the input file itself (or a link to it): write to another file");
  if (!S_ISREG(so.st_mode)) return invalid_argument(out + " exists and is not a regular file");
  if (!force) return invalid_argument(out + " exists: pass --force to replace it");
  return {};
}

// OUT.partial-XXXXXX in OUT's folder, so that the final rename is atomic.
std::string temp_path_beside(const std::string& out) {
  std::string pattern = out + ".partial-XXXXXX";
  const int fd = ::mkstemp(pattern.data());
  if (fd < 0) return {};
  ::close(fd);
  return pattern;
}

}  // namespace


int cmd_quantize(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {{"--help", "-h", false}, {"--force", "-f", false}});
  if (!args) return report(args.status());
  if (args->has("--help") || args->positional().size() != 3) {
    std::fprintf(args->has("--help") ? stdout : stderr,
                 "usage: phaselab-cli quantize [--force] IN.gguf OUT.gguf TYPE\n"
                 "  TYPE: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K (matrices only)\n"
                 "  OUT is written beside itself and renamed into place once complete and reloaded;\n"
                 "  an existing OUT is replaced only with --force, and never when it is IN.\n");
    return args->has("--help") ? kExitOk : kExitBadInput;
  }
  const auto& pos = args->positional();
  std::optional<TensorType> type;
  for (uint32_t id = 0; id < 40; id++)
    if (auto tr = tensor_type_traits(id); tr && tr->can_dequantize && tr->name == pos[2]) type = tr->type;
  if (!type) return usage_error("unknown or unsupported type '" + pos[2] + "'");
  if (Status st = check_output(pos[0], pos[1], args->has("--force")); !st) return report(st);
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
  const std::string tmp = temp_path_beside(pos[1]);
  if (tmp.empty()) return report(io_error(pos[1] + ": cannot create a file in its folder"));
  auto fail = [&](const Status& st) {
    std::remove(tmp.c_str());
    return report(st);
  };
  if (Status st = w.write(tmp); !st) return fail(st);
  // Reload what was written before it replaces anything.
  auto check = GgufFile::open(tmp);
  if (!check) return fail(check.status());
  if ((*check)->tensors().size() != f.tensors().size())
    return fail(internal_error(pos[1] + ": the written file does not read back (tensor count differs)"));
  // mkstemp made it 0600: give it the mode a new file gets here.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::chmod(tmp.c_str(), 0666 & ~mask);
  if (std::rename(tmp.c_str(), pos[1].c_str()) != 0) return fail(io_error(pos[1] + ": cannot rename the finished file into place"));
  std::fprintf(stderr, "quantize: %d matrices converted to %s, written to %s\n", converted, pos[2].c_str(), pos[1].c_str());
  return kExitOk;
}

}  // namespace phaselab::cli
