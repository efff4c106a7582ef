#include "phaselab/thread_pool.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PHASELAB_PAUSE() _mm_pause()
#else
#define PHASELAB_PAUSE() std::this_thread::yield()
#endif

namespace phaselab {

namespace {
// About 50-100 microseconds of spinning before a worker goes to sleep.
constexpr int kSpinIterations = 20000;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; i++) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // Publishing under the lock pairs with the sleepers' predicate check.
    std::lock_guard lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (sleepers_.load(std::memory_order_acquire) > 0) wake_.notify_all();
  fn(0, n_threads_);
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (++spins < kSpinIterations) PHASELAB_PAUSE();
    else std::this_thread::yield();
  }
  job_ = nullptr;
}

void ThreadPool::worker(int ith) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && !stop_.load(std::memory_order_relaxed)) {
      if (++spins < kSpinIterations) {
        PHASELAB_PAUSE();
        continue;
      }
      std::unique_lock lock(mutex_);
      sleepers_.fetch_add(1, std::memory_order_acq_rel);
      wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      sleepers_.fetch_sub(1, std::memory_order_acq_rel);
      break;
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    (*job_)(ith, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace phaselab
