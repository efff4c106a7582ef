// A persistent pool of worker threads for data-parallel loops. Threads are
// created once. Work is split into chunks that threads claim one at a time
// (the caller included), so a worker the OS has not scheduled never holds the
// others up: the caller simply does its chunks. Workers spin briefly, then
// yield, then sleep, so the many short parallel sections of a decode step do
// not each pay a kernel wake-up, and a machine with more runnable threads
// than cores (a GUI beside the engine) is not starved by spinning. No
// allocation per call: safe in the decode loop.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace phaselab {

// A warning for the front ends when more threads are asked for than the
// machine has hardware threads (they then slow each other down), else empty.
std::string thread_count_warning(int threads);

// The CPUs this process may run on (its affinity mask), in order; empty
// where the platform does not say.
std::vector<int> allowed_cpus();
// Pins the calling thread to one CPU; false where the platform refuses.
bool pin_this_thread(int cpu);

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Pins worker thread i (1 .. size()-1) to cpus[i % cpus.size()]; the
  // calling thread, which does chunks too, pins itself (pin_this_thread to
  // cpus[0]). False where the platform refuses.
  bool pin(const std::vector<int>& cpus);

  // Runs fn(chunk, thread) once for every chunk in [0, n_chunks) and waits.
  // thread (< size()) identifies the executing thread, for its scratch
  // buffers. fn must not throw.
  void for_chunks(int n_chunks, const std::function<void(int chunk, int thread)>& fn);

  // Runs fn(i, n) for i in [0, n = size()): each i once, on some thread; i
  // may index per-slot scratch (no two calls with the same i overlap).
  void run(const std::function<void(int i, int n)>& fn) {
    for_chunks(n_threads_, [&](int c, int) { fn(c, n_threads_); });
  }

  // The time a cache line takes to go from one of the pool's threads to
  // another and back (a flag passed n_trips times, the mean), in
  // nanoseconds: ~50 between cores that share a last-level cache, ~300
  // between AMD CCDs. Negative when the pool has one thread, or when a
  // second thread did not take its part within 20 ms (one thread then ran
  // both; it does not wait for itself).
  double round_trip_ns(int n_trips = 64);

  // Splits [0, n) into contiguous ranges, one per slot.
  template <typename F>
  void parallel_for(int64_t n, F&& body) {
    if (n_threads_ == 1 || n < 2) {
      body(int64_t{0}, n);
      return;
    }
    run([&](int i, int nth) {
      const int64_t chunk = (n + nth - 1) / nth;
      const int64_t begin = i * chunk;
      const int64_t end = begin + chunk < n ? begin + chunk : n;
      if (begin < end) body(begin, end);
    });
  }

 private:
  void worker(int ith);
  void work(uint32_t generation, int thread);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_;
  const std::function<void(int, int)>* fn_ = nullptr;
  uint32_t generation_ = 0;          // the caller's count of jobs
  std::atomic<uint64_t> state_{0};   // generation << 32 | chunk count << 16 | next chunk to claim
  std::atomic<int> done_{0};         // chunks of the current job finished
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace phaselab
