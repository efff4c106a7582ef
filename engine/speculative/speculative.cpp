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
    // A new random stream per proposal (a sampler made from the same seed
    // each time would draw the same uniforms: not a draw from q).
    go.sampling.seed = mix(sp.seed, ++proposals_);
    go.ignore_eos = true;  // the target decides where the answer ends
    go.draw_dists = &out->probs;
    auto r = s_->generate(context, go);
    if (!r) return r.status();
    out->tokens = std::move(r->tokens);
    if (sp.greedy()) out->probs.clear();  // deterministic: q is one-hot on each token
    return Status::ok();
  }

 private:
  // splitmix64 of the seed and the proposal's number.
  static uint64_t mix(uint64_t seed, uint64_t i) {
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  std::unique_ptr<Session> s_;
  uint64_t proposals_ = 0;
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
