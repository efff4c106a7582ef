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
#endif

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
  return p;
}

HardwarePeaks HardwareProbe::cached() {
  QSettings s;
  HardwarePeaks p;
  p.memoryBandwidth = s.value(QStringLiteral("probe/memoryBandwidth"), 0.0).toDouble();
  p.peakFlops = s.value(QStringLiteral("probe/peakFlops"), 0.0).toDouble();
  p.threads = s.value(QStringLiteral("probe/threads"), 0).toInt();
  return p;
}

void HardwareProbe::store(const HardwarePeaks& p) {
  QSettings s;
  s.setValue(QStringLiteral("probe/memoryBandwidth"), p.memoryBandwidth);
  s.setValue(QStringLiteral("probe/peakFlops"), p.peakFlops);
  s.setValue(QStringLiteral("probe/threads"), p.threads);
}

}  // namespace phaselab::ui
