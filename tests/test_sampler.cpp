// The sampler (engine/sampling, phaselab/sampler.h) rule by rule: greedy is
// the argmax; temperature, top-k, top-p and min-p give the distribution
// their definitions give, both as returned by distribution() (exactly) and
// as drawn by sample() (the frequencies of many draws against the expected
// probabilities: every bin within 5 standard deviations and the chi-squared
// statistic below its 1e-6 quantile; a token the rules remove is never
// drawn); the repetition, frequency and presence penalties change the logits
// exactly as llama.cpp's do; the seed makes the draws reproducible.
//
// The chain (sampler.h): penalties over the last penalty_last_n tokens, then
// greedy (temperature <= 0) or top-k -> top-p -> min-p -> temperature ->
// draw. top-p and min-p look at the softmax of the logits before the
// temperature, over the candidates the previous steps kept.
#include <QtTest>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "phaselab/sampler.h"
#include "sampling/vocab_passes.h"

using namespace phaselab;

namespace {

using Dist = std::vector<std::pair<float, int32_t>>;

// Plain sampling: no truncation, temperature 1, no penalties.
SamplingParams plain(uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = 1.f;
  p.top_k = 0;
  p.top_p = 1.f;
  p.min_p = 0.f;
  p.seed = seed;
  return p;
}

// softmax(logits / T) over the ids in keep (all when empty), in double; the
// other ids get 0.
std::vector<double> softmax(const std::vector<float>& logits, double T, const std::vector<int>& keep = {}) {
  std::vector<int> ids = keep;
  if (ids.empty()) {
    ids.resize(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
  }
  double mx = -INFINITY;
  for (int i : ids) mx = std::max(mx, static_cast<double>(logits[i]));
  std::vector<double> p(logits.size(), 0.0);
  double sum = 0;
  for (int i : ids) sum += p[i] = std::exp((logits[i] - mx) / T);
  for (double& x : p) x /= sum;
  return p;
}

// The chain as a full sort of the vocabulary computes it (what the sampler
// did before it learnt to gather only the candidates above a cutoff): the
// oracle for the fast chain. (prob, id), largest first.
Dist sorted_chain(const SamplingParams& p, const std::vector<float>& logits) {
  Dist c;
  for (int i = 0; i < static_cast<int>(logits.size()); i++) c.emplace_back(logits[i], i);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::sort(c.begin(), c.end(), by_logit);
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) c.resize(p.top_k);
  const double mx = c[0].first;
  double sum = 0;
  for (auto& x : c) sum += std::exp(x.first - mx);
  if (p.top_p < 1.f) {
    double cum = 0;
    for (size_t i = 0; i < c.size(); i++) {
      cum += std::exp(c[i].first - mx) / sum;
      if (cum >= p.top_p) {
        c.resize(i + 1);
        break;
      }
    }
  }
  if (p.min_p > 0.f) {
    const float threshold = static_cast<float>(mx) + std::log(p.min_p);
    size_t keep = 1;
    while (keep < c.size() && c[keep].first >= threshold) keep++;
    c.resize(keep);
  }
  double total = 0;
  for (auto& x : c) total += (x.first = static_cast<float>(std::exp((x.first - mx) / p.temperature)));
  for (auto& x : c) x.first = static_cast<float>(x.first / total);
  return c;
}

// The probabilities a distribution() call returns, by id (0 for absent ids).
std::vector<double> dist_probs(Sampler& s, std::vector<float> logits, const std::vector<int32_t>& history = {}) {
  Dist d;
  s.distribution(logits.data(), history, &d);
  std::vector<double> p(logits.size(), 0.0);
  for (const auto& [prob, id] : d) p.at(id) += prob;
  return p;
}

// How often each id is drawn in n calls of sample() (the logits are copied
// for every call, as the penalties modify them).
std::vector<int> draw_counts(const SamplingParams& params, const std::vector<float>& logits, int n,
                             const std::vector<int32_t>& history = {}) {
  Sampler s(params, static_cast<int>(logits.size()));
  std::vector<int> counts(logits.size(), 0);
  std::vector<float> l;
  for (int i = 0; i < n; i++) {
    l = logits;
    const int32_t id = s.sample(l.data(), history);
    if (id < 0 || id >= static_cast<int32_t>(logits.size())) qFatal("sample() returned id %d", id);
    counts[id]++;
  }
  return counts;
}

// The chi-squared distribution's quantile at 1 - 1e-6 (Wilson-Hilferty).
double chi2_limit(int df) {
  const double z = 4.753, a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3);
}

// Empty when counts (out of n draws) fit the probabilities want: ids with
// probability 0 never drawn, each other id within 5 sigma of n*p, and the
// chi-squared statistic under its 1e-6 quantile. Else what does not fit.
QString frequencies_mismatch(const std::vector<int>& counts, const std::vector<double>& want) {
  const double n = std::accumulate(counts.begin(), counts.end(), 0.0);
  double chi2 = 0;
  int bins = 0;
  for (size_t i = 0; i < want.size(); i++) {
    const double p = want[i];
    if (p <= 0) {
      if (counts[i] != 0) return QString("id %1 should never be drawn, was drawn %2 times").arg(i).arg(counts[i]);
      continue;
    }
    const double mean = n * p, sigma = std::sqrt(n * p * (1 - p));
    if (std::fabs(counts[i] - mean) > 5 * sigma + 1)
      return QString("id %1 drawn %2 times, expected %3 +- %4 (5 sigma)").arg(i).arg(counts[i]).arg(mean).arg(5 * sigma);
    chi2 += (counts[i] - mean) * (counts[i] - mean) / mean;
    bins++;
  }
  if (bins > 1 && chi2 > chi2_limit(bins - 1))
    return QString("chi-squared %1 over %2 bins, limit %3").arg(chi2).arg(bins).arg(chi2_limit(bins - 1));
  return {};
}

#define CHECK_FREQUENCIES(counts, want)                                    \
  do {                                                                     \
    const QString why_ = frequencies_mismatch((counts), (want));           \
    QVERIFY2(why_.isEmpty(), qPrintable(why_));                            \
  } while (0)

// want and got equal within 1e-6 per id.
#define CHECK_PROBS(got, want)                                                                             \
  do {                                                                                                     \
    const auto g_ = (got);                                                                                 \
    const auto w_ = (want);                                                                                \
    QCOMPARE(g_.size(), w_.size());                                                                        \
    for (size_t i_ = 0; i_ < w_.size(); i_++)                                                              \
      QVERIFY2(std::fabs(g_[i_] - w_[i_]) <= 1e-6,                                                         \
               qPrintable(QString("id %1: probability %2, expected %3").arg(i_).arg(g_[i_]).arg(w_[i_]))); \
  } while (0)

constexpr int kDraws = 100000;

// Logits with well separated, unequal probabilities.
const std::vector<float> kLogits = {1.2f, -0.4f, 2.0f, 0.1f, -1.5f, 0.9f, -0.2f, 1.6f, -3.0f, 0.5f};

// The sampler with p keeps exactly the ids in `keep`, with softmax(logits / T)
// over them: in its probabilities and in its draws.
void check_keeps(const SamplingParams& p, const std::vector<float>& logits, const std::vector<int>& keep) {
  const std::vector<double> want = softmax(logits, p.temperature, keep);
  Sampler s(p, static_cast<int>(logits.size()));
  CHECK_PROBS(dist_probs(s, logits), want);
  CHECK_FREQUENCIES(draw_counts(p, logits, kDraws / 2), want);
}

// The ids of kLogits from most to least likely.
std::vector<int> ranked(const std::vector<float>& l) {
  std::vector<int> ids(l.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return l[a] > l[b]; });
  return ids;
}

}  // namespace

class TestSampler : public QObject {
  Q_OBJECT
 private slots:
  void greedy_is_argmax() {
    SamplingParams p = plain();
    p.temperature = 0.f;
    p.top_k = 3;  // truncation does not matter to greedy
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 3.f);
    for (int trial = 0; trial < 200; trial++) {
      const int n = 1 + trial % 50;
      std::vector<float> l(n);
      for (float& x : l) x = nd(rng) - (trial % 2 ? 50.f : 0.f);  // all negative for odd trials
      const int want = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
      QCOMPARE(argmax(l.data(), n), want);
      Sampler s(p, n);
      std::vector<float> c = l;
      QCOMPARE(s.sample(c.data(), {}), want);
      Dist d;
      c = l;
      s.distribution(c.data(), {}, &d);
      QCOMPARE(d.size(), size_t{1});
      QCOMPARE(d[0].second, want);
      QCOMPARE(d[0].first, 1.f);
    }
    // Ties go to the lowest id.
    std::vector<float> tie = {1.f, 3.f, -2.f, 3.f, 3.f};
    QCOMPARE(argmax(tie.data(), 5), 1);
    Sampler s(p, 5);
    QCOMPARE(s.sample(tie.data(), {}), 1);
    // The last id can win.
    std::vector<float> last = {-1.f, -2.f, 0.5f};
    QCOMPARE(Sampler(p, 3).sample(last.data(), {}), 2);
    // Vocabulary-sized rows (the scan runs in lanes, then a tail): the
    // maximum anywhere, ties across lanes and between the lanes and the
    // tail go to the lowest id.
    for (int n : {262144, 262145, 1000, 33, 17}) {
      std::vector<float> big(n);
      for (float& x : big) x = nd(rng);
      for (int at : {0, 1, 15, 16, n / 2 + 3, n - 17, n - 2, n - 1}) {
        if (at < 0 || at >= n) continue;
        std::vector<float> v = big;
        v[at] = 100.f;
        QCOMPARE(argmax(v.data(), n), at);
        if (at + 5 < n) {
          v[at + 5] = 100.f;  // another lane holds the same maximum
          QCOMPARE(argmax(v.data(), n), at);
        }
        v[n - 1] = 100.f;  // and the tail
        QCOMPARE(argmax(v.data(), n), at);
      }
    }
  }

  void temperature_data() {
    QTest::addColumn<float>("T");
    QTest::newRow("T=1") << 1.f;
    QTest::newRow("T=0.5 (sharper)") << 0.5f;
    QTest::newRow("T=2 (flatter)") << 2.f;
    QTest::newRow("T=0.05 (nearly greedy)") << 0.05f;
  }
  void temperature() {
    QFETCH(float, T);
    SamplingParams p = plain(11);
    p.temperature = T;
    const std::vector<double> want = softmax(kLogits, T);
    Sampler s(p, static_cast<int>(kLogits.size()));
    // distribution(): softmax(l / T) summing to 1; nothing truncates, so
    // every token, in id order (no sort of the vocabulary).
    Dist d;
    std::vector<float> c = kLogits;
    s.distribution(c.data(), {}, &d);
    QCOMPARE(d.size(), kLogits.size());
    double sum = 0;
    for (size_t i = 0; i < d.size(); i++) {
      sum += d[i].first;
      QCOMPARE(d[i].second, static_cast<int32_t>(i));
    }
    QVERIFY(std::fabs(sum - 1) < 1e-5);
    CHECK_PROBS(dist_probs(s, kLogits), want);
    // sample(): the frequencies of many draws.
    CHECK_FREQUENCIES(draw_counts(p, kLogits, kDraws), want);
  }

  void top_k_data() {
    QTest::addColumn<int>("k");
    QTest::addColumn<float>("T");
    QTest::newRow("k=1 (the argmax)") << 1 << 1.f;
    QTest::newRow("k=3") << 3 << 1.f;
    QTest::newRow("k=3, T=1.7") << 3 << 1.7f;
    QTest::newRow("k=6, T=0.6") << 6 << 0.6f;
    QTest::newRow("k=n (all)") << 10 << 1.f;
    QTest::newRow("k>n (all)") << 50 << 1.f;
  }
  void top_k() {
    QFETCH(int, k);
    QFETCH(float, T);
    SamplingParams p = plain(21);
    p.top_k = k;
    p.temperature = T;
    const std::vector<int> order = ranked(kLogits);
    const std::vector<int> keep(order.begin(), order.begin() + std::min<size_t>(k, order.size()));
    const std::vector<double> want = softmax(kLogits, T, keep);
    Sampler s(p, static_cast<int>(kLogits.size()));
    CHECK_PROBS(dist_probs(s, kLogits), want);
    CHECK_FREQUENCIES(draw_counts(p, kLogits, kDraws), want);
  }

  void top_p_data() {
    QTest::addColumn<std::vector<float>>("logits");
    QTest::addColumn<float>("top_p");
    QTest::addColumn<int>("top_k");
    QTest::addColumn<float>("T");
    QTest::addColumn<std::vector<int>>("keep");
    // Two equal logits: exactly 0.5 each, so the boundary is exact.
    QTest::newRow("mass reaches p exactly: kept") << std::vector<float>{0.f, 0.f} << 0.5f << 0 << 1.f
                                                  << std::vector<int>{0};
    QTest::newRow("just above: the next one too") << std::vector<float>{0.f, 0.f} << 0.5001f << 0 << 1.f
                                                  << std::vector<int>{0, 1};
    // Four equal: 0.25 each; ties by id.
    QTest::newRow("4 equal, p=0.5") << std::vector<float>{0.f, 0.f, 0.f, 0.f} << 0.5f << 0 << 1.f
                                    << std::vector<int>{0, 1};
    QTest::newRow("4 equal, p=0.75") << std::vector<float>{0.f, 0.f, 0.f, 0.f} << 0.75f << 0 << 1.f
                                     << std::vector<int>{0, 1, 2};
    // Probabilities 0.5, 0.3, 0.15, 0.05 (ids 2, 0, 3, 1).
    const std::vector<float> l = {std::log(0.3f), std::log(0.05f), std::log(0.5f), std::log(0.15f)};
    QTest::newRow("p=0.7: two") << l << 0.7f << 0 << 1.f << std::vector<int>{2, 0};
    QTest::newRow("p=0.79: two") << l << 0.79f << 0 << 1.f << std::vector<int>{2, 0};
    QTest::newRow("p=0.81: three") << l << 0.81f << 0 << 1.f << std::vector<int>{2, 0, 3};
    QTest::newRow("p=0.96: all four") << l << 0.96f << 0 << 1.f << std::vector<int>{2, 0, 3, 1};
    QTest::newRow("p tiny: the most likely alone") << l << 1e-6f << 0 << 1.f << std::vector<int>{2};
    QTest::newRow("p=1: off") << l << 1.f << 0 << 1.f << std::vector<int>{2, 0, 3, 1};
    // The set is chosen before the temperature: at T=10 the first two are
    // 0.28 and 0.27 of the mass, which would need three for p=0.7.
    QTest::newRow("p=0.7, T=10: still two") << l << 0.7f << 0 << 10.f << std::vector<int>{2, 0};
    QTest::newRow("p=0.45, T=0.3: still one") << l << 0.45f << 0 << 0.3f << std::vector<int>{2};
    // After top-k: the mass of the k kept, renormalized: with k=2, id 2 has
    // 0.5/0.8 = 0.625 >= 0.6 (over the whole vocabulary it would be 0.5).
    QTest::newRow("k=2 then p=0.6: one") << l << 0.6f << 2 << 1.f << std::vector<int>{2};
    QTest::newRow("k=3 then p=0.6: two") << l << 0.6f << 3 << 1.f << std::vector<int>{2, 0};
  }
  void top_p() {
    QFETCH(std::vector<float>, logits);
    QFETCH(float, top_p);
    QFETCH(int, top_k);
    QFETCH(float, T);
    QFETCH(std::vector<int>, keep);
    SamplingParams p = plain(31);
    p.top_p = top_p;
    p.top_k = top_k;
    p.temperature = T;
    check_keeps(p, logits, keep);
  }

  void min_p_data() {
    QTest::addColumn<std::vector<float>>("logits");
    QTest::addColumn<float>("min_p");
    QTest::addColumn<int>("top_k");
    QTest::addColumn<float>("T");
    QTest::addColumn<std::vector<int>>("keep");
    // Probabilities relative to the most likely (id 1): 1, 0.5, 0.2, 0.09, 0.05.
    const std::vector<float> l = {std::log(0.2f), 0.f, std::log(0.05f), std::log(0.5f), std::log(0.09f)};
    QTest::newRow("min_p=0.1") << l << 0.1f << 0 << 1.f << std::vector<int>{1, 3, 0};
    QTest::newRow("min_p=0.3") << l << 0.3f << 0 << 1.f << std::vector<int>{1, 3};
    QTest::newRow("min_p=0.06") << l << 0.06f << 0 << 1.f << std::vector<int>{1, 3, 0, 4};
    QTest::newRow("min_p=0.01: all") << l << 0.01f << 0 << 1.f << std::vector<int>{1, 3, 0, 4, 2};
    QTest::newRow("min_p=0.9: the most likely alone") << l << 0.9f << 0 << 1.f << std::vector<int>{1};
    QTest::newRow("min_p=0 off") << l << 0.f << 0 << 1.f << std::vector<int>{1, 3, 0, 4, 2};
    // Before the temperature: T=5 flattens the ratios (0.2 -> 0.72) but not the set.
    QTest::newRow("min_p=0.3, T=5") << l << 0.3f << 0 << 5.f << std::vector<int>{1, 3};
    // After top-k.
    QTest::newRow("k=2, min_p=0.1") << l << 0.1f << 2 << 1.f << std::vector<int>{1, 3};
    // Exactly min_p times the most likely: kept (p >= min_p * p_max).
    QTest::newRow("at the threshold: kept") << std::vector<float>{0.f, std::log(0.25f), std::log(0.2f)} << 0.25f << 0
                                            << 1.f << std::vector<int>{0, 1};
  }
  void min_p() {
    QFETCH(std::vector<float>, logits);
    QFETCH(float, min_p);
    QFETCH(int, top_k);
    QFETCH(float, T);
    QFETCH(std::vector<int>, keep);
    SamplingParams p = plain(41);
    p.min_p = min_p;
    p.top_k = top_k;
    p.temperature = T;
    check_keeps(p, logits, keep);
  }

  void the_whole_chain() {
    // top-k=6 -> top-p=0.9 -> min-p=0.2 -> T=0.8 on kLogits, worked out here
    // step by step from the definitions.
    SamplingParams p = plain(51);
    p.top_k = 6;
    p.top_p = 0.9f;
    p.min_p = 0.2f;
    p.temperature = 0.8f;
    std::vector<int> keep = ranked(kLogits);
    keep.resize(6);
    const std::vector<double> pk = softmax(kLogits, 1.0, keep);
    double cum = 0;
    size_t n = 0;
    while (n < keep.size() && cum < 0.9) cum += pk[keep[n++]];
    keep.resize(n);
    const double pmax = pk[keep[0]];
    keep.erase(std::remove_if(keep.begin(), keep.end(), [&](int id) { return pk[id] < 0.2 * pmax; }), keep.end());
    QVERIFY(keep.size() >= 2 && keep.size() < 6);  // every step did something
    const std::vector<double> want = softmax(kLogits, 0.8, keep);
    Sampler s(p, static_cast<int>(kLogits.size()));
    CHECK_PROBS(dist_probs(s, kLogits), want);
    CHECK_FREQUENCIES(draw_counts(p, kLogits, kDraws), want);
  }

  // The chain gathers only the tokens above a logit cutoff instead of
  // sorting the vocabulary: the same tokens in the same order with the same
  // probabilities as the full sort, for every combination of the rules, on
  // a Gemma-sized vocabulary with peaked, flat and tied logits.
  void chain_equals_a_full_sort() {
    std::mt19937 rng(7);
    const int n = 262144;
    struct Case {
      const char* shape;
      float spread;
    };
    // ("wide ties": whole-number logits over 40 nats, many of them on the
    // gathering's cutoffs, which are whole nats below the maximum.)
    for (const Case shape : {Case{"peaked", 6.f}, Case{"flat", 0.5f}, Case{"ties", 0.f}, Case{"wide ties", -1.f}}) {
      std::vector<float> logits(n);
      std::normal_distribution<float> g(0.f, std::max(shape.spread, 1e-3f));
      for (auto& x : logits)
        x = shape.spread == 0.f ? static_cast<float>(rng() % 8) : shape.spread < 0.f ? static_cast<float>(rng() % 40) : g(rng);
      if (shape.spread > 1.f) logits[12345] += 30.f;  // one clear favourite
      for (int k : {0, 1, 40, 300000})
        for (float top_p : {1.f, 0.95f, 0.5f})
          for (float min_p : {0.f, 0.05f, 1e-6f})
            for (float t : {0.7f}) {
              SamplingParams p = plain();
              p.top_k = k;
              p.top_p = top_p;
              p.min_p = min_p;
              p.temperature = t;
              Sampler s(p, n);
              Dist got;
              std::vector<float> copy = logits;
              s.distribution(copy.data(), {}, &got);
              const Dist want = sorted_chain(p, logits);
              const QByteArray what = QByteArray(shape.shape) + " k=" + QByteArray::number(k) +
                                      " p=" + QByteArray::number(top_p) + " min_p=" + QByteArray::number(min_p);
              QVERIFY2(got.size() == want.size(), what + " sizes " + QByteArray::number(qulonglong(got.size())) +
                                                      " vs " + QByteArray::number(qulonglong(want.size())));
              const bool unsorted = (k == 0 || k >= n) && top_p >= 1.f && min_p == 0.f;  // every token, id order
              std::vector<double> by_id(n, 0.0);
              for (const auto& [prob, id] : want) by_id[id] = prob;
              for (size_t i = 0; i < got.size(); i++) {
                if (!unsorted) QVERIFY2(got[i].second == want[i].second, what + " order");
                const double w = by_id[got[i].second];
                QVERIFY2(std::fabs(got[i].first - w) <= 1e-5 * w + 1e-12, what + " probability");
              }
            }
    }
  }

  // A lone sequence's draw with its passes over the vocabulary in slices on
  // several threads (the engine loop's, through Backend::run_host_tasks)
  // draws the tokens one pass draws, draw after draw from the same seed,
  // for every kind of chain, on vocabularies whose slices end inside a block
  // of 1024 or not, with peaked, flat and tied logits, NaN and -inf among
  // them, bias and penalties; the distributions bitwise equal; the slices run on
  // threads of their own, last slice first. Small vocabularies stay one pass.
  void sliced_draws_are_the_draws_of_one_pass() {
    int task_calls = 0, tasks_run = 0;
    const Sampler::HostTasks tasks = [&](int n, const std::function<void(int)>& fn) {
      task_calls++;
      tasks_run += n;
      std::vector<std::thread> threads;
      for (int i = n - 1; i >= 0; i--) threads.emplace_back(fn, i);
      for (auto& t : threads) t.join();
    };
    std::mt19937 rng(17);
    for (int n : {262144, 40000, 32769, 1000}) {
      for (const char* shape : {"peaked", "flat", "ties", "nan"}) {
        std::vector<float> logits(n);
        std::normal_distribution<float> g(0.f, shape[0] == 'p' ? 4.f : 0.5f);
        for (auto& x : logits) x = shape[0] == 't' ? static_cast<float>(rng() % 8) : g(rng);
        if (shape[0] == 'p') logits[n - 3] += 12.f;  // a favourite in the last slice
        if (shape[0] == 'n')  // NaN and -inf here and there, also where a slice starts
          for (int i = 0; i < n; i += n / 7) logits[i] = i % 2 ? -std::numeric_limits<float>::infinity() : NAN;
        struct Rules {
          float t, top_p, min_p;
          int k;
        };
        for (const Rules r : {Rules{1.f, 1.f, 0.f, 0}, Rules{1.f, 0.95f, 0.f, 0}, Rules{0.7f, 0.5f, 0.f, 0},
                              Rules{0.8f, 0.95f, 0.05f, 40}, Rules{1.f, 1.f, 0.02f, 0}, Rules{1.f, 1.f, 0.f, 100}}) {
          SamplingParams p = plain(99);
          p.temperature = r.t, p.top_p = r.top_p, p.min_p = r.min_p, p.top_k = r.k;
          if (r.k == 100) {  // with a bias and penalties too
            p.logit_bias = {{5, 3.f}, {n - 1, -2.f}};
            p.repeat_penalty = 1.3f;
            p.presence_penalty = 0.5f;
          }
          const std::vector<int32_t> history = {5, 7, n - 1, 7};
          Sampler one(p, n), sliced(p, n);
          const int calls_before = task_calls;
          // The distributions themselves: bitwise the same list.
          {
            std::vector<float> a = logits, b = logits;
            Dist want, got;
            one.distribution(a.data(), history, &want);
            sliced.distribution(b.data(), history, &got, tasks);
            QVERIFY2(got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size() * sizeof(got[0])) == 0,
                     qPrintable(QString("n=%1 %2 t=%3 top_p=%4 min_p=%5 k=%6: distributions differ")
                                    .arg(n).arg(shape).arg(r.t).arg(r.top_p).arg(r.min_p).arg(r.k)));
          }
          for (int d = 0; d < 16; d++) {
            std::vector<float> a = logits, b = logits;
            const int32_t want = one.sample(a.data(), history);
            const int32_t got = sliced.sample(b.data(), history, tasks);
            QVERIFY2(got == want, qPrintable(QString("n=%1 %2 t=%3 top_p=%4 min_p=%5 k=%6 draw %7: %8 vs %9")
                                                 .arg(n).arg(shape).arg(r.t).arg(r.top_p).arg(r.min_p).arg(r.k).arg(d)
                                                 .arg(got).arg(want)));
          }
          if (n >= Sampler::kSliceMinVocab)
            QVERIFY(task_calls > calls_before);  // the passes did run in slices
          else
            QCOMPARE(task_calls, calls_before);
        }
      }
    }
    QCOMPARE(tasks_run, task_calls * Sampler::kVocabSlices);
  }

  // The vocabulary passes (vocab_passes.h), each build this CPU runs (the
  // baseline always; AVX2 and AVX-512 where present) against plain scalar
  // definitions: the maximum, the first position at or above a value, the
  // k largest and the candidates gathered in a band exactly; the softmax sums against double exp
  // (1e-6) and bitwise against the baseline build's, blocks, tail and
  // stored terms alike. Lengths around the 16-lane, 64-value and 1024-value
  // steps, NaN, -inf and +inf among the values, bands that hold none,
  // some, all; each stored term bitwise vocab::exp_nonpositive's.
  void vocab_passes_agree_in_every_build() {
    using vocab::Isa;
    const vocab::Passes* base = vocab::passes_for(Isa::baseline);
    QVERIFY(base);
    std::vector<const vocab::Passes*> builds = {base};
    for (Isa isa : {Isa::avx2, Isa::avx512})
      if (const vocab::Passes* p = vocab::passes_for(isa)) builds.push_back(p);
    QVERIFY(std::find(builds.begin(), builds.end(), &vocab::best_passes()) != builds.end());
    qInfo("vocabulary passes: %d builds here, %s chosen", static_cast<int>(builds.size()), vocab::best_passes().name);
    const float inf = std::numeric_limits<float>::infinity();
    std::mt19937 rng(23);
    std::normal_distribution<float> g(0.f, 3.f);
    for (int n : {0, 1, 15, 16, 17, 63, 64, 65, 1000, 1023, 1024, 1025, 2048, 5000, 70001}) {
      for (const char* shape : {"normal", "specials", "ties", "+inf"}) {
        std::vector<float> x(static_cast<size_t>(n));
        for (float& v : x) v = shape[0] == 't' ? static_cast<float>(rng() % 4) : g(rng);
        if (shape[0] == 's' && n > 0)
          for (int i = 0; i < n; i += 1 + static_cast<int>(rng() % 97)) x[i] = (i % 3 == 0) ? NAN : -inf;
        if (shape[0] == '+' && n > 0)  // +inf (twice, tied), NaN and -inf
          for (int i : {n / 3, n - 1, n / 2, n / 5}) x[i] = i == n / 2 ? NAN : i == n / 5 ? -inf : inf;
        const QString what = QString("n=%1 %2").arg(n).arg(shape);
        // The scalar definitions.
        float mx = -inf;
        for (float v : x) mx = v > mx ? v : mx;
        for (const vocab::Passes* p : builds) {
          const QString at = what + " " + p->name;
          const float got_mx = p->max_logit(x.data(), n);
          QVERIFY2(std::memcmp(&got_mx, &mx, sizeof mx) == 0, qPrintable(at + ": maximum"));
          for (float v : {mx, mx - 1.f, -inf, inf}) {
            int32_t want = -1;
            for (int i = 0; i < n && want < 0; i++)
              if (x[i] >= v) want = i;
            QVERIFY2(p->first_at_least(x.data(), n, v) == want, qPrintable(at + QString(": first >= %1").arg(v)));
          }
          for (int k : {0, 1, 5, 20, 64}) {  // the k largest, equal values in id order, no NaN
            std::vector<int> order;
            for (int i = 0; i < n; i++)
              if (x[i] == x[i]) order.push_back(i);
            std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return x[a] > x[b]; });
            order.resize(std::min(order.size(), static_cast<size_t>(k)));
            std::vector<std::pair<float, int32_t>> got(static_cast<size_t>(k));
            const int m = p->top_n(x.data(), n, k, got.data());
            QCOMPARE(m, static_cast<int>(order.size()));
            for (int j = 0; j < m; j++)
              QVERIFY2(got[j].second == order[j] && got[j].first == x[order[j]], qPrintable(at + QString(": top %1, place %2").arg(k).arg(j)));
          }
          for (float lo : {mx, mx - 2.f, mx - 6.f, -inf, inf})
            for (float hi : {inf, mx, mx - 1.f, mx - 3.f, -inf}) {
              vocab::Candidates want, got;
              for (int i = 0; i < n; i++)
                if (x[i] >= lo && (hi == inf || x[i] < hi)) want.emplace_back(x[i], 1000 + i);
              p->gather_band(x.data(), n, 1000, lo, hi, &got);
              QVERIFY2(got == want, qPrintable(at + QString(": gathered in [%1, %2)").arg(lo).arg(hi)));
            }
        }
        if (!std::isfinite(mx)) continue;  // (the sums take the maximum as given)
        // The softmax sums: double exp, then every build bitwise the baseline's.
        for (float inv_t : {1.f, 1.f / 0.7f}) {
          double want = 0;
          for (float v : x) want += v == v ? std::exp((static_cast<double>(v) - mx) * inv_t) : 0.0;
          struct Sums {
            std::vector<double> blocks;
            double tail = -1;
            std::vector<float> terms;
            vocab::Candidates cand;
          } ref;
          for (const vocab::Passes* p : builds) {
            const QString at = what + " " + p->name + QString(" 1/T=%1").arg(inv_t);
            Sums s;
            s.terms.assign(static_cast<size_t>(n), -1.f);
            p->sum_exp_stored(x.data(), n, mx, inv_t, s.terms.data(), &s.blocks, &s.tail);
            QCOMPARE(s.blocks.size(), static_cast<size_t>(n / vocab::kExpBlock));
            double sum = 0;
            for (double b : s.blocks) sum += b;
            sum += s.tail;
            if (inv_t == 1.f) {  // the sum alone: the same double
              const double alone = p->sum_exp(x.data(), n, mx);
              QVERIFY2(std::memcmp(&alone, &sum, sizeof sum) == 0, qPrintable(at + ": the sum alone"));
            }
            QVERIFY2(std::fabs(sum - want) <= 1e-6 * want, qPrintable(at + QString(": sum %1 against %2").arg(sum).arg(want)));
            for (int i = 0; i < n; i++) {  // each term: exp_nonpositive's bits (this file: no FMA contraction)
              const float e = vocab::exp_nonpositive((x[i] - mx) * inv_t);
              QVERIFY2(std::memcmp(&e, &s.terms[i], sizeof e) == 0, qPrintable(at + QString(": term %1").arg(i)));
            }
            Sums gathered;
            if (inv_t == 1.f) {
              p->sum_exp_gather(x.data(), n, 7, mx, mx - 2.f, &gathered.cand, &gathered.blocks, &gathered.tail);
              QVERIFY2(gathered.blocks == s.blocks && gathered.tail == s.tail, qPrintable(at + ": the gathering sum"));
              vocab::Candidates cand;
              p->gather_band(x.data(), n, 7, mx - 2.f, inf, &cand);
              QVERIFY2(gathered.cand == cand, qPrintable(at + ": the candidates gathered with the sum"));
              s.cand = gathered.cand;
            }
            if (p == base) {
              ref = s;
              continue;
            }
            QVERIFY2(s.blocks == ref.blocks && std::memcmp(&s.tail, &ref.tail, sizeof s.tail) == 0,
                     qPrintable(at + ": block sums differ from the baseline build's"));
            QVERIFY2(std::memcmp(s.terms.data(), ref.terms.data(), s.terms.size() * sizeof(float)) == 0,
                     qPrintable(at + ": stored terms differ from the baseline build's"));
            QVERIFY2(s.cand == ref.cand, qPrintable(at + ": candidates differ from the baseline build's"));
          }
        }
      }
    }
  }

  // Without truncation sample() draws from the exponentials directly (block
  // sums, then inside a block): the frequencies of its draws on a vocabulary
  // of 5000 (several blocks and a tail) match softmax(l / T).
  void untruncated_draws_follow_the_softmax() {
    std::mt19937 rng(3);
    std::normal_distribution<float> g(0.f, 1.f);
    std::vector<float> logits(5000);
    for (auto& x : logits) x = g(rng);
    // A few likely tokens in the last block and the tail, so every part is hit.
    logits[10] = logits[3000] = logits[4990] = 6.f;
    SamplingParams p = plain(11);
    p.temperature = 0.8f;
    const auto want = softmax(logits, 0.8);
    Sampler s(p, static_cast<int>(logits.size()));
    std::vector<double> counts(logits.size(), 0.0);
    const int draws = 200000;
    for (int i = 0; i < draws; i++) {
      std::vector<float> l = logits;
      counts[s.sample(l.data(), {})] += 1;
    }
    double chi2 = 0;
    int bins = 0;
    for (size_t i = 0; i < logits.size(); i++) {
      const double e = want[i] * draws;
      if (e < 5) continue;
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
      bins++;
    }
    // Mean bins - 1, sd sqrt(2 (bins - 1)): 6 standard deviations above is a failure.
    QVERIFY2(chi2 < bins - 1 + 6 * std::sqrt(2.0 * (bins - 1)), qPrintable(QString("chi2 %1 over %2 bins").arg(chi2).arg(bins)));
    QVERIFY(counts[10] > 0 && counts[3000] > 0 && counts[4990] > 0);
  }

  void draw_follows_the_distribution() {
    // draw() (speculative decoding's residual) on a given list.
    const Dist d = {{0.1f, 4}, {0.6f, 0}, {0.25f, 2}, {0.05f, 1}};
    const std::vector<double> want = {0.6, 0.05, 0.25, 0.0, 0.1};
    Sampler s(plain(61), 5);
    std::vector<int> counts(5, 0);
    for (int i = 0; i < kDraws; i++) counts.at(s.draw(d))++;
    CHECK_FREQUENCIES(counts, want);
    // uniform(): in [0, 1), mean 1/2.
    double sum = 0;
    for (int i = 0; i < kDraws; i++) {
      const double u = s.uniform();
      QVERIFY(u >= 0 && u < 1);
      sum += u;
    }
    QVERIFY(std::fabs(sum / kDraws - 0.5) < 5 * std::sqrt(1.0 / 12 / kDraws));
  }

  // llama.cpp's penalties, on each id that occurs count > 0 times in the last
  // penalty_last_n tokens: logit / repeat_penalty if positive, else
  // logit * repeat_penalty; then - count * frequency_penalty - presence_penalty.
  void penalties_data() {
    QTest::addColumn<float>("repeat");
    QTest::addColumn<float>("frequency");
    QTest::addColumn<float>("presence");
    QTest::addColumn<int>("last_n");
    QTest::newRow("repeat 1.3") << 1.3f << 0.f << 0.f << 64;
    QTest::newRow("repeat 0.8 (favours repeats)") << 0.8f << 0.f << 0.f << 64;
    QTest::newRow("frequency 0.4") << 1.f << 0.4f << 0.f << 64;
    QTest::newRow("presence 0.7") << 1.f << 0.f << 0.7f << 64;
    QTest::newRow("negative frequency and presence") << 1.f << -0.3f << -0.5f << 64;
    QTest::newRow("all three") << 1.5f << 0.25f << 0.6f << 64;
    QTest::newRow("all three, window 4") << 1.5f << 0.25f << 0.6f << 4;
    QTest::newRow("all three, window 1") << 1.5f << 0.25f << 0.6f << 1;
    QTest::newRow("window 0: off") << 1.5f << 0.25f << 0.6f << 0;
  }
  void penalties() {
    QFETCH(float, repeat);
    QFETCH(float, frequency);
    QFETCH(float, presence);
    QFETCH(int, last_n);
    // Positive, negative and zero logits among the repeated ids.
    const std::vector<float> logits = {2.5f, -1.25f, 0.f, 3.f, 0.75f, -2.f, 1.f, 0.5f};
    // Older than any window above 4: 6 (x2), 0. The last 4: 1, 3, 1, 2.
    // Ids outside the vocabulary are ignored.
    const std::vector<int32_t> history = {6, 0, 6, 99, -3, 1, 3, 1, 2};
    const size_t n = std::min(history.size(), static_cast<size_t>(last_n));
    std::vector<int> count(logits.size(), 0);
    for (size_t i = history.size() - n; i < history.size(); i++)
      if (history[i] >= 0 && history[i] < static_cast<int32_t>(logits.size())) count[history[i]]++;
    std::vector<float> want = logits;
    for (size_t id = 0; id < want.size(); id++) {
      if (!count[id]) continue;
      float& l = want[id];
      l = l > 0 ? l / repeat : l * repeat;
      l -= static_cast<float>(count[id]) * frequency + presence;
    }
    SamplingParams p = plain();
    p.temperature = 0.f;
    p.repeat_penalty = repeat;
    p.frequency_penalty = frequency;
    p.presence_penalty = presence;
    p.penalty_last_n = last_n;
    QVERIFY(p.validate());
    Sampler s(p, static_cast<int>(logits.size()));
    std::vector<float> got = logits;
    const int32_t id = s.sample(got.data(), history);
    for (size_t i = 0; i < want.size(); i++)
      QVERIFY2(std::fabs(got[i] - want[i]) <= 1e-6f * std::max(1.f, std::fabs(want[i])),
               qPrintable(QString("id %1 (count %2): logit %3, expected %4").arg(i).arg(count[i]).arg(got[i]).arg(want[i])));
    // Greedy picks from the penalized logits.
    QCOMPARE(id, argmax(want.data(), static_cast<int>(want.size())));
    // distribution() applies them the same way.
    got = logits;
    Dist d;
    s.distribution(got.data(), history, &d);
    for (size_t i = 0; i < want.size(); i++) QVERIFY(std::fabs(got[i] - want[i]) <= 1e-6f * std::max(1.f, std::fabs(want[i])));
    // No history: nothing changes.
    got = logits;
    s.sample(got.data(), {});
    QVERIFY(got == logits);
  }

  void penalties_steer_sampling() {
    // A strong presence penalty on the two likeliest ids: the draws follow
    // softmax of the penalized logits.
    SamplingParams p = plain(71);
    p.presence_penalty = 2.f;
    const std::vector<int32_t> history = {2, 7, 2};
    std::vector<float> penalized = kLogits;
    penalized[2] -= 2.f;
    penalized[7] -= 2.f;
    CHECK_FREQUENCIES(draw_counts(p, kLogits, kDraws, history), softmax(penalized, 1.0));
  }

  void seeds() {
    SamplingParams p = plain(1234);
    const std::vector<float> l(64, 0.f);  // uniform over 64 ids: every draw depends on the RNG
    auto sequence = [&](Sampler& s) {
      std::vector<int32_t> seq;
      for (int i = 0; i < 200; i++) {
        std::vector<float> c = l;
        seq.push_back(s.sample(c.data(), {}));
      }
      return seq;
    };
    Sampler a(p, 64), b(p, 64);
    const auto sa = sequence(a);
    QCOMPARE(sequence(b), sa);  // same seed, same sequence
    QVERIFY(std::set<int32_t>(sa.begin(), sa.end()).size() > 40);  // and it does vary
    a.reset(1234);
    QCOMPARE(sequence(a), sa);  // reset restarts it
    for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{1235}, ~uint64_t{0}}) {
      p.seed = seed;
      Sampler c(p, 64);
      const auto sc = sequence(c);
      QVERIFY2(sc != sa, qPrintable(QString("seed %1 gives seed 1234's sequence").arg(seed)));
      c.reset(1234);
      QCOMPARE(sequence(c), sa);  // the seed alone decides
    }
    Sampler zero(plain(0), 64), one(plain(1), 64);
    QVERIFY(sequence(zero) != sequence(one));
  }

  void validate_rejects_out_of_range() {
    QVERIFY(plain().validate());
    auto bad = [](auto change) {
      SamplingParams p = plain();
      change(p);
      return !p.validate();
    };
    QVERIFY(bad([](SamplingParams& p) { p.temperature = -0.1f; }));
    QVERIFY(bad([](SamplingParams& p) { p.temperature = NAN; }));
    QVERIFY(bad([](SamplingParams& p) { p.top_k = -1; }));
    QVERIFY(bad([](SamplingParams& p) { p.top_p = 0.f; }));
    QVERIFY(bad([](SamplingParams& p) { p.top_p = 1.01f; }));
    QVERIFY(bad([](SamplingParams& p) { p.min_p = 1.f; }));
    QVERIFY(bad([](SamplingParams& p) { p.min_p = -0.1f; }));
    QVERIFY(bad([](SamplingParams& p) { p.repeat_penalty = 0.f; }));
    QVERIFY(bad([](SamplingParams& p) { p.frequency_penalty = 11.f; }));
    QVERIFY(bad([](SamplingParams& p) { p.presence_penalty = -11.f; }));
    QVERIFY(bad([](SamplingParams& p) { p.penalty_last_n = -1; }));
    QVERIFY(bad([](SamplingParams& p) { p.logit_bias = {{3, 100.5f}}; }));
    QVERIFY(bad([](SamplingParams& p) { p.logit_bias = {{3, NAN}}; }));
    QVERIFY(bad([](SamplingParams& p) { p.logit_bias = {{-1, 1.f}}; }));
    SamplingParams in_vocab = plain();
    in_vocab.logit_bias = {{63, -100.f}, {0, 100.f}};
    QVERIFY(in_vocab.validate(64));
    in_vocab.logit_bias = {{64, 1.f}};
    QVERIFY(in_vocab.validate());  // no vocabulary given: the id is not checked
    QVERIFY(!in_vocab.validate(64));
    QVERIFY(in_vocab.validate(64).message().find("64") != std::string::npos);
  }

  // OpenAI's logit_bias: +100 all but forces a token, -100 all but bans it,
  // greedy or sampled, and it comes before the penalties.
  void logit_bias_plus_100_forces_and_minus_100_bans() {
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.f, 3.f);
    const int n = 512;
    std::vector<float> l(n);
    for (float& x : l) x = nd(rng);
    const int32_t top = argmax(l.data(), n);
    const int32_t other = (top + 17) % n;
    for (float temperature : {0.f, 1.f}) {
      SamplingParams p = plain(5);
      p.temperature = temperature;
      p.logit_bias = {{other, 100.f}};
      QVERIFY(!p.plain_greedy());  // a backend's argmax of the raw logits would miss the bias
      Sampler forced(p, n);
      for (int i = 0; i < 200; i++) {
        std::vector<float> c = l;
        QCOMPARE(forced.sample(c.data(), {}), other);
      }
      p.logit_bias = {{top, -100.f}};
      Sampler banned(p, n);
      for (int i = 0; i < 2000; i++) {
        std::vector<float> c = l;
        QVERIFY(banned.sample(c.data(), {}) != top);
      }
    }
    // The bias is added before the penalties: a repeat penalty of 2 divides
    // the biased (positive) logit, not the raw one.
    SamplingParams p = plain();
    p.temperature = 0.f;
    p.repeat_penalty = 2.f;
    p.logit_bias = {{1, 10.f}};
    std::vector<float> two = {3.f, -2.f};  // biased: 8 / 2 = 4 > 3
    QCOMPARE(Sampler(p, 2).sample(two.data(), {1}), 1);
    QCOMPARE(two[1], 4.f);
  }

  // token_logprobs against a reference that sorts the whole vocabulary and
  // computes the log-softmax in double: the same ids in the same order
  // (equal logits by id), the same values, at every top count.
  void token_logprobs_equal_a_sorted_log_softmax() {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 4.f);
    for (int n : {1, 7, 20, 21, 512, 50000}) {
      for (int trial = 0; trial < 6; trial++) {
        std::vector<float> l(n);
        for (float& x : l) x = nd(rng);
        if (trial % 2) for (float& x : l) x = std::round(x);  // many ties
        if (trial == 4) for (float& x : l) x += 1e4f;          // large logits must not overflow
        double mx = -INFINITY;
        for (float x : l) mx = std::max(mx, static_cast<double>(x));
        double sum = 0;
        for (float x : l) sum += std::exp(static_cast<double>(x) - mx);
        auto ref = [&](int i) { return static_cast<double>(l[i]) - mx - std::log(sum); };
        std::vector<int> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
        for (int k : {0, 1, 5, 20}) {
          const int32_t chosen = static_cast<int32_t>(rng() % n);
          TokenLogprob t;
          token_logprobs(l.data(), n, chosen, k, &t);
          QCOMPARE(t.id, chosen);
          QVERIFY2(std::fabs(t.logprob - ref(chosen)) < 2e-5 * (1 + std::fabs(ref(chosen))), qPrintable(QString::number(t.logprob)));
          QCOMPARE(t.top.size(), static_cast<size_t>(std::min(k, n)));
          double p_top = 0;
          for (size_t j = 0; j < t.top.size(); j++) {
            QCOMPARE(t.top[j].first, order[j]);
            QVERIFY(std::fabs(t.top[j].second - ref(order[j])) < 2e-5 * (1 + std::fabs(ref(order[j]))));
            if (j > 0) QVERIFY(t.top[j].second <= t.top[j - 1].second);
            p_top += std::exp(static_cast<double>(t.top[j].second));
          }
          QVERIFY(p_top <= 1.0 + 1e-5);
          if (k >= n) QVERIFY(std::fabs(p_top - 1.0) < 1e-5);  // the whole distribution sums to 1
        }
      }
    }
    // The top list reuses its capacity, and a count above the limit is the limit.
    std::vector<float> l(100, 0.f);
    TokenLogprob t;
    token_logprobs(l.data(), 100, 0, 50, &t);
    QCOMPARE(t.top.size(), static_cast<size_t>(kMaxTopLogprobs));
    QCOMPARE(t.top.front().first, 0);  // all equal: lowest ids first
    QCOMPARE(t.top.back().first, kMaxTopLogprobs - 1);
    QVERIFY(std::fabs(t.logprob + std::log(100.f)) < 1e-5);
    const auto* data = t.top.data();
    token_logprobs(l.data(), 100, 3, 5, &t);
    QCOMPARE(t.top.data(), data);
    QCOMPARE(t.top.size(), size_t{5});
    // An impossible token (a logit of minus infinity) has a log-probability of minus infinity.
    l[7] = -INFINITY;
    token_logprobs(l.data(), 100, 7, 0, &t);
    QVERIFY(std::isinf(t.logprob) && t.logprob < 0);
  }
};

QTEST_APPLESS_MAIN(TestSampler)
#include "test_sampler.moc"
