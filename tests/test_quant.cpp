// Block formats: dequantization of hand-built blocks (values worked out by
// hand from the format's definition), and quantize -> dequantize round trips.
#include <QtTest>

#include <cmath>
#include <random>
#include <vector>

#include "phaselab/quant.h"

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
};

QTEST_APPLESS_MAIN(TestQuant)
#include "test_quant.moc"
