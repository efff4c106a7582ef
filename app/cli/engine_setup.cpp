#include "engine_setup.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <cstdlib>
#include <cerrno>
#include <cctype>

#include "phaselab/machine.h"

namespace phaselab::cli {

const std::vector<OptionSpec>& engine_options() {
  static const std::vector<OptionSpec> opts = {
      {"--model", "-m", true},  {"--threads", "-t", true}, {"--ctx-size", "-c", true}, {"--backend", "", true},
      {"--batch-size", "-b", true}, {"--spec", "", true},  {"--draft", "", true},      {"--spec-k", "", true},
      {"--spec-skip", "", true}, {"--no-prefix-cache", "", false}, {"--cache-type", "", true},
  };
  return opts;
}

const char* const kEngineHelp =
    "  -m, --model PATH         GGUF model file\n"
    "  -t, --threads N          CPU threads (default: one per physical core)\n"
    "  -c, --ctx-size N         context size in tokens (default: the model's, at most 4096)\n"
    "  -b, --batch-size N       tokens per forward pass at most (default with --backend cpu: 512 for\n"
    "                           up to 125M parameters in the model's blocks, 256 up to 250M, 128\n"
    "                           up to 500M, 64 above; 64 for cpu-portable and cpu-reference; 512\n"
    "                           with --backend cuda)\n"
    "      --backend NAME       cpu (fast, default), cpu-portable (no SIMD), cpu-reference (the oracle),\n"
    "                           cuda (NVIDIA GPU; falls back to the CPU with the reason when unavailable)\n"
    "      --spec MODE          speculative decoding: none (default), lookup (n-grams of the context),\n"
    "                           draft (a smaller model: --draft MODEL), self (the model itself with\n"
    "                           layers skipped: --spec-skip; CPU backend)\n"
    "      --draft PATH         draft model with the target's vocabulary (implies --spec draft)\n"
    "      --spec-k K           tokens drafted per target pass (default 4)\n"
    "      --spec-skip LAYERS   the layers a self draft leaves out, from 0: 8-13 or 3,5,9-11, or auto\n"
    "                           (measured on a short answer: the fastest single layer, grown)\n"
    "                           (default: the layer before the middle, 8 of 18)\n"
    "      --no-prefix-cache    prefill every request in full (no reuse of cached KV blocks)\n"
    "      --cache-type T       how K and V are stored: f16 (default), bf16, f32, or q8_0 (8-bit blocks:\n"
    "                           about half of f16's memory)\n";

Result<KvType> cache_type(const Args& args) {
  const std::string name = args.get_or("--cache-type", "f16");
  if (auto t = kv_type_from_name(name)) return *t;
  return invalid_argument("--cache-type must be f16, bf16, f32 or q8_0 (got '" + name + "')");
}

// One per physical core (SMT siblings share a core's FMA units and its share
// of memory bandwidth: they make decode slower, not faster).
int default_threads() { return phaselab::default_thread_count(); }

Result<BackendOptions> backend_options_from_args(const Args& args, int default_max_batch) {
  auto threads = args.get_int("--threads", default_threads(), 1, 256);
  if (!threads) return threads.status();
  warn_if_oversubscribed(*threads);
  auto kind = parse_backend_kind(args.get_or("--backend", "cpu"));  // before the (long) load
  if (!kind) return kind.status();
  // (A command's own default, where larger, wins over the backend's.)
  auto batch = args.get_int("--batch-size", std::max(default_max_batch, phaselab::default_max_batch(*kind)), 1, 4096);
  if (!batch) return batch.status();
  BackendOptions bo = backend_options_from_environment();
  bo.kind = *kind;
  bo.n_threads = *threads;
  bo.max_batch = *batch;
  return bo;
}

void set_model_batch(const Args& args, const Model& model, int command_default, BackendOptions* bo) {
  if (!args.has("--batch-size")) phaselab::set_default_passes(bo, model, command_default);
}

Result<ModelAndBackend> open_model_and_backend(const Args& args, int default_max_batch) {
  const auto path = args.get("--model");
  if (!path) return invalid_argument("no model given: pass -m MODEL.gguf (scripts/fetch-model.sh gets the default one)");
  auto bo = backend_options_from_args(args, default_max_batch);
  if (!bo) return bo.status();
  auto model = Model::load(*path);
  if (!model) return model.status();
  set_model_batch(args, **model, default_max_batch, &*bo);
  auto b = make_backend(*model, *bo);
  if (!b) return b.status();
  // The reason is shown and the CPU does the work.
  if (!b->fallback_reason.empty())
    std::fprintf(stderr, "phaselab-cli: %s; using the CPU backend\n", b->fallback_reason.c_str());
  return ModelAndBackend{std::move(*model), std::move(b->backend), bo->n_threads};
}

Result<EngineSetup> open_session(const Args& args, int default_ctx, bool chat) {
  auto ctx = args.get_int("--ctx-size", default_ctx, 0, 1 << 20);
  if (!ctx) return ctx.status();
  auto mb = open_model_and_backend(args);
  if (!mb) return mb.status();
  auto kv_type = cache_type(args);
  if (!kv_type) return kv_type.status();
  EngineSetup s;
  s.model = mb->model;
  auto session = Session::create(s.model, std::move(mb->backend), *ctx, *kv_type, chat);
  if (!session) return session.status();
  s.session = std::move(*session);
  s.chat_format = s.model->chat_format();
  if (!s.model->chat_template_error().empty())
    std::fprintf(stderr, "note: the model's chat template does not parse: %s\n", s.model->chat_template_error().c_str());

  const std::string spec =
      args.get_or("--spec", to_string(args.has("--draft") ? SpeculativeMode::draft_model : SpeculativeMode::off));
  const auto mode = speculative_mode_from_string(spec);
  if (!mode) return invalid_argument("--spec must be none, lookup, draft or self (got '" + spec + "')");
  if (args.has("--spec-skip") && *mode != SpeculativeMode::self_draft)
    return invalid_argument("--spec-skip is for --spec self (the layers the model's own draft leaves out)");
  auto k = args.get_int("--spec-k", 4, 1, kMaxSpecK);
  if (!k) return k.status();
  s.spec_k = *k;
  if (*mode == SpeculativeMode::prompt_lookup) {
    s.draft = make_prompt_lookup_draft();
  } else if (*mode == SpeculativeMode::draft_model) {
    const auto draft_path = args.get("--draft");
    if (!draft_path) return invalid_argument("--spec draft needs --draft MODEL (a smaller model with the same vocabulary)");
    auto dm = Model::load(*draft_path);
    if (!dm) return dm.status().with_context("draft model");
    // The draft runs on the fast CPU backend whatever the target's.
    BackendOptions dbo = backend_options_from_environment();
    dbo.n_threads = mb->threads;
    dbo.max_batch = s.session->backend().max_batch();
    auto db = make_backend(*dm, dbo);
    if (!db) return db.status();
    auto src = make_draft_model_source(*dm, std::move(db->backend), s.session->n_ctx(), *s.model);
    if (!src) return src.status();
    s.draft = std::move(*src);
  } else if (*mode == SpeculativeMode::self_draft) {
    if (!s.session->backend().can_skip_layers())
      return unsupported("--spec self needs a backend that can skip layers; the " + s.session->backend().name() +
                         " backend cannot: use --backend cpu, or --spec lookup / --spec draft");
    const int n_layer = s.model->config().n_layer;
    const std::string spelling = args.get_or("--spec-skip", default_self_skip(n_layer));
    Result<std::vector<uint8_t>> skip = std::vector<uint8_t>{};
    if (spelling == "auto") {
      std::fprintf(stderr, "self-speculation: measuring which layers to skip (a %d-token answer per trial, k=%d)...\n",
                   32, s.spec_k);
      auto choice = calibrate_self_skip(*s.session, self_skip_calibration_prompt(*s.model), s.spec_k);
      if (!choice) return choice.status();
      std::fprintf(stderr, "  plain            %7.1f tok/s\n", choice->plain_tokens_per_s);
      for (const auto& t : choice->trials)
        std::fprintf(stderr, "  skip %-11s %7.1f tok/s, %3.0f%% accepted, %.2f tokens per target pass\n",
                     t.skip.c_str(), t.tokens_per_s, 100 * t.acceptance, t.tokens_per_pass);
      std::fprintf(stderr, "self-speculation: skipping %s (--spec-skip %s)\n",
                   layer_skip_to_string(choice->skip).c_str(), layer_skip_to_string(choice->skip).c_str());
      s.session->kv().clear();
      skip = std::move(choice->skip);
    } else {
      skip = parse_layer_skip(spelling, n_layer);
    }
    if (!skip) return skip.status();
    auto src = make_self_draft(s.model, SelfDraftOptions{std::move(*skip)});
    if (!src) return src.status();
    s.draft = std::move(*src);
  }
  return s;
}

const std::vector<OptionSpec>& sampling_options() {
  static const std::vector<OptionSpec> opts = {
    {"--n-predict", "-n", true},  {"--temp", "", true},          {"--top-k", "", true},
    {"--top-p", "", true},        {"--min-p", "", true},         {"--repeat-penalty", "", true},
    {"--frequency-penalty", "", true}, {"--presence-penalty", "", true}, {"--seed", "-s", true},
    {"--stop", "", true},         {"--ignore-eos", "", false},
};
  return opts;
}

Status read_generate_options(const Args& a, GenerateOptions* o) {
  auto n = a.get_int("--n-predict", 256, 1, 1 << 20);
  if (!n) return n.status();
  o->n_predict = *n;
  SamplingParams& s = o->sampling;
  auto temp = a.get_double("--temp", 0.8, 0, 100);
  if (!temp) return temp.status();
  auto top_k = a.get_int("--top-k", 40, 0, 1 << 30);
  if (!top_k) return top_k.status();
  auto top_p = a.get_double("--top-p", 0.95, 0.0001, 1);
  if (!top_p) return top_p.status();
  auto min_p = a.get_double("--min-p", 0.05, 0, 0.9999);
  if (!min_p) return min_p.status();
  auto rp = a.get_double("--repeat-penalty", 1.0, 0.01, 10);
  if (!rp) return rp.status();
  auto fp = a.get_double("--frequency-penalty", 0.0, -10, 10);
  if (!fp) return fp.status();
  auto pp = a.get_double("--presence-penalty", 0.0, -10, 10);
  if (!pp) return pp.status();
  s.temperature = static_cast<float>(*temp);
  s.top_k = *top_k;
  s.top_p = static_cast<float>(*top_p);
  s.min_p = static_cast<float>(*min_p);
  s.repeat_penalty = static_cast<float>(*rp);
  s.frequency_penalty = static_cast<float>(*fp);
  s.presence_penalty = static_cast<float>(*pp);
  if (auto seed = a.get("--seed")) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(seed->c_str(), &end, 10);
    // strtoull accepts "-5" (and wraps it): only digits are a seed.
    if (seed->empty() || *end || !std::isdigit(static_cast<unsigned char>((*seed)[0])) || errno == ERANGE)
      return invalid_argument("--seed must be a non-negative integer below 2^64, not '" + *seed + "'");
    s.seed = v;
  } else {
    s.seed = std::random_device{}();
  }
  if (auto stop = a.get("--stop")) o->stop.push_back(*stop);
  o->use_kv_cache = !a.has("--no-kv-cache");
  o->prefix_cache = !a.has("--no-prefix-cache");
  o->ignore_eos = a.has("--ignore-eos");
  return s.validate();
}

const char* const kSamplingHelp =
    "  -n, --n-predict N        token limit (default 256)\n"
    "      --temp T             temperature, 0 = greedy (default 0.8)\n"
    "      --top-k K            (default 40, 0 = off)   --top-p P (0.95)   --min-p P (0.05)\n"
    "      --repeat-penalty X   (1.0 = off)  --frequency-penalty X  --presence-penalty X\n"
    "  -s, --seed S             makes sampling reproducible (default: random)\n"
    "      --stop TEXT          stop when TEXT is generated\n"
    "      --ignore-eos         keep going past end-of-generation tokens\n";

}  // namespace phaselab::cli
