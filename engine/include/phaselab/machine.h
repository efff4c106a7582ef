// The machine: its cores, its last-level cache, and the peaks a phase is
// measured against (memory read bandwidth for decode, FP32 and int8 compute
// for prefill). The peaks are measured, not looked up: a VM's memory bandwidth
// is not in any table. The front ends (phaselab-cli bench, the GUI's phase
// meter) share this one method, so their percentages agree.
#pragma once

#include <cstddef>
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
  double read_bandwidth = 0;   // bytes/s: the best of `runs` passes, all threads reading their own slice
  double fp32_flops = 0;       // FP32 FLOP/s: independent FMA chains on every thread
  double int8_ops = 0;         // 8-bit multiply-adds x 2 per second, with the instructions the fast
                               // CPU backend uses (AVX-512 VNNI, AVX-VNNI or AVX2); 0 if none
  int threads = 0;             // threads the probes ran on (one per physical core by default)
  std::size_t llc_bytes = 0;   // last_level_cache_bytes()
  std::size_t buffer_bytes = 0;  // what the bandwidth passes read (512 MiB unless memory is short)
  int runs = 0;                // bandwidth passes done (the best one counts)
  std::string isa;             // the loads and FMAs used: "avx2", "avx512vnni", "portable", ...
  bool plausible = false;      // false: a figure looks wrong (see note); offer to measure again
  std::string note;            // why a figure is doubtful or the buffer was smaller; empty when fine
};

// Measures the peaks with `threads` threads (0: physical_core_count()), each
// pinned to its own physical core. About 0.5-1.5 s: call it off any UI thread
// and not while a model is running (anything else busy lowers the figures).
MachinePeaks measure_machine_peaks(int threads = 0);

}  // namespace phaselab
