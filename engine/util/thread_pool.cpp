#include "phaselab/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PHASELAB_PAUSE() _mm_pause()
#else
#define PHASELAB_PAUSE() std::this_thread::yield()
#endif

namespace phaselab {

namespace {
// A few microseconds of pausing, then yielding to other threads, then sleep.
constexpr int kSpinPauses = 20000;
constexpr int kSpinYields = 200;
constexpr int kMaxChunks = 0xffff;
}  // namespace

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
#endif
  return cpus;
}

namespace {
#if defined(__linux__)
bool pin_thread(pthread_t t, int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(t, sizeof(set), &set) == 0;
}
#endif
}  // namespace

bool pin_this_thread(int cpu) {
#if defined(__linux__)
  return pin_thread(pthread_self(), cpu);
#else
  (void)cpu;
  return false;
#endif
}

bool ThreadPool::pin(const std::vector<int>& cpus) {
  if (cpus.empty()) return false;
  bool ok = true;
#if defined(__linux__)
  for (size_t i = 0; i < threads_.size(); i++)
    ok = pin_thread(threads_[i].native_handle(), cpus[(i + 1) % cpus.size()]) && ok;
#else
  ok = false;
#endif
  return ok;
}

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

// Claims and runs chunks of job `generation` until none is left. The state
// word holds (generation, chunk count, next chunk) and a chunk is claimed by a
// compare-and-swap on all three, so a thread that looks late can neither take
// a chunk of a finished job nor one of the next job under the old count.
void ThreadPool::work(uint32_t generation, int thread) {
  for (;;) {
    uint64_t s = state_.load(std::memory_order_acquire);
    if (static_cast<uint32_t>(s >> 32) != generation) return;
    const int chunk = static_cast<int>(s & 0xffffu);
    const int n_chunks = static_cast<int>((s >> 16) & 0xffffu);
    if (chunk >= n_chunks) return;
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) continue;
    (*fn_)(chunk, thread);
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::for_chunks(int n_chunks, const std::function<void(int, int)>& fn) {
  if (n_chunks <= 0) return;
  if (n_threads_ == 1 || n_chunks == 1) {
    for (int c = 0; c < n_chunks; c++) fn(c, 0);
    return;
  }
  if (n_chunks > kMaxChunks) {  // the state word counts chunks in 16 bits
    for (int base = 0; base < n_chunks; base += kMaxChunks) {
      const int n = std::min(kMaxChunks, n_chunks - base);
      for_chunks(n, [&](int c, int thread) { fn(base + c, thread); });
    }
    return;
  }
  fn_ = &fn;
  done_.store(0, std::memory_order_relaxed);
  const uint32_t gen = ++generation_;
  {
    // Publishing under the lock pairs with the sleepers' predicate check.
    std::lock_guard lock(mutex_);
    state_.store((static_cast<uint64_t>(gen) << 32) | (static_cast<uint64_t>(n_chunks) << 16),
                 std::memory_order_release);
  }
  if (sleepers_.load(std::memory_order_acquire) > 0) wake_.notify_all();
  work(gen, 0);
  // Only chunks already claimed by other threads remain: wait for them.
  int spins = 0;
  while (done_.load(std::memory_order_acquire) != n_chunks) {
    if (++spins < kSpinPauses) PHASELAB_PAUSE();
    else std::this_thread::yield();
  }
}

void ThreadPool::worker(int ith) {
  uint32_t seen = 0;
  for (;;) {
    int spins = 0;
    auto current = [&] { return static_cast<uint32_t>(state_.load(std::memory_order_acquire) >> 32); };
    while (current() == seen && !stop_.load(std::memory_order_relaxed)) {
      if (spins < kSpinPauses) {
        PHASELAB_PAUSE();
      } else if (spins < kSpinPauses + kSpinYields) {
        std::this_thread::yield();
      } else {
        std::unique_lock lock(mutex_);
        sleepers_.fetch_add(1, std::memory_order_acq_rel);
        wake_.wait(lock, [&] { return stop_.load() || current() != seen; });
        sleepers_.fetch_sub(1, std::memory_order_acq_rel);
      }
      spins++;
    }
    if (stop_.load()) return;
    seen = current();
    work(seen, ith);
  }
}

double ThreadPool::round_trip_ns(int n_trips) {
  if (n_threads_ < 2 || n_trips < 1) return -1;
  // Slots 0 and 1 pass the ball; each waits for the other to arrive first,
  // so that one thread running both slots in turn gives up rather than
  // waits for itself.
  alignas(64) std::atomic<int> ball{0};
  alignas(64) std::atomic<int> arrived{0};
  std::atomic<bool> gave_up{false};
  double ns = -1;
  run([&](int i, int) {
    if (i > 1) return;
    arrived.fetch_add(1, std::memory_order_acq_rel);
    if (i == 1) {
      for (int k = 0; k < n_trips; k++) {
        while (ball.load(std::memory_order_acquire) != 2 * k + 1) {
          if (gave_up.load(std::memory_order_acquire)) return;
          PHASELAB_PAUSE();
        }
        ball.store(2 * k + 2, std::memory_order_release);
      }
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    while (arrived.load(std::memory_order_acquire) < 2) {
      if (std::chrono::steady_clock::now() > deadline) {
        gave_up.store(true, std::memory_order_release);
        return;
      }
      std::this_thread::yield();  // (the other thread may be waiting for this core)
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < n_trips; k++) {
      ball.store(2 * k + 1, std::memory_order_release);
      while (ball.load(std::memory_order_acquire) != 2 * k + 2) PHASELAB_PAUSE();
    }
    ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n_trips;
  });
  return ns;
}

std::string thread_count_warning(int threads) {
  const unsigned hw = std::thread::hardware_concurrency();
  if (hw == 0 || threads <= static_cast<int>(hw)) return {};
  return std::to_string(threads) + " threads on " + std::to_string(hw) +
         " hardware threads will be slower, not faster (the default is one per core)";
}

}  // namespace phaselab
