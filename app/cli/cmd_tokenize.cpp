// phaselab-cli tokenize -m MODEL [--no-bos] [--pieces] [--no-special] [--file PATH | TEXT]
#include <cstdio>

#include "cli_util.h"
#include "commands.h"
#include "phaselab/gguf.h"
#include "phaselab/tokenizer.h"

namespace phaselab::cli {

int cmd_tokenize(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          {{"--model", "-m", true},
                           {"--file", "-f", true},
                           {"--no-bos", "", false},
                           {"--pieces", "", false},
                           {"--parse-special", "", false},
                           {"--help", "-h", false}});
  if (!args) return report(args.status());
  if (args->has("--help")) {
    std::printf(
        "usage: phaselab-cli tokenize -m MODEL [--no-bos] [--pieces] [--parse-special] [--file PATH | TEXT]\n"
        "  prints the token ids, space-separated, on one line; --pieces prints the pieces instead\n");
    return kExitOk;
  }
  const auto model = args->get("--model");
  if (!model) return usage_error("tokenize needs -m MODEL");
  std::string text;
  if (auto file = args->get("--file")) {
    if (!args->positional().empty()) return usage_error("give either --file or TEXT, not both");
    auto t = read_text_file(*file);
    if (!t) return report(t.status());
    text = std::move(*t);
  } else if (args->positional().size() == 1) {
    text = args->positional()[0];
  } else {
    return usage_error("tokenize needs the text (one argument) or --file PATH");
  }
  auto gguf = GgufFile::open(*model);
  if (!gguf) return report(gguf.status());
  auto tok = Tokenizer::from_gguf(**gguf);
  if (!tok) return report(tok.status());
  const auto ids = (*tok)->encode(text, !args->has("--no-bos"), args->has("--parse-special"));
  std::string out;
  for (size_t i = 0; i < ids.size(); i++) {
    if (i) out += ' ';
    if (args->has("--pieces")) {
      std::string piece = (*tok)->token_to_piece(ids[i], true);
      out += "'" + piece + "'";
    } else {
      out += std::to_string(ids[i]);
    }
  }
  // fwrite, not printf: a piece may hold a NUL byte.
  out += '\n';
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

}  // namespace phaselab::cli
