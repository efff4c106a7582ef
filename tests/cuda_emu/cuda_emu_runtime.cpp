// PhaseLab's CUDA emulator, host side: the part of the CUDA runtime and of
// cuBLAS that PhaseLab uses, on the CPU (see cuda_emu.h for what is checked).
//
// Model:
// - Device memory: each cudaMalloc is its own mapping with an inaccessible
//   page on either side and the buffer ending (to 16 bytes) at the upper
//   one, so a kernel that reads past its buffer faults, and the fault names
//   the kernel, block and thread.
// - Streams: work is queued and runs only when the host waits for it
//   (cudaStreamSynchronize, cudaDeviceSynchronize, a synchronous copy, a
//   free), in stream order. The legacy stream synchronises with blocking
//   streams, not with cudaStreamNonBlocking ones, as on a GPU.
// - Kernels: one block at a time; its threads are fibers that run until a
//   barrier (__syncthreads, or a shuffle, which is two warp barriers). Each
//   round of the schedule runs the threads in the opposite order of the
//   last, so that a missing barrier shows as a wrong result.
// - Graphs: a capture records the stream's work (kernel arguments copied at
//   launch, as on a GPU); replays run the records.
// One host thread uses the emulator at a time; the blocks of a grid run on
// all CPUs.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/context/fiber.hpp>
#include <chrono>
#include <condition_variable>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_emu.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local uint3 blockDim;
thread_local uint3 gridDim;

using Op = std::function<void()>;

struct CUstream_st {
  std::deque<Op> queue;
  bool non_blocking = false;
  bool capturing = false;
  bool capture_broken = false;
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
  std::thread::id capture_thread;  // who began the capture
  std::vector<Op> captured;
};
struct CUgraph_st {
  std::vector<Op> ops;
};
struct CUgraphExec_st {
  std::vector<Op> ops;
};
struct CUevent_st {
  bool recorded = false, done = false;
  std::chrono::steady_clock::time_point when;  // when the stream got to it
};
struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace phaselab::emu {

namespace {

// ---- errors ------------------------------------------------------------------

thread_local cudaError_t g_last = cudaSuccess;  // per host thread, as on a GPU; cleared by cudaGetLastError
std::atomic<cudaError_t> g_sticky{cudaSuccess};  // a fault in device work: every later call reports it

// One host thread in the emulated runtime at a time: its streams, allocations
// and captures are plain containers, and a grid's blocks take all the worker
// threads. Host threads of their own (a prefill worker beside the decode
// loop, each with its backend and stream) take turns at every API call; the
// blocks of a grid, run by the workers, never call the API.
std::recursive_mutex g_api_mu;
#define EMU_API_LOCK std::lock_guard<std::recursive_mutex> emu_api_lock(::phaselab::emu::g_api_mu)

void say(const std::string& m) { std::fprintf(stderr, "phaselab CUDA emulator: %s\n", m.c_str()); }

cudaError_t api_error(cudaError_t e, const std::string& m) {
  say(m);
  g_last = e;
  return e;
}
std::mutex g_fault_mu;  // faults come from the CPU threads that run blocks
void device_fault(cudaError_t e, const std::string& m) {
  std::lock_guard<std::mutex> lock(g_fault_mu);
  say(m);
  if (g_sticky == cudaSuccess) g_sticky = e;
}
cudaError_t status() { return g_sticky != cudaSuccess ? g_sticky.load() : cudaSuccess; }

// ---- memory ------------------------------------------------------------------

struct Mapping {
  void* base = nullptr;  // the mapping, guards included
  size_t bytes = 0;
};
// size bytes between two inaccessible pages, ending (to 16 bytes) at the upper one.
void* guarded_alloc(size_t size, Mapping* m) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t body = (std::max<size_t>(size, 1) + page - 1) / page * page;
  m->bytes = body + 2 * page;
  void* base = mmap(nullptr, m->bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  char* b = static_cast<char*>(base);
  if (mprotect(b + page, body, PROT_READ | PROT_WRITE) != 0) {
    munmap(base, m->bytes);
    return nullptr;
  }
  m->base = base;
#if defined(__SANITIZE_ADDRESS__)
  // A fresh mapping may reuse the addresses of a library that was
  // dlclose'd earlier (the loader closes CUDA libraries it refuses), whose
  // globals' redzones ASan left poisoned: the mapping is addressable.
  __asan_unpoison_memory_region(b + page, body);
#endif
  const uintptr_t end = reinterpret_cast<uintptr_t>(b + page + body);
  return reinterpret_cast<void*>((end - size) & ~uintptr_t{15});
}

struct Allocation {
  size_t size = 0;
  Mapping map;
  bool pinned = false;  // cudaMallocHost
};
std::map<uintptr_t, Allocation> g_allocs;  // by start address
size_t g_device_bytes = 0;

// The allocation holding p, or null.
const Allocation* find_alloc(const void* p, uintptr_t* start) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocs.upper_bound(a);
  if (it == g_allocs.begin()) return nullptr;
  --it;
  if (a > it->first + it->second.size) return nullptr;  // one past the end still belongs
  if (start) *start = it->first;
  return &it->second;
}

// The multiprocessors the emulator reports: an H200's 132 by default, so
// that launch policies decide as they would there (PHASELAB_EMU_SM_COUNT).
int emulated_sms() {
  const char* v = std::getenv("PHASELAB_EMU_SM_COUNT");
  return v && std::atoi(v) > 0 ? std::atoi(v) : 132;
}

size_t device_total() {
  const char* v = std::getenv("PHASELAB_EMU_DEVICE_MIB");
  const long mib = v ? std::atol(v) : 0;
  return (mib > 0 ? static_cast<size_t>(mib) : size_t{8192}) << 20;
}

// Where a copy's pointer lies: in device memory (whole range), host memory,
// or partly past the end of a device allocation (an error).
enum class Where { device, host, overflow };
Where where(const void* p, size_t bytes) {
  uintptr_t start = 0;
  const Allocation* a = find_alloc(p, &start);
  if (!a || a->pinned) return Where::host;
  return reinterpret_cast<uintptr_t>(p) + bytes <= start + a->size ? Where::device : Where::overflow;
}

cudaError_t check_copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind, const char* api) {
  if (count == 0) return cudaSuccess;
  if (!dst || !src) return api_error(cudaErrorInvalidValue, std::string(api) + ": null pointer");
  const Where d = where(dst, count), s = where(src, count);
  if (d == Where::overflow || s == Where::overflow)
    return api_error(cudaErrorInvalidValue, std::string(api) + ": " + std::to_string(count) + " bytes run past the end of the " +
                                                (d == Where::overflow ? "destination" : "source") + " device allocation");
  const bool ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyHostToDevice && d == Where::device && s == Where::host) ||
                  (kind == cudaMemcpyDeviceToHost && d == Where::host && s == Where::device) ||
                  (kind == cudaMemcpyDeviceToDevice && d == Where::device && s == Where::device) ||
                  (kind == cudaMemcpyHostToHost && d == Where::host && s == Where::host);
  if (!ok)
    return api_error(cudaErrorInvalidValue, std::string(api) + ": the pointers do not match the copy kind " +
                                                std::to_string(static_cast<int>(kind)) + " (destination " +
                                                (d == Where::device ? "device" : "host") + ", source " +
                                                (s == Where::device ? "device" : "host") + ")");
  return cudaSuccess;
}

// ---- streams -------------------------------------------------------------------

CUstream_st g_legacy;
std::vector<CUstream_st*> g_streams;

CUstream_st* resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return &g_legacy;
  return std::find(g_streams.begin(), g_streams.end(), s) != g_streams.end() ? s : nullptr;
}

void run_ops(CUstream_st& st) {
  while (!st.queue.empty()) {
    Op op = std::move(st.queue.front());
    st.queue.pop_front();
    if (g_sticky == cudaSuccess) op();  // after a fault the device does nothing more
  }
}
void flush_blocking() {
  run_ops(g_legacy);
  for (CUstream_st* s : g_streams)
    if (!s->non_blocking) run_ops(*s);
}
void flush_all() {
  run_ops(g_legacy);
  for (CUstream_st* s : g_streams) run_ops(*s);
}

// Whether s's capture forbids the calling thread the calls that could
// synchronise with it: a global capture forbids every thread, a thread-local
// one only the thread that began it, a relaxed one none.
bool capture_forbids_me(const CUstream_st* s) {
  if (!s->capturing) return false;
  switch (s->capture_mode) {
    case cudaStreamCaptureModeGlobal: return true;
    case cudaStreamCaptureModeThreadLocal: return s->capture_thread == std::this_thread::get_id();
    default: return false;
  }
}
bool capture_active() { return std::any_of(g_streams.begin(), g_streams.end(), capture_forbids_me); }
// A call that is not allowed while a stream captures: the capture is
// invalidated (cudaStreamEndCapture fails), as on a GPU.
cudaError_t refuse_during_capture(const char* api) {
  for (CUstream_st* s : g_streams)
    if (capture_forbids_me(s)) s->capture_broken = true;
  return api_error(cudaErrorStreamCaptureUnsupported, std::string(api) + " while a stream is being captured");
}

cudaError_t enqueue(cudaStream_t s, Op op, const char* api) {
  CUstream_st* st = resolve(s);
  if (!st) return api_error(cudaErrorInvalidResourceHandle, std::string(api) + ": not a live stream");
  if (st->capturing) {
    st->captured.push_back(std::move(op));
    return cudaSuccess;
  }
  if (st == &g_legacy && capture_active()) {
    for (CUstream_st* c : g_streams)
      if (c->capturing) c->capture_broken = true;
    return api_error(cudaErrorStreamCaptureImplicit, std::string(api) + " on the legacy stream while a stream is being captured");
  }
  // Implicit synchronisation: blocking streams wait for earlier legacy work and the other way round.
  if (st == &g_legacy) {
    for (CUstream_st* o : g_streams)
      if (!o->non_blocking) run_ops(*o);
  } else if (!st->non_blocking) {
    run_ops(g_legacy);
  }
  st->queue.push_back(std::move(op));
  return cudaSuccess;
}

// ---- kernels -------------------------------------------------------------------

constexpr size_t kStackBytes = size_t{32} << 10;

// Fixed-size fiber stacks, reused from one block to the next, each above an
// inaccessible page: a kernel that overflows its stack faults.
struct StackPool {
  std::vector<void*> free;
  ~StackPool() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    for (void* p : free) munmap(static_cast<char*>(p) - page, kStackBytes + page);
  }
};
struct PooledStack {
  StackPool* pool;
  boost::context::stack_context allocate() {
    void* p = nullptr;
    if (pool->free.empty()) {
      const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      void* m = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) throw std::bad_alloc();
      mprotect(m, page, PROT_NONE);
      p = static_cast<char*>(m) + page;
    } else {
      p = pool->free.back();
      pool->free.pop_back();
    }
    boost::context::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = static_cast<char*>(p) + kStackBytes;
    return sc;
  }
  void deallocate(boost::context::stack_context& sc) { pool->free.push_back(static_cast<char*>(sc.sp) - sc.size); }
};

enum class State { run, warp_wait, block_wait, done };

struct EmuThread {
  boost::context::fiber fiber;  // the thread, while suspended
  boost::context::fiber back;   // the scheduler, while the thread runs
  State state = State::run;
  uint3 idx{};
  unsigned shuffles = 0;  // how many this thread has done (all lanes of a warp agree)
};

struct Block {
  const char* kernel = "";
  std::vector<EmuThread> threads;
  std::vector<uint64_t> slots;  // shuffle values by thread
  void* smem = nullptr;
  int current = -1;  // the running thread
  bool failed = false;
};

thread_local Block* t_block = nullptr;
// For the fault handler: the kernel running, if any.
thread_local const char* t_kernel = nullptr;
struct sigaction g_old_segv, g_old_bus;
std::once_flag g_handler_once;

void on_fault(int sig, siginfo_t* info, void* uctx) {
  if (t_kernel) {
    char buf[512];
    const int n = std::snprintf(buf, sizeof buf,
                                "phaselab CUDA emulator: invalid memory access at %p in kernel %s, block (%u,%u,%u), "
                                "thread (%u,%u,%u)\n",
                                info->si_addr, t_kernel, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y,
                                threadIdx.z);
    if (n > 0) (void)!write(2, buf, static_cast<size_t>(std::min(n, static_cast<int>(sizeof buf) - 1)));
    // The default action when the access runs again: the process ends on
    // the fault, with the message above as its explanation.
    signal(sig, SIG_DFL);
    return;
  }
  // Not in a kernel: hand over to whoever handled the signal before (a test
  // framework, or the default).
  const struct sigaction& old = sig == SIGSEGV ? g_old_segv : g_old_bus;
  if (old.sa_flags & SA_SIGINFO) {
    if (old.sa_sigaction) return old.sa_sigaction(sig, info, uctx);
  } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
    return old.sa_handler(sig);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_fault_handler() {
  std::call_once(g_handler_once, [] {
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_old_segv);
  sigaction(SIGBUS, &sa, &g_old_bus);
  });
}

void wait_here(State s) {
  Block* b = t_block;
  if (!b || b->current < 0) {
    device_fault(cudaErrorLaunchFailure, "__syncthreads or a warp shuffle outside a kernel");
    return;
  }
  EmuThread& t = b->threads[b->current];
  t.state = s;
  t.back = std::move(t.back).resume();
}

std::string where_in_grid(const Block& b) {
  return std::string("kernel ") + b.kernel + ", block (" + std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) +
         "," + std::to_string(blockIdx.z) + ")";
}

// Runs one block to the end. False (and a fault recorded) when its threads
// cannot all get past a barrier.
bool run_block(Block& b, const std::function<void()>& body, StackPool& pool, size_t smem) {
  const int n = static_cast<int>(b.threads.size());
  if (b.smem) std::memset(b.smem, 0xFF, smem);  // shared memory starts as garbage (NaNs) in every block
  for (int i = 0; i < n; i++) {
    EmuThread& t = b.threads[i];
    t.state = State::run;
    t.shuffles = 0;
    t.fiber = boost::context::fiber(std::allocator_arg, PooledStack{&pool}, [&b, &body, i](boost::context::fiber&& back) {
      b.threads[i].back = std::move(back);
      body();
      b.threads[i].state = State::done;
      return std::move(b.threads[i].back);
    });
  }
  for (int round = 0;; round++) {
    const bool reverse = round % 2 == 1;
    for (int k = 0; k < n; k++) {
      const int i = reverse ? n - 1 - k : k;
      EmuThread& t = b.threads[i];
      if (t.state != State::run) continue;
      threadIdx = t.idx;
      b.current = i;
      t.fiber = std::move(t.fiber).resume();
      b.current = -1;
    }
    // Every thread now waits at a barrier or is done.
    bool released = false;
    std::string problem;  // what stops the block if nothing else can move
    std::string fault;    // what stops it now
    for (int w = 0; w < n && fault.empty(); w += 32) {
      const int lanes = std::min(32, n - w);
      int waiting = 0, done = 0;
      for (int l = 0; l < lanes; l++) {
        const State s = b.threads[w + l].state;
        waiting += s == State::warp_wait;
        done += s == State::done;
      }
      if (waiting == 32) {
        // The same shuffle for every lane: lanes of a warp at different
        // shuffles (divergent code) are undefined on a GPU.
        for (int l = 1; l < 32 && fault.empty(); l++)
          if (b.threads[w + l].shuffles != b.threads[w].shuffles)
            fault = "lanes of warp " + std::to_string(w / 32) + " at different shuffles (lane 0 at its shuffle " +
                    std::to_string(b.threads[w].shuffles) + ", lane " + std::to_string(l) + " at its shuffle " +
                    std::to_string(b.threads[w + l].shuffles) + ")";
        if (!fault.empty()) break;
        for (int l = 0; l < 32; l++) b.threads[w + l].state = State::run;
        released = true;
      } else if (waiting > 0 && problem.empty()) {
        problem = "a full-warp shuffle that only " + std::to_string(waiting) + " of the 32 lanes of warp " +
                  std::to_string(w / 32) + " reached (" + std::to_string(done) + " had exited" +
                  (lanes < 32 ? ", the block has a partial warp" : "") + ")";
      }
    }
    if (fault.empty()) {
      int live = 0, at_block = 0, at_warp = 0;
      for (const EmuThread& t : b.threads) {
        live += t.state != State::done;
        at_block += t.state == State::block_wait;
        at_warp += t.state == State::warp_wait;
      }
      if (released) continue;
      if (live == 0) return true;
      // A barrier must be reached by the whole block: CUDA leaves one that
      // exited threads skip undefined, so it is a fault here.
      if (at_warp == 0 && at_block == n) {
        for (EmuThread& t : b.threads) t.state = State::run;
        continue;
      }
      fault = !problem.empty() ? problem
                               : "a __syncthreads that " + std::to_string(n - at_block) + " of the block's " +
                                     std::to_string(n) + " threads never reached (" + std::to_string(n - live) +
                                     " had exited)";
    }
    device_fault(cudaErrorLaunchFailure, where_in_grid(b) + ": " + fault);
    b.failed = true;
    for (EmuThread& t : b.threads) t.fiber = boost::context::fiber();  // unwinds the suspended threads
    return false;
  }
}

// Runs one OS thread's share of a grid's blocks: the next block from the
// counter until there are none (or one has failed).
void run_blocks(const char* name, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body,
                std::atomic<uint64_t>& next, std::atomic<bool>& failed) {
  static thread_local StackPool pool;
  Block b;
  b.kernel = name;
  const int n = static_cast<int>(block.x * block.y * block.z);
  b.threads.resize(n);
  b.slots.assign(2 * static_cast<size_t>(n), 0);
  for (int i = 0; i < n; i++)
    b.threads[i].idx = uint3{static_cast<unsigned>(i) % block.x, static_cast<unsigned>(i) / block.x % block.y,
                             static_cast<unsigned>(i) / (block.x * block.y)};
  Mapping smem_map;
  if (smem > 0) b.smem = guarded_alloc(smem, &smem_map);
  gridDim = uint3{grid.x, grid.y, grid.z};
  blockDim = uint3{block.x, block.y, block.z};
  t_block = &b;
  t_kernel = name;
  const uint64_t total = static_cast<uint64_t>(grid.x) * grid.y * grid.z;
  for (uint64_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < total;) {
    blockIdx = uint3{static_cast<unsigned>(i % grid.x), static_cast<unsigned>(i / grid.x % grid.y),
                     static_cast<unsigned>(i / (static_cast<uint64_t>(grid.x) * grid.y))};
    if (!run_block(b, body, pool, smem)) failed = true;
  }
  t_block = nullptr;
  t_kernel = nullptr;
  if (smem_map.base) munmap(smem_map.base, smem_map.bytes);
}

// CPU threads that share a grid's blocks with the host thread (blocks are
// independent, so the results do not depend on who runs which).
// PHASELAB_EMU_THREADS sets their number (default: one per CPU).
class Workers {
 public:
  static Workers& get() {
    static Workers* w = new Workers();  // never destroyed: idle workers may outlive main
    return *w;
  }
  // 0 in a forked child, which has none of the threads.
  int count() const { return getpid() == pid_ ? static_cast<int>(threads_.size()) : 0; }
  // Runs job on every worker and on the calling thread; returns when all are done.
  // One grid at a time: host threads that launch on streams of their own
  // (two backends, say) take turns, as the workers hold one job.
  void run(const std::function<void()>& job) {
    std::lock_guard<std::mutex> one_grid(run_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      pending_ = count();
      generation_++;
    }
    cv_.notify_all();
    job();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  Workers() {
    const char* v = std::getenv("PHASELAB_EMU_THREADS");
    const int n = v && std::atoi(v) > 0 ? std::atoi(v) : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i < n; i++) threads_.emplace_back([this] { loop(); });
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void()>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = job_;
      }
      (*job)();
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
  const pid_t pid_ = getpid();
  std::vector<std::thread> threads_;
  std::mutex run_mu_;  // held by the host thread whose grid the workers run
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void()>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
};

void run_grid(const char* name, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  install_fault_handler();
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  const uint64_t total = static_cast<uint64_t>(grid.x) * grid.y * grid.z;
  const std::function<void()> job = [&] { run_blocks(name, grid, block, smem, body, next, failed); };
  if (total > 1 && Workers::get().count() > 0)
    Workers::get().run(job);
  else
    job();
}

}  // namespace

// ---- device side (cuda_emu.h) ----------------------------------------------------

void sync_block() { wait_here(State::block_wait); }

uint64_t shfl_xor_bits(unsigned mask, uint64_t bits, int lane_mask, int width) {
  Block* b = t_block;
  if (!b || b->current < 0) {
    device_fault(cudaErrorLaunchFailure, "a warp shuffle outside a kernel");
    return bits;
  }
  if (mask != 0xffffffffu || width != 32) {
    device_fault(cudaErrorNotSupported, where_in_grid(*b) + ": only full-warp shuffles of width 32 are emulated");
    return bits;
  }
  // One warp barrier per shuffle: the slots alternate between two halves,
  // so a lane's next write (to the other half) cannot clobber a value a
  // slower lane has yet to read, and the write after that comes only once
  // every lane has passed the next barrier, that is, has read.
  const int me = b->current;
  const size_t n = b->threads.size();
  uint64_t* half = b->slots.data() + (b->threads[me].shuffles++ % 2) * n;
  half[me] = bits;
  wait_here(State::warp_wait);  // every lane has put its value
  const int partner = (me & ~31) | ((me & 31) ^ (lane_mask & 31));
  return half[partner];
}

void* dynamic_shared() { return t_block ? t_block->smem : nullptr; }

bool device_accessible(const void* p, size_t bytes) {
  EMU_API_LOCK;
  uintptr_t start = 0;
  const Allocation* a = find_alloc(p, &start);
  return a && reinterpret_cast<uintptr_t>(p) + bytes <= start + a->size;
}

void bad_pointer_argument(const char* name, int index, const void* p) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%p", p);
  device_fault(cudaErrorIllegalAddress, std::string("kernel ") + name + ": argument " + std::to_string(index) + " (" + buf +
                                            ") is not device memory");
}

void launch_grid(const char* name, dim3 grid, dim3 block, size_t smem, cudaStream_t s, std::function<void()> body) {
  EMU_API_LOCK;
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > static_cast<unsigned>(INT_MAX) || grid.y > 65535 ||
      grid.z > 65535 || threads == 0 || threads > 1024 || block.z > 64) {
    api_error(cudaErrorInvalidConfiguration,
              std::string("kernel ") + name + ": invalid configuration, grid (" + std::to_string(grid.x) + "," +
                  std::to_string(grid.y) + "," + std::to_string(grid.z) + "), block (" + std::to_string(block.x) + "," +
                  std::to_string(block.y) + "," + std::to_string(block.z) + ")");
    return;
  }
  if (smem > (size_t{48} << 10)) {
    api_error(cudaErrorInvalidValue, std::string("kernel ") + name + ": " + std::to_string(smem) +
                                         " bytes of dynamic shared memory (48 KiB without an opt-in)");
    return;
  }
  enqueue(s, [name, grid, block, smem, body = std::move(body)] { run_grid(name, grid, block, smem, body); }, name);
}

}  // namespace phaselab::emu

// ---- the CUDA runtime API --------------------------------------------------------

using namespace phaselab::emu;

cudaError_t cudaGetLastError() {
  EMU_API_LOCK;
  const cudaError_t e = g_sticky != cudaSuccess ? g_sticky.load() : g_last;
  g_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return g_sticky != cudaSuccess ? g_sticky.load() : g_last; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotReady: return "device not ready";
    default: return "unknown error";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  EMU_API_LOCK;
  if (!count) return api_error(cudaErrorInvalidValue, "cudaGetDeviceCount: null pointer");
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  EMU_API_LOCK;
  return device == 0 ? cudaSuccess : api_error(cudaErrorInvalidDevice, "cudaSetDevice: the emulator has device 0 only");
}
cudaError_t cudaGetDevice(int* device) {
  EMU_API_LOCK;
  if (!device) return api_error(cudaErrorInvalidValue, "cudaGetDevice: null pointer");
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  EMU_API_LOCK;
  if (!p || device != 0) return api_error(cudaErrorInvalidValue, "cudaGetDeviceProperties: bad arguments");
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "PhaseLab CUDA emulator (CPU)");
  p->totalGlobalMem = device_total();
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = emulated_sms();
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->sharedMemPerBlock = size_t{48} << 10;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  EMU_API_LOCK;
  if (!value || device != 0) return api_error(cudaErrorInvalidValue, "cudaDeviceGetAttribute: bad arguments");
  switch (attr) {
    case cudaDevAttrMemoryClockRate: *value = 1000000; break;  // kHz: with 64 bits, "16 GB/s"
    case cudaDevAttrGlobalMemoryBusWidth: *value = 64; break;
    case cudaDevAttrClockRate: *value = 1000000; break;
    case cudaDevAttrMultiProcessorCount: *value = emulated_sms(); break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    default: *value = 0;
  }
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
  EMU_API_LOCK;
  if (!free_b || !total_b) return api_error(cudaErrorInvalidValue, "cudaMemGetInfo: null pointer");
  const size_t total = device_total();
  *total_b = total;
  *free_b = total > g_device_bytes ? total - g_device_bytes : 0;
  return cudaSuccess;
}

namespace {
cudaError_t allocate(void** p, size_t size, bool pinned, const char* api) {
  EMU_API_LOCK;
  if (!p) return api_error(cudaErrorInvalidValue, std::string(api) + ": null pointer");
  *p = nullptr;
  if (size == 0) return cudaSuccess;
  if (!pinned && g_device_bytes + size > device_total())
    return api_error(cudaErrorMemoryAllocation, std::string(api) + ": " + std::to_string(size >> 20) + " MiB requested, " +
                                                    std::to_string((device_total() - g_device_bytes) >> 20) + " MiB free");
  Allocation a;
  a.size = size;
  a.pinned = pinned;
  void* data = guarded_alloc(size, &a.map);
  if (!data) return api_error(cudaErrorMemoryAllocation, std::string(api) + ": the host is out of memory");
  // New device memory holds garbage on a GPU: NaNs here, so that reading
  // what was never written shows.
  if (!pinned) std::memset(data, 0xFF, size);
  g_allocs[reinterpret_cast<uintptr_t>(data)] = a;
  if (!pinned) g_device_bytes += size;
  *p = data;
  return cudaSuccess;
}
cudaError_t release(void* p, bool pinned, const char* api) {
  EMU_API_LOCK;
  if (!p) return cudaSuccess;
  if (capture_active()) return refuse_during_capture(api);
  flush_all();  // freeing waits for the device, as on a GPU
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end() || it->second.pinned != pinned)
    return api_error(cudaErrorInvalidValue, std::string(api) + ": not a pointer this allocator returned");
  munmap(it->second.map.base, it->second.map.bytes);
  if (!pinned) g_device_bytes -= it->second.size;
  g_allocs.erase(it);
  return status();
}
}  // namespace

cudaError_t cudaMalloc(void** p, size_t size) {
  EMU_API_LOCK;
  if (capture_active()) return refuse_during_capture("cudaMalloc");
  return allocate(p, size, false, "cudaMalloc");
}
cudaError_t cudaFree(void* p) { return release(p, false, "cudaFree"); }
cudaError_t cudaMallocHost(void** p, size_t size) { return allocate(p, size, true, "cudaMallocHost"); }
cudaError_t cudaHostAlloc(void** p, size_t size, unsigned int) { return allocate(p, size, true, "cudaHostAlloc"); }
cudaError_t cudaFreeHost(void* p) { return release(p, true, "cudaFreeHost"); }

// A synchronous copy to the device returns once the source has been read:
// the data lands when the legacy stream gets to it, so work on a
// non-blocking stream that does not wait for it (cudaDeviceSynchronize)
// sees the old contents, as it may on a GPU. Copies to the host wait for
// the legacy stream and the blocking streams, and land at once.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  EMU_API_LOCK;
  if (capture_active()) return refuse_during_capture("cudaMemcpy");
  if (cudaError_t e = check_copy(dst, src, count, kind, "cudaMemcpy"); e != cudaSuccess) return e;
  if (count == 0) return status();
  if (where(dst, count) == Where::device) {
    auto data = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                             static_cast<const unsigned char*>(src) + count);
    if (cudaError_t e = enqueue(nullptr, [dst, data] { std::memcpy(dst, data->data(), data->size()); }, "cudaMemcpy");
        e != cudaSuccess)
      return e;
    return status();
  }
  flush_blocking();
  if (g_sticky != cudaSuccess) return g_sticky;
  std::memmove(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  EMU_API_LOCK;
  if (cudaError_t e = check_copy(dst, src, count, kind, "cudaMemcpyAsync"); e != cudaSuccess) return e;
  if (count == 0) return status();
  // The source is read when the stream gets to the copy, as a GPU reads
  // pinned memory: host code that reuses the buffer too early is caught.
  if (cudaError_t e = enqueue(stream, [dst, src, count] { std::memmove(dst, src, count); }, "cudaMemcpyAsync");
      e != cudaSuccess)
    return e;
  return status();
}
cudaError_t cudaMemset(void* p, int value, size_t count) {
  EMU_API_LOCK;
  if (capture_active()) return refuse_during_capture("cudaMemset");
  if (count && where(p, count) != Where::device)
    return api_error(cudaErrorInvalidValue, "cudaMemset: not a device range of " + std::to_string(count) + " bytes");
  if (count == 0) return status();
  if (cudaError_t e = enqueue(nullptr, [p, value, count] { std::memset(p, value, count); }, "cudaMemset"); e != cudaSuccess)
    return e;  // lands when the legacy stream gets to it, like a copy to the device
  return status();
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t stream) {
  EMU_API_LOCK;
  if (count && where(p, count) != Where::device)
    return api_error(cudaErrorInvalidValue, "cudaMemsetAsync: not a device range of " + std::to_string(count) + " bytes");
  if (cudaError_t e = enqueue(stream, [p, value, count] { std::memset(p, value, count); }, "cudaMemsetAsync");
      e != cudaSuccess)
    return e;
  return status();
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  EMU_API_LOCK;
  if (!s) return api_error(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: null pointer");
  auto* st = new CUstream_st;
  st->non_blocking = (flags & cudaStreamNonBlocking) != 0;
  g_streams.push_back(st);
  *s = st;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  EMU_API_LOCK;
  CUstream_st* st = resolve(s);
  if (!st || st == &g_legacy) return api_error(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: not a created stream");
  if (st->capturing) return refuse_during_capture("cudaStreamDestroy");
  run_ops(*st);  // its work still completes
  g_streams.erase(std::find(g_streams.begin(), g_streams.end(), st));
  delete st;
  return status();
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  EMU_API_LOCK;
  CUstream_st* st = resolve(s);
  if (!st) return api_error(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: not a live stream");
  if (st->capturing) st->capture_broken = true;  // whoever asks: a capturing stream has no work to wait for
  if (capture_active() || st->capturing) return refuse_during_capture("cudaStreamSynchronize");
  if (st == &g_legacy)
    flush_blocking();
  else
    run_ops(*st);
  return status();
}
cudaError_t cudaDeviceSynchronize() {
  EMU_API_LOCK;
  if (capture_active()) return refuse_during_capture("cudaDeviceSynchronize");
  flush_all();
  return status();
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  EMU_API_LOCK;
  CUstream_st* st = resolve(s);
  if (!st) return api_error(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture: not a live stream");
  if (st == &g_legacy) return api_error(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture: the legacy stream cannot be captured");
  if (st->capturing) return api_error(cudaErrorIllegalState, "cudaStreamBeginCapture: the stream is already capturing");
  st->capturing = true;
  st->capture_mode = mode;
  st->capture_thread = std::this_thread::get_id();
  st->capture_broken = false;
  st->captured.clear();
  return status();
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  EMU_API_LOCK;
  CUstream_st* st = resolve(s);
  if (!st || !g) return api_error(cudaErrorInvalidValue, "cudaStreamEndCapture: bad arguments");
  *g = nullptr;
  if (!st->capturing) return api_error(cudaErrorIllegalState, "cudaStreamEndCapture: the stream is not capturing");
  st->capturing = false;
  std::vector<Op> ops = std::move(st->captured);
  st->captured.clear();
  if (st->capture_broken) return api_error(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture: the capture was invalidated");
  *g = new CUgraph_st{std::move(ops)};
  return status();
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long) {
  EMU_API_LOCK;
  if (!exec || !g) return api_error(cudaErrorInvalidValue, "cudaGraphInstantiate: bad arguments");
  *exec = new CUgraphExec_st{g->ops};
  return status();
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  EMU_API_LOCK;
  if (!exec) return api_error(cudaErrorInvalidValue, "cudaGraphLaunch: null graph");
  for (const Op& op : exec->ops)
    if (cudaError_t e = enqueue(s, op, "cudaGraphLaunch"); e != cudaSuccess) return e;
  return status();
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  EMU_API_LOCK;
  delete g;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  EMU_API_LOCK;
  delete exec;
  return cudaSuccess;
}

// Events: a timestamp taken when the stream reaches the record (host time:
// the emulator's, which says nothing about a GPU's).
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  EMU_API_LOCK;
  if (!e) return api_error(cudaErrorInvalidValue, "cudaEventCreate: null pointer");
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  EMU_API_LOCK;
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  EMU_API_LOCK;
  if (!e) return api_error(cudaErrorInvalidResourceHandle, "cudaEventRecord: null event");
  e->recorded = true;
  e->done = false;
  if (cudaError_t err = enqueue(s, [e] {
        e->when = std::chrono::steady_clock::now();
        e->done = true;
      }, "cudaEventRecord");
      err != cudaSuccess)
    return err;
  return status();
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  EMU_API_LOCK;
  if (!e) return api_error(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: null event");
  if (capture_active()) return refuse_during_capture("cudaEventSynchronize");
  flush_all();
  return status();
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  EMU_API_LOCK;
  if (!ms || !a || !b) return api_error(cudaErrorInvalidValue, "cudaEventElapsedTime: bad arguments");
  if (!a->done || !b->done) return api_error(cudaErrorNotReady, "cudaEventElapsedTime: an event has not completed");
  *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return cudaSuccess;
}

// ---- cuBLAS ------------------------------------------------------------------------

cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  EMU_API_LOCK;
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  EMU_API_LOCK;
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  EMU_API_LOCK;
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t) {
  EMU_API_LOCK;
  return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

namespace {
size_t type_bytes(cudaDataType t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    default: return 0;
  }
}
float load(cudaDataType t, const void* p, size_t i) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(p)[i]);
    default: return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16);
  }
}
// The bytes of a column-major rows x cols matrix with leading dimension ld.
size_t extent(int rows, int cols, int ld, size_t elem) {
  return rows == 0 || cols == 0 ? 0 : (static_cast<size_t>(cols - 1) * ld + rows) * elem;
}
}  // namespace

// C (m x n) = alpha op(A) (m x k) op(B) (k x n) + beta C, column-major, as
// cuBLAS defines it: op(A)(i, l) = A[i + l lda] (N) or A[l + i lda] (T).
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  EMU_API_LOCK;
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m) ||
      !alpha || !beta) {
    say("cublasGemmEx: invalid sizes or leading dimensions (m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " +
        std::to_string(k) + ", lda " + std::to_string(lda) + ", ldb " + std::to_string(ldb) + ", ldc " +
        std::to_string(ldc) + ")");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // The combinations cuBLAS documents for these types: 16-bit or FP32 inputs
  // with FP32 compute; the FAST_16BF / FAST_TF32 compute types only with
  // FP32 inputs and output (computed here in full FP32).
  const bool fast = compute == CUBLAS_COMPUTE_32F_FAST_16BF || compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  if (Atype != Btype || type_bytes(Atype) == 0 || (Ctype != CUDA_R_32F && Ctype != Atype) ||
      (compute != CUBLAS_COMPUTE_32F && !fast) || (fast && (Atype != CUDA_R_32F || Ctype != CUDA_R_32F))) {
    say("cublasGemmEx: a type combination the emulator does not implement");
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const size_t ea = type_bytes(Atype), ec = type_bytes(Ctype);
  if (!device_accessible(A, extent(ta ? k : m, ta ? m : k, lda, ea)) ||
      !device_accessible(B, extent(tb ? n : k, tb ? k : n, ldb, ea)) || !device_accessible(C, extent(m, n, ldc, ec))) {
    say("cublasGemmEx: A, B or C is not a device buffer of the size its shape and leading dimension need");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // Host pointer mode: alpha and beta are read now.
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const cudaError_t e = enqueue(h->stream, [=] {
    for (int j = 0; j < n; j++)
      for (int i = 0; i < m; i++) {
        float acc = 0.f;
        for (int l = 0; l < k; l++) {
          const float a = load(Atype, A, ta ? l + static_cast<size_t>(i) * lda : i + static_cast<size_t>(l) * lda);
          const float b = load(Btype, B, tb ? j + static_cast<size_t>(l) * ldb : l + static_cast<size_t>(j) * ldb);
          acc += a * b;
        }
        const size_t ci = i + static_cast<size_t>(j) * ldc;
        const float c = be != 0.f ? be * load(Ctype, C, ci) : 0.f;  // beta 0: C is not read
        const float r = al * acc + c;
        if (Ctype == CUDA_R_32F)
          static_cast<float*>(C)[ci] = r;
        else if (Ctype == CUDA_R_16F)
          static_cast<__half*>(C)[ci] = __float2half_rn(r);
        else
          static_cast<__nv_bfloat16*>(C)[ci] = __float2bfloat16_rn(r);
      }
  }, "cublasGemmEx");
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
