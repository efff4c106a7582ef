// phaselab-cli perplexity: perplexity of a model on a text with
// llama-perplexity's conventions (phaselab/perplexity.h), and KL divergence
// against a reference run saved with --save-logits.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli_util.h"
#include "commands.h"
#include "engine_setup.h"
#include "phaselab/log.h"
#include "phaselab/perplexity.h"

namespace phaselab::cli {

namespace {

namespace fs = std::filesystem;

std::string base_name(const std::string& p) { return fs::path(p).filename().string(); }

void print_progress(const PerplexityProgress& p, bool tty, double* last_line_s) {
  if (tty) {
    constexpr int kWidth = 30;
    const double f = p.tokens_total ? static_cast<double>(p.tokens_done) / p.tokens_total : 1;
    const int filled = static_cast<int>(f * kWidth);
    const double eta = p.tokens_per_s > 0 ? (p.tokens_total - p.tokens_done) / p.tokens_per_s : 0;
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\rperplexity: [%s] %d/%d chunks, %.0f tok/s", bar.c_str(), p.chunk, p.n_chunks, p.tokens_per_s);
    if (p.chunk > 0) std::fprintf(stderr, ", PPL %.4f", p.ppl);
    std::fprintf(stderr, ", ETA %.0f s   ", eta);
    if (p.tokens_done == p.tokens_total) std::fputc('\n', stderr);
    std::fflush(stderr);
  } else if (p.tokens_done == p.tokens_total || (p.chunk > 0 && p.elapsed_s - *last_line_s >= 10)) {
    // A log file gets a line at most every 10 s (and the last).
    if (p.chunk == 0) return;
    std::fprintf(stderr, "perplexity: %d/%d chunks, PPL %.4f, %.0f tok/s\n", p.chunk, p.n_chunks, p.ppl, p.tokens_per_s);
    *last_line_s = p.elapsed_s;
  }
}

void print_help() {
  std::printf(
      "usage: phaselab-cli perplexity -m MODEL [-f TEXT] [-c 512] [-b N] [-t N] [--chunks N] [--json]\n"
      "                               [--save-logits FILE [--top-k 32]] [--kl-base FILE]\n"
      "  Perplexity as llama-perplexity computes it: the text tokenized once, cut into chunks of\n"
      "  -c tokens, each run from an empty cache with BOS first, the second half of each scored.\n"
      "  Every row's logits are held, so without -b a pass on the CPU takes the tokens whose\n"
      "  logits fit in 64 MiB (at least 64; 64 for a 262144-entry vocabulary).\n"
      "  -f, --file PATH          the text (default: the bundled eval-en.txt)\n"
      "      --chunks N           run only the first N chunks (default: all)\n"
      "      --save-logits FILE   keep this run's top-k log-probs at every scored position (a KL base)\n"
      "      --top-k K            tokens kept per position with --save-logits (default 32), or read\n"
      "                           of a llama-perplexity base (default 64)\n"
      "      --kl-base FILE       KL divergence, top-1 agreement and RMS dp against a saved base:\n"
      "                           PhaseLab's (--save-logits) or llama-perplexity's\n"
      "                           (--kl-divergence-base); same vocabulary, -c defaults to the base's,\n"
      "                           and without -f the tokens are the base's\n"
      "      --json               print one JSON object at the end\n%s",
      kEngineHelp);
}

void print_json(const PerplexityResult& r, const std::string& model_name, const std::string& backend,
                const std::string& text_path, const std::optional<std::string>& save_path, const std::string& kl_base) {
  nlohmann::json j;
  j["model"] = model_name;
  j["backend"] = backend;
  j["text"] = text_path;
  j["ppl"] = r.ppl;
  j["ppl_err"] = r.ppl_err;
  j["nll"] = r.nll_mean;
  j["n_ctx"] = r.n_ctx;
  j["n_chunks"] = r.n_chunks;
  j["n_scored"] = r.n_scored;
  j["n_tokens_text"] = r.n_tokens_text;
  j["n_evaluated"] = r.n_evaluated;
  j["seconds"] = r.seconds;
  j["tokens_per_s"] = r.tokens_per_s;
  if (save_path) j["saved_logits"] = *save_path;
  if (r.kl) {
    const KlStats& k = *r.kl;
    j["kl_base"] = kl_base;
    j["kl_base_label"] = k.base_label;
    j["kl_top_k"] = k.top_k;
    j["kld"] = k.kld;
    j["kld_err"] = k.kld_err;
    j["kld_median"] = k.kld_median;
    j["kld_p99"] = k.kld_p99;
    j["kld_max"] = k.kld_max;
    j["top1_agree"] = k.top1_agree;
    j["accept_sampled"] = k.accept_sampled;
    j["accept_sampled_hi"] = k.accept_sampled_hi;
    j["rms_dp"] = k.rms_dp;
    j["dp_mean"] = k.dp_mean;
    j["ppl_base"] = k.ppl_base;
    j["max_dlogp"] = k.max_dlogp;
  }
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

// llama-perplexity's wording, so that the two read side by side.
void print_text(const PerplexityResult& r) {
  std::printf("%d chunks of %d tokens, %lld scored; %lld tokens in %.2f s, %.1f tokens/s\n", r.n_chunks, r.n_ctx,
              static_cast<long long>(r.n_scored), static_cast<long long>(r.n_evaluated), r.seconds, r.tokens_per_s);
  std::printf("Final estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_err);
  if (r.kl) {
    const KlStats& k = *r.kl;
    std::printf("\nKL divergence against %s (top-%d of the base plus the rest as one bin: a lower bound)\n",
                k.base_label.empty() ? "the base" : k.base_label.c_str(), k.top_k);
    std::printf("PPL(base)  : %.4f\n", k.ppl_base);
    std::printf("Mean    KLD: %10.6f +/- %10.6f\n", k.kld, k.kld_err);
    std::printf("Median  KLD: %10.6f\n", k.kld_median);
    std::printf("99.0%%   KLD: %10.6f\n", k.kld_p99);
    std::printf("Maximum KLD: %10.6f\n", k.kld_max);
    std::printf("Max |dlogp|: %10.6f (over the base's top-%d with log p > -15)\n", k.max_dlogp, k.top_k);
    std::printf("Mean    dp : %7.3f %%\n", k.dp_mean);
    std::printf("RMS     dp : %7.3f %%\n", k.rms_dp);
    std::printf("Same top p : %7.3f %%\n", 100 * k.top1_agree);
    std::printf("\nAs a speculative draft of the base, on this text: greedy keeps %.2f %% of drafted tokens,\n"
                "sampling (T = 1) %.2f-%.2f %% (sum of min(p, q) over the base's top %d, and with the rest)\n",
                100 * k.top1_agree, 100 * k.accept_sampled, 100 * k.accept_sampled_hi, k.top_k);
  }
}

}  // namespace

int cmd_perplexity(int argc, char** argv) {
  std::vector<OptionSpec> opts = engine_options();
  opts.insert(opts.end(), {{"--file", "-f", true},
                           {"--chunks", "", true},
                           {"--save-logits", "", true},
                           {"--kl-base", "", true},
                           {"--top-k", "", true},
                           {"--json", "", false},
                           {"--help", "-h", false}});
  auto args = Args::parse(argc, argv, opts);
  if (!args) return report(args.status());
  if (args->has("--help")) {
    print_help();
    return kExitOk;
  }
  if (!args->positional().empty()) return usage_error("unexpected argument '" + args->positional()[0] + "'");

  auto top_k = args->get_int("--top-k", 32, 1, KlBase::kMaxTopK);
  if (!top_k) return report(top_k.status());
  std::optional<KlBase> base;
  if (const auto kl = args->get("--kl-base")) {
    auto b = KlBase::load(*kl, args->has("--top-k") ? *top_k : KlBase::kLlamaTopK);
    if (!b) return report(b.status());
    base = std::move(*b);
  }
  if (args->has("--top-k") && !args->has("--save-logits") && !(base && base->from_llama))
    return usage_error("--top-k applies to --save-logits and to a llama-perplexity --kl-base only");
  auto n_ctx = args->get_int("--ctx-size", base ? base->n_ctx : 512, 4, 1 << 20);
  if (!n_ctx) return report(n_ctx.status());
  auto chunks = args->get_int("--chunks", -1, 1, 1 << 24);
  if (!chunks) return report(chunks.status());
  // Without a text, a KL base's own tokens are run (as llama-perplexity
  // --kl-divergence does): no tokenizer can then differ.
  const bool tokens_of_base = base && !args->has("--file");
  std::string text_path = args->get_or("--file", "");
  if (text_path.empty() && !tokens_of_base) {
    text_path = bundled_text_path("eval-en.txt");
    if (text_path.empty())
      return report(invalid_argument(
          "the bundled evaluation text (share/phaselab/text/eval-en.txt) is not installed here: pass -f TEXT"));
  }
  std::string text;
  if (!tokens_of_base) {
    auto t = read_text_file(text_path);
    if (!t) return report(t.status());
    text = std::move(*t);
  }

  auto setup = open_session(*args, *n_ctx);
  if (!setup) return report(setup.status());
  Session& session = *setup->session;
  const std::string model_name = base_name(setup->model->path());
  const std::string backend = session.backend().name();

  const std::vector<int32_t> tokens =
      tokens_of_base ? base->tokens : perplexity_tokenize(setup->model->tokenizer(), text);
  const std::string text_name = tokens_of_base ? "the KL base's tokens" : base_name(text_path);
  PerplexityOptions po;
  po.n_ctx = *n_ctx;
  po.n_chunks = *chunks;
  if (args->has("--batch-size")) po.n_batch = session.backend().max_batch();  // (as given)
  po.kl_base = base ? &*base : nullptr;
  KlBase saved;
  const auto save_path = args->get("--save-logits");
  if (save_path) {
    po.save_base = &saved;
    po.save_top_k = *top_k;
  }
  const int n_chunk_max = static_cast<int>(tokens.size() / *n_ctx);
  int n_run = *chunks > 0 ? std::min(*chunks, n_chunk_max) : n_chunk_max;
  if (base && *chunks < 0) n_run = std::min(n_run, base->n_chunks);
  std::fprintf(stderr, "perplexity: %s on %s (%s), %zu tokens; %d chunk%s of %d tokens\n", model_name.c_str(),
               text_name.c_str(), backend.c_str(), tokens.size(), n_run, n_run == 1 ? "" : "s", *n_ctx);

  const bool tty = ::isatty(STDERR_FILENO);
  double last_line = 0;
  auto res = run_perplexity(session, tokens, po, [&](const PerplexityProgress& p) { print_progress(p, tty, &last_line); });
  if (!res) return report(res.status());
  const PerplexityResult& r = *res;

  if (save_path) {
    saved.label = model_name + " (" + backend + ")";
    if (Status st = saved.save(*save_path); !st) return report(st);
  }

  if (args->has("--json")) {
    print_json(r, model_name, backend, tokens_of_base ? text_name : text_path, save_path, args->get_or("--kl-base", ""));
    return kExitOk;
  }

  print_text(r);
  if (save_path) std::fprintf(stderr, "perplexity: saved the top-%d log-probs to %s\n", *top_k, save_path->c_str());
  return kExitOk;
}

}  // namespace phaselab::cli
