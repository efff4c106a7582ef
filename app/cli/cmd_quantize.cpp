// phaselab-cli quantize IN OUT TYPE: rewrites a GGUF model in one of
// llama.cpp's file types with llama.cpp's per-tensor mix (the work is
// phaselab::quantize_model; this prints its progress and a summary).
#include <unistd.h>

#include <cstdio>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "phaselab/quantize.h"

namespace phaselab::cli {

namespace {

double mib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

std::string type_list() {
  std::string s;
  for (FileType t : supported_file_types()) {
    if (!s.empty()) s += ' ';
    s += file_type_name(t);
  }
  return s;
}

}  // namespace

int cmd_quantize(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          {{"--help", "-h", false}, {"--force", "-f", false}, {"--threads", "-t", true}, {"--quiet", "-q", false}});
  if (!args) return report(args.status());
  if (args->has("--help") || args->positional().size() != 3) {
    std::fprintf(args->has("--help") ? stdout : stderr,
                 "usage: phaselab-cli quantize [--force] [-t N] [-q] IN.gguf OUT.gguf TYPE\n"
                 "  TYPE: a llama.cpp file type: %s\n"
                 "        (Q4_K and Q5_K mean Q4_K_M and Q5_K_M)\n"
                 "  Tensors get llama.cpp's per-tensor types for that file type (e.g. Q4_K_M: Q6_K for\n"
                 "  the output and for attn_v/ffn_down in some layers); norms and biases keep theirs.\n"
                 "  A quantized IN is dequantized and quantized again (tensors already in their target\n"
                 "  type are copied unchanged).\n"
                 "  -t, --threads N  threads (default: one per hardware thread)\n"
                 "  -f, --force      replace an existing OUT (never IN itself)\n"
                 "  -q, --quiet      no progress, only the summary\n"
                 "  OUT is written beside itself and renamed into place once complete and reloaded.\n",
                 type_list().c_str());
    return args->has("--help") ? kExitOk : kExitBadInput;
  }
  const auto& pos = args->positional();
  const auto ft = parse_file_type(pos[2]);
  if (!ft) return usage_error("unknown or unsupported type '" + pos[2] + "' (one of: " + type_list() + ")");
  auto threads = args->get_int("--threads", 0, 0, 256);
  if (!threads) return report(threads.status());
  if (*threads > 0) warn_if_oversubscribed(*threads);

  QuantizeOptions opts;
  opts.n_threads = *threads;
  opts.overwrite = args->has("--force");
  const bool tty = ::isatty(STDERR_FILENO);
  const bool quiet = args->has("--quiet");
  int last_pct = -1;
  auto progress = [&](size_t i, size_t n, uint64_t done, uint64_t total) {
    if (quiet) return;
    const int pct = total ? static_cast<int>(100 * done / total) : 100;
    if (tty) {
      std::fprintf(stderr, "\rquantize: tensor %zu/%zu, %3d%% of %.1f MiB", i + 1, n, pct, mib(total));
      if (i + 1 == n) std::fputc('\n', stderr);
    } else if (pct / 10 != last_pct / 10 || i + 1 == n) {
      std::fprintf(stderr, "quantize: tensor %zu/%zu, %d%%\n", i + 1, n, pct);
    }
    last_pct = pct;
  };
  auto rep = quantize_model(pos[0], pos[1], *ft, opts, progress, nullptr);
  if (!rep) return report(rep.status());

  const std::string name(file_type_name(*ft));
  std::fprintf(stderr, "quantize: %s (%s, %.1f MiB) -> %s (%s, %.1f MiB) in %.1f s on %d thread%s\n", pos[0].c_str(),
               rep->in_file_type.empty() ? "no file type" : rep->in_file_type.c_str(), mib(rep->in_file_bytes),
               pos[1].c_str(), name.c_str(), mib(rep->out_file_bytes), rep->seconds, rep->n_threads,
               rep->n_threads == 1 ? "" : "s");
  const int copied = static_cast<int>(rep->tensors.size()) - rep->n_converted;
  std::fprintf(stderr, "quantize: %d tensors converted, %d copied unchanged (already in their target type)\n",
               rep->n_converted, copied);
  if (rep->n_requantized > 0)
    std::fprintf(stderr,
                 "quantize: requantizing: %d tensors were quantized already and were dequantized to F32 first;\n"
                 "          their error adds to the original quantization's (quantize from F16/BF16/F32 when you can)\n",
                 rep->n_requantized);
  if (rep->n_fallback > 0)
    std::fprintf(stderr, "quantize: %d tensors took a fallback type (row length not a multiple of 256)\n",
                 rep->n_fallback);
  std::string mix;
  for (const auto& c : rep->type_mix) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s x%d (%.1f MiB)", mix.empty() ? "" : ", ",
                  std::string(tensor_type_name(c.type)).c_str(), c.tensors, mib(c.bytes));
    mix += buf;
  }
  std::fprintf(stderr, "quantize: type mix: %s\n", mix.c_str());
  return kExitOk;
}

}  // namespace phaselab::cli
