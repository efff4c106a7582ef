// Block formats: dequantization of hand-built blocks (values worked out by
// hand from the format's definition), and quantize -> dequantize round trips.
// Model quantization: llama.cpp's per-tensor type mix (type_for_tensor, a
// pure function), the file it writes, and that the file runs.
#include <QtTest>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <vector>

#include "phaselab/backend.h"
#include "phaselab/model.h"
#include "phaselab/quant.h"
#include "phaselab/quantize.h"
#include "phaselab/session.h"
#include "tiny_model.h"

using namespace phaselab;

namespace {

std::vector<float> dequant(TensorType t, const void* blocks, int n) {
  std::vector<float> out(n);
  const Status st = dequantize_row(t, blocks, out.data(), n);
  if (!st) qFatal("%s", st.message().c_str());
  return out;
}

std::vector<float> random_values(int n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Relative RMS error of a round trip through the type.
double round_trip_error(TensorType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_size(t, static_cast<int64_t>(x.size())));
  if (!quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()))) return 1e9;
  const auto y = dequant(t, q.data(), static_cast<int>(x.size()));
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); i++) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += x[i] * x[i];
  }
  return std::sqrt(num / den);
}

// The layers that llama.cpp's use_more_bits picks, written out by hand.
const std::set<int> kMoreBits32 = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
const std::set<int> kMoreBits26 = {0, 1, 2, 5, 8, 11, 14, 17, 20, 22, 23, 24, 25};
const std::set<int> kMoreBits18 = {0, 1, 4, 7, 10, 13, 15, 16, 17};

MixModelInfo llama_info(int n_layer, bool tied = false) {
  MixModelInfo m;
  m.arch = "llama";
  m.n_layer = n_layer;
  m.n_attn_v = n_layer;
  m.n_head = 32;
  m.n_head_kv = 8;
  m.tied_embeddings = tied;
  return m;
}

TensorType mix(FileType ft, const std::string& name, int64_t ne0, const MixModelInfo& m, int n_dims = 2,
               bool* fell_back = nullptr) {
  return type_for_tensor(ft, {name, TensorType::F16, n_dims, ne0}, m, fell_back);
}

std::string blk(int il, const char* t) { return "blk." + std::to_string(il) + "." + t; }

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); i++) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

std::vector<float> last_logits(const std::string& path, bool fast) {
  auto m = Model::load(path);
  if (!m) qFatal("load %s: %s", path.c_str(), m.status().message().c_str());
  auto b = fast ? make_cpu_backend(*m, 2, 16) : make_cpu_reference_backend(*m, 2, 16);
  if (!b) qFatal("%s", b.status().message().c_str());
  auto s = Session::create(*m, std::move(*b), 64);
  if (!s) qFatal("%s", s.status().message().c_str());
  std::vector<float> logits;
  const Status st = (*s)->eval({1, 260, 261, 262, 263, 100, 101, 102}, &logits);
  if (!st) qFatal("%s", st.message().c_str());
  return logits;
}

// A llama model whose matrices are 256 wide (so K-quants apply without
// fallback) with 8 layers (use_more_bits picks 0, 3, 6 and 7).
testing::TinySpec k_quant_spec() {
  testing::TinySpec s;
  s.arch = "llama";
  s.n_embd = 256;
  s.n_ff = 512;
  s.head_dim = 64;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_layer = 8;
  return s;
}

std::string temp_out(const char* name) { return QDir::temp().filePath(name).toStdString(); }

}  // namespace

class TestQuant : public QObject {
  Q_OBJECT
 private slots:
  void fp16_conversions_are_exact_where_representable() {
    QCOMPARE(fp16_to_fp32(0x3C00), 1.0f);
    QCOMPARE(fp16_to_fp32(0xC000), -2.0f);
    QCOMPARE(fp16_to_fp32(0x3800), 0.5f);
    QCOMPARE(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
    QCOMPARE(fp16_to_fp32(0x7BFF), 65504.0f);
    QVERIFY(std::isinf(fp16_to_fp32(0x7C00)));
    QVERIFY(std::isnan(fp16_to_fp32(0x7E00)));
    for (uint32_t h = 0; h < 0x10000; h++) {
      if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;  // NaN payloads
      QCOMPARE(fp32_to_fp16(fp16_to_fp32(static_cast<uint16_t>(h))), static_cast<uint16_t>(h));
    }
    QCOMPARE(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), uint16_t(0x3C00));  // tie to even
    QCOMPARE(fp32_to_fp16(1e6f), uint16_t(0x7C00));                           // overflow to inf
    QCOMPARE(bf16_to_fp32(0x3F80), 1.0f);
    QCOMPARE(fp32_to_bf16(-3.0f), uint16_t(0xC040));
  }

  void q4_0_hand_built_block() {
    BlockQ4_0 b{};
    b.d = fp32_to_fp16(0.5f);
    for (int j = 0; j < 16; j++) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    const auto y = dequant(TensorType::Q4_0, &b, 32);
    for (int j = 0; j < 16; j++) {
      QCOMPARE(y[j], (j - 8) * 0.5f);              // low nibbles: first half
      QCOMPARE(y[j + 16], ((15 - j) - 8) * 0.5f);  // high nibbles: second half
    }
  }

  void q4_1_hand_built_block() {
    BlockQ4_1 b{};
    b.d = fp32_to_fp16(0.25f);
    b.m = fp32_to_fp16(-1.0f);
    for (int j = 0; j < 16; j++) b.qs[j] = static_cast<uint8_t>(3 | (12 << 4));
    const auto y = dequant(TensorType::Q4_1, &b, 32);
    QCOMPARE(y[0], 3 * 0.25f - 1.0f);
    QCOMPARE(y[16], 12 * 0.25f - 1.0f);
  }

  void q5_0_hand_built_block() {
    BlockQ5_0 b{};
    b.d = fp32_to_fp16(2.0f);
    // value 0: low nibble 1, fifth bit set (bit 0 of qh) -> 17 - 16 = 1
    // value 16: high nibble 15, fifth bit set (bit 16 of qh) -> 31 - 16 = 15
    // value 1: low nibble 0, no fifth bit -> -16
    b.qs[0] = static_cast<uint8_t>(1 | (15 << 4));
    const uint32_t qh = (1u << 0) | (1u << 16);
    std::memcpy(b.qh, &qh, 4);
    const auto y = dequant(TensorType::Q5_0, &b, 32);
    QCOMPARE(y[0], 2.0f);
    QCOMPARE(y[16], 30.0f);
    QCOMPARE(y[1], -32.0f);
    QCOMPARE(y[17], -32.0f);
  }

  void q5_1_hand_built_block() {
    BlockQ5_1 b{};
    b.d = fp32_to_fp16(1.0f);
    b.m = fp32_to_fp16(0.5f);
    b.qs[3] = 0x0F;
    const uint32_t qh = 1u << 3;
    std::memcpy(b.qh, &qh, 4);
    const auto y = dequant(TensorType::Q5_1, &b, 32);
    QCOMPARE(y[3], 31.5f);
    QCOMPARE(y[19], 0.5f);
  }

  void q8_0_hand_built_block() {
    BlockQ8_0 b{};
    b.d = fp32_to_fp16(0.125f);
    for (int j = 0; j < 32; j++) b.qs[j] = static_cast<int8_t>(j - 16);
    const auto y = dequant(TensorType::Q8_0, &b, 32);
    for (int j = 0; j < 32; j++) QCOMPARE(y[j], (j - 16) * 0.125f);
  }

  void q4_k_hand_built_block() {
    BlockQ4_K b{};
    b.d = fp32_to_fp16(1.0f);
    b.dmin = fp32_to_fp16(0.5f);
    // Sub-block scales 1..8, mins 8..1 (6-bit, split over the 12 bytes).
    for (int j = 0; j < 4; j++) {
      b.scales[j] = static_cast<uint8_t>(j + 1);      // sc 0..3
      b.scales[j + 4] = static_cast<uint8_t>(8 - j);  // m 0..3
    }
    for (int j = 4; j < 8; j++) b.scales[j + 4] = static_cast<uint8_t>((j + 1) | ((8 - j) << 4));  // sc, m 4..7
    for (int l = 0; l < 128; l++) b.qs[l] = static_cast<uint8_t>(2 | (7 << 4));
    const auto y = dequant(TensorType::Q4_K, &b, 256);
    for (int s = 0; s < 8; s++) {
      const float sc = static_cast<float>(s + 1), m = static_cast<float>(8 - s);
      const float q = (s % 2 == 0) ? 2.f : 7.f;  // even sub-blocks: low nibbles
      for (int l = 0; l < 32; l++) QCOMPARE(y[32 * s + l], sc * q - 0.5f * m);
    }
  }

  void q5_k_hand_built_block() {
    BlockQ5_K b{};
    b.d = fp32_to_fp16(1.0f);
    b.dmin = fp32_to_fp16(1.0f);
    for (int j = 0; j < 4; j++) b.scales[j] = 1;        // scale 1 for sub-blocks 0..3
    for (int j = 4; j < 8; j++) b.scales[j + 4] = 1;    // scale 1, min 0 for 4..7
    for (int l = 0; l < 128; l++) b.qs[l] = static_cast<uint8_t>(3 | (5 << 4));
    // High bit of sub-block s is bit s of qh[l].
    for (int l = 0; l < 32; l++) b.qh[l] = static_cast<uint8_t>(l % 2 ? 0xAA : 0x55);
    const auto y = dequant(TensorType::Q5_K, &b, 256);
    for (int s = 0; s < 8; s++)
      for (int l = 0; l < 32; l++) {
        const int low = (s % 2 == 0) ? 3 : 5;
        const int hi = ((l % 2 ? 0xAA : 0x55) >> s) & 1;
        QCOMPARE(y[32 * s + l], static_cast<float>(low + 16 * hi));
      }
  }

  void q6_k_hand_built_block() {
    BlockQ6_K b{};
    b.d = fp32_to_fp16(0.5f);
    for (int s = 0; s < 16; s++) b.scales[s] = static_cast<int8_t>(s - 8);
    // Every 6-bit quant = 33 (low nibble 1, high bits 2) -> 33 - 32 = 1.
    for (auto& q : b.ql) q = 0x11;
    for (auto& q : b.qh) q = 0xAA;
    const auto y = dequant(TensorType::Q6_K, &b, 256);
    // Value i belongs to sub-block i / 16 in natural order.
    for (int i = 0; i < 256; i++) QCOMPARE(y[i], 0.5f * static_cast<float>((i / 16) - 8) * 1.f);
  }

  void round_trips_stay_within_the_format_precision_data() {
    QTest::addColumn<int>("type");
    QTest::addColumn<double>("max_rel_rms");
    QTest::newRow("F16") << int(TensorType::F16) << 1e-3;
    QTest::newRow("BF16") << int(TensorType::BF16) << 5e-3;
    QTest::newRow("Q8_0") << int(TensorType::Q8_0) << 0.01;
    QTest::newRow("Q6_K") << int(TensorType::Q6_K) << 0.04;
    QTest::newRow("Q5_0") << int(TensorType::Q5_0) << 0.06;
    QTest::newRow("Q5_1") << int(TensorType::Q5_1) << 0.06;
    QTest::newRow("Q5_K") << int(TensorType::Q5_K) << 0.08;
    QTest::newRow("Q4_0") << int(TensorType::Q4_0) << 0.12;
    QTest::newRow("Q4_1") << int(TensorType::Q4_1) << 0.12;
    QTest::newRow("Q4_K") << int(TensorType::Q4_K) << 0.15;
  }
  void round_trips_stay_within_the_format_precision() {
    QFETCH(int, type);
    QFETCH(double, max_rel_rms);
    const auto x = random_values(4096, 42);
    const double err = round_trip_error(static_cast<TensorType>(type), x);
    QVERIFY2(err < max_rel_rms, qPrintable(QString("relative RMS error %1").arg(err)));
  }

  void bad_row_length_is_an_error() {
    std::vector<float> out(40);
    std::vector<uint8_t> in(64);
    const Status st = dequantize_row(TensorType::Q8_0, in.data(), out.data(), 40);
    QVERIFY(!st.is_ok());
    QVERIFY(st.message().find("block size") != std::string::npos);
    QVERIFY(!dequantize_row(TensorType::Q2_K, in.data(), out.data(), 256).is_ok());
  }
  void k_quant_fits_beat_min_max_scaling() {
    // Levels fitted by least squares: below what plain min/max scaling
    // (PhaseLab's earlier quantizers) gives on the same values: Q4_K 0.0780,
    // Q5_K 0.0380, Q6_K 0.0187 (now about 0.071, 0.036, 0.017).
    const auto x = random_values(1 << 14, 7);
    const double q4 = round_trip_error(TensorType::Q4_K, x), q5 = round_trip_error(TensorType::Q5_K, x),
                 q6 = round_trip_error(TensorType::Q6_K, x);
    qInfo("relative RMS error: Q4_K %.4f, Q5_K %.4f, Q6_K %.4f", q4, q5, q6);
    QVERIFY2(q4 < 0.074, qPrintable(QString::number(q4)));
    QVERIFY2(q5 < 0.037, qPrintable(QString::number(q5)));
    QVERIFY2(q6 < 0.018, qPrintable(QString::number(q6)));
    // Outliers: one large value per block must not flatten the others to zero.
    auto y = random_values(4096, 9);
    for (size_t i = 0; i < y.size(); i += 256) y[i] = 12.f;
    QVERIFY(round_trip_error(TensorType::Q4_K, y) < 0.12);
    QVERIFY(round_trip_error(TensorType::Q6_K, y) < 0.04);
  }

  void file_type_names_and_values_are_llama_cpps() {
    QCOMPARE(uint32_t(*parse_file_type("Q4_K_M")), 15u);
    QCOMPARE(uint32_t(*parse_file_type("q4_k_s")), 14u);
    QCOMPARE(uint32_t(*parse_file_type("Q5_K_M")), 17u);
    QCOMPARE(uint32_t(*parse_file_type("Q5_K_S")), 16u);
    QCOMPARE(uint32_t(*parse_file_type("Q6_K")), 18u);
    QCOMPARE(uint32_t(*parse_file_type("Q8_0")), 7u);
    QCOMPARE(uint32_t(*parse_file_type("Q5_0")), 8u);
    QCOMPARE(uint32_t(*parse_file_type("Q4_0")), 2u);
    QCOMPARE(uint32_t(*parse_file_type("F16")), 1u);
    QCOMPARE(uint32_t(*parse_file_type("BF16")), 32u);
    QCOMPARE(uint32_t(*parse_file_type("F32")), 0u);
    QCOMPARE(*parse_file_type("Q4_K"), FileType::Q4_K_M);  // llama-quantize's aliases
    QCOMPARE(*parse_file_type("Q5_K"), FileType::Q5_K_M);
    QVERIFY(!parse_file_type("Q9_9"));
    QVERIFY(!parse_file_type("Q2_K"));  // no Q2_K/Q3_K quantizer in PhaseLab
    for (FileType t : supported_file_types()) QCOMPARE(*parse_file_type(file_type_name(t)), t);
    QCOMPARE(file_type_name_of(15), std::string("Q4_K_M"));
    QCOMPARE(file_type_name_of(12), std::string("Q3_K_M"));
    QCOMPARE(kQuantizationVersion, 2u);
  }

  // MXFP4 (OCP microscaling FP4): a block written by hand decodes to its
  // definition, E2M1 values times 2^(e - 127); quantizing values on that
  // grid gives the same bytes back; and the round trip of random values
  // stays within the format's step.
  void mxfp4_blocks_decode_and_encode_by_the_definition() {
    QCOMPARE(row_size(TensorType::MXFP4, 64), size_t(34));
    QCOMPARE(std::string(tensor_type_name(TensorType::MXFP4)), std::string("MXFP4"));
    QVERIFY(tensor_type_traits(39).has_value());
    uint8_t block[17];
    block[0] = 127 + 1;  // scale 2
    const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int j = 0; j < 16; j++) block[1 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    float out[32];
    QVERIFY(dequantize_row(TensorType::MXFP4, block, out, 32));
    for (int j = 0; j < 16; j++) {
      QCOMPARE(out[j], 2 * e2m1[j]);
      QCOMPARE(out[16 + j], 2 * e2m1[15 - j]);
    }
    // Values on the grid come back as the same bytes (the -0 nibble reads as
    // +0: the encoder's first choice).
    uint8_t again[17];
    QVERIFY(quantize_row(TensorType::MXFP4, out, again, 32));
    QCOMPARE(int(again[0]), int(block[0]));
    for (int j = 0; j < 16; j++) {
      QCOMPARE(kMxfp4Values[again[1 + j] & 15], kMxfp4Values[block[1 + j] & 15]);
      QCOMPARE(kMxfp4Values[again[1 + j] >> 4], kMxfp4Values[block[1 + j] >> 4]);
    }
    // E8M0's smallest scales are subnormal floats.
    QCOMPARE(mxfp4_half_scale(0), std::ldexp(1.f, -128));
    QCOMPARE(mxfp4_half_scale(1), std::ldexp(1.f, -127));
    QCOMPARE(mxfp4_half_scale(254), std::ldexp(1.f, 126));
    const auto x = random_values(4096, 3);
    QVERIFY(round_trip_error(TensorType::MXFP4, x) < 0.2);
  }

  void mxfp4_moe_mix_puts_the_experts_in_mxfp4() {
    const MixModelInfo m = llama_info(24, true);
    QCOMPARE(*parse_file_type("MXFP4_MOE"), FileType::MXFP4_MOE);
    QCOMPARE(uint32_t(FileType::MXFP4_MOE), 38u);
    QCOMPARE(mix(FileType::MXFP4_MOE, blk(3, "ffn_up_exps.weight"), 2880, m, 3), TensorType::MXFP4);
    QCOMPARE(mix(FileType::MXFP4_MOE, blk(3, "ffn_down_exps.weight"), 2880, m, 3), TensorType::MXFP4);
    QCOMPARE(mix(FileType::MXFP4_MOE, blk(3, "attn_v.weight"), 2880, m), TensorType::Q8_0);
    QCOMPARE(mix(FileType::MXFP4_MOE, blk(3, "ffn_down.weight"), 2880, m), TensorType::Q8_0);
    QCOMPARE(mix(FileType::MXFP4_MOE, "token_embd.weight", 2880, m), TensorType::Q8_0);
    QCOMPARE(mix(FileType::MXFP4_MOE, blk(3, "ffn_gate_inp.weight"), 2880, m), TensorType::F16);  // routers keep their type
  }

  void q4_k_m_mix_follows_use_more_bits_data() {
    QTest::addColumn<int>("n_layer");
    QTest::newRow("26 layers") << 26;
    QTest::newRow("32 layers") << 32;
  }
  void q4_k_m_mix_follows_use_more_bits() {
    QFETCH(int, n_layer);
    const auto& more = n_layer == 32 ? kMoreBits32 : kMoreBits26;
    const MixModelInfo m = llama_info(n_layer);
    for (int il = 0; il < n_layer; il++) {
      const TensorType hi = more.count(il) ? TensorType::Q6_K : TensorType::Q4_K;
      QCOMPARE(mix(FileType::Q4_K_M, blk(il, "attn_v.weight"), 4096, m), hi);
      QCOMPARE(mix(FileType::Q4_K_M, blk(il, "ffn_down.weight"), 14336, m), hi);
      QCOMPARE(mix(FileType::Q5_K_M, blk(il, "attn_v.weight"), 4096, m), more.count(il) ? TensorType::Q6_K : TensorType::Q5_K);
      QCOMPARE(mix(FileType::Q5_K_M, blk(il, "ffn_down.weight"), 14336, m), more.count(il) ? TensorType::Q6_K : TensorType::Q5_K);
      for (const char* t : {"attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight"}) {
        QCOMPARE(mix(FileType::Q4_K_M, blk(il, t), 4096, m), TensorType::Q4_K);
        QCOMPARE(mix(FileType::Q5_K_M, blk(il, t), 4096, m), TensorType::Q5_K);
      }
      // _S: more bits only at the start.
      QCOMPARE(mix(FileType::Q4_K_S, blk(il, "attn_v.weight"), 4096, m), il < 4 ? TensorType::Q5_K : TensorType::Q4_K);
      QCOMPARE(mix(FileType::Q4_K_S, blk(il, "ffn_down.weight"), 14336, m),
               il < n_layer / 8 ? TensorType::Q5_K : TensorType::Q4_K);
      QCOMPARE(mix(FileType::Q5_K_S, blk(il, "attn_v.weight"), 4096, m), TensorType::Q5_K);
      QCOMPARE(mix(FileType::Q5_K_S, blk(il, "ffn_down.weight"), 14336, m), TensorType::Q5_K);
      // Norms and biases are never quantized.
      QCOMPARE(mix(FileType::Q4_K_M, blk(il, "attn_norm.weight"), 4096, m, 1), TensorType::F16);
      QCOMPARE(type_for_tensor(FileType::Q4_K_M, {blk(il, "attn_q.bias"), TensorType::F32, 1, 4096}, m), TensorType::F32);
    }
  }

  void output_and_embeddings_follow_llama_cpp() {
    const MixModelInfo untied = llama_info(32), tied = llama_info(32, true);
    for (FileType ft : {FileType::Q4_K_M, FileType::Q4_K_S, FileType::Q5_K_M, FileType::Q6_K, FileType::Q4_0,
                        FileType::Q5_0, FileType::Q4_1, FileType::Q5_1})
      QCOMPARE(mix(ft, "output.weight", 4096, untied), TensorType::Q6_K);
    QCOMPARE(mix(FileType::Q8_0, "output.weight", 4096, untied), TensorType::Q8_0);
    // Untied token_embd keeps the base type; tied, it is the output matrix.
    QCOMPARE(mix(FileType::Q4_K_M, "token_embd.weight", 4096, untied), TensorType::Q4_K);
    QCOMPARE(mix(FileType::Q4_0, "token_embd.weight", 4096, untied), TensorType::Q4_0);
    QCOMPARE(mix(FileType::Q4_K_M, "token_embd.weight", 4096, tied), TensorType::Q6_K);
    QCOMPARE(mix(FileType::Q8_0, "token_embd.weight", 4096, tied), TensorType::Q8_0);
    // Gemma 3 270M: 640-wide rows are not a multiple of 256.
    bool fell = true;
    QCOMPARE(mix(FileType::Q4_K_M, "token_embd.weight", 640, tied, 2, &fell), TensorType::Q8_0);
    QVERIFY(!fell);  // the output rule picks Q8_0 itself
    QCOMPARE(mix(FileType::Q4_0, "token_embd.weight", 640, tied, 2, &fell), TensorType::Q8_0);
    QVERIFY(fell);  // Q6_K, then the fallback
    // F16/BF16/F32: every quantizable tensor, no mix.
    for (FileType ft : {FileType::F16, FileType::BF16, FileType::F32}) {
      const TensorType base = file_type_base_type(ft);
      QCOMPARE(mix(ft, "output.weight", 4096, untied), base);
      QCOMPARE(mix(ft, "token_embd.weight", 4096, tied), base);
      QCOMPARE(mix(ft, blk(0, "attn_v.weight"), 4096, untied), base);
      QCOMPARE(mix(ft, blk(0, "ffn_norm.weight"), 4096, untied, 1), TensorType::F16);
    }
  }

  void rows_not_a_multiple_of_256_fall_back() {
    const MixModelInfo m = llama_info(18, true);
    bool fell = false;
    QCOMPARE(mix(FileType::Q4_K_M, blk(2, "attn_q.weight"), 640, m, 2, &fell), TensorType::Q5_0);
    QVERIFY(fell);
    QCOMPARE(mix(FileType::Q5_K_M, blk(2, "attn_q.weight"), 640, m), TensorType::Q5_1);
    QCOMPARE(mix(FileType::Q4_K_M, blk(0, "attn_v.weight"), 640, m), TensorType::Q8_0);  // Q6_K -> Q8_0
    QCOMPARE(mix(FileType::Q6_K, blk(2, "attn_q.weight"), 640, m), TensorType::Q8_0);
    QCOMPARE(mix(FileType::Q4_K_M, blk(2, "attn_q.weight"), 96, m), TensorType::Q5_0);
    QCOMPARE(mix(FileType::Q4_K_M, blk(2, "attn_q.weight"), 100, m), TensorType::F16);   // not even 32-wide blocks
    QCOMPARE(mix(FileType::Q4_0, blk(2, "attn_q.weight"), 100, m), TensorType::F16);
    fell = true;
    QCOMPARE(mix(FileType::Q4_K_M, blk(2, "attn_output.weight"), 1024, m, 2, &fell), TensorType::Q4_K);
    QVERIFY(!fell);
  }

  void seventy_b_models_get_q5_k_attn_v() {
    MixModelInfo m = llama_info(80);
    QCOMPARE(mix(FileType::Q4_K_M, blk(10, "attn_v.weight"), 8192, m), TensorType::Q5_K);  // not use_more_bits
    QCOMPARE(mix(FileType::Q4_K_M, blk(12, "attn_v.weight"), 8192, m), TensorType::Q6_K);  // (12 - 80/8) % 3 == 2
    QCOMPARE(mix(FileType::Q4_K_S, blk(10, "attn_v.weight"), 8192, m), TensorType::Q5_K);
    QCOMPARE(mix(FileType::Q4_K_M, blk(10, "attn_q.weight"), 8192, m), TensorType::Q4_K);
    m.n_head_kv = m.n_head;  // llama's 65B: no GQA, no bump
    QCOMPARE(mix(FileType::Q4_K_M, blk(10, "attn_v.weight"), 8192, m), TensorType::Q4_K);
  }

  // The default model is llama.cpp's own Q4_K_M file: the plan for Q4_K_M
  // must give every tensor the type it already has.
  void plan_reproduces_llama_cpps_q4_k_m_of_the_default_model() {
    const std::string path = testing::default_model_path();
    if (path.empty()) QSKIP("default model (gemma-3-270m-q4_k_m.gguf) not found");
    auto f = GgufFile::open(path);
    QVERIFY(bool(f));
    auto plan = plan_quantization(**f, FileType::Q4_K_M);
    QVERIFY(bool(plan));
    for (const auto& p : *plan) QVERIFY2(!p.converted(), qPrintable(QString::fromStdString(p.name)));
    for (int il = 0; il < 18; il++)
      QCOMPARE((*f)->find_tensor(blk(il, "ffn_down.weight"))->type,
               kMoreBits18.count(il) ? TensorType::Q6_K : TensorType::Q4_K);
  }

  void quantized_tiny_model_has_the_mix_and_metadata_and_runs() {
    const std::string in = testing::write_tiny_model(k_quant_spec(), "quant_tiny_f32.gguf");
    const std::string out = temp_out("quant_tiny_q4_k_m.gguf");
    std::remove(out.c_str());
    size_t calls = 0, last_n = 0;
    uint64_t last_done = 0, last_total = 1;
    QuantizeOptions opts;
    opts.n_threads = 2;
    auto rep = quantize_model(in, out, FileType::Q4_K_M, opts, [&](size_t i, size_t n, uint64_t done, uint64_t total) {
      QCOMPARE(i, calls);
      calls++;
      last_n = n;
      last_done = done;
      last_total = total;
    });
    QVERIFY2(rep.is_ok(), rep.status().message().c_str());
    QCOMPARE(calls, last_n);
    QCOMPARE(last_done, last_total);
    QCOMPARE(rep->n_requantized, 0);
    auto f = GgufFile::open(out);
    QVERIFY(bool(f));
    QCOMPARE((*f)->get_int("general.file_type").value_or(-1), int64_t(15));
    QCOMPARE((*f)->get_int("general.quantization_version").value_or(-1), int64_t(2));
    QCOMPARE((*f)->get_string("general.architecture").value_or(""), std::string_view("llama"));
    for (int il = 0; il < 8; il++) {
      const bool more = il == 0 || il == 3 || il == 6 || il == 7;
      QCOMPARE((*f)->find_tensor(blk(il, "attn_v.weight"))->type, more ? TensorType::Q6_K : TensorType::Q4_K);
      QCOMPARE((*f)->find_tensor(blk(il, "ffn_down.weight"))->type, more ? TensorType::Q6_K : TensorType::Q4_K);
      QCOMPARE((*f)->find_tensor(blk(il, "attn_q.weight"))->type, TensorType::Q4_K);
      QCOMPARE((*f)->find_tensor(blk(il, "attn_norm.weight"))->type, TensorType::F32);
    }
    QCOMPARE((*f)->find_tensor("output.weight")->type, TensorType::Q6_K);
    // token_embd is 256 wide but untied: the base type.
    QCOMPARE((*f)->find_tensor("token_embd.weight")->type, TensorType::Q4_K);
    // It loads and runs, on both backends, close to the F32 original.
    const auto ref = last_logits(in, false);
    const auto q_ref = last_logits(out, false), q_fast = last_logits(out, true);
    const double c_ref = cosine(ref, q_ref), c_fast = cosine(ref, q_fast);
    QVERIFY2(c_ref > 0.95 && c_fast > 0.95, qPrintable(QString("cosine %1 %2").arg(c_ref).arg(c_fast)));
    std::remove(out.c_str());
    std::remove(in.c_str());
  }

  void every_file_type_writes_a_loadable_model_data() {
    QTest::addColumn<QString>("type");
    for (FileType t : supported_file_types()) QTest::newRow(std::string(file_type_name(t)).c_str()) << QString::fromStdString(std::string(file_type_name(t)));
  }
  void every_file_type_writes_a_loadable_model() {
    QFETCH(QString, type);
    const FileType ft = *parse_file_type(type.toStdString());
    // gemma3: tied embeddings, 64-wide rows (every K-quant falls back).
    const std::string in = testing::write_tiny_model(testing::tiny_spec("gemma3"), "quant_tiny_gemma.gguf");
    const std::string out = temp_out("quant_tiny_gemma_out.gguf");
    std::remove(out.c_str());
    auto rep = quantize_model(in, out, ft);
    QVERIFY2(rep.is_ok(), rep.status().message().c_str());
    auto f = GgufFile::open(out);
    QVERIFY(bool(f));
    QCOMPARE((*f)->get_int("general.file_type").value_or(-1), int64_t(ft));
    const MixModelInfo m = MixModelInfo::from_gguf(**f);
    QVERIFY(m.tied_embeddings);
    QCOMPARE(m.n_attn_v, 3);
    for (const auto& p : rep->tensors) QCOMPARE((*f)->find_tensor(p.name)->type, p.to);
    const double c = cosine(last_logits(in, false), last_logits(out, true));
    QVERIFY2(c > 0.95, qPrintable(QString("cosine %1").arg(c)));
    std::remove(out.c_str());
    std::remove(in.c_str());
  }

  void requantizing_copies_tensors_already_in_their_type() {
    testing::TinySpec s = k_quant_spec();
    s.matrix_type = TensorType::Q4_K;
    const std::string in = testing::write_tiny_model(s, "quant_tiny_q4k.gguf");
    const std::string out = temp_out("quant_tiny_requant.gguf");
    std::remove(out.c_str());
    auto rep = quantize_model(in, out, FileType::Q4_K_M);
    QVERIFY(rep.is_ok());
    // Only attn_v/ffn_down of 4 layers (Q6_K) and output (Q6_K) and
    // token_embd (F32 -> Q4_K) change; they count as requantized when they
    // were quantized.
    QCOMPARE(rep->n_converted, 4 * 2 + 2);
    QCOMPARE(rep->n_requantized, 4 * 2 + 1);
    auto fi = GgufFile::open(in);
    auto fo = GgufFile::open(out);
    const auto* a = (*fi)->find_tensor("blk.1.attn_q.weight");
    const auto* b = (*fo)->find_tensor("blk.1.attn_q.weight");
    QCOMPARE(a->n_bytes, b->n_bytes);
    QVERIFY(std::memcmp(a->data, b->data, a->n_bytes) == 0);
    std::remove(out.c_str());
    std::remove(in.c_str());
  }

  void quantize_refuses_its_input_and_cancels_cleanly() {
    const std::string in = testing::write_tiny_model(k_quant_spec(), "quant_tiny_guard.gguf");
    auto self = quantize_model(in, in, FileType::Q8_0);
    QVERIFY(!self.is_ok());
    QVERIFY(self.status().message().find("input file") != std::string::npos);
    const std::string out = temp_out("quant_tiny_cancel.gguf");
    std::remove(out.c_str());
    std::atomic<bool> cancel{false};
    auto rep = quantize_model(in, out, FileType::Q8_0, {}, [&](size_t i, size_t, uint64_t, uint64_t) {
      if (i == 3) cancel = true;
    }, &cancel);
    QVERIFY(!rep.is_ok());
    QCOMPARE(rep.status().code(), StatusCode::cancelled);
    QVERIFY(!QFile::exists(QString::fromStdString(out)));
    QVERIFY(QDir::temp().entryList({"quant_tiny_cancel.gguf.partial*"}).isEmpty());
    // An existing file is replaced only when asked.
    QVERIFY(quantize_model(in, out, FileType::Q8_0).is_ok());
    QVERIFY(!quantize_model(in, out, FileType::Q4_0).is_ok());
    QuantizeOptions force;
    force.overwrite = true;
    QVERIFY(quantize_model(in, out, FileType::Q4_0, force).is_ok());
    std::remove(out.c_str());
    std::remove(in.c_str());
  }
};

QTEST_APPLESS_MAIN(TestQuant)
#include "test_quant.moc"
