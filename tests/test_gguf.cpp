// GGUF reader and writer: round trips, and one malformed file per validation
// class, each of which must give an error naming the field (never a crash).
#include <QtTest>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "phaselab/gguf.h"
#include "phaselab/quant.h"

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

QTEST_APPLESS_MAIN(TestGguf)
#include "test_gguf.moc"
