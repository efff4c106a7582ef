// Each CUDA kernel (kernels/kernels.h) against the CPU reference: NMSE
// <= 1e-7 for element-wise ops, <= 5e-4 for matrix products and attention,
// exact for the cache writes and sampling. Without a usable GPU every test
// reports SKIP with the CUDA runtime's reason.
#include <QtTest>

#include <map>
#include <numeric>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/ref_ops.h"
#include "kernels/kernels.h"
#include "phaselab/backend.h"
#include "phaselab/quant.h"
#include "phaselab/sampler.h"
#include "sampling/vocab_passes.h"
#include "test_util.h"

using namespace phaselab;

namespace {

// The reason CUDA cannot run here, or empty when it can.
QString cuda_unavailable() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return QString("CUDA unavailable: ") + cudaGetErrorString(e);
  if (n == 0) return "CUDA unavailable: no device";
  return {};
}

#define REQUIRE_GPU()                                          \
  do {                                                         \
    const QString why = cuda_unavailable();                    \
    if (!why.isEmpty()) QSKIP(qPrintable(why));                \
  } while (0)

#define CU(expr) QVERIFY2((expr) == cudaSuccess, #expr)

// A device copy of a host vector, freed with the object.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)); }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) { cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

using testing::nmse;
using testing::randn;

// x (T rows of n) as the matrix-vector kernels' integer path rounds it
// (cuda::Q8Act): per 32 values, d = max |x| / 127, q = x / d rounded to
// nearest even; returned as q * d. The kernels' integer dot products of
// the same quants then differ from a float product with these values only
// in the order of the sums.
std::vector<float> q8_rounded(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t b = 0; b < x.size() / 32; b++) {
    float amax = 0.f;
    for (int i = 0; i < 32; i++) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    for (int i = 0; i < 32; i++) r[b * 32 + i] = std::nearbyint(x[b * 32 + i] * id) * d;
  }
  return r;
}
// Scratch for the integer path of T rows of n values.
struct DevQ8 {
  Dev<int8_t> q;
  Dev<float> d;
  DevQ8(int T, int n) : q(static_cast<size_t>(T) * n), d(static_cast<size_t>(T) * n / 32) {}
  cuda::Q8Act act() const { return cuda::Q8Act{q.p, d.p, q.n}; }
};

// A paged K/V cache of n_ctx positions as the kernels see it: two layers
// (the second is used), the blocks in a shuffled order, so that the
// addressing through the block table and the block stride is checked, and
// two sequences' block tables one after the other (entry table_at(s) on).
struct PagedCache {
  int n_ctx, nkv, n_layer = 2, il = 1, n_blocks, used;
  std::vector<int> table;  // sequence 0's blocks, then sequence 1's
  PagedCache(int ctx, int n_embd_kv) : n_ctx(ctx), nkv(n_embd_kv) {
    used = (ctx + cuda::kKvBlockTokens - 1) / cuda::kKvBlockTokens;
    n_blocks = 2 * used + 3;
    if (n_blocks % 5 == 0) n_blocks++;  // distinct entries: 5 and n_blocks coprime
    for (int i = 0; i < 2 * used; i++) table.push_back((i * 5 + 2) % n_blocks);
  }
  int table_at(int seq) const { return seq * used; }
  size_t floats() const { return static_cast<size_t>(n_blocks) * n_layer * cuda::kKvBlockTokens * nkv; }
  // Where position pos's row of layer il lies in the pool for sequence seq.
  size_t row(int pos, int seq = 0) const {
    return ((static_cast<size_t>(table[table_at(seq) + pos / cuda::kKvBlockTokens]) * n_layer + il) *
                cuda::kKvBlockTokens + pos % cuda::kKvBlockTokens) * nkv;
  }
  cuda::KvPages pages(void* k, void* v, const int* dev_table, cuda::KvElem e = cuda::KvElem::f32) const {
    const size_t layer = cuda::kv_values_bytes(e, static_cast<size_t>(il) * cuda::kKvBlockTokens * nkv);
    return {static_cast<uint8_t*>(k) + layer, static_cast<uint8_t*>(v) + layer, dev_table,
            static_cast<size_t>(n_layer) * cuda::kKvBlockTokens * nkv, e};
  }
};

const char* elem_name(cuda::KvElem e) {
  return e == cuda::KvElem::f16 ? "f16" : e == cuda::KvElem::bf16 ? "bf16" : e == cuda::KvElem::q8_0 ? "q8_0" : "f32";
}

// Cache values stored as element type e on the device (rounded to nearest
// even, as the host's KV pool rounds; Q8_0 quantized as the host quantizes
// rows), and read back as floats.
struct DevKv {
  cuda::KvElem e;
  size_t n;
  void* p = nullptr;
  std::vector<float> rounded;  // the values as stored
  DevKv(const std::vector<float>& x, cuda::KvElem elem) : e(elem), n(x.size()), rounded(x) {
    cudaMalloc(&p, std::max<size_t>(cuda::kv_values_bytes(e, n), 1));
    if (e == cuda::KvElem::f32) {
      cudaMemcpy(p, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
      return;
    }
    if (e == cuda::KvElem::q8_0) {
      std::vector<uint8_t> q(cuda::kv_values_bytes(e, n));
      (void)quantize_row(TensorType::Q8_0, x.data(), q.data(), static_cast<int64_t>(n));
      (void)dequantize_row(TensorType::Q8_0, q.data(), rounded.data(), static_cast<int64_t>(n));
      cudaMemcpy(p, q.data(), q.size(), cudaMemcpyHostToDevice);
      return;
    }
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; i++) {
      h[i] = e == cuda::KvElem::f16 ? fp32_to_fp16(x[i]) : fp32_to_bf16(x[i]);
      rounded[i] = e == cuda::KvElem::f16 ? fp16_to_fp32(h[i]) : bf16_to_fp32(h[i]);
    }
    cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice);
  }
  ~DevKv() { cudaFree(p); }
  DevKv(const DevKv&) = delete;
  DevKv& operator=(const DevKv&) = delete;
  std::vector<float> get() const {
    std::vector<float> v(n);
    if (e == cuda::KvElem::f32) {
      cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost);
      return v;
    }
    if (e == cuda::KvElem::q8_0) {
      std::vector<uint8_t> q(cuda::kv_values_bytes(e, n));
      cudaMemcpy(q.data(), p, q.size(), cudaMemcpyDeviceToHost);
      (void)dequantize_row(TensorType::Q8_0, q.data(), v.data(), static_cast<int64_t>(n));
      return v;
    }
    std::vector<uint16_t> h(n);
    cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i++) v[i] = e == cuda::KvElem::f16 ? fp16_to_fp32(h[i]) : bf16_to_fp32(h[i]);
    return v;
  }
};
// Rounds x as element type e stores it.
std::vector<float> round_as(std::vector<float> x, cuda::KvElem e) {
  if (e == cuda::KvElem::q8_0) {
    std::vector<uint8_t> q(cuda::kv_values_bytes(e, x.size()));
    (void)quantize_row(TensorType::Q8_0, x.data(), q.data(), static_cast<int64_t>(x.size()));
    (void)dequantize_row(TensorType::Q8_0, q.data(), x.data(), static_cast<int64_t>(x.size()));
    return x;
  }
  for (float& v : x)
    if (e == cuda::KvElem::f16) v = fp16_to_fp32(fp32_to_fp16(v));
    else if (e == cuda::KvElem::bf16) v = bf16_to_fp32(fp32_to_bf16(v));
  return x;
}
constexpr cuda::KvElem kElems[] = {cuda::KvElem::f32, cuda::KvElem::f16, cuda::KvElem::bf16, cuda::KvElem::q8_0};

// Row t of a batch at position pos[t] of sequence seq[t], as device memory.
struct DevRows {
  std::vector<int> pos, at;
  int* p = nullptr;  // pos then at
  DevRows(const PagedCache& c, const std::vector<int>& positions, const std::vector<int>& seqs) : pos(positions) {
    for (int s : seqs) at.push_back(c.table_at(s));
    std::vector<int> both(pos);
    both.insert(both.end(), at.begin(), at.end());
    cudaMalloc(reinterpret_cast<void**>(&p), both.size() * sizeof(int));
    cudaMemcpy(p, both.data(), both.size() * sizeof(int), cudaMemcpyHostToDevice);
  }
  ~DevRows() { cudaFree(p); }
  DevRows(const DevRows&) = delete;
  DevRows& operator=(const DevRows&) = delete;
  cuda::RowMap map(int first = 0) const { return {p + first, p + pos.size() + first}; }
};

#define CHECK_NMSE(ref, got, bound)                                                              \
  do {                                                                                           \
    const double e_ = nmse(ref, got);                                                            \
    QVERIFY2(e_ <= (bound), qPrintable(QString("NMSE %1 > %2").arg(e_).arg(bound)));             \
  } while (0)

// A matrix of n_out rows of n_in values in the given format, and its
// dequantized copy.
struct Matrix {
  std::vector<uint8_t> data;
  std::vector<float> deq;
  size_t row_bytes = 0;
};
Matrix make_matrix(TensorType t, int n_in, int n_out, uint32_t seed) {
  Matrix m;
  m.row_bytes = row_size(t, n_in);
  m.data.resize(m.row_bytes * n_out);
  m.deq.resize(static_cast<size_t>(n_in) * n_out);
  const auto w = randn(static_cast<size_t>(n_in) * n_out, seed, 0.5f);
  for (int r = 0; r < n_out; r++) {
    (void)quantize_row(t, &w[static_cast<size_t>(r) * n_in], &m.data[r * m.row_bytes], n_in);
    (void)dequantize_row(t, &m.data[r * m.row_bytes], &m.deq[static_cast<size_t>(r) * n_in], n_in);
  }
  return m;
}

// out[t, r] = sum_i deq[r, i] * x[t, i], in double.
std::vector<float> ref_matmul(const Matrix& m, int n_in, int n_out, const std::vector<float>& x, int T) {
  std::vector<float> out(static_cast<size_t>(T) * n_out);
  for (int t = 0; t < T; t++)
    for (int r = 0; r < n_out; r++) {
      double s = 0;
      for (int i = 0; i < n_in; i++) s += static_cast<double>(m.deq[static_cast<size_t>(r) * n_in + i]) * x[static_cast<size_t>(t) * n_in + i];
      out[static_cast<size_t>(t) * n_out + r] = static_cast<float>(s);
    }
  return out;
}

}  // namespace

class TestCudaOps : public QObject {
  Q_OBJECT
 private slots:
  // What the CUDA runtime says about this machine, checked for substance.
  // Unavailable: a real error code, with the runtime's own name and
  // description (not "unknown"), which is the reason every other test SKIPs
  // with; and the engine's loader (probe_cuda through libphaselab_cuda.so)
  // passes the same reason on. Available: device 0's name, compute capability
  // and memory, as the runtime and the loader's probe report them.
  void availability_is_reported() {
    int count = -1;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      const QString name = cudaGetErrorName(e), what = cudaGetErrorString(e);
      qInfo("CUDA unavailable: %s (%s)", qPrintable(what), qPrintable(name));
      QVERIFY2(name.startsWith("cudaError") && name != "cudaErrorUnknown", qPrintable(name));
      QVERIFY2(what.size() > 3 && what != "unknown error" && !what.startsWith("unrecognized"), qPrintable(what));
      QCOMPARE(cuda_unavailable(), "CUDA unavailable: " + what);
#ifndef PHASELAB_CUDA_EMULATOR
      // The loader either finds no library (and says where it looked) or
      // the library's probe gives the runtime's reason.
      const CudaProbe probe = probe_cuda();
      QVERIFY(!probe.available);
      QVERIFY2(probe.reason.find(what.toStdString()) != std::string::npos ||
                   probe.reason.find("libphaselab_cuda") != std::string::npos,
               probe.reason.c_str());
#endif
      return;
    }
    // The runtime answers cudaErrorNoDevice rather than success with none.
    QVERIFY2(count >= 1, qPrintable(QString("cudaGetDeviceCount: success with %1 devices").arg(count)));
    QVERIFY(cuda_unavailable().isEmpty());
    cudaDeviceProp prop{};
    CU(cudaGetDeviceProperties(&prop, 0));
    const size_t name_len = strnlen(prop.name, sizeof prop.name);
    QVERIFY2(name_len > 0 && name_len < sizeof prop.name, "device 0 has no name");
    QVERIFY2(prop.major >= 5 && prop.minor >= 0, qPrintable(QString("compute %1.%2").arg(prop.major).arg(prop.minor)));
    QVERIFY(prop.multiProcessorCount > 0);
    QCOMPARE(prop.warpSize, 32);
    CU(cudaSetDevice(0));
    size_t free_b = 0, total_b = 0;
    CU(cudaMemGetInfo(&free_b, &total_b));
    QVERIFY(total_b >= (size_t{256} << 20));
    QVERIFY(free_b > 0 && free_b <= total_b);
    QCOMPARE(total_b, static_cast<size_t>(prop.totalGlobalMem));
    qInfo("CUDA device 0: %s, compute %d.%d, %d SMs, %zu MiB (%zu MiB free)", prop.name, prop.major, prop.minor,
          prop.multiProcessorCount, total_b >> 20, free_b >> 20);
#ifndef PHASELAB_CUDA_EMULATOR
    // The same device through the engine's loader, when the library is
    // there (a test run right after building only this test may lack it).
    const CudaProbe probe = probe_cuda();
    if (!probe.available) {
      QVERIFY2(probe.reason.find("libphaselab_cuda") != std::string::npos, probe.reason.c_str());
      return;
    }
    QVERIFY2(probe.description.find(prop.name) != std::string::npos, probe.description.c_str());
    QCOMPARE(probe.total_mem, total_b);
    QVERIFY(probe.free_mem > 0 && probe.free_mem <= probe.total_mem);
#endif
  }

  void rmsnorm_data() {
    QTest::addColumn<int>("n");
    QTest::newRow("640 (row in registers, 256 threads)") << 640;
    QTest::newRow("5000 (row in registers, 1024 threads)") << 5000;
    QTest::newRow("9000 (the looping kernel)") << 9000;
  }
  void rmsnorm() {
    REQUIRE_GPU();
    QFETCH(int, n);
    const int rows = 7;
    const auto x = randn(static_cast<size_t>(rows) * n, 1, 3.f), w = randn(n, 2);
    Dev<float> dx(x), dw(w), dout(x.size());
    CU(cuda::launch_rmsnorm(dx.p, dw.p, dout.p, rows, n, 1e-6f, nullptr));
    std::vector<float> want(x.size());
    for (int r = 0; r < rows; r++) ref::rmsnorm(&want[r * n], &x[r * n], w.data(), n, 1e-6f);
    CHECK_NMSE(want, dout.get(), 1e-7);
  }

  void add_rmsnorm_data() {
    QTest::addColumn<bool>("post_norm");
    QTest::addColumn<int>("n");
    QTest::newRow("Gemma: post-norm, add, pre-norm") << true << 640;
    QTest::newRow("llama: add, pre-norm") << false << 640;
    QTest::newRow("post-norm, 256 threads") << true << 2048;
    QTest::newRow("post-norm, 1024 threads") << true << 4096;
    QTest::newRow("post-norm, the looping kernel") << true << 8224;
  }
  void add_rmsnorm() {
    REQUIRE_GPU();
    QFETCH(bool, post_norm);
    QFETCH(int, n);
    const int rows = 5;
    const auto x = randn(static_cast<size_t>(rows) * n, 20, 4.f), y = randn(x.size(), 21, 2.f);
    const auto pw = randn(n, 22), w = randn(n, 23);
    Dev<float> dx(x), dy(y), dpw(pw), dw(w), dout(x.size());
    CU(cuda::launch_add_rmsnorm(dx.p, dy.p, post_norm ? dpw.p : nullptr, dw.p, dout.p, rows, n, 1e-6f, nullptr));
    std::vector<float> wx(x), wy(y), wout(x.size());
    for (int r = 0; r < rows; r++) {
      if (post_norm) ref::rmsnorm(&wy[r * n], &wy[r * n], pw.data(), n, 1e-6f);
      ref::add(&wx[r * n], &wy[r * n], n);
      ref::rmsnorm(&wout[r * n], &wx[r * n], w.data(), n, 1e-6f);
    }
    CHECK_NMSE(wx, dx.get(), 1e-7);  // the residual stream
    CHECK_NMSE(wout, dout.get(), 1e-7);
    // The output's 8-bit copy for the integer path, written by the norm
    // itself: bitwise what launch_quantize_q8 makes of that output.
    Dev<float> dx2(x), dout2(x.size());
    DevQ8 fused(rows, n), separate(rows, n);
    CU(cuda::launch_add_rmsnorm(dx2.p, dy.p, post_norm ? dpw.p : nullptr, dw.p, dout2.p, rows, n, 1e-6f, nullptr,
                                fused.act()));
    CU(cuda::launch_quantize_q8(dout2.p, rows, n, separate.act(), nullptr));
    QVERIFY(dout2.get() == dout.get());
    QVERIFY(fused.q.get() == separate.q.get());
    QVERIFY(fused.d.get() == separate.d.get());
    const auto q = fused.q.get();
    QVERIFY(std::any_of(q.begin(), q.end(), [](int8_t v) { return v == 127 || v == -127; }));
    // The same for the plain norm.
    DevQ8 fused2(rows, n);
    CU(cuda::launch_rmsnorm(dx.p, dw.p, dout2.p, rows, n, 1e-6f, nullptr, fused2.act()));
    CU(cuda::launch_quantize_q8(dout2.p, rows, n, separate.act(), nullptr));
    QVERIFY(fused2.q.get() == separate.q.get());
    QVERIFY(fused2.d.get() == separate.d.get());
  }

  void qk_norm_rope_store_data() {
    QTest::addColumn<bool>("qk_norm");
    QTest::addColumn<bool>("neox");
    QTest::addColumn<int>("n_rot");
    QTest::addColumn<bool>("freq_factors");
    QTest::newRow("Gemma 3 / Qwen 3: QK-norm, NeoX") << true << true << 256 << false;
    QTest::newRow("llama: normal rotation") << false << false << 256 << false;
    QTest::newRow("partial rotary (n_rot 64 of 256), NeoX") << false << true << 64 << false;
    QTest::newRow("partial rotary, normal rotation, QK-norm") << true << false << 64 << false;
    QTest::newRow("llama 3: frequency factors") << false << false << 256 << true;
  }
  void qk_norm_rope_store() {
    REQUIRE_GPU();
    QFETCH(bool, qk_norm);
    QFETCH(bool, neox);
    QFETCH(int, n_rot);
    QFETCH(bool, freq_factors);
    const int T = 3, NH = 4, NKVH = 2, HD = 256, NQ = NH * HD, NKV = NKVH * HD, n_ctx = 32, pos0 = 14;  // across a block edge
    const float base = 1e6f, eps = 1e-6f;
    const auto q = randn(static_cast<size_t>(T) * NQ, 24), k = randn(static_cast<size_t>(T) * NKV, 25),
               v = randn(static_cast<size_t>(T) * NKV, 26), qn = randn(HD, 27), kn = randn(HD, 28);
    std::vector<float> ff(n_rot / 2);
    for (int i = 0; i < n_rot / 2; i++) ff[i] = 1.f + 0.25f * static_cast<float>(i % 5);
    Dev<float> dq(q), dk(k), dv(v), dqn(qn), dkn(kn), dff(ff);
    const PagedCache cache(n_ctx, NKV);
    Dev<int> dtable(cache.table);
    // Rows of two sequences: the first's positions 14 and 16 (across a block
    // edge), the second's 16 between them.
    const std::vector<int> pos{pos0, pos0 + 2, pos0 + 2}, seq{0, 1, 0};
    const float mscale = freq_factors ? 1.19f : 1.f;  // phi3's attn_factor goes with its factors
    const DevRows rows(cache, pos, seq);
    std::vector<float> wq(q), wk(k), wkc(cache.floats(), 0.f), wvc(wkc), cs(n_rot);
    for (int t = 0; t < T; t++) {
      ref::rope_angles(cs.data(), n_rot, pos[t], base, freq_factors ? ff.data() : nullptr, mscale);
      for (int h = 0; h < NH; h++) {
        float* qh = &wq[static_cast<size_t>(t) * NQ + h * HD];
        if (qk_norm) ref::rmsnorm(qh, qh, qn.data(), HD, eps);
        ref::rope_apply(qh, n_rot, cs.data(), neox);
      }
      for (int h = 0; h < NKVH; h++) {
        float* kh = &wk[static_cast<size_t>(t) * NKV + h * HD];
        if (qk_norm) ref::rmsnorm(kh, kh, kn.data(), HD, eps);
        ref::rope_apply(kh, n_rot, cs.data(), neox);
      }
      std::copy_n(&wk[static_cast<size_t>(t) * NKV], NKV, &wkc[cache.row(pos[t], seq[t])]);
      std::copy_n(&v[static_cast<size_t>(t) * NKV], NKV, &wvc[cache.row(pos[t], seq[t])]);
    }
    // The cache in each element type: K within rounding of the float
    // result, V rounded exactly as the host rounds.
    for (const cuda::KvElem e : kElems) {
      const std::vector<float> zeros(cache.floats(), 0.f);
      DevKv kc(zeros, e), vc(zeros, e);
      Dev<float> dq2(q);
      CU(cuda::launch_qk_norm_rope_store(dq2.p, dk.p, dv.p, qk_norm ? dqn.p : nullptr, qk_norm ? dkn.p : nullptr,
                                         cache.pages(kc.p, vc.p, dtable.p, e), rows.map(), T, NH, NKVH, HD, n_rot,
                                         base, freq_factors ? dff.p : nullptr, mscale, neox, eps, nullptr));
      qInfo("K/V cache of %s", elem_name(e));
      CHECK_NMSE(wq, dq2.get(), 1e-7);
      QVERIFY(dk.get() == k);  // k itself is left alone: attention reads the cache
      CHECK_NMSE(round_as(wkc, e), kc.get(), e == cuda::KvElem::f32 ? 1e-7 : e == cuda::KvElem::f16 ? 1e-6 : 1e-4);
      QVERIFY(vc.get() == round_as(wvc, e));  // V is copied as it is, rounded (quantized) as the host does
    }
    // The same with the inverse frequencies from a table (the backend's
    // way): the angles reduced in double, sines and cosines in float.
    std::vector<double> inv(n_rot / 2);
    cuda::rope_inv_freq(base, n_rot, freq_factors ? ff.data() : nullptr, inv.data());
    Dev<double> dinv(inv);
    const std::vector<float> zeros(cache.floats(), 0.f);
    DevKv kc(zeros, cuda::KvElem::f32), vc(zeros, cuda::KvElem::f32);
    Dev<float> dq3(q);
    CU(cuda::launch_qk_norm_rope_store(dq3.p, dk.p, dv.p, qk_norm ? dqn.p : nullptr, qk_norm ? dkn.p : nullptr,
                                       cache.pages(kc.p, vc.p, dtable.p, cuda::KvElem::f32), rows.map(), T, NH, NKVH,
                                       HD, n_rot, base, nullptr, mscale, neox, eps, nullptr, dinv.p));
    CHECK_NMSE(wq, dq3.get(), 1e-7);
    CHECK_NMSE(wkc, kc.get(), 1e-7);
  }

  // Q, K and V with their QK-norm, RoPE and cache store as the product's
  // tails (QkRope; one token: each head by the last of its blocks) against
  // the product and launch_qk_norm_rope_store launched apart: q, k, v and
  // the cache bitwise equal, in every cache type, the counters back at
  // zero (and a second launch alike); 3 tokens take the separate launch.
  void qkv_products_with_rope_tail() {
    REQUIRE_GPU();
    const int n_in = 256, NH = 4, NKVH = 2, HD = 64, NQ = NH * HD, NKV = NKVH * HD, n_rot = HD;
    const Matrix mq = make_matrix(TensorType::Q8_0, n_in, NQ, 60), mk = make_matrix(TensorType::Q4_K, n_in, NKV, 61),
                 mv = make_matrix(TensorType::Q8_0, n_in, NKV, 62);
    Dev<uint8_t> dmq(mq.data), dmk(mk.data), dmv(mv.data);
    const auto qn = randn(HD, 63), kn = randn(HD, 64);
    Dev<float> dqn(qn), dkn(kn);
    const PagedCache cache(32, NKV);
    Dev<int> dtable(cache.table);
    for (int T : {1, 3}) {
      const auto x = randn(static_cast<size_t>(T) * n_in, 65 + T);
      Dev<float> dx(x);
      std::vector<int> pos, seq;
      for (int t = 0; t < T; t++) pos.push_back(15 + t), seq.push_back(t % 2);
      const DevRows rows(cache, pos, seq);
      Dev<unsigned> counters(std::vector<unsigned>(NH + NKVH, 0));
      for (const cuda::KvElem e : kElems) {
        const std::vector<float> zeros(cache.floats(), 0.f);
        auto rope_of = [&](const DevKv& kc, const DevKv& vc) {
          cuda::QkRope r;
          r.q_norm = dqn.p;
          r.k_norm = dkn.p;
          r.cache = cache.pages(kc.p, vc.p, dtable.p, e);
          r.rows = rows.map();
          r.n_head = NH;
          r.n_head_kv = NKVH;
          r.head_dim = HD;
          r.n_rot = n_rot;
          r.base = 1e4f;
          r.neox = true;
          r.eps = 1e-6f;
          r.head_counters = counters.p;
          return r;
        };
        // Apart.
        DevKv kc1(zeros, e), vc1(zeros, e);
        Dev<float> q1(static_cast<size_t>(T) * NQ), k1(static_cast<size_t>(T) * NKV), v1(k1.n);
        DevQ8 in1(T, n_in);
        CU(cuda::launch_matvec3({dmq.p, TensorType::Q8_0, mq.row_bytes, NQ, q1.p},
                                {dmk.p, TensorType::Q4_K, mk.row_bytes, NKV, k1.p},
                                {dmv.p, TensorType::Q8_0, mv.row_bytes, NKV, v1.p}, n_in, dx.p, T, nullptr, in1.act()));
        const cuda::QkRope r1 = rope_of(kc1, vc1);
        CU(cuda::launch_qk_norm_rope_store(q1.p, k1.p, v1.p, r1.q_norm, r1.k_norm, r1.cache, r1.rows, T, NH, NKVH, HD,
                                           n_rot, r1.base, nullptr, 1.f, true, r1.eps, nullptr));
        for (int launch = 0; launch < 2; launch++) {
          DevKv kc2(zeros, e), vc2(zeros, e);
          Dev<float> q2(q1.n), k2(k1.n), v2(v1.n);
          DevQ8 in2(T, n_in);
          const cuda::QkRope r2 = rope_of(kc2, vc2);
          CU(cuda::launch_matvec3({dmq.p, TensorType::Q8_0, mq.row_bytes, NQ, q2.p},
                                  {dmk.p, TensorType::Q4_K, mk.row_bytes, NKV, k2.p},
                                  {dmv.p, TensorType::Q8_0, mv.row_bytes, NKV, v2.p}, n_in, dx.p, T, nullptr, in2.act(),
                                  &r2));
          QVERIFY(q2.get() == q1.get());
          QVERIFY(k2.get() == k1.get());
          QVERIFY(v2.get() == v1.get());
          QVERIFY(kc2.get() == kc1.get());
          QVERIFY(vc2.get() == vc1.get());
          const auto c = counters.get();
          QVERIFY(std::all_of(c.begin(), c.end(), [](unsigned u) { return u == 0; }));
        }
        const auto kc = kc1.get();
        QVERIFY(std::any_of(kc.begin(), kc.end(), [](float f) { return f != 0.f; }));  // (something was stored)
      }
    }
  }

  // Q, K and V in one launch: three matrices of different types and sizes.
  void three_matrix_products() {
    REQUIRE_GPU();
    const int n_in = 512;
    const int T = 3;
    const Matrix a = make_matrix(TensorType::Q5_0, n_in, 64, 40), b = make_matrix(TensorType::Q8_0, n_in, 16, 41),
                 c = make_matrix(TensorType::Q4_K, n_in, 21, 42);
    const auto x = randn(static_cast<size_t>(T) * n_in, 43);
    Dev<uint8_t> da(a.data), db(b.data), dc(c.data);
    Dev<float> dx(x), oa(static_cast<size_t>(T) * 64), ob(static_cast<size_t>(T) * 16), oc(static_cast<size_t>(T) * 21);
    CU(cuda::launch_matvec3({da.p, TensorType::Q5_0, a.row_bytes, 64, oa.p}, {db.p, TensorType::Q8_0, b.row_bytes, 16, ob.p},
                            {dc.p, TensorType::Q4_K, c.row_bytes, 21, oc.p}, n_in, dx.p, T, nullptr));
    CHECK_NMSE(ref_matmul(a, n_in, 64, x, T), oa.get(), 5e-4);
    CHECK_NMSE(ref_matmul(b, n_in, 16, x, T), ob.get(), 5e-4);
    CHECK_NMSE(ref_matmul(c, n_in, 21, x, T), oc.get(), 5e-4);
    // The integer path: x quantized once for all three.
    DevQ8 q8(T, n_in);
    CU(cuda::launch_matvec3({da.p, TensorType::Q5_0, a.row_bytes, 64, oa.p}, {db.p, TensorType::Q8_0, b.row_bytes, 16, ob.p},
                            {dc.p, TensorType::Q4_K, c.row_bytes, 21, oc.p}, n_in, dx.p, T, nullptr, q8.act()));
    const auto xr = q8_rounded(x);
    CHECK_NMSE(ref_matmul(a, n_in, 64, xr, T), oa.get(), 1e-10);
    CHECK_NMSE(ref_matmul(b, n_in, 16, xr, T), ob.get(), 1e-10);
    CHECK_NMSE(ref_matmul(c, n_in, 21, xr, T), oc.get(), 1e-10);
  }

  void gated_matrix_products_data() {
    QTest::addColumn<int>("T");
    QTest::newRow("decode") << 1;
    QTest::newRow("11 tokens (two passes)") << 11;
  }
  // Gate in Q4_K and up in Q6_K (types may differ), GELU and SiLU.
  void gated_matrix_products() {
    REQUIRE_GPU();
    QFETCH(int, T);
    const int n_in = 512, n_out = 45;
    const Matrix g = make_matrix(TensorType::Q4_K, n_in, n_out, 30), u = make_matrix(TensorType::Q6_K, n_in, n_out, 31);
    const auto x = randn(static_cast<size_t>(T) * n_in, 32);
    const auto wg = ref_matmul(g, n_in, n_out, x, T), wu = ref_matmul(u, n_in, n_out, x, T);
    Dev<uint8_t> dg(g.data), du(u.data);
    Dev<float> dx(x), dout(static_cast<size_t>(T) * n_out);
    for (bool gelu : {true, false}) {
      CU(cuda::launch_matvec_gated(dg.p, TensorType::Q4_K, g.row_bytes, du.p, TensorType::Q6_K, u.row_bytes, n_in, n_out,
                                   dx.p, T, gelu, dout.p, nullptr));
      std::vector<float> want(wg.size());
      for (size_t i = 0; i < want.size(); i++) want[i] = (gelu ? ref::gelu_tanh(wg[i]) : ref::silu(wg[i])) * wu[i];
      CHECK_NMSE(want, dout.get(), 5e-4);
      // The integer path.
      DevQ8 q8(T, n_in);
      CU(cuda::launch_matvec_gated(dg.p, TensorType::Q4_K, g.row_bytes, du.p, TensorType::Q6_K, u.row_bytes, n_in, n_out,
                                   dx.p, T, gelu, dout.p, nullptr, q8.act()));
      const auto xr = q8_rounded(x);
      const auto rg = ref_matmul(g, n_in, n_out, xr, T), ru = ref_matmul(u, n_in, n_out, xr, T);
      for (size_t i = 0; i < want.size(); i++) want[i] = (gelu ? ref::gelu_tanh(rg[i]) : ref::silu(rg[i])) * ru[i];
      CHECK_NMSE(want, dout.get(), 1e-10);
    }
  }

  // The gated kernel's 8-bit output (q8_out), each 32 rows quantized by
  // the last of their blocks: bitwise what launch_quantize_q8 makes of the
  // float output, the counters back at zero, and again on a second launch.
  void gated_products_write_8_bits() {
    REQUIRE_GPU();
    const int n_in = 256, n_out = 96;
    const Matrix g = make_matrix(TensorType::Q4_K, n_in, n_out, 33), u = make_matrix(TensorType::Q8_0, n_in, n_out, 34);
    Dev<uint8_t> dg(g.data), du(u.data);
    for (int T : {1, 11}) {
      const auto x = randn(static_cast<size_t>(T) * n_in, 35 + T);
      Dev<float> dx(x), dout(static_cast<size_t>(T) * n_out);
      Dev<unsigned> counters(std::vector<unsigned>(n_out / 32, 0));
      DevQ8 in(T, n_in), fused(T, n_out), separate(T, n_out);
      for (int launch = 0; launch < 2; launch++) {
        CU(cuda::launch_matvec_gated(dg.p, TensorType::Q4_K, g.row_bytes, du.p, TensorType::Q8_0, u.row_bytes, n_in,
                                     n_out, dx.p, T, true, dout.p, nullptr, in.act(), fused.act(), counters.p));
        CU(cuda::launch_quantize_q8(dout.p, T, n_out, separate.act(), nullptr));
        QVERIFY(fused.q.get() == separate.q.get());
        QVERIFY(fused.d.get() == separate.d.get());
        const auto c = counters.get();
        QVERIFY(std::all_of(c.begin(), c.end(), [](unsigned v) { return v == 0; }));
        cudaMemset(fused.q.p, 0, fused.q.n);  // (the second launch must write it again)
        cudaMemset(fused.d.p, 0, fused.d.n * sizeof(float));
      }
    }
    // Rows not a multiple of 32: refused.
    Dev<float> dx(randn(n_in, 36)), dout(45);
    DevQ8 in(1, n_in), out8(1, 64);
    Dev<unsigned> counters(std::vector<unsigned>(2, 0));
    QCOMPARE(cuda::launch_matvec_gated(dg.p, TensorType::Q4_K, g.row_bytes, du.p, TensorType::Q8_0, u.row_bytes, n_in,
                                       45, dx.p, 1, true, dout.p, nullptr, in.act(), out8.act(), counters.p),
             cudaErrorInvalidValue);
  }

  // A product with the residual add and norms as its tail (AddNormTail),
  // against the product and launch_add_rmsnorm launched apart: the same
  // product, residual and output, bitwise (so that a decode pass of one
  // sequence equals its row in a batched pass), the tail's 8-bit copy
  // bitwise what launch_quantize_q8 makes of its output, the counter back
  // at zero. Several rows, and widths the tail cannot take, get the
  // separate launch.
  void product_with_norm_tail_data() {
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("n_out");
    QTest::addColumn<bool>("post_norm");
    QTest::newRow("decode, Gemma's post-norm") << 1 << 640 << true;
    QTest::newRow("decode, llama") << 1 << 640 << false;
    QTest::newRow("decode, 1024 wide") << 1 << 1024 << true;
    QTest::newRow("3 rows: the separate launch") << 3 << 640 << true;
    QTest::newRow("11 rows, two launches") << 11 << 640 << true;
    QTest::newRow("too wide: the separate launch") << 1 << 2048 << true;
  }
  void product_with_norm_tail() {
    REQUIRE_GPU();
    QFETCH(int, T);
    QFETCH(int, n_out);
    QFETCH(bool, post_norm);
    const int n_in = 256;
    const Matrix m = make_matrix(TensorType::Q6_K, n_in, n_out, 50);
    const auto x = randn(static_cast<size_t>(T) * n_in, 51), res = randn(static_cast<size_t>(T) * n_out, 52, 3.f);
    const auto pw = randn(n_out, 53), w = randn(n_out, 54);
    Dev<uint8_t> dm(m.data);
    Dev<float> dx(x), dpw(pw), dw(w);
    // Apart.
    Dev<float> res1(res), prod1(res.size()), out1(res.size());
    DevQ8 in1(T, n_in), q1(T, n_out);
    CU(cuda::launch_matvec(dm.p, TensorType::Q6_K, m.row_bytes, n_in, n_out, dx.p, T, prod1.p, nullptr, in1.act()));
    CU(cuda::launch_add_rmsnorm(res1.p, prod1.p, post_norm ? dpw.p : nullptr, dw.p, out1.p, T, n_out, 1e-6f, nullptr,
                                q1.act()));
    // As a tail, twice (the counter serves the second launch too).
    Dev<unsigned> counter(std::vector<unsigned>(1, 0));
    for (int launch = 0; launch < 2; launch++) {
      Dev<float> res2(res), prod2(res.size()), out2(res.size());
      DevQ8 in2(T, n_in), q2(T, n_out), sep(T, n_out);
      cuda::AddNormTail tail{res2.p, post_norm ? dpw.p : nullptr, dw.p, out2.p, 1e-6f, q2.act(), counter.p};
      CU(cuda::launch_matvec(dm.p, TensorType::Q6_K, m.row_bytes, n_in, n_out, dx.p, T, prod2.p, nullptr, in2.act(),
                             &tail));
      QVERIFY(prod2.get() == prod1.get());
      QVERIFY(res2.get() == res1.get());
      QVERIFY(out2.get() == out1.get());
      CU(cuda::launch_quantize_q8(out2.p, T, n_out, sep.act(), nullptr));
      QVERIFY(q2.q.get() == sep.q.get());
      QVERIFY(q2.d.get() == sep.d.get());
      QCOMPARE(counter.get()[0], 0u);
    }
  }

  void gated_activations() {
    REQUIRE_GPU();
    const size_t n = 5000;
    const auto g = randn(n, 4, 2.f), u = randn(n, 5);
    for (bool gelu : {true, false}) {
      Dev<float> dg(g), du(u);
      CU(cuda::launch_gated_act(dg.p, du.p, n, gelu, nullptr));
      std::vector<float> want(n);
      for (size_t i = 0; i < n; i++) want[i] = (gelu ? ref::gelu_tanh(g[i]) : ref::silu(g[i])) * u[i];
      CHECK_NMSE(want, dg.get(), 1e-7);
    }
  }

  void add_bias_and_softcap() {
    REQUIRE_GPU();
    const int T = 5, n = 96;
    const auto x = randn(static_cast<size_t>(T) * n, 6, 20.f), b = randn(n, 7);
    Dev<float> dx(x), db(b);
    CU(cuda::launch_add_bias(dx.p, db.p, T, n, nullptr));
    CU(cuda::launch_softcap(dx.p, x.size(), 30.f, nullptr));
    std::vector<float> want(x);
    for (size_t i = 0; i < want.size(); i++) want[i] = 30.f * std::tanh((x[i] + b[i % n]) / 30.f);
    CHECK_NMSE(want, dx.get(), 1e-7);
  }

  void embedding_data() {
    QTest::addColumn<int>("type");
    for (TensorType t :
         {TensorType::F32, TensorType::F16, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q6_K, TensorType::MXFP4})
      QTest::newRow(std::string(tensor_type_name(t)).c_str()) << static_cast<int>(t);
  }
  void embedding() {
    REQUIRE_GPU();
    QFETCH(int, type);
    const auto t = static_cast<TensorType>(type);
    const int n_embd = t == TensorType::F32 || t == TensorType::F16 ? 520 : 512, n_vocab = 50;
    const Matrix m = make_matrix(t, n_embd, n_vocab, 8);
    const std::vector<int32_t> tokens = {3, 0, 49, 3};
    Dev<uint8_t> dw(m.data);
    Dev<int32_t> dt(tokens);
    Dev<float> dx(tokens.size() * n_embd);
    CU(cuda::launch_embedding(dw.p, t, m.row_bytes, dt.p, static_cast<int>(tokens.size()), n_embd, 2.f, dx.p, nullptr));
    std::vector<float> want;
    for (int32_t tok : tokens)
      for (int i = 0; i < n_embd; i++) want.push_back(2.f * m.deq[static_cast<size_t>(tok) * n_embd + i]);
    CHECK_NMSE(want, dx.get(), 1e-7);
  }

  // The rows that want logits in a batch: copied exactly, in any order and
  // with repeats.
  void gather_rows() {
    REQUIRE_GPU();
    const int n = 300, n_rows = 7;
    const auto x = randn(static_cast<size_t>(n_rows) * n, 9);
    const std::vector<int> rows = {6, 0, 3, 3};
    Dev<float> dx(x), dout(rows.size() * n);
    Dev<int> dr(rows);
    CU(cuda::launch_gather_rows(dx.p, dr.p, static_cast<int>(rows.size()), n, dout.p, nullptr));
    std::vector<float> want;
    for (int r : rows) want.insert(want.end(), x.begin() + static_cast<size_t>(r) * n, x.begin() + static_cast<size_t>(r + 1) * n);
    QVERIFY(dout.get() == want);
  }

  void matrix_products_data() {
    QTest::addColumn<int>("type");
    QTest::addColumn<int>("T");
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0,
                         TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q4_K, TensorType::Q5_K,
                         TensorType::Q6_K, TensorType::MXFP4})
      for (int T : {1, 11, 40}) {
        const std::string name = std::string(tensor_type_name(t)) + " x " + std::to_string(T) + " tokens";
        QTest::newRow(name.c_str()) << static_cast<int>(t) << T;
      }
  }
  // The matrix-vector kernel (decode, small batches) and the cuBLAS path
  // (prefill; a small BF16 slab so that several slabs are needed). n_in 540
  // for the float formats: rows that end in 32 values outside a sub-block,
  // like stories260K's n_ff of 172.
  void matrix_products() {
    REQUIRE_GPU();
    QFETCH(int, type);
    QFETCH(int, T);
    const auto t = static_cast<TensorType>(type);
    const bool float_rows = t == TensorType::F32 || t == TensorType::F16 || t == TensorType::BF16;
    const int n_in = float_rows ? 540 : 512, n_out = 37;
    const Matrix m = make_matrix(t, n_in, n_out, 9);
    const auto x = randn(static_cast<size_t>(T) * n_in, 10);
    const auto want = ref_matmul(m, n_in, n_out, x, T);
    Dev<uint8_t> dw(m.data);
    Dev<float> dx(x), dout(static_cast<size_t>(T) * n_out);
    CU(cuda::launch_matvec(dw.p, t, m.row_bytes, n_in, n_out, dx.p, T, dout.p, nullptr));
    CHECK_NMSE(want, dout.get(), 5e-4);
    // The integer path (dp4a on 8-bit x) where the format has one, the
    // float path where it has none: close to the exact product, and for
    // the integer formats equal to the product with x rounded as it rounds.
    {
      DevQ8 q8(T, n_in);
      Dev<float> dq(static_cast<size_t>(T) * n_out);
      CU(cuda::launch_matvec(dw.p, t, m.row_bytes, n_in, n_out, dx.p, T, dq.p, nullptr, q8.act()));
      CHECK_NMSE(want, dq.get(), 5e-4);
      if (cuda::q8_dot_supported(t)) {
        const double e = nmse(ref_matmul(m, n_in, n_out, q8_rounded(x), T), dq.get());
        qInfo("integer path: NMSE %.3g against x rounded alike, %.3g against x", e, nmse(want, dq.get()));
        QVERIFY2(e <= 1e-10, qPrintable(QString("NMSE %1 against the product with x rounded alike").arg(e)));
      }
    }

    cublasHandle_t h = nullptr;
    QVERIFY(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    const size_t slab = static_cast<size_t>(n_in) * 16;  // 16 rows: 3 slabs for 37
    Dev<__nv_bfloat16> w16(slab), x16(static_cast<size_t>(T) * n_in);
    Dev<float> dout2(static_cast<size_t>(T) * n_out);
    const cudaError_t e = cuda::launch_gemm_bf16(h, dw.p, t, m.row_bytes, n_in, n_out, dx.p, T, dout2.p, w16.p, slab,
                                                x16.p, nullptr);
    cudaDeviceSynchronize();
    cublasDestroy(h);
    QVERIFY(e == cudaSuccess);
    CHECK_NMSE(want, dout2.get(), 5e-4);
  }

  // A decoded token's wide rows (2048 values: several loops of units per
  // lane) on the integer path, per format.
  void wide_rows_integer_path() {
    REQUIRE_GPU();
    const int n_in = 2048, n_out = 19;
    const auto x = randn(n_in, 71);
    for (TensorType t : {TensorType::Q8_0, TensorType::Q4_0, TensorType::Q5_0, TensorType::Q4_K, TensorType::Q6_K,
                         TensorType::MXFP4}) {
      const Matrix m = make_matrix(t, n_in, n_out, 72);
      Dev<uint8_t> dw(m.data);
      Dev<float> dx(x), dout(n_out);
      DevQ8 q8(1, n_in);
      CU(cuda::launch_matvec(dw.p, t, m.row_bytes, n_in, n_out, dx.p, 1, dout.p, nullptr, q8.act()));
      const double e = nmse(ref_matmul(m, n_in, n_out, q8_rounded(x), 1), dout.get());
      QVERIFY2(e <= 1e-10, qPrintable(QString("%1: NMSE %2").arg(QString::fromStdString(std::string(tensor_type_name(t)))).arg(e)));
    }
  }

  void attention_data() {
    QTest::addColumn<int>("n_head");
    QTest::addColumn<int>("n_head_kv");
    QTest::addColumn<int>("head_dim");
    QTest::addColumn<int>("window");
    QTest::addColumn<float>("softcap");
    QTest::addColumn<int>("n_split");
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("pos0");
    QTest::addColumn<bool>("sinks");  // gpt-oss: a sink logit per head
    QTest::newRow("Gemma 3 shape, one range") << 4 << 1 << 256 << 0 << 0.f << 1 << 5 << 20 << false;
    QTest::newRow("Gemma 3 shape, 3 ranges") << 4 << 1 << 256 << 0 << 0.f << 3 << 5 << 20 << false;
    QTest::newRow("sliding window 8, 2 ranges") << 4 << 2 << 64 << 8 << 0.f << 2 << 5 << 20 << false;
    QTest::newRow("softcap 50, more ranges than keys") << 2 << 2 << 128 << 0 << 50.f << 40 << 5 << 20 << false;
    QTest::newRow("Gemma 3 shape, 8 ranges (merged in the kernel)") << 4 << 1 << 256 << 0 << 0.f << 8 << 5 << 20 << false;
    QTest::newRow("window 8, 4 ranges (merged in the kernel)") << 4 << 2 << 64 << 8 << 0.f << 4 << 3 << 20 << false;
    QTest::newRow("tiny heads (8 dims)") << 8 << 8 << 8 << 0 << 0.f << 1 << 5 << 20 << false;
    QTest::newRow("head_dim 80 (partly filled lanes)") << 4 << 4 << 80 << 0 << 0.f << 2 << 5 << 20 << false;
    QTest::newRow("prefill from 0, Gemma 3 shape") << 4 << 1 << 256 << 0 << 0.f << 1 << 37 << 0 << false;
    QTest::newRow("prefill from 0, Gemma 3 shape, 3 ranges") << 4 << 1 << 256 << 0 << 0.f << 3 << 37 << 0 << false;
    QTest::newRow("prefill, 8 heads per KV head, window 20") << 16 << 2 << 64 << 20 << 0.f << 1 << 29 << 3 << false;
    QTest::newRow("prefill, 8 heads per KV head, window 20, 5 ranges") << 16 << 2 << 64 << 20 << 0.f << 5 << 29 << 3 << false;
    QTest::newRow("prefill, head_dim 512 (8-row K/V tiles)") << 2 << 1 << 512 << 0 << 0.f << 1 << 11 << 9 << false;
    QTest::newRow("sinks, 3 ranges") << 4 << 2 << 64 << 0 << 0.f << 3 << 5 << 20 << true;
    QTest::newRow("sinks, window 8, 4 ranges (merged in the kernel)") << 4 << 2 << 64 << 8 << 0.f << 4 << 3 << 20 << true;
    QTest::newRow("sinks, prefill from 0, 8 heads per KV head, 5 ranges") << 16 << 2 << 64 << 0 << 0.f << 5 << 29 << 0
                                                                           << true;
  }
  void attention() {
    REQUIRE_GPU();
    QFETCH(int, n_head);
    QFETCH(int, n_head_kv);
    QFETCH(int, head_dim);
    QFETCH(int, window);
    QFETCH(float, softcap);
    QFETCH(int, n_split);
    QFETCH(int, T);
    QFETCH(int, pos0);
    QFETCH(bool, sinks);
    const int n_ctx = 64, HD = head_dim, NKV = n_head_kv * HD;
    const float scale = 1.f / std::sqrt(static_cast<float>(HD));
    const auto q = randn(static_cast<size_t>(T) * n_head * HD, 11);
    const auto sink = randn(n_head, 14, 2.f);  // (used where sinks)
    Dev<float> dsink(sink);
    const float* sp = sinks ? dsink.p : nullptr;
    const PagedCache cache(n_ctx, NKV);
    const auto k_values = randn(cache.floats(), 12), v_values = randn(cache.floats(), 13);
    for (const cuda::KvElem e : kElems) {
      if (e == cuda::KvElem::q8_0 && HD % 32 != 0) {  // heads must be whole Q8_0 blocks: refused
        Dev<float> dq(q), dout(q.size());
        Dev<int> dtable(cache.table);
        const DevRows rows(cache, std::vector<int>(T, pos0), std::vector<int>(T, 0));
        QVERIFY(cuda::launch_attention(dq.p, cache.pages(nullptr, nullptr, dtable.p, e), rows.map(), dout.p, nullptr, T,
                                       n_head, n_head_kv, HD, window, scale, softcap, 1, nullptr) == cudaErrorInvalidValue);
        continue;
      }
      qInfo("K/V cache of %s", elem_name(e));
      // The cache as stored, and its values as the reference reads them.
      const DevKv dk(k_values, e), dv(v_values, e);
      const std::vector<float>& kc = dk.rounded;
      const std::vector<float>& vc = dv.rounded;
      // Row t at position pos[t] of sequence seq[t], in double.
      auto reference = [&](const std::vector<int>& pos, const std::vector<int>& seq) {
        std::vector<float> want(q.size());
        for (int t = 0; t < T; t++)
          for (int h = 0; h < n_head; h++) {
            const int kvh = h / (n_head / n_head_kv);
            const int j0 = window > 0 ? std::max(0, pos[t] - window + 1) : 0;
            std::vector<double> s;
            double mx = -1e300;
            for (int j = j0; j <= pos[t]; j++) {
              double d = 0;
              for (int i = 0; i < HD; i++)
                d += static_cast<double>(q[(static_cast<size_t>(t) * n_head + h) * HD + i]) * kc[cache.row(j, seq[t]) + kvh * HD + i];
              d *= scale;
              if (softcap > 0) d = softcap * std::tanh(d / softcap);
              s.push_back(d);
              mx = std::max(mx, d);
            }
            if (sinks) mx = std::max(mx, static_cast<double>(sink[h]));
            double sum = sinks ? std::exp(sink[h] - mx) : 0.0;
            for (double& v : s) sum += (v = std::exp(v - mx));
            for (int i = 0; i < HD; i++) {
              double a = 0;
              for (int j = j0; j <= pos[t]; j++) a += s[j - j0] * vc[cache.row(j, seq[t]) + kvh * HD + i];
              want[(static_cast<size_t>(t) * n_head + h) * HD + i] = static_cast<float>(a / sum);
            }
          }
        return want;
      };
      Dev<float> dq(q), dout(q.size());
      Dev<float> part(std::max<size_t>(cuda::attention_partials_floats(T, n_head, HD, n_split), 1));
      Dev<int> dtable(cache.table);
      const cuda::KvPages pages = cache.pages(dk.p, dv.p, dtable.p, e);
      // One sequence at consecutive positions (a prefill chunk).
      std::vector<int> pos(T), seq0(T, 0);
      for (int t = 0; t < T; t++) pos[t] = pos0 + t;
      const auto want = reference(pos, seq0);
      const DevRows rows(cache, pos, seq0);
      CU(cuda::launch_attention(dq.p, pages, rows.map(), dout.p, part.p, T, n_head, n_head_kv, HD, window, scale, softcap,
                                n_split, nullptr, {}, nullptr, sp));
      CU(cudaDeviceSynchronize());
      CHECK_NMSE(want, dout.get(), 5e-4);
      if (HD % 32 == 0) {  // the output's 8-bit copy, bitwise launch_quantize_q8's of the output
        DevQ8 fused(T, n_head * HD), separate(T, n_head * HD);
        Dev<float> dout3(q.size());
        CU(cuda::launch_attention(dq.p, pages, rows.map(), dout3.p, part.p, T, n_head, n_head_kv, HD, window, scale,
                                  softcap, n_split, nullptr, fused.act(), nullptr, sp));
        CU(cuda::launch_quantize_q8(dout3.p, T, n_head * HD, separate.act(), nullptr));
        QVERIFY(dout3.get() == dout.get());
        QVERIFY(fused.q.get() == separate.q.get());
        QVERIFY(fused.d.get() == separate.d.get());
        // The merge as the kernel's tail (head_counters): the same values,
        // bitwise, with the 8-bit copy; the counters back at zero, twice.
        Dev<unsigned> counters(std::vector<unsigned>(static_cast<size_t>(T) * n_head, 0));
        for (int launch = 0; launch < 2; launch++) {
          DevQ8 tail_q8(T, n_head * HD);
          Dev<float> dout4(q.size());
          CU(cuda::launch_attention(dq.p, pages, rows.map(), dout4.p, part.p, T, n_head, n_head_kv, HD, window, scale,
                                    softcap, n_split, nullptr, tail_q8.act(), counters.p, sp));
          QVERIFY(dout4.get() == dout.get());
          QVERIFY(tail_q8.q.get() == separate.q.get());
          QVERIFY(tail_q8.d.get() == separate.d.get());
          const auto c = counters.get();
          QVERIFY(std::all_of(c.begin(), c.end(), [](unsigned u) { return u == 0; }));
        }
      }
      // The tiled prefill kernel, on the same inputs, with as many key ranges.
      QVERIFY(cuda::attention_tiled_fits(n_head, n_head_kv, HD));
      Dev<float> dout2(q.size());
      CU(cuda::launch_attention_tiled(dq.p, pages, rows.map(), dout2.p, part.p, T, n_head, n_head_kv, HD, window, scale,
                                      softcap, n_split, nullptr, sp));
      CU(cudaDeviceSynchronize());
      CHECK_NMSE(want, dout2.get(), 5e-4);
      // Rows of two sequences in one launch (a batched decode): every other
      // row belongs to the second sequence, at positions near its end.
      std::vector<int> mixed_pos(T), mixed_seq(T);
      for (int t = 0; t < T; t++) {
        mixed_seq[t] = t % 2;
        mixed_pos[t] = t % 2 ? n_ctx - 1 - t : pos0 + t;
      }
      const auto want_mixed = reference(mixed_pos, mixed_seq);
      QVERIFY(nmse(want_mixed, want) > 1e-3);  // the second sequence's rows differ
      const DevRows mixed(cache, mixed_pos, mixed_seq);
      CU(cuda::launch_attention(dq.p, pages, mixed.map(), dout.p, part.p, T, n_head, n_head_kv, HD, window, scale,
                                softcap, n_split, nullptr, {}, nullptr, sp));
      CU(cudaDeviceSynchronize());
      CHECK_NMSE(want_mixed, dout.get(), 5e-4);
      // The tiled kernel on the second sequence's chunk, which starts at row 1
      // of its batch (RowMap advanced by one row).
      std::vector<int> later_pos{5}, later_seq{0};
      later_pos.insert(later_pos.end(), pos.begin(), pos.end());
      later_seq.insert(later_seq.end(), T, 1);
      const DevRows later(cache, later_pos, later_seq);
      CU(cuda::launch_attention_tiled(dq.p, pages, later.map(1), dout2.p, part.p, T, n_head, n_head_kv, HD, window, scale,
                                      softcap, n_split, nullptr, sp));
      CU(cudaDeviceSynchronize());
      CHECK_NMSE(reference(pos, std::vector<int>(T, 1)), dout2.get(), 5e-4);
    }
  }

  void splits_policy() {
    // Host-side policy, checked everywhere: one range when the batch fills
    // the GPU, else about 256 warps, at least 16 keys per range, at most 64.
    QCOMPARE(cuda::attention_splits(512, 4, 4096), 1);
    QCOMPARE(cuda::attention_splits(1, 4, 4096), 64);
    QCOMPARE(cuda::attention_splits(1, 4, 100), 7);
    QCOMPARE(cuda::attention_splits(16, 4, 4096), 4);
    QCOMPARE(cuda::attention_splits(1, 4, 1 << 20), 64);
    QCOMPARE(cuda::attention_partials_floats(1, 4, 256, 1), size_t{0});
    QCOMPARE(cuda::attention_partials_floats(2, 4, 256, 3), size_t{2 * 4 * 3 * 258});
    // Tiled: Gemma 3 270M (4 heads, 1 KV head: 16 blocks for 64 tokens) on
    // 132 SMs wants 33 ranges, capped by 64 keys per range and by 32.
    QCOMPARE(cuda::attention_tiled_splits(64, 4, 1, 512, 132), 8);
    QCOMPARE(cuda::attention_tiled_splits(64, 4, 1, 4096, 132), 32);
    QCOMPARE(cuda::attention_tiled_splits(64, 4, 1, 40, 132), 1);
    QCOMPARE(cuda::attention_tiled_splits(512, 32, 8, 4096, 132), 1);  // 1024 blocks already
  }

  // Mixture of experts: the router's choice, the pairs grouped by expert,
  // the experts' gated and down products (Q4_K gate, Q6_K up, Q8_0 down;
  // the float path and the integer path) and each token's weighted sum,
  // against a plain computation here. gpt-oss's kind (oss): the K largest
  // logits then a softmax over them, MXFP4 experts with biases, its gate.
  void moe_kernels_data() {
    QTest::addColumn<bool>("q8");
    QTest::addColumn<bool>("norm");
    QTest::addColumn<int>("T");
    QTest::addColumn<bool>("oss");
    QTest::newRow("float path, renormalised") << false << true << 11 << false;
    QTest::newRow("integer path, renormalised") << true << true << 11 << false;
    QTest::newRow("float path, raw probabilities") << false << false << 11 << false;
    QTest::newRow("integer path, one token (decode)") << true << true << 1 << false;
    QTest::newRow("float path, one token (decode)") << false << true << 1 << false;
    QTest::newRow("gpt-oss, float path") << false << false << 11 << true;
    QTest::newRow("gpt-oss, integer path") << true << false << 11 << true;
    QTest::newRow("gpt-oss, integer path, one token") << true << false << 1 << true;
  }
  void moe_kernels() {
    REQUIRE_GPU();
    QFETCH(bool, q8);
    QFETCH(bool, norm);
    QFETCH(int, T);
    QFETCH(bool, oss);
    const int E = 6, K = 2, D = 256, F = 96;
    const auto logits = randn(static_cast<size_t>(T) * E, 60, 2.f);
    const TensorType tg = oss ? TensorType::MXFP4 : TensorType::Q4_K, tu = oss ? TensorType::MXFP4 : TensorType::Q6_K,
                     td = oss ? TensorType::MXFP4 : TensorType::Q8_0;
    const Matrix gate = make_matrix(tg, D, E * F, 61), up = make_matrix(tu, D, E * F, 62),
                 down = make_matrix(td, F, E * D, 63);
    const auto x = randn(static_cast<size_t>(T) * D, 64);
    // gpt-oss's biases (none otherwise).
    const auto gate_b = randn(static_cast<size_t>(E) * F, 65, 0.5f), up_b = randn(static_cast<size_t>(E) * F, 66, 0.5f),
               down_b = randn(static_cast<size_t>(E) * D, 67, 0.5f);
    // Here: softmax, the K largest, renormalised or not, by ascending id (or
    // gpt-oss's: the K largest, a softmax over them).
    std::vector<int> want_sel(static_cast<size_t>(T) * K);
    std::vector<float> want_w(want_sel.size()), want_out(static_cast<size_t>(T) * D, 0.f);
    for (int t = 0; t < T; t++) {
      const float* l = &logits[static_cast<size_t>(t) * E];
      const float mx = *std::max_element(l, l + E);
      double sum = 0;
      for (int e = 0; e < E; e++) sum += std::exp(l[e] - mx);
      std::vector<int> ids(E);
      for (int e = 0; e < E; e++) ids[e] = e;
      std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return l[a] > l[b]; });
      ids.resize(K);
      std::sort(ids.begin(), ids.end());
      double ws = 0, top_sum = 0;
      for (int j = 0; j < K; j++) ws += std::exp(l[ids[j]] - mx) / sum;
      for (int j = 0; j < K; j++) top_sum += std::exp(l[ids[j]] - mx);
      for (int j = 0; j < K; j++) {
        want_sel[t * K + j] = ids[j];
        want_w[t * K + j] = oss ? static_cast<float>(std::exp(l[ids[j]] - mx) / top_sum)
                                : static_cast<float>(std::exp(l[ids[j]] - mx) / sum / (norm ? ws : 1.0));
        const int e = ids[j];
        std::vector<float> h(F);
        for (int r = 0; r < F; r++) {
          double g = 0, u = 0;
          for (int i = 0; i < D; i++) {
            g += static_cast<double>(gate.deq[(static_cast<size_t>(e) * F + r) * D + i]) * x[t * D + i];
            u += static_cast<double>(up.deq[(static_cast<size_t>(e) * F + r) * D + i]) * x[t * D + i];
          }
          h[r] = oss ? ref::swiglu_oai(static_cast<float>(g) + gate_b[e * F + r], static_cast<float>(u) + up_b[e * F + r])
                     : ref::silu(static_cast<float>(g)) * static_cast<float>(u);
        }
        for (int r = 0; r < D; r++) {
          double y = oss ? down_b[e * D + r] : 0.0;
          for (int i = 0; i < F; i++) y += static_cast<double>(down.deq[(static_cast<size_t>(e) * D + r) * F + i]) * h[i];
          want_out[t * D + r] += want_w[t * K + j] * static_cast<float>(y);
        }
      }
    }
    Dev<float> dl(logits), dx(x), dw(static_cast<size_t>(T) * K), dh(static_cast<size_t>(T) * K * F),
        dy(static_cast<size_t>(T) * K * D), dout(static_cast<size_t>(T) * D);
    Dev<uint8_t> dg(gate.data), du(up.data), dd(down.data);
    Dev<float> dgb(gate_b), dub(up_b), ddb(down_b);
    Dev<int> dsel(static_cast<size_t>(T) * K), order(static_cast<size_t>(T) * K), offsets(E), counts(E), active(E + 1);
    const cuda::MoeGroups g{order.p, offsets.p, counts.p, active.p};
    DevQ8 scratch(T * K, std::max(D, F));
    const cuda::Q8Act act = q8 ? scratch.act() : cuda::Q8Act{};
    CU(cuda::launch_moe_route(dl.p, T, E, K, norm, oss, dsel.p, dw.p, nullptr));
    CU(cuda::launch_moe_group(dsel.p, T, K, E, g, nullptr));
    CU(cuda::launch_moe_gated({dg.p, tg, gate.row_bytes, F, oss ? dgb.p : nullptr},
                              {du.p, tu, up.row_bytes, F, oss ? dub.p : nullptr}, D, dx.p, T, K, g, E,
                              oss ? cuda::GateAct::swiglu_oai : cuda::GateAct::silu, dh.p, nullptr, act));
    CU(cuda::launch_moe_down({dd.p, td, down.row_bytes, D, oss ? ddb.p : nullptr}, F, dh.p, T, K, g, E, dy.p,
                             nullptr, act));
    CU(cuda::launch_moe_combine(dy.p, dw.p, T, K, D, dout.p, nullptr));
    QCOMPARE(dsel.get(), want_sel);
    CHECK_NMSE(want_w, dw.get(), 1e-12);
    // The groups: every pair once, each expert's ascending, the active list.
    const auto o = order.get(), c = counts.get(), off = offsets.get(), a = active.get();
    int n_active = 0;
    for (int e = 0; e < E; e++) {
      for (int i = 0; i < c[e]; i++) QCOMPARE(want_sel[o[off[e] + i]], e);
      for (int i = 1; i < c[e]; i++) QVERIFY(o[off[e] + i] > o[off[e] + i - 1]);
      if (c[e] > 0) QCOMPARE(a[n_active++], e);
    }
    QCOMPARE(a[E], n_active);
    QCOMPARE(std::accumulate(c.begin(), c.end(), 0), T * K);
    const double e = nmse(want_out, dout.get());
    qInfo("experts' output NMSE %.3g (%s path)", e, q8 ? "integer" : "float");
    QVERIFY2(e <= (q8 ? 5e-4 : 1e-9), qPrintable(QString("NMSE %1").arg(e)));
  }

  void argmax_rows() {
    REQUIRE_GPU();
    const int n = 262144;
    auto x = randn(n, 16);
    x[123456] = 9.f;
    x[200000] = 9.f;  // a tie: the lower index wins
    x[7] = 8.5f;
    x[99] = 8.f;
    Dev<float> dx(x);
    Dev<int> out(1);
    CU(cuda::launch_argmax(dx.p, n, out.p, nullptr));
    QCOMPARE(out.get()[0], 123456);
    // Rows: each row's own argmax (row 1: the same values shifted by 5, with
    // its maximum at 5 after the wrap; row 2: all equal, so index 0).
    std::vector<float> rows(x);
    rows.insert(rows.end(), x.end() - 5, x.end());
    rows.insert(rows.end(), x.begin(), x.end() - 5);
    rows.insert(rows.end(), n, 1.f);
    Dev<float> drows(rows);
    Dev<int> outs(3);
    CU(cuda::launch_argmax_rows(drows.p, 3, n, outs.p, nullptr));
    QVERIFY(outs.get() == (std::vector<int>{123456, 123461, 0}));
  }

  // Sampled draws' passes over the vocabulary on the device
  // (cuda::launch_vocab_draw) against the host sampler on the same rows:
  // for every rule set and row, the token Sampler::sample_device finishes
  // from what came back (or, where that says the candidates do not
  // suffice, Sampler::sample of the row with the same uniform number) is
  // the token Sampler::sample draws; the softmax sums are bitwise the host
  // passes' sums, and the candidates are exactly the tokens at or above
  // the cutoff.
  void vocab_draw_equals_the_host_sampler() {
    REQUIRE_GPU();
    struct Row {
      const char* what;
      std::vector<float> x;
    };
    std::vector<Row> rows;
    auto scaled = [](int n, float scale, uint64_t seed) {
      auto x = randn(n, seed);
      for (float& v : x) v *= scale;
      return x;
    };
    const int V = 262144;
    rows.push_back({"peaked (Gemma-sized)", scaled(V, 3.f, 1)});
    rows.push_back({"flat (Gemma-sized)", scaled(V, 1.f, 2)});
    {
      auto x = scaled(V, 2.f, 3);
      x[5] = 30.f;  // one token all but certain
      x[77] = std::numeric_limits<float>::quiet_NaN();
      x[1000] = -std::numeric_limits<float>::infinity();
      rows.push_back({"one spike, NaN and -inf", x});
    }
    {
      std::vector<float> x(V);
      for (int i = 0; i < V; i++) x[i] = static_cast<float>((i * 7919) % 41);  // whole numbers: ties on the cutoffs
      rows.push_back({"ties over 40 nats", x});
    }
    rows.push_back({"a tail after the last block (33000)", scaled(33000, 2.5f, 4)});
    rows.push_back({"no whole block (512)", scaled(512, 2.f, 5)});
    rows.push_back({"every logit NaN (512)", std::vector<float>(512, std::numeric_limits<float>::quiet_NaN())});
    {
      auto x = scaled(2048, 1.f, 6);
      x[300] = std::numeric_limits<float>::infinity();
      rows.push_back({"an infinite logit (2048)", x});
    }
    rows.push_back({"very flat (Gemma-sized)", scaled(V, 0.3f, 7)});

    struct Rules {
      float t;
      int k;
      float p, min_p;
    };
    const Rules rules[] = {{1.f, 0, 0.95f, 0.f},   {0.8f, 40, 0.95f, 0.05f}, {1.f, 0, 1.f, 0.f},  {0.7f, 0, 1.f, 0.f},
                           {1.f, 0, 1.f, 0.1f},    {1.f, 5, 1.f, 0.f},       {0.9f, 0, 0.5f, 0.02f},
                           {1.3f, 4096, 1.f, 0.f}, {1.f, 0, 0.999f, 0.f}};
    const vocab::Passes& host = vocab::best_passes();
    constexpr int kCap = DeviceDraw::kMaxCandidates, kHead = 512, kSeeds = 3;
    int n_checked = 0, n_fallbacks = 0, n_on_device = 0, n_from_candidates = 0;
    // One launch per row length: every (row, rules, seed) a row of the
    // launch, in a shuffled order (DrawRule::row is not the launch's row),
    // truncated and untruncated rows side by side.
    std::map<int, std::vector<size_t>> by_length;
    for (size_t i = 0; i < rows.size(); i++) by_length[static_cast<int>(rows[i].x.size())].push_back(i);
    std::mt19937 shuffle_rng(11);
    for (const auto& [n, members] : by_length) {
      std::vector<float> xs;
      for (size_t i : members) xs.insert(xs.end(), rows[i].x.begin(), rows[i].x.end());
      struct Job {
        int data_row;  // index into members
        size_t rules;
        int seed;
      };
      std::vector<Job> jobs;
      for (int d = 0; d < static_cast<int>(members.size()); d++)
        for (size_t u = 0; u < std::size(rules); u++)
          for (int seed = 0; seed < kSeeds; seed++) jobs.push_back({d, u, 100 + seed});
      std::shuffle(jobs.begin(), jobs.end(), shuffle_rng);
      const int R = static_cast<int>(jobs.size());
      std::vector<DeviceDraw> draws(R);
      std::vector<Sampler> samplers;
      std::vector<cuda::DrawRule> dr(R);
      auto params = [&](const Job& j) {
        SamplingParams sp;
        sp.temperature = rules[j.rules].t;
        sp.top_k = rules[j.rules].k;
        sp.top_p = rules[j.rules].p;
        sp.min_p = rules[j.rules].min_p;
        sp.seed = static_cast<uint64_t>(j.seed);
        return sp;
      };
      samplers.reserve(R);
      for (int r = 0; r < R; r++) {
        samplers.emplace_back(params(jobs[r]), n);
        QVERIFY(samplers.back().device_drawable());
        DeviceDraw& d = draws[r];
        d.cand.resize(kCap);
        samplers.back().prepare_device_draw(&d);
        dr[r] = cuda::DrawRule{jobs[r].data_row, d.untruncated, d.top_k, d.use_min_p, d.top_p, d.log_min_p, d.inv_t, 0.f, d.u};
      }
      Dev<float> dx(xs);
      Dev<cuda::DrawRule> drules(dr);
      Dev<cuda::DrawResult> dres(R);
      Dev<cuda::DrawCand> dcand(static_cast<size_t>(R) * kCap);
      Dev<uint8_t> work(cuda::vocab_draw_work_bytes(R, n));
      CU(cuda::launch_vocab_draw(dx.p, n, drules.p, R, dres.p, dcand.p, kCap, kHead, work.p, nullptr));
      const auto res = dres.get();
      const auto cand = dcand.get();
      for (int r = 0; r < R; r++) {
        const Job& job = jobs[r];
        const Row& row = rows[members[job.data_row]];
        const Rules& ru = rules[job.rules];
        const QString where = QString("%1, t=%2 k=%3 p=%4 min-p=%5, seed %6")
                                  .arg(row.what).arg(ru.t).arg(ru.k).arg(ru.p).arg(ru.min_p).arg(job.seed);
        Sampler reference(params(job), n);
        std::vector<float> copy = row.x;
        const int32_t want = reference.sample(copy.data(), {});
        DeviceDraw& d = draws[r];
        const cuda::DrawResult& got = res[r];
        d.token = got.token;
        d.complete = got.complete != 0;
        d.max_logit = got.max_logit;
        d.cutoff = got.cutoff;
        d.total = got.total;
        d.n_cand = got.n_cand;
        d.n_back = got.token < 0 && got.n_cand <= static_cast<uint32_t>(kCap) ? got.n_cand : 0;
        const float mx = host.max_logit(row.x.data(), n);
        if (std::isfinite(mx)) QCOMPARE(got.max_logit, mx);
        if (got.token < 0) {
          QVERIFY2(std::isfinite(mx), qPrintable(where));
          QCOMPARE(got.total, host.sum_exp(row.x.data(), n, mx));  // bitwise the host's sum
          uint32_t at_or_above = 0;
          for (float v : row.x) at_or_above += v >= got.cutoff;
          QCOMPARE(got.n_cand, at_or_above);
          // (In the order the device wrote them, as the backend passes them on.)
          for (uint32_t j = 0; j < d.n_back; j++) {
            const cuda::DrawCand& c = cand[cuda::draw_cand_index(R, kCap, kHead, r, static_cast<int>(j))];
            QVERIFY(c.id >= 0 && c.id < n && row.x[c.id] == c.logit && c.logit >= got.cutoff);
            d.cand[j] = {c.logit, c.id};
          }
          std::vector<std::pair<float, int32_t>> ids(d.cand.begin(), d.cand.begin() + d.n_back);
          std::sort(ids.begin(), ids.end(), [](auto a, auto b) { return a.second < b.second; });
          QVERIFY2(std::adjacent_find(ids.begin(), ids.end(), [](auto a, auto b) { return a.second == b.second; }) ==
                       ids.end(),
                   qPrintable(where + ": a candidate twice"));
        } else {
          n_on_device++;
        }
        int32_t token = samplers[r].sample_device(d);
        if (token >= 0 && got.token < 0) n_from_candidates++;
        if (token < 0) {  // (the fallback: the row itself, the same uniform number)
          n_fallbacks++;
          if (std::getenv("PHASELAB_TEST_VERBOSE"))
            qInfo("fallback: %s (%u candidates at or above %g, max %g)", qPrintable(where), got.n_cand, got.cutoff,
                  got.max_logit);
          std::vector<float> again = row.x;
          token = samplers[r].sample(again.data(), {});
        }
        QVERIFY2(token == want, qPrintable(where + QString(": device %1, host %2").arg(token).arg(want)));
        n_checked++;
      }
    }
    qInfo("%d draws equal the host's: %d drawn on the device, %d from its candidates, %d from the row after too many "
          "candidates", n_checked, n_on_device, n_from_candidates, n_fallbacks);
    QVERIFY(n_on_device > 0 && n_from_candidates > 0 && n_fallbacks > 0);  // (every way out was taken)
  }
};

QTEST_APPLESS_MAIN(TestCudaOps)
#include "test_cuda_ops.moc"
