// phaselab-cli pull REPO[:QUANT|:FILE]: download a GGUF model from Hugging
// Face (or HF_ENDPOINT's mirror) into the model folder, resumable and
// verified; --search TEXT finds repositories, --list a repository's models.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "phaselab/hub.h"
#include "phaselab/log.h"

namespace phaselab::cli {

namespace {

hub::DownloadControl* g_control = nullptr;
void on_interrupt(int sig) {
  if (g_control) g_control->pause();  // an atomic operation: safe in a handler
  std::signal(sig, SIG_DFL);          // a second Ctrl+C ends the program at once
}

// The network and the server are not bad input: exit 1, not 2.
int report_hub(const Status& st) {
  const int code = report(st);
  return st.code() == StatusCode::io_error ? kExitFailure : code;
}

const char* const kHelp =
    "usage: phaselab-cli pull REPO[:QUANT|:FILE] [--dir DIR] [--ctx N] [--list] [--json]\n"
    "       phaselab-cli pull --search TEXT [--sort downloads|likes|updated] [--limit N] [--json]\n"
    "Downloads a GGUF model from Hugging Face into the model folder: resumable (run the same command\n"
    "again after an interruption or Ctrl+C), verified against the SHA-256 the repository lists, written\n"
    "under a temporary name and renamed, with its source noted in FILE.source.json.\n"
    "  REPO            owner/name, or a huggingface.co link; :QUANT picks a quantization (Q4_K_M, Q8_0),\n"
    "                  :FILE a file; without either the only model, else the Q4_K_M one, is taken\n"
    "  --list          the repository's GGUF models (split files as one), their sizes and whether they fit\n"
    "  --search TEXT   repositories with GGUF files matching TEXT\n"
    "  --sort S        downloads (default), likes or updated\n"
    "  --limit N       results of --search (default 20, at most 200)\n"
    "  --dir DIR       where to put the model (default: the model folder, PHASELAB_MODEL_DIR)\n"
    "  --ctx N         the context the memory estimate is for (default 4096)\n"
    "  --json          machine-readable output on stdout\n"
    "environment: HF_TOKEN (a token, for gated or private repositories), HF_ENDPOINT (a mirror)\n";

std::string fit_text(const hub::FitEstimate& f) {
  if (f.architecture.empty()) return "fit unknown (" + f.note + ")";
  if (!f.supported) return "PhaseLab cannot run it: " + f.note;
  std::string s = (f.available == 0 ? "needs " : f.fits() ? "fits: needs " : "does NOT fit: needs ") +
                  hub::format_bytes(f.need.total()) +
                  " (weights " + hub::format_bytes(f.need.weights) + ", KV cache " + hub::format_bytes(f.need.kv) +
                  " for " + std::to_string(f.n_ctx) + " tokens, work " + hub::format_bytes(f.need.work) + ")";
  s += f.available ? " of " + hub::format_bytes(f.available) + " available" : " (available memory unknown)";
  if (!f.note.empty()) s += "; " + f.note;
  return s;
}

nlohmann::json fit_json(const hub::FitEstimate& f) {
  return {{"architecture", f.architecture}, {"supported", f.supported},   {"fits", f.fits()},
          {"n_ctx", f.n_ctx},               {"need_bytes", f.need.total()}, {"weights_bytes", f.need.weights},
          {"kv_bytes", f.need.kv},          {"work_bytes", f.need.work},    {"available_bytes", f.available},
          {"note", f.note}};
}

int search(const Args& args, const hub::HubOptions& opt) {
  const std::string sort = args.get_or("--sort", "downloads");
  hub::SortBy by = hub::SortBy::downloads;
  if (sort == "likes") by = hub::SortBy::likes;
  else if (sort == "updated") by = hub::SortBy::last_modified;
  else if (sort != "downloads") return usage_error("--sort takes downloads, likes or updated (got '" + sort + "')");
  auto limit = args.get_int("--limit", 20, 1, 200);
  if (!limit) return report(limit.status());
  auto r = hub::search_models(opt, *args.get("--search"), by, *limit);
  if (!r) return report_hub(r.status());
  if (args.has("--json")) {
    auto j = nlohmann::json::array();
    for (const auto& m : *r)
      j.push_back({{"id", m.id}, {"downloads", m.downloads}, {"likes", m.likes}, {"last_modified", m.last_modified},
                   {"gated", m.gated}, {"license", m.license}});
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  if (r->empty()) {
    std::printf("no GGUF repositories match '%s'\n", args.get("--search")->c_str());
    return kExitOk;
  }
  std::printf("%-56s %12s %7s  %-10s %s\n", "repository", "downloads", "likes", "updated", "licence");
  for (const auto& m : *r)
    std::printf("%-56s %12lld %7lld  %-10s %s%s\n", m.id.c_str(), static_cast<long long>(m.downloads),
                static_cast<long long>(m.likes), m.last_modified.substr(0, 10).c_str(),
                m.license.empty() ? "-" : m.license.c_str(), m.gated.empty() ? "" : "  (gated: needs a token)");
  std::printf("\nphaselab-cli pull REPO --list shows a repository's models; pull REPO:QUANT downloads one.\n");
  return kExitOk;
}

int list(const Args& args, const hub::HubOptions& opt, const hub::RepoInfo& info, int n_ctx) {
  // One header read serves every model of the repository (their
  // architecture and shapes are the same); each model's weights are its size.
  hub::FitEstimate base;
  bool have_base = false;
  if (!info.models.empty()) {
    auto pick = hub::choose_model(info, "");
    auto f = hub::estimate_fit(opt, info, pick ? *pick : info.models.front(), n_ctx);
    if (f) {
      base = *f;
      have_base = true;
    }
  }
  auto fit_of = [&](const hub::GgufChoice& m) {
    hub::FitEstimate f = base;
    f.need.weights = m.total_size();
    return f;
  };
  if (args.has("--json")) {
    nlohmann::json j = {{"repo", info.id}, {"commit", info.commit}, {"license", info.license}, {"gated", info.gated}};
    j["models"] = nlohmann::json::array();
    for (const auto& m : info.models) {
      nlohmann::json e = {{"name", m.name}, {"quant", m.quant}, {"size", m.total_size()}, {"parts", m.parts.size()}};
      if (have_base) e["fit"] = fit_json(fit_of(m));
      j["models"].push_back(e);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%s  licence: %s%s\n", info.id.c_str(), info.license.empty() ? "not stated (read the model card)" : info.license.c_str(),
              info.gated.empty() ? "" : "  gated: needs a token (HF_TOKEN)");
  if (info.models.empty()) {
    std::printf("no GGUF files\n");
    return kExitOk;
  }
  std::printf("%-60s %-9s %11s  %s\n", "model", "quant", "size", "memory (weights as the file's size)");
  for (const auto& m : info.models) {
    std::string fit = "-";
    if (have_base) {
      const auto f = fit_of(m);
      fit = f.architecture.empty() ? "unknown"
            : !f.supported         ? "cannot run " + f.architecture
                                   : std::string(f.available == 0 ? "needs " : f.fits() ? "fits, " : "too big, ") +
                                         hub::format_bytes(f.need.total());
    }
    std::printf("%-60s %-9s %11s  %s\n", m.label().c_str(), m.quant.empty() ? "-" : m.quant.c_str(),
                hub::format_bytes(m.total_size()).c_str(), fit.c_str());
  }
  if (have_base && !base.note.empty()) std::printf("note: %s\n", base.note.c_str());
  std::printf("\nphaselab-cli pull %s:QUANT (or :FILE) downloads one (context %d in the estimate; --ctx N).\n",
              info.id.c_str(), n_ctx);
  return kExitOk;
}

}  // namespace

int cmd_pull(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          {{"--dir", "", true},
                           {"--ctx", "", true},
                           {"--list", "", false},
                           {"--search", "", true},
                           {"--sort", "", true},
                           {"--limit", "", true},
                           {"--json", "", false},
                           {"--help", "-h", false}});
  if (!args) return report(args.status());
  if (args->has("--help")) {
    std::printf("%s", kHelp);
    return kExitOk;
  }
  const hub::HubOptions opt = hub::HubOptions::from_environment();
  if (args->has("--search")) {
    if (!args->positional().empty()) return usage_error("--search takes no repository");
    return search(*args, opt);
  }
  if (args->positional().size() != 1)
    return usage_error("pull needs one repository: phaselab-cli pull OWNER/NAME[:QUANT|:FILE] (or --search TEXT)");
  auto spec = hub::parse_pull_spec(args->positional()[0]);
  if (!spec) return report(spec.status());
  auto n_ctx = args->get_int("--ctx", 4096, 16, 1 << 20);
  if (!n_ctx) return report(n_ctx.status());
  const bool json = args->has("--json");

  auto info = hub::repo_info(opt, spec->repo);
  if (!info) return report_hub(info.status());
  if (args->has("--list")) return list(*args, opt, *info, *n_ctx);
  auto model = hub::choose_model(*info, spec->selector);
  if (!model) return report(model.status());

  const std::string dir = args->get_or("--dir", user_model_dir());
  std::fprintf(stderr, "%s: %s, %s%s, licence %s\n", info->id.c_str(), model->label().c_str(),
               hub::format_bytes(model->total_size()).c_str(), model->quant.empty() ? "" : (", " + model->quant).c_str(),
               info->license.empty() ? "not stated (read the model card)" : info->license.c_str());
  auto fit = hub::estimate_fit(opt, *info, *model, *n_ctx);
  if (fit) std::fprintf(stderr, "memory: %s\n", fit_text(*fit).c_str());
  else std::fprintf(stderr, "memory: not estimated (%s)\n", fit.status().message().c_str());

  hub::DownloadControl control;
  g_control = &control;
  struct sigaction sa{}, old_int{}, old_term{};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  const bool tty = ::isatty(STDERR_FILENO);
  int last_tenth = -1;  // without a terminal: a line per tenth and per stage
  std::string last_stage;
  auto r = hub::download_model(opt, *info, *model, dir, [&](const hub::DownloadProgress& p) {
    const double frac = p.total ? static_cast<double>(p.done) / p.total : 0;
    const std::string part = p.n_parts > 1 ? " part " + std::to_string(p.part) + "/" + std::to_string(p.n_parts) : "";
    if (tty) {
      const double left = p.bytes_per_s > 0 ? (p.total - p.done) / p.bytes_per_s : 0;
      std::fprintf(stderr, "\r\033[K%5.1f%%  %s of %s  %.1f MiB/s  %s%s  %s", 100 * frac,
                   hub::format_bytes(p.done).c_str(), hub::format_bytes(p.total).c_str(), p.bytes_per_s / 1048576.0,
                   left > 0 ? (std::to_string(static_cast<int>(left)) + " s left").c_str() : "", part.c_str(),
                   p.stage.c_str());
    } else if (static_cast<int>(frac * 10) != last_tenth || p.stage != last_stage) {
      last_tenth = static_cast<int>(frac * 10);
      last_stage = p.stage;
      std::fprintf(stderr, "%5.1f%%  %s of %s%s  %s\n", 100 * frac, hub::format_bytes(p.done).c_str(),
                   hub::format_bytes(p.total).c_str(), part.c_str(), p.stage.c_str());
    }
  }, &control);
  if (tty) std::fprintf(stderr, "\n");
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  g_control = nullptr;
  if (!r) return report_hub(r.status());
  if (r->paused) {
    std::fprintf(stderr, "interrupted: the partial download is kept; run the same command again to resume\n");
    return 130;
  }
  if (json) {
    nlohmann::json j = {{"repo", info->id}, {"model", model->name}, {"paths", r->paths},
                        {"already_present", r->already_present}, {"verified", r->verified},
                        {"bytes", r->bytes_transferred},
                        {"seconds", r->seconds}};
    if (fit) j["fit"] = fit_json(*fit);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    if (!r->verified)
      std::fprintf(stderr, "note: the repository lists no SHA-256 for this file, so it was not verified\n");
    if (r->already_present) std::printf("already in the model folder: %s\n", r->paths.front().c_str());
    else
      std::printf("saved %s (%s in %.1f s) — run it: phaselab-cli chat -m %s\n", r->paths.front().c_str(),
                  hub::format_bytes(r->bytes_transferred).c_str(), r->seconds, r->paths.front().c_str());
  }
  return kExitOk;
}

}  // namespace phaselab::cli
