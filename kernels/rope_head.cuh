// One (token, head) of launch_qk_norm_rope_store, by the threads of a block
// (rope.cu's kernel, a block per head; matvec.cu's Q/K/V product, as a
// tail, the last block of each head's rows). Private to the kernels.
#pragma once

#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {
namespace {

// The threads of rope.cu's block per head (matvec.cu's blocks are as many:
// the same values either way).
constexpr int kQkRopeThreads = 128;

// Whether the kernels can take these arguments.
inline bool qk_rope_args_ok(const QkRope& p) {
  return p.rows.pos && p.rows.table_at && p.cache.table && (p.cache.elem != KvElem::q8_0 || p.head_dim % 32 == 0) &&
         p.n_rot / 2 <= 4 * kQkRopeThreads;
}

// Head hh of token t over the q heads then the k heads: the head in shared
// memory (head: head_dim floats), its RMSNorm (QK-norm models), RoPE; a q
// head is written back, a k head to the cache with the token's v head. q,
// k and v are read through L2 (a tail's other blocks wrote them).
__device__ __forceinline__ void qk_norm_rope_store_head(float* q, float* k, const float* v, const QkRope& p, int t,
                                                        int hh, float* head, float* shared) {
  const int n_head = p.n_head, n_head_kv = p.n_head_kv, head_dim = p.head_dim, n_rot = p.n_rot;
  const KvPages& cache = p.cache;
  const RowMap& rows = p.rows;
  const bool is_k = hh >= n_head;
  const int NQ = n_head * head_dim, NKV = n_head_kv * head_dim;
  const int kh = hh - n_head;
  float* ptr = is_k ? k + static_cast<size_t>(t) * NKV + kh * head_dim : q + static_cast<size_t>(t) * NQ + hh * head_dim;
  const float* norm = is_k ? p.k_norm : p.q_norm;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) head[i] = __ldcg(ptr + i);
  const int pos = rows.pos[t], half = n_rot / 2;
  // This thread's pairs' cosines and sines first (no dependence on the
  // head): with the table, the angle reduced to [-pi, pi] in double and its
  // sine and cosine taken in float.
  constexpr int kMaxPairsPerThread = 4;  // half <= 4 * blockDim (head_dim <= 1024)
  float cs[kMaxPairsPerThread], sns[kMaxPairsPerThread];
#pragma unroll
  for (int j = 0; j < kMaxPairsPerThread; j++) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i >= half) break;
    if (p.inv_freq) {
      const double theta = static_cast<double>(pos) * p.inv_freq[i];
      constexpr double kTwoPi = 6.283185307179586;
      const double r = fma(-rint(theta / kTwoPi), kTwoPi, theta);
      float sn, c;
      sincosf(static_cast<float>(r), &sn, &c);
      cs[j] = c * p.mscale;
      sns[j] = sn * p.mscale;
    } else {
      double freq = pow(static_cast<double>(p.base), -2.0 * i / n_rot);
      if (p.freq_factors) freq /= p.freq_factors[i];
      const double theta = static_cast<double>(pos) * freq;
      cs[j] = static_cast<float>(cos(theta)) * p.mscale;
      sns[j] = static_cast<float>(sin(theta)) * p.mscale;
    }
  }
  __syncthreads();
  if (norm) {  // the same for the whole block
    float ss = 0.f;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) ss += head[i] * head[i];
    const float scale = rsqrtf(block_sum(ss, shared) / head_dim + p.eps);
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) head[i] = head[i] * scale * norm[i];
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < kMaxPairsPerThread; j++) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i >= half) break;
    const float c = cs[j], sn = sns[j];
    const int a = p.neox ? i : 2 * i, b = p.neox ? i + half : 2 * i + 1;
    const float x0 = head[a], x1 = head[b];
    head[a] = x0 * c - x1 * sn;
    head[b] = x0 * sn + x1 * c;
  }
  __syncthreads();
  if (is_k && cache.elem == KvElem::q8_0) {  // a block of 32 values per thread
    const size_t dst = kv_row(cache.table + rows.table_at[t], cache.block_stride, pos, NKV) + kh * head_dim;
    for (int b = threadIdx.x; b < head_dim / 32; b += blockDim.x) {
      kv_put_q8_0_block(cache.k, dst + b * 32, head + b * 32);
      kv_put_q8_0_block<true>(cache.v, dst + b * 32, v + static_cast<size_t>(t) * NKV + kh * head_dim + b * 32);
    }
    return;
  }
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    if (!is_k) ptr[i] = head[i];  // k is read from the cache from here on
    if (is_k) {
      const size_t dst = kv_row(cache.table + rows.table_at[t], cache.block_stride, pos, NKV) + kh * head_dim + i;
      kv_put(cache.k, dst, cache.elem, head[i]);
      kv_put(cache.v, dst, cache.elem, __ldcg(v + static_cast<size_t>(t) * NKV + kh * head_dim + i));
    }
  }
}

}  // namespace
}  // namespace phaselab::cuda
