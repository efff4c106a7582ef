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

// The second generated token's distribution with speculation through
// draft, against the target's exact distribution given the first token
// (the most frequent one): chi-squared over 3000 seeded generations.
void check_second_token_distribution(Session& s, const std::string& target_path, DraftSource* draft) {
  const std::vector<int32_t> prompt = {1, 260, 261};
  GenerateOptions o;
  o.n_predict = 2;
  o.ignore_eos = true;
  o.sampling.temperature = 1.0f;
  o.sampling.top_k = 6;
  o.sampling.top_p = 1.0f;
  o.sampling.min_p = 0.0f;
  o.draft = draft;
  o.spec_k = 2;
  // First token: fix it by sampling, then count the second given it.
  std::map<int32_t, std::map<int32_t, int>> pairs;
  for (int i = 0; i < 3000; i++) {
    o.sampling.seed = 1000 + i;
    auto r = s.generate(prompt, o);
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

  // Self-speculation: the target with layers skipped drafts on the
  // sequence's own cache. Greedy output equals plain greedy for every
  // family (gemma3 with a sliding window too: the rollback keeps the
  // window), both CPU backends, several k and skips, with the short
  // vocabulary list (short_list 40 of a 279-token vocabulary) and without.
  // After it, the cache holds the history and the prefix cache gives a
  // plain rerun the same tokens: the draft published no block of its
  // approximate K/V.
  void greedy_self_draft_equals_plain_greedy_data() {
    QTest::addColumn<QString>("arch");
    QTest::addColumn<bool>("fast");
    QTest::addColumn<int>("k");
    QTest::addColumn<QString>("skip");
    QTest::addColumn<int>("short_list");
    for (const char* arch : {"llama", "qwen3", "gemma3"})
      for (bool fast : {true, false})
        for (auto [k, skip, list] : {std::tuple{1, "1", 40}, std::tuple{3, "0,2", 40}, std::tuple{6, "1-2", 16384},
                                     std::tuple{4, "2", 40}})
          QTest::newRow(qPrintable(QString("%1/%2/k=%3/skip %4/list %5")
                                       .arg(arch, fast ? "fast" : "reference")
                                       .arg(k)
                                       .arg(skip)
                                       .arg(list)))
              << QString(arch) << fast << k << QString(skip) << list;
  }
  void greedy_self_draft_equals_plain_greedy() {
    QFETCH(QString, arch);
    QFETCH(bool, fast);
    QFETCH(int, k);
    QFETCH(QString, skip);
    QFETCH(int, short_list);
    TinySpec spec;
    spec.arch = arch.toStdString();
    spec.matrix_type = TensorType::Q8_0;
    spec.n_layer = 4;
    if (arch == "gemma3") spec.sliding_window = 24;  // shorter than the answer: the window moves on
    const std::string path = write_tiny_model(spec, "spec_self_" + spec.arch + ".gguf");
    auto s = open(path, fast, 256);
    const std::vector<int32_t> prompt = {1, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270, 271, 272};
    auto plain = s->generate(prompt, greedy(70));
    QVERIFY(plain.is_ok());
    auto mask = parse_layer_skip(skip.toStdString(), spec.n_layer);
    QVERIFY2(mask.is_ok(), mask.status().message().c_str());
    auto self = make_self_draft(s->shared_model(), SelfDraftOptions{*mask, short_list});
    QVERIFY2(self.is_ok(), self.status().message().c_str());
    GenerateOptions o = greedy(70);
    o.draft = self->get();
    o.spec_k = k;
    s->kv().clear();
    auto spec_run = s->generate(prompt, o);
    QVERIFY2(spec_run.is_ok(), spec_run.status().message().c_str());
    QCOMPARE(spec_run->tokens, plain->tokens);
    const RequestMetrics& m = spec_run->metrics;
    QVERIFY(m.spec_drafted > 0);
    QVERIFY2(m.spec_accepted > 0, qPrintable(QString("accepted %1 of %2").arg(m.spec_accepted).arg(m.spec_drafted)));
    // The cache holds the history (the last token too when a verification
    // computed it), nothing the draft wrote.
    std::vector<int32_t> history = prompt;
    history.insert(history.end(), spec_run->tokens.begin(), spec_run->tokens.end());
    const std::vector<int32_t>& held = s->kv().tokens();
    QVERIFY(held.size() + 1 >= history.size() && held.size() <= history.size());
    QVERIFY(std::equal(held.begin(), held.end(), history.begin()));
    // A plain rerun through the prefix cache: the blocks it finds are the
    // full model's.
    s->kv().clear();
    auto again = s->generate(prompt, greedy(70));
    QVERIFY(again.is_ok());
    QCOMPARE(again->tokens, plain->tokens);
  }

  // stories260K (a real model: 512 tokens, so no short list), and the
  // draft that skips nothing but the list: every drafted token accepted.
  void greedy_self_draft_on_a_real_model() {
    auto s = open(test_data("stories260K.gguf"), true);
    const auto prompt = repetitive_prompt(s->model().tokenizer());
    auto plain = s->generate(prompt, greedy(60));
    QVERIFY(plain.is_ok());
    const int L = s->model().config().n_layer;
    auto mask = parse_layer_skip(default_self_skip(L), L);
    QVERIFY2(mask.is_ok(), mask.status().message().c_str());
    auto self = make_self_draft(s->shared_model(), SelfDraftOptions{*mask});
    QVERIFY(self.is_ok());
    GenerateOptions o = greedy(60);
    o.draft = self->get();
    o.spec_k = 4;
    s->kv().clear();
    auto r = s->generate(prompt, o);
    QVERIFY2(r.is_ok(), r.status().message().c_str());
    QCOMPARE(r->tokens, plain->tokens);
    QVERIFY(r->metrics.spec_accepted > 0);
    // Nothing skipped: the draft is the model, every token accepted.
    auto all = make_self_draft(s->shared_model(), SelfDraftOptions{std::vector<uint8_t>(static_cast<size_t>(L), 0)});
    QVERIFY(all.is_ok());
    o.draft = all->get();
    s->kv().clear();
    auto full = s->generate(prompt, o);
    QVERIFY(full.is_ok());
    QCOMPARE(full->tokens, plain->tokens);
    QCOMPARE(full->metrics.spec_accepted, full->metrics.spec_drafted);
    QVERIFY(full->metrics.tokens_per_pass > 4.0);
  }

  // One proposal, called as the engine loop calls it, across a block
  // boundary: the cache is rolled back to the context, and no block that
  // the draft completed is published (its K/V at the drafted positions are
  // the skipped model's; a later prompt with the same tokens must not get
  // them from the prefix cache).
  void self_draft_rolls_back_and_publishes_nothing() {
    auto s = open(test_data("stories260K.gguf"), true);
    const int B = KvPool::kBlockTokens;
    std::vector<int32_t> context = repetitive_prompt(s->model().tokenizer());
    context.resize(B - 1);
    auto first = s->generate(context, greedy(1));  // the cache holds the B - 1 context tokens
    QVERIFY(first.is_ok());
    QCOMPARE(s->kv().n_past(), B - 1);
    context.push_back(first->tokens[0]);
    auto published = [&] {
      int n = 0;
      for (int b = 0; b < s->kv().pool().n_blocks(); b++) n += s->kv().pool().published(b) ? 1 : 0;
      return n;
    };
    const int before = published();
    const int L = s->model().config().n_layer;
    auto self = make_self_draft(s->shared_model(), SelfDraftOptions{*parse_layer_skip("0", L)});
    QVERIFY(self.is_ok());
    Draft d;
    const Status st = (*self)->propose_on_target(s->backend(), s->kv(), context, 5, greedy(1).sampling, &d);
    QVERIFY2(st.is_ok(), st.message().c_str());
    QCOMPARE(static_cast<int>(d.tokens.size()), 5);
    QCOMPARE(s->kv().n_past(), B - 1);
    QCOMPARE(s->kv().tokens(), std::vector<int32_t>(context.begin(), context.end() - 1));
    QCOMPARE(published(), before);
    QVERIFY(s->kv().prefix_cache());  // restored
    // Through propose (no backend, no cache) it says what it needs.
    QVERIFY(!(*self)->propose(context, 5, greedy(1).sampling, &d).is_ok());
  }

  // --spec-skip auto: every single inner layer tried, then grown; the
  // choice is one of the trials and the fastest of them.
  void self_skip_calibration_measures_and_chooses() {
    auto s = open(test_data("stories260K.gguf"), true);
    const int L = s->model().config().n_layer;
    const auto prompt = self_skip_calibration_prompt(s->model());
    QVERIFY(prompt.size() > 5);
    auto choice = calibrate_self_skip(*s, prompt, 3, 16);
    QVERIFY2(choice.is_ok(), choice.status().message().c_str());
    QVERIFY(choice->plain_tokens_per_s > 0);
    QVERIFY(static_cast<int>(choice->trials.size()) >= L - 2);
    const std::string chosen = layer_skip_to_string(choice->skip);
    double best = 0;
    bool found = false;
    for (const auto& t : choice->trials) {
      QVERIFY2(parse_layer_skip(t.skip, L).is_ok(), t.skip.c_str());
      QVERIFY(t.tokens_per_s > 0 && t.tokens_per_pass >= 1.0);
      best = std::max(best, t.tokens_per_s);
      found = found || t.skip == chosen;
    }
    QVERIFY2(found, chosen.c_str());
    for (const auto& t : choice->trials)
      if (t.skip == chosen) QCOMPARE(t.tokens_per_s, best);
    QCOMPARE(choice->trials.front().skip, std::string("1"));  // the first and last layers are kept
  }

  void layer_skips_parse_and_refuse() {
    auto a = parse_layer_skip("3,5,9-11", 18);
    QVERIFY(a.is_ok());
    QCOMPARE(std::count(a->begin(), a->end(), uint8_t{1}), 5);
    QCOMPARE(layer_skip_to_string(*a), std::string("3,5,9-11"));
    QCOMPARE(layer_skip_to_string(*parse_layer_skip("4-4,5", 18)), std::string("4-5"));
    QCOMPARE(default_self_skip(18), std::string("8"));
    QVERIFY(parse_layer_skip(default_self_skip(2), 2).is_ok());
    QVERIFY(parse_layer_skip(default_self_skip(1), 1).is_ok() == false);  // one layer: nothing to skip
    for (const char* bad : {"", "x", "3-", "-3", "5-3", "18", "0-17", "1,,2", "1;2", " 1"}) {
      auto r = parse_layer_skip(bad, 18);
      QVERIFY2(!r.is_ok(), bad);
      QVERIFY2(r.status().message().find("--spec-skip") != std::string::npos, r.status().message().c_str());
    }
  }

  // Sampling with the self draft (a layer skipped, a short list, so q
  // differs from p and covers part of the vocabulary): the second token's
  // distribution is the target's.
  void self_draft_sampling_matches_the_target_distribution() {
    TinySpec spec;
    spec.arch = "llama";
    const std::string target_path = write_tiny_model(spec, "spec_self_dist.gguf");
    auto s = open(target_path, true, 64);
    auto self = make_self_draft(s->shared_model(), SelfDraftOptions{{0, 1, 0}, 40});
    QVERIFY(self.is_ok());
    check_second_token_distribution(*s, target_path, self->get());
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
    check_second_token_distribution(*s, target_path, draft.get());
  }
};

QTEST_APPLESS_MAIN(TestSpeculative)
#include "test_speculative.moc"
