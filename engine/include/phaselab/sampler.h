// Logit processing and sampling. The chain, in order: logit bias; repetition /
// frequency / presence penalties over the last penalty_last_n tokens; then
// greedy (temperature <= 0) or top-k -> top-p -> min-p -> temperature -> draw.
// And the log-probabilities of the raw logits, for requests that ask for them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "phaselab/status.h"

namespace phaselab {

struct SamplingParams {
  float temperature = 0.8f;  // <= 0: greedy
  int top_k = 40;            // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repeat_penalty = 1.0f;     // 1: off
  float frequency_penalty = 0.0f;  // 0: off
  float presence_penalty = 0.0f;   // 0: off
  int penalty_last_n = 64;
  uint64_t seed = 0;
  // (token id, value) added to that token's logit before anything else, as
  // OpenAI's logit_bias: -100..100, where -100 in practice bans the token and
  // +100 all but forces it. Empty: off.
  std::vector<std::pair<int32_t, float>> logit_bias;

  bool greedy() const { return temperature <= 0.f; }
  // Greedy on unmodified logits: their argmax, which a backend can pick
  // where they are (SeqChunk::argmax).
  bool plain_greedy() const { return greedy() && plain(); }
  // No bias and no penalties: the rules read the model's logits as they are.
  bool plain() const {
    return repeat_penalty == 1.f && frequency_penalty == 0.f && presence_penalty == 0.f && logit_bias.empty();
  }
  // A message for the first out-of-range parameter, or ok. n_vocab > 0 also
  // checks logit_bias's ids against the vocabulary.
  Status validate(int n_vocab = 0) const;
};

// A sampled draw whose passes over the vocabulary run where the logits are
// (Backend::has_device_sampling; the CUDA backend's kernels/sample.cu):
// the rules go with the pass's chunk (Sampler::prepare_device_draw), and
// what comes back is what the host sampler would have computed of the whole
// row, bitwise: either the token (no rule truncates, or no finite logit),
// or the largest logit, the softmax sum and the tokens at or above a
// cutoff, from which Sampler::sample_device cuts and draws. A few
// thousand candidates leave the device instead of the whole row.
struct DeviceDraw {
  static constexpr int kMaxCandidates = 4096;
  // The rules (prepare_device_draw).
  bool untruncated = false;  // top-k, top-p and min-p off: drawn on the device
  int32_t top_k = 0;         // 0: off (else below n_vocab)
  float top_p = 1.f;         // 1: off
  bool use_min_p = false;
  float log_min_p = 0.f;     // log(min_p)
  float inv_t = 1.f;         // 1 / temperature
  double u = 0;              // the draw's uniform number
  // What came back.
  int32_t token = -1;         // >= 0: the token
  bool complete = false;      // cutoff is -inf or min-p's threshold: every token the rules may keep
  float max_logit = 0.f;      // of the row (NaN ignored)
  float cutoff = 0.f;         // cand: every token at or above it
  double total = 0;           // sum exp(logit - max_logit) over the row, as Sampler sums it
  uint32_t n_cand = 0;        // how many tokens are at or above cutoff
  uint32_t n_back = 0;        // how many of them came back: n_cand where it fits in cand, else 0
  // Room for kMaxCandidates (logit, id) pairs, sized once by the owner; the
  // first n_back are the candidates, in no particular order.
  std::vector<std::pair<float, int32_t>> cand;
};

class Sampler {
 public:
  Sampler(const SamplingParams& p, int n_vocab);
  void reset(uint64_t seed);
  const SamplingParams& params() const { return p_; }

  // Picks the next token from logits[n_vocab] (modified in place by the
  // bias and the penalties). history: the tokens so far (prompt and generated).
  int32_t sample(float* logits, const std::vector<int32_t>& history);
  // Runs fn(i) for every i in [0, n) and waits, on several threads where it
  // can (Backend::run_host_tasks); fn does not throw.
  using HostTasks = std::function<void(int n, const std::function<void(int)>& fn)>;
  // The same token, its passes over a large vocabulary (the maximum, the
  // softmax sum, the gathering of candidates) split into kVocabSlices
  // slices run as tasks: a lone sequence's draw on every core, not one.
  // The slices' partial results are combined in the order one pass makes
  // them, so the token, and every probability, is bitwise the same.
  int32_t sample(float* logits, const std::vector<int32_t>& history, const HostTasks& tasks);
  static constexpr int kVocabSlices = 4;
  static constexpr int kSliceMinVocab = 32768;  // smaller vocabularies: one pass
  // The distribution the chain ends in, without drawing: (probability, id)
  // pairs summing to 1, largest first (in id order when no rule truncates:
  // top-k, top-p and min-p all off); greedy gives the argmax with 1.
  // logits are modified in place (bias, penalties). For speculative verification.
  void distribution(float* logits, const std::vector<int32_t>& history, std::vector<std::pair<float, int32_t>>* out);
  // The same with its passes over the vocabulary in slices on tasks (as
  // sample(..., tasks)): bitwise the same list.
  void distribution(float* logits, const std::vector<int32_t>& history, std::vector<std::pair<float, int32_t>>* out,
                    const HostTasks& tasks);
  // Draws from a distribution like the one above with this sampler's RNG.
  int32_t draw(const std::vector<std::pair<float, int32_t>>& dist);
  // A uniform number in [0, 1) from this sampler's RNG (the one drawn
  // ahead by prepare_device_draw, if any). Every sampled (not greedy) draw
  // takes exactly one.
  double uniform();

  // Whether a draw may run on the device (DeviceDraw): sampled, on the
  // model's logits as they are (no bias, no penalties), top-k off or at
  // most DeviceDraw::kMaxCandidates.
  bool device_drawable() const;
  // d's rules for the next draw; its uniform number is drawn now and kept
  // for that draw (a pass that fails leaves it for the next one).
  void prepare_device_draw(DeviceDraw* d);
  // The token sample() draws from the row the device read, given what came
  // back; -1 when the candidates do not surely hold what the rules keep
  // (more than kMaxCandidates of them, or top-p's share not within them by
  // the host's own sums): then sample() the row itself, which takes the same
  // uniform number.
  int32_t sample_device(const DeviceDraw& d);

 private:
  void apply_bias(float* logits) const;
  void apply_penalties(float* logits, const std::vector<int32_t>& history);
  void chain(float* logits);  // fills cand_ with the final (prob, id) list
  // The chain after the gathering: cand_ holds (at least) every token the
  // rules may keep, as (logit, id); mx the largest logit, total the softmax
  // sum over the vocabulary (top-p without top-k). Leaves the (prob, id) list.
  void cut(float mx, double total);
  // Whether the gathered cand_ surely holds top-p's share (top-p without top-k).
  bool holds_top_p(float mx, double total, size_t* n_massed, double* mass) const;
  // Whether the gathered cand_ surely hold what the rules keep: top-k's k,
  // or else top-p's share (holds_top_p; min-p alone bounds the gathering
  // itself). chain()'s stop rule, and sample_device()'s test of what came back.
  bool gathered_enough(float mx, double total, size_t* n_massed, double* mass) const;
  bool uses_top_k() const { return p_.top_k > 0 && p_.top_k < n_vocab_; }
  int32_t draw_untruncated(const float* logits);  // sample() when no rule truncates
  // The passes over the vocabulary, in slices on tasks_ where set (and the
  // vocabulary is large), else in one pass.
  float vocab_max(const float* x);
  // sum exp((x - mx) * inv_t); out (when not gather): each term;
  // block_sums_: the sums of its blocks of 1024 (and the tail's, if any);
  // cand_ (when gather) += the tokens at or above cutoff, in id order.
  double vocab_sum_exp(const float* x, float mx, float inv_t, float* out, bool gather, float cutoff);
  void vocab_gather(const float* x, float lo, float hi);  // cand_ += the tokens in [lo, hi) (hi +inf: >= lo)
  void reserve_slices();
  void allocate_ahead();
  int n_slices() const { return tasks_ && n_vocab_ >= kSliceMinVocab ? kVocabSlices : 1; }
  const HostTasks* tasks_ = nullptr;  // during sample(..., tasks) only

  SamplingParams p_;
  int n_vocab_;
  std::mt19937_64 rng_;
  std::optional<double> ahead_;  // a uniform number drawn ahead (prepare_device_draw)
  std::vector<std::pair<float, int32_t>> cand_;    // (logit or prob, id), reserved n_vocab
  std::vector<float> scratch_;                     // exp terms when every token is kept
  std::vector<double> block_sums_;                 // their sums per block of 1024
  // Per slice: its largest logit, its blocks' sums, the sum of its tail
  // (the last slice's values after the last whole block), its candidates.
  float slice_max_[kVocabSlices] = {};
  std::vector<double> slice_blocks_[kVocabSlices];
  double slice_tail_[kVocabSlices] = {};
  std::vector<std::pair<float, int32_t>> slice_cand_[kVocabSlices];
  std::vector<std::pair<int32_t, int>> counts_;    // (id, count) over the penalty window
};

int32_t argmax(const float* logits, int n);

// The log-probability of a chosen token and of the most likely ones, from
// the log-softmax of the logits as the model gave them (before bias,
// penalties and temperature), as OpenAI's logprobs report them.
struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), most likely first
};
constexpr int kMaxTopLogprobs = 20;  // OpenAI's limit for top_logprobs

// Fills *out for the token id chosen from logits[n_vocab], with the n_top
// (0..kMaxTopLogprobs) most likely tokens, equal logits in id order (NaN
// logits never among them). The sampler's vectorised passes: one keeps the
// n_top largest in a small heap (no sort of the vocabulary), one finds the
// maximum, one sums the exponentials; out->top reuses its capacity.
void token_logprobs(const float* logits, int n_vocab, int32_t id, int n_top, TokenLogprob* out);

}  // namespace phaselab
