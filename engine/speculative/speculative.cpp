#include "phaselab/speculative.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "phaselab/prompt.h"
#include "phaselab/session.h"

namespace phaselab {

const char* to_string(SpeculativeMode m) {
  switch (m) {
    case SpeculativeMode::off: return "none";
    case SpeculativeMode::prompt_lookup: return "lookup";
    case SpeculativeMode::draft_model: return "draft";
    case SpeculativeMode::self_draft: return "self";
  }
  return "none";
}

std::optional<SpeculativeMode> speculative_mode_from_string(std::string_view s) {
  for (SpeculativeMode m :
       {SpeculativeMode::off, SpeculativeMode::prompt_lookup, SpeculativeMode::draft_model, SpeculativeMode::self_draft})
    if (s == to_string(m)) return m;
  return std::nullopt;
}

namespace {

// splitmix64 of a seed and a proposal's number: a new random stream per
// proposal (a sampler made from the same seed each time would draw the same
// uniforms: not a draw from q).
uint64_t proposal_seed(uint64_t seed, uint64_t i) {
  uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float prob_of(const TokenDist& d, int32_t id) {
  for (const auto& [p, t] : d)
    if (t == id) return p;
  return 0.f;
}

class PromptLookupDraft final : public DraftSource {
 public:
  PromptLookupDraft(int max_ngram, int min_ngram) : max_ngram_(max_ngram), min_ngram_(min_ngram) {}
  std::string name() const override { return to_string(SpeculativeMode::prompt_lookup); }

  Status propose(const std::vector<int32_t>& c, int k, const SamplingParams&, Draft* out) override {
    out->clear();
    const int n = static_cast<int>(c.size());
    for (int g = std::min(max_ngram_, n - 1); g >= min_ngram_; g--) {
      // The most recent earlier occurrence of the last g tokens.
      for (int s = n - g - 1; s >= 0; s--) {
        if (!std::equal(c.begin() + s, c.begin() + s + g, c.end() - g)) continue;
        const int from = s + g;
        for (int i = from; i < n && static_cast<int>(out->tokens.size()) < k; i++) out->tokens.push_back(c[i]);
        return Status::ok();
      }
    }
    return Status::ok();
  }

 private:
  int max_ngram_, min_ngram_;
};

// A draft model's proposal is a short greedy (or sampled) generation on the
// draft's own Session, so through the engine's one loop: the draft's cache
// keeps the common prefix of the last context (Session reuses it), and in
// sampling mode each token is drawn from the distribution the verification
// weighs it by (GenerateOptions::draw_dists).
class DraftModelSource final : public DraftSource {
 public:
  explicit DraftModelSource(std::unique_ptr<Session> s) : s_(std::move(s)) {}
  std::string name() const override { return to_string(SpeculativeMode::draft_model); }

  Status propose(const std::vector<int32_t>& context, int k, const SamplingParams& sp, Draft* out) override {
    out->clear();
    const int n = static_cast<int>(context.size());
    if (n + k >= s_->n_ctx()) k = s_->n_ctx() - n - 1;
    if (k <= 0 || n == 0) return Status::ok();
    GenerateOptions go;
    go.n_predict = k;
    go.sampling = sp;
    go.sampling.seed = proposal_seed(sp.seed, ++proposals_);
    go.ignore_eos = true;  // the target decides where the answer ends
    go.draw_dists = &out->probs;
    auto r = s_->generate(context, go);
    if (!r) return r.status();
    out->tokens = std::move(r->tokens);
    if (sp.greedy()) out->probs.clear();  // deterministic: q is one-hot on each token
    return Status::ok();
  }

 private:
  std::unique_ptr<Session> s_;
  uint64_t proposals_ = 0;
};

// The target with layers skipped, on the sequence's own cache: k passes of
// one token each (the last context token, then each drafted one) through
// Backend::forward_skipping, then the cache rolled back to where it was.
// While it drafts, the cache publishes no block: a full block written by the
// draft holds K/V that the full model would not give, and another request
// must never find it by its tokens' hash.
class SelfDraft final : public DraftSource {
 public:
  SelfDraft(std::shared_ptr<const Model> model, SelfDraftOptions o)
      : model_(std::move(model)), skip_(std::move(o.skip)), n_vocab_(model_->config().n_vocab) {
    const WeightView& out = model_->weights().output;
    const Tokenizer& tok = model_->tokenizer();
    if (n_vocab_ <= 2 * o.short_list) {
      head_ = out;  // the whole vocabulary: no list
    } else {
      slot_.assign(static_cast<size_t>(n_vocab_), -1);
      rows_.reserve(static_cast<size_t>(o.short_list + 8192) * out.row_bytes);
      for (int32_t id = 0; id < n_vocab_; id++)
        if (id < o.short_list || id == tok.eos() || id == tok.eot() || short_latin_piece(tok.token_text(id))) add(id);
      update_head();
    }
    logits_.resize(static_cast<size_t>(head_.n_out));
    if (!slot_.empty()) full_.assign(static_cast<size_t>(n_vocab_), -INFINITY);
  }
  std::string name() const override { return to_string(SpeculativeMode::self_draft); }
  bool drafts_on_target() const override { return true; }

  Status propose(const std::vector<int32_t>&, int, const SamplingParams&, Draft* out) override {
    out->clear();
    return unsupported("self-speculation drafts with the target's backend and cache: the engine loop calls it");
  }

  Status propose_on_target(Backend& backend, KvCache& kv, const std::vector<int32_t>& context, int k,
                           const SamplingParams& sp, Draft* out) override {
    out->clear();
    const int n0 = kv.n_past();
    if (k <= 0 || context.empty() || n0 != static_cast<int>(context.size()) - 1) return Status::ok();
    if (!slot_.empty()) {
      const size_t before = ids_.size();
      for (int32_t id : context)
        if (id >= 0 && id < n_vocab_ && slot_[static_cast<size_t>(id)] < 0) add(id);
      if (ids_.size() != before) {
        update_head();
        logits_.resize(ids_.size());
      }
    }
    // Every block the k passes need, at once: no pass of the draft takes a
    // block (and with it a window part the rollback needs) from the pool.
    if (!kv.reserve(k)) {
      kv.truncate(n0);
      return Status::ok();  // no room: a plain decode (with its preemption)
    }
    const bool greedy = sp.greedy();
    if (!greedy) {
      sampler_.emplace(sp, n_vocab_);
      sampler_->reset(proposal_seed(sp.seed, ++proposals_));
      history_.assign(context.begin(), context.end());
    }
    const bool publishing = kv.prefix_cache();
    kv.set_prefix_cache(false);
    Status st = Status::ok();
    int32_t tok = context.back();
    for (int i = 0; i < k; i++) {
      SeqChunk ch;
      ch.kv = &kv;
      ch.tokens = &tok;
      ch.n_tokens = 1;
      ch.mode = LogitsMode::last;
      ch.logits = logits_.data();
      st = backend.forward_skipping(ch, skip_, &head_);
      if (!st) break;
      const int n = static_cast<int>(logits_.size());
      if (greedy) {
        const int j = argmax(logits_.data(), n);
        tok = slot_.empty() ? j : ids_[static_cast<size_t>(j)];
      } else {
        float* full = logits_.data();
        if (!slot_.empty()) {  // the list's logits in their ids' places, -inf elsewhere
          for (int j = 0; j < n; j++) full_[static_cast<size_t>(ids_[static_cast<size_t>(j)])] = logits_[static_cast<size_t>(j)];
          full = full_.data();
        }
        TokenDist q;
        sampler_->distribution(full, history_, &q);
        if (!slot_.empty()) std::fill(full_.begin(), full_.end(), -INFINITY);
        tok = sampler_->draw(q);
        out->probs.push_back(std::move(q));
        history_.push_back(tok);
      }
      out->tokens.push_back(tok);
    }
    const int back = kv.truncate(n0);
    kv.set_prefix_cache(publishing);
    if (!st) {
      out->clear();
      return st.with_context("self-speculative draft");
    }
    if (back != n0)
      return internal_error("self-speculative draft: rolling the cache back to " + std::to_string(n0) +
                            " positions left " + std::to_string(back));
    return Status::ok();
  }

 private:
  // One character of a Latin script, a digit or punctuation (a SentencePiece
  // word-start mark U+2581 or a GPT-2 byte-level space "Ġ" before it is
  // allowed): such pieces sit at the end of some vocabularies (Gemma 3's
  // "." is 236761) yet are among the most frequent.
  static bool short_latin_piece(std::string_view t) {
    auto strip = [&](std::string_view mark) {
      if (t.size() > mark.size() && t.substr(0, mark.size()) == mark) t.remove_prefix(mark.size());
    };
    strip("\xE2\x96\x81");  // U+2581
    strip("\xC4\xA0");       // U+0120
    if (t.size() == 1) return true;  // ASCII (and single raw bytes)
    if (t.size() != 2) return false;
    const unsigned c = (static_cast<unsigned char>(t[0]) & 0x1Fu) << 6 | (static_cast<unsigned char>(t[1]) & 0x3Fu);
    return (static_cast<unsigned char>(t[0]) & 0xE0u) == 0xC0u && c < 0x250;  // Latin-1 and Latin Extended
  }
  void add(int32_t id) {
    const WeightView& out = model_->weights().output;
    slot_[static_cast<size_t>(id)] = static_cast<int32_t>(ids_.size());
    ids_.push_back(id);
    const uint8_t* r = out.row(id);
    rows_.insert(rows_.end(), r, r + out.row_bytes);
  }
  void update_head() {
    head_ = model_->weights().output;
    head_.data = rows_.data();
    head_.n_out = static_cast<int64_t>(ids_.size());
  }

  std::shared_ptr<const Model> model_;
  std::vector<uint8_t> skip_;  // (n_layer) 1 = left out
  int n_vocab_;
  WeightView head_;              // the output matrix the draft uses: the list's rows, or the model's
  std::vector<int32_t> ids_;     // (list) the vocabulary id of each row of head_
  std::vector<int32_t> slot_;    // (n_vocab) id -> row of head_, -1 when not listed; empty: no list
  std::vector<uint8_t> rows_;    // (list, row_bytes) head_'s rows, copied from the output matrix
  std::vector<float> logits_;    // (head_.n_out)
  std::vector<float> full_;      // (n_vocab) sampling: the list's logits scattered, -inf elsewhere
  std::optional<Sampler> sampler_;
  std::vector<int32_t> history_;
  uint64_t proposals_ = 0;
};

}  // namespace

Result<std::unique_ptr<DraftSource>> make_self_draft(std::shared_ptr<const Model> model, SelfDraftOptions options) {
  const ModelConfig& c = model->config();
  if (static_cast<int>(options.skip.size()) != c.n_layer)
    return invalid_argument("a layer mask of " + std::to_string(options.skip.size()) + " entries for a model of " +
                            std::to_string(c.n_layer) + " layers");
  if (options.short_list < 1) return invalid_argument("the draft's short list needs at least one token");
  return std::unique_ptr<DraftSource>(new SelfDraft(std::move(model), std::move(options)));
}

Result<std::vector<uint8_t>> parse_layer_skip(std::string_view spec, int n_layer) {
  const std::string hint = "--spec-skip takes layers counted from 0 and ranges, e.g. 8-13 or 3,5,9-11 (this model has " +
                           std::to_string(n_layer) + " layers: 0-" + std::to_string(n_layer - 1) + ")";
  std::vector<uint8_t> skip(static_cast<size_t>(std::max(0, n_layer)), 0);
  auto number = [](std::string_view t, int* v) {
    const auto r = std::from_chars(t.data(), t.data() + t.size(), *v);
    return r.ec == std::errc() && r.ptr == t.data() + t.size();
  };
  size_t at = 0;
  while (at <= spec.size()) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string_view item = spec.substr(at, comma - at);
    const size_t dash = item.find('-');
    int a = 0, b = 0;
    const bool ok = dash == std::string_view::npos ? number(item, &a) && (b = a, true)
                                                   : number(item.substr(0, dash), &a) && number(item.substr(dash + 1), &b);
    // (Messages appended: GCC 12 warns wrongly on "'" + std::string.)
    if (!ok || item.empty()) {
      std::string m = "'";
      m += spec;
      m += "' is not a list of layers: " + hint;
      return invalid_argument(m);
    }
    if (a > b || a < 0 || b >= n_layer) {
      std::string m = "layers ";
      m += item;
      m += " are not in the model: " + hint;
      return invalid_argument(m);
    }
    for (int il = a; il <= b; il++) skip[static_cast<size_t>(il)] = 1;
    at = comma + 1;
  }
  const auto n = std::count(skip.begin(), skip.end(), uint8_t{1});
  if (n == n_layer) return invalid_argument("skipping every layer leaves no draft: " + hint);
  return skip;
}

Result<SelfSkipChoice> calibrate_self_skip(Session& s, const std::vector<int32_t>& prompt, int k, int n_predict) {
  if (!s.backend().can_skip_layers())
    return unsupported("--spec-skip auto needs a backend that can skip layers (the CPU backend); the " +
                       s.backend().name() + " backend cannot");
  const int L = s.model().config().n_layer;
  if (L < 2) return invalid_argument("a model of one layer has no layer to skip");
  GenerateOptions o;
  o.n_predict = n_predict;
  o.sampling.temperature = 0;
  o.ignore_eos = true;
  o.spec_k = k;
  // Plain, twice (the first warms the caches and the prefix), the faster kept.
  SelfSkipChoice choice;
  std::vector<int32_t> plain_tokens;
  for (int i = 0; i < 2; i++) {
    auto r = s.generate(prompt, o);
    if (!r) return r.status().with_context("calibration");
    plain_tokens = r->tokens;
    choice.plain_tokens_per_s = std::max(choice.plain_tokens_per_s, r->metrics.decode_tps);
  }
  auto trial = [&](const std::vector<uint8_t>& skip) -> Result<double> {
    auto draft = make_self_draft(s.shared_model(), SelfDraftOptions{skip});
    if (!draft) return draft.status();
    GenerateOptions so = o;
    so.draft = draft->get();
    auto r = s.generate(prompt, so);
    if (!r) return r.status().with_context("calibration");
    if (r->tokens != plain_tokens)
      return internal_error("calibration: the self draft skipping " + layer_skip_to_string(skip) +
                            " changed the greedy output (a bug: verification must keep it)");
    choice.trials.push_back({layer_skip_to_string(skip), r->metrics.decode_tps, r->metrics.spec_acceptance,
                             r->metrics.tokens_per_pass});
    return r->metrics.decode_tps;
  };
  std::vector<uint8_t> best(static_cast<size_t>(L), 0);
  double best_tps = -1;
  const int first = L > 3 ? 1 : 0, last = L > 3 ? L - 2 : L - 1;
  for (int il = first; il <= last; il++) {
    std::vector<uint8_t> m(static_cast<size_t>(L), 0);
    m[static_cast<size_t>(il)] = 1;
    auto tps = trial(m);
    if (!tps) return tps.status();
    if (*tps > best_tps) best_tps = *tps, best = m;
  }
  // Grow the best by a neighbour while that is faster.
  for (int grown = 1; grown < 4; grown++) {
    int lo = 0;
    while (!best[static_cast<size_t>(lo)]) lo++;
    int hi = L - 1;
    while (!best[static_cast<size_t>(hi)]) hi--;
    std::vector<uint8_t> winner;
    double winner_tps = best_tps;
    for (int il : {lo - 1, hi + 1}) {
      if (il < first || il > last) continue;
      std::vector<uint8_t> m = best;
      m[static_cast<size_t>(il)] = 1;
      auto tps = trial(m);
      if (!tps) return tps.status();
      if (*tps > winner_tps) winner_tps = *tps, winner = m;
    }
    if (winner.empty()) break;
    best = winner, best_tps = winner_tps;
  }
  choice.skip = best;
  return choice;
}

std::vector<int32_t> self_skip_calibration_prompt(const Model& model) {
  const char* ask = "Explain in a few sentences how a lighthouse guides ships at night.";
  // A base model's "template" renders the turn as a transcript.
  return render_prompt(model.tokenizer(), model.chat_format(), PromptInput::chat_of({ChatMessage{"user", ask}})).tokens;
}

std::string default_self_skip(int n_layer) { return std::to_string(std::max(0, n_layer / 2 - 1)); }

std::string layer_skip_to_string(const std::vector<uint8_t>& skip) {
  std::string s;
  const int n = static_cast<int>(skip.size());
  for (int i = 0; i < n;) {
    if (!skip[static_cast<size_t>(i)]) {
      i++;
      continue;
    }
    int j = i;
    while (j + 1 < n && skip[static_cast<size_t>(j + 1)]) j++;
    if (!s.empty()) s += ',';
    s += std::to_string(i);
    if (j > i) {
      s += '-';
      s += std::to_string(j);
    }
    i = j + 1;
  }
  return s;
}

std::unique_ptr<DraftSource> make_prompt_lookup_draft(int max_ngram, int min_ngram) {
  return std::make_unique<PromptLookupDraft>(std::max(1, max_ngram), std::max(1, min_ngram));
}

Result<std::unique_ptr<DraftSource>> make_draft_model_source(std::shared_ptr<const Model> draft,
                                                             std::unique_ptr<Backend> backend, int n_ctx,
                                                             const Model& target) {
  const Tokenizer& a = draft->tokenizer();
  const Tokenizer& b = target.tokenizer();
  if (a.n_vocab() != b.n_vocab())
    return invalid_argument("the draft model's vocabulary has " + std::to_string(a.n_vocab()) + " tokens, the target's " +
                            std::to_string(b.n_vocab()) + ": a draft model must share the target's tokenizer");
  for (int32_t id = 0; id < a.n_vocab(); id++)
    if (a.token_text(id) != b.token_text(id))
      return invalid_argument("the draft model's token " + std::to_string(id) + " ('" + std::string(a.token_text(id)) +
                              "') differs from the target's ('" + std::string(b.token_text(id)) +
                              "'): a draft model must share the target's tokenizer");
  auto s = Session::create(std::move(draft), std::move(backend), n_ctx);
  if (!s) return s.status().with_context("draft model");
  return std::unique_ptr<DraftSource>(new DraftModelSource(std::move(*s)));
}

int32_t speculative_accept_or_resample(const TokenDist& p, const TokenDist& q, int32_t d, Sampler& rng,
                                       TokenDist* scratch) {
  const float pd = prob_of(p, d);
  const float qd = q.empty() ? 1.f : prob_of(q, d);
  if (qd > 0 && rng.uniform() < std::min(1.0, static_cast<double>(pd) / qd)) return -1;
  // Residual distribution max(0, p - q), renormalised. q sorted by id for
  // the look-ups (p and q may each cover the whole vocabulary).
  TokenDist qs(q);
  std::sort(qs.begin(), qs.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
  auto q_of = [&](int32_t t) -> float {
    if (q.empty()) return t == d ? 1.f : 0.f;
    auto it = std::lower_bound(qs.begin(), qs.end(), t, [](const auto& e, int32_t id) { return e.second < id; });
    return it != qs.end() && it->second == t ? it->first : 0.f;
  };
  scratch->clear();
  double total = 0;
  for (const auto& [pp, t] : p) {
    const float r = pp - q_of(t);
    if (r > 0) {
      scratch->emplace_back(r, t);
      total += r;
    }
  }
  if (scratch->empty() || total <= 0) return rng.draw(p);  // p == q: nothing to correct
  for (auto& e : *scratch) e.first = static_cast<float>(e.first / total);
  return rng.draw(*scratch);
}

}  // namespace phaselab
