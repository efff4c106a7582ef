// Speculative decoding: greedy output identical to plain greedy (both draft
// sources, several k, both CPU backends), the KV cache rolled back correctly,
// a draft with another vocabulary refused, and the sampling-mode rejection
// scheme reproducing the target distribution (chi-squared, fixed seed).
#include <QtTest>

#include <cmath>
#include <map>

#include "phaselab/session.h"
#include "phaselab/speculative.h"
#include "tiny_model.h"

using namespace phaselab;
using namespace phaselab::testing;

namespace {

std::unique_ptr<Session> open(const std::string& path, bool fast, int n_ctx = 512) {
  auto m = Model::load(path);
  if (!m) qFatal("%s", m.status().message().c_str());
  auto b = fast ? make_cpu_backend(*m, 2, 64) : make_cpu_reference_backend(*m, 2, 64);
  auto s = Session::create(*m, std::move(*b), n_ctx);
  if (!s) qFatal("%s", s.status().message().c_str());
  return std::move(*s);
}

std::unique_ptr<DraftSource> draft_model(const std::string& path, const Model& target) {
  auto m = Model::load(path);
  if (!m) qFatal("%s", m.status().message().c_str());
  auto b = make_cpu_backend(*m, 1, 64);
  auto d = make_draft_model_source(*m, std::move(*b), 256, target);
  if (!d) qFatal("%s", d.status().message().c_str());
  return std::move(*d);
}

// A prompt that repeats itself, so that prompt lookup finds matches.
std::vector<int32_t> repetitive_prompt(const Tokenizer& tok) {
  return tok.encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
                    "Once upon a time, there was a little girl named Lily. She loved",
                    true, false);
}

double chi_squared_p_value(double chi2, int dof) {
  // Wilson-Hilferty approximation of the chi-squared upper tail.
  const double z = (std::cbrt(chi2 / dof) - (1 - 2.0 / (9 * dof))) / std::sqrt(2.0 / (9 * dof));
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

}  // namespace

class TestSpeculative : public QObject {
  Q_OBJECT
 private slots:
  void greedy_lookup_equals_plain_greedy_data() {
    QTest::addColumn<bool>("fast");
    QTest::addColumn<int>("k");
    for (bool fast : {true, false})
      for (int k : {1, 2, 4, 7})
        QTest::newRow(qPrintable(QString("%1/k=%2").arg(fast ? "fast" : "reference").arg(k))) << fast << k;
  }
  void greedy_lookup_equals_plain_greedy() {
    QFETCH(bool, fast);
    QFETCH(int, k);
    auto s = open(test_data("stories260K.gguf"), fast);
    const auto prompt = repetitive_prompt(s->model().tokenizer());
    auto plain = s->generate(prompt, greedy(60));
    QVERIFY(plain.is_ok());
    s->kv().clear();
    auto lookup = make_prompt_lookup_draft();
    GenerateOptions o = greedy(60);
    o.draft = lookup.get();
    o.spec_k = k;
    auto spec = s->generate(prompt, o);
    QVERIFY2(spec.is_ok(), spec.status().message().c_str());
    QCOMPARE(spec->tokens, plain->tokens);
    QCOMPARE(spec->text, plain->text);
    const RequestMetrics& m = spec->metrics;
    QVERIFY2(m.spec_accepted >= 5, qPrintable(QString("accepted %1 of %2").arg(m.spec_accepted).arg(m.spec_drafted)));
    QVERIFY(m.tokens_per_pass > 1.0);
    // The cache holds exactly the history minus the last token, so the next
    // turn can reuse it.
    std::vector<int32_t> history = prompt;
    history.insert(history.end(), spec->tokens.begin(), spec->tokens.end() - 1);
    QCOMPARE(s->kv().tokens(), history);
  }

  void greedy_draft_model_equals_plain_greedy_data() {
    QTest::addColumn<bool>("same_model");
    QTest::addColumn<int>("k");
    QTest::addColumn<bool>("fast");
    for (bool fast : {true, false})
      for (bool same : {true, false})
        for (int k : {1, 3, 5})
          QTest::newRow(qPrintable(QString("%1/%2/k=%3").arg(fast ? "fast" : "reference", same ? "same" : "other").arg(k)))
              << same << k << fast;
  }
  void greedy_draft_model_equals_plain_greedy() {
    QFETCH(bool, same_model);
    QFETCH(int, k);
    QFETCH(bool, fast);
    TinySpec target_spec;
    target_spec.arch = "qwen3";
    target_spec.matrix_type = TensorType::Q8_0;
    const std::string target = write_tiny_model(target_spec, "spec_target.gguf");
    TinySpec draft_spec = target_spec;
    draft_spec.seed = 99;  // same vocabulary, other weights: many rejections
    draft_spec.n_layer = 1;
    const std::string other = write_tiny_model(draft_spec, "spec_draft.gguf");
    auto s = open(target, fast, 256);
    const std::vector<int32_t> prompt = {1, 260, 261, 262, 263, 264};
    auto plain = s->generate(prompt, greedy(40));
    QVERIFY(plain.is_ok());
    auto draft = draft_model(same_model ? target : other, s->model());
    GenerateOptions o = greedy(40);
    o.draft = draft.get();
    o.spec_k = k;
    s->kv().clear();
    auto spec = s->generate(prompt, o);
    QVERIFY2(spec.is_ok(), spec.status().message().c_str());
    QCOMPARE(spec->tokens, plain->tokens);
    if (same_model) QCOMPARE(spec->metrics.spec_accepted, spec->metrics.spec_drafted);
    QVERIFY(spec->metrics.spec_drafted > 0);
  }

  // Sampling with a draft model that is the target itself: the draft's q
  // (kept per token through GenerateOptions::draw_dists) equals the target's
  // p, so every drafted token passes the rejection test. A draft whose
  // distributions were lost would be taken as one-hot and rejected often.
  void sampled_draft_model_equal_to_target_accepts_everything() {
    TinySpec spec;
    spec.arch = "qwen3";
    spec.matrix_type = TensorType::Q8_0;
    const std::string target = write_tiny_model(spec, "spec_sampled.gguf");
    auto s = open(target, true, 256);
    auto draft = draft_model(target, s->model());
    GenerateOptions o;
    o.n_predict = 40;
    o.ignore_eos = true;
    o.sampling.temperature = 1.0f;
    o.sampling.seed = 7;
    o.draft = draft.get();
    o.spec_k = 4;
    auto r = s->generate({1, 260, 261, 262, 263, 264}, o);
    QVERIFY2(r.is_ok(), r.status().message().c_str());
    QCOMPARE(static_cast<int>(r->tokens.size()), 40);
    QVERIFY(r->metrics.spec_drafted > 0);
    QCOMPARE(r->metrics.spec_accepted, r->metrics.spec_drafted);
  }

  void draft_with_another_vocabulary_is_refused() {
    auto target = Model::load(test_data("stories260K.gguf"));
    QVERIFY(target.is_ok());
    const std::string tiny = write_tiny_model(TinySpec{}, "spec_vocab.gguf");
    auto m = Model::load(tiny);
    QVERIFY(m.is_ok());
    auto b = make_cpu_backend(*m, 1, 16);
    auto d = make_draft_model_source(*m, std::move(*b), 64, **target);
    QVERIFY(!d.is_ok());
    QVERIFY(d.status().message().find("vocabulary") != std::string::npos);
  }

  // The rejection scheme on its own, with a draft distribution q far from
  // the target p: the accepted-or-resampled token must follow p.
  void rejection_sampling_keeps_the_target_distribution() {
    const TokenDist p = {{0.4f, 0}, {0.3f, 1}, {0.2f, 2}, {0.1f, 3}};
    const TokenDist q = {{0.1f, 0}, {0.1f, 1}, {0.2f, 2}, {0.6f, 3}};
    SamplingParams sp;
    sp.seed = 2024;
    Sampler rng(sp, 4);
    TokenDist scratch;
    std::map<int32_t, int> counts;
    const int n = 40000;
    for (int i = 0; i < n; i++) {
      const int32_t d = rng.draw(q);
      const int32_t r = speculative_accept_or_resample(p, q, d, rng, &scratch);
      counts[r < 0 ? d : r]++;
    }
    double chi2 = 0;
    for (const auto& [prob, id] : p) {
      const double e = prob * n;
      chi2 += (counts[id] - e) * (counts[id] - e) / e;
    }
    const double pv = chi_squared_p_value(chi2, 3);
    QVERIFY2(pv > 0.001, qPrintable(QString("chi2 %1, p %2").arg(chi2).arg(pv)));
    // One-hot drafts (prompt lookup) too.
    counts.clear();
    for (int i = 0; i < n; i++) {
      const int32_t r = speculative_accept_or_resample(p, {}, 3, rng, &scratch);
      counts[r < 0 ? 3 : r]++;
    }
    chi2 = 0;
    for (const auto& [prob, id] : p) {
      const double e = prob * n;
      chi2 += (counts[id] - e) * (counts[id] - e) / e;
    }
    QVERIFY2(chi_squared_p_value(chi2, 3) > 0.001, qPrintable(QString("one-hot chi2 %1").arg(chi2)));
  }

  // End to end on a tiny model: the second generated token's distribution
  // with speculation (a mismatched draft model) matches the target's exact
  // distribution given the first token.
  void speculative_sampling_matches_the_target_distribution() {
    TinySpec spec;
    spec.arch = "llama";
    const std::string target_path = write_tiny_model(spec, "spec_dist_target.gguf");
    TinySpec dspec = spec;
    dspec.seed = 5;
    dspec.n_layer = 1;
    const std::string draft_path = write_tiny_model(dspec, "spec_dist_draft.gguf");
    auto s = open(target_path, true, 64);
    auto draft = draft_model(draft_path, s->model());
    const std::vector<int32_t> prompt = {1, 260, 261};
    GenerateOptions o;
    o.n_predict = 2;
    o.ignore_eos = true;
    o.sampling.temperature = 1.0f;
    o.sampling.top_k = 6;
    o.sampling.top_p = 1.0f;
    o.sampling.min_p = 0.0f;
    o.draft = draft.get();
    o.spec_k = 2;
    // First token: fix it by sampling, then count the second given it.
    std::map<int32_t, std::map<int32_t, int>> pairs;
    for (int i = 0; i < 3000; i++) {
      o.sampling.seed = 1000 + i;
      auto r = s->generate(prompt, o);
      QVERIFY(r.is_ok());
      pairs[r->tokens[0]][r->tokens[1]]++;
    }
    // The most frequent first token.
    int32_t first = -1;
    int best = 0;
    for (const auto& [t, m] : pairs) {
      int c = 0;
      for (const auto& [u, n] : m) c += n;
      if (c > best) {
        best = c;
        first = t;
      }
    }
    QVERIFY(best > 300);
    // Exact target distribution of the second token.
    auto exact = open(target_path, true, 64);
    std::vector<int32_t> ctx = prompt;
    ctx.push_back(first);
    std::vector<float> logits;
    QVERIFY(exact->eval(ctx, &logits));
    Sampler chain(o.sampling, exact->model().config().n_vocab);
    TokenDist p;
    chain.distribution(logits.data(), ctx, &p);
    double chi2 = 0;
    int dof = -1;
    for (const auto& [prob, id] : p) {
      const double e = prob * best;
      if (e < 5) continue;
      chi2 += (pairs[first][id] - e) * (pairs[first][id] - e) / e;
      dof++;
    }
    QVERIFY(dof >= 2);
    const double pv = chi_squared_p_value(chi2, dof);
    QVERIFY2(pv > 0.001, qPrintable(QString("chi2 %1 dof %2 p %3").arg(chi2).arg(dof).arg(pv)));
  }
};

QTEST_APPLESS_MAIN(TestSpeculative)
#include "test_speculative.moc"
