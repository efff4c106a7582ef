// phaselab-cli: the command-line face of the PhaseLab engine.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "phaselab/log.h"

namespace {

void print_usage(FILE* out) {
  std::fprintf(out,
               "usage: phaselab-cli COMMAND [options]\n\n"
               "commands:\n"
               "  info MODEL [--json]           what a GGUF model holds and whether PhaseLab can run it\n"
               "  tokenize -m MODEL TEXT        token ids of TEXT (--no-bos, --pieces, --file PATH)\n"
               "  generate -m MODEL -p TEXT     stream a completion (--chat, -n, --temp, --seed, --json, ...)\n"
               "  chat -m MODEL                 interactive multi-turn chat in the terminal\n"
               "  bench -m MODEL                prefill (pp) and decode (tg) tokens/s, llama-bench style\n"
               "  perplexity -m MODEL           perplexity on a text (llama-perplexity's conventions), KL divergence\n"
               "  quantize IN OUT TYPE          rewrite a model in a llama.cpp file type (Q4_K_M, Q8_0, ...)\n"
               "  prune IN OUT --prune layers:A-B|layers:nN  a copy without a run of layers\n"
               "  batch -m MODEL -i IN -o OUT   offline batch inference (JSONL), many sequences per forward pass\n"
               "  serve -m MODEL                an OpenAI-compatible HTTP server (--port, --parallel, --api-key)\n"
               "  loadtest --url URL            many concurrent clients against an OpenAI-compatible server\n"
               "  compare -m A [-m B] [--quant T,...]  models and quantizations side by side: speed, memory, quality\n"
               "  pull REPO[:QUANT]             download a GGUF model from Hugging Face (--search TEXT, --list)\n"
               "  devices                       the compute devices PhaseLab can use here\n"
               "  twin export|build ...         a random-weight model of another's shapes (for benchmarks)\n\n"
               "options:\n"
               "  -h, --help                    this help\n"
               "  -V, --version                 the version (phaselab-cli X.Y.Z)\n\n"
               "Run 'phaselab-cli COMMAND --help' for a command's options. Exit codes: 0 success,\n"
               "2 bad input (a one-line error on stderr), 1 other failure.\n");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace phaselab::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? kExitBadInput : kExitOk;
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "-V") || !std::strcmp(argv[1], "version")) {
    std::printf("phaselab-cli %s\n", PHASELAB_VERSION);
    return kExitOk;
  }
  phaselab::init_logging(std::getenv("PHASELAB_LOG") ? std::getenv("PHASELAB_LOG") : "warn");
  const std::string cmd = argv[1];
  try {
    if (cmd == "info") return cmd_info(argc - 2, argv + 2);
    if (cmd == "tokenize") return cmd_tokenize(argc - 2, argv + 2);
    if (cmd == "generate") return cmd_generate(argc - 2, argv + 2);
    if (cmd == "chat") return cmd_chat(argc - 2, argv + 2);
    if (cmd == "bench") return cmd_bench(argc - 2, argv + 2);
    if (cmd == "quantize") return cmd_quantize(argc - 2, argv + 2);
    if (cmd == "prune") return cmd_prune(argc - 2, argv + 2);
    if (cmd == "devices") return cmd_devices(argc - 2, argv + 2);
    if (cmd == "twin") return cmd_twin(argc - 2, argv + 2);
    if (cmd == "perplexity") return cmd_perplexity(argc - 2, argv + 2);
    if (cmd == "compare") return cmd_compare(argc - 2, argv + 2);
    if (cmd == "batch") return cmd_batch(argc - 2, argv + 2);
    if (cmd == "serve") return cmd_serve(argc - 2, argv + 2);
    if (cmd == "loadtest") return cmd_loadtest(argc - 2, argv + 2);
    if (cmd == "pull") return cmd_pull(argc - 2, argv + 2);
  } catch (const std::bad_alloc&) {
    return report(phaselab::out_of_memory("out of memory (try a smaller model or context size)"));
  } catch (const std::exception& e) {
    return report(phaselab::internal_error(std::string("unexpected error: ") + e.what()));
  }
  return usage_error("unknown command '" + cmd + "' (run phaselab-cli --help)");
}
