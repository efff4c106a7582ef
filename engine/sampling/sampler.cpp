#include "phaselab/sampler.h"

#include "vocab_passes.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <span>

namespace phaselab {

namespace {

using vocab::exp_nonpositive;
using vocab::kExpBlock;

// The vocabulary passes this CPU runs fastest (vocab_passes.h).
const vocab::Passes& passes() { return vocab::best_passes(); }

// Slice s of n_slices over n values: [first, end), whole blocks of
// kExpBlock but for the last slice's end.
std::pair<int, int> vocab_slice(int n, int n_slices, int s) {
  const int per = (n / n_slices + kExpBlock - 1) / kExpBlock * kExpBlock;
  return {std::min(n, s * per), s + 1 == n_slices ? n : std::min(n, (s + 1) * per)};
}

}  // namespace

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
  // The largest value in 16 lanes, then the first position holding it (the
  // first at or above it): the first of equal maxima, as a scan with ">"
  // finds. That scan carried a dependency through every comparison and took
  // 1.4 ms for a 262144-entry vocabulary (Gemma 3), about a tenth of a
  // decoded token's time; this takes 0.013 ms on one Zen 4 core.
  const vocab::Passes& p = passes();
  const int32_t first = p.first_at_least(logits, n, p.max_logit(logits, n));
  return first >= 0 ? first : 0;  // (none: every value NaN)
}

void token_logprobs(const float* logits, int n_vocab, int32_t id, int n_top, TokenLogprob* out) {
  n_top = std::clamp(n_top, 0, kMaxTopLogprobs);
  const vocab::Passes& p = passes();
  std::pair<float, int32_t> top[kMaxTopLogprobs];  // (logit, id), most likely first
  const int n_kept = p.top_n(logits, n_vocab, n_top, top);
  // log p_i = (l_i - max) - log(sum_j exp(l_j - max)): every exponent <= 0,
  // so nothing overflows, and the sum is at least 1 (the softmax's float
  // terms, summed as the sampler sums them: relative error ~2e-7). No
  // finite maximum (every logit NaN or infinite): no distribution, NaN.
  const float mx = n_kept > 0 ? top[0].first : p.max_logit(logits, n_vocab);  // (the top list's first is it)
  const float log_sum = std::isfinite(mx) ? static_cast<float>(std::log(p.sum_exp(logits, n_vocab, mx)))
                                          : std::numeric_limits<float>::quiet_NaN();
  auto logprob = [&](int32_t i) { return (logits[i] - mx) - log_sum; };
  out->id = id;
  out->logprob = id >= 0 && id < n_vocab ? logprob(id) : -std::numeric_limits<float>::infinity();
  out->top.clear();
  for (int k = 0; k < n_kept; k++) out->top.emplace_back(top[k].second, logprob(top[k].second));
}

Sampler::Sampler(const SamplingParams& p, int n_vocab) : p_(p), n_vocab_(n_vocab), rng_(p.seed) {
  cand_.reserve(n_vocab);
  counts_.reserve(static_cast<size_t>(std::max(p.penalty_last_n, 0)));
  block_sums_.reserve(static_cast<size_t>(n_vocab) / kExpBlock + 2);
  for (auto& b : slice_blocks_) b.reserve(static_cast<size_t>(n_vocab) / kExpBlock / kVocabSlices + 2);
  slice_blocks_[0].reserve(static_cast<size_t>(n_vocab) / kExpBlock + 2);  // (one pass: every block)
}

// Room for every candidate of every slice, made on the calling thread
// before a draw (allocate_ahead: a task must not throw); it allocates on a
// sampler's first sliced draw only.
void Sampler::reserve_slices() {
  for (int s = 0; s < kVocabSlices; s++) {
    const auto [a, b] = vocab_slice(n_vocab_, kVocabSlices, s);
    slice_cand_[s].reserve(static_cast<size_t>(b - a));
  }
}

float Sampler::vocab_max(const float* x) {
  const int S = n_slices();
  if (S == 1) return passes().max_logit(x, n_vocab_);
  auto slice = [&](int s) {
    const auto [a, b] = vocab_slice(n_vocab_, S, s);
    slice_max_[s] = passes().max_logit(x + a, b - a);
  };
  (*tasks_)(S, std::ref(slice));  // (a std::function of a reference: nothing allocated)
  float best = slice_max_[0];  // (as max_logit folds its lanes)
  for (int s = 1; s < S; s++) best = slice_max_[s] > best ? slice_max_[s] : best;
  return best;
}

double Sampler::vocab_sum_exp(const float* x, float mx, float inv_t, float* out, bool gather, float cutoff) {
  const int S = n_slices();
  auto slice = [&](int s) {
    const auto [a, b] = vocab_slice(n_vocab_, S, s);
    slice_blocks_[s].clear();
    slice_cand_[s].clear();
    if (gather)
      passes().sum_exp_gather(x + a, b - a, a, mx, cutoff, S == 1 ? &cand_ : &slice_cand_[s], &slice_blocks_[s], &slice_tail_[s]);
    else
      passes().sum_exp_stored(x + a, b - a, mx, inv_t, out + a, &slice_blocks_[s], &slice_tail_[s]);
  };
  if (S == 1) {
    slice(0);
  } else {
    (*tasks_)(S, std::ref(slice));  // (room for the candidates: allocate_ahead)
  }
  // The blocks in order, then the tail (only the last slice has one).
  double sum = 0;
  block_sums_.clear();
  for (int s = 0; s < S; s++)
    for (double b : slice_blocks_[s]) {
      sum += b;
      block_sums_.push_back(b);
    }
  const double tail = slice_tail_[S - 1];
  if (tail > 0) block_sums_.push_back(tail);
  if (gather && S > 1)
    for (int s = 0; s < S; s++) cand_.insert(cand_.end(), slice_cand_[s].begin(), slice_cand_[s].end());
  return sum + tail;
}

void Sampler::vocab_gather(const float* x, float lo, float hi) {
  const int S = n_slices();
  if (S == 1) return passes().gather_band(x, n_vocab_, 0, lo, hi, &cand_);
  auto slice = [&](int s) {
    const auto [a, b] = vocab_slice(n_vocab_, S, s);
    slice_cand_[s].clear();
    passes().gather_band(x + a, b - a, a, lo, hi, &slice_cand_[s]);
  };
  (*tasks_)(S, std::ref(slice));
  for (int s = 0; s < S; s++) cand_.insert(cand_.end(), slice_cand_[s].begin(), slice_cand_[s].end());
}

void Sampler::reset(uint64_t seed) {
  rng_.seed(seed);
  ahead_.reset();
}

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

namespace {

// Sets *slot for the scope (an empty tasks: none).
struct TasksScope {
  TasksScope(const Sampler::HostTasks** slot, const Sampler::HostTasks& tasks) : slot_(slot) {
    *slot = tasks ? &tasks : nullptr;
  }
  ~TasksScope() { *slot_ = nullptr; }
  const Sampler::HostTasks** slot_;
};

}  // namespace

int32_t Sampler::sample(float* logits, const std::vector<int32_t>& history, const HostTasks& tasks) {
  const TasksScope scope(&tasks_, tasks);
  return sample(logits, history);
}

void Sampler::distribution(float* logits, const std::vector<int32_t>& history,
                           std::vector<std::pair<float, int32_t>>* out, const HostTasks& tasks) {
  const TasksScope scope(&tasks_, tasks);
  distribution(logits, history, out);
}

// What a draw may allocate, made before the logits change (bias,
// penalties): a draw that runs out of memory leaves the row as it was, and
// the engine loop's serial draw starts again from it.
void Sampler::allocate_ahead() {
  if (p_.greedy()) return;
  const bool truncates = uses_top_k() || p_.top_p < 1.f || p_.min_p > 0.f;
  if (!truncates)
    scratch_.resize(static_cast<size_t>(n_vocab_));
  else if (n_slices() > 1)
    reserve_slices();
}

int32_t Sampler::sample(float* logits, const std::vector<int32_t>& history) {
  allocate_ahead();
  apply_bias(logits);
  apply_penalties(logits, history);
  cand_.clear();
  if (p_.greedy()) return argmax(logits, n_vocab_);
  if (!uses_top_k() && p_.top_p >= 1.f && p_.min_p <= 0.f) return draw_untruncated(logits);
  chain(logits);
  return draw(cand_);
}

// Nothing truncates (the OpenAI API's defaults): the draw walks the
// exponentials where they are, first over the sums of blocks of 1024, then
// inside one block, instead of building a (prob, id) list of the vocabulary.
// The same token as draw() over distribution()'s id-ordered list.
int32_t Sampler::draw_untruncated(const float* logits) {
  const int n = n_vocab_;
  const float mx = vocab_max(logits);
  if (!std::isfinite(mx)) {  // nothing to weigh: the argmax (the draw's number taken, as every draw takes one)
    uniform();
    return argmax(logits, n);
  }
  scratch_.resize(static_cast<size_t>(n));
  const double total = vocab_sum_exp(logits, mx, 1.f / p_.temperature, scratch_.data(), false, 0.f);
  const double r = uniform() * total;
  double cum = 0;
  size_t b = 0;
  while (b + 1 < block_sums_.size() && r >= cum + block_sums_[b]) cum += block_sums_[b++];
  const int end = static_cast<int>(std::min<size_t>(static_cast<size_t>(n), (b + 1) * kExpBlock));  // the tail block ends at n
  for (int i = static_cast<int>(b * kExpBlock); i < end; i++) {
    cum += scratch_[i];
    if (r < cum) return i;
  }
  // Rounding left r past the block's terms (its sum was added in float
  // lanes, the walk adds in double): its last token with any weight.
  for (int i = end - 1; i >= static_cast<int>(b * kExpBlock); i--)
    if (scratch_[i] > 0) return i;
  for (int i = n - 1; i >= 0; i--)  // (a block of zeros: the vocabulary's last)
    if (scratch_[i] > 0) return i;
  return n - 1;
}

void Sampler::distribution(float* logits, const std::vector<int32_t>& history,
                           std::vector<std::pair<float, int32_t>>* out) {
  allocate_ahead();
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
  if (ahead_) {
    const double u = *ahead_;
    ahead_.reset();
    return u;
  }
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  return uni(rng_);
}

bool Sampler::device_drawable() const {
  return !p_.greedy() && p_.plain() && (p_.top_k <= DeviceDraw::kMaxCandidates || p_.top_k >= n_vocab_);
}

void Sampler::prepare_device_draw(DeviceDraw* d) {
  d->top_k = uses_top_k() ? p_.top_k : 0;
  d->top_p = p_.top_p < 1.f ? p_.top_p : 1.f;
  d->use_min_p = p_.min_p > 0.f;
  d->log_min_p = d->use_min_p ? std::log(p_.min_p) : 0.f;  // (as chain() computes min-p's threshold)
  d->untruncated = d->top_k == 0 && d->top_p >= 1.f && !d->use_min_p;
  d->inv_t = 1.f / p_.temperature;
  if (!ahead_) ahead_ = uniform();
  d->u = *ahead_;
  d->token = -1;
  d->n_cand = d->n_back = 0;
}

int32_t Sampler::sample_device(const DeviceDraw& d) {
  if (d.token >= 0) {  // drawn there with this draw's number
    uniform();
    return d.token;
  }
  if (d.n_back < d.n_cand || d.n_back > d.cand.size()) return -1;  // not all came back
  cand_.assign(d.cand.begin(), d.cand.begin() + d.n_back);
  size_t n_massed = 0;
  double mass = 0;
  if (!d.complete && !gathered_enough(d.max_logit, d.total, &n_massed, &mass)) {
    cand_.clear();
    return -1;
  }
  cut(d.max_logit, d.total);
  return draw(cand_);
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

// The chain without sorting the vocabulary: every rule keeps a prefix of the
// candidates sorted by logit, so only the tokens above a logit cutoff that
// surely holds that prefix are gathered and sorted. The cutoff starts 8 nats
// below the largest logit (or at min-p's threshold) and moves down, each
// pass gathering only the band between the last cutoff and the new one,
// until the gathered tokens hold top-k's k, or top-p's mass of the softmax
// over the whole vocabulary; at worst every token. Top-p alone moves it a
// nat at a time first (kFineCutoffs), where its cut usually falls: on Gemma
// 3's flatter rows a step from 8 nats to 16 gathered 12-36 thousand
// candidates where top-p kept about a thousand (docs/benchmarks.md); the
// other rules, which stop at a count or at min-p's threshold, take twice
// the distance each time (kCoarseCutoffs). The result is the one a full
// sort gives: the same tokens, largest first, the same probabilities (the
// sort's order is total: by logit, then id). With no truncation at all
// (top-k, top-p and min-p off) every token is kept, in id order. Costs for
// a 262144-entry vocabulary: one pass for the maximum, one for the softmax
// sum (top-p without top-k, or no truncation), usually one to gather; the
// sort is over the few candidates.
void Sampler::chain(float* logits) {
  const int n = n_vocab_;
  const float mx = vocab_max(logits);
  const bool use_k = uses_top_k();
  const bool use_p = p_.top_p < 1.f;
  const bool use_min = p_.min_p > 0.f;
  const float inv_t = 1.f / p_.temperature;
  if (!std::isfinite(mx)) {  // every logit NaN or -inf: nothing to weigh
    cand_.emplace_back(1.f, argmax(logits, n));
    return;
  }
  if (!use_k && !use_p && !use_min) {
    cand_.resize(static_cast<size_t>(n));
    scratch_.resize(static_cast<size_t>(n));
    const double total = vocab_sum_exp(logits, mx, inv_t, scratch_.data(), false, 0.f);
    const float inv = static_cast<float>(1.0 / total);
    for (int i = 0; i < n; i++) cand_[i] = {scratch_[i] * inv, i};
    return;
  }

  // The softmax denominator over the whole vocabulary, which top-p divides
  // by when top-k is off.
  // (The first gather comes with it, in the same pass.)
  const float min_cutoff = use_min ? mx + std::log(p_.min_p) : -std::numeric_limits<float>::infinity();
  // min-p's threshold bounds the kept tokens unless top-p must see all of
  // top-k's k to normalise (then the k are gathered first).
  const bool min_bounds = use_min && !(use_k && use_p);
  auto cutoff_at = [&](float delta, bool* complete) {
    const bool every = delta > 64.f;
    float cutoff = every ? -std::numeric_limits<float>::infinity() : mx - delta;
    *complete = every;
    if (min_bounds && min_cutoff >= cutoff) {
      cutoff = min_cutoff;
      *complete = true;
    }
    return cutoff;
  };
  const bool top_p_alone = use_p && !use_k;
  bool unused = false;
  cand_.clear();
  const double total = top_p_alone ? vocab_sum_exp(logits, mx, 1.f, nullptr, true, cutoff_at(8.f, &unused)) : 0.0;
  // Nats below the maximum; past 64, every token.
  static constexpr float kInf = std::numeric_limits<float>::infinity();
  static constexpr float kFineCutoffs[] = {8.f, 9.f, 10.f, 11.f, 12.f, 14.f, 16.f, 20.f, 24.f, 32.f, 48.f, 64.f, kInf};
  static constexpr float kCoarseCutoffs[] = {8.f, 16.f, 32.f, 64.f, kInf};
  const std::span<const float> cutoffs = top_p_alone ? std::span<const float>(kFineCutoffs) : kCoarseCutoffs;
  float above = kInf;  // the tokens at or above it are gathered
  double mass = 0;     // exp(logit - mx) summed over the first n_massed candidates (top-p)
  size_t n_massed = 0;
  for (float delta : cutoffs) {
    bool complete = false;
    const float cutoff = cutoff_at(delta, &complete);
    if (!(top_p_alone && delta == cutoffs[0])) vocab_gather(logits, cutoff, above);  // (the first: with the sum)
    above = cutoff;
    if (complete || gathered_enough(mx, total, &n_massed, &mass)) break;
  }
  cut(mx, total);
}

// The mass of the candidates gathered, added from *n_massed on (kept in
// *mass between calls), against top-p's share of the total. (A margin over
// the float terms' rounding: the cut, in double, must find top_p inside
// what is gathered, as it did when this check summed double exponentials.)
bool Sampler::holds_top_p(float mx, double total, size_t* n_massed, double* mass) const {
  for (; *n_massed < cand_.size(); ++*n_massed) *mass += exp_nonpositive(cand_[*n_massed].first - mx);
  return *mass >= p_.top_p * total * (1 + 1e-5);
}

bool Sampler::gathered_enough(float mx, double total, size_t* n_massed, double* mass) const {
  if (uses_top_k()) return cand_.size() >= static_cast<size_t>(p_.top_k);
  return p_.top_p < 1.f && holds_top_p(mx, total, n_massed, mass);
}

// The candidates cut to what the rules keep, largest first, and weighed.
// Every rule keeps a prefix of them sorted by logit (ByLogit, a total
// order), so any superset of that prefix gives the same list.
void Sampler::cut(float mx, double total) {
  const bool use_k = uses_top_k();
  const bool use_p = p_.top_p < 1.f;
  const bool use_min = p_.min_p > 0.f;
  const float min_cutoff = use_min ? mx + std::log(p_.min_p) : -std::numeric_limits<float>::infinity();
  const vocab::ByLogit by_logit;
  // top-k: keep the k largest, sorted.
  size_t kept = cand_.size();
  if (use_k && static_cast<size_t>(p_.top_k) < kept) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    kept = static_cast<size_t>(p_.top_k);
  } else if (use_p && !use_k) {
    // Only top-p's prefix needs its order: the largest 64, 256, 1024, ...
    // sorted until they hold top_p of the mass (the cut below then falls
    // inside them), so a gathered set of thousands is not sorted whole.
    size_t sorted = 0;
    for (size_t want = 64; sorted < cand_.size(); want *= 4) {
      const size_t k = std::min(want, cand_.size());
      std::partial_sort(cand_.begin() + static_cast<std::ptrdiff_t>(sorted), cand_.begin() + static_cast<std::ptrdiff_t>(k),
                        cand_.end(), by_logit);
      sorted = k;
      double cum = 0;
      for (size_t i = 0; i < k && cum < p_.top_p; i++) cum += std::exp(static_cast<double>(cand_[i].first - mx)) / total;
      if (cum >= p_.top_p) break;
    }
    kept = sorted;
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  cand_.resize(kept);
  // top-p: the smallest prefix whose probability (softmax of the raw logits
  // over top-k's tokens, or over the vocabulary) reaches top_p.
  if (use_p) {
    double sum = total;
    if (use_k) {
      sum = 0;
      for (const auto& c : cand_) sum += std::exp(static_cast<double>(c.first - mx));
    }
    double cum = 0;
    for (size_t i = 0; i < cand_.size(); i++) {
      cum += std::exp(static_cast<double>(cand_[i].first - mx)) / sum;
      if (cum >= p_.top_p) {
        cand_.resize(i + 1);
        break;
      }
    }
  }
  // min-p: drop tokens less likely than min_p times the most likely one.
  if (use_min) {
    size_t keep = 1;
    while (keep < cand_.size() && cand_[keep].first >= min_cutoff) keep++;
    cand_.resize(keep);
  }
  // Temperature, then the renormalised distribution to draw from.
  double t = 0;
  for (auto& c : cand_) {
    c.first = static_cast<float>(std::exp(static_cast<double>(c.first - mx) / p_.temperature));
    t += c.first;
  }
  for (auto& c : cand_) c.first = static_cast<float>(c.first / t);
}

}  // namespace phaselab
