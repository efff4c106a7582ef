// Shared device helpers of PhaseLab's CUDA kernels: error checks, reductions
// and the dequantization of one 32-value sub-block of every GGUF block
// format (the layouts of kernels/formats/include/phaselab/formats/quant_blocks.h).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels.h"
#include "phaselab/formats/quant_blocks.h"

// Launches and dynamic shared memory go through these two macros so that the
// same sources also build for the CPU emulator (tests/cuda_emu), which has
// no <<<>>> syntax.
#ifdef PHASELAB_CUDA_EMULATOR
#define PHASELAB_LAUNCH(kernel, grid, block, smem, stream) \
  ::phaselab::emu::launcher(#kernel, kernel, grid, block, smem, stream)
#define PHASELAB_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::phaselab::emu::dynamic_shared())
#else
#define PHASELAB_LAUNCH(kernel, grid, block, smem, stream) \
  ::phaselab::cuda::launch_after_previous(kernel, grid, block, smem, stream)
#define PHASELAB_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

namespace phaselab::cuda {

// ---- programmatic dependent launch (Hopper and later) ------------------------
// A decode step is ~200 short kernels, each a few microseconds: the gap
// between one kernel's end and the next one's start is a large part of a
// step. Launched with cudaLaunchAttributeProgrammaticStreamSerialization,
// a kernel may start while the previous one in the stream still runs; it
// then waits in grid_dependency_sync() (griddepcontrol.wait: the previous
// grid complete and its writes visible) before it touches memory that
// kernel may write, so only its launch and scheduling overlap, and what
// needs nothing of that kernel: the weights, and the pass's row positions
// and block tables (copied in before the pass's first kernel). Every kernel
// calls it before any other load or store (a kernel that did not would race
// with its predecessor), and then lets its own successor launch. Without
// the attribute (older GPUs, PHASELAB_CUDA_PDL=0, the emulator) both are
// no-ops.
__device__ __forceinline__ void grid_dependency_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// A warp's request that the bytes [p, p + n) be brought into L2: issued
// before grid_dependency_sync() for what does not depend on the previous
// kernel (a matrix-vector kernel's weight rows, the decode attention's
// older K/V rows), so that their fetch from memory overlaps the previous
// kernel's end rather than following it.
__device__ __forceinline__ void prefetch_l2(const uint8_t* p, size_t n, int lane) {
#if defined(__CUDA_ARCH__)
  for (size_t off = static_cast<size_t>(lane) * 128; off < n; off += 32 * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
#else
  (void)p, (void)n, (void)lane;
#endif
}

#ifndef PHASELAB_CUDA_EMULATOR
// Whether launches carry the attribute: compute capability 9.0 or later and
// PHASELAB_CUDA_PDL not 0 (read once per process).
bool dependent_launch_enabled();

// kernel<<<grid, block, smem, stream>>>(args...) as
// launch_after_previous(kernel, grid, block, smem, stream)(args...), with
// the attribute where dependent_launch_enabled(). Errors as a <<<>>>
// launch's: cudaGetLastError() after the call.
template <typename... P>
struct DependentLaunch {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  template <typename... A>
  void operator()(A&&... args) const {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = dependent_launch_enabled() ? 1 : 0;
    (void)cudaLaunchKernelEx(&cfg, kernel, static_cast<A&&>(args)...);
  }
};
template <typename... P>
DependentLaunch<P...> launch_after_previous(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                                            cudaStream_t stream) {
  return {kernel, grid, block, smem, stream};
}
#endif

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

// Value i of a K/V cache of element type E (KvElem), as F32, and the store.
template <KvElem E>
__device__ __forceinline__ float kv_get(const void* p, size_t i) {
  if constexpr (E == KvElem::f32) return static_cast<const float*>(p)[i];
  if constexpr (E == KvElem::f16) return h2f(static_cast<const uint16_t*>(p)[i]);
  if constexpr (E == KvElem::bf16) return bf2f(static_cast<const uint16_t*>(p)[i]);
  if constexpr (E == KvElem::q8_0) {
    const uint8_t* b = static_cast<const uint8_t*>(p) + i / 32 * 34;
    return h2f(*reinterpret_cast<const uint16_t*>(b)) * static_cast<float>(static_cast<int8_t>(b[2 + i % 32]));
  }
}
// Values i0 .. i0 + 32 (i0 a multiple of 32) of a Q8_0 cache from x[32], as
// the CPU's quantize_row: scale = max |x| / 127, each value rounded (half
// away from zero) after multiplying by 1 / scale.
// kFromL2: x is global memory other blocks of the grid wrote (read
// through L2), else any memory.
template <bool kFromL2 = false>
__device__ __forceinline__ void kv_put_q8_0_block(void* p, size_t i0, const float* x_in) {
  uint8_t* b = static_cast<uint8_t*>(p) + i0 / 32 * 34;
  float x[32];
  for (int j = 0; j < 32; j++) {
    if constexpr (kFromL2) x[j] = __ldcg(x_in + j);
    else x[j] = x_in[j];
  }
  float amax = 0.f;
  for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
  const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
  *reinterpret_cast<uint16_t*>(b) = __half_as_ushort(__float2half_rn(d));
  for (int j = 0; j < 32; j++) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(lroundf(x[j] * id)));
}
// (Not for Q8_0, whose values are stored a block at a time.)
__device__ __forceinline__ void kv_put(void* p, size_t i, KvElem e, float x) {
  if (e == KvElem::f32) static_cast<float*>(p)[i] = x;
  else if (e == KvElem::f16) static_cast<uint16_t*>(p)[i] = __half_as_ushort(__float2half_rn(x));
  else static_cast<uint16_t*>(p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, <= 1024).
__device__ __forceinline__ float block_sum(float v, float* shared32) {
  v = warp_sum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  const int n_warps = blockDim.x / 32;
  v = threadIdx.x < n_warps ? shared32[threadIdx.x] : 0.f;
  if (warp == 0) v = warp_sum(v);
  if (threadIdx.x == 0) shared32[0] = v;
  __syncthreads();
  const float r = shared32[0];
  __syncthreads();
  return r;
}

__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

#ifdef PHASELAB_CUDA_EMULATOR
// For the emulator's argument checks: the device pointers inside the
// kernels' struct arguments.
template <typename F>
void device_pointers(const KvPages& c, F&& f) {
  f(c.k), f(c.v), f(c.table);
}
template <typename F>
void device_pointers(const RowMap& r, F&& f) {
  f(r.pos), f(r.table_at);
}
template <typename F>
void device_pointers(const MatvecOut& m, F&& f) {
  f(m.w), f(m.out);
}
template <typename F>
void device_pointers(const QkRope& p, F&& f) {
  f(p.q_norm), f(p.k_norm), f(p.cache.k), f(p.cache.v), f(p.cache.table), f(p.rows.pos), f(p.rows.table_at),
      f(p.freq_factors), f(p.inv_freq), f(p.head_counters);
}
template <typename F>
void device_pointers(const AddNormTail& t, F&& f) {
  f(t.x), f(t.post_w), f(t.w), f(t.out), f(t.q8_out.q), f(t.q8_out.d), f(t.counter);
}
template <typename F>
void device_pointers(const ExpertMats& m, F&& f) {
  f(m.w), f(m.bias);
}
template <typename F>
void device_pointers(const MoeGroups& g, F&& f) {
  f(g.order), f(g.offsets), f(g.counts), f(g.active);
}
#endif

// Value i of a row being quantized to 8 bits per 32 values (cuda::Q8Act),
// called by the 32 lanes of a warp together with i % 32 == lane: the
// block's scale max |v| / 127 (lane 0 stores it) and v / scale rounded to
// nearest even. Every kernel that quantizes x for the matrix-vector
// kernels' integer path does it here, so that they round alike.
__device__ __forceinline__ void q8_store(float v, int8_t* q, float* d, size_t i) {
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float dd = amax / 127.f, id = dd != 0.f ? 1.f / dd : 0.f;
  q[i] = static_cast<int8_t>(__float2int_rn(v * id));
  if (i % 32 == 0) d[i / 32] = dd;
}

// Whether this block is the last of the n blocks counted on *counter to get
// here; every thread of the block calls it. The writes each block made
// before are visible to the last one (each thread fences before the count;
// the last block reads them through L2: __ldcg). The last block resets the
// counter to zero for the next launch that uses it.
__device__ __forceinline__ bool last_block_done(unsigned* counter, unsigned n) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == n - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  const bool r = last;
  if (r) __threadfence();
  return r;
}

// One row's x += y' (y' = rmsnorm(y) * post_w, or y itself without post_w),
// then out = rmsnorm(x) * w, by the blockDim.x threads of a block (a
// multiple of 32) with the row in registers: n <= kPer * blockDim.x. Every
// load of the row is issued at the start, so that a decoded token's norm
// waits on memory once rather than once per phase. y is read through L2
// (it may come from other blocks of the grid: matvec.cu's tails). q8: out
// in 8 bits too, from value q8_off (n % 32 == 0: whole warps).
template <int kPer>
__device__ __forceinline__ void add_rmsnorm_row(float* xr, const float* yr, const float* post_w, const float* w,
                                                float* orow, int n, float eps, int8_t* q8, float* q8d, size_t q8_off,
                                                float* shared32) {
  float xv[kPer], yv[kPer], pv[kPer], wv[kPer];
#pragma unroll
  for (int k = 0; k < kPer; k++) {
    const int i = threadIdx.x + k * blockDim.x;
    const bool in = i < n;
    xv[k] = in ? xr[i] : 0.f;
    yv[k] = in ? __ldcg(yr + i) : 0.f;
    pv[k] = in && post_w ? post_w[i] : 0.f;
    wv[k] = in ? w[i] : 0.f;
  }
  if (post_w) {
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kPer; k++) ss += yv[k] * yv[k];
    const float ys = rsqrtf(block_sum(ss, shared32) / n + eps);
#pragma unroll
    for (int k = 0; k < kPer; k++) yv[k] = yv[k] * ys * pv[k];
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; k++) {
    xv[k] += yv[k];
    ss += xv[k] * xv[k];
  }
  const float scale = rsqrtf(block_sum(ss, shared32) / n + eps);
#pragma unroll
  for (int k = 0; k < kPer; k++) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i >= n) break;  // (n % 32 == 0 where q8: whole warps)
    xr[i] = xv[k];
    const float o = xv[k] * scale * wv[k];
    orow[i] = o;
    if (q8) q8_store(o, q8, q8d, q8_off + i);
  }
}

// Offset (floats) of position pos's row in a layer of the paged cache.
__device__ __forceinline__ size_t kv_row(const int* table, size_t block_stride, int pos, int n_embd_kv) {
  return static_cast<size_t>(table[pos / kKvBlockTokens]) * block_stride +
         static_cast<size_t>(pos % kKvBlockTokens) * n_embd_kv;
}

// The gating activations, as the CPU reference defines them.
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }
// gpt-oss's gate (ref::swiglu_oai): g' = min(g, 7), u' = clamp(u, -7, 7),
// g' * sigmoid(1.702 g') * (u' + 1).
__device__ __forceinline__ float swiglu_oai(float g, float u) {
  const float x = fminf(g, 7.f), y = fminf(fmaxf(u, -7.f), 7.f);
  return x / (1.f + expf(-1.702f * x)) * (y + 1.f);
}
// act(g) * u for a gated feed-forward's activation.
__device__ __forceinline__ float gate_act(GateAct act, float g, float u) {
  switch (act) {
    case GateAct::gelu_tanh: return gelu_tanh(g) * u;
    case GateAct::swiglu_oai: return swiglu_oai(g, u);
    default: return silu(g) * u;
  }
}

// ---- MXFP4 (BlockMXFP4: an E8M0 exponent, 32 E2M1 nibbles) -----------------
// The block's scale halved, 2^(e - 128), as mxfp4_half_scale on the host
// (e = 0 and 1: the subnormals 2^-128 and 2^-127).
__device__ __forceinline__ float mxfp4_half_scale_dev(uint8_t e) {
  return __uint_as_float(e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23));
}
// Four nibbles (bits 0-3 of each byte of b; the other bits 0) to their
// values kMxfp4Values (twice E2M1: -12 .. 12), one signed byte each: the
// magnitude by a byte permutation of a table in two words, the sign (bit 3)
// choosing between the positive and the negative table.
__device__ __forceinline__ int mxfp4_bytes(uint32_t b) {
  const uint32_t sel = (b & 0x7u) | ((b >> 4) & 0x70u) | ((b >> 8) & 0x700u) | ((b >> 12) & 0x7000u);
  const uint32_t pos = __byte_perm(0x03020100u, 0x0C080604u, sel);  // 0 1 2 3 | 4 6 8 12
  const uint32_t neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, sel);  // their negatives
  const uint32_t m = ((b >> 3) & 0x01010101u) * 0xFFu;
  return static_cast<int>((pos & ~m) | (neg & m));
}
// 4 bytes from any address (MXFP4's 17-byte blocks leave its nibbles unaligned).
__device__ __forceinline__ uint32_t load_bytes4(const uint8_t* p) {
  return p[0] | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// Value i of a row of F32, F16 or BF16 (0 for block formats).
__device__ __forceinline__ float load_float_weight(TensorType type, const uint8_t* row, int i) {
  switch (type) {
    case TensorType::F32: return reinterpret_cast<const float*>(row)[i];
    case TensorType::F16: return h2f(reinterpret_cast<const uint16_t*>(row)[i]);
    case TensorType::BF16: return bf2f(reinterpret_cast<const uint16_t*>(row)[i]);
    default: return 0.f;
  }
}

// Values 32*sb .. 32*sb+31 of a row of the given type into out[32].
__device__ __forceinline__ void dequant_sub32(TensorType type, const uint8_t* row, int sb, float* out) {
  switch (type) {
    case TensorType::F32: {
      const float* f = reinterpret_cast<const float*>(row) + 32 * sb;
      for (int i = 0; i < 32; i++) out[i] = f[i];
      return;
    }
    case TensorType::F16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(row) + 32 * sb;
      for (int i = 0; i < 32; i++) out[i] = h2f(h[i]);
      return;
    }
    case TensorType::BF16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(row) + 32 * sb;
      for (int i = 0; i < 32; i++) out[i] = bf2f(h[i]);
      return;
    }
    case TensorType::Q8_0: {
      const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[sb];
      const float d = h2f(b.d);
      for (int i = 0; i < 32; i++) out[i] = d * b.qs[i];
      return;
    }
    case TensorType::Q4_0: {
      const BlockQ4_0& b = reinterpret_cast<const BlockQ4_0*>(row)[sb];
      const float d = h2f(b.d);
      for (int i = 0; i < 16; i++) {
        out[i] = d * ((b.qs[i] & 0xF) - 8);
        out[i + 16] = d * ((b.qs[i] >> 4) - 8);
      }
      return;
    }
    case TensorType::Q4_1: {
      const BlockQ4_1& b = reinterpret_cast<const BlockQ4_1*>(row)[sb];
      const float d = h2f(b.d), m = h2f(b.m);
      for (int i = 0; i < 16; i++) {
        out[i] = d * (b.qs[i] & 0xF) + m;
        out[i + 16] = d * (b.qs[i] >> 4) + m;
      }
      return;
    }
    case TensorType::Q5_0:
    case TensorType::Q5_1: {
      const bool one = type == TensorType::Q5_1;
      const uint8_t* base = row + static_cast<size_t>(sb) * (one ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0));
      const float d = h2f(*reinterpret_cast<const uint16_t*>(base));
      const float m = one ? h2f(*reinterpret_cast<const uint16_t*>(base + 2)) : 0.f;
      const uint8_t* qh8 = base + (one ? 4 : 2);
      const uint8_t* qs = qh8 + 4;
      const uint32_t qh = qh8[0] | (qh8[1] << 8) | (qh8[2] << 16) | (static_cast<uint32_t>(qh8[3]) << 24);
      for (int i = 0; i < 16; i++) {
        const int lo = (qs[i] & 0xF) | (((qh >> i) & 1) << 4);
        const int hi = (qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4);
        out[i] = one ? d * lo + m : d * (lo - 16);
        out[i + 16] = one ? d * hi + m : d * (hi - 16);
      }
      return;
    }
    case TensorType::Q4_K:
    case TensorType::Q5_K: {
      const bool five = type == TensorType::Q5_K;
      const int j = sb % 8;
      const uint8_t* base = row + static_cast<size_t>(sb / 8) * (five ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K));
      const float d = h2f(*reinterpret_cast<const uint16_t*>(base));
      const float dmin = h2f(*reinterpret_cast<const uint16_t*>(base + 2));
      const uint8_t* scales = base + 4;
      const uint8_t* qh = five ? base + 16 : nullptr;
      const uint8_t* qs = base + (five ? 48 : 16) + 32 * (j / 2);
      int sc, m;
      scale_min_k4(j, scales, &sc, &m);
      const int shift = (j % 2) * 4;
      for (int i = 0; i < 32; i++) {
        int q = (qs[i] >> shift) & 0xF;
        if (five) q |= ((qh[i] >> j) & 1) << 4;
        out[i] = d * sc * q - dmin * m;
      }
      return;
    }
    case TensorType::MXFP4: {
      const BlockMXFP4& b = reinterpret_cast<const BlockMXFP4*>(row)[sb];
      const float d = mxfp4_half_scale_dev(b.e);
      for (int i = 0; i < 16; i += 4) {
        const uint32_t q = load_bytes4(b.qs + i);
        const int lo = mxfp4_bytes(q & 0x0F0F0F0Fu), hi = mxfp4_bytes((q >> 4) & 0x0F0F0F0Fu);
        for (int j = 0; j < 4; j++) {
          out[i + j] = d * static_cast<float>(static_cast<int8_t>(lo >> (8 * j)));
          out[i + j + 16] = d * static_cast<float>(static_cast<int8_t>(hi >> (8 * j)));
        }
      }
      return;
    }
    case TensorType::Q6_K: {
      const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(row)[sb / 8];
      const int h = (sb % 8) / 4, r = sb % 4;
      const uint8_t* ql = b.ql + 64 * h + 32 * (r & 1);
      const uint8_t* qh = b.qh + 32 * h;
      const float d = h2f(b.d);
      const int8_t* sc = b.scales + 8 * h + 2 * r;
      for (int i = 0; i < 32; i++) {
        const int q = ((r < 2 ? ql[i] & 0xF : ql[i] >> 4) | (((qh[i] >> (2 * r)) & 3) << 4)) - 32;
        out[i] = d * sc[i / 16] * q;
      }
      return;
    }
    default:
      for (int i = 0; i < 32; i++) out[i] = 0.f;
  }
}

}  // namespace phaselab::cuda
