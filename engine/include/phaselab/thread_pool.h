// A persistent pool of worker threads for data-parallel loops. Threads are
// created once; run() wakes them, every thread (the caller included) calls
// fn(thread_index, n_threads), and run() returns when all are done. Workers
// spin briefly before sleeping, so the many short parallel sections of a
// decode step do not pay a kernel wake-up each. No allocation per call, so it
// is safe in the decode loop.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace phaselab {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(ith, nth) on all threads and waits. fn must not throw.
  void run(const std::function<void(int ith, int nth)>& fn);

  // Splits [0, n) into contiguous chunks, one per thread.
  template <typename F>
  void parallel_for(int64_t n, F&& body) {
    if (n_threads_ == 1 || n < 2) {
      body(int64_t{0}, n);
      return;
    }
    run([&](int ith, int nth) {
      const int64_t chunk = (n + nth - 1) / nth;
      const int64_t begin = ith * chunk;
      const int64_t end = begin + chunk < n ? begin + chunk : n;
      if (begin < end) body(begin, end);
    });
  }

 private:
  void worker(int ith);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace phaselab
