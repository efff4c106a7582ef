// Layer dropping and FFN width pruning (prune.h): the spellings; a pruned file that holds exactly
// the kept tensors, renumbered, with its metadata; the oracle: the pruned
// model's logits are bitwise those of the full model run with the same
// layers skipped (Backend::forward_skipping), on both CPU backends and for
// Gemma 3's local/global pattern; the refusals; and the angular distances
// that choose the run. FFN width pruning: the pruned model's logits equal
// those of the full model with the dropped neurons' weights zeroed (F32,
// within rounding of the shorter sums), the file's shapes and metadata, and
// the measured importance beating its opposite on perplexity.
#include <QtTest>

#include <cstdio>
#include <filesystem>

#include "phaselab/backend.h"
#include "phaselab/gguf.h"
#include "phaselab/perplexity.h"
#include "phaselab/prune.h"
#include "phaselab/quant.h"
#include "phaselab/session.h"
#include "phaselab/speculative.h"
#include "tiny_model.h"

using namespace phaselab;
using namespace phaselab::testing;

namespace {

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("phaselab_test_prune_" + name)).string();
}

std::unique_ptr<Session> open(const std::string& path, bool fast = true) {
  auto m = Model::load(path);
  if (!m) qFatal("%s", m.status().message().c_str());
  auto b = fast ? make_cpu_backend(*m, 2, 64) : make_cpu_reference_backend(*m, 2, 64);
  auto s = Session::create(*m, std::move(*b), 128);
  if (!s) qFatal("%s", s.status().message().c_str());
  return std::move(*s);
}

// All logits of tokens through s, with the layers of skip left out (none: a plain pass).
std::vector<float> all_logits(Session& s, const std::vector<int32_t>& tokens, const std::vector<uint8_t>* skip) {
  std::vector<float> out(tokens.size() * static_cast<size_t>(s.model().config().n_vocab));
  s.kv().clear();
  SeqChunk ch;
  ch.kv = &s.kv();
  ch.tokens = tokens.data();
  ch.n_tokens = static_cast<int>(tokens.size());
  ch.mode = LogitsMode::all;
  ch.logits = out.data();
  const Status st = skip ? s.backend().forward_skipping(ch, *skip) : s.backend().forward_batch(&ch, 1);
  if (!st) qFatal("%s", st.message().c_str());
  return out;
}

const std::vector<int32_t> kTokens = {1, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270};

// A copy of in with every FFN neuron not in keep[l] zeroed (its ffn_gate and
// ffn_up rows and its ffn_down column): the same function as the pruned
// model, computed the long way.
std::string zero_ffn_neurons(const std::string& in, const std::vector<std::vector<int>>& keep, const std::string& name) {
  auto f = GgufFile::open(in);
  if (!f) qFatal("%s", f.status().message().c_str());
  GgufWriter w;
  for (const auto& [key, value] : (*f)->metadata())
    if (key != "general.alignment") w.set(key, GgufWriteValue::copy_of(value));
  for (const GgufTensorInfo& t : (*f)->tensors()) {
    std::vector<float> v(t.n_elements);
    const Status st = dequantize_row(t.type, t.data, v.data(), static_cast<int64_t>(t.n_elements));
    if (!st) qFatal("%s", st.message().c_str());
    int layer = -1;
    char kind[16] = {};
    if (std::sscanf(t.name.c_str(), "blk.%d.ffn_%15[a-z].weight", &layer, kind) == 2 &&
        (std::string(kind) == "gate" || std::string(kind) == "up" || std::string(kind) == "down")) {
      const auto& k = keep[static_cast<size_t>(layer)];
      auto dropped = [&](int j) { return !std::binary_search(k.begin(), k.end(), j); };
      if (std::string(kind) == "down") {
        for (int64_t r = 0; r < t.ne[1]; r++)
          for (int64_t j = 0; j < t.ne[0]; j++)
            if (dropped(static_cast<int>(j))) v[static_cast<size_t>(r * t.ne[0] + j)] = 0;
      } else {
        for (int64_t j = 0; j < t.ne[1]; j++)
          if (dropped(static_cast<int>(j))) std::fill_n(&v[static_cast<size_t>(j * t.ne[0])], t.ne[0], 0.f);
      }
    }
    std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    if (!w.add_tensor_f32(t.name, t.type, shape, v)) qFatal("zeroed copy: %s", t.name.c_str());
  }
  const std::string out = tmp_path(name);
  if (!w.write(out)) qFatal("zeroed copy: write");
  return out;
}

std::string story_text() {
  std::string t = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. "
                  "One day, she saw a big, red ball in the park. She ran to it and kicked it high into the sky. ";
  for (int i = 0; i < 4; i++) t += t;
  return t;
}

}  // namespace

class TestPrune : public QObject {
  Q_OBJECT
 private slots:
  void spellings_parse_and_refuse() {
    auto a = parse_prune_spec("layers:3-5");
    QVERIFY(a.is_ok());
    QCOMPARE(a->first, 3);
    QCOMPARE(a->count, 3);
    QCOMPARE(prune_spec_to_string(*a), std::string("layers:3-5"));
    QCOMPARE(prune_spec_to_string(*parse_prune_spec("layers:7")), std::string("layers:7"));
    auto n = parse_prune_spec("layers:n2");
    QVERIFY(n.is_ok());
    QCOMPARE(n->first, -1);
    QCOMPARE(n->count, 2);
    QCOMPARE(prune_spec_to_string(*n), std::string("layers:n2"));
    for (const char* bad : {"", "layers", "layers:", "layers:5-3", "layers:-1", "layers:n0", "layers:nx", "ffn",
                            "layers:1,2", "Layers:1", "FFN:10%"}) {
      auto r = parse_prune_spec(bad);
      QVERIFY2(!r.is_ok(), bad);
      QVERIFY2(r.status().message().find("layers:A-B") != std::string::npos, r.status().message().c_str());
    }
  }

  // The pruned file's tensors are the kept ones, byte for byte, renamed;
  // its metadata the input's but for the block count and the name.
  void the_file_holds_the_kept_layers() {
    const std::string in = test_data("stories260K.gguf"), out = tmp_path("stories.gguf");
    std::remove(out.c_str());
    auto rep = prune_layers(in, out, {1, 2}, false);
    QVERIFY2(rep.is_ok(), rep.status().message().c_str());
    QCOMPARE(rep->n_layer_in, 5);
    QCOMPARE(rep->n_layer_out, 3);
    auto fi = GgufFile::open(in), fo = GgufFile::open(out);
    QVERIFY(fi.is_ok() && fo.is_ok());
    const GgufFile &a = **fi, &b = **fo;
    QCOMPARE(b.get_int("llama.block_count").value_or(-1), int64_t{3});
    QVERIFY(b.get_string("general.name")->find("layers 1-2 dropped") != std::string_view::npos);
    QCOMPARE(std::string(*b.get_string("phaselab.pruned_layers")), std::string("1-2 of 5"));
    int per_layer = 0;
    for (const auto& t : a.tensors()) per_layer += t.name.rfind("blk.0.", 0) == 0 ? 1 : 0;
    QCOMPARE(static_cast<int>(b.tensors().size()), static_cast<int>(a.tensors().size()) - 2 * per_layer);
    QCOMPARE(rep->n_tensors_out, static_cast<int>(b.tensors().size()));
    for (const auto& t : b.tensors()) {
      std::string src = t.name;
      if (src.rfind("blk.1.", 0) == 0) src = "blk.3." + src.substr(6);
      if (src.rfind("blk.2.", 0) == 0) src = "blk.4." + src.substr(6);
      QVERIFY2(src.rfind("blk.1.", 0) != 0 && src.rfind("blk.2.", 0) != 0, t.name.c_str());
      const GgufTensorInfo* s = a.find_tensor(src);
      QVERIFY2(s, src.c_str());
      QCOMPARE(t.type, s->type);
      QCOMPARE(t.n_bytes, s->n_bytes);
      QVERIFY2(std::memcmp(t.data, s->data, t.n_bytes) == 0, t.name.c_str());
    }
    for (const auto& [key, v] : a.metadata()) {
      if (key == "llama.block_count" || key == "general.name") continue;
      QVERIFY2(b.find(key), key.c_str());
      QCOMPARE(b.find(key)->to_string(64), v.to_string(64));
    }
    std::remove(out.c_str());
  }

  // The oracle: the pruned model computes what the full model computes with
  // those layers skipped, bit for bit.
  void pruned_logits_equal_the_full_model_skipping_those_layers_data() {
    QTest::addColumn<QString>("arch");
    QTest::addColumn<int>("first");
    QTest::addColumn<int>("count");
    QTest::addColumn<bool>("fast");
    for (bool fast : {true, false}) {
      const char* f = fast ? "fast" : "reference";
      QTest::newRow(qPrintable(QString("llama/1/%1").arg(f))) << "llama" << 1 << 1 << fast;
      QTest::newRow(qPrintable(QString("llama/2-3/%1").arg(f))) << "llama" << 2 << 2 << fast;
      QTest::newRow(qPrintable(QString("qwen3/0/%1").arg(f))) << "qwen3" << 0 << 1 << fast;
      QTest::newRow(qPrintable(QString("gemma3/1-2/%1").arg(f))) << "gemma3" << 1 << 2 << fast;  // period 2
      QTest::newRow(qPrintable(QString("gpt-oss/1-2/%1").arg(f))) << "gpt-oss" << 1 << 2 << fast;  // period 2, MoE
    }
  }
  void pruned_logits_equal_the_full_model_skipping_those_layers() {
    QFETCH(QString, arch);
    QFETCH(int, first);
    QFETCH(int, count);
    QFETCH(bool, fast);
    TinySpec spec = arch == "gpt-oss" ? tiny_spec("gpt-oss") : TinySpec{};
    spec.arch = arch.toStdString();
    spec.n_layer = 5;
    spec.matrix_type = TensorType::Q8_0;
    if (arch == "gemma3") spec.sliding_window = 6;
    const std::string in = write_tiny_model(spec, "prune_" + spec.arch + ".gguf");
    const std::string out = tmp_path(spec.arch + "_pruned.gguf");
    auto rep = prune_layers(in, out, {first, count}, true);
    QVERIFY2(rep.is_ok(), rep.status().message().c_str());
    auto full = open(in, fast), pruned = open(out, fast);
    QCOMPARE(pruned->model().config().n_layer, spec.n_layer - count);
    for (int j = 0; j < pruned->model().config().n_layer; j++) {
      const int src = j < first ? j : j + count;
      QCOMPARE(pruned->model().config().is_swa(j), full->model().config().is_swa(src));
    }
    std::vector<uint8_t> skip(static_cast<size_t>(spec.n_layer), 0);
    for (int l = first; l < first + count; l++) skip[static_cast<size_t>(l)] = 1;
    const auto want = all_logits(*full, kTokens, &skip);
    const auto got = all_logits(*pruned, kTokens, nullptr);
    QCOMPARE(got.size(), want.size());
    QVERIFY(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    // And not what the whole model computes.
    const auto whole = all_logits(*full, kTokens, nullptr);
    QVERIFY(std::memcmp(whole.data(), want.data(), got.size() * sizeof(float)) != 0);
    std::remove(out.c_str());
  }

  void ffn_spellings() {
    for (const char* ok : {"ffn:75%", "ffn:75", "ffn:1%", "ffn:99%"}) {
      auto p = parse_prune_spec(ok);
      QVERIFY2(p.is_ok() && p->is_ffn(), ok);
    }
    QCOMPARE(prune_spec_to_string(*parse_prune_spec("ffn:50")), std::string("ffn:50%"));
    for (const char* bad : {"ffn:0%", "ffn:100%", "ffn:", "ffn:x%", "ffn:-5%", "ffn:50%%"}) {
      auto p = parse_prune_spec(bad);
      QVERIFY2(!p.is_ok() && p.status().message().find("ffn:P%") != std::string::npos, bad);
    }
    QCOMPARE(ffn_kept_width(2048, 75, 256), 1536);
    QCOMPARE(ffn_kept_width(2048, 80, 256), 1536);  // rounded down to ffn_down's block
    QCOMPARE(ffn_kept_width(172, 50, 32), 64);
    QCOMPARE(ffn_kept_width(256, 10, 256), 0);  // no whole block left to drop
    QCOMPARE(ffn_kept_width(512, 1, 256), 256);  // at least one block
  }

  void ffn_pruned_logits_equal_the_full_model_with_those_neurons_zeroed() {
    TinySpec spec;
    spec.arch = "llama";
    spec.n_ff = 128;
    spec.matrix_type = TensorType::F32;
    const std::string in = write_tiny_model(spec, "prune_ffn_llama.gguf");
    // A different half of the neurons in each layer.
    std::vector<std::vector<int>> keep(static_cast<size_t>(spec.n_layer));
    for (int l = 0; l < spec.n_layer; l++)
      for (int j = 0; j < spec.n_ff; j++)
        if ((j * 7 + l) % 4 < 2 && keep[l].size() < 64) keep[l].push_back(j);
    for (auto& k : keep)
      for (int j = 0; static_cast<int>(k.size()) < 64; j++)
        if (!std::binary_search(k.begin(), k.end(), j)) k.insert(std::lower_bound(k.begin(), k.end(), j), j);
    const std::string out = tmp_path("ffn_pruned.gguf");
    auto rep = prune_ffn_neurons(in, out, keep, true);
    QVERIFY2(rep.is_ok(), rep.status().message().c_str());
    QCOMPARE(rep->n_ff_in, 128);
    QCOMPARE(rep->n_ff_out, 64);
    auto pf = GgufFile::open(out);
    QVERIFY(pf.is_ok());
    QCOMPARE((*pf)->get_int("llama.feed_forward_length").value_or(0), int64_t{64});
    QCOMPARE((*pf)->find_tensor("blk.1.ffn_up.weight")->ne[1], int64_t{64});
    QCOMPARE((*pf)->find_tensor("blk.1.ffn_down.weight")->ne[0], int64_t{64});
    QCOMPARE((*pf)->find_tensor("blk.1.attn_q.weight")->n_bytes, GgufFile::open(in).value()->find_tensor("blk.1.attn_q.weight")->n_bytes);
    const std::string zeroed = zero_ffn_neurons(in, keep, "ffn_zeroed.gguf");
    for (bool fast : {false, true}) {
      auto pruned = open(out, fast), zero = open(zeroed, fast), full = open(in, fast);
      const auto got = all_logits(*pruned, kTokens, nullptr);
      const auto want = all_logits(*zero, kTokens, nullptr);
      const auto whole = all_logits(*full, kTokens, nullptr);
      double max_err = 0, max_diff_whole = 0;
      for (size_t i = 0; i < got.size(); i++) {
        max_err = std::max(max_err, double(std::fabs(got[i] - want[i])));
        max_diff_whole = std::max(max_diff_whole, double(std::fabs(whole[i] - want[i])));
      }
      qInfo("%s: |pruned - zeroed| <= %.2g, |whole - zeroed| up to %.2g", fast ? "fast" : "reference", max_err,
            max_diff_whole);
      QVERIFY(max_err < 1e-4);
      QVERIFY(max_diff_whole > 1e-2);  // the neurons mattered
    }
    // Refusals: counts that are not the same, not whole blocks, or everything.
    auto bad = keep;
    bad[0].pop_back();
    QVERIFY(!prune_ffn_neurons(in, out, bad, true));
    std::vector<std::vector<int>> all(static_cast<size_t>(spec.n_layer));
    for (auto& k : all)
      for (int j = 0; j < spec.n_ff; j++) k.push_back(j);
    QVERIFY(prune_ffn_neurons(in, out, all, true).status().message().find("fewer than all") != std::string::npos);
    auto unsorted = keep;
    std::swap(unsorted[1][0], unsorted[1][1]);
    QVERIFY(prune_ffn_neurons(in, out, unsorted, true).status().message().find("ascending") != std::string::npos);
    QVERIFY(prune_ffn_neurons(in, in, keep, true).status().code() == StatusCode::invalid_argument);  // never its input
    std::remove(out.c_str());
    std::remove(zeroed.c_str());
  }

  // The measured importance picks neurons that matter: keeping the top half
  // of stories260K's FFNs costs far less perplexity than keeping the bottom
  // half (the same count), and the file loads and generates.
  void ffn_importance_beats_its_opposite() {
    const std::string in = test_data("stories260K.gguf");
    const std::string text = story_text();
    const std::string top = tmp_path("ffn_top.gguf"), bottom = tmp_path("ffn_bottom.gguf");
    auto rep = prune_ffn(in, top, 50, text, 2, true);
    QVERIFY2(rep.is_ok(), rep.status().message().c_str());
    const int K = rep->n_ff_out;
    QCOMPARE(K, ffn_kept_width(rep->n_ff_in, 50, 32));
    auto full = open(in);
    const auto tokens = perplexity_tokenize(full->model().tokenizer(), text);
    auto score = ffn_neuron_importance(*full, tokens);
    QVERIFY(score.is_ok());
    std::vector<std::vector<int>> low;
    for (const auto& sc : *score) {
      std::vector<int> idx(sc.size());
      for (size_t j = 0; j < sc.size(); j++) idx[j] = static_cast<int>(j);
      std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return sc[a] < sc[b]; });
      idx.resize(static_cast<size_t>(K));
      std::sort(idx.begin(), idx.end());
      low.push_back(idx);
    }
    QVERIFY(prune_ffn_neurons(in, bottom, low, true).is_ok());
    auto ppl = [&](const std::string& path) {
      auto s = open(path);
      PerplexityOptions o;
      o.n_ctx = 64;
      auto r = run_perplexity(*s, tokens, o);
      if (!r) qFatal("%s", r.status().message().c_str());
      return r->ppl;
    };
    const double p_full = ppl(in), p_top = ppl(top), p_bottom = ppl(bottom);
    qInfo("perplexity: whole %.3f, top half of the FFN kept %.3f, bottom half %.3f", p_full, p_top, p_bottom);
    QVERIFY(p_top < p_bottom);
    QVERIFY(p_top > p_full * 0.5);
    std::remove(top.c_str());
    std::remove(bottom.c_str());
  }

  void refusals_say_what_to_do() {
    const std::string in = test_data("stories260K.gguf"), out = tmp_path("refused.gguf");
    std::remove(out.c_str());
    auto expect = [&](const LayerPrune& p, const std::string& target, const char* words, bool force = false) {
      auto r = prune_layers(in, target, p, force);
      QVERIFY2(!r.is_ok(), words);
      QVERIFY2(r.status().message().find(words) != std::string::npos, r.status().message().c_str());
    };
    expect({4, 2}, out, "not in the model");
    expect({-1, 1}, out, "not in the model");
    expect({0, 5}, out, "every layer");
    expect({1, 1}, in, "input file itself", true);
    QVERIFY(!QFile::exists(QString::fromStdString(out)));
    QVERIFY(prune_layers(in, out, {1, 1}, false).is_ok());
    expect({1, 1}, out, "--force");
    QVERIFY(prune_layers(in, out, {1, 1}, true).is_ok());
    std::remove(out.c_str());
    // Gemma 3 with its pattern as a period: a drop that shifts it is refused.
    TinySpec g;
    g.arch = "gemma3";
    g.n_layer = 6;
    g.sliding_window = 4;
    g.swa_period = 3;
    const std::string gin = write_tiny_model(g, "prune_gemma3_p3.gguf");
    auto r = prune_layers(gin, out, {1, 2}, true);
    QVERIFY(!r.is_ok());
    QVERIFY2(r.status().message().find("multiple of 3") != std::string::npos, r.status().message().c_str());
    QVERIFY(prune_layers(gin, out, {1, 3}, true).is_ok());
    std::remove(out.c_str());
    // gpt-oss alternates every other layer: an odd drop is refused.
    TinySpec o = tiny_spec("gpt-oss");
    o.n_layer = 4;
    const std::string oin = write_tiny_model(o, "prune_gpt_oss.gguf");
    auto ro = prune_layers(oin, out, {1, 1}, true);
    QVERIFY(!ro.is_ok());
    QVERIFY2(ro.status().message().find("multiple of 2") != std::string::npos, ro.status().message().c_str());
    QVERIFY(!QFile::exists(QString::fromStdString(out)));
    // A corrupt input is the reader's error, and nothing is written.
    const std::string junk = tmp_path("junk.gguf");
    {
      QFile f(QString::fromStdString(junk));
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write("GGUF not really");
    }
    QVERIFY(!prune_layers(junk, out, {0, 1}, true).is_ok());
    QVERIFY(!QFile::exists(QString::fromStdString(out)));
    std::remove(junk.c_str());
  }

  // One value per run, each an angle in [0, 1]; the run that leaves the
  // stream unchanged (a layer whose output matrices are zero) is 0 and so
  // the one chosen.
  void angular_distances_find_the_layer_that_changes_nothing() {
    auto s = open(test_data("stories260K.gguf"));
    const int L = s->model().config().n_layer;
    const auto tok = s->model().tokenizer().encode("Once upon a time, there was a little girl named Lily.", true, false);
    for (int count : {1, 2}) {
      auto d = block_angular_distances(*s, tok, count);
      QVERIFY2(d.is_ok(), d.status().message().c_str());
      QCOMPARE(static_cast<int>(d->size()), L - count + 1);
      for (double v : *d) QVERIFY(v > 0 && v <= 1);
    }
    QVERIFY(!block_angular_distances(*s, tok, L).is_ok());
    QVERIFY(!block_angular_distances(*s, {}, 1).is_ok());
    // Layer 2 of a tiny model made a no-op: its output projections are zero.
    TinySpec spec;
    spec.n_layer = 4;
    const std::string path = write_tiny_model(spec, "prune_noop.gguf");
    auto f = GgufFile::open(path);
    QVERIFY(f.is_ok());
    GgufWriter w;
    for (const auto& [key, v] : (*f)->metadata())
      if (key != "general.alignment") w.set(key, GgufWriteValue::copy_of(v));
    for (const auto& t : (*f)->tensors()) {
      std::vector<uint8_t> bytes(t.data, t.data + t.n_bytes);
      if (t.name == "blk.2.attn_output.weight" || t.name == "blk.2.ffn_down.weight") std::fill(bytes.begin(), bytes.end(), 0);
      std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
      QVERIFY(w.add_tensor(t.name, t.type, shape, bytes.data(), bytes.size()));
    }
    const std::string noop = tmp_path("noop.gguf");
    QVERIFY(w.write(noop));
    auto ns = open(noop);
    auto d = block_angular_distances(*ns, kTokens, 1);
    QVERIFY(d.is_ok());
    QVERIFY2((*d)[2] < 1e-6, qPrintable(QString::number((*d)[2])));
    for (int l = 0; l < 4; l++)
      if (l != 2) QVERIFY((*d)[static_cast<size_t>(l)] > 1e-3);
    std::remove(noop.c_str());
  }
};

QTEST_APPLESS_MAIN(TestPrune)
#include "test_prune.moc"
