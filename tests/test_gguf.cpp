// GGUF reader and writer: round trips, and one malformed file per validation
// class, each of which must give an error naming the field (never a crash).
// Also what loading adds on top of a well-formed file (tokenizer metadata,
// tensors, hyperparameters), as the engine and `phaselab-cli info` see it,
// and model paths that are not regular files.
#include <sys/stat.h>

#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QtTest>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "phaselab/gguf.h"
#include "phaselab/model.h"
#include "phaselab/quant.h"
#include "phaselab/tokenizer.h"
#include "tiny_model.h"

using namespace phaselab;

namespace {

// Writes raw GGUF bytes field by field, so that each test can break exactly
// one thing.
struct Raw {
  std::vector<uint8_t> b;
  template <typename T>
  Raw& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Raw& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    put<uint32_t>(0x46554747).put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
    return *this;
  }
  Raw& kv_u32(const std::string& key, uint32_t v) {
    str(key).put<uint32_t>(uint32_t(GgufValueType::UINT32)).put<uint32_t>(v);
    return *this;
  }
  Raw& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (auto d : ne) put<uint64_t>(d);
    put<uint32_t>(type).put<uint64_t>(offset);
    return *this;
  }
  Raw& pad(size_t alignment = 32) {
    while (b.size() % alignment) b.push_back(0);
    return *this;
  }
  Raw& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
};

Status open_bytes(std::vector<uint8_t> bytes) {
  auto f = GgufFile::from_bytes(std::move(bytes), "bad.gguf");
  return f.is_ok() ? Status::ok() : f.status();
}

#define EXPECT_INVALID(bytes, needle)                                                                   \
  do {                                                                                                   \
    const Status _st = open_bytes(bytes);                                                                \
    QVERIFY2(!_st.is_ok(), "a malformed file was accepted");                                             \
    QVERIFY2(_st.message().find("bad.gguf") != std::string::npos, _st.message().c_str());                \
    QVERIFY2(_st.message().find(needle) != std::string::npos, _st.message().c_str());                    \
  } while (0)

std::vector<uint8_t> valid_file() {
  GgufWriter w;
  w.set("general.architecture", GgufWriteValue::string("llama"));
  w.set("some.u8", GgufWriteValue::u8(200));
  w.set("some.i8", GgufWriteValue::i8(-5));
  w.set("some.u16", GgufWriteValue::u16(60000));
  w.set("some.i16", GgufWriteValue::i16(-30000));
  w.set("some.u32", GgufWriteValue::u32(4000000000u));
  w.set("some.i32", GgufWriteValue::i32(-2000000000));
  w.set("some.u64", GgufWriteValue::u64(1ull << 40));
  w.set("some.i64", GgufWriteValue::i64(-(1ll << 40)));
  w.set("some.f32", GgufWriteValue::f32(1.5f));
  w.set("some.f64", GgufWriteValue::f64(-2.25));
  w.set("some.bool", GgufWriteValue::boolean(true));
  w.set("some.string", GgufWriteValue::string("héllo"));
  w.set("some.strings", GgufWriteValue::string_array({"a", "", "ccc"}));
  w.set("some.floats", GgufWriteValue::f32_array({0.5f, -1.f}));
  w.set("some.nested", GgufWriteValue::array(GgufValueType::ARRAY,
                                             {GgufWriteValue::i32_array({1, 2}), GgufWriteValue::i32_array({3})}));
  std::vector<float> v(64);
  for (int i = 0; i < 64; i++) v[i] = static_cast<float>(i) - 30.f;
  if (!w.add_tensor_f32("a", TensorType::F32, {8, 8}, v)) qFatal("add a");
  if (!w.add_tensor_f32("b", TensorType::Q8_0, {32, 2}, v)) qFatal("add b");
  return w.serialize();
}

// ---- models that are well-formed GGUF but cannot load -----------------------

// The tiny llama of tiny_model.h, rewritten through the writer with edits:
// tensor_edit may change a tensor's name or shape or drop it (return false),
// meta_edit changes the metadata. Returns the new file's path.
using TensorEdit = std::function<bool(std::string& name, std::vector<int64_t>& shape)>;
using MetaEdit = std::function<void(GgufWriter&)>;

std::string tiny_llama() {
  static const std::string path = phaselab::testing::write_tiny_model(phaselab::testing::TinySpec{}, "phaselab_test_gguf_tiny.gguf");
  return path;
}

std::string edited_model(const std::string& file_name, const TensorEdit& tensor_edit, const MetaEdit& meta_edit = {}) {
  auto src = GgufFile::open(tiny_llama());
  if (!src) qFatal("%s", src.status().message().c_str());
  GgufWriter w;
  for (const auto& [key, v] : (*src)->metadata()) w.set(key, GgufWriteValue::copy_of(v));
  if (meta_edit) meta_edit(w);
  for (const GgufTensorInfo& t : (*src)->tensors()) {
    std::string name = t.name;
    std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    if (tensor_edit && !tensor_edit(name, shape)) continue;
    if (!w.add_tensor(name, t.type, shape, t.data, t.n_bytes)) qFatal("rewrite %s", name.c_str());
  }
  const std::string path = QDir::temp().filePath(QString::fromStdString(file_name)).toStdString();
  if (!w.write(path)) qFatal("cannot write %s", path.c_str());
  return path;
}

std::string model_with_meta(const std::string& file_name, const MetaEdit& meta_edit) {
  return edited_model(file_name, {}, meta_edit);
}

struct Run {
  int code = -1;
  QString out, err;
};

// phaselab-cli with a time limit: a command that hangs (on a FIFO, say)
// is killed and reported as code -2.
Run cli(const QStringList& args, int timeout_ms = 60000) {
  QProcess p;
  p.start(PHASELAB_CLI_PATH, args);
  if (!p.waitForStarted()) qFatal("cannot start phaselab-cli");
  p.closeWriteChannel();
  if (!p.waitForFinished(timeout_ms)) {
    p.kill();
    p.waitForFinished();
    return {-2, QString::fromUtf8(p.readAllStandardOutput()), QString::fromUtf8(p.readAllStandardError())};
  }
  return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1, QString::fromUtf8(p.readAllStandardOutput()),
          QString::fromUtf8(p.readAllStandardError())};
}

// Exit 2 with one line "phaselab-cli: error: ..." naming needle.
#define EXPECT_CLI_ERROR(run, needle)                                                                    \
  do {                                                                                                    \
    const Run& _r = (run);                                                                                \
    QVERIFY2(_r.code == 2, qPrintable(QString("exit %1, stderr: %2").arg(_r.code).arg(_r.err)));          \
    QVERIFY2(_r.err.startsWith("phaselab-cli: error: ") && _r.err.trimmed().count('\n') == 0, qPrintable(_r.err)); \
    QVERIFY2(_r.err.contains(needle), qPrintable(_r.err));                                                \
  } while (0)

// `info` (text and --json) on a file that is valid GGUF but would not load.
void expect_info_refuses(const std::string& path, const QString& needle) {
  const QString p = QString::fromStdString(path);
  const Run r = cli({"info", p});
  EXPECT_CLI_ERROR(r, needle);
  QVERIFY2(r.out.contains("file            ") && r.out.contains("loadable        no: "), qPrintable(r.out));
  const Run j = cli({"info", p, "--json"});
  EXPECT_CLI_ERROR(j, needle);
  const QJsonObject o = QJsonDocument::fromJson(j.out.toUtf8()).object();
  QVERIFY2(!o.isEmpty(), qPrintable(j.out));
  QCOMPARE(o["loadable"].toBool(true), false);
  QVERIFY2(o["load_error"].toString().contains(needle), qPrintable(o["load_error"].toString()));
  QVERIFY(o["n_tensors"].toInt() > 0);  // the metadata it could read is still there
  QVERIFY(o.contains("vocab") && o.contains("tensor_types"));
}

Status load_status(const std::string& path) {
  auto m = Model::load(path);
  return m.is_ok() ? Status::ok() : m.status();
}

// A tokenizer from a tiny SentencePiece vocabulary with one key changed.
Status tokenizer_with(const MetaEdit& edit) {
  GgufWriter w;
  int n_vocab = 0;
  phaselab::testing::add_tiny_vocab(w, &n_vocab);
  edit(w);
  auto f = GgufFile::from_bytes(w.serialize(), "vocab.gguf");
  if (!f) return f.status();
  auto t = Tokenizer::from_gguf(**f);
  return t.is_ok() ? Status::ok() : t.status();
}

#define EXPECT_REFUSED(status, needle)                                                      \
  do {                                                                                       \
    const Status _s = (status);                                                              \
    QVERIFY2(!_s.is_ok(), "accepted: " needle);                                              \
    QVERIFY2(_s.message().find(needle) != std::string::npos, _s.message().c_str());          \
  } while (0)

}  // namespace

class TestGguf : public QObject {
  Q_OBJECT
 private slots:
  void writer_and_reader_round_trip_every_value_type() {
    auto f = GgufFile::from_bytes(valid_file(), "ok.gguf");
    QVERIFY2(f.is_ok(), f.status().message().c_str());
    const GgufFile& g = **f;
    QCOMPARE(g.version(), 3u);
    QCOMPARE(std::string(*g.get_string("general.architecture")), std::string("llama"));
    QCOMPARE(*g.get_int("some.u8"), int64_t(200));
    QCOMPARE(*g.get_int("some.i8"), int64_t(-5));
    QCOMPARE(*g.get_int("some.u16"), int64_t(60000));
    QCOMPARE(*g.get_int("some.i16"), int64_t(-30000));
    QCOMPARE(*g.get_int("some.u32"), int64_t(4000000000ll));
    QCOMPARE(*g.get_int("some.i32"), int64_t(-2000000000));
    QCOMPARE(*g.get_int("some.u64"), int64_t(1ll << 40));
    QCOMPARE(*g.get_int("some.i64"), -(int64_t(1) << 40));
    QCOMPARE(*g.get_float("some.f32"), 1.5);
    QCOMPARE(*g.get_float("some.f64"), -2.25);
    QCOMPARE(*g.get_bool("some.bool"), true);
    QCOMPARE(std::string(*g.get_string("some.string")), std::string("héllo"));
    const GgufValue* s = g.find("some.strings");
    QVERIFY(s && s->strings.size() == 3 && s->strings[2] == "ccc" && s->strings[1].empty());
    const GgufValue* fl = g.find("some.floats");
    QVERIFY(fl && fl->count == 2 && fl->float_at(1) == -1.0);
    const GgufValue* n = g.find("some.nested");
    QVERIFY(n && n->items.size() == 2 && n->items[0].int_at(1) == 2 && n->items[1].int_at(0) == 3);
    QCOMPARE(g.tensors().size(), size_t(2));
    const GgufTensorInfo* a = g.find_tensor("a");
    QVERIFY(a && a->ne[0] == 8 && a->ne[1] == 8 && a->type == TensorType::F32 && a->n_bytes == 256);
    float first;
    std::memcpy(&first, a->data, 4);
    QCOMPARE(first, -30.f);
    const GgufTensorInfo* b = g.find_tensor("b");
    QVERIFY(b && b->type == TensorType::Q8_0 && b->n_bytes == 68);
    QCOMPARE((g.data_offset() + b->offset) % 32, uint64_t(0));  // aligned within the file
  }

  void writes_and_maps_a_real_file() {
    GgufWriter w(2, 64);
    w.set("k", GgufWriteValue::u32(7));
    std::vector<float> v(32, 1.f);
    QVERIFY(w.add_tensor_f32("t", TensorType::F16, {32}, v));
    const QString path = QDir::temp().filePath("phaselab_test_writer.gguf");
    QVERIFY(w.write(path.toStdString()));
    auto f = GgufFile::open(path.toStdString());
    QVERIFY2(f.is_ok(), f.status().message().c_str());
    QCOMPARE((*f)->version(), 2u);
    QCOMPARE((*f)->alignment(), uint64_t(64));
    QCOMPARE((*f)->data_offset() % 64, uint64_t(0));
    QFile::remove(path);
  }

  void missing_file_is_an_io_error_naming_it() {
    auto f = GgufFile::open("/nonexistent/model.gguf");
    QVERIFY(!f.is_ok());
    QVERIFY(f.status().message().find("/nonexistent/model.gguf") != std::string::npos);
  }

  void bad_magic() { EXPECT_INVALID(Raw().put<uint32_t>(0x12345678).zeros(40).b, "magic"); }
  void empty_file() { EXPECT_INVALID(std::vector<uint8_t>{}, "magic"); }

  void bad_version() {
    EXPECT_INVALID(Raw().header(0, 0, 99).b, "version");
    const Status v1 = open_bytes(Raw().header(0, 0, 1).b);
    QVERIFY(!v1.is_ok() && v1.code() == StatusCode::unsupported);
  }

  void counts_bounded_by_file_size() {
    EXPECT_INVALID(Raw().header(0, 1ull << 60).b, "metadata count");
    EXPECT_INVALID(Raw().header(1ull << 40, 0).b, "tensor count");
  }

  void string_length_past_end() {
    Raw r;
    r.header(0, 1).put<uint64_t>(1ull << 40).zeros(16);
    EXPECT_INVALID(r.b, "string length");
  }

  void array_count_past_end() {
    Raw r;
    r.header(0, 1).str("arr").put<uint32_t>(uint32_t(GgufValueType::ARRAY)).put<uint32_t>(uint32_t(GgufValueType::UINT32));
    r.put<uint64_t>(1ull << 61).zeros(8);
    EXPECT_INVALID(r.b, "does not fit");
    Raw s;  // strings: the count alone must be refused before any allocation
    s.header(0, 1).str("arr").put<uint32_t>(uint32_t(GgufValueType::ARRAY)).put<uint32_t>(uint32_t(GgufValueType::STRING));
    s.put<uint64_t>(1ull << 62).zeros(8);
    EXPECT_INVALID(s.b, "does not fit");
  }

  void unknown_value_type() {
    Raw r;
    r.header(0, 1).str("x").put<uint32_t>(77).zeros(8);
    EXPECT_INVALID(r.b, "unknown value type");
  }

  void arrays_nested_too_deep() {
    Raw r;
    r.header(0, 1).str("deep").put<uint32_t>(uint32_t(GgufValueType::ARRAY));
    for (int d = 0; d < 20; d++) r.put<uint32_t>(uint32_t(GgufValueType::ARRAY)).put<uint64_t>(1);
    r.zeros(64);
    EXPECT_INVALID(r.b, "nested");
  }

  void bool_out_of_range() {
    Raw r;
    r.header(0, 1).str("b").put<uint32_t>(uint32_t(GgufValueType::BOOL)).put<uint8_t>(7).zeros(8);
    EXPECT_INVALID(r.b, "bool");
  }

  void duplicate_key() {
    Raw r;
    r.header(0, 2).kv_u32("dup", 1).kv_u32("dup", 2).zeros(8);
    EXPECT_INVALID(r.b, "duplicate key");
  }

  void duplicate_tensor_name() {
    Raw r;
    r.header(2, 0).tensor("t", {8}, 0, 0).tensor("t", {8}, 0, 32).pad().zeros(64);
    EXPECT_INVALID(r.b, "duplicate tensor");
  }

  void too_many_dimensions() {
    Raw r;
    r.header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0).pad().zeros(32);
    EXPECT_INVALID(r.b, "n_dims");
    Raw z;
    z.header(1, 0).tensor("t", {}, 0, 0).pad().zeros(32);
    EXPECT_INVALID(z.b, "n_dims");
  }

  void zero_dimension() {
    Raw r;
    r.header(1, 0).tensor("t", {8, 0}, 0, 0).pad().zeros(32);
    EXPECT_INVALID(r.b, "must be positive");
  }

  void element_count_overflow() {
    Raw r;
    r.header(1, 0).tensor("t", {1ull << 32, 1ull << 32, 1ull << 32}, 0, 0).pad().zeros(32);
    EXPECT_INVALID(r.b, "overflow");
  }

  void unknown_tensor_type() {
    Raw r;
    r.header(1, 0).tensor("t", {32}, 1234, 0).pad().zeros(64);
    EXPECT_INVALID(r.b, "unknown tensor type");
  }

  void row_not_multiple_of_block() {
    Raw r;
    r.header(1, 0).tensor("t", {33}, uint32_t(TensorType::Q8_0), 0).pad().zeros(64);
    EXPECT_INVALID(r.b, "block size");
  }

  void misaligned_offset() {
    Raw r;
    r.header(1, 0).tensor("t", {4}, 0, 5).pad().zeros(64);
    EXPECT_INVALID(r.b, "not aligned");
  }

  void tensor_past_end_of_file() {
    Raw r;
    r.header(1, 0).tensor("t", {1024}, 0, 0).pad().zeros(64);
    EXPECT_INVALID(r.b, "past the end");
    Raw far;
    far.header(1, 0).tensor("t", {8}, 0, 1ull << 50).pad().zeros(64);
    EXPECT_INVALID(far.b, "past the end");
  }

  void overlapping_tensors() {
    Raw r;
    r.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad().zeros(128);
    EXPECT_INVALID(r.b, "overlaps");
  }

  void alignment_not_power_of_two() {
    Raw r;
    r.header(0, 1).kv_u32("general.alignment", 24).zeros(32);
    EXPECT_INVALID(r.b, "power of two");
    Raw zero;
    zero.header(0, 1).kv_u32("general.alignment", 0).zeros(32);
    EXPECT_INVALID(zero.b, "power of two");
  }

  // ---- loading beyond the GGUF structure ----------------------------------

  void info_reports_a_loadable_model() {
    const Run r = cli({"info", QString::fromStdString(tiny_llama())});
    QCOMPARE(r.code, 0);
    QVERIFY2(r.out.contains("loadable        yes"), qPrintable(r.out));
    const Run j = cli({"info", QString::fromStdString(tiny_llama()), "--json"});
    QCOMPARE(j.code, 0);
    QCOMPARE(QJsonDocument::fromJson(j.out.toUtf8()).object()["loadable"].toBool(false), true);
  }

  void info_refuses_a_model_with_a_missing_tensor() {
    const std::string path = edited_model("phaselab_test_missing_tensor.gguf",
                                          [](std::string& name, std::vector<int64_t>&) { return name != "blk.1.ffn_down.weight"; });
    EXPECT_REFUSED(load_status(path), "blk.1.ffn_down.weight");
    expect_info_refuses(path, "blk.1.ffn_down.weight");
  }

  void info_refuses_a_tensor_of_the_wrong_shape() {
    // attn_k is [n_embd, n_head_kv * head_dim] = [64, 32]; written as [32, 64].
    const std::string path = edited_model("phaselab_test_wrong_shape.gguf", [](std::string& name, std::vector<int64_t>& shape) {
      if (name == "blk.0.attn_k.weight") std::swap(shape[0], shape[1]);
      return true;
    });
    EXPECT_REFUSED(load_status(path), "blk.0.attn_k.weight");
    expect_info_refuses(path, "blk.0.attn_k.weight");
  }

  void info_refuses_bad_hyperparameters() {
    const std::string zero_heads = model_with_meta("phaselab_test_zero_heads.gguf", [](GgufWriter& w) {
      w.set("llama.attention.head_count", GgufWriteValue::u32(0));
    });
    expect_info_refuses(zero_heads, "attention.head_count");
    const std::string bad_eps = model_with_meta("phaselab_test_bad_eps.gguf", [](GgufWriter& w) {
      w.set("llama.attention.layer_norm_rms_epsilon", GgufWriteValue::f32(-1.f));
    });
    expect_info_refuses(bad_eps, "layer_norm_rms_epsilon");
    const std::string bad_rope = model_with_meta("phaselab_test_bad_rope.gguf", [](GgufWriter& w) {
      w.set("llama.rope.freq_base", GgufWriteValue::f32(0.f));
    });
    expect_info_refuses(bad_rope, "rope.freq_base");
    // More layers than the file has tensors for: refused before anything is
    // sized for them.
    const std::string many_layers = model_with_meta("phaselab_test_many_layers.gguf", [](GgufWriter& w) {
      w.set("llama.block_count", GgufWriteValue::u32(60000));
    });
    EXPECT_REFUSED(load_status(many_layers), "block_count");
    expect_info_refuses(many_layers, "block_count");
  }

  void info_refuses_an_unknown_architecture() {
    const std::string path = model_with_meta("phaselab_test_unknown_arch.gguf", [](GgufWriter& w) {
      w.set("general.architecture", GgufWriteValue::string("mamba"));
    });
    expect_info_refuses(path, "'mamba'");
  }

  void special_token_ids_must_be_in_the_vocabulary() {
    for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                            "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                            "tokenizer.ggml.eot_token_id", "tokenizer.ggml.fim_pre_token_id"}) {
      const Status st = tokenizer_with([&](GgufWriter& w) { w.set(key, GgufWriteValue::u32(100000)); });
      QVERIFY2(!st.is_ok(), key);
      QVERIFY2(st.message().find(key) != std::string::npos && st.message().find("outside the vocabulary") != std::string::npos,
               st.message().c_str());
    }
    EXPECT_REFUSED(tokenizer_with([](GgufWriter& w) { w.set("tokenizer.ggml.eos_token_id", GgufWriteValue::i32(-7)); }),
                   "tokenizer.ggml.eos_token_id");
    EXPECT_REFUSED(tokenizer_with([](GgufWriter& w) { w.set("tokenizer.ggml.bos_token_id", GgufWriteValue::string("1")); }),
                   "tokenizer.ggml.bos_token_id");
    // -1 and the uint32 0xFFFFFFFF are the converters' "none" (stories260K's
    // padding_token_id): accepted as no such token.
    QVERIFY(tokenizer_with([](GgufWriter& w) { w.set("tokenizer.ggml.padding_token_id", GgufWriteValue::u32(0xFFFFFFFFu)); }).is_ok());
    QVERIFY(tokenizer_with([](GgufWriter& w) { w.set("tokenizer.ggml.eot_token_id", GgufWriteValue::i32(-1)); }).is_ok());
    // Through the model loader and info, too.
    const std::string path = model_with_meta("phaselab_test_bad_bos.gguf", [](GgufWriter& w) {
      w.set("tokenizer.ggml.bos_token_id", GgufWriteValue::u32(279));  // the tiny vocabulary has 279 tokens
    });
    EXPECT_REFUSED(load_status(path), "tokenizer.ggml.bos_token_id");
    expect_info_refuses(path, "tokenizer.ggml.bos_token_id");
  }

  void tokenizer_arrays_must_have_their_element_type_and_length() {
    auto ints = [](size_t n, int32_t v) { return std::vector<int32_t>(n, v); };
    EXPECT_REFUSED(tokenizer_with([&](GgufWriter& w) { w.set("tokenizer.ggml.scores", GgufWriteValue::i32_array(ints(279, 0))); }),
                   "tokenizer.ggml.scores must be an array of float32");
    EXPECT_REFUSED(tokenizer_with([&](GgufWriter& w) {
                     std::vector<GgufWriteValue> v(279, GgufWriteValue::f64(0));
                     w.set("tokenizer.ggml.scores", GgufWriteValue::array(GgufValueType::FLOAT64, v));
                   }),
                   "tokenizer.ggml.scores must be an array of float32");
    EXPECT_REFUSED(tokenizer_with([](GgufWriter& w) { w.set("tokenizer.ggml.scores", GgufWriteValue::f32_array({0.f, 1.f})); }),
                   "tokenizer.ggml.scores has 2 entries");
    EXPECT_REFUSED(tokenizer_with([](GgufWriter& w) { w.set("tokenizer.ggml.scores", GgufWriteValue::f32(0.f)); }),
                   "tokenizer.ggml.scores must be an array of float32");
    EXPECT_REFUSED(tokenizer_with([&](GgufWriter& w) {
                     std::vector<GgufWriteValue> v(279, GgufWriteValue::u8(1));
                     w.set("tokenizer.ggml.token_type", GgufWriteValue::array(GgufValueType::UINT8, v));
                   }),
                   "tokenizer.ggml.token_type must be an array of int32");
    EXPECT_REFUSED(tokenizer_with([&](GgufWriter& w) {
                     w.set("tokenizer.ggml.token_type", GgufWriteValue::f32_array(std::vector<float>(279, 1.f)));
                   }),
                   "tokenizer.ggml.token_type must be an array of int32");
    EXPECT_REFUSED(tokenizer_with([&](GgufWriter& w) { w.set("tokenizer.ggml.token_type", GgufWriteValue::i32_array(ints(300, 1))); }),
                   "tokenizer.ggml.token_type has 300 entries");
  }

  void empty_metadata_key() {
    Raw r;
    r.header(0, 2).kv_u32("general.alignment", 32).kv_u32("", 1).zeros(8);
    EXPECT_INVALID(r.b, "key #1");
    EXPECT_INVALID(r.b, "empty");
  }

  // Float arrays read as integers (a per-layer hyperparameter written as
  // floats): NaN and out-of-range values do not reach an undefined cast.
  void float_elements_read_as_integers_are_clamped() {
    GgufWriter w;
    w.set("f", GgufWriteValue::f32_array({1e30f, -1e30f, std::nanf(""), 3.9f}));
    auto f = GgufFile::from_bytes(w.serialize(), "f.gguf");
    QVERIFY(f.is_ok());
    const GgufValue* v = (*f)->find("f");
    QCOMPARE(v->int_at(0), INT64_MAX);
    QCOMPARE(v->int_at(1), INT64_MIN);
    QCOMPARE(v->int_at(2), int64_t(0));
    QCOMPARE(v->int_at(3), int64_t(3));
  }

  // ---- model paths that are not regular files ------------------------------

  void a_directory_is_not_a_model() {
    auto f = GgufFile::open(QDir::tempPath().toStdString());
    QVERIFY(!f.is_ok());
    QVERIFY2(f.status().message().find("is a directory") != std::string::npos, f.status().message().c_str());
    EXPECT_CLI_ERROR(cli({"info", QDir::tempPath()}), "directory");
  }

  // Opening a FIFO for reading waits for a writer: every command that takes
  // a model must refuse one at once instead.
  void a_fifo_is_refused_at_once() {
    const QString fifo = QDir::temp().filePath("phaselab_test_model.fifo");
    QFile::remove(fifo);
    QVERIFY(mkfifo(fifo.toLocal8Bit().constData(), 0600) == 0);
    const QString stories = QString::fromStdString(phaselab::testing::test_data("stories260K.gguf"));
    QElapsedTimer t;
    t.start();
    EXPECT_CLI_ERROR(cli({"info", fifo}, 10000), "FIFO");
    EXPECT_CLI_ERROR(cli({"info", fifo, "--json"}, 10000), "FIFO");
    EXPECT_CLI_ERROR(cli({"generate", "-m", fifo, "-p", "x", "-n", "1"}, 10000), "FIFO");
    EXPECT_CLI_ERROR(cli({"generate", "-m", stories, "--draft", fifo, "-p", "x", "-n", "1"}, 10000), "FIFO");
    EXPECT_CLI_ERROR(cli({"tokenize", "-m", fifo, "x"}, 10000), "FIFO");
    QVERIFY2(t.elapsed() < 20000, "refusing the FIFO took too long");
    QFile::remove(fifo);
  }

  // Property: every truncation of a valid file, and random corruptions of it,
  // either load or fail with a message; none crashes or over-allocates.
  void truncations_and_corruptions_never_crash() {
    const auto good = valid_file();
    auto parsed = GgufFile::from_bytes(good, "good.gguf");
    QVERIFY(parsed.is_ok());
    const GgufTensorInfo* last = (*parsed)->find_tensor("b");
    const size_t data_end = (*parsed)->data_offset() + last->offset + last->n_bytes;
    for (size_t n = 0; n < good.size(); n++) {
      std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<long>(n));
      auto f = GgufFile::from_bytes(std::move(cut), "cut.gguf");
      // Only the trailing padding may be cut off without losing anything.
      QCOMPARE(f.is_ok(), n >= data_end);
      if (!f.is_ok()) QVERIFY(!f.status().message().empty());
    }
    std::mt19937 rng(1234);
    for (int iter = 0; iter < 3000; iter++) {
      auto bad = good;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < flips; k++) bad[rng() % 400] = static_cast<uint8_t>(rng());
      auto f = GgufFile::from_bytes(std::move(bad), "fuzz.gguf");
      if (!f.is_ok()) QVERIFY(!f.status().message().empty());
    }
  }
};

QTEST_GUILESS_MAIN(TestGguf)
#include "test_gguf.moc"
