#include <cmath>

#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {
// One block per (token, head) over the q heads then the k heads: the head in
// shared memory, its RMSNorm (QK-norm models), RoPE; a q head is written
// back, a k head to the cache with the token's v head.
__global__ void qk_norm_rope_store_kernel(float* q, float* k, const float* v, const float* q_norm, const float* k_norm,
                                          KvPages cache, RowMap rows, int n_head, int n_head_kv, int head_dim,
                                          int n_rot, float base, const float* freq_factors, float mscale,
                                          bool neox, float eps, const double* inv_freq) {
  PHASELAB_DYNAMIC_SHARED(float, head);  // head_dim floats
  __shared__ float shared[32];
  const int per_token = n_head + n_head_kv;
  const int t = blockIdx.x / per_token, hh = blockIdx.x % per_token;
  const bool is_k = hh >= n_head;
  const int NQ = n_head * head_dim, NKV = n_head_kv * head_dim;
  const int kh = hh - n_head;
  float* ptr = is_k ? k + static_cast<size_t>(t) * NKV + kh * head_dim : q + static_cast<size_t>(t) * NQ + hh * head_dim;
  const float* norm = is_k ? k_norm : q_norm;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) head[i] = ptr[i];
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
    if (inv_freq) {
      const double theta = static_cast<double>(pos) * inv_freq[i];
      constexpr double kTwoPi = 6.283185307179586;
      const double r = fma(-rint(theta / kTwoPi), kTwoPi, theta);
      float sn, c;
      sincosf(static_cast<float>(r), &sn, &c);
      cs[j] = c * mscale;
      sns[j] = sn * mscale;
    } else {
      double freq = pow(static_cast<double>(base), -2.0 * i / n_rot);
      if (freq_factors) freq /= freq_factors[i];
      const double theta = static_cast<double>(pos) * freq;
      cs[j] = static_cast<float>(cos(theta)) * mscale;
      sns[j] = static_cast<float>(sin(theta)) * mscale;
    }
  }
  __syncthreads();
  if (norm) {  // the same for the whole block
    float ss = 0.f;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) ss += head[i] * head[i];
    const float scale = rsqrtf(block_sum(ss, shared) / head_dim + eps);
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) head[i] = head[i] * scale * norm[i];
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < kMaxPairsPerThread; j++) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i >= half) break;
    const float c = cs[j], sn = sns[j];
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = head[a], x1 = head[b];
    head[a] = x0 * c - x1 * sn;
    head[b] = x0 * sn + x1 * c;
  }
  __syncthreads();
  if (is_k && cache.elem == KvElem::q8_0) {  // a block of 32 values per thread
    const size_t dst = kv_row(cache.table + rows.table_at[t], cache.block_stride, pos, NKV) + kh * head_dim;
    for (int b = threadIdx.x; b < head_dim / 32; b += blockDim.x) {
      kv_put_q8_0_block(cache.k, dst + b * 32, head + b * 32);
      kv_put_q8_0_block(cache.v, dst + b * 32, v + static_cast<size_t>(t) * NKV + kh * head_dim + b * 32);
    }
    return;
  }
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    if (!is_k) ptr[i] = head[i];  // k is read from the cache from here on
    if (is_k) {
      const size_t dst = kv_row(cache.table + rows.table_at[t], cache.block_stride, pos, NKV) + kh * head_dim + i;
      kv_put(cache.k, dst, cache.elem, head[i]);
      kv_put(cache.v, dst, cache.elem, v[static_cast<size_t>(t) * NKV + kh * head_dim + i]);
    }
  }
}
}  // namespace

cudaError_t launch_qk_norm_rope_store(float* q, float* k, const float* v, const float* q_norm, const float* k_norm,
                                      KvPages cache, RowMap rows, int T, int n_head, int n_head_kv, int head_dim,
                                      int n_rot, float base, const float* freq_factors, float mscale, bool neox,
                                      float eps, cudaStream_t s, const double* inv_freq) {
  if (!rows.pos || !rows.table_at || !cache.table || (cache.elem == KvElem::q8_0 && head_dim % 32 != 0) ||
      n_rot / 2 > 4 * 128)
    return cudaErrorInvalidValue;
  PHASELAB_LAUNCH(qk_norm_rope_store_kernel, T * (n_head + n_head_kv), 128, head_dim * sizeof(float), s)(
      q, k, v, q_norm, k_norm, cache, rows, n_head, n_head_kv, head_dim, n_rot, base, freq_factors, mscale, neox, eps,
      inv_freq);
  return cudaGetLastError();
}

void rope_inv_freq(double base, int n_rot, const float* freq_factors, double* out) {
  for (int i = 0; i < n_rot / 2; i++) {
    out[i] = std::pow(base, -2.0 * i / n_rot);
    if (freq_factors) out[i] /= freq_factors[i];
  }
}

}  // namespace phaselab::cuda
