#include "engine_setup.h"

#include <algorithm>
#include <cstdio>

#include "phaselab/machine.h"

namespace phaselab::cli {

const std::vector<OptionSpec>& engine_options() {
  static const std::vector<OptionSpec> opts = {
      {"--model", "-m", true},  {"--threads", "-t", true}, {"--ctx-size", "-c", true}, {"--backend", "", true},
      {"--batch-size", "-b", true}, {"--spec", "", true},  {"--draft", "", true},      {"--spec-k", "", true},
      {"--no-prefix-cache", "", false},
  };
  return opts;
}

const char* const kEngineHelp =
    "  -m, --model PATH         GGUF model file\n"
    "  -t, --threads N          CPU threads (default: one per physical core)\n"
    "  -c, --ctx-size N         context size in tokens (default: the model's, at most 4096)\n"
    "  -b, --batch-size N       prefill batch (default 64)\n"
    "      --backend NAME       cpu (fast, default), cpu-portable (no SIMD), cpu-reference (the oracle),\n"
    "                           cuda (NVIDIA GPU; falls back to the CPU with the reason when unavailable)\n"
    "      --spec MODE          speculative decoding: none (default), lookup (n-grams of the context),\n"
    "                           draft (a smaller model: --draft MODEL)\n"
    "      --draft PATH         draft model with the target's vocabulary (implies --spec draft)\n"
    "      --spec-k K           tokens drafted per target pass (default 4)\n"
    "      --no-prefix-cache    prefill every request in full (no reuse of cached KV blocks)\n";

// One per physical core (SMT siblings share a core's FMA units and its share
// of memory bandwidth: they make decode slower, not faster).
int default_threads() { return phaselab::default_thread_count(); }

Result<EngineSetup> open_session(const Args& args, int default_ctx) {
  const auto path = args.get("--model");
  if (!path) return invalid_argument("no model given: pass -m MODEL.gguf (scripts/fetch-model.sh gets the default one)");
  auto threads = args.get_int("--threads", default_threads(), 1, 256);
  if (!threads) return threads.status();
  warn_if_oversubscribed(*threads);
  auto ctx = args.get_int("--ctx-size", default_ctx, 0, 1 << 20);
  if (!ctx) return ctx.status();
  auto batch = args.get_int("--batch-size", 64, 1, 4096);
  if (!batch) return batch.status();
  BackendOptions bo;
  bo.kind = args.get_or("--backend", "cpu");
  bo.n_threads = *threads;
  bo.max_batch = *batch;
  if (const auto& kinds = backend_kinds(); std::find(kinds.begin(), kinds.end(), bo.kind) == kinds.end())
    return invalid_argument("unknown backend '" + bo.kind + "' (available: cpu, cpu-portable, cpu-reference, cuda)");

  auto model = Model::load(*path);
  if (!model) return model.status();
  EngineSetup s;
  s.model = std::move(*model);
  auto b = make_backend(s.model, bo);
  if (!b) return b.status();
  // The reason is shown and the CPU does the work.
  if (!b->fallback_reason.empty())
    std::fprintf(stderr, "phaselab-cli: %s; using the CPU backend\n", b->fallback_reason.c_str());
  auto session = Session::create(s.model, std::move(b->backend), *ctx);
  if (!session) return session.status();
  s.session = std::move(*session);
  s.chat_family = s.model->chat_template();

  const std::string spec = args.get_or("--spec", args.has("--draft") ? "draft" : "none");
  auto k = args.get_int("--spec-k", 4, 1, 32);
  if (!k) return k.status();
  s.spec_k = *k;
  if (spec == "lookup") {
    s.draft = make_prompt_lookup_draft();
  } else if (spec == "draft") {
    const auto draft_path = args.get("--draft");
    if (!draft_path) return invalid_argument("--spec draft needs --draft MODEL (a smaller model with the same vocabulary)");
    auto dm = Model::load(*draft_path);
    if (!dm) return dm.status().with_context("draft model");
    auto db = make_cpu_backend(*dm, *threads, *batch);
    if (!db) return db.status();
    auto src = make_draft_model_source(*dm, std::move(*db), s.session->n_ctx(), *s.model);
    if (!src) return src.status();
    s.draft = std::move(*src);
  } else if (spec != "none") {
    return invalid_argument("--spec must be none, lookup or draft (got '" + spec + "')");
  }
  return s;
}

}  // namespace phaselab::cli
