// The machine: its cores, its last-level cache, and the peaks a phase is
// measured against (memory read bandwidth for decode, FP32 and int8 compute
// for prefill). The peaks are measured, not looked up: a VM's memory bandwidth
// is not in any table. The front ends (phaselab-cli bench, the GUI's phase
// meter) share this one method, so their percentages agree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace phaselab {

// Physical cores this process may run on: unique (package, core) pairs among
// the CPUs of the affinity mask (Linux sysfs topology), so SMT siblings count
// once. Falls back to std::thread::hardware_concurrency() (at least 1).
int physical_core_count();

// The engine's default CPU thread count: one per physical core (as llama.cpp
// does: a second hyper-thread on a core competes for the same FMA units and
// memory bandwidth and makes decode slower, not faster).
int default_thread_count();

// Size of the largest (last-level) data or unified cache, from
// /sys/devices/system/cpu/cpu0/cache; 0 if unknown.
std::size_t last_level_cache_bytes();

struct MachinePeaks {
  // bytes/s read from memory (DRAM): the best of `runs` passes, all threads
  // reading their own slice of a buffer of at least 4x the last-level cache
  // and 512 MiB. This is the figure decode is divided by.
  double read_bandwidth = 0;
  // bytes/s read from a buffer of half the last-level cache, the same way:
  // the ceiling for weights that fit in that cache. 0 when the cache size is
  // unknown or under 4 MiB (then it is not the level that holds weights).
  double llc_read_bandwidth = 0;
  double fp32_flops = 0;       // FP32 FLOP/s: independent FMA chains on every thread
  double int8_ops = 0;         // 8-bit multiply-adds x 2 per second, with the instructions the fast
                               // CPU backend uses (AVX-512 VNNI, AVX-VNNI or AVX2); 0 if none
  int threads = 0;             // threads the probes ran on (one per physical core by default)
  std::size_t llc_bytes = 0;   // the last-level cache the probe read past (sysfs, or the options' size)
  std::size_t buffer_bytes = 0;      // what the memory passes read
  std::size_t llc_buffer_bytes = 0;  // what the cache passes read (0: not measured)
  bool past_cache = false;     // buffer_bytes >= 4x llc_bytes (or the cache size is unknown)
  int runs = 0;                // memory passes done (the best one counts)
  std::string isa;             // the loads and FMAs used: "avx2", "avx512vnni", "portable", ...
  bool plausible = false;      // false: a figure looks wrong (see note); do not divide by it, measure again
  std::string note;            // why a figure is doubtful or the buffer was smaller; empty when fine
};

// What the probe may use, and what tests inject in place of the machine's.
struct MachineProbeOptions {
  int threads = 0;  // 0: physical_core_count()
  // The last-level cache to read past; nullopt: last_level_cache_bytes().
  std::optional<std::size_t> llc_bytes;
  // Memory the buffer may come from; nullopt: available_memory_bytes().
  std::optional<uint64_t> available_bytes;
};

// The memory buffer's size for a last-level cache of `llc_bytes` (0:
// unknown) with `available_bytes` of memory (0: unknown): 4x the cache and
// at least 512 MiB, whole MiB, at most half of what is available (the probe
// must not push the machine into swap) and at least 64 MiB.
struct BandwidthBuffer {
  std::size_t bytes = 0;   // what to read
  std::size_t wanted = 0;  // what reading past the cache takes (max(4x llc, 512 MiB))
  bool past_cache() const { return bytes >= wanted; }
};
BandwidthBuffer plan_bandwidth_buffer(std::size_t llc_bytes, uint64_t available_bytes);

// What the memory passes timed.
struct BandwidthTiming {
  double best = 0;    // bytes/s
  double median = 0;  // bytes/s
  int runs = 0;
  std::size_t bytes = 0;  // the buffer read
};

// Decides p->plausible and p->note from the memory passes, the buffer plan
// and the figures already in *p (llc_bytes, llc_read_bandwidth, fp32_flops):
// the rules, kept apart from the timing so that tests can inject cache sizes
// and timings. Also sets read_bandwidth, runs, buffer_bytes and past_cache.
void judge_peaks(const BandwidthBuffer& plan, const BandwidthTiming& memory, MachinePeaks* p);

// Measures the peaks with `threads` threads (0: physical_core_count()), each
// pinned to its own physical core. About 0.5-2 s (more with a large cache):
// call it off any UI thread and not while a model is running (anything else
// busy lowers the figures).
MachinePeaks measure_machine_peaks(int threads = 0);
MachinePeaks measure_machine_peaks(const MachineProbeOptions& options);

// The memory probe's read of n bytes at p (32-byte aligned, n a multiple
// of 128: a remainder is not read), as a sum of its 64-bit words
// (wrapping): with simd the AVX2 loop in its four streams where the CPU has
// AVX2, else the portable one. Every byte is read once, so that the bytes
// the probe counts are the bytes it read (test_machine).
uint64_t probe_read_sum(const uint8_t* p, std::size_t n, bool simd);

// The peaks in one line, as bench and devices print them: which buffer each
// bandwidth read, the compute peaks, and "doubtful: <note>" when implausible.
std::string describe_machine_peaks(const MachinePeaks& p);

// Two probes of the same machine, in the same placement of its CPUs
// (bench's, before and after its tests), as one: each figure the larger of
// the two, since on one machine a probe only under-reads what it can do (a
// neighbour's burst), and a fraction of the limit must not rise because the
// limit was read at a bad moment. (Across placements that does not hold: a
// 2-vCPU VM reads half again as much memory bandwidth with its vCPUs on two
// CCDs as on one, and half the compute on one core's two hardware threads;
// bench and bench --batch merge only probes whose core_placement agrees.)
// A doubtful probe is left out (both doubtful: the first). Buffer sizes, threads and ISA are
// the first's; the cache figure is dropped if it reads slower than memory.
MachinePeaks better_peaks(const MachinePeaks& first, const MachinePeaks& second);

// Whether two MachinePeaks differ by more than `tolerance` (relative) in
// any of the figures bench divides by (memory read, int8, FP32).
bool peaks_differ(const MachinePeaks& a, const MachinePeaks& b, double tolerance);

// How long a cache line takes between the first two allowed CPUs and back,
// in nanoseconds (the median of five ThreadPool::round_trip_ns of 64 trips
// each, on a pool of two pinned to them): about 50 where their cores share
// a last-level cache, about 300 where they do not (two AMD CCDs). A VM's
// two vCPUs can move between the two placements from one minute to the
// next, and its speeds with them (docs/benchmarks.md), so bench prints it
// before and after its tests. Negative where fewer than two CPUs are
// allowed, pinning is refused, or the second thread did not come.
double core_round_trip_ns();

// Where two CPUs are, from core_round_trip_ns(). On the 2-vCPU Zen 4 VMs
// all three came and went (docs/benchmarks.md): 29-38 ns when both vCPUs
// were the two hardware threads of one core (the int8 probe then read
// 469 GOP/s against ~915: one core's execution units), 65-73 ns on two
// cores of one CCD, 210-300 ns on two CCDs (the read probe 45-52 GB/s
// against ~31).
enum class CorePlacement { unknown, one_core, shared_cache, apart };
inline constexpr double kOneCoreTripNs = 45;
inline constexpr double kSharedCacheTripNs = 150;
inline CorePlacement core_placement(double trip_ns) {
  if (trip_ns <= 0) return CorePlacement::unknown;
  if (trip_ns < kOneCoreTripNs) return CorePlacement::one_core;
  return trip_ns < kSharedCacheTripNs ? CorePlacement::shared_cache : CorePlacement::apart;
}
// Whether two round trips put the CPUs in different places: the machine
// changed between them. False where either was not measured.
inline bool placement_changed(double trip_a_ns, double trip_b_ns) {
  const CorePlacement a = core_placement(trip_a_ns), b = core_placement(trip_b_ns);
  return a != CorePlacement::unknown && b != CorePlacement::unknown && a != b;
}

// The cache figure applies to weights that fit in the last-level cache.
inline bool weights_fit_in_llc(const MachinePeaks& p, double weight_bytes) {
  return p.llc_read_bandwidth > 0 && weight_bytes > 0 && weight_bytes <= static_cast<double>(p.llc_bytes);
}

}  // namespace phaselab
