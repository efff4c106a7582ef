// Perplexity and KL divergence (phaselab/perplexity.h, phaselab-cli
// perplexity): the figure against one computed here from the reference
// backend's logits in double, the KL base round trip, refusal of mismatched
// and corrupt base files, and the CLI's --json contract.
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>

#include <cmath>
#include <fstream>

#include "phaselab/perplexity.h"
#include "reference/reference_models.h"
#include "tiny_model.h"

using namespace phaselab;
using namespace phaselab::testing;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The start of the bundled evaluation text: enough for several chunks of 64
// tokens with stories260K's 512-token vocabulary.
std::string eval_text(size_t bytes) {
  return read_file(std::string(PHASELAB_TEST_DATA) + "/../../resources/text/eval-en.txt").substr(0, bytes);
}

std::unique_ptr<Session> session(std::shared_ptr<Model> m, bool reference, int n_ctx, int batch = 64,
                                 KvType kv_type = KvType::f16) {
  auto b = reference ? make_cpu_reference_backend(m, 2, batch) : make_cpu_backend(m, 2, batch);
  if (!b) qFatal("%s", b.status().message().c_str());
  auto s = Session::create(m, std::move(*b), n_ctx, kv_type);
  if (!s) qFatal("%s", s.status().message().c_str());
  return std::move(*s);
}

struct Reference {
  double ppl = 0, ppl_err = 0;
  int64_t n = 0;
};

// llama-perplexity's definition, written out plainly: chunk c is tokens
// [c*n_ctx, (c+1)*n_ctx) with BOS first, the logits of every position from
// one forward pass, log-softmax in double, tokens n_ctx/2 + 1 .. n_ctx - 1 scored.
Reference reference_ppl(const Model& m, Backend& be, const std::vector<int32_t>& tokens, int n_ctx) {
  const int n_vocab = m.config().n_vocab;
  auto kv = KvCache::create(m.config(), n_ctx);
  if (!kv) qFatal("kv");
  std::vector<float> logits(static_cast<size_t>(n_ctx) * n_vocab);
  double sum = 0, sum2 = 0;
  int64_t n = 0;
  for (size_t c = 0; c + 1 <= tokens.size() / n_ctx; c++) {
    (*kv)->clear();
    std::vector<int32_t> chunk(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx);
    if (m.tokenizer().add_bos()) chunk[0] = m.tokenizer().bos();
    for (int p = 0; p < n_ctx; p += be.max_batch()) {
      const int nt = std::min(be.max_batch(), n_ctx - p);
      if (!be.forward(chunk.data() + p, nt, **kv, logits.data() + static_cast<size_t>(p) * n_vocab, LogitsMode::all))
        qFatal("forward");
    }
    for (int pos = n_ctx / 2; pos < n_ctx - 1; pos++) {
      const float* z = logits.data() + static_cast<size_t>(pos) * n_vocab;
      double mx = z[0];
      for (int i = 1; i < n_vocab; i++) mx = std::max(mx, static_cast<double>(z[i]));
      double se = 0;
      for (int i = 0; i < n_vocab; i++) se += std::exp(z[i] - mx);
      const double v = -(z[chunk[pos + 1]] - mx - std::log(se));
      sum += v, sum2 += v * v, n++;
    }
  }
  Reference r;
  r.n = n;
  const double mean = sum / n;
  r.ppl = std::exp(mean);
  r.ppl_err = r.ppl * std::sqrt((sum2 / n - mean * mean) / (n - 1));
  return r;
}

struct Run {
  int code = -1;
  QString out, err;
};

Run cli(const QStringList& args) {
  QProcess p;
  p.start(PHASELAB_CLI_PATH, args);
  if (!p.waitForStarted()) qFatal("cannot start phaselab-cli");
  p.closeWriteChannel();
  if (!p.waitForFinished(600000)) qFatal("phaselab-cli did not finish");
  return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1, QString::fromUtf8(p.readAllStandardOutput()),
          QString::fromUtf8(p.readAllStandardError())};
}

}  // namespace

class TestPerplexity : public QObject {
  Q_OBJECT
  std::shared_ptr<Model> stories_;
  std::vector<int32_t> tokens_;

 private slots:
  void initTestCase() {
    auto m = Model::load(test_data("stories260K.gguf"));
    QVERIFY2(m, m.status().message().c_str());
    stories_ = *m;
    tokens_ = perplexity_tokenize(stories_->tokenizer(), eval_text(3000));
    QVERIFY(tokens_.size() >= 5 * 64);
    QCOMPARE(tokens_[0], stories_->tokenizer().bos());
  }

  void tokenize_matches_encode_with_bos() {
    const std::string t = "Alice was beginning to get very tired.";
    QCOMPARE(perplexity_tokenize(stories_->tokenizer(), t), stories_->tokenizer().encode(t, true, false));
  }

  void ppl_equals_independent_reference() {
    auto s = session(stories_, true, 64);
    const Reference ref = reference_ppl(*stories_, s->backend(), tokens_, 64);
    PerplexityOptions o;
    o.n_ctx = 64;
    int calls = 0;
    auto r = run_perplexity(*s, tokens_, o, [&](const PerplexityProgress&) { calls++; });
    QVERIFY2(r, r.status().message().c_str());
    QCOMPARE(r->n_chunks, static_cast<int>(tokens_.size() / 64));
    QCOMPARE(r->n_scored, ref.n);
    QCOMPARE(r->n_scored, static_cast<int64_t>(r->n_chunks) * 31);
    QCOMPARE(r->n_evaluated, static_cast<int64_t>(r->n_chunks) * 64);
    QCOMPARE(calls, r->n_chunks);  // one forward pass per chunk at batch 64
    QVERIFY2(std::fabs(r->ppl / ref.ppl - 1) < 1e-5, qPrintable(QString("%1 vs %2").arg(r->ppl).arg(ref.ppl)));
    QVERIFY(std::fabs(r->ppl_err / ref.ppl_err - 1) < 1e-4);
    QVERIFY(r->ppl > 1 && r->ppl < 512);
    QCOMPARE(s->kv().n_past(), 0);  // the session's cache is left empty

    // Smaller batches and fewer chunks: the same numbers (batched prefill is exact).
    auto s16 = session(stories_, true, 64, 16);
    auto r16 = run_perplexity(*s16, tokens_, o);
    QVERIFY(r16);
    QCOMPARE(r16->ppl, r->ppl);
    o.n_chunks = 2;
    auto r2 = run_perplexity(*s, tokens_, o);
    QVERIFY(r2);
    QCOMPARE(r2->n_chunks, 2);
    QCOMPARE(r2->n_scored, int64_t{62});
  }

  void ppl_of_tiny_models_equals_reference() {
    for (const char* arch : {"llama", "qwen2", "qwen3", "qwen3moe", "mixtral", "gemma2", "gemma3", "phi3"}) {
      const std::string path = write_tiny_model(tiny_spec(arch), std::string("ppl-tiny-") + arch + ".gguf");
      auto m = Model::load(path);
      QVERIFY2(m, m.status().message().c_str());
      std::vector<int32_t> toks = perplexity_tokenize((*m)->tokenizer(), eval_text(600));
      QVERIFY(toks.size() >= 64);
      auto s = session(*m, true, 32);
      const Reference ref = reference_ppl(**m, s->backend(), toks, 32);
      PerplexityOptions o;
      o.n_ctx = 32;
      auto r = run_perplexity(*s, toks, o);
      QVERIFY2(r, r.status().message().c_str());
      QVERIFY2(std::fabs(r->ppl / ref.ppl - 1) < 1e-5, arch);
    }
  }

  void too_short_text_refused() {
    auto s = session(stories_, true, 64);
    PerplexityOptions o;
    o.n_ctx = 64;
    std::vector<int32_t> few(tokens_.begin(), tokens_.begin() + 100);
    auto r = run_perplexity(*s, few, o);
    QVERIFY(!r);
    QVERIFY2(r.status().message().find("at least 128") != std::string::npos, r.status().message().c_str());
    o.n_ctx = 128;  // more than the session holds
    QVERIFY(!run_perplexity(*s, tokens_, o));
  }

  void cancel_stops_the_run() {
    auto s = session(stories_, true, 64, 16);
    std::atomic<bool> stop{false};
    PerplexityOptions o;
    o.n_ctx = 64;
    auto r = run_perplexity(*s, tokens_, o, [&](const PerplexityProgress& p) { if (p.tokens_done >= 32) stop = true; }, &stop);
    QVERIFY(!r);
    QCOMPARE(r.status().code(), StatusCode::cancelled);
  }

  void kl_base_round_trip() {
    QTemporaryDir dir;
    const std::string path = dir.filePath("base.plkl").toStdString();
    auto ref = session(stories_, true, 64, 64, KvType::f32);
    PerplexityOptions o;
    o.n_ctx = 64;
    KlBase base;
    o.save_base = &base;
    o.save_top_k = 16;
    auto r0 = run_perplexity(*ref, tokens_, o);
    QVERIFY(r0);
    base.label = "stories260K (cpu-reference)";
    QCOMPARE(base.n_positions(), r0->n_scored);
    QVERIFY(base.save(path));
    auto loaded = KlBase::load(path);
    QVERIFY2(loaded, loaded.status().message().c_str());
    QCOMPARE(loaded->tokens, base.tokens);
    QCOMPARE(loaded->top_ids, base.top_ids);
    QCOMPARE(loaded->top_logp, base.top_logp);
    QCOMPARE(loaded->target_logp, base.target_logp);
    QCOMPARE(loaded->label, base.label);
    QCOMPARE(loaded->top_k, 16);
    // The stored top-k is the reference's: most likely first, argmax first.
    QVERIFY(base.top_logp[0] >= base.top_logp[1]);

    // Against itself: exactly no divergence.
    PerplexityOptions c;
    c.n_ctx = 64;
    c.kl_base = &*loaded;
    auto self = run_perplexity(*ref, tokens_, c);
    QVERIFY2(self, self.status().message().c_str());
    QVERIFY(self->kl);
    QCOMPARE(self->kl->kld, 0.0);
    QCOMPARE(self->kl->kld_max, 0.0);
    QCOMPARE(self->kl->top1_agree, 1.0);
    QCOMPARE(self->kl->rms_dp, 0.0);
    QVERIFY(std::fabs(self->kl->ppl_base / r0->ppl - 1) < 1e-6);
    QCOMPARE(self->kl->base_label, base.label);

    // stories260K's weights are F32: the fast backend multiplies them in
    // float too, so with an F32 cache it differs from the reference only by
    // summation order (an F16 cache would round K/V that differ by an ulp
    // to different halves now and then).
    auto fast = session(stories_, false, 64, 64, KvType::f32);
    auto fr = run_perplexity(*fast, tokens_, c);
    QVERIFY(fr && fr->kl);
    QVERIFY(fr->kl->kld < 1e-8);
    QVERIFY(std::fabs(fr->ppl / r0->ppl - 1) < 1e-5);

    // Fewer chunks than the base holds compares a prefix.
    c.n_chunks = 2;
    auto two = run_perplexity(*fast, tokens_, c);
    QVERIFY(two && two->kl);
    QCOMPARE(two->n_scored, int64_t{62});
  }

  // Quantized weights: the fast backend's 8-bit activations move the
  // distributions a little away from the reference's (F32 activations).
  void kl_fast_vs_reference_small_but_positive() {
    for (TensorType t : {TensorType::Q8_0, TensorType::Q4_0}) {
      TinySpec spec = tiny_spec("llama");
      spec.matrix_type = t;
      spec.n_ctx_train = 512;
      const std::string path = write_tiny_model(spec, "ppl-kl-tiny.gguf");
      auto m = Model::load(path);
      QVERIFY2(m, m.status().message().c_str());
      const std::vector<int32_t> toks = perplexity_tokenize((*m)->tokenizer(), eval_text(3000));
      auto ref = session(*m, true, 128);
      auto fast = session(*m, false, 128);
      PerplexityOptions o;
      o.n_ctx = 128;
      KlBase base;
      o.save_base = &base;
      auto r0 = run_perplexity(*ref, toks, o);
      QVERIFY(r0);
      PerplexityOptions c;
      c.n_ctx = 128;
      c.kl_base = &base;
      auto fr = run_perplexity(*fast, toks, c);
      QVERIFY(fr && fr->kl);
      const KlStats& k = *fr->kl;
      qInfo("%s, fast vs reference: kld %.3g (p99 %.3g), top-1 %.4f, rms dp %.4f %%, ppl %.4f vs %.4f",
            std::string(tensor_type_name(t)).c_str(), k.kld, k.kld_p99, k.top1_agree, k.rms_dp, fr->ppl, r0->ppl);
      QVERIFY(k.kld > 1e-7 && k.kld < 0.01);
      QVERIFY(k.kld_p99 >= k.kld_median && k.kld_max >= k.kld_p99);
      QVERIFY(k.top1_agree > 0.9 && k.top1_agree <= 1);
      QVERIFY(k.rms_dp > 0 && k.rms_dp < 2);
      QVERIFY(std::fabs(fr->ppl / r0->ppl - 1) < 0.01);
      QVERIFY(std::fabs(k.ppl_base / r0->ppl - 1) < 1e-6);
    }
  }

  // The sampled acceptance of a draft, sum min(p, q): its two bounds hold
  // the exact value (a base keeping the whole vocabulary gives it: both
  // bounds meet), and Pinsker's inequality ties it to the KL divergence
  // (1 - accept = TV <= sqrt(KL / 2) per position, and by Jensen for the
  // means). Two tiny models with the same vocabulary and different weights.
  void sampled_acceptance_bounds_hold_the_exact_value() {
    TinySpec a = tiny_spec("llama");
    a.n_ctx_train = 512;
    TinySpec b = a;
    b.seed = 7;
    auto ma = Model::load(write_tiny_model(a, "accept-a.gguf"));
    auto mb = Model::load(write_tiny_model(b, "accept-b.gguf"));
    QVERIFY(ma && mb);
    const int n_vocab = (*ma)->config().n_vocab;
    QVERIFY(n_vocab <= KlBase::kMaxTopK);
    const std::vector<int32_t> toks = perplexity_tokenize((*ma)->tokenizer(), eval_text(3000));
    auto sa = session(*ma, true, 128);
    auto sb = session(*mb, true, 128);
    auto stats_against = [&](int top_k) {
      PerplexityOptions o;
      o.n_ctx = 128;
      KlBase base;
      o.save_base = &base;
      o.save_top_k = top_k;
      if (!run_perplexity(*sa, toks, o)) qFatal("base run failed");
      PerplexityOptions c;
      c.n_ctx = 128;
      c.kl_base = &base;
      auto self = run_perplexity(*sa, toks, c);
      auto other = run_perplexity(*sb, toks, c);
      if (!self || !other || !self->kl || !other->kl) qFatal("comparison failed");
      return std::make_pair(*self->kl, *other->kl);
    };
    const auto [self_all, all] = stats_against(n_vocab);
    const auto [self_top4, top4] = stats_against(4);
    qInfo("other weights: kld %.4f, top-1 %.4f, sampled acceptance %.4f (whole vocabulary), %.4f-%.4f (top 4)", all.kld,
          all.top1_agree, all.accept_sampled, top4.accept_sampled, top4.accept_sampled_hi);
    // Against itself every drafted token is kept.
    QVERIFY(std::fabs(self_all.accept_sampled - 1) < 1e-5 && std::fabs(self_all.accept_sampled_hi - 1) < 1e-5);
    QVERIFY(std::fabs(self_top4.accept_sampled_hi - 1) < 1e-5);
    QVERIFY(self_top4.accept_sampled < 1 - 1e-3);  // the top 4 alone miss the tail
    // Whole vocabulary: the bounds meet at the exact value.
    QVERIFY(std::fabs(all.accept_sampled - all.accept_sampled_hi) < 1e-6);
    QVERIFY(all.accept_sampled > 0.05 && all.accept_sampled < 0.999);
    // Top 4: a lower and an upper bound of it.
    QVERIFY(top4.accept_sampled <= all.accept_sampled + 1e-9);
    QVERIFY(top4.accept_sampled_hi >= all.accept_sampled - 1e-9);
    QVERIFY(top4.accept_sampled < top4.accept_sampled_hi);
    // Pinsker (the KL over the whole vocabulary is exact here too).
    QVERIFY2(1 - all.accept_sampled <= std::sqrt(all.kld / 2) + 1e-6,
             qPrintable(QStringLiteral("TV %1, KL %2").arg(1 - all.accept_sampled).arg(all.kld)));
  }

  void mismatched_base_refused() {
    auto ref = session(stories_, true, 64);
    PerplexityOptions o;
    o.n_ctx = 64;
    KlBase base;
    o.save_base = &base;
    QVERIFY(run_perplexity(*ref, tokens_, o));

    auto expect_refused = [&](const PerplexityOptions& c, const std::vector<int32_t>& toks, const char* needle) {
      auto r = run_perplexity(*ref, toks, c);
      QVERIFY(!r);
      QCOMPARE(r.status().code(), StatusCode::invalid_argument);
      QVERIFY2(r.status().message().find(needle) != std::string::npos, r.status().message().c_str());
    };
    PerplexityOptions c;
    c.kl_base = &base;
    c.n_ctx = 32;
    expect_refused(c, tokens_, "context of 64");
    c.n_ctx = 64;
    std::vector<int32_t> other = tokens_;
    other[100] = (other[100] + 1) % stories_->config().n_vocab;
    expect_refused(c, other, "other tokens");
    c.n_chunks = base.n_chunks + 1;
    std::vector<int32_t> longer = tokens_;
    longer.insert(longer.end(), tokens_.begin(), tokens_.end());
    expect_refused(c, longer, "holds");
    c.n_chunks = -1;
    KlBase wrong_vocab = base;
    wrong_vocab.n_vocab = 1000;
    c.kl_base = &wrong_vocab;
    expect_refused(c, tokens_, "vocabulary");
  }

  void corrupt_base_refused() {
    auto ref = session(stories_, true, 64);
    PerplexityOptions o;
    o.n_ctx = 64;
    o.n_chunks = 2;
    o.save_top_k = 4;
    KlBase base;
    o.save_base = &base;
    QVERIFY(run_perplexity(*ref, tokens_, o));
    QTemporaryDir dir;
    const std::string path = dir.filePath("b").toStdString();
    QVERIFY(base.save(path));
    const std::string good = read_file(path);
    QVERIFY(KlBase::parse(good));
    const size_t header = 8 + 4 + 16 + 4 + 4;  // magic, version, 4 sizes, bos, label length (empty label)
    const size_t rec0 = header + base.tokens.size() * 4;

    auto refused = [](const std::string& bytes, const char* needle) {
      auto r = KlBase::parse(bytes);
      QVERIFY(!r);
      QCOMPARE(r.status().code(), StatusCode::invalid_file);
      QVERIFY2(r.status().message().find(needle) != std::string::npos, r.status().message().c_str());
    };
    auto patched = [&](size_t off, const void* v, size_t n) {
      std::string b = good;
      std::memcpy(b.data() + off, v, n);
      return b;
    };
    refused(good.substr(0, good.size() - 1), "promises");
    refused(good + "x", "promises");
    refused(good.substr(0, 10), "truncated");
    refused("", "magic");
    refused(patched(0, "XXXXXXXX", 8), "magic");
    const uint32_t v2 = 2, huge = 0xffffffffu, zero = 0;
    refused(patched(8, &v2, 4), "version");
    refused(patched(12, &zero, 4), "n_ctx");
    refused(patched(16, &huge, 4), "n_vocab");
    refused(patched(20, &huge, 4), "top_k");
    const uint32_t many_chunks = 1u << 23;  // sizes that would need gigabytes: refused before allocating
    refused(patched(24, &many_chunks, 4), "promises");
    refused(patched(header - 4, &huge, 4), "label");
    const int32_t bad_token = 9999, bad_id = -5;
    refused(patched(header + 8, &bad_token, 4), "token 9999");
    const float nan = std::nanf(""), positive = 0.5f;
    refused(patched(rec0, &nan, 4), "next token");
    refused(patched(rec0 + 4, &bad_id, 4), "token id -5");
    const int32_t dup = base.top_ids[0];
    refused(patched(rec0 + 8, &dup, 4), "repeats");
    refused(patched(rec0 + 4 + 16, &positive, 4), "descending");
    refused(patched(rec0 + 4 + 16 + 4, &positive, 4), "descending");

    // Random damage: refused or read, never a crash (run under the sanitizers too).
    std::mt19937 rng(7);
    for (int i = 0; i < 2000; i++) {
      std::string b = good;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; f++) b[rng() % b.size()] ^= static_cast<char>(1u << (rng() % 8));
      if (rng() % 4 == 0) b.resize(rng() % b.size());
      (void)KlBase::parse(b);
    }

    QVERIFY(!KlBase::load(dir.filePath("missing").toStdString()));
    QVERIFY(!KlBase::load(dir.path().toStdString()));  // a folder
  }

  // Every family against llama.cpp: the reference models' logits at every
  // scored position of llama-perplexity's run (its --kl-divergence-base
  // files, kept in tests/data/reference-models with the commit and command
  // that made them) against PhaseLab's on the same tokens, on the reference
  // and the fast backend, with F32 K/V as llama's run had. Float weights:
  // the distributions agree to the 16-bit rounding of llama's file (max
  // |dlogp| ~1e-4); quantized ones to the rounding of each engine's 8-bit
  // activations.
  void matches_llama_cpp_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<bool>("exact");  // float weights
    QTest::addColumn<bool>("reference");
    for (const auto& m : reference_models()) {
      const bool exact = m.spec.matrix_type == TensorType::F32 && m.spec.embd_type == TensorType::F32 &&
                         m.spec.expert_type.value_or(TensorType::F32) == TensorType::F32;
      for (bool ref : {true, false})
        QTest::newRow((m.name + (ref ? "/reference" : "/fast")).c_str()) << QString::fromStdString(m.name) << exact << ref;
    }
    QTest::newRow("stories260K/reference") << "stories260K" << true << true;  // trained, all F32
    QTest::newRow("stories260K/fast") << "stories260K" << true << false;
  }
  void matches_llama_cpp() {
    QFETCH(QString, model);
    QFETCH(bool, exact);
    QFETCH(bool, reference);
    const std::string dir = test_data("reference-models/");
    const std::string gguf = model == "stories260K" ? test_data("stories260K.gguf") : dir + model.toStdString() + ".gguf";
    auto m = Model::load(gguf);
    QVERIFY2(m, m.status().message().c_str());
    // Every token kept: the KL divergence is then over the whole vocabulary.
    auto base = KlBase::load(dir + model.toStdString() + ".kld", (*m)->config().n_vocab);
    QVERIFY2(base, base.status().message().c_str());
    QVERIFY(base->from_llama);
    QVERIFY(base->top_k >= 32);  // all but the tokens the file holds only a bound for
    auto s = session(*m, reference, base->n_ctx, 64, KvType::f32);
    PerplexityOptions o;
    o.n_ctx = base->n_ctx;
    o.kl_base = &*base;
    auto r = run_perplexity(*s, base->tokens, o);
    QVERIFY2(r, r.status().message().c_str());
    QVERIFY(r->kl.has_value());
    const KlStats& k = *r->kl;
    qInfo("%s: PPL %.4f (llama.cpp %.4f), KLD %.3g, max |dlogp| %.3g, top-1 %.1f %%", qPrintable(model), r->ppl,
          k.ppl_base, k.kld, k.max_dlogp, 100 * k.top1_agree);
    QCOMPARE(r->n_scored, base->n_positions());
    if (exact) {
      QVERIFY2(k.kld < 1e-5, qPrintable(QString("KLD %1").arg(k.kld)));
      QVERIFY2(k.max_dlogp < 1e-3, qPrintable(QString("max |dlogp| %1").arg(k.max_dlogp)));
      QVERIFY2(std::fabs(r->ppl / k.ppl_base - 1) < 1e-4, qPrintable(QString("PPL %1 vs %2").arg(r->ppl).arg(k.ppl_base)));
      QVERIFY2(k.top1_agree >= 0.95, qPrintable(QString("top-1 %1").arg(k.top1_agree)));
    } else {
      QVERIFY2(k.kld < 1e-3, qPrintable(QString("KLD %1").arg(k.kld)));
      // The reference path keeps float activations where llama.cpp (and the
      // fast path) round them to 8 bits: the largest single difference is
      // then llama.cpp's rounding (0.35 at one position of gpt-oss-mxfp4,
      // whose fast path differs by 0.02).
      const double max_dlogp = reference ? 0.5 : 0.2;
      QVERIFY2(k.max_dlogp < max_dlogp, qPrintable(QString("max |dlogp| %1").arg(k.max_dlogp)));
      QVERIFY2(std::fabs(r->ppl / k.ppl_base - 1) < 5e-3, qPrintable(QString("PPL %1 vs %2").arg(r->ppl).arg(k.ppl_base)));
      QVERIFY2(k.top1_agree >= 0.9, qPrintable(QString("top-1 %1").arg(k.top1_agree)));
    }
  }

  // The check can fail: another model's logits on the same tokens (Gemma 2
  // with other weights) are far from the base.
  void llama_base_of_another_model_differs() {
    auto m = Model::load(test_data("reference-models/gemma2-f32.gguf"));
    QVERIFY(m);
    auto base = KlBase::load(test_data("reference-models/gemma2-q8_0.kld"), 1000);
    QVERIFY(base);
    QVERIFY(base->top_k < (*m)->config().n_vocab);  // clamped to the vocabulary, less the tokens held as bounds
    auto s = session(*m, true, base->n_ctx);
    PerplexityOptions o;
    o.n_ctx = base->n_ctx;
    o.kl_base = &*base;
    auto r = run_perplexity(*s, base->tokens, o);
    QVERIFY(r);
    QVERIFY2(r->kl->kld > 0.05, qPrintable(QString("KLD %1").arg(r->kl->kld)));
    QVERIFY(r->kl->max_dlogp > 0.5);
  }

  // llama-perplexity's files: a few tokens kept by default, checked against
  // the file's size before anything is allocated, each field refused with
  // what is wrong.
  void llama_base_read_and_checked() {
    const std::string path = test_data("reference-models/llama-f32.kld");
    const std::string good = read_file(path);
    auto b = KlBase::load(path);
    QVERIFY2(b, b.status().message().c_str());
    QCOMPARE(b->top_k, KlBase::kLlamaTopK);
    QCOMPARE(b->n_ctx, 64);
    QCOMPARE(b->n_chunks, 3);
    QCOMPARE(b->bos, KlBase::kBosOfRun);
    QVERIFY(b->label.find("llama-f32.kld (llama-perplexity)") != std::string::npos);
    // The top-k is the most likely first, and the target's log p is its own.
    auto all = KlBase::load(path, 10000);
    QVERIFY(all);
    for (int64_t s = 0; s < b->n_positions(); s++) {
      for (int j = 0; j < b->top_k; j++) {
        QCOMPARE(b->top_ids[s * b->top_k + j], all->top_ids[s * all->top_k + j]);
        if (j > 0) QVERIFY(b->top_logp[s * b->top_k + j] <= b->top_logp[s * b->top_k + j - 1]);
      }
      const int32_t target = b->tokens[(s / 31) * 64 + 32 + s % 31 + 1];
      for (int j = 0; j < all->top_k; j++)
        if (all->top_ids[s * all->top_k + j] == target) QCOMPARE(all->top_logp[s * all->top_k + j], b->target_logp[s]);
    }

    QTemporaryDir dir;
    auto refused = [&](const std::string& bytes, const char* needle) {
      const std::string p = dir.filePath("bad.kld").toStdString();
      {
        std::ofstream out(p, std::ios::binary | std::ios::trunc);
        out << bytes;
      }
      auto r = KlBase::load(p);
      QVERIFY2(!r, needle);
      QCOMPARE(r.status().code(), StatusCode::invalid_file);
      QVERIFY2(r.status().message().find(needle) != std::string::npos, r.status().message().c_str());
      QVERIFY2(r.status().message().find("llama-perplexity") != std::string::npos, r.status().message().c_str());
    };
    auto patched = [&](size_t off, const void* v, size_t n) {
      std::string s = good;
      std::memcpy(s.data() + off, v, n);
      return s;
    };
    refused(good.substr(0, good.size() - 2), "promises");
    refused(good + "xy", "promises");
    refused(good.substr(0, 14), "truncated header");
    const uint32_t zero = 0, huge = 0x7fffffffu, many = 1u << 20;
    refused(patched(8, &zero, 4), "n_ctx");
    refused(patched(12, &huge, 4), "n_vocab");
    refused(patched(16, &many, 4), "promises");  // would be gigabytes: refused by size
    const int32_t bad_token = 5000;
    refused(patched(20 + 4 * 7, &bad_token, 4), "token 5000");
    const size_t rec0 = 20 + 4 * 64 * 3;
    const float nan = std::nanf(""), negative = -1.f, positive = 3.f;
    refused(patched(rec0, &nan, 4), "scale");
    refused(patched(rec0, &negative, 4), "scale");
    refused(patched(rec0 + 4, &positive, 4), "position 0");
    // Random damage: refused or read, never a crash (run under the sanitizers too).
    std::mt19937 rng(11);
    const std::string p = dir.filePath("damaged.kld").toStdString();
    for (int i = 0; i < 300; i++) {
      std::string s = good;
      for (int f = 0; f < 3; f++) s[rng() % 2048] ^= static_cast<char>(1u << (rng() % 8));
      if (rng() % 4 == 0) s.resize(rng() % s.size());
      {
        std::ofstream out(p, std::ios::binary | std::ios::trunc);
        out << s;
      }
      (void)KlBase::load(p);
    }
  }

  void cli_json_contract() {
    QTemporaryDir dir;
    const QString text = dir.filePath("text.txt");
    {
      std::ofstream out(text.toStdString(), std::ios::binary);
      out << eval_text(3000);
    }
    const QString base = dir.filePath("base.plkl");
    const QStringList common = {"perplexity", "-m", QString::fromStdString(test_data("stories260K.gguf")), "-f", text,
                                "-c", "64", "--backend", "cpu-reference", "-t", "2"};
    const Run r = cli(common + QStringList{"--json", "--save-logits", base});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const QJsonObject j = QJsonDocument::fromJson(r.out.toUtf8()).object();
    for (const char* key : {"ppl", "ppl_err", "n_chunks", "n_scored", "n_ctx", "tokens_per_s", "backend", "model"})
      QVERIFY2(j.contains(key), key);
    QCOMPARE(r.out.trimmed().count('\n'), 0);  // one object, one line
    QCOMPARE(j["n_ctx"].toInt(), 64);
    QCOMPARE(j["n_chunks"].toInt(), static_cast<int>(tokens_.size() / 64));
    QCOMPARE(j["n_scored"].toInt(), j["n_chunks"].toInt() * 31);
    QCOMPARE(j["model"].toString(), QString("stories260K.gguf"));
    QVERIFY(j["tokens_per_s"].toDouble() > 0);

    // The same figure as the library gives.
    auto s = session(stories_, true, 64);
    PerplexityOptions o;
    o.n_ctx = 64;
    auto lib = run_perplexity(*s, tokens_, o);
    QVERIFY(lib);
    QVERIFY(std::fabs(j["ppl"].toDouble() / lib->ppl - 1) < 1e-9);

    // Against its own base: KL 0, same argmax everywhere; -c taken from the base.
    const Run k = cli({"perplexity", "-m", QString::fromStdString(test_data("stories260K.gguf")), "-f", text,
                       "--backend", "cpu-reference", "--json", "--kl-base", base, "--chunks", "3"});
    QVERIFY2(k.code == 0, qPrintable(k.err));
    const QJsonObject kj = QJsonDocument::fromJson(k.out.toUtf8()).object();
    QCOMPARE(kj["n_ctx"].toInt(), 64);
    QCOMPARE(kj["n_chunks"].toInt(), 3);
    QCOMPARE(kj["kld"].toDouble(), 0.0);
    QCOMPARE(kj["top1_agree"].toDouble(), 1.0);
    QCOMPARE(kj["rms_dp"].toDouble(), 0.0);
    for (const char* key : {"kld_p99", "kld_median", "ppl_base", "kl_base_label"}) QVERIFY2(kj.contains(key), key);

    // Plain output: llama-perplexity's final line.
    const Run t = cli(common + QStringList{"--chunks", "2"});
    QVERIFY2(t.code == 0, qPrintable(t.err));
    QVERIFY2(QRegularExpression("Final estimate: PPL = [0-9.]+ \\+/- [0-9.]+").match(t.out).hasMatch(), qPrintable(t.out));

    // Mismatches and bad files: exit code 2, one line.
    for (const QStringList& bad : {common + QStringList{"-c", "32", "--kl-base", base},
                                   common + QStringList{"--kl-base", text}, common + QStringList{"--top-k", "8"}}) {
      const Run e = cli(bad);
      QCOMPARE(e.code, 2);
      QVERIFY2(e.err.contains("phaselab-cli: "), qPrintable(e.err));
    }
    const Run no_text = cli({"perplexity", "-m", QString::fromStdString(test_data("stories260K.gguf")), "-f",
                             dir.filePath("missing.txt")});
    QVERIFY(no_text.code != 0);
    QVERIFY(no_text.err.contains("missing.txt"));
  }

  void cli_default_text() {
    // No -f: the bundled eval-en.txt (from the source tree in a build tree).
    const Run r = cli({"perplexity", "-m", QString::fromStdString(test_data("stories260K.gguf")), "-c", "128",
                       "--chunks", "2", "--json"});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const QJsonObject j = QJsonDocument::fromJson(r.out.toUtf8()).object();
    QVERIFY(j["text"].toString().endsWith("eval-en.txt"));
    QVERIFY(j["n_tokens_text"].toInt() > 10000);
    QCOMPARE(j["n_chunks"].toInt(), 2);
  }
};

QTEST_GUILESS_MAIN(TestPerplexity)
#include "test_perplexity.moc"
