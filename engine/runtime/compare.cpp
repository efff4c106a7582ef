#include "phaselab/compare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "phaselab/backend.h"
#include "phaselab/chat_template.h"
#include "phaselab/log.h"
#include "phaselab/machine.h"
#include "phaselab/memory.h"
#include "phaselab/model.h"
#include "phaselab/perplexity.h"
#include "phaselab/prompt.h"
#include "phaselab/session.h"
#include "phaselab/prune.h"
#include "phaselab/speculative.h"
#include "phaselab/throughput.h"

namespace phaselab {

namespace fs = std::filesystem;

namespace {

double vm_hwm_mib() { return peak_resident_memory_bytes() / 1048576.0; }

Result<std::unique_ptr<Backend>> open_backend(const std::string& kind, std::shared_ptr<const Model> model, int threads) {
  auto k = parse_backend_kind(kind);
  if (!k) return k.status();
  BackendOptions bo = backend_options_from_environment();
  bo.kind = *k;
  bo.n_threads = threads;
  set_default_passes(&bo, *model);  // bench's passes
  bo.fallback = false;  // a comparison names what it measured: no silent substitute
  auto c = make_backend(std::move(model), bo);
  if (!c) return c.status();
  return std::move(c->backend);
}

std::string stem_of(const std::string& path) { return fs::path(path).stem().string(); }

// Where a variant made from source is cached: dir/<stem><suffix>.gguf (dir
// created), and whether that file is there and not older than source.
Result<std::pair<std::string, bool>> cached_file(const std::string& source, const std::string& dir,
                                                 const std::string& suffix) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error("cannot create the cache folder " + dir + ": " + ec.message() + " (choose another with --cache)");
  const std::string out = (fs::path(dir) / (stem_of(source) + suffix + ".gguf")).string();
  const auto src_time = fs::last_write_time(source, ec);
  const bool fresh = !ec && fs::exists(out) && fs::last_write_time(out, ec) >= src_time && !ec;
  return std::pair{out, fresh};
}

// The cached quantization of source in dir, made when missing or older.
Result<std::string> quantized_variant(const std::string& source, FileType type, const std::string& dir, int threads,
                                      const std::function<void(double)>& progress, const std::atomic<bool>* cancel) {
  auto cached = cached_file(source, dir, std::string("-").append(file_type_name(type)));
  if (!cached) return cached.status();
  const auto& [out, fresh] = *cached;
  if (fresh) return out;
  QuantizeOptions qo;
  qo.n_threads = threads;
  qo.overwrite = true;  // a stale cached copy
  auto r = quantize_model(source, out, type, qo,
                          [&](size_t, size_t, uint64_t done, uint64_t total) {
                            if (progress && total) progress(static_cast<double>(done) / static_cast<double>(total));
                          },
                          cancel);
  if (!r) return r.status();
  return out;
}

// The cached layer drop of source in dir (spec "layers:A-B", or "layers:nN"
// chosen on text), made when missing or older. Returns the file and the
// layers dropped.
Result<std::pair<std::string, LayerPrune>> pruned_variant(const std::string& source, const std::string& spec,
                                                          const std::string& dir, const std::string& text, int threads) {
  auto p = parse_prune_spec(spec);
  if (!p) return p.status();
  if (p->first < 0 && !p->is_ffn()) {
    auto chosen = choose_layer_prune(source, text, p->count, threads, nullptr);
    if (!chosen) return chosen.status();
    *p = *chosen;
  }
  std::string suffix = "-pruned-";
  if (p->is_ffn()) {
    suffix += "ffn";
    suffix += std::to_string(p->ffn_keep_percent);
  } else {
    suffix += prune_spec_to_string(*p).substr(7);  // "layers:" off
  }
  auto cached = cached_file(source, dir, suffix);
  if (!cached) return cached.status();
  const auto& [out, fresh] = *cached;
  if (fresh) return std::pair{out, *p};
  if (p->is_ffn()) {
    // (The cache keys on the source and percentage: the neurons were chosen
    // on the text of the run that made the file.)
    auto r = prune_ffn(source, out, p->ffn_keep_percent, text, threads, true);
    if (!r) return r.status();
    return std::pair{out, *p};
  }
  auto r = prune_layers(source, out, *p, true);
  if (!r) return r.status();
  return std::pair{out, *p};
}

// Stages of one variant and their share of its time (for the progress bar):
// quantize (when made), load, pp, tg, ttft, perplexity.
constexpr double kShare[] = {0.15, 0.02, 0.13, 0.15, 0.05, 0.50};

}  // namespace

std::string default_compare_cache_dir() { return user_cache_dir() + "/quantized"; }

Status validate_compare(const std::vector<CompareVariant>& variants, const CompareOptions& opts) {
  if (variants.empty()) return invalid_argument("nothing to compare: give at least one model");
  if (variants.size() > 32) return invalid_argument("at most 32 variants in one comparison");
  for (size_t i = 0; i < variants.size(); i++) {
    const CompareVariant& v = variants[i];
    const std::string which = "variant " + std::to_string(i + 1) + " (" + v.file + ")";
    std::error_code ec;
    if (!fs::is_regular_file(v.file, ec))
      return invalid_argument(which + ": no such model file (give the path of a .gguf file)");
    if (auto k = parse_backend_kind(v.backend); !k) return invalid_argument(which + ": " + k.status().message());
    const auto spec = speculative_mode_from_string(v.speculative);
    if (!spec || *spec == SpeculativeMode::draft_model)
      return invalid_argument(which + ": speculative must be none, lookup or self, not '" + v.speculative + "'");
    if (*spec == SpeculativeMode::self_draft && v.backend.rfind("cpu", 0) != 0)
      return invalid_argument(which + ": self-speculation runs on the CPU backends (it skips layers), not " + v.backend);
    if (!v.prune.empty())
      if (auto p = parse_prune_spec(v.prune); !p) return invalid_argument(which + ": " + p.status().message());
    if (*spec != SpeculativeMode::off && !v.kv_cache)
      return invalid_argument(which + ": speculative decoding needs the KV cache");
    if (v.draft && i == 0)
      return invalid_argument(which + ": the first variant is the target that drafts are measured for; mark a later "
                                      "variant as its draft");
  }
  if (opts.draft_k < 1 || opts.draft_k > 16) return invalid_argument("the draft test drafts 1 to 16 tokens per pass");
  const bool any_draft = std::any_of(variants.begin(), variants.end(), [](const CompareVariant& v) { return v.draft; });
  if (any_draft && !variants[0].kv_cache)
    return invalid_argument("the first variant decodes without the KV cache: speculative decoding with a draft needs it");
  if (any_draft && opts.n_gen < 1)
    return invalid_argument("the draft test decodes -n tokens of a chat answer: give -n of at least 1");
  if (opts.n_ctx < 16 || opts.n_ctx > 32768 || opts.n_ctx % 2)
    return invalid_argument("the perplexity context must be an even number from 16 to 32768 (-c)");
  if (opts.n_chunks == 0 || opts.n_chunks < -1 || opts.n_chunks > 100000)
    return invalid_argument("chunks must be at least 1 (or -1 for the whole text)");
  if (opts.n_prompt < 0 || opts.n_prompt > 16384 || opts.n_gen < 0 || opts.n_gen > 16384)
    return invalid_argument("-p and -n must be from 0 to 16384");
  if (opts.repetitions < 1 || opts.repetitions > 100) return invalid_argument("-r must be from 1 to 100");
  if (opts.text.empty()) return invalid_argument("the evaluation text is empty (-f FILE)");
  return Status::ok();
}

namespace {

// Progress of one variant: each stage reports its part of the variant's
// share (kShare) of the whole run.
struct VariantProgress {
  const CompareProgressFn& progress;
  int vi = 0, n = 0;
  double done = 0;  // of this variant
  void report(const char* stage, double within, const std::string& message) const {
    if (progress) progress({vi, n, stage, std::min(1.0, (vi + done + within) / n), message});
  }
  void finish_stage(int stage) { done += kShare[stage]; }
};

struct MeanSd {
  double mean = 0, sd = 0;
};

// The mean and sample standard deviation (sd 0 for one value), as
// measure_pp_tg reports pp and tg.
MeanSd mean_and_sd(const std::vector<double>& v) {
  MeanSd out;
  if (v.empty()) return out;
  for (double x : v) out.mean += x;
  out.mean /= static_cast<double>(v.size());
  double sq = 0;
  for (double x : v) sq += (x - out.mean) * (x - out.mean);
  out.sd = v.size() > 1 ? std::sqrt(sq / static_cast<double>(v.size() - 1)) : 0;
  return out;
}

// The pp, tg and TTFT tests of one variant (stages 2-4). pp and tg go through
// the engine's measure_pp_tg (phaselab/throughput.h), as bench's do; tg
// decodes as the variant would (KV cache on or off, speculative or not).
Status measure_speed(Session& s, const CompareVariant& v, const CompareOptions& opts,
                     const std::vector<int32_t>& text_tokens, const std::vector<int32_t>& ttft_prompt,
                     const std::string& label, VariantProgress& vp, const std::atomic<bool>* cancel, CompareRow* row) {
  auto stop_asked = [&] { return cancel && cancel->load(); };
  // A cancel seen inside a measurement is the comparison's; other errors name the variant.
  auto failed = [&](const Status& st) { return stop_asked() ? cancelled("comparison cancelled") : st; };
  ThroughputRun run;
  run.repetitions = opts.repetitions;
  run.cancel = cancel;
  // pp: prefill of n_prompt tokens (the text's, repeated if short).
  if (opts.n_prompt > 0) {
    run.test = ThroughputTest::pp;
    run.tokens.resize(opts.n_prompt);
    for (int i = 0; i < opts.n_prompt; i++) run.tokens[i] = text_tokens[i % text_tokens.size()];
    run.on_run = [&](int r) {
      vp.report("pp", kShare[2] * r / (opts.repetitions + 1), label + ": prefill " + std::to_string(opts.n_prompt));
    };
    auto pp = measure_pp_tg(s, run);
    if (!pp) return failed(pp.status());
    row->pp = pp->mean;
    row->pp_sd = pp->sd;
  }
  vp.finish_stage(2);

  // tg: n_gen greedy tokens after 16 tokens of the text.
  if (opts.n_gen > 0) {
    std::unique_ptr<DraftSource> draft;
    const auto mode = speculative_mode_from_string(v.speculative);
    if (mode == SpeculativeMode::prompt_lookup) draft = make_prompt_lookup_draft();
    if (mode == SpeculativeMode::self_draft) {
      const int L = s.model().config().n_layer;
      auto skip = parse_layer_skip(default_self_skip(L), L);
      if (!skip) return skip.status();
      auto d = make_self_draft(s.shared_model(), SelfDraftOptions{std::move(*skip)});
      if (!d) return d.status();
      draft = std::move(*d);
    }
    GenerateOptions g;
    g.n_predict = opts.n_gen;
    g.ignore_eos = true;
    g.sampling.temperature = 0;
    g.use_kv_cache = v.kv_cache;
    g.prefix_cache = false;
    g.draft = draft.get();
    run.test = ThroughputTest::tg;
    run.tokens.assign(text_tokens.begin(), text_tokens.begin() + 16);
    run.generate = &g;
    run.on_run = [&](int r) {
      vp.report("tg", kShare[3] * r / (opts.repetitions + 1), label + ": decode " + std::to_string(opts.n_gen));
    };
    auto tg = measure_pp_tg(s, run);
    if (!tg) return failed(tg.status());
    row->tg = tg->mean;
    row->tg_sd = tg->sd;
    row->spec_acceptance = tg->spec_acceptance;
    row->tokens_per_pass = tg->tokens_per_pass;
  }
  vp.finish_stage(3);

  // TTFT of the fixed chat prompt: a warm-up, then the mean and sd of the runs.
  std::vector<double> ttft;
  for (int r = 0; r <= opts.repetitions; r++) {
    if (stop_asked()) return cancelled("comparison cancelled");
    vp.report("ttft", kShare[4] * r / (opts.repetitions + 1), label + ": time to first token");
    s.kv().clear();
    GenerateOptions g;
    g.n_predict = 1;
    g.sampling.temperature = 0;
    g.prefix_cache = false;
    g.use_kv_cache = v.kv_cache;
    auto res = s.generate(ttft_prompt, g, {}, cancel);
    if (!res) return res.status();
    if (r > 0) ttft.push_back(res->metrics.ttft_ms);
  }
  const MeanSd t = mean_and_sd(ttft);
  row->ttft_prompt_tokens = static_cast<int>(ttft_prompt.size());
  row->ttft_ms = t.mean;
  row->ttft_sd_ms = t.sd;
  vp.finish_stage(4);
  return Status::ok();
}

// Perplexity (stage 5); the reference (base == nullptr) saves its
// distributions into *made for the others' KL divergence.
Status measure_quality(Session& s, const std::vector<int32_t>& text_tokens, const CompareOptions& opts,
                       const KlBase* base, KlBase* made, const std::string& label, VariantProgress& vp,
                       const std::atomic<bool>* cancel, CompareRow* row) {
  PerplexityOptions po;
  po.n_ctx = opts.n_ctx;
  po.n_chunks = opts.n_chunks;
  if (base) po.kl_base = base;
  else po.save_base = made;
  auto ppl = run_perplexity(
      s, text_tokens, po,
      [&](const PerplexityProgress& p) {
        const double f = p.tokens_total ? static_cast<double>(p.tokens_done) / p.tokens_total : 0;
        vp.report("perplexity", kShare[5] * f,
                  label + ": perplexity chunk " + std::to_string(p.chunk) + " of " + std::to_string(p.n_chunks));
      },
      cancel);
  if (!ppl) return ppl.status();
  row->ppl = ppl->ppl;
  row->ppl_err = ppl->ppl_err;
  if (!base) {
    row->kld = 0, row->kld_p99 = 0, row->top1_agree = 1, row->rms_dp = 0, row->accept_sampled = 1;
  } else if (ppl->kl) {
    row->kld = ppl->kl->kld;
    row->kld_p99 = ppl->kl->kld_p99;
    row->top1_agree = ppl->kl->top1_agree;
    row->accept_sampled = ppl->kl->accept_sampled;
    row->rms_dp = ppl->kl->rms_dp;
  }
  vp.finish_stage(5);
  return Status::ok();
}

// The draft test (after the variant's own measurements and its peak memory;
// its progress stays at the variant's end, where its shares have summed to 1):
// the target (the first variant's file and backend, loaded again from the
// page cache) answers the chat prompt greedily (opts.n_gen tokens), plainly
// and with this variant's model drafting k tokens per pass, each the mean of
// the runs.
Status measure_as_draft(const std::shared_ptr<const Model>& draft_model, const CompareVariant& v,
                        const std::string& target_file, const CompareVariant& target_v, const CompareOptions& opts,
                        int threads, const std::string& label, VariantProgress& vp, const std::atomic<bool>* cancel,
                        CompareRow* row) {
  vp.report("draft", 0, label + ": loading the target for the draft test");
  auto target = Model::load(target_file);
  if (!target) return target.status();
  auto tb = open_backend(target_v.backend, *target, threads);
  if (!tb) return tb.status();
  const int n_ctx = std::max(512, 256 + opts.n_gen + opts.draft_k + 16);
  auto ts = Session::create(*target, std::move(*tb), n_ctx, KvType::f16, false);
  if (!ts) return ts.status();
  auto db = open_backend(v.backend, draft_model, threads);
  if (!db) return db.status();
  auto source = make_draft_model_source(draft_model, std::move(*db), n_ctx, **target);
  if (!source) return source.status();
  GenerateOptions g;
  g.n_predict = opts.n_gen;
  g.ignore_eos = true;
  g.sampling.temperature = 0;
  g.prefix_cache = false;
  g.spec_k = opts.draft_k;
  ThroughputRun run;
  run.test = ThroughputTest::tg;
  run.repetitions = opts.repetitions;
  run.cancel = cancel;
  // The answer to the fixed chat prompt (the TTFT test's, in the target's
  // template): what speculative decoding serves in a chat. A continuation of
  // the text's first tokens, as tg decodes, soon repeats itself on small
  // models, and repeats are easy to draft.
  run.tokens = render_prompt((*target)->tokenizer(), (*target)->chat_format(),
                             PromptInput::chat_of({{"user", opts.ttft_prompt}}))
                   .tokens;
  run.generate = &g;
  run.on_run = [&](int r) {
    vp.report("draft", 0, label + ": the target decoding plainly (" + std::to_string(r) + ")");
  };
  auto plain = measure_pp_tg(**ts, run);
  if (!plain) return plain.status();
  g.draft = source->get();
  run.on_run = [&](int r) {
    vp.report("draft", 0, label + ": the target decoding with this draft (" + std::to_string(r) + ")");
  };
  auto spec = measure_pp_tg(**ts, run);
  if (!spec) return spec.status();
  row->draft_k = opts.draft_k;
  row->draft_base_tg = plain->mean, row->draft_base_tg_sd = plain->sd;
  row->draft_tg = spec->mean, row->draft_tg_sd = spec->sd;
  row->draft_speedup = plain->mean > 0 ? spec->mean / plain->mean : 0;
  row->draft_acceptance = spec->spec_acceptance;
  row->draft_tokens_per_pass = spec->tokens_per_pass;
  return Status::ok();
}

std::string variant_label(const CompareVariant& v) {
  if (!v.name.empty()) return v.name;
  std::string s = v.quantize_to ? std::string(file_type_name(*v.quantize_to)) : fs::path(v.file).filename().string();
  if (!v.prune.empty()) {  // "pruned 3-5" or "FFN 75%" (after a quantization's name: "Q8_0 pruned 3-5")
    if (!v.quantize_to) s.clear();
    else s += ' ';
    if (v.prune.rfind("ffn:", 0) == 0) {
      s += "FFN ";
      s += v.prune.substr(4);
      if (s.back() != '%') s += '%';
    } else {
      s += "pruned ";
      s += v.prune.substr(7);  // "layers:" off
    }
  }
  if (speculative_mode_from_string(v.speculative) == SpeculativeMode::self_draft) s += " +self";
  return s;
}

}  // namespace

Result<std::vector<CompareRow>> run_compare(const std::vector<CompareVariant>& variants, const CompareOptions& opts,
                                            const CompareProgressFn& progress, const std::atomic<bool>* cancel) {
  PHASELAB_TRY(validate_compare(variants, opts));
  const int threads = opts.n_threads > 0 ? opts.n_threads : default_thread_count();
  const std::string cache_dir = opts.cache_dir.empty() ? default_compare_cache_dir() : opts.cache_dir;
  const int n = static_cast<int>(variants.size());
  auto stop_asked = [&] { return cancel && cancel->load(); };
  std::vector<CompareRow> rows;
  std::optional<KlBase> base;  // the reference's distributions
  std::vector<int32_t> base_tokens;

  for (int vi = 0; vi < n; vi++) {
    const CompareVariant& v = variants[vi];
    VariantProgress vp{progress, vi, n};
    CompareRow row;
    row.backend = v.backend;
    row.kv_cache = v.kv_cache;
    row.speculative = v.speculative;
    row.reference = vi == 0;
    row.n_prompt = opts.n_prompt;
    row.n_gen = opts.n_gen;
    row.repetitions = opts.repetitions;
    row.rss_per_variant = reset_peak_resident_memory();
    std::string file = v.file;
    const std::string label = variant_label(v);
    auto fail = [&](const Status& st) -> Status {
      return Status(st.code(), label + ": " + st.message());
    };
    if (v.quantize_to) {
      vp.report("quantize", 0, label + ": quantizing " + fs::path(v.file).filename().string());
      auto q = quantized_variant(v.file, *v.quantize_to, cache_dir, threads,
                                 [&](double f) { vp.report("quantize", kShare[0] * f, label + ": quantizing"); }, cancel);
      if (!q) return fail(q.status());
      file = *q;
    }
    if (!v.prune.empty()) {
      vp.report("quantize", kShare[0] / 2, label + ": pruning");
      auto pruned = pruned_variant(file, v.prune, cache_dir, opts.text, threads);
      if (!pruned) return fail(pruned.status());
      file = pruned->first;
      row.prune = prune_spec_to_string(pruned->second);
    }
    vp.finish_stage(0);
    if (stop_asked()) return cancelled("comparison cancelled");
    row.name = label;
    if (!row.prune.empty() && v.name.empty()) {  // "pruned n1" -> "pruned 3": the layers measured
      CompareVariant resolved = v;
      resolved.prune = row.prune;
      row.name = variant_label(resolved);
    }
    row.file = file;
    std::error_code ec;
    row.size_mib = static_cast<double>(fs::file_size(file, ec)) / (1 << 20);

    vp.report("load", 0, label + ": loading");
    auto model = Model::load(file);
    if (!model) return fail(model.status());
    row.type_mix = (*model)->type_mix();
    if (auto ft = (*model)->file().get_int("general.file_type"); ft && *ft >= 0 && *ft < (1ll << 32))
      row.file_type = file_type_name_of(static_cast<uint32_t>(*ft));
    auto backend = open_backend(v.backend, *model, threads);
    if (!backend) return fail(backend.status());
    // The fixed chat prompt of the TTFT test, in the model's own template.
    const auto ttft_prompt =
        render_prompt((*model)->tokenizer(), (*model)->chat_format(), PromptInput::chat_of({{"user", opts.ttft_prompt}}))
            .tokens;
    const int n_ctx = std::max({opts.n_ctx, opts.n_prompt + 16, 16 + opts.n_gen + 16,
                                static_cast<int>(ttft_prompt.size()) + 8, 256});
    auto session_r = Session::create(*model, std::move(*backend), n_ctx, KvType::f16, false);  // one prompt per measurement
    if (!session_r) return fail(session_r.status());
    Session& s = **session_r;
    vp.finish_stage(1);

    // The evaluation text's tokens: also the source of the pp and tg prompts.
    std::vector<int32_t> text_tokens = perplexity_tokenize((*model)->tokenizer(), opts.text);
    if (text_tokens.size() < 32) return fail(invalid_argument("the evaluation text is too short (" +
                                                              std::to_string(text_tokens.size()) + " tokens)"));
    // A cancel is the comparison's ("comparison cancelled"); an error names the variant.
    if (Status st = measure_speed(s, v, opts, text_tokens, ttft_prompt, label, vp, cancel, &row); !st)
      return st.code() == StatusCode::cancelled ? st : fail(st);

    if (vi > 0 && text_tokens != base_tokens)
      return fail(invalid_argument("its tokenizer splits the text differently from the reference's: KL divergence "
                                   "needs the same vocabulary (compare quantizations of one model)"));
    KlBase made;
    if (Status st = measure_quality(s, text_tokens, opts, vi == 0 ? nullptr : &*base, &made, label, vp, cancel, &row); !st)
      return fail(st);
    if (vi == 0) {
      base = std::move(made);
      base_tokens = text_tokens;
    }
    row.peak_rss_mib = vm_hwm_mib();  // before the draft test, which loads the target beside it
    row.draft = v.draft;
    if (v.draft) {
      Status st = measure_as_draft(*model, v, rows[0].file, variants[0], opts, threads, label, vp, cancel, &row);
      if (!st) return st.code() == StatusCode::cancelled || stop_asked() ? cancelled("comparison cancelled") : fail(st);
    }
    rows.push_back(row);
    if (progress) progress({vi, n, "done", static_cast<double>(vi + 1) / n, label + ": done", &rows.back()});
  }
  return rows;
}

namespace {

nlohmann::json row_to_json(const CompareRow& r) {
  return {{"name", r.name},
          {"file", r.file},
          {"file_type", r.file_type},
          {"type_mix", r.type_mix},
          {"backend", r.backend},
          {"kv_cache", r.kv_cache},
          {"speculative", r.speculative},
          {"prune", r.prune},
          {"size_mib", r.size_mib},
          {"n_prompt", r.n_prompt},
          {"n_gen", r.n_gen},
          {"repetitions", r.repetitions},
          {"pp512", r.pp},
          {"pp512_sd", r.pp_sd},
          {"tg128", r.tg},
          {"tg128_sd", r.tg_sd},
          {"ttft_ms", r.ttft_ms},
          {"ttft_ms_sd", r.ttft_sd_ms},
          {"ttft_prompt_tokens", r.ttft_prompt_tokens},
          {"peak_rss_mib", r.peak_rss_mib},
          {"peak_rss_per_variant", r.rss_per_variant},
          {"ppl", r.ppl},
          {"ppl_err", r.ppl_err},
          {"kld", r.kld},
          {"kld_p99", r.kld_p99},
          {"top1_agree", r.top1_agree},
          {"rms_dp", r.rms_dp},
          {"accept_sampled", r.accept_sampled},
          {"spec_acceptance", r.spec_acceptance},
          {"tokens_per_pass", r.tokens_per_pass},
          {"draft", r.draft},
          {"draft_k", r.draft_k},
          {"draft_tg", r.draft_tg},
          {"draft_tg_sd", r.draft_tg_sd},
          {"draft_base_tg", r.draft_base_tg},
          {"draft_base_tg_sd", r.draft_base_tg_sd},
          {"draft_speedup", r.draft_speedup},
          {"draft_acceptance", r.draft_acceptance},
          {"draft_tokens_per_pass", r.draft_tokens_per_pass},
          {"reference", r.reference}};
}

// A field of the expected JSON type, or the default when absent; a field of
// another type is an error naming it.
template <typename T>
Status read_field(const nlohmann::json& o, const char* key, T* out, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return Status::ok();
  const bool fits = std::is_same_v<T, bool>          ? it->is_boolean()
                    : std::is_same_v<T, std::string> ? it->is_string()
                                                     : it->is_number();
  if (!fits) return invalid_argument(where + ": field '" + key + "' has the wrong type");
  *out = it->get<T>();
  return Status::ok();
}

Result<CompareRow> row_from_json(const nlohmann::json& o, const std::string& where) {
  if (!o.is_object()) return invalid_argument(where + " is not an object");
  if (!o.contains("name") || !o.contains("tg128")) return invalid_argument(where + " has no name or tg128");
  CompareRow r;
  r.top1_agree = 1;
  for (const auto& [key, field] : std::initializer_list<std::pair<const char*, std::string*>>{
           {"name", &r.name}, {"file", &r.file}, {"file_type", &r.file_type}, {"type_mix", &r.type_mix},
           {"backend", &r.backend}, {"speculative", &r.speculative}, {"prune", &r.prune}})
    PHASELAB_TRY(read_field(o, key, field, where));
  for (const auto& [key, field] : std::initializer_list<std::pair<const char*, double*>>{
           {"size_mib", &r.size_mib}, {"pp512", &r.pp}, {"pp512_sd", &r.pp_sd}, {"tg128", &r.tg},
           {"tg128_sd", &r.tg_sd}, {"ttft_ms", &r.ttft_ms}, {"ttft_ms_sd", &r.ttft_sd_ms},
           {"peak_rss_mib", &r.peak_rss_mib}, {"ppl", &r.ppl}, {"ppl_err", &r.ppl_err}, {"kld", &r.kld},
           {"kld_p99", &r.kld_p99}, {"top1_agree", &r.top1_agree}, {"rms_dp", &r.rms_dp},
           {"accept_sampled", &r.accept_sampled}, {"spec_acceptance", &r.spec_acceptance},
           {"tokens_per_pass", &r.tokens_per_pass}, {"draft_tg", &r.draft_tg}, {"draft_tg_sd", &r.draft_tg_sd},
           {"draft_base_tg", &r.draft_base_tg}, {"draft_base_tg_sd", &r.draft_base_tg_sd},
           {"draft_speedup", &r.draft_speedup}, {"draft_acceptance", &r.draft_acceptance},
           {"draft_tokens_per_pass", &r.draft_tokens_per_pass}})
    PHASELAB_TRY(read_field(o, key, field, where));
  for (const auto& [key, field] : std::initializer_list<std::pair<const char*, int*>>{
           {"n_prompt", &r.n_prompt}, {"n_gen", &r.n_gen}, {"repetitions", &r.repetitions},
           {"ttft_prompt_tokens", &r.ttft_prompt_tokens}, {"draft_k", &r.draft_k}})
    PHASELAB_TRY(read_field(o, key, field, where));
  for (const auto& [key, field] : std::initializer_list<std::pair<const char*, bool*>>{
           {"kv_cache", &r.kv_cache}, {"peak_rss_per_variant", &r.rss_per_variant}, {"reference", &r.reference},
           {"draft", &r.draft}})
    PHASELAB_TRY(read_field(o, key, field, where));
  return r;
}

Result<nlohmann::json> parse_json(std::string_view text, const char* what) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(std::string(what) + " is not valid JSON");
  return j;
}

}  // namespace

std::string compare_rows_json(const std::vector<CompareRow>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const CompareRow& r : rows) a.push_back(row_to_json(r));
  return a.dump(2);
}

std::string compare_row_json(const CompareRow& row) { return row_to_json(row).dump(); }

Result<std::vector<CompareRow>> compare_rows_from_json(std::string_view json) {
  auto j = parse_json(json, "the comparison rows");
  if (!j) return j.status();
  if (!j->is_array()) return invalid_argument("the comparison rows are not a JSON array");
  std::vector<CompareRow> rows;
  for (size_t i = 0; i < j->size(); i++) {
    auto r = row_from_json((*j)[i], "row " + std::to_string(i + 1));
    if (!r) return r.status();
    rows.push_back(std::move(*r));
  }
  return rows;
}

Result<CompareRow> compare_row_from_json(std::string_view json) {
  auto j = parse_json(json, "the comparison row");
  if (!j) return j.status();
  return row_from_json(*j, "the row");
}

std::string compare_progress_json(const CompareProgress& p) {
  if (p.row) return nlohmann::json{{"row", row_to_json(*p.row)}}.dump();
  return nlohmann::json{{"progress",
                         {{"variant", p.variant},
                          {"n_variants", p.n_variants},
                          {"stage", p.stage},
                          {"fraction", p.fraction},
                          {"message", p.message}}}}
      .dump();
}

std::string compare_variants_json(const std::vector<CompareVariant>& variants) {
  nlohmann::json a = nlohmann::json::array();
  for (const CompareVariant& v : variants)
    a.push_back({{"name", v.name},
                 {"file", v.file},
                 {"quantize_to", v.quantize_to ? std::string(file_type_name(*v.quantize_to)) : std::string()},
                 {"backend", v.backend},
                 {"kv_cache", v.kv_cache},
                 {"speculative", v.speculative},
                 {"prune", v.prune},
                 {"draft", v.draft}});
  return a.dump();
}

Result<std::vector<CompareVariant>> compare_variants_from_json(std::string_view json) {
  auto j = parse_json(json, "the variants");
  if (!j) return j.status();
  if (!j->is_array()) return invalid_argument("the variants are not a JSON array of {file, quantize_to, ...}");
  std::vector<CompareVariant> out;
  for (size_t i = 0; i < j->size(); i++) {
    const nlohmann::json& o = (*j)[i];
    const std::string where = "variant " + std::to_string(i + 1);
    if (!o.is_object() || !o.contains("file")) return invalid_argument(where + " has no file");
    CompareVariant v;
    std::string quant;
    for (const auto& [key, field] : std::initializer_list<std::pair<const char*, std::string*>>{
             {"name", &v.name}, {"file", &v.file}, {"quantize_to", &quant}, {"backend", &v.backend},
             {"speculative", &v.speculative}, {"prune", &v.prune}})
      PHASELAB_TRY(read_field(o, key, field, where));
    PHASELAB_TRY(read_field(o, "kv_cache", &v.kv_cache, where));
    PHASELAB_TRY(read_field(o, "draft", &v.draft, where));
    if (!quant.empty()) {
      v.quantize_to = parse_file_type(quant);
      if (!v.quantize_to) return invalid_argument(where + ": unknown quantization type '" + quant + "'");
    }
    out.push_back(std::move(v));
  }
  return out;
}

namespace {

// "12.3 ± 0.4" right-aligned in width columns (the ± is two bytes in UTF-8,
// one column on screen).
std::string mean_sd_cell(double mean, double sd, int width, int repetitions) {
  char buf[64];
  if (repetitions > 1) std::snprintf(buf, sizeof buf, "%.1f \u00b1 %.1f", mean, sd);
  else std::snprintf(buf, sizeof buf, "%.1f", mean);
  std::string s = buf;
  const int columns = static_cast<int>(s.size()) - (repetitions > 1 ? 1 : 0);
  return std::string(std::max(0, width - columns), ' ') + s;
}

}  // namespace

std::string compare_rows_table(const std::vector<CompareRow>& rows, int n_prompt, int n_gen) {
  std::ostringstream o;
  char buf[512];
  std::snprintf(buf, sizeof buf, "| %-22s | %8s | %15s | %15s | %15s | %8s | %20s | %8s | %7s | %7s |\n", "variant",
                "MiB", ("pp" + std::to_string(n_prompt) + " tok/s").c_str(),
                ("tg" + std::to_string(n_gen) + " tok/s").c_str(), "TTFT ms", "RSS MiB", "PPL", "KLD", "top-1",
                "RMS dp");
  o << buf;
  o << "|------------------------|----------|-----------------|-----------------|-----------------|----------|"
       "----------------------|----------|---------|---------|\n";
  for (const CompareRow& r : rows) {
    std::string name = r.name.size() > 22 ? r.name.substr(0, 21) + "~" : r.name;
    char ppl[64];
    std::snprintf(ppl, sizeof ppl, "%.3f +/- %.3f", r.ppl, r.ppl_err);
    std::snprintf(buf, sizeof buf, "| %-22s | %8.1f | %s | %s | %s | %8.0f | %20s | %8.5f | %6.2f%% | %6.2f%% |\n",
                  name.c_str(), r.size_mib, mean_sd_cell(r.pp, r.pp_sd, 15, r.repetitions).c_str(),
                  mean_sd_cell(r.tg, r.tg_sd, 15, r.repetitions).c_str(),
                  mean_sd_cell(r.ttft_ms, r.ttft_sd_ms, 15, r.repetitions).c_str(), r.peak_rss_mib, ppl, r.kld,
                  100 * r.top1_agree, r.rms_dp);
    o << buf;
  }
  // The other variants as drafts of the reference: acceptance teacher-forced
  // on the text (every one) and measured while decoding (those marked draft).
  if (rows.size() < 2) return o.str();
  o << "\nAs speculative drafts of " << rows[0].name
    << " (on the text: greedy = top-1 agreement, sampled = sum of min(p, q); decoding: the draft test)\n";
  std::snprintf(buf, sizeof buf, "| %-22s | %8s | %9s | %9s | %9s | %8s | %15s | %15s | %8s |\n", "draft", "KLD",
                "greedy", "sampled", "decoding", "tok/pass", "target tok/s", "with draft", "speed-up");
  o << buf;
  o << "|------------------------|----------|-----------|-----------|-----------|----------|-----------------|"
       "-----------------|----------|\n";
  for (size_t i = 1; i < rows.size(); i++) {
    const CompareRow& r = rows[i];
    std::string name = r.name.size() > 22 ? r.name.substr(0, 21) + "~" : r.name;
    char sampled[32] = "        -";
    if (r.accept_sampled >= 0) std::snprintf(sampled, sizeof sampled, "%8.2f%%", 100 * r.accept_sampled);
    if (!r.draft) {
      std::snprintf(buf, sizeof buf, "| %-22s | %8.5f | %8.2f%% | %9s | %9s | %8s | %15s | %15s | %8s |\n",
                    name.c_str(), r.kld, 100 * r.top1_agree, sampled, "-", "-", "-", "-", "-");
    } else {
      std::snprintf(buf, sizeof buf, "| %-22s | %8.5f | %8.2f%% | %9s | %8.2f%% | %8.2f | %s | %s | %7.2fx |\n",
                    name.c_str(), r.kld, 100 * r.top1_agree, sampled, 100 * r.draft_acceptance,
                    r.draft_tokens_per_pass, mean_sd_cell(r.draft_base_tg, r.draft_base_tg_sd, 15, r.repetitions).c_str(),
                    mean_sd_cell(r.draft_tg, r.draft_tg_sd, 15, r.repetitions).c_str(), r.draft_speedup);
    }
    o << buf;
  }
  return o.str();
}

std::string compare_rows_csv(const std::vector<CompareRow>& rows) {
  auto field = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  std::ostringstream o;
  o << "name,file,file_type,type_mix,backend,kv_cache,speculative,size_mib,n_prompt,n_gen,repetitions,pp512,pp512_sd,"
       "tg128,tg128_sd,ttft_ms,ttft_ms_sd,ttft_prompt_tokens,peak_rss_mib,ppl,ppl_err,kld,kld_p99,top1_agree,rms_dp,"
       "reference,accept_sampled,spec_acceptance,tokens_per_pass,draft,draft_k,draft_tg,draft_tg_sd,draft_base_tg,"
       "draft_base_tg_sd,draft_speedup,draft_acceptance,draft_tokens_per_pass\n";
  for (const CompareRow& r : rows) {
    o << field(r.name) << ',' << field(r.file) << ',' << field(r.file_type) << ',' << field(r.type_mix) << ','
      << field(r.backend) << ',' << (r.kv_cache ? "true" : "false") << ',' << field(r.speculative) << ',' << r.size_mib
      << ',' << r.n_prompt << ',' << r.n_gen << ',' << r.repetitions << ',' << r.pp << ',' << r.pp_sd << ',' << r.tg
      << ',' << r.tg_sd << ',' << r.ttft_ms << ',' << r.ttft_sd_ms << ',' << r.ttft_prompt_tokens << ','
      << r.peak_rss_mib << ',' << r.ppl << ',' << r.ppl_err
      << ',' << r.kld << ',' << r.kld_p99 << ',' << r.top1_agree << ',' << r.rms_dp << ','
      << (r.reference ? "true" : "false") << ',' << r.accept_sampled << ',' << r.spec_acceptance << ','
      << r.tokens_per_pass << ',' << (r.draft ? "true" : "false") << ',' << r.draft_k << ',' << r.draft_tg << ','
      << r.draft_tg_sd << ',' << r.draft_base_tg << ',' << r.draft_base_tg_sd << ',' << r.draft_speedup << ','
      << r.draft_acceptance << ',' << r.draft_tokens_per_pass << '\n';
  }
  return o.str();
}

}  // namespace phaselab
