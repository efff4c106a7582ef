// The sampler's passes over a whole vocabulary (262144 logits for Gemma 3):
// the largest logit, the softmax sum (alone, with its terms stored, or with
// the candidates above a cutoff gathered in the same read), the gathering of
// a band of logits, the first logit at or above a value, and the k largest. Compiled once per instruction set
// (vocab_passes_{baseline,avx2,avx512}.cpp, all from vocab_passes.inc) and
// chosen when first used; each computes the same floats in every lane
// (-ffp-contract=off: no fused multiply-add), so the choice never changes a
// token or a probability (test_sampler compares them bitwise).
#pragma once

#include <bit>
#include <cstdint>
#include <utility>
#include <vector>

namespace phaselab::vocab {

using Candidates = std::vector<std::pair<float, int32_t>>;  // (logit, token id)

// Terms are summed in float lanes over blocks of this many values, each
// block's sum kept in double: the whole sum is the blocks in order plus the
// tail after the last whole block, the same double whether the values came
// in one slice or several whose bounds are whole blocks.
constexpr int kExpBlock = 1024;

struct Passes {
  const char* name;  // "avx512", "avx2", "baseline"
  // The largest of x[0..n) (NaN ignored; -inf when none).
  float (*max_logit)(const float* x, int n);
  // The first i with x[i] >= v, or -1.
  int32_t (*first_at_least)(const float* x, int n, float v);
  // sum_i exp((x[i] - mx) * inv_t) (every term <= 1 for mx the maximum),
  // each term written to out[i]: the blocks' sums appended to *blocks, the
  // tail's to *tail.
  void (*sum_exp_stored)(const float* x, int n, float mx, float inv_t, float* out, std::vector<double>* blocks,
                         double* tail);
  // sum_i exp(x[i] - mx) as above, and (x[i], id0 + i) appended to *cand for
  // every x[i] >= cutoff, in id order.
  void (*sum_exp_gather)(const float* x, int n, int id0, float mx, float cutoff, Candidates* cand,
                         std::vector<double>* blocks, double* tail);
  // sum_i exp(x[i] - mx), the blocks' sums added in order, then the tail's.
  double (*sum_exp)(const float* x, int n, float mx);
  // The k largest of x[0..n) as (x[i], i), largest first, equal values in
  // id order (NaN never), written to out[0..k); returns how many (fewer
  // than k when x has fewer values that are not NaN).
  int (*top_n)(const float* x, int n, int k, std::pair<float, int32_t>* out);
  // (x[i], id0 + i) appended to *out for every lo <= x[i] < hi, in id order
  // (hi = +inf: every x[i] >= lo, +inf too).
  void (*gather_band)(const float* x, int n, int id0, float lo, float hi, Candidates* out);
};

// The candidates' order: the larger logit first, equal logits in id order.
// Total, so every sort of the same candidates gives one list (and a heap
// with it as comparator keeps its worst kept candidate on top).
struct ByLogit {
  bool operator()(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) const {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  }
};

enum class Isa { baseline, avx2, avx512 };

// The passes compiled for isa, or null where this CPU (or build) lacks it.
const Passes* passes_for(Isa isa);
// The fastest this CPU runs, chosen on the first call.
const Passes& best_passes();

// exp(x) for x <= 0 in plain arithmetic (no library call): x = n ln2 + r
// with |r| <= ln2/2, e^r by its Taylor polynomial to r^6 (relative error
// < 2e-7, float's own), 2^n in the exponent bits. Below -87 the result is
// flushed to 0 (float's normal range), and NaN gives 0. vocab_passes.inc
// does the same operations in each lane of a vector.
inline float exp_nonpositive(float x) {
  const bool in_range = x >= -87.f;
  x = in_range ? x : -87.f;
  // n = round(x / ln2): adding 1.5 * 2^23 rounds to an integer in float.
  const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln2 split hi + lo
  const float p =
      1.f + r * (1.f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f + r * (8.3333338e-3f + r * 1.3888889e-3f)))));
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return in_range ? p * scale : 0.f;
}

}  // namespace phaselab::vocab
