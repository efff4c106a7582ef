#include "phaselab/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace phaselab {

Status SamplingParams::validate(int n_vocab) const {
  if (!(temperature >= 0.f && temperature <= 100.f)) return invalid_argument("temperature must be from 0 to 100");
  if (top_k < 0) return invalid_argument("top-k must be 0 (off) or positive");
  if (!(top_p > 0.f && top_p <= 1.f)) return invalid_argument("top-p must be in (0, 1]");
  if (!(min_p >= 0.f && min_p < 1.f)) return invalid_argument("min-p must be in [0, 1)");
  if (!(repeat_penalty > 0.f && repeat_penalty <= 10.f)) return invalid_argument("repeat penalty must be in (0, 10]");
  if (!(std::fabs(frequency_penalty) <= 10.f)) return invalid_argument("frequency penalty must be in [-10, 10]");
  if (!(std::fabs(presence_penalty) <= 10.f)) return invalid_argument("presence penalty must be in [-10, 10]");
  if (penalty_last_n < 0) return invalid_argument("penalty window must be >= 0");
  for (const auto& [id, v] : logit_bias) {
    if (!(v >= -100.f && v <= 100.f))
      return invalid_argument("logit bias of token " + std::to_string(id) + " must be from -100 to 100");
    if (id < 0 || (n_vocab > 0 && id >= n_vocab))
      return invalid_argument("logit bias names token " + std::to_string(id) + ", outside the vocabulary" +
                              (n_vocab > 0 ? " (0.." + std::to_string(n_vocab - 1) + ")" : std::string()));
  }
  return Status::ok();
}

int32_t argmax(const float* logits, int n) {
  // The largest value in 16 independent lanes (the compiler vectorizes
  // this), then the first position holding it: the first of equal maxima,
  // as a scan with ">" finds. That scan carried a dependency through every
  // comparison and took 1.4 ms for a 262144-entry vocabulary (Gemma 3),
  // about a tenth of a decoded token's time; this takes 0.1 ms.
  constexpr int L = 16;
  float lane[L];
  for (float& m : lane) m = -std::numeric_limits<float>::infinity();
  int i = 0;
  for (; i + L <= n; i += L)
    for (int l = 0; l < L; l++) lane[l] = logits[i + l] > lane[l] ? logits[i + l] : lane[l];
  float best = lane[0];
  for (int l = 1; l < L; l++) best = lane[l] > best ? lane[l] : best;
  for (; i < n; i++) best = logits[i] > best ? logits[i] : best;
  for (int j = 0; j < n; j++)
    if (logits[j] == best) return j;
  return 0;  // every value NaN
}

void token_logprobs(const float* logits, int n_vocab, int32_t id, int n_top, TokenLogprob* out) {
  n_top = std::clamp(n_top, 0, kMaxTopLogprobs);
  // "a before b": larger logit, then smaller id. As a heap comparator it puts
  // the worst kept candidate on top, the one a better logit replaces.
  auto before = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::pair<float, int32_t> heap[kMaxTopLogprobs];  // (logit, id), n_top at most
  int n_heap = 0;
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n_vocab; i++) {
    const float l = logits[i];
    mx = l > mx ? l : mx;
    if (n_heap < n_top) {
      heap[n_heap++] = {l, i};
      std::push_heap(heap, heap + n_heap, before);
    } else if (n_top > 0 && before({l, i}, heap[0])) {
      std::pop_heap(heap, heap + n_heap, before);
      heap[n_heap - 1] = {l, i};
      std::push_heap(heap, heap + n_heap, before);
    }
  }
  // log p_i = (l_i - max) - log(sum_j exp(l_j - max)): every exponent <= 0,
  // so nothing overflows, and the sum (in double) is at least 1.
  double sum = 0;
  for (int i = 0; i < n_vocab; i++) sum += std::exp(logits[i] - mx);
  const float log_sum = static_cast<float>(std::log(sum));
  auto logprob = [&](int32_t i) { return (logits[i] - mx) - log_sum; };
  out->id = id;
  out->logprob = id >= 0 && id < n_vocab ? logprob(id) : -std::numeric_limits<float>::infinity();
  std::sort_heap(heap, heap + n_heap, before);  // most likely first
  out->top.clear();
  for (int k = 0; k < n_heap; k++) out->top.emplace_back(heap[k].second, logprob(heap[k].second));
}

Sampler::Sampler(const SamplingParams& p, int n_vocab) : p_(p), n_vocab_(n_vocab), rng_(p.seed) {
  cand_.reserve(n_vocab);
  counts_.reserve(static_cast<size_t>(std::max(p.penalty_last_n, 0)));
}

void Sampler::reset(uint64_t seed) { rng_.seed(seed); }

void Sampler::apply_bias(float* logits) const {
  for (const auto& [id, v] : p_.logit_bias)
    if (id >= 0 && id < n_vocab_) logits[id] += v;
}

void Sampler::apply_penalties(float* logits, const std::vector<int32_t>& history) {
  const bool any = p_.repeat_penalty != 1.f || p_.frequency_penalty != 0.f || p_.presence_penalty != 0.f;
  if (!any || p_.penalty_last_n == 0 || history.empty()) return;
  counts_.clear();
  const size_t n = std::min(history.size(), static_cast<size_t>(p_.penalty_last_n));
  for (size_t i = history.size() - n; i < history.size(); i++) {
    const int32_t id = history[i];
    auto it = std::find_if(counts_.begin(), counts_.end(), [id](const auto& c) { return c.first == id; });
    if (it == counts_.end()) counts_.emplace_back(id, 1);
    else it->second++;
  }
  for (const auto& [id, count] : counts_) {
    if (id < 0 || id >= n_vocab_) continue;
    float& l = logits[id];
    if (p_.repeat_penalty != 1.f) l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
    l -= static_cast<float>(count) * p_.frequency_penalty + p_.presence_penalty;
  }
}

int32_t Sampler::sample(float* logits, const std::vector<int32_t>& history) {
  apply_bias(logits);
  apply_penalties(logits, history);
  cand_.clear();
  if (p_.greedy()) return argmax(logits, n_vocab_);
  chain(logits);
  return draw(cand_);
}

void Sampler::distribution(float* logits, const std::vector<int32_t>& history,
                           std::vector<std::pair<float, int32_t>>* out) {
  apply_bias(logits);
  apply_penalties(logits, history);
  cand_.clear();
  if (p_.greedy()) {
    cand_.emplace_back(1.f, argmax(logits, n_vocab_));
  } else {
    chain(logits);
  }
  out->assign(cand_.begin(), cand_.end());
}

double Sampler::uniform() {
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  return uni(rng_);
}

int32_t Sampler::draw(const std::vector<std::pair<float, int32_t>>& dist) {
  const double r = uniform();
  double cum = 0;
  for (const auto& c : dist) {
    cum += c.first;
    if (r < cum) return c.second;
  }
  return dist.back().second;
}

void Sampler::chain(float* logits) {
  for (int i = 0; i < n_vocab_; i++) cand_.emplace_back(logits[i], i);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  // top-k: keep the k largest, sorted.
  size_t n = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = static_cast<size_t>(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  cand_.resize(n);
  // Softmax of the raw logits for top-p and min-p.
  const float mx = cand_[0].first;
  double sum = 0;
  for (auto& c : cand_) sum += std::exp(static_cast<double>(c.first - mx));
  // top-p: the smallest prefix whose probability reaches top_p.
  if (p_.top_p < 1.f) {
    double cum = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; i++) {
      cum += std::exp(static_cast<double>(cand_[i].first - mx)) / sum;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    cand_.resize(keep);
  }
  // min-p: drop tokens less likely than min_p times the most likely one.
  if (p_.min_p > 0.f) {
    const float threshold = mx + std::log(p_.min_p);
    size_t keep = 1;
    while (keep < cand_.size() && cand_[keep].first >= threshold) keep++;
    cand_.resize(keep);
  }
  // Temperature, then draw from the renormalised distribution.
  double total = 0;
  for (auto& c : cand_) {
    c.first = static_cast<float>(std::exp(static_cast<double>(c.first - mx) / p_.temperature));
    total += c.first;
  }
  for (auto& c : cand_) c.first = static_cast<float>(c.first / total);
}

}  // namespace phaselab
