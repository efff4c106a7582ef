#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {
// One block per (token, head): scores into scratch, softmax, weighted sum.
__global__ void attention_kernel(const float* q, const float* k_cache, const float* v_cache, float* out, float* scratch,
                                 int pos0, int n_head, int n_head_kv, int head_dim, int n_ctx, int window, float scale,
                                 float softcap) {
  __shared__ float shared[32];
  const int t = blockIdx.x / n_head, h = blockIdx.x % n_head;
  const int kvh = h / (n_head / n_head_kv);
  const int pos = pos0 + t;
  const int j0 = window > 0 ? max(0, pos - window + 1) : 0;
  const int n_embd_kv = n_head_kv * head_dim;
  const float* qh = q + (static_cast<size_t>(t) * n_head + h) * head_dim;
  float* sc = scratch + (static_cast<size_t>(t) * n_head + h) * n_ctx;
  float mx = -INFINITY;
  for (int j = j0 + threadIdx.x; j <= pos; j += blockDim.x) {
    const float* kj = k_cache + static_cast<size_t>(j) * n_embd_kv + kvh * head_dim;
    float s = 0.f;
    for (int i = 0; i < head_dim; i++) s += qh[i] * kj[i];
    s *= scale;
    if (softcap > 0.f) s = softcap * tanhf(s / softcap);
    sc[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_max(mx, shared);
  float sum = 0.f;
  for (int j = j0 + threadIdx.x; j <= pos; j += blockDim.x) {
    const float e = expf(sc[j] - mx);
    sc[j] = e;
    sum += e;
  }
  sum = block_sum(sum, shared);  // also orders the writes to sc before the reads below
  float* oh = out + (static_cast<size_t>(t) * n_head + h) * head_dim;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float acc = 0.f;
    for (int j = j0; j <= pos; j++) acc += sc[j] * v_cache[static_cast<size_t>(j) * n_embd_kv + kvh * head_dim + i];
    oh[i] = acc / sum;
  }
}

__global__ void store_kv_kernel(const float* k, const float* v, float* k_cache, float* v_cache, int pos0, int n_embd_kv,
                                size_t total) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const size_t dst = static_cast<size_t>(pos0) * n_embd_kv + i;
  k_cache[dst] = k[i];
  v_cache[dst] = v[i];
}
}  // namespace

cudaError_t launch_attention(const float* q, const float* k_cache, const float* v_cache, float* out, float* scratch,
                             int T, int pos0, int n_head, int n_head_kv, int head_dim, int n_ctx, int window,
                             float scale, float softcap, cudaStream_t s) {
  attention_kernel<<<T * n_head, 128, 0, s>>>(q, k_cache, v_cache, out, scratch, pos0, n_head, n_head_kv, head_dim,
                                              n_ctx, window, scale, softcap);
  return cudaGetLastError();
}

cudaError_t launch_store_kv(const float* k, const float* v, float* k_cache, float* v_cache, int T, int pos0,
                            int n_embd_kv, cudaStream_t s) {
  const size_t total = static_cast<size_t>(T) * n_embd_kv;
  store_kv_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, s>>>(k, v, k_cache, v_cache, pos0, n_embd_kv,
                                                                             total);
  return cudaGetLastError();
}

}  // namespace phaselab::cuda
