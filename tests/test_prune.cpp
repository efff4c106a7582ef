// Layer dropping (prune.h): the spellings; a pruned file that holds exactly
// the kept tensors, renumbered, with its metadata; the oracle: the pruned
// model's logits are bitwise those of the full model run with the same
// layers skipped (Backend::forward_skipping), on both CPU backends and for
// Gemma 3's local/global pattern; the refusals; and the angular distances
// that choose the run.
#include <QtTest>

#include <cstdio>
#include <filesystem>

#include "phaselab/backend.h"
#include "phaselab/gguf.h"
#include "phaselab/prune.h"
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
    for (const char* bad : {"", "layers", "layers:", "layers:5-3", "layers:-1", "layers:n0", "layers:nx", "ffn:10%",
                            "layers:1,2", "Layers:1"}) {
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
    }
  }
  void pruned_logits_equal_the_full_model_skipping_those_layers() {
    QFETCH(QString, arch);
    QFETCH(int, first);
    QFETCH(int, count);
    QFETCH(bool, fast);
    TinySpec spec;
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
