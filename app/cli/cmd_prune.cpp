// phaselab-cli prune IN OUT --prune layers:A-B | layers:nN: a copy of a
// model without a run of layers (phaselab::prune_layers). With layers:nN the
// run of N layers is chosen by measurement: the angular distance between the
// residual stream before and after each run, on the evaluation text
// (phaselab::block_angular_distances); the table is printed. ffn:P% keeps
// P% of every layer's FFN neurons, the most important on the text
// (phaselab::prune_ffn, structured Wanda).
#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "engine_setup.h"
#include "phaselab/log.h"
#include "phaselab/perplexity.h"
#include "phaselab/prune.h"

namespace phaselab::cli {

int cmd_prune(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          {{"--help", "-h", false}, {"--force", "-f", false}, {"--prune", "", true},
                           {"--file", "", true}, {"--threads", "-t", true}, {"--json", "", false}});
  if (!args) return report(args.status());
  if (args->has("--help") || args->positional().size() != 2 || !args->has("--prune")) {
    std::fprintf(args->has("--help") ? stdout : stderr,
                 "usage: phaselab-cli prune [--force] [--json] IN.gguf OUT.gguf --prune layers:A-B|layers:nN|ffn:P%%\n"
                 "  --prune layers:A-B  drop layers A..B (counted from 0; layers:A drops one)\n"
                 "  --prune layers:nN   drop the N consecutive layers whose output is closest to their\n"
                 "                      input (angular distance of the residual stream on --file)\n"
                 "  --prune ffn:P%%      keep P%% of every layer's FFN neurons (rounded down to ffn_down's\n"
                 "                      block): those with the largest ||activation|| x sum |W_down column|\n"
                 "                      on --file (structured Wanda); ffn_down is quantized again\n"
                 "  --file TEXT         the text measured on (default: the bundled eval-en.txt; 512 tokens)\n"
                 "  -t, --threads N     threads for the measurement\n"
                 "  -f, --force         replace an existing OUT (never IN itself)\n"
                 "  --json              the report as JSON\n"
                 "  Later layers are renumbered and the block count lowered; every other tensor and key is\n"
                 "  copied as it is, so llama.cpp loads the file too. Measure the result with perplexity or\n"
                 "  compare. Gemma 3 drops multiples of 6 layers (its local/global pattern).\n");
    return args->has("--help") ? kExitOk : kExitBadInput;
  }
  const auto& pos = args->positional();
  auto spec = parse_prune_spec(*args->get("--prune"));
  if (!spec) return report(spec.status());
  LayerPrune p = *spec;
  std::vector<double> distances;
  if (p.first < 0 || p.is_ffn()) {
    std::string text_path = args->get_or("--file", "");
    if (text_path.empty()) text_path = bundled_text_path("eval-en.txt");
    if (text_path.empty())
      return report(invalid_argument("the bundled evaluation text (share/phaselab/text/eval-en.txt) is not installed "
                                     "here: pass --file TEXT"));
    auto text = read_text_file(text_path);
    if (!text) return report(text.status());
    auto threads = args->get_int("--threads", default_threads(), 1, 256);
    if (!threads) return report(threads.status());
    if (p.is_ffn()) {
      auto rep = prune_ffn(pos[0], pos[1], p.ffn_keep_percent, *text, *threads, args->has("--force"));
      if (!rep) return report(rep.status());
      if (args->has("--json")) {
        std::printf("%s\n", nlohmann::json{{"in", pos[0]},
                                           {"out", pos[1]},
                                           {"arch", rep->arch},
                                           {"prune", prune_spec_to_string(p)},
                                           {"n_layer", rep->n_layer},
                                           {"n_ff_in", rep->n_ff_in},
                                           {"n_ff_out", rep->n_ff_out},
                                           {"bytes_in", rep->bytes_in},
                                           {"bytes_out", rep->bytes_out}}
                                 .dump(2)
                                 .c_str());
      } else {
        std::printf("%s: every FFN %d of %d neurons wide (the most important on %s), %.1f MiB (from %.1f MiB)\n",
                    pos[1].c_str(), rep->n_ff_out, rep->n_ff_in, text_path.c_str(), rep->bytes_out / 1048576.0,
                    rep->bytes_in / 1048576.0);
      }
      return kExitOk;
    }
    auto chosen = choose_layer_prune(pos[0], *text, p.count, *threads, &distances);
    if (!chosen) return report(chosen.status());
    p = *chosen;
    const int best = p.first;
    if (!args->has("--json")) {
      std::fprintf(stderr, "angular distance of each run of %d layers (the first 512 tokens of %s):\n", p.count,
                   text_path.c_str());
      for (int l = 0; l < static_cast<int>(distances.size()); l++)
        std::fprintf(stderr, "  layers %-8s %.4f%s\n",
                     prune_spec_to_string({l, p.count}).substr(7).c_str(), distances[static_cast<size_t>(l)],
                     l == best ? "  <- dropped" : "");
    }
  }
  auto rep = prune_layers(pos[0], pos[1], p, args->has("--force"));
  if (!rep) return report(rep.status());
  if (args->has("--json")) {
    nlohmann::json j = {{"in", pos[0]},
                        {"out", pos[1]},
                        {"arch", rep->arch},
                        {"prune", prune_spec_to_string(rep->dropped)},
                        {"n_layer_in", rep->n_layer_in},
                        {"n_layer_out", rep->n_layer_out},
                        {"n_tensors_in", rep->n_tensors_in},
                        {"n_tensors_out", rep->n_tensors_out},
                        {"bytes_in", rep->bytes_in},
                        {"bytes_out", rep->bytes_out}};
    if (!distances.empty()) j["angular_distances"] = distances;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s: %d of %d layers (%s dropped), %d tensors, %.1f MiB (from %.1f MiB)\n", pos[1].c_str(),
                rep->n_layer_out, rep->n_layer_in, prune_spec_to_string(rep->dropped).substr(7).c_str(),
                rep->n_tensors_out, rep->bytes_out / 1048576.0, rep->bytes_in / 1048576.0);
  }
  return kExitOk;
}

}  // namespace phaselab::cli
