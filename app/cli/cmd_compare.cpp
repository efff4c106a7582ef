// phaselab-cli compare: models and quantizations side by side (speed,
// memory, perplexity, KL divergence against the first), through
// phaselab/compare.h, the same runner the desktop Compare window uses.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "engine_setup.h"
#include "phaselab/compare.h"
#include "phaselab/log.h"

namespace phaselab::cli {

namespace {

const char* const kHelp =
    "usage: phaselab-cli compare -m A.gguf [-m B.gguf ...] [--quant T1,T2,...] [options]\n"
    "  Runs every variant through the same measurements and prints a table (or --json):\n"
    "  pp<P> and tg<N> tokens/s, time to first token of a fixed prompt, peak memory,\n"
    "  file size, perplexity, KL divergence / top-1 agreement against the first variant, and\n"
    "  each other variant's acceptance as the first's speculative draft on the text.\n"
    "  -m, --model PATH       a model (repeat for more; the first is the reference)\n"
    "      --quant T1,T2      also quantizations of the first model (F16 BF16 Q8_0 Q6_K Q5_K_M\n"
    "                         Q5_K_S Q5_0 Q4_K_M Q4_K_S Q4_0 ...), made once into --cache\n"
    "      --cache DIR        where quantized variants are kept (default ~/.cache/PhaseLab/quantized)\n"
    "  -f, --file PATH        evaluation text (default: the bundled eval-en.txt)\n"
    "  -c, --ctx-size N       perplexity chunk length (default 512)\n"
    "      --chunks N         perplexity chunks (default 8; -1: the whole text)\n"
    "  -p, --n-prompt N       prefill test length (default 512; 0 skips it)\n"
    "  -n, --n-gen N          decode test length (default 128; 0 skips it)\n"
    "  -r, --repetitions N    runs of each speed test after a warm-up (default 3)\n"
    "  -t, --threads N        CPU threads (default: one per physical core)\n"
    "      --backend NAME     cpu (default), cpu-portable, cpu-reference, cuda\n"
    "      --no-kv-cache      decode without the KV cache (every variant)\n"
    "      --spec MODE        decode with speculation (every variant): lookup (prompt lookup) or\n"
    "                         self (the model with a layer skipped; CPU backends)\n"
    "      --prune S1,S2      also prunings of the first model: layers:A-B, layers:nN (the N\n"
    "                         layers that change the residual stream least on the text), or\n"
    "                         ffn:P% (P% of every FFN's neurons, the most important on the\n"
    "                         text), made once into --cache\n"
    "      --draft            also measure every variant after the first as a speculative draft\n"
    "                         of the first (distillation, measured): the target answers the\n"
    "                         TTFT chat prompt (-n tokens) plainly and with the variant\n"
    "                         drafting: acceptance, tokens per target pass and the speed-up\n"
    "                         (another model must share the first's vocabulary)\n"
    "      --draft-k N        tokens drafted per target pass in that test (default 4)\n"
    "      --variants-json J  the variants as a JSON array instead of -m/--quant, each\n"
    "                         {\"file\", \"quantize_to\", \"backend\", \"kv_cache\", \"speculative\",\n"
    "                         \"prune\", \"draft\"}\n"
    "                         (what the desktop Compare window runs)\n"
    "      --json             print a JSON array of rows instead of the table\n"
    "      --progress-json    progress on stderr as JSON lines, {\"progress\": {...}}, and each\n"
    "                         variant's row as {\"row\": {...}} once it is measured\n"
    "  Speeds are the mean \u00b1 sample standard deviation of the -r runs. SIGINT or SIGTERM\n"
    "  stops the run at its next step (a quantization in progress is removed).\n";

// Set by SIGINT / SIGTERM, read by run_compare between and inside its steps
// (a lock-free atomic store is safe in a signal handler).
std::atomic<bool> g_stop{false};
void on_stop_signal(int) { g_stop.store(true); }

// The variants: --variants-json, or the models (-m, positional) and the
// quantizations of the first (--quant) with the shared settings.
Result<std::vector<CompareVariant>> variants_from_args(const Args& args, const std::vector<std::string>& models) {
  if (auto j = args.get("--variants-json")) {
    if (!models.empty() || args.has("--quant") || args.has("--prune") || args.has("--draft"))
      return invalid_argument("--variants-json replaces -m, --quant, --prune and --draft (each variant's \"draft\"): "
                              "give one or the other");
    return compare_variants_from_json(*j);
  }
  if (models.empty()) return invalid_argument("give at least one model: compare -m MODEL.gguf (run compare --help)");
  const std::string backend = args.get_or("--backend", "cpu");
  const bool kv = !args.has("--no-kv-cache");
  const std::string spec = args.get_or("--spec", to_string(SpeculativeMode::off));
  std::vector<CompareVariant> variants;
  for (const std::string& m : models) {
    CompareVariant v;
    v.file = m;
    v.backend = backend;
    v.kv_cache = kv;
    v.speculative = spec;
    variants.push_back(v);
  }
  if (auto q = args.get("--quant")) {
    for (const std::string& name : split_commas(*q)) {
      const auto ft = parse_file_type(name);
      if (!ft)
        return invalid_argument("unknown quantization type '" + name +
                                "' (run phaselab-cli quantize --help for the list)");
      CompareVariant v = variants.front();
      v.quantize_to = *ft;
      variants.push_back(v);
    }
  }
  if (auto pr = args.get("--prune")) {
    const CompareVariant first = variants.front();
    for (const std::string& spec : split_commas(*pr)) {
      CompareVariant v = first;
      v.prune = spec;
      variants.push_back(v);
    }
  }
  if (args.has("--draft")) {
    if (variants.size() < 2) return invalid_argument("--draft measures the variants after the first as its drafts: give more than one");
    for (size_t i = 1; i < variants.size(); i++) variants[i].draft = true;
  }
  return variants;
}

}  // namespace

int cmd_compare(int argc, char** argv) {
  // -m may be repeated: take every model out of argv before the parser,
  // which keeps one value per option.
  std::vector<std::string> models;
  std::vector<char*> rest;
  for (int i = 0; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "-m" || a == "--model") {
      if (i + 1 >= argc) return usage_error(a + " needs a value (a .gguf file)");
      for (const std::string& m : split_commas(argv[++i])) models.push_back(m);
    } else if (a.rfind("--model=", 0) == 0) {
      for (const std::string& m : split_commas(a.substr(8))) models.push_back(m);
    } else {
      rest.push_back(argv[i]);
    }
  }
  const std::vector<OptionSpec> specs = {
      {"--quant", "", true},       {"--cache", "", true},        {"--file", "-f", true},
      {"--ctx-size", "-c", true},  {"--chunks", "", true},       {"--n-prompt", "-p", true},
      {"--n-gen", "-n", true},     {"--repetitions", "-r", true}, {"--threads", "-t", true},
      {"--backend", "", true},     {"--no-kv-cache", "", false}, {"--spec", "", true},
      {"--json", "", false},       {"--help", "-h", false},      {"--variants-json", "", true},
      {"--progress-json", "", false}, {"--prune", "", true},       {"--draft", "", false},
      {"--draft-k", "", true}};
  auto args = Args::parse(static_cast<int>(rest.size()), rest.data(), specs);
  if (!args) return report(args.status());
  if (args->has("--help")) {
    std::fputs(kHelp, stdout);
    return kExitOk;
  }
  for (const std::string& p : args->positional()) models.push_back(p);

  CompareOptions opts;
  auto ctx = args->get_int("--ctx-size", 512, 16, 32768);
  auto chunks = args->get_int("--chunks", 8, -1, 100000);
  auto np = args->get_int("--n-prompt", 512, 0, 16384);
  auto ng = args->get_int("--n-gen", 128, 0, 16384);
  auto reps = args->get_int("--repetitions", 3, 1, 100);
  auto threads = args->get_int("--threads", default_threads(), 1, 256);
  auto draft_k = args->get_int("--draft-k", 4, 1, 16);
  for (const auto* r : {&ctx, &chunks, &np, &ng, &reps, &threads, &draft_k})
    if (!*r) return report(r->status());
  opts.draft_k = *draft_k;
  opts.n_ctx = *ctx, opts.n_chunks = *chunks, opts.n_prompt = *np, opts.n_gen = *ng, opts.repetitions = *reps;
  opts.n_threads = *threads;
  warn_if_oversubscribed(*threads);
  opts.cache_dir = args->get_or("--cache", "");
  std::string text_path = args->get_or("--file", "");
  if (text_path.empty()) {
    text_path = bundled_text_path("eval-en.txt");
    if (text_path.empty())
      return report(invalid_argument("the bundled evaluation text (share/phaselab/text/eval-en.txt) is not installed "
                                     "here: pass -f TEXT"));
  }
  auto text = read_text_file(text_path);
  if (!text) return report(text.status());
  opts.text = std::move(*text);

  auto variants = variants_from_args(*args, models);
  if (!variants) return report(variants.status());
  if (Status st = validate_compare(*variants, opts); !st) return report(st);

  const bool progress_json = args->has("--progress-json");
  const bool tty = !progress_json && isatty(STDERR_FILENO);
  std::string last_message;
  double last_fraction = -1;
  g_stop.store(false);
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  auto rows = run_compare(*variants, opts, [&](const CompareProgress& p) {
    if (progress_json) {
      // Every row; progress when its message changes or it moves by 0.2%.
      if (!p.row && p.message == last_message && p.fraction - last_fraction < 0.002) return;
      last_message = p.message;
      last_fraction = p.fraction;
      std::fprintf(stderr, "%s\n", compare_progress_json(p).c_str());
      std::fflush(stderr);
      return;
    }
    if (p.message == last_message) return;
    last_message = p.message;
    if (tty)
      std::fprintf(stderr, "\r\033[K[%3.0f%%] %s", 100 * p.fraction, p.message.c_str());
    else if (p.stage != "pp" && p.stage != "tg" && p.stage != "ttft" && p.message.find("chunk") == std::string::npos)
      std::fprintf(stderr, "[%3.0f%%] %s\n", 100 * p.fraction, p.message.c_str());
  }, &g_stop);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (tty) std::fputs("\r\033[K", stderr);
  if (!rows) return report(rows.status());
  if (args->has("--json")) {
    std::printf("%s\n", compare_rows_json(*rows).c_str());
  } else {
    std::printf("%s", compare_rows_table(*rows, opts.n_prompt, opts.n_gen).c_str());
    std::printf("\nKL divergence, top-1 agreement and RMS dp are against %s; perplexity on %s, %d chunks of %d tokens.\n",
                rows->front().name.c_str(), text_path.c_str(), opts.n_chunks, opts.n_ctx);
    if (opts.repetitions > 1)
      std::printf("tok/s and TTFT: mean \u00b1 sample standard deviation of %d runs after a warm-up.\n", opts.repetitions);
    for (const CompareRow& r : *rows)
      if (!r.rss_per_variant) {
        std::printf("Peak memory could not be reset between variants here: each row's is at least the rows' before it.\n");
        break;
      }
  }
  return kExitOk;
}

}  // namespace phaselab::cli
