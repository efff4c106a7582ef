#include "phaselab/machine.h"

#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include "phaselab/memory.h"
#include "phaselab/thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PHASELAB_X86 1
#endif

namespace phaselab {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMiB = std::size_t{1} << 20;
// The memory buffer is 4x the last-level cache: a cache that keeps part of a
// streamed buffer (adaptive replacement, as Intel's L3 does) can serve up to
// llc / buffer of it, so 4x bounds the cache's share to a quarter and
// usually far less. And never under 512 MiB, so that no L4, eDRAM or
// misreported cache is read instead.
constexpr std::size_t kCacheMultiple = 4;
constexpr std::size_t kMinDramBytes = 512 * kMiB;
constexpr std::size_t kMinBandwidthBytes = 64 * kMiB;
// The cache figure is measured only for caches that can hold weights.
constexpr std::size_t kMinLlcForFigure = 4 * kMiB;
// A cache figure under this share of the memory one is not a level that
// holds weights (a busy neighbour, a misread size): it is not used.
constexpr double kMinLlcToMemory = 0.8;
// Streams a thread reads its slice in (read_avx2).
constexpr std::size_t kProbeReadWays = 4;
bool llc_figure_usable(double llc, double memory) { return !(llc > 0 && llc < kMinLlcToMemory * memory); }
// A cache pass reads its buffer this many bytes' worth at least, so that the
// team's start does not dominate its time.
constexpr std::size_t kCachePassBytes = 256 * kMiB;
constexpr int kRunsPerBatch = 5;
constexpr int kMaxBatches = 3;
constexpr double kBandwidthBudgetSeconds = 1.0;

bool read_line(const std::string& path, std::string* out) {
  std::ifstream f(path);
  return static_cast<bool>(std::getline(f, *out));
}

// The CPUs of the affinity mask, the first CPU of each physical core first,
// then the SMT siblings (so threads 0..cores-1 land on distinct cores).
struct CpuLayout {
  std::vector<int> cores;     // one CPU per physical core
  std::vector<int> siblings;  // the other hardware threads
};

CpuLayout cpu_layout() {
  CpuLayout l;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return l;
  std::set<std::string> seen;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string topo = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    // (package, core) names a core; the siblings list does too where those
    // are missing; without topology every CPU counts as its own core.
    std::string core, package, key;
    if (read_line(topo + "core_id", &core) && read_line(topo + "physical_package_id", &package))
      key.append("p").append(package).append(":").append(core);
    else if (!read_line(topo + "thread_siblings_list", &key))
      key.append("c").append(std::to_string(cpu));
    (seen.insert(key).second ? l.cores : l.siblings).push_back(cpu);
  }
  return l;
}

void pin_to(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)sched_setaffinity(0, sizeof set, &set);  // best effort: unpinned threads still measure
}

// Runs body(t) for t in [0, n) on n threads, thread t pinned to cpus[t] (if
// any), all released at once; returns the seconds from the release to the
// last thread's finish. The waiting threads yield, so the releasing thread
// gets a core even when every core has a pinned thread.
template <typename F>
double run_team(int n, const std::vector<int>& cpus, F&& body) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<Clock::time_point> end(n);
  std::vector<std::thread> team;
  team.reserve(n);
  for (int t = 0; t < n; t++)
    team.emplace_back([&, t] {
      pin_to(t < static_cast<int>(cpus.size()) ? cpus[t] : -1);
      ready.fetch_add(1, std::memory_order_acq_rel);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      body(t);
      end[t] = Clock::now();
    });
  while (ready.load(std::memory_order_acquire) < n) std::this_thread::yield();
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : team) th.join();
  const auto last = *std::max_element(end.begin(), end.end());
  return std::chrono::duration<double>(last - t0).count();
}

// --- memory reads ------------------------------------------------------------

// Sums a slice as 64-bit lanes; the sum is returned so the loads stay.
uint64_t read_portable(const uint8_t* p, std::size_t n) {
  const auto* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (std::size_t i = 0; i + 4 <= n / 8; i += 4) {
    a += q[i];
    b += q[i + 1];
    c += q[i + 2];
    d += q[i + 3];
  }
  return a + b + c + d;
}

#ifdef PHASELAB_X86
// The slice read as kProbeReadWays ascending streams, a 128-byte step of each in
// turn (four independent 32-byte sums), for more misses in flight than one
// stream keeps (as decode's large matrices are read where
// CpuSwitches::stream_ways is 4). One stream a thread under-read a core with
// its own path to memory: on the Zen 4 VM with its two vCPUs on two CCDs,
// 46.7-48.7 GB/s against 54.9-56.9 with four; on one CCD about level
// (28-33 against 31-36).
__attribute__((target("avx2"))) inline void add_line_pair(const uint8_t* q, __m256i (&acc)[4]) {
  for (int k = 0; k < 4; k++)
    acc[k] = _mm256_add_epi64(acc[k], _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 32 * k)));
}
__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, std::size_t n) {
  __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  const std::size_t per = n / kProbeReadWays / 128 * 128;  // each way's bytes; the tail below
  for (std::size_t i = 0; i < per; i += 128)
    for (std::size_t w = 0; w < kProbeReadWays; w++) add_line_pair(p + w * per + i, acc);
  for (std::size_t i = kProbeReadWays * per; i + 128 <= n; i += 128) add_line_pair(p + i, acc);
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
  // The lanes as unsigned numbers: their sum wraps, which it may (only its
  // existence matters), where a signed sum would be undefined (UBSan).
  return static_cast<uint64_t>(_mm256_extract_epi64(s, 0)) + static_cast<uint64_t>(_mm256_extract_epi64(s, 1)) +
         static_cast<uint64_t>(_mm256_extract_epi64(s, 2)) + static_cast<uint64_t>(_mm256_extract_epi64(s, 3));
}
#endif

// The probe's read: the AVX2 loop where avx2 (the caller has checked the
// CPU has it), else the portable one.
uint64_t read_slice(const uint8_t* p, std::size_t n, bool avx2) {
#ifdef PHASELAB_X86
  if (avx2) return read_avx2(p, n);
#else
  (void)avx2;
#endif
  return read_portable(p, n);
}

volatile uint64_t g_read_sink = 0;

// Reads a buffer of `bytes` with every thread, each its own slice, `repeats`
// times a pass; passes until they agree or the budget is spent.
BandwidthTiming probe_bandwidth(int threads, const std::vector<int>& cpus, std::size_t bytes, int repeats,
                                bool avx2) {
  BandwidthTiming r;
  // Whole pages per thread, 128-byte multiples for the loop.
  const std::size_t slice = bytes / threads / 4096 * 4096;
  if (slice == 0) return r;
  bytes = slice * threads;
  // mmap rather than new: page-aligned, and returned to the system at once.
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return r;
  auto* buf = static_cast<uint8_t*>(mem);
  // Each thread writes its own slice first: the pages exist (a never-written
  // page reads as the shared zero page, from cache) and sit on the thread's
  // memory node.
  run_team(threads, cpus, [&](int t) { std::memset(buf + t * slice, 1, slice); });

  std::vector<uint64_t> sums(static_cast<std::size_t>(threads) * 8);  // a cache line apart
  std::vector<double> samples;
  const auto start = Clock::now();
  for (int batch = 0; batch < kMaxBatches; batch++) {
    for (int i = 0; i < kRunsPerBatch; i++) {
      const double sec = run_team(threads, cpus, [&](int t) {
        const uint8_t* p = buf + t * slice;
        for (int rep = 0; rep < repeats; rep++) {
          sums[t * 8] += read_slice(p, slice, avx2);
        }
      });
      if (sec > 0) samples.push_back(static_cast<double>(bytes) * repeats / sec);
    }
    if (samples.empty()) continue;
    std::vector<double> sorted = samples;
    std::sort(sorted.begin(), sorted.end());
    r.best = sorted.back();
    r.median = sorted[sorted.size() / 2];
    // Passes that agree end it; otherwise something else was busy for some of
    // them, and more passes give the best one more chances.
    if (r.best <= 1.25 * r.median) break;
    if (std::chrono::duration<double>(Clock::now() - start).count() > kBandwidthBudgetSeconds) break;
  }
  r.runs = static_cast<int>(samples.size());
  r.bytes = bytes;
  munmap(mem, bytes);
  g_read_sink = sums[0];  // the sums are used: the loads stay
  return r;
}

// --- compute -----------------------------------------------------------------

volatile float g_fp_sink = 0;
volatile int g_int_sink = 0;

#ifdef PHASELAB_X86
// 10 independent 8-wide FMA chains hide the FMA latency (4-5 cycles on two
// ports), so this runs at the core's FP32 peak: 2 FMA/cycle * 8 lanes * 2 FLOP.
__attribute__((target("avx2,fma"))) double fma_loop_avx2(long iters) {
  __m256 acc[10];
  for (int j = 0; j < 10; j++) acc[j] = _mm256_set1_ps(1.0f + j * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iters; i++)
    for (int j = 0; j < 10; j++) acc[j] = _mm256_fmadd_ps(acc[j], m, a);
  float out[8];
  __m256 s = acc[0];
  for (int j = 1; j < 10; j++) s = _mm256_add_ps(s, acc[j]);
  _mm256_storeu_ps(out, s);
  g_fp_sink = out[0];
  return static_cast<double>(iters) * 10 * 8 * 2;
}

// Independent chains of u8 x s8 dot products, as the integer kernels run
// them; each returns the operations done (2 per multiply-add).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) double int8_loop_avx512(long iters) {
  __m512i acc[10];
  for (int j = 0; j < 10; j++) acc[j] = _mm512_set1_epi32(j);
  const __m512i a = _mm512_set1_epi8(static_cast<char>(3 + (iters & 1))), b = _mm512_set1_epi8(-2);
  for (long i = 0; i < iters; i++)
    for (int j = 0; j < 10; j++) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
  __m512i s = acc[0];
  for (int j = 1; j < 10; j++) s = _mm512_add_epi32(s, acc[j]);
  alignas(64) int lanes[16];
  _mm512_store_si512(lanes, s);
  g_int_sink = lanes[0];
  return static_cast<double>(iters) * 10 * 64 * 2;
}
__attribute__((target("avx2,avxvnni"))) double int8_loop_avxvnni(long iters) {
  __m256i acc[10];
  for (int j = 0; j < 10; j++) acc[j] = _mm256_set1_epi32(j);
  const __m256i a = _mm256_set1_epi8(static_cast<char>(3 + (iters & 1))), b = _mm256_set1_epi8(-2);
  for (long i = 0; i < iters; i++)
    for (int j = 0; j < 10; j++) acc[j] = _mm256_dpbusd_avx_epi32(acc[j], a, b);
  __m256i s = acc[0];
  for (int j = 1; j < 10; j++) s = _mm256_add_epi32(s, acc[j]);
  g_int_sink = _mm256_extract_epi32(s, 0);
  return static_cast<double>(iters) * 10 * 32 * 2;
}
// The u8 x s8 products read the accumulator as their unsigned bytes: with
// constant operands the compiler hoists maddubs/madd out of the loop and only
// the additions are timed (the earlier probe did that and reported about twice
// this figure). Twelve chains cover the maddubs + madd latency (6-10 cycles).
__attribute__((target("avx2"))) double int8_loop_avx2(long iters) {
  __m256i acc[12];
  for (int j = 0; j < 12; j++) acc[j] = _mm256_set1_epi32(j + static_cast<int>(iters & 1));
  const __m256i b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  for (long i = 0; i < iters; i++)
    for (int j = 0; j < 12; j++)
      acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(acc[j], b), ones));
  __m256i s = acc[0];
  for (int j = 1; j < 12; j++) s = _mm256_add_epi32(s, acc[j]);
  g_int_sink = _mm256_extract_epi32(s, 0);
  return static_cast<double>(iters) * 12 * 32 * 2;
}
#endif

double fma_loop_portable(long iters) {
  float acc[16];
  for (int j = 0; j < 16; j++) acc[j] = 1.0f + j * 1e-3f;
  for (long i = 0; i < iters; i++)
    for (int j = 0; j < 16; j++) acc[j] = acc[j] * 0.999999f + 1e-7f;
  float s = 0;
  for (float v : acc) s += v;
  g_fp_sink = s;
  return static_cast<double>(iters) * 32;
}

// Best of `runs` team runs of loop(iters) on every thread, in ops per second.
template <typename Loop>
double best_rate(int threads, const std::vector<int>& cpus, int runs, long iters, Loop loop) {
  double best = 0;
  for (int r = 0; r < runs; r++) {
    std::vector<double> ops(threads);
    const double sec = run_team(threads, cpus, [&](int t) { ops[t] = loop(iters); });
    double total = 0;
    for (double o : ops) total += o;
    if (sec > 0) best = std::max(best, total / sec);
  }
  return best;
}

std::string gbps(double bytes_per_s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB/s", bytes_per_s / 1e9);
  return buf;
}

void add_note(std::string* note, const std::string& s) {
  if (!note->empty()) *note += "; ";
  *note += s;
}

}  // namespace

int physical_core_count() {
  const int n = static_cast<int>(cpu_layout().cores.size());
  if (n > 0) return n;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int default_thread_count() { return physical_core_count(); }

std::size_t last_level_cache_bytes() {
  std::size_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 16; i++) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::string level, type, size;
    if (!read_line(dir + "level", &level) || !read_line(dir + "size", &size)) {
      if (i >= 4) break;  // indices are dense, but a missing one early is not the end
      continue;
    }
    if (read_line(dir + "type", &type) && type == "Instruction") continue;
    std::size_t value = 0, pos = 0;
    while (pos < size.size() && size[pos] >= '0' && size[pos] <= '9') value = value * 10 + (size[pos++] - '0');
    if (pos < size.size()) {
      const char unit = size[pos];
      value <<= unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : 0;
    }
    const int lv = std::atoi(level.c_str());
    if (lv > best_level || (lv == best_level && value > best)) {
      best_level = lv;
      best = value;
    }
  }
  return best;
}

namespace {
std::string mib_text(std::size_t bytes) { return std::to_string(bytes / kMiB) + " MiB"; }
}  // namespace

BandwidthBuffer plan_bandwidth_buffer(std::size_t llc_bytes, uint64_t available_bytes) {
  BandwidthBuffer b;
  b.wanted = std::max(kMinDramBytes, (kCacheMultiple * llc_bytes + kMiB - 1) / kMiB * kMiB);
  b.bytes = b.wanted;
  if (available_bytes > 0 && available_bytes / 2 < b.bytes)
    b.bytes = std::max<std::size_t>(kMinBandwidthBytes, static_cast<std::size_t>(available_bytes / 2 / kMiB * kMiB));
  return b;
}

void judge_peaks(const BandwidthBuffer& plan, const BandwidthTiming& memory, MachinePeaks* p) {
  p->read_bandwidth = memory.best;
  p->runs = memory.runs;
  p->buffer_bytes = memory.bytes;
  p->past_cache = memory.runs > 0 && plan.past_cache();
  p->plausible = true;
  p->note.clear();
  if (memory.runs == 0) {
    p->plausible = false;
    add_note(&p->note, "could not allocate " + mib_text(plan.bytes) + " for the bandwidth test");
  } else if (memory.best < 1e9) {
    p->plausible = false;
    add_note(&p->note, "read bandwidth " + gbps(memory.best) +
                           " is implausibly low (below 1 GB/s): the machine was busy; measure again when it is idle");
  } else if (memory.median < 0.5 * memory.best) {
    p->plausible = false;
    add_note(&p->note, "the " + std::to_string(memory.runs) + " passes disagree (median " + gbps(memory.median) +
                           ", best " + gbps(memory.best) +
                           "): something else was using the cores or memory; measure again when idle");
  }
  if (memory.runs > 0 && !p->past_cache) {
    // Memory was short: the figure is the largest buffer's, which the cache
    // may have served in part (up to llc / buffer of it).
    const std::string past = p->llc_bytes > 0 ? " reads past the " + mib_text(p->llc_bytes) + " last-level cache"
                                              : " is what the probe reads";
    const std::string why = "only " + mib_text(memory.bytes) + " of memory could be read (" + mib_text(plan.wanted) +
                            past + "; free memory and measure again)";
    if (p->llc_bytes > 0 && memory.bytes < 2 * p->llc_bytes) {
      p->plausible = false;
      add_note(&p->note, why + ": the bandwidth is mostly cache hits");
    } else {
      add_note(&p->note, why + ": the bandwidth may include some cache hits");
    }
  }
  if (memory.runs > 0 && !llc_figure_usable(p->llc_read_bandwidth, memory.best)) {
    add_note(&p->note, "the last-level cache read slower (" + gbps(p->llc_read_bandwidth) + ") than memory (" +
                           gbps(memory.best) + "): its figure is not used");
    p->llc_read_bandwidth = 0;
  }
  if (p->fp32_flops <= 0) {
    p->plausible = false;
    add_note(&p->note, "the FP32 compute test did not run");
  }
}

uint64_t probe_read_sum(const uint8_t* p, std::size_t n, bool simd) {
#ifdef PHASELAB_X86
  __builtin_cpu_init();
  simd = simd && __builtin_cpu_supports("avx2");
#endif
  return read_slice(p, n, simd);
}

std::string describe_machine_peaks(const MachinePeaks& p) {
  char buf[512];
  std::string s;
  std::snprintf(buf, sizeof buf, "read %.1f GB/s from memory (%d threads, %s of %zu MiB, best of %d", p.read_bandwidth / 1e9,
                p.threads, p.isa.rfind("avx2", 0) == 0 ? ("SIMD reads in " + std::to_string(kProbeReadWays) + " streams a thread").c_str() : "reads",
                p.buffer_bytes / kMiB, p.runs);
  s += buf;
  if (p.llc_bytes > 0 && p.past_cache) s += ", at least 4x the " + mib_text(p.llc_bytes) + " last-level cache";
  s += ")";
  if (p.llc_read_bandwidth > 0) {
    std::snprintf(buf, sizeof buf, ", %.1f GB/s from the %zu MiB last-level cache (%zu MiB read)",
                  p.llc_read_bandwidth / 1e9, p.llc_bytes / kMiB, p.llc_buffer_bytes / kMiB);
    s += buf;
  } else if (p.llc_bytes > 0 && !p.past_cache) {
    s += ", last-level cache " + mib_text(p.llc_bytes);
  }
  std::snprintf(buf, sizeof buf, "; FP32 %.0f GFLOP/s, int8 %.0f GOP/s", p.fp32_flops / 1e9, p.int8_ops / 1e9);
  s += buf;
  if (!p.plausible) s += "; doubtful: " + p.note;
  return s;
}

MachinePeaks better_peaks(const MachinePeaks& first, const MachinePeaks& second) {
  if (!second.plausible && first.plausible) return first;
  if (!first.plausible && second.plausible) return second;
  if (!first.plausible) return first;
  MachinePeaks p = first;
  p.read_bandwidth = std::max(first.read_bandwidth, second.read_bandwidth);
  p.llc_read_bandwidth = std::max(first.llc_read_bandwidth, second.llc_read_bandwidth);
  p.fp32_flops = std::max(first.fp32_flops, second.fp32_flops);
  p.int8_ops = std::max(first.int8_ops, second.int8_ops);
  p.runs = first.runs + second.runs;
  if (!second.note.empty() && second.note != first.note) add_note(&p.note, "after the tests: " + second.note);
  // judge_peaks' rule on the merged pair.
  if (!llc_figure_usable(p.llc_read_bandwidth, p.read_bandwidth)) p.llc_read_bandwidth = 0;
  return p;
}

bool peaks_differ(const MachinePeaks& a, const MachinePeaks& b, double tolerance) {
  auto differ = [&](double x, double y) { return std::fabs(x - y) > tolerance * std::max(x, y); };
  return differ(a.read_bandwidth, b.read_bandwidth) || differ(a.int8_ops, b.int8_ops) ||
         differ(a.fp32_flops, b.fp32_flops);
}

MachinePeaks measure_machine_peaks(int threads) {
  MachineProbeOptions o;
  o.threads = threads;
  return measure_machine_peaks(o);
}

MachinePeaks measure_machine_peaks(const MachineProbeOptions& options) {
  MachinePeaks p;
  const CpuLayout layout = cpu_layout();
  p.threads = options.threads > 0 ? options.threads : physical_core_count();
  // Thread t on cpus[t]: distinct physical cores first, then their siblings,
  // round robin when more threads than CPUs are asked for.
  std::vector<int> cpus = layout.cores;
  cpus.insert(cpus.end(), layout.siblings.begin(), layout.siblings.end());
  if (!cpus.empty())
    for (int t = static_cast<int>(cpus.size()); t < p.threads; t++) cpus.push_back(cpus[t % cpus.size()]);
  p.llc_bytes = options.llc_bytes ? *options.llc_bytes : last_level_cache_bytes();

  bool avx2 = false, fma = false, avxvnni = false, avx512vnni = false;
#ifdef PHASELAB_X86
  __builtin_cpu_init();
  avx2 = __builtin_cpu_supports("avx2");
  fma = avx2 && __builtin_cpu_supports("fma");
  avxvnni = avx2 && __builtin_cpu_supports("avxvnni");
  avx512vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vnni");
#endif
  p.isa = avx2 ? "avx2" : "portable";
  if (avx512vnni) p.isa += ", int8: avx512vnni";
  else if (avxvnni) p.isa += ", int8: avxvnni";

  // Memory: a buffer sized from the cache it must read past.
  const uint64_t avail = options.available_bytes ? *options.available_bytes : available_memory_bytes();
  const BandwidthBuffer plan = plan_bandwidth_buffer(p.llc_bytes, avail);
  const BandwidthTiming memory = probe_bandwidth(p.threads, cpus, plan.bytes, 1, avx2);

  // The cache: half of it, read over and over (the other half leaves room
  // for the code, the stacks and whatever the cache keeps of others).
  if (p.llc_bytes >= kMinLlcForFigure) {
    const std::size_t bytes = p.llc_bytes / 2;
    const int repeats = static_cast<int>(std::max<std::size_t>(1, kCachePassBytes / bytes));
    const BandwidthTiming cache = probe_bandwidth(p.threads, cpus, bytes, repeats, avx2);
    if (cache.runs > 0) {
      p.llc_read_bandwidth = cache.best;
      p.llc_buffer_bytes = cache.bytes;
    }
  }

  // Compute: short loops (about 10 ms each), best of five: a run that shared
  // a core with another process only counts if nothing better came.
  constexpr int kComputeRuns = 5;
  if (fma) {
#ifdef PHASELAB_X86
    p.fp32_flops = best_rate(p.threads, cpus, kComputeRuns, 4'000'000, fma_loop_avx2);
#endif
  } else {
    p.fp32_flops = best_rate(p.threads, cpus, kComputeRuns, 1'000'000, fma_loop_portable);
  }
#ifdef PHASELAB_X86
  if (avx512vnni)
    p.int8_ops = best_rate(p.threads, cpus, kComputeRuns, 2'000'000, int8_loop_avx512);
  else if (avxvnni)
    p.int8_ops = best_rate(p.threads, cpus, kComputeRuns, 2'000'000, int8_loop_avxvnni);
  else if (avx2)
    p.int8_ops = best_rate(p.threads, cpus, kComputeRuns, 2'000'000, int8_loop_avx2);
#endif

  judge_peaks(plan, memory, &p);
  return p;
}

double core_round_trip_ns() {
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.size() < 2) return -1;
  // A thread of its own pinned to the first allowed CPU, the pool's worker
  // to the second (the caller's own affinity stays as it was).
  double ns = -1;
  std::thread probe([&] {
    if (!pin_this_thread(cpus[0])) return;
    ThreadPool pool(2);
    if (!pool.pin({cpus[0], cpus[1]})) return;
    for (int i = 0; i < 3; i++) pool.run([](int, int) {});  // the worker awake and spinning
    std::vector<double> trips;
    for (int i = 0; i < 5; i++)
      if (const double t = pool.round_trip_ns(64); t > 0) trips.push_back(t);
    if (trips.empty()) return;
    std::sort(trips.begin(), trips.end());
    ns = trips[trips.size() / 2];
  });
  probe.join();
  return ns;
}

}  // namespace phaselab
