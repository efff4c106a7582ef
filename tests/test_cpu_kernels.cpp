// Kernels of the fast CPU backend against the reference definitions:
//  - activation quantization of the SIMD path equals the portable one exactly;
//  - every dot product (portable and SIMD) equals the float dot of the
//    dequantized weights with the dequantized activations, up to float
//    rounding (integer sums are exact, only the scale products round).
#include <QtTest>

#include <tuple>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/ref_ops.h"
#include "phaselab/quant.h"
#include "test_util.h"

using namespace phaselab;
using namespace phaselab::cpu;

namespace {

using testing::randn;

// The exact value the quantized dot stands for: sum_i w_i * (d_a * q_a_i).
double exact_dot(TensorType t, const std::vector<uint8_t>& w, const std::vector<ActQ8>& a, int n) {
  std::vector<float> wf(n);
  if (!dequantize_row(t, w.data(), wf.data(), n)) qFatal("dequantize");
  double s = 0;
  for (int i = 0; i < n; i++) s += static_cast<double>(wf[i]) * a[i / 32].d * a[i / 32].qs[i % 32];
  return s;
}

// n_rows stored rows of f (f.row_bytes each) as the kernels other than dot1
// read them: rewritten by f.unpack where the format stores them packed.
std::vector<uint8_t> tile_rows(const RepackedFormat& f, const std::vector<uint8_t>& stored, int n_rows, int n) {
  if (!f.unpack) return stored;
  std::vector<uint8_t> out(f.unpacked_row_bytes * n_rows);
  for (int r = 0; r < n_rows; r++) f.unpack(stored.data() + r * f.row_bytes, out.data() + r * f.unpacked_row_bytes, n);
  return out;
}

// The attention kernels of a KV cache type on every kernel set, the
// portable first: run(k, s, out) fills the scores s (G, n; scale 0.125) of
// the query heads q against the key rows and adds the value rows weighted
// by p to out (G, HD; started at 1). Both are checked against the
// definition on the rows as stored (values[j]: row j as floats), and the
// weighted sums of the SIMD sets are bitwise equal. Returns what failed, or "".
template <typename Run>
std::string check_cache_kernels(int G, int HD, int n, const std::vector<float>& q, const std::vector<float>& p,
                                const std::vector<std::vector<float>>& values, Run run) {
  std::vector<const Kernels*> sets = simd_kernels();
  sets.insert(sets.begin(), &portable_kernels());
  std::vector<float> first_o;
  for (const Kernels* k : sets) {
    std::vector<float> s(G * n), out(G * HD, 1.f);
    run(k, s.data(), out.data());
    for (int g = 0; g < G; g++) {
      for (int j = 0; j < n; j++) {
        double want = 0;
        for (int i = 0; i < HD; i++) want += static_cast<double>(q[g * HD + i]) * values[j][i];
        want *= 0.125;
        if (!(std::fabs(s[g * n + j] - want) < 1e-5 * (1 + std::fabs(want)) * HD / 8))
          return std::string(k->isa) + ": score " + std::to_string(g) + "," + std::to_string(j);
      }
      for (int i = 0; i < HD; i++) {
        double want = 1.0;
        for (int j = 0; j < n; j++) want += static_cast<double>(p[g * n + j]) * values[j][i];
        if (!(std::fabs(out[g * HD + i] - want) < 1e-4 * (1 + std::fabs(want))))
          return std::string(k->isa) + ": weighted sum " + std::to_string(g) + "," + std::to_string(i);
      }
    }
    if (k == &portable_kernels()) continue;
    if (first_o.empty())
      first_o = out;
    else if (std::memcmp(out.data(), first_o.data(), out.size() * sizeof(float)) != 0)
      return std::string(k->isa) + ": weighted sums differ bitwise from the first SIMD set's";
  }
  return "";
}

}  // namespace

class TestCpuKernels : public QObject {
  Q_OBJECT
 private slots:
  void simd_kernels_are_available_on_this_machine() {
    // CI and development machines are x86-64 with AVX2: the fast path must
    // really be the SIMD one there, or the other tests compare portable to itself.
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
      QVERIFY(avx2_kernels() != nullptr);
      QVERIFY(QString(best_kernels().isa).startsWith("avx"));
    }
    // The machine's best instruction set is the one chosen.
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        !std::getenv("PHASELAB_CPU_ISA")) {
      QVERIFY(avx512_kernels() != nullptr);
      QCOMPARE(QString(best_kernels().isa), QString("avx512-vnni"));
    }
#endif
    QVERIFY(best_kernels().quantize_act != nullptr);
  }

  void activation_quantization_matches_portable_exactly() {
    const Kernels* simd = avx2_kernels();
    if (!simd) QSKIP("no AVX2 on this CPU");
    const int n = 1024;
    auto x = randn(n, 7);
    x[5] = 0;  // a block with a zero and one of all zeros
    std::fill(x.begin() + 64, x.begin() + 96, 0.f);
    std::vector<ActQ8> a(n / 32), b(n / 32);
    portable_kernels().quantize_act(x.data(), a.data(), n);
    simd->quantize_act(x.data(), b.data(), n);
    for (int i = 0; i < n / 32; i++) {
      QCOMPARE(a[i].d, b[i].d);
      QCOMPARE(a[i].s[0], b[i].s[0]);
      QCOMPARE(a[i].s[1], b[i].s[1]);
      QVERIFY(std::memcmp(a[i].qs, b[i].qs, 32) == 0);
      int s0 = 0, s1 = 0;
      for (int j = 0; j < 16; j++) s0 += a[i].qs[j], s1 += a[i].qs[j + 16];
      QCOMPARE(int(a[i].s[0]), s0);
      QCOMPARE(int(a[i].s[1]), s1);
      for (int j = 0; j < 32; j++) QVERIFY(std::fabs(x[i * 32 + j] - a[i].d * a[i].qs[j]) <= a[i].d * 0.5f + 1e-6f);
    }
  }

  void dot_products_match_the_dequantized_definition_data() {
    QTest::addColumn<int>("type");
    for (TensorType t : {TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1,
                         TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::MXFP4})
      QTest::newRow(std::string(tensor_type_name(t)).c_str()) << static_cast<int>(t);
  }
  void dot_products_match_the_dequantized_definition() {
    QFETCH(int, type);
    const auto t = static_cast<TensorType>(type);
    const int n = 2048;
    for (uint32_t seed = 1; seed <= 20; seed++) {
      const auto wf = randn(n, seed);
      std::vector<uint8_t> w(row_size(t, n));
      QVERIFY(quantize_row(t, wf.data(), w.data(), n));
      const auto x = randn(n, 1000 + seed);
      std::vector<ActQ8> a(n / 32);
      portable_kernels().quantize_act(x.data(), a.data(), n);
      const double want = exact_dot(t, w, a, n);
      const double tol = 1e-4 * (1.0 + std::fabs(want)) + 1e-3;
      const float got_p = portable_kernels().dot_q8[type](w.data(), a.data(), n);
      QVERIFY2(std::fabs(got_p - want) < tol, qPrintable(QString("portable %1 vs %2").arg(got_p).arg(want)));
      for (const Kernels* simd : simd_kernels()) {
        const float got_s = simd->dot_q8[type](w.data(), a.data(), n);
        QVERIFY2(std::fabs(got_s - want) < tol, qPrintable(QString("%1 %2 vs %3").arg(simd->isa).arg(got_s).arg(want)));
      }
      // AVX-VNNI and AVX-512 only replace how the integer sums are formed: same bits.
      const auto sets = simd_kernels();
      for (size_t i = 1; i < sets.size(); i++) {
        const float x0 = sets[0]->dot_q8[type](w.data(), a.data(), n);
        const float xi = sets[i]->dot_q8[type](w.data(), a.data(), n);
        QVERIFY2(std::memcmp(&x0, &xi, sizeof(float)) == 0, sets[i]->isa);
      }
    }
  }

  void four_row_kernels_equal_one_row_kernels_bitwise_data() { dot_products_match_the_dequantized_definition_data(); }
  void four_row_kernels_equal_one_row_kernels_bitwise() {
    QFETCH(int, type);
    const auto t = static_cast<TensorType>(type);
    const int n = 512, nb = n / 32;
    const auto wf = randn(n, 11);
    std::vector<uint8_t> w(row_size(t, n));
    QVERIFY(quantize_row(t, wf.data(), w.data(), n));
    const auto x = randn(4 * n, 12);
    std::vector<ActQ8> a(4 * nb);
    portable_kernels().quantize_act(x.data(), a.data(), 4 * n);
    std::vector<const Kernels*> sets = simd_kernels();
    sets.insert(sets.begin(), &portable_kernels());
    for (const Kernels* k : sets) {
      if (!k->dot_q8_x4[type]) continue;
      float four[4];
      k->dot_q8_x4[type](w.data(), a.data(), nb, n, four);
      for (int j = 0; j < 4; j++) {
        const float one = k->dot_q8[type](w.data(), a.data() + j * nb, n);
        QVERIFY2(std::memcmp(&one, &four[j], sizeof(float)) == 0, k->isa);
      }
    }
  }

  // Repacked formats (cpu::repacked_format: 8-block groups, half groups and
  // plain tail blocks of the 32-value formats; super-blocks of the K
  // formats) against the exact dot of the original row; four-token calls
  // bitwise equal to one-token calls; every ISA bitwise equal to the first.
  void repacked_formats_match_the_original_row_data() {
    QTest::addColumn<int>("type");
    QTest::addColumn<int>("n");
    for (TensorType t : {TensorType::Q5_0, TensorType::Q8_0, TensorType::Q4_0, TensorType::MXFP4}) {
      const std::string name(tensor_type_name(t));
      QTest::newRow((name + " 640: 2 groups + a half group").c_str()) << int(t) << 640;
      QTest::newRow((name + " 2048: 8 groups").c_str()) << int(t) << 2048;
      QTest::newRow((name + " 96: 3 plain blocks").c_str()) << int(t) << 96;
      QTest::newRow((name + " 736: 2 groups + a half group + 3 blocks").c_str()) << int(t) << 736;
      QTest::newRow((name + " 160: a half group + 1 block").c_str()) << int(t) << 160;
    }
    for (TensorType t : {TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K})
      for (int n : {256, 1024, 2048})
        QTest::newRow((std::string(tensor_type_name(t)) + " " + std::to_string(n)).c_str()) << int(t) << n;
  }
  void repacked_formats_match_the_original_row() {
    QFETCH(int, type);
    QFETCH(int, n);
    const auto tt = static_cast<TensorType>(type);
    const int nb = n / 32, gs = std::max<int>(act_groups(nb), 1);
    std::vector<float> first_isa;  // every ISA's results must equal the first one's bitwise
    int checked = 0;
    for (const Kernels* k : simd_kernels()) {
      const RepackedFormat f = repacked_format(*k, tt, n);
      if (!f.repack) continue;
      checked++;
      for (uint32_t seed = 1; seed <= 10; seed++) {
        const auto wf = randn(n, seed);
        std::vector<uint8_t> w(row_size(tt, n)), r(f.row_bytes);
        QVERIFY(quantize_row(tt, wf.data(), w.data(), n));
        if (tt == TensorType::MXFP4) {  // E8M0's subnormal scales (e = 0, 1) and a large one, in groups and the tail
          for (int b : {0, 1, nb - 1}) w[static_cast<size_t>(b) * 17] = static_cast<uint8_t>(b == 0 ? 0 : b == 1 ? 1 : 140);
          w[static_cast<size_t>(nb / 2) * 17] = 1;
        }
        f.repack(w.data(), r.data(), n);
        const auto x = randn(4 * n, 500 + seed);
        std::vector<ActQ8> a(4 * nb);
        k->quantize_act(x.data(), a.data(), 4 * n);
        std::vector<ActGroup> g(4 * gs);
        for (int t = 0; t < 4; t++) group_act(&a[t * nb], &g[t * gs], nb);
        float four[4];
        f.dot4(tile_rows(f, r, 1, n).data(), g.data(), gs, a.data(), nb, n, four);
        for (int t = 0; t < 4; t++) {
          std::vector<ActQ8> at(a.begin() + t * nb, a.begin() + (t + 1) * nb);
          const double want = exact_dot(tt, w, at, n);
          float one;
          f.dot1(r.data(), &g[t * gs], 0, &a[t * nb], 0, n, &one);
          QVERIFY2(std::fabs(one - want) < 1e-4 * (1.0 + std::fabs(want)) + 1e-3,
                   qPrintable(QString("%1 n=%2: %3 vs %4").arg(k->isa).arg(n).arg(one).arg(want)));
          QVERIFY(std::memcmp(&one, &four[t], sizeof(float)) == 0);
          const size_t idx = (seed - 1) * 4 + t;
          if (checked == 1)
            first_isa.push_back(one);
          else
            QVERIFY2(std::memcmp(&one, &first_isa[idx], sizeof(float)) == 0, k->isa);
        }
      }
    }
    // Every SIMD set repacks these formats (Q8_0: the VNNI ones only).
    if (!simd_kernels().empty() && tt != TensorType::Q8_0) QVERIFY2(checked > 0, "no SIMD kernel set repacks this format");
  }

  // The several-rows kernels: every (row, token) bitwise equal to the
  // one-row kernel, for each format and row shape.
  void several_row_kernels_equal_one_row_kernels_bitwise_data() {
    QTest::addColumn<int>("type");
    QTest::addColumn<int>("n");
    for (TensorType t : {TensorType::Q5_0, TensorType::Q8_0, TensorType::Q4_0, TensorType::MXFP4})
      for (int n : {640, 736, 2048}) QTest::newRow(qPrintable(QString("%1 x %2").arg(tensor_type_name(t).data()).arg(n))) << int(t) << n;
    QTest::newRow("Q4_K x 1024") << int(TensorType::Q4_K) << 1024;
    QTest::newRow("Q5_K x 512") << int(TensorType::Q5_K) << 512;
    QTest::newRow("Q6_K x 2048") << int(TensorType::Q6_K) << 2048;
  }
  void several_row_kernels_equal_one_row_kernels_bitwise() {
    QFETCH(int, type);
    QFETCH(int, n);
    const auto tt = static_cast<TensorType>(type);
    const int nb = n / 32, gs = std::max<int>(act_groups(nb), 1);
    int checked = 0;
    for (const Kernels* k : simd_kernels()) {
      const RepackedFormat f = repacked_format(*k, tt, n);
      if (!f.repack || !f.dot_tile) continue;
      checked++;
      const int R = k->repacked_rows, NT = k->repacked_tokens;
      QVERIFY(R >= 1 && R <= 4);
      QVERIFY(NT == 4 || NT == 8);
      const size_t rb = f.row_bytes;
      std::vector<uint8_t> packed(rb * R);
      for (int r = 0; r < R; r++) {
        const auto wf = randn(n, 40 + r);
        std::vector<uint8_t> w(row_size(tt, n));
        QVERIFY(quantize_row(tt, wf.data(), w.data(), n));
        f.repack(w.data(), packed.data() + r * rb, n);
      }
      // The rows as the kernels other than dot1 read them (packed Q5_0: unpacked).
      const std::vector<uint8_t> tiles = tile_rows(f, packed, R, n);
      const size_t tb = f.unpack ? f.unpacked_row_bytes : rb;
      const auto x = randn(NT * n, 77);
      std::vector<ActQ8> a(NT * nb);
      k->quantize_act(x.data(), a.data(), NT * n);
      std::vector<ActGroup> g(NT * gs);
      for (int t = 0; t < NT; t++) group_act(&a[t * nb], &g[t * gs], nb);
      float many[32], four[16], paired[32];
      f.dot_tile(tiles.data(), tb, g.data(), gs, a.data(), nb, n, many);
      // The paired kernel where the set has one (AVX-512: the 32-value formats).
      std::vector<ActPair> pairs(NT / 2 * gs);
      for (int p = 0; p < NT / 2; p++) pair_groups(&g[2 * p * gs], &g[(2 * p + 1) * gs], &pairs[p * gs], gs);
      // Written as out[token * stride + row], then added to (the refinement's way).
      constexpr int kStride = 5;
      float strided[8 * kStride], added[8 * kStride];
      if (f.dot_tile_pairs) {
        f.dot_tile_pairs(tiles.data(), tb, pairs.data(), gs, a.data(), nb, n, strided, kStride, false);
        for (int r = 0; r < R; r++)
          for (int t = 0; t < NT; t++) {
            paired[r * NT + t] = strided[t * kStride + r];
            added[t * kStride + r] = 0.25f * static_cast<float>(r + t);
          }
        f.dot_tile_pairs(tiles.data(), tb, pairs.data(), gs, a.data(), nb, n, added, kStride, true);
        for (int r = 0; r < R; r++)
          for (int t = 0; t < NT; t++) {
            const float want = 0.25f * static_cast<float>(r + t) + paired[r * NT + t];
            QVERIFY2(std::memcmp(&want, &added[t * kStride + r], sizeof(float)) == 0, "the paired tile's add mode");
          }
      }
      const bool avx512 = std::string_view(k->isa).find("512") != std::string_view::npos;
      QVERIFY2(!avx512 || f.dot_tile_pairs, "the AVX-512 kernels have a paired tile for every repacked format");
      QVERIFY(f.dot_tile4);
      f.dot_tile4(tiles.data(), tb, g.data(), gs, a.data(), nb, n, four);  // the first 4 tokens
      for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) {
          float v;
          f.dot1(packed.data() + r * rb, &g[t * gs], 0, &a[t * nb], 0, n, &v);
          QVERIFY2(std::memcmp(&v, &many[r * NT + t], sizeof(float)) == 0,
                   qPrintable(QString("%1 row %2 token %3: %4 vs %5").arg(k->isa).arg(r).arg(t).arg(v).arg(many[r * NT + t])));
          if (f.dot_tile_pairs)
            QVERIFY2(std::memcmp(&v, &paired[r * NT + t], sizeof(float)) == 0,
                     qPrintable(QString("%1 paired tile, row %2 token %3: %4 vs %5").arg(k->isa).arg(r).arg(t).arg(v).arg(paired[r * NT + t])));
          if (t < 4)
            QVERIFY2(std::memcmp(&v, &four[r * 4 + t], sizeof(float)) == 0,
                     qPrintable(QString("%1 4-token tile, row %2 token %3: %4 vs %5").arg(k->isa).arg(r).arg(t).arg(v).arg(four[r * 4 + t])));
        }
    }
    if (checked == 0 && !simd_kernels().empty()) {
      // Only the VNNI kernel sets take the grouped Q8_0 layout (with maddubs,
      // q + 128 would saturate int16); every other format must be checked.
      QVERIFY2(tt == TensorType::Q8_0, "no SIMD kernel set on this CPU repacks this format");
      QSKIP("no kernel set on this CPU repacks Q8_0: the grouped Q8_0 layout needs AVX-VNNI or AVX-512 VNNI");
    }
  }

  // Decode's several-rows kernels (kDecodeRows rows x one token, reading
  // the rows as stored, as dot1 does): every row bitwise dot1's, for each
  // format, packed or not, and row shape (whole groups, a half group, blocks
  // outside the groups), and for tokens of different activations.
  void decode_rows_equal_one_row_kernels_bitwise_data() { several_row_kernels_equal_one_row_kernels_bitwise_data(); }
  void decode_rows_equal_one_row_kernels_bitwise() {
    QFETCH(int, type);
    QFETCH(int, n);
    const auto tt = static_cast<TensorType>(type);
    const int nb = n / 32, gs = std::max<int>(act_groups(nb), 1);
    constexpr int kTokens = 3;
    int checked = 0;
    for (const Kernels* k : simd_kernels()) {
      const RepackedFormat f = repacked_format(*k, tt, n);
      const bool avx512 = std::string_view(k->isa).find("512") != std::string_view::npos;
      QVERIFY2(!avx512 || !f.repack || f.dot1_rows, "the AVX-512 kernels have decode rows for every repacked format");
      if (!f.dot1_rows) continue;
      checked++;
      const size_t rb = f.row_bytes;
      std::vector<uint8_t> stored(rb * kDecodeRows);
      for (int r = 0; r < kDecodeRows; r++) {
        auto wf = randn(n, 500 + r);
        if (r == 2) std::fill(wf.begin(), wf.begin() + 32, 0.f);  // a zero block
        std::vector<uint8_t> w(row_size(tt, n));
        QVERIFY(quantize_row(tt, wf.data(), w.data(), n));
        f.repack(w.data(), stored.data() + r * rb, n);
      }
      const auto x = randn(kTokens * n, 123);
      std::vector<ActQ8> a(kTokens * nb);
      k->quantize_act(x.data(), a.data(), kTokens * n);
      std::vector<ActGroup> g(kTokens * gs);
      for (int t = 0; t < kTokens; t++) group_act(&a[t * nb], &g[t * gs], nb);
      for (int t = 0; t < kTokens; t++) {
        float rows[kDecodeRows + 1];
        rows[kDecodeRows] = -7.f;
        // Prefetching (the rows ahead: here the same buffer's start, up to
        // its end), non-temporal or into L2, changes nothing.
        const size_t ahead = t >= 1 ? rb : 0;
        const PrefetchHint hint = t == 2 ? PrefetchHint::t1 : PrefetchHint::nta;
        f.dot1_rows(stored.data(), rb, &g[t * gs], &a[t * nb], n, rows, ahead, stored.data() + stored.size(), hint);
        QCOMPARE(rows[kDecodeRows], -7.f);  // nothing past the rows
        for (int r = 0; r < kDecodeRows; r++) {
          float v;
          f.dot1(stored.data() + r * rb, &g[t * gs], 0, &a[t * nb], 0, n, &v);
          QVERIFY2(std::memcmp(&v, &rows[r], sizeof(float)) == 0,
                   qPrintable(QString("%1 row %2 token %3: %4 vs %5").arg(k->isa).arg(r).arg(t).arg(v).arg(rows[r])));
        }
        // The refined decode rows: tokens t and t + 1 (stored one after the
        // other, as a token's activations and their residual are), each
        // sum bitwise dot1's.
        if (!f.dot1_rows2 || t + 1 >= kTokens) continue;
        float two[2 * kDecodeRows + 1];
        two[2 * kDecodeRows] = -7.f;
        f.dot1_rows2(stored.data(), rb, &g[t * gs], &a[t * nb], n, two, ahead, stored.data() + stored.size(), hint);
        QCOMPARE(two[2 * kDecodeRows], -7.f);
        for (int r = 0; r < kDecodeRows; r++)
          for (int j = 0; j < 2; j++) {
            float v;
            f.dot1(stored.data() + r * rb, &g[(t + j) * gs], 0, &a[(t + j) * nb], 0, n, &v);
            QVERIFY2(std::memcmp(&v, &two[r * 2 + j], sizeof(float)) == 0,
                     qPrintable(QString("%1 refined rows, row %2 token %3: %4 vs %5")
                                    .arg(k->isa).arg(r).arg(t + j).arg(v).arg(two[r * 2 + j])));
          }
      }
      const bool grouped = tt == TensorType::Q5_0 || tt == TensorType::Q8_0 || tt == TensorType::Q4_0 || tt == TensorType::MXFP4;
      QVERIFY2(!avx512 || !grouped || !f.repack || f.dot1_rows2, "the AVX-512 kernels have refined decode rows for the 32-value formats");
    }
    if (checked == 0) {
      for (const Kernels* k : simd_kernels())
        QVERIFY2(std::string_view(k->isa).find("512") == std::string_view::npos || !repacked_format(*k, tt, n).repack,
                 "an AVX-512 kernel set without decode rows");
      QSKIP("decode rows are AVX-512 kernels: this CPU has no AVX-512 VNNI");
    }
  }

  // Prefill's row tiles (16 rows interleaved, AVX-512) give bitwise the
  // one-token kernel's result for every row and token, for any number of
  // tokens (4 a call, then 3, 2 or 1), written at a row stride and in add
  // mode. Row widths: a half group alone, whole groups, groups and a half
  // group; widths with blocks outside them (736: 23 blocks) have none.
  void row_tiles_equal_one_row_kernels_bitwise_data() {
    QTest::addColumn<int>("type");
    QTest::addColumn<int>("n");
    for (TensorType t : {TensorType::Q5_0, TensorType::Q8_0})
      for (int n : {128, 256, 384, 640, 736, 2048})
        QTest::newRow(qPrintable(QString("%1 x %2").arg(tensor_type_name(t).data()).arg(n))) << int(t) << n;
  }
  void row_tiles_equal_one_row_kernels_bitwise() {
    QFETCH(int, type);
    QFETCH(int, n);
    const auto tt = static_cast<TensorType>(type);
    const int nb = n / 32, gs = std::max<int>(act_groups(nb), 1);
    constexpr int kTokens = 11, kStride = kRowTile + 3;
    int checked = 0;
    for (const Kernels* k : simd_kernels()) {
      const RepackedFormat f = repacked_format(*k, tt, n);
      if (!f.dot_row_tile) continue;
      QVERIFY(f.tile_rows);
      QVERIFY2(n % 128 == 0, "a row tile for a width with blocks outside the groups");
      checked++;
      const size_t rb = f.row_bytes;
      std::vector<uint8_t> stored(rb * kRowTile);
      for (int r = 0; r < kRowTile; r++) {
        auto wf = randn(n, 300 + r);
        if (r == 5) std::fill(wf.begin(), wf.begin() + 64, 0.f);  // zero blocks: +0 sums in some lanes
        std::vector<uint8_t> w(row_size(tt, n));
        QVERIFY(quantize_row(tt, wf.data(), w.data(), n));
        f.repack(w.data(), stored.data() + r * rb, n);
      }
      const std::vector<uint8_t> bytes = tile_rows(f, stored, kRowTile, n);
      std::vector<uint8_t> tile(row_tile_bytes(n) + 64);
      f.tile_rows(bytes.data(), f.unpack ? f.unpacked_row_bytes : rb, n, tile.data());
      const auto x = randn(kTokens * n, 99);
      std::vector<ActQ8> a(kTokens * nb);
      k->quantize_act(x.data(), a.data(), kTokens * n);
      std::vector<ActGroup> g(kTokens * gs);
      for (int t = 0; t < kTokens; t++) group_act(&a[t * nb], &g[t * gs], nb);
      // Every count of tokens up to kTokens: each tail (1, 2, 3) after 0, 1 or 2 calls of 4.
      for (int tokens = 1; tokens <= kTokens; tokens++) {
        std::vector<float> out(kTokens * kStride, -7.f), added(kTokens * kStride);
        f.dot_row_tile(tile.data(), a.data(), nb, n, tokens, out.data(), kStride, false);
        for (int t = 0; t < kTokens; t++)
          for (int r = 0; r < kStride; r++) added[t * kStride + r] = 0.25f * static_cast<float>(r + t);
        f.dot_row_tile(tile.data(), a.data(), nb, n, tokens, added.data(), kStride, true);
        for (int t = tokens; t < kTokens; t++) QCOMPARE(out[t * kStride], -7.f);  // nothing past the tokens asked for
        for (int t = 0; t < tokens; t++) {
          for (int r = 0; r < kRowTile; r++) {
            float v;
            f.dot1(stored.data() + r * rb, &g[t * gs], 0, &a[t * nb], 0, n, &v);
            QVERIFY2(std::memcmp(&v, &out[t * kStride + r], sizeof(float)) == 0,
                     qPrintable(QString("%1 row %2 token %3: %4 vs %5").arg(k->isa).arg(r).arg(t).arg(v).arg(out[t * kStride + r])));
            const float want = 0.25f * static_cast<float>(r + t) + v;
            QVERIFY2(std::memcmp(&want, &added[t * kStride + r], sizeof(float)) == 0, "the row tile's add mode");
          }
          for (int r = kRowTile; r < kStride; r++) QCOMPARE(out[t * kStride + r], -7.f);  // nothing past the tile's rows
        }
      }
    }
    if (checked == 0) {
      if (n % 128 != 0) return;  // no row tile for this width, as required
      bool avx512 = false;
      for (const Kernels* k : simd_kernels()) avx512 = avx512 || std::string_view(k->isa).find("512") != std::string_view::npos;
      QVERIFY2(!avx512, "the AVX-512 kernels have row tiles for Q5_0 and Q8_0");
      QSKIP("row tiles are AVX-512 kernels: this CPU has no AVX-512 VNNI");
    }
  }

  // Packed rows (the file's size: Q5_0, Q5_K, Q6_K) unpack to exactly the
  // byte layout the tile kernels read, by the portable reference and by each
  // kernel set's own unpacker; the row shapes cover full groups, a half
  // group and tail blocks. A high bit or a nibble put in the wrong place
  // fails here.
  void packed_rows_unpack_to_the_byte_layout_data() {
    QTest::addColumn<int>("type");
    QTest::addColumn<int>("n");
    for (int n : {640, 736, 2048, 96, 160, 32}) QTest::newRow(qPrintable(QString("Q5_0 x %1").arg(n))) << int(TensorType::Q5_0) << n;
    for (TensorType t : {TensorType::Q5_K, TensorType::Q6_K})
      for (int n : {256, 1024, 2048})
        QTest::newRow(qPrintable(QString("%1 x %2").arg(tensor_type_name(t).data()).arg(n))) << int(t) << n;
  }
  void packed_rows_unpack_to_the_byte_layout() {
    QFETCH(int, type);
    QFETCH(int, n);
    const auto t = static_cast<TensorType>(type);
    using Rewrite = void (*)(const uint8_t*, uint8_t*, int64_t);
    Rewrite to_bytes = repack_q5_0_u8_row, to_packed = repack_q5_0_packed_row, unpack = unpack_q5_0_packed_row;
    size_t bytes_size = grouped_row_bytes(t, n);
    UnpackRowFn Kernels::*simd_unpack = &Kernels::unpack_q5_0_packed;
    if (t == TensorType::Q5_K) {
      to_bytes = repack_q5_k_row, to_packed = repack_q5_k_packed_row, unpack = unpack_q5_k_packed_row;
      bytes_size = n / 256 * kGroupBytesQ5_K;
      simd_unpack = &Kernels::unpack_q5_k_packed;
    } else if (t == TensorType::Q6_K) {
      to_bytes = repack_q6_k_row, to_packed = repack_q6_k_packed_row, unpack = unpack_q6_k_packed_row;
      bytes_size = n / 256 * kGroupBytesQ6_K;
      simd_unpack = &Kernels::unpack_q6_k_packed;
    }
    const auto wf = randn(n, 21 + n + type);
    std::vector<uint8_t> w(row_size(t, n)), bytes(bytes_size), packed(w.size()), back(bytes_size, 0xAA);
    QVERIFY(quantize_row(t, wf.data(), w.data(), n));
    to_bytes(w.data(), bytes.data(), n);
    to_packed(w.data(), packed.data(), n);  // the file's size
    unpack(packed.data(), back.data(), n);
    QVERIFY2(back == bytes, "portable");
    int checked = 0;
    for (const Kernels* k : simd_kernels()) {
      if (!(k->*simd_unpack)) continue;
      checked++;
      const RepackedFormat f = repacked_format(*k, t, n);
      QCOMPARE(f.row_bytes, w.size());
      QCOMPARE(f.unpacked_row_bytes, bytes.size());
      std::fill(back.begin(), back.end(), 0x55);
      (k->*simd_unpack)(packed.data(), back.data(), n);
      QVERIFY2(back == bytes, k->isa);
    }
    const bool avx512 = !simd_kernels().empty() && std::string_view(simd_kernels().back()->isa).find("512") != std::string_view::npos;
    QVERIFY2(!avx512 || checked > 0, "the AVX-512 kernels store these formats packed");
  }

  // Compact Q4_K (the file's size) keeps the header and nibbles of the
  // byte-scale layout; its scales and mins come out as get_scale_min_k4
  // reads them, for every bit of the 12 packed bytes.
  void compact_q4_k_rows_keep_the_scales_and_nibbles() {
    std::mt19937 rng(5);
    for (int trial = 0; trial < 2000; trial++) {
      uint8_t s12[12];
      for (auto& b : s12) b = static_cast<uint8_t>(rng());
      uint64_t sc, mn;
      q4_k_scales_mins(s12, sc, mn);
      for (int j = 0; j < 8; j++) {
        uint8_t want_sc, want_m;
        get_scale_min_k4(j, s12, &want_sc, &want_m);
        QCOMPARE(static_cast<int>((sc >> (8 * j)) & 0xFF), static_cast<int>(want_sc));
        QCOMPARE(static_cast<int>((mn >> (8 * j)) & 0xFF), static_cast<int>(want_m));
      }
    }
    for (int n : {256, 1024, 2048}) {
      const auto wf = randn(n, 31 + n);
      std::vector<uint8_t> w(row_size(TensorType::Q4_K, n)), full(n / 256 * kGroupBytesQ4_K);
      std::vector<uint8_t> compact(n / 256 * kGroupBytesQ4_KC);
      QCOMPARE(compact.size(), w.size());
      QVERIFY(quantize_row(TensorType::Q4_K, wf.data(), w.data(), n));
      repack_q4_k_row(w.data(), full.data(), n);
      repack_q4_k_compact_row(w.data(), compact.data(), n);
      for (int b = 0; b < n / 256; b++) {
        const uint8_t* c = &compact[b * kGroupBytesQ4_KC];
        const uint8_t* f = &full[b * kGroupBytesQ4_K];
        uint64_t sc, mn;
        q4_k_scales_mins(c + 4, sc, mn);
        QVERIFY(std::memcmp(c, f, 4) == 0 && std::memcmp(&sc, f + 4, 8) == 0 && std::memcmp(&mn, f + 12, 8) == 0);
        QVERIFY(std::memcmp(c + 16, f + 32, 128) == 0);
      }
    }
    for (const Kernels* k : simd_kernels())
      QVERIFY2(repacked_format(*k, TensorType::Q4_K, 1024).row_bytes == 4 * kGroupBytesQ4_KC, k->isa);
  }

  // A tied Q8_0 embedding is looked up in the output matrix's repacked copy:
  // bitwise the floats of the file's row, for rows of full groups, a half
  // group and blocks left in the file's layout.
  void repacked_q8_0_rows_dequantize_as_the_file() {
    for (int n : {640, 736, 2048, 96, 128, 32}) {
      const auto wf = randn(n, 11 + n);
      std::vector<uint8_t> w(row_size(TensorType::Q8_0, n)), packed(grouped_row_bytes(TensorType::Q8_0, n));
      QVERIFY(quantize_row(TensorType::Q8_0, wf.data(), w.data(), n));
      repack_q8_0_u8_row(w.data(), packed.data(), n);
      std::vector<float> want(n), got(n, -1.f);
      QVERIFY(dequantize_row(TensorType::Q8_0, w.data(), want.data(), n));
      dequantize_q8_0_u8_row(packed.data(), got.data(), n);
      QVERIFY2(std::memcmp(want.data(), got.data(), n * sizeof(float)) == 0, qPrintable(QString("n = %1").arg(n)));
    }
  }

  void float_weight_dots_match_data() {
    QTest::addColumn<int>("type");
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16})
      QTest::newRow(std::string(tensor_type_name(t)).c_str()) << static_cast<int>(t);
  }
  void float_weight_dots_match() {
    QFETCH(int, type);
    const auto t = static_cast<TensorType>(type);
    const int n = 1000;  // not a multiple of 8: the tails are exercised
    const auto wf = randn(n, 3);
    std::vector<uint8_t> w(row_size(t, n));
    QVERIFY(quantize_row(t, wf.data(), w.data(), n));
    std::vector<float> back(n);
    QVERIFY(dequantize_row(t, w.data(), back.data(), n));
    const auto x = randn(n, 4);
    double want = 0;
    for (int i = 0; i < n; i++) want += static_cast<double>(back[i]) * x[i];
    QVERIFY(std::fabs(portable_kernels().dot_f32[type](w.data(), x.data(), n) - want) < 1e-3);
    if (const Kernels* simd = avx2_kernels()) QVERIFY(std::fabs(simd->dot_f32[type](w.data(), x.data(), n) - want) < 1e-3);
  }

  void weighted_sum_matches_the_definition_data() {
    QTest::addColumn<int>("G");
    QTest::addColumn<int>("HD");
    QTest::newRow("5 heads x 36: a partial group of 8 and a tail of 4 dims") << 5 << 36;
    QTest::newRow("6 heads x 128: AVX-512 blocks of 4 x 64, then 2 heads") << 6 << 128;
    QTest::newRow("4 heads x 256 (Gemma 3)") << 4 << 256;
  }
  void weighted_sum_matches_the_definition() {
    QFETCH(int, G);
    QFETCH(int, HD);
    const int n = 13;
    const auto p = randn(G * n, 21);
    std::vector<std::vector<float>> rows(n);
    std::vector<const float*> v(n);
    for (int k = 0; k < n; k++) {
      rows[k] = randn(HD, 100 + k);
      v[k] = rows[k].data();
    }
    std::vector<const Kernels*> sets = simd_kernels();
    sets.insert(sets.begin(), &portable_kernels());
    std::vector<float> first_simd;
    for (const Kernels* k : sets) {
      std::vector<float> out(G * HD, 1.f);
      k->weighted_sum(out.data(), HD, G, p.data(), n, v.data(), n, HD);
      for (int g = 0; g < G; g++)
        for (int i = 0; i < HD; i++) {
          double want = 1.0;
          for (int j = 0; j < n; j++) want += static_cast<double>(p[g * n + j]) * rows[j][i];
          QVERIFY2(std::fabs(out[g * HD + i] - want) < 1e-4, k->isa);
        }
      // Every SIMD build does the same fused multiply-adds in the same order.
      if (k == &portable_kernels()) continue;
      if (first_simd.empty())
        first_simd = out;
      else
        QVERIFY2(std::memcmp(out.data(), first_simd.data(), out.size() * sizeof(float)) == 0, k->isa);
    }
  }

  void attention_scores_match_the_definition_data() {
    QTest::addColumn<int>("G");
    QTest::addColumn<int>("HD");
    QTest::addColumn<int>("n");
    QTest::newRow("1 head x 8, 1 key (tiny models)") << 1 << 8 << 1;
    QTest::newRow("4 heads x 256, 7 keys (Gemma 3: pairs and a single)") << 4 << 256 << 7;
    QTest::newRow("7 heads x 64, 10 keys (4 + 3 heads)") << 7 << 64 << 10;
    QTest::newRow("2 heads x 36, 5 keys (no whole vectors)") << 2 << 36 << 5;
  }
  void attention_scores_match_the_definition() {
    QFETCH(int, G);
    QFETCH(int, HD);
    QFETCH(int, n);
    const auto q = randn(G * HD, 31);
    std::vector<std::vector<float>> rows(n);
    std::vector<const float*> k(n);
    for (int j = 0; j < n; j++) {
      rows[j] = randn(HD, 300 + j);
      k[j] = rows[j].data();
    }
    const float scale = 0.0625f;
    const int stride = n + 3;
    std::vector<const Kernels*> sets = simd_kernels();
    sets.insert(sets.begin(), &portable_kernels());
    for (const Kernels* ks : sets) {
      std::vector<float> s(G * stride, -7.f);
      ks->scores(s.data(), stride, G, q.data(), k.data(), n, HD, scale);
      for (int g = 0; g < G; g++) {
        for (int j = 0; j < n; j++) {
          double want = 0;
          for (int i = 0; i < HD; i++) want += static_cast<double>(q[g * HD + i]) * rows[j][i];
          want *= scale;
          QVERIFY2(std::fabs(s[g * stride + j] - want) < 1e-5 * (1 + std::fabs(want)), ks->isa);
        }
        for (int j = n; j < stride; j++) QCOMPARE(s[g * stride + j], -7.f);  // nothing written past n
      }
    }
  }

  // The RMS norm of every kernel set: bitwise the same as the portable
  // one's (each sums its squares in the same lanes, folded the same way),
  // within a float rounding or two of the definition, whole vectors or a
  // tail, in place or not.
  void rms_norm_is_bitwise_the_same_in_every_set() {
    std::vector<const Kernels*> sets = simd_kernels();
    sets.insert(sets.begin(), &portable_kernels());
    for (int n : {640, 256, 37, 16, 9, 1, 2053}) {
      auto x = randn(n, 40 + n, 3.f);
      x[n / 2] = 1e3f;  // one large value among small ones
      const auto w = randn(n, 50 + n);
      double ss = 0;
      for (float v : x) ss += static_cast<double>(v) * v;
      const double scale = 1.0 / std::sqrt(ss / n + 1e-6);
      std::vector<float> first;
      for (const Kernels* k : sets) {
        QVERIFY(k->rms_norm);
        std::vector<float> out(n, -7.f), inplace(x);
        k->rms_norm(out.data(), x.data(), w.data(), n, 1e-6f);
        k->rms_norm(inplace.data(), inplace.data(), w.data(), n, 1e-6f);
        for (int i = 0; i < n; i++) {
          const double want = x[i] * scale * w[i];
          QVERIFY2(std::fabs(out[i] - want) <= 3e-7 * std::fabs(want) + 1e-30, qPrintable(QString("%1 n=%2 i=%3").arg(k->isa).arg(n).arg(i)));
          QCOMPARE(inplace[i], out[i]);
        }
        if (first.empty())
          first = out;
        else
          QVERIFY2(std::memcmp(first.data(), out.data(), n * sizeof(float)) == 0, k->isa);
      }
    }
  }

  // u = act(g) * u for both gates in every set, against ref_ops (the
  // engine's gated FFN writes its result into the up rows).
  void gated_activations_write_the_up_rows() {
    std::vector<const Kernels*> sets = simd_kernels();
    sets.insert(sets.begin(), &portable_kernels());
    for (int n : {2048, 37, 8, 1}) {
      const auto g = randn(n, 60 + n, 2.f), u = randn(n, 70 + n);
      for (const Kernels* k : sets)
        for (const bool gelu : {true, false}) {
          const auto fn = gelu ? k->gelu_mul : k->silu_mul;
          QVERIFY(fn);
          std::vector<float> out(u);
          fn(g.data(), out.data(), n);
          for (int i = 0; i < n; i++) {
            const double want = (gelu ? ref::gelu_tanh(g[i]) : ref::silu(g[i])) * static_cast<double>(u[i]);
            QVERIFY2(std::fabs(out[i] - want) <= 1e-5 * (1 + std::fabs(want)),
                     qPrintable(QString("%1 %2 n=%3 i=%4").arg(k->isa).arg(gelu ? "gelu" : "silu").arg(n).arg(i)));
          }
        }
    }
  }

  void axpy_and_dot() {
    const auto a = randn(77, 5), b = randn(77, 6);
    for (const Kernels* k : {&portable_kernels(), avx2_kernels()}) {
      if (!k) continue;
      double want = 0;
      for (int i = 0; i < 77; i++) want += static_cast<double>(a[i]) * b[i];
      QVERIFY(std::fabs(k->dot(a.data(), b.data(), 77) - want) < 1e-4);
      std::vector<float> y(a);
      k->axpy(y.data(), 0.5f, b.data(), 77);
      for (int i = 0; i < 77; i++) QCOMPARE(y[i], a[i] + 0.5f * b[i]);
    }
  }

  // An F16 or BF16 KV cache: the 16-bit-row kernels against the definition
  // on the rows as stored (rounded to half or bfloat16), the weighted sums
  // of every SIMD set bitwise equal (the same FMAs per lane), and the
  // rounding itself bitwise equal to the portable round-to-nearest-even.
  // (The scores are sums over the head's dimension, which AVX-512 takes 16
  // lanes at a time and AVX2 8: close, not bitwise equal, as for an F32
  // cache.)
  void half_cache_kernels_match_the_definition_data() {
    QTest::addColumn<bool>("bf16");
    QTest::newRow("F16") << false;
    QTest::newRow("BF16") << true;
  }
  void half_cache_kernels_match_the_definition() {
    QFETCH(bool, bf16);
    using ScoresFn16 = decltype(Kernels::scores_f16);
    using SumFn16 = decltype(Kernels::weighted_sum_f16);
    using RoundFn = decltype(Kernels::to_f16);
    auto scores_of = [&](const Kernels* k) -> ScoresFn16 { return bf16 ? k->scores_bf16 : k->scores_f16; };
    auto sum_of = [&](const Kernels* k) -> SumFn16 { return bf16 ? k->weighted_sum_bf16 : k->weighted_sum_f16; };
    auto round_of = [&](const Kernels* k) -> RoundFn { return bf16 ? k->to_bf16 : k->to_f16; };
    auto round1 = [&](float x) { return bf16 ? fp32_to_bf16(x) : fp32_to_fp16(x); };
    auto widen1 = [&](uint16_t h) { return bf16 ? bf16_to_fp32(h) : fp16_to_fp32(h); };
    for (auto [G, HD, n] : {std::tuple{4, 256, 7}, std::tuple{7, 64, 10}, std::tuple{2, 36, 5}, std::tuple{1, 8, 1}}) {
      const auto q = randn(G * HD, 31);
      const auto p = randn(G * n, 21);
      std::vector<std::vector<uint16_t>> rows(n, std::vector<uint16_t>(HD));
      std::vector<std::vector<float>> widened(n, std::vector<float>(HD));
      std::vector<const uint16_t*> r(n);
      for (int j = 0; j < n; j++) {
        const auto f = randn(HD, 300 + j, 3.f);
        round_of(&portable_kernels())(f.data(), rows[j].data(), HD);
        for (int i = 0; i < HD; i++) {
          QCOMPARE(rows[j][i], round1(f[i]));
          widened[j][i] = widen1(rows[j][i]);
        }
        r[j] = rows[j].data();
      }
      for (const Kernels* k : simd_kernels()) {  // every set rounds as the portable one
        QVERIFY(round_of(k));
        std::vector<uint16_t> h(HD);
        const auto f = randn(HD, 300, 3.f);
        round_of(k)(f.data(), h.data(), HD);
        QVERIFY2(h == rows[0], k->isa);
      }
      const std::string failed = check_cache_kernels(G, HD, n, q, p, widened, [&](const Kernels* k, float* s, float* out) {
        if (!scores_of(k) || !sum_of(k)) qFatal("%s: no 16-bit cache kernels", k->isa);
        scores_of(k)(s, n, G, q.data(), r.data(), n, HD, 0.125f);
        sum_of(k)(out, HD, G, p.data(), n, r.data(), n, HD);
      });
      QVERIFY2(failed.empty(), failed.c_str());
    }
  }

  // A Q8_0 KV cache: the kernels against the definition on the rows as
  // stored (dequantized), the weighted sums of every SIMD set bitwise equal.
  void q8_0_cache_kernels_match_the_definition() {
    for (auto [G, HD, n] : {std::tuple{4, 256, 7}, std::tuple{7, 64, 10}, std::tuple{5, 32, 3}, std::tuple{1, 96, 1}}) {
      const auto q = randn(G * HD, 41);
      const auto p = randn(G * n, 42);
      const size_t row_bytes = HD / QK8_0 * sizeof(BlockQ8_0);
      std::vector<std::vector<uint8_t>> rows(n, std::vector<uint8_t>(row_bytes));
      std::vector<std::vector<float>> deq(n, std::vector<float>(HD));
      std::vector<const uint8_t*> r(n);
      for (int j = 0; j < n; j++) {
        const auto f = randn(HD, 400 + j, 3.f);
        QVERIFY(quantize_row(TensorType::Q8_0, f.data(), rows[j].data(), HD));
        QVERIFY(dequantize_row(TensorType::Q8_0, rows[j].data(), deq[j].data(), HD));
        r[j] = rows[j].data();
      }
      const std::string failed = check_cache_kernels(G, HD, n, q, p, deq, [&](const Kernels* k, float* s, float* out) {
        if (!k->scores_q8_0 || !k->weighted_sum_q8_0) qFatal("%s: no Q8_0 cache kernels", k->isa);
        k->scores_q8_0(s, n, G, q.data(), r.data(), n, HD, 0.125f);
        k->weighted_sum_q8_0(out, HD, G, p.data(), n, r.data(), n, HD);
      });
      QVERIFY2(failed.empty(), failed.c_str());
    }
  }
};

QTEST_APPLESS_MAIN(TestCpuKernels)
#include "test_cpu_kernels.moc"
