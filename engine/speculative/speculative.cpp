#include "phaselab/speculative.h"

#include <algorithm>

#include "phaselab/session.h"

namespace phaselab {

const char* to_string(SpeculativeMode m) {
  switch (m) {
    case SpeculativeMode::off: return "none";
    case SpeculativeMode::prompt_lookup: return "lookup";
    case SpeculativeMode::draft_model: return "draft";
  }
  return "none";
}

std::optional<SpeculativeMode> speculative_mode_from_string(std::string_view s) {
  for (SpeculativeMode m : {SpeculativeMode::off, SpeculativeMode::prompt_lookup, SpeculativeMode::draft_model})
    if (s == to_string(m)) return m;
  return std::nullopt;
}

namespace {

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

class DraftModelSource final : public DraftSource {
 public:
  explicit DraftModelSource(std::unique_ptr<Session> s) : s_(std::move(s)) {}
  std::string name() const override { return to_string(SpeculativeMode::draft_model); }

  Status propose(const std::vector<int32_t>& context, int k, const SamplingParams& sp, Draft* out) override {
    out->clear();
    KvCache& kv = s_->kv();
    const int n = static_cast<int>(context.size());
    if (n + k >= kv.n_ctx()) k = kv.n_ctx() - n - 1;
    if (k <= 0 || n == 0) return Status::ok();
    // Bring the draft's cache to the context: keep the common prefix.
    int common = 0;
    const auto& cached = kv.tokens();
    const int lim = std::min<int>(static_cast<int>(cached.size()), n - 1);
    while (common < lim && cached[common] == context[common]) common++;
    common = kv.truncate(common);  // less when the window before it is gone
    PHASELAB_TRY(s_->eval(std::vector<int32_t>(context.begin() + common, context.end()), &logits_));
    if (!sampler_ || sampler_params_changed(sp)) {
      sampler_ = std::make_unique<Sampler>(sp, s_->model().config().n_vocab);
      params_ = sp;
    }
    history_.assign(context.begin(), context.end());
    for (int i = 0; i < k; i++) {
      TokenDist q;
      sampler_->distribution(logits_.data(), history_, &q);
      const int32_t t = sp.greedy() ? q.front().second : sampler_->draw(q);
      out->tokens.push_back(t);
      out->probs.push_back(sp.greedy() ? TokenDist{} : std::move(q));
      history_.push_back(t);
      if (i + 1 < k) PHASELAB_TRY(s_->eval({t}, &logits_));
    }
    return Status::ok();
  }

 private:
  bool sampler_params_changed(const SamplingParams& sp) const {
    return sp.temperature != params_.temperature || sp.top_k != params_.top_k || sp.top_p != params_.top_p ||
           sp.min_p != params_.min_p || sp.seed != params_.seed;
  }

  std::unique_ptr<Session> s_;
  std::unique_ptr<Sampler> sampler_;
  SamplingParams params_;
  std::vector<float> logits_;
  std::vector<int32_t> history_;
};

}  // namespace

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
