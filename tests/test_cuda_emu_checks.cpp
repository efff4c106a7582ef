// The CUDA emulator (tests/cuda_emu) is an oracle for the CUDA backend in CI,
// so it is tested too: each misuse it claims to catch is committed here on
// purpose and must be caught, and its cuBLAS GEMM must follow cuBLAS's
// column-major definition.
#include <QtTest>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "cuda_emu/cuda_emu.h"
#include "test_util.h"

using phaselab::emu::launcher;

namespace {

// Each thread writes its index to shared memory; thread i then reads the
// value of thread (i + 1) % n. With the barrier this is a rotation; without
// it the result depends on the schedule (and the emulator's alternating
// order makes it wrong).
template <bool kSync>
void rotate_kernel(int* out) {
  __shared__ int s[128];
  s[threadIdx.x] = static_cast<int>(threadIdx.x);
  if (kSync) __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

// A warp sum where lanes >= live have returned first: undefined on a GPU.
void partial_warp_sum_kernel(float* out, int live) {
  if (static_cast<int>(threadIdx.x) >= live) return;
  float v = 1.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x == 0) out[0] = v;
}

// A barrier only half the block reaches.
void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 64) __syncthreads();
  out[threadIdx.x] = 1;
}

void warp_sum_kernel(float* out) {
  float v = static_cast<float>(threadIdx.x);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[threadIdx.x] = v;
}

// Lanes below 16 shuffle twice, the others once: lanes at different shuffles.
void divergent_shuffle_kernel(float* out) {
  float v = 1.f;
  if (threadIdx.x < 16) v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  out[threadIdx.x] = v;
}

// A struct argument holding a pointer, as the kernels' KvPages does.
struct Rows {
  const float* data = nullptr;
};
template <typename F>
void device_pointers(const Rows& r, F&& f) {
  f(r.data);
}
void struct_read_kernel(Rows r, float* out) { out[0] = r.data[0]; }

void copy_kernel(const float* x, float* out) { out[0] = x[0]; }

// A float load two bytes off its alignment.
void misaligned_kernel(const float* x, float* out) {
  out[0] = *reinterpret_cast<const float*>(reinterpret_cast<const char*>(x) + 2);
}

void add_from_device_kernel(float* x, const int* by) { x[0] += static_cast<float>(*by); }
void add_value_kernel(float* x, int by) { x[0] += static_cast<float>(by); }
void read_kernel(const float* x, float* out, int i) { out[0] = x[i]; }
void index_kernel(int* out, int add) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  out[i] = i + add;
}

// Runs body in a child process (a fault is sticky, or kills the process)
// and returns the child's wait status; body's return value is its exit code.
template <typename F>
int in_child(F&& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int st = -1;
  if (pid > 0) waitpid(pid, &st, 0);
  return st;
}

std::vector<float> download(const float* d, size_t n) {
  std::vector<float> v(n);
  cudaMemcpy(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  return v;
}

}  // namespace

class TestCudaEmuChecks : public QObject {
  Q_OBJECT
 private slots:
  // Each misuse below leaves a sticky fault (as on a GPU), so each runs in a
  // child process; the parent reads what the child reports.
  void faults_data() {
    QTest::addColumn<int>("which");
    QTest::addColumn<int>("expected");
    QTest::newRow("shuffle with exited lanes") << 0 << static_cast<int>(cudaErrorLaunchFailure);
    QTest::newRow("barrier half the block reaches") << 1 << static_cast<int>(cudaErrorLaunchFailure);
    QTest::newRow("host pointer passed to a kernel") << 2 << static_cast<int>(cudaErrorIllegalAddress);
    QTest::newRow("host pointer inside a struct argument") << 3 << static_cast<int>(cudaErrorIllegalAddress);
    QTest::newRow("lanes at different shuffles") << 4 << static_cast<int>(cudaErrorLaunchFailure);
  }
  void faults() {
    QFETCH(int, which);
    QFETCH(int, expected);
    const int st = in_child([which] {
      float* d = nullptr;
      int* di = nullptr;
      cudaMalloc(reinterpret_cast<void**>(&d), 32 * sizeof(float));
      cudaMalloc(reinterpret_cast<void**>(&di), 128 * sizeof(int));
      std::vector<float> host(4);
      if (which == 0) launcher("partial_warp_sum_kernel", partial_warp_sum_kernel, 1, 32, 0, nullptr)(d, 20);
      if (which == 1) launcher("divergent_barrier_kernel", divergent_barrier_kernel, 1, 128, 0, nullptr)(di);
      if (which == 2) launcher("read_kernel", read_kernel, 1, 32, 0, nullptr)(d, host.data(), 0);
      if (which == 3) launcher("struct_read_kernel", struct_read_kernel, 1, 1, 0, nullptr)(Rows{host.data()}, d);
      if (which == 4) launcher("divergent_shuffle_kernel", divergent_shuffle_kernel, 1, 32, 0, nullptr)(d);
      return static_cast<int>(cudaDeviceSynchronize()) & 0xff;
    });
    QVERIFY(WIFEXITED(st));
    QCOMPARE(WEXITSTATUS(st), expected & 0xff);
  }

  void reading_past_a_buffer_faults() {
    const int st = in_child([] {
      float *d = nullptr, *out = nullptr;
      cudaMalloc(reinterpret_cast<void**>(&d), 1000 * sizeof(float));
      cudaMalloc(reinterpret_cast<void**>(&out), sizeof(float));
      launcher("read_kernel", read_kernel, 1, 1, 0, nullptr)(d, out, 999);  // the last value: fine
      if (cudaDeviceSynchronize() != cudaSuccess) return 3;
      launcher("read_kernel", read_kernel, 1, 1, 0, nullptr)(d, out, 1004);  // 16 bytes past the end
      cudaDeviceSynchronize();
      return 0;
    });
    QVERIFY2(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "a read past a device buffer must fault");
  }

  // New device memory is garbage on a GPU: NaN here. And a synchronous copy
  // to the device lands in legacy-stream order, so a non-blocking stream
  // that does not wait for it reads what was there before.
  void memory_starts_as_garbage_and_copies_land_in_order() {
    float *d = nullptr, *out = nullptr;
    QCOMPARE(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(float)), cudaSuccess);
    QCOMPARE(cudaMalloc(reinterpret_cast<void**>(&out), sizeof(float)), cudaSuccess);
    launcher("copy_kernel", copy_kernel, 1, 1, 0, nullptr)(d, out);
    QVERIFY(std::isnan(download(out, 1)[0]));
    cudaStream_t s = nullptr;
    QCOMPARE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    const float five = 5.f;
    QCOMPARE(cudaMemcpy(d, &five, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    launcher("copy_kernel", copy_kernel, 1, 1, 0, s)(d, out);
    QCOMPARE(cudaStreamSynchronize(s), cudaSuccess);
    float got = 0.f;
    QCOMPARE(cudaMemcpyAsync(&got, out, sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
    QCOMPARE(cudaStreamSynchronize(s), cudaSuccess);
    QVERIFY2(std::isnan(got), "the non-blocking stream did not wait for the copy");
    QCOMPARE(cudaDeviceSynchronize(), cudaSuccess);  // now the copy has landed
    launcher("copy_kernel", copy_kernel, 1, 1, 0, s)(d, out);
    QCOMPARE(cudaStreamSynchronize(s), cudaSuccess);
    QCOMPARE(download(out, 1)[0], 5.f);
    cudaStreamDestroy(s);
    cudaFree(d);
    cudaFree(out);
  }

  // A GPU faults on a misaligned load (cudaErrorMisalignedAddress); the
  // emulated kernels are built with UBSan's fatal alignment check.
  void misaligned_loads_fault() {
    const int st = in_child([] {
      float *d = nullptr, *out = nullptr;
      cudaMalloc(reinterpret_cast<void**>(&d), 16 * sizeof(float));
      cudaMalloc(reinterpret_cast<void**>(&out), sizeof(float));
      launcher("misaligned_kernel", misaligned_kernel, 1, 1, 0, nullptr)(d, out);
      cudaDeviceSynchronize();
      return 0;
    });
    QVERIFY2(st != -1 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0), "a misaligned load must not pass");
  }

  void missing_barrier_gives_a_wrong_result() {
    int* d = nullptr;
    QCOMPARE(cudaMalloc(reinterpret_cast<void**>(&d), 128 * sizeof(int)), cudaSuccess);
    for (const bool sync : {true, false}) {
      if (sync)
        launcher("rotate_kernel<true>", rotate_kernel<true>, 1, 128, 0, nullptr)(d);
      else
        launcher("rotate_kernel<false>", rotate_kernel<false>, 1, 128, 0, nullptr)(d);
      std::vector<int> h(128);
      QCOMPARE(cudaMemcpy(h.data(), d, h.size() * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
      int right = 0;
      for (int i = 0; i < 128; i++) right += h[i] == (i + 1) % 128;
      if (sync)
        QCOMPARE(right, 128);
      else
        QVERIFY2(right < 128, "without the barrier some thread must read before its neighbour wrote");
    }
    cudaFree(d);
  }

  void warp_shuffles_exchange_across_the_warp() {
    float* d = nullptr;
    QCOMPARE(cudaMalloc(reinterpret_cast<void**>(&d), 64 * sizeof(float)), cudaSuccess);
    launcher("warp_sum_kernel", warp_sum_kernel, 1, 64, 0, nullptr)(d);
    const auto h = download(d, 64);
    for (int i = 0; i < 64; i++) QCOMPARE(h[i], i < 32 ? 496.f : 1520.f);  // 0+..+31, 32+..+63
    cudaFree(d);
  }

  void launch_configuration_is_checked() {
    float* d = nullptr;
    QCOMPARE(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(float)), cudaSuccess);
    (void)cudaGetLastError();
    launcher("warp_sum_kernel", warp_sum_kernel, 0, 32, 0, nullptr)(d);
    QCOMPARE(cudaGetLastError(), cudaErrorInvalidConfiguration);
    launcher("warp_sum_kernel", warp_sum_kernel, 1, 2048, 0, nullptr)(d);
    QCOMPARE(cudaGetLastError(), cudaErrorInvalidConfiguration);
    QCOMPARE(cudaGetLastError(), cudaSuccess);  // not sticky
    cudaFree(d);
  }

  void copies_are_checked() {
    float* d = nullptr;
    QCOMPARE(cudaMalloc(reinterpret_cast<void**>(&d), 8 * sizeof(float)), cudaSuccess);
    std::vector<float> h(16, 1.f);
    QCOMPARE(cudaMemcpy(d, h.data(), 8 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    QCOMPARE(cudaMemcpy(h.data(), d, 8 * sizeof(float), cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // wrong kind
    QCOMPARE(cudaMemcpy(d, h.data(), 16 * sizeof(float), cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // too long
    QCOMPARE(cudaMemcpy(d + 4, h.data(), 4 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    (void)cudaGetLastError();
    cudaFree(d);
  }

  // Stream work runs when the host waits for it: a result read before the
  // synchronisation is stale, and a pinned buffer reused before it is the
  // reused value.
  void stream_work_waits_for_the_host() {
    cudaStream_t s = nullptr;
    QCOMPARE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float* d = nullptr;
    float* pinned = nullptr;
    QCOMPARE(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(float)), cudaSuccess);
    QCOMPARE(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(float)), cudaSuccess);
    *pinned = 5.f;
    QCOMPARE(cudaMemcpyAsync(d, pinned, sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
    *pinned = 7.f;  // too early: the copy has not run
    float back = 0.f;
    QCOMPARE(cudaMemcpyAsync(&back, d, sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
    QCOMPARE(back, 0.f);  // not synchronised yet
    QCOMPARE(cudaStreamSynchronize(s), cudaSuccess);
    QCOMPARE(back, 7.f);
    cudaFreeHost(pinned);
    cudaFree(d);
    cudaStreamDestroy(s);
  }

  // A captured graph keeps kernel arguments as they were at capture and
  // reads device memory at replay: the reason positions live on the device.
  void graphs_replay_arguments_and_read_memory_anew() {
    cudaStream_t s = nullptr;
    QCOMPARE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float* x = nullptr;
    int* by = nullptr;
    QCOMPARE(cudaMalloc(reinterpret_cast<void**>(&x), sizeof(float)), cudaSuccess);
    QCOMPARE(cudaMalloc(reinterpret_cast<void**>(&by), sizeof(int)), cudaSuccess);
    const float zero = 0.f;
    int host_by = 10;
    QCOMPARE(cudaMemcpy(x, &zero, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    QCOMPARE(cudaMemcpy(by, &host_by, sizeof(int), cudaMemcpyHostToDevice), cudaSuccess);
    QCOMPARE(cudaDeviceSynchronize(), cudaSuccess);
    QCOMPARE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    launcher("add_from_device_kernel", add_from_device_kernel, 1, 1, 0, s)(x, by);
    launcher("add_value_kernel", add_value_kernel, 1, 1, 0, s)(x, host_by);  // 10, fixed at capture
    cudaGraph_t g = nullptr;
    QCOMPARE(cudaStreamEndCapture(s, &g), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    QCOMPARE(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
    QCOMPARE(download(x, 1)[0], 0.f);  // capturing ran nothing
    host_by = 100;
    QCOMPARE(cudaMemcpy(by, &host_by, sizeof(int), cudaMemcpyHostToDevice), cudaSuccess);
    QCOMPARE(cudaDeviceSynchronize(), cudaSuccess);  // the non-blocking stream would not wait for the copy
    QCOMPARE(cudaGraphLaunch(exec, s), cudaSuccess);
    QCOMPARE(cudaStreamSynchronize(s), cudaSuccess);
    QCOMPARE(download(x, 1)[0], 110.f);  // 100 read at replay + 10 from capture
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);

    // Waiting for the stream inside a capture invalidates it.
    QCOMPARE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    launcher("add_value_kernel", add_value_kernel, 1, 1, 0, s)(x, 1);
    QCOMPARE(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    QCOMPARE(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    QVERIFY(g == nullptr);
    (void)cudaGetLastError();
    cudaFree(x);
    cudaFree(by);
    cudaStreamDestroy(s);
  }

  // Two host threads, each with a stream of its own (the disaggregated
  // policy's prefill and decode workers on two CUDA backends): their grids
  // take turns at the emulator's worker threads, and a thread-local capture
  // on one stream forbids nothing to the other thread. (The emulator once
  // let two grids share its workers and hung.)
  void host_threads_launch_on_their_own_streams() {
    constexpr int kBlocks = 64, kThreads = 64, kN = kBlocks * kThreads;
    std::atomic<int> wrong{0};
    auto worker = [&](bool capture, int rounds) {
      cudaStream_t s = nullptr;
      int* d = nullptr;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
          cudaMalloc(reinterpret_cast<void**>(&d), kN * sizeof(int)) != cudaSuccess) {
        wrong++;
        return;
      }
      std::vector<int> back(kN);
      for (int r = 0; r < rounds; r++) {
        if (capture) {  // a graph captured, replayed, then checked
          cudaGraph_t g = nullptr;
          cudaGraphExec_t exec = nullptr;
          if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) wrong++;
          launcher("index_kernel", index_kernel, kBlocks, kThreads, 0, s)(d, r);
          std::this_thread::yield();  // let the other thread synchronise during the capture
          if (cudaStreamEndCapture(s, &g) != cudaSuccess || cudaGraphInstantiate(&exec, g, 0) != cudaSuccess ||
              cudaGraphLaunch(exec, s) != cudaSuccess) {
            wrong++;
            break;
          }
          cudaGraphExecDestroy(exec);
          cudaGraphDestroy(g);
        } else {
          launcher("index_kernel", index_kernel, kBlocks, kThreads, 0, s)(d, r);
        }
        if (cudaMemcpyAsync(back.data(), d, kN * sizeof(int), cudaMemcpyDeviceToHost, s) != cudaSuccess ||
            cudaStreamSynchronize(s) != cudaSuccess)
          wrong++;
        for (int i = 0; i < kN; i++) wrong += back[i] != i + r;
      }
      cudaFree(d);
      cudaStreamDestroy(s);
    };
    std::thread a(worker, false, 300), b(worker, true, 300);
    a.join();
    b.join();
    QCOMPARE(wrong.load(), 0);
    QCOMPARE(cudaGetLastError(), cudaSuccess);

    // A global-mode capture forbids the other thread's synchronisation, and
    // is invalidated by it; a thread-local one does not.
    for (const cudaStreamCaptureMode mode : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal}) {
      cudaStream_t s = nullptr, other = nullptr;
      float* x = nullptr;
      QCOMPARE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      QCOMPARE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
      QCOMPARE(cudaMalloc(reinterpret_cast<void**>(&x), sizeof(float)), cudaSuccess);
      QCOMPARE(cudaStreamBeginCapture(s, mode), cudaSuccess);
      launcher("add_value_kernel", add_value_kernel, 1, 1, 0, s)(x, 1);
      cudaError_t synced = cudaSuccess;
      std::thread([&] { synced = cudaStreamSynchronize(other); }).join();
      cudaGraph_t g = nullptr;
      const cudaError_t ended = cudaStreamEndCapture(s, &g);
      if (mode == cudaStreamCaptureModeGlobal) {
        QCOMPARE(synced, cudaErrorStreamCaptureUnsupported);
        QCOMPARE(ended, cudaErrorStreamCaptureInvalidated);
      } else {
        QCOMPARE(synced, cudaSuccess);
        QCOMPARE(ended, cudaSuccess);
        cudaGraphDestroy(g);
      }
      (void)cudaGetLastError();
      cudaFree(x);
      cudaStreamDestroy(s);
      cudaStreamDestroy(other);
    }
  }

  // cublasGemmEx against its column-major definition, for each transpose.
  void gemm_follows_the_cublas_definition() {
    const int m = 5, n = 3, k = 7, pad = 2;
    cublasHandle_t h = nullptr;
    QCOMPARE(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    const auto a = phaselab::testing::randn(static_cast<size_t>(k + pad) * (k + pad), 1);
    const auto b = phaselab::testing::randn(static_cast<size_t>(k + pad) * (k + pad), 2);
    float *da = nullptr, *db = nullptr, *dc = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&da), a.size() * sizeof(float));
    cudaMalloc(reinterpret_cast<void**>(&db), b.size() * sizeof(float));
    cudaMalloc(reinterpret_cast<void**>(&dc), static_cast<size_t>(m + pad) * n * sizeof(float));
    cudaMemcpy(da, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(db, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice);
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        const int lda = (ta ? k : m) + pad, ldb = (tb ? n : k) + pad, ldc = m + pad;
        const float alpha = 1.5f, beta = 0.f;
        QCOMPARE(cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, da,
                              CUDA_R_32F, lda, db, CUDA_R_32F, ldb, &beta, dc, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_SUCCESS);
        const auto c = download(dc, static_cast<size_t>(ldc) * n);
        for (int j = 0; j < n; j++)
          for (int i = 0; i < m; i++) {
            double ref = 0;
            for (int l = 0; l < k; l++)
              ref += static_cast<double>(ta ? a[l + static_cast<size_t>(i) * lda] : a[i + static_cast<size_t>(l) * lda]) *
                     (tb ? b[j + static_cast<size_t>(l) * ldb] : b[l + static_cast<size_t>(j) * ldb]);
            QVERIFY(std::abs(c[i + static_cast<size_t>(j) * ldc] - alpha * ref) < 1e-4);
          }
      }
    const float one = 1.f;
    // A leading dimension shorter than a column: refused, as cuBLAS does.
    QCOMPARE(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, CUDA_R_32F, m - 1, db, CUDA_R_32F, k, &one, dc,
                          CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             CUBLAS_STATUS_INVALID_VALUE);
    // C larger than its buffer: refused (a GPU would write past it).
    QCOMPARE(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, 50, k, &one, da, CUDA_R_32F, m, db, CUDA_R_32F, k, &one, dc,
                          CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             CUBLAS_STATUS_INVALID_VALUE);
    cublasDestroy(h);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
  }
};

QTEST_APPLESS_MAIN(TestCudaEmuChecks)
#include "test_cuda_emu_checks.moc"
