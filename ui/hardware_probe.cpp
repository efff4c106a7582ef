#include "hardware_probe.h"

#include <QSettings>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PHASELAB_X86 1
#endif

namespace phaselab::ui {

namespace {

using Clock = std::chrono::steady_clock;
volatile int g_int8_sink = 0;

// Sums a slice repeatedly; the result is returned so the loop is not removed.
uint64_t sumSlice(const uint64_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  return a + b + c + d;
}

double probeBandwidth(int threads) {
  constexpr size_t kBytes = size_t{256} << 20;  // far beyond any last-level cache
  std::vector<uint64_t> buf(kBytes / sizeof(uint64_t), 1);
  const size_t per = buf.size() / threads;
  std::vector<uint64_t> sink(threads);
  std::vector<double> bytes(threads);
  std::vector<std::thread> pool;
  const auto t0 = Clock::now();
  for (int t = 0; t < threads; t++) {
    pool.emplace_back([&, t] {
      double done = 0;
      while (std::chrono::duration<double>(Clock::now() - t0).count() < 0.3) {
        sink[t] += sumSlice(buf.data() + t * per, per);
        done += static_cast<double>(per * sizeof(uint64_t));
      }
      bytes[t] = done;
    });
  }
  for (auto& th : pool) th.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  double total = 0;
  for (double b : bytes) total += b;
  return sink[0] == 42 ? 0 : total / secs;  // sink read keeps the sums alive
}

#ifdef PHASELAB_X86
// 10 independent 8-wide FMA chains hide the FMA latency (4-5 cycles on two
// ports), so this runs at the core's FP32 peak: 2 FMA/cycle * 8 lanes * 2 FLOP.
__attribute__((target("avx2,fma"))) double fmaLoopAvx2(long iters) {
  __m256 acc[10];
  for (int j = 0; j < 10; j++) acc[j] = _mm256_set1_ps(1.0f + j * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iters; i++)
    for (int j = 0; j < 10; j++) acc[j] = _mm256_fmadd_ps(acc[j], m, a);
  float out[8];
  __m256 s = acc[0];
  for (int j = 1; j < 10; j++) s = _mm256_add_ps(s, acc[j]);
  _mm256_storeu_ps(out, s);
  return out[0];
}

// Independent chains of u8 x s8 dot products, as the integer kernels run
// them; returns the operations done (2 per multiply-add).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) double int8LoopAvx512(long iters, int* sink) {
  __m512i acc[10];
  for (int j = 0; j < 10; j++) acc[j] = _mm512_set1_epi32(j);
  const __m512i a = _mm512_set1_epi8(static_cast<char>(3 + (iters & 1))), b = _mm512_set1_epi8(-2);
  for (long i = 0; i < iters; i++)
    for (int j = 0; j < 10; j++) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
  __m512i s = acc[0];
  for (int j = 1; j < 10; j++) s = _mm512_add_epi32(s, acc[j]);
  alignas(64) int lanes[16];
  _mm512_store_si512(lanes, s);
  *sink = lanes[0];
  return static_cast<double>(iters) * 10 * 64 * 2;
}
__attribute__((target("avx2,avxvnni"))) double int8LoopAvxVnni(long iters, int* sink) {
  __m256i acc[10];
  for (int j = 0; j < 10; j++) acc[j] = _mm256_set1_epi32(j);
  const __m256i a = _mm256_set1_epi8(static_cast<char>(3 + (iters & 1))), b = _mm256_set1_epi8(-2);
  for (long i = 0; i < iters; i++)
    for (int j = 0; j < 10; j++) acc[j] = _mm256_dpbusd_avx_epi32(acc[j], a, b);
  __m256i s = acc[0];
  for (int j = 1; j < 10; j++) s = _mm256_add_epi32(s, acc[j]);
  *sink = _mm256_extract_epi32(s, 0);
  return static_cast<double>(iters) * 10 * 32 * 2;
}
__attribute__((target("avx2"))) double int8LoopAvx2(long iters, int* sink) {
  __m256i acc[10];
  for (int j = 0; j < 10; j++) acc[j] = _mm256_set1_epi32(j);
  const __m256i a = _mm256_set1_epi8(static_cast<char>(3 + (iters & 1))), b = _mm256_set1_epi8(-2),
                ones = _mm256_set1_epi16(1);
  for (long i = 0; i < iters; i++)
    for (int j = 0; j < 10; j++)
      acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
  __m256i s = acc[0];
  for (int j = 1; j < 10; j++) s = _mm256_add_epi32(s, acc[j]);
  *sink = _mm256_extract_epi32(s, 0);
  return static_cast<double>(iters) * 10 * 32 * 2;
}
#endif

double probeInt8(int threads) {
#ifdef PHASELAB_X86
  __builtin_cpu_init();
  const bool v512 = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
  const bool vnni = __builtin_cpu_supports("avxvnni");
  if (!v512 && !vnni && !__builtin_cpu_supports("avx2")) return 0;
  constexpr long kIters = 10'000'000;
  std::vector<double> ops(threads);
  std::vector<int> sink(threads);
  std::vector<std::thread> pool;
  const auto t0 = Clock::now();
  for (int t = 0; t < threads; t++)
    pool.emplace_back([&, t] {
      ops[t] = v512 ? int8LoopAvx512(kIters, &sink[t]) : vnni ? int8LoopAvxVnni(kIters, &sink[t]) : int8LoopAvx2(kIters, &sink[t]);
    });
  for (auto& th : pool) th.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  double total = 0;
  for (double o : ops) total += o;
  g_int8_sink = sink[0];  // keeps the sums alive
  return total / secs;
#else
  (void)threads;
  return 0;
#endif
}

double fmaLoopPortable(long iters, int* flopsPerIter) {
  float acc[16];
  for (int j = 0; j < 16; j++) acc[j] = 1.0f + j * 1e-3f;
  for (long i = 0; i < iters; i++)
    for (int j = 0; j < 16; j++) acc[j] = acc[j] * 0.999999f + 1e-7f;
  *flopsPerIter = 32;
  float s = 0;
  for (float v : acc) s += v;
  return s;
}

double probeFlops(int threads) {
  constexpr long kIters = 20'000'000;
  std::vector<double> flops(threads), sink(threads);
  std::vector<std::thread> pool;
  const auto t0 = Clock::now();
  for (int t = 0; t < threads; t++) {
    pool.emplace_back([&, t] {
#ifdef PHASELAB_X86
      if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        sink[t] = fmaLoopAvx2(kIters);
        flops[t] = static_cast<double>(kIters) * 10 * 8 * 2;
        return;
      }
#endif
      int per = 0;
      sink[t] = fmaLoopPortable(kIters / 4, &per);
      flops[t] = static_cast<double>(kIters / 4) * per;
    });
  }
  for (auto& th : pool) th.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  double total = 0;
  for (double f : flops) total += f;
  return sink[0] == 42.0 ? 0 : total / secs;
}

}  // namespace

HardwarePeaks HardwareProbe::measure(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  HardwarePeaks p;
  p.threads = threads;
  p.memoryBandwidth = probeBandwidth(threads);
  p.peakFlops = probeFlops(threads);
  p.peakInt8Ops = probeInt8(threads);
  return p;
}

HardwarePeaks HardwareProbe::cached() {
  QSettings s;
  HardwarePeaks p;
  p.memoryBandwidth = s.value(QStringLiteral("probe/memoryBandwidth"), 0.0).toDouble();
  p.peakFlops = s.value(QStringLiteral("probe/peakFlops"), 0.0).toDouble();
  p.peakInt8Ops = s.value(QStringLiteral("probe/peakInt8Ops"), 0.0).toDouble();
  p.threads = s.value(QStringLiteral("probe/threads"), 0).toInt();
  return p;
}

void HardwareProbe::store(const HardwarePeaks& p) {
  QSettings s;
  s.setValue(QStringLiteral("probe/memoryBandwidth"), p.memoryBandwidth);
  s.setValue(QStringLiteral("probe/peakFlops"), p.peakFlops);
  s.setValue(QStringLiteral("probe/peakInt8Ops"), p.peakInt8Ops);
  s.setValue(QStringLiteral("probe/threads"), p.threads);
}

}  // namespace phaselab::ui
