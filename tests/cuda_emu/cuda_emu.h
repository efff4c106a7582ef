// PhaseLab's CUDA emulator, device side: what a kernel source (kernels/*.cu)
// needs to compile as plain C++ and run on the CPU. Included before the
// kernel sources when they are built for the emulator (PHASELAB_CUDA_EMULATOR;
// see tests/cuda_emu/CMakeLists.txt), never in a real CUDA build.
//
// Why: no GPU is lent to most sessions and none to CI, yet the kernels and
// the backend's host side (streams, graph capture, cuBLAS calls, copies)
// deserve to run somewhere. The emulator runs every CUDA thread of a block as
// a fiber (Boost.Context) on one CPU thread, switching at __syncthreads and
// warp shuffles, and checks what a GPU would punish: shuffles with exited or
// diverged lanes, barriers some threads never reach, launch configurations
// out of range, host pointers passed to kernels, copies in the wrong
// direction or past the end of an allocation, reads past a device buffer
// (guard pages), synchronisation inside a graph capture, and host code that
// reads results before it synchronises (stream work runs only when the host
// waits for it). It says nothing about speed, and a race that no schedule
// of whole barrier phases exposes is not caught.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

// On the host compiler __global__, __device__ and __host__ already expand to
// nothing. Static shared memory: one copy per CPU thread, which runs one
// block at a time.
#undef __shared__
#define __shared__ static thread_local
// Occupancy hints mean nothing on the CPU.
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

// The built-in indices, set by the scheduler before it resumes a thread.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local uint3 blockDim;
extern thread_local uint3 gridDim;

namespace phaselab::emu {

// __syncthreads: suspends this thread until every live thread of the block arrives.
void sync_block();
// A full-warp exchange: returns the value lane (this lane ^ lane_mask) passed.
uint64_t shfl_xor_bits(unsigned mask, uint64_t bits, int lane_mask, int width);
// The block's dynamic shared memory (the launch's smem bytes).
void* dynamic_shared();

// Whether [p, p + bytes) lies in one device allocation (cudaMalloc) or in
// pinned host memory (cudaMallocHost, which a GPU reaches through UVA).
bool device_accessible(const void* p, size_t bytes);

// Queues a grid on stream s: grid blocks of block threads, each running body.
// Checks the configuration as the CUDA runtime does (the error is returned
// by the next cudaGetLastError).
void launch_grid(const char* name, dim3 grid, dim3 block, size_t smem, cudaStream_t s, std::function<void()> body);
// Records a kernel argument that is a pointer no kernel may dereference.
void bad_pointer_argument(const char* name, int index, const void* p);

// Pointer arguments must be device memory; a struct argument's pointers are
// checked by an overload of device_pointers(const S&, F) found by argument-
// dependent lookup (kernels/common.cuh has those of the kernels' structs),
// which calls f on each.
template <typename T>
void check_pointer(const char* name, int index, const T* p) {
  if (p && !device_accessible(p, 0)) bad_pointer_argument(name, index, p);
}
template <typename S, typename F>
void device_pointers(const S&, F&&) {}  // a struct without pointers
template <typename T>
void check_argument(const char* name, int index, const T& v) {
  if constexpr (std::is_pointer_v<T>) {
    check_pointer(name, index, v);
  } else if constexpr (std::is_class_v<T>) {
    device_pointers(v, [&](const void* p) { check_pointer(name, index, p); });
  }
}

// kernel<<<grid, block, smem, stream>>>(args...) as launcher(...)(args...).
template <typename... P>
struct Launcher {
  const char* name;
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;

  template <typename... A>
  void operator()(A&&... a) const {
    // The arguments as the kernel's parameter types, copied now (as a real
    // launch copies them), checked, and used when the stream gets to them.
    std::tuple<std::decay_t<P>...> args(std::forward<A>(a)...);
    std::apply([this](const auto&... v) {
      int i = 0;
      (check_argument(name, i++, v), ...);
    }, args);
    auto* k = kernel;
    launch_grid(name, grid, block, smem, stream, [k, args] { std::apply(k, args); });
  }
};

template <typename... P>
Launcher<P...> launcher(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s) {
  return Launcher<P...>{name, kernel, grid, block, smem, s};
}

}  // namespace phaselab::emu

// ---- device functions the host compiler lacks --------------------------------

inline void __syncthreads() { phaselab::emu::sync_block(); }

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  bits = phaselab::emu::shfl_xor_bits(mask, bits, lane_mask, width);
  T r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
// Float operations rounded one at a time, never fused into a multiply-add
// (the kernels that repeat the host's arithmetic bitwise use them; the
// emulator's kernels are built with -ffp-contract=off as well).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
// Four signed bytes of a times those of b, plus c.
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; i++)
    c += static_cast<int>(static_cast<int8_t>(a >> (8 * i))) * static_cast<int>(static_cast<int8_t>(b >> (8 * i)));
  return c;
}
// Byte n of the result: byte (s >> 4n) & 7 of the eight bytes of y:x (x's
// bytes 0-3, y's 4-7).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  unsigned r = 0;
  for (int n = 0; n < 4; n++) r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
  return r;
}
// Atomics and fences: the blocks of a grid run on several CPU threads at
// once (a grid's last-block tails count finished blocks with these).
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// A load that bypasses L1 (the CPU has one coherent cache).
template <typename T>
inline T __ldcg(const T* p) {
  return *p;
}
// Rounded to the nearest integer, ties to even (the default rounding mode).
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
// CUDA's overloads of min and max (mixed arguments convert as there).
#define PHASELAB_EMU_MINMAX(T)                         \
  inline T min(T a, T b) { return a < b ? a : b; }     \
  inline T max(T a, T b) { return a > b ? a : b; }
PHASELAB_EMU_MINMAX(int)
PHASELAB_EMU_MINMAX(unsigned)
PHASELAB_EMU_MINMAX(long long)
PHASELAB_EMU_MINMAX(unsigned long long)
PHASELAB_EMU_MINMAX(float)
PHASELAB_EMU_MINMAX(double)
#undef PHASELAB_EMU_MINMAX
