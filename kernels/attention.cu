#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;

// One warp per (query t, head h, split s). Lane l holds dims l, l+32, ... of
// the query and of the output (EPL of them): each key row is read by the
// warp in coalesced 128-byte pieces, its score summed across lanes, and the
// running maximum m, normalizer l and output rescaled as keys stream past
// (online softmax). partials (n_split > 1): per warp [m, l, out[head_dim]].
template <int EPL>
__global__ void attention_kernel(const float* q, KvPages cache, float* out, float* partials, int T, const int* pos0p,
                                 int n_head, int n_head_kv, int head_dim,
                                 int window, float scale, float softcap, int n_split) {
  const int warp = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= T * n_head * n_split) return;
  const int split = warp % n_split, th = warp / n_split;
  const int t = th / n_head, h = th % n_head;
  const int kvh = h / (n_head / n_head_kv);
  const int n_embd_kv = n_head_kv * head_dim;
  const int pos = *pos0p + t;
  const int j0 = window > 0 ? max(0, pos - window + 1) : 0;
  const int n_keys = pos + 1 - j0;
  const int chunk = (n_keys + n_split - 1) / n_split;
  const int js = j0 + split * chunk, je = min(pos + 1, js + chunk);

  const float* qh = q + (static_cast<size_t>(t) * n_head + h) * head_dim;
  float qv[EPL], acc[EPL];
#pragma unroll
  for (int e = 0; e < EPL; e++) {
    const int i = lane + 32 * e;
    qv[e] = i < head_dim ? qh[i] : 0.f;
    acc[e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int j = js; j < je; j++) {
    const size_t row = kv_row(cache.table, cache.block_stride, j, n_embd_kv) + kvh * head_dim;
    const float* kj = cache.k + row;
    const float* vj = cache.v + row;
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
      const int i = lane + 32 * e;
      if (i < head_dim) s += qv[e] * kj[i];
    }
    s = warp_sum(s) * scale;
    if (softcap > 0.f) s = softcap * tanhf(s / softcap);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
      const int i = lane + 32 * e;
      acc[e] = acc[e] * corr + (i < head_dim ? p * vj[i] : 0.f);
    }
    m = m_new;
  }
  if (n_split == 1) {
    float* oh = out + (static_cast<size_t>(t) * n_head + h) * head_dim;
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
      const int i = lane + 32 * e;
      if (i < head_dim) oh[i] = acc[e] * inv;
    }
    return;
  }
  float* part = partials + static_cast<size_t>(warp) * (head_dim + 2);
  if (lane == 0) {
    part[0] = m;  // -inf for an empty range
    part[1] = l;
  }
#pragma unroll
  for (int e = 0; e < EPL; e++) {
    const int i = lane + 32 * e;
    if (i < head_dim) part[2 + i] = acc[e];
  }
}

// One warp per (query, head): merges its n_split partial results.
__global__ void attention_merge_kernel(const float* partials, float* out, int T, int n_head, int head_dim,
                                       int n_split) {
  const int th = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (th >= T * n_head) return;
  const float* p = partials + static_cast<size_t>(th) * n_split * (head_dim + 2);
  float mx = -INFINITY;
  for (int s = 0; s < n_split; s++) mx = fmaxf(mx, p[static_cast<size_t>(s) * (head_dim + 2)]);
  float L = 0.f;
  for (int s = 0; s < n_split; s++) {
    const float* ps = p + static_cast<size_t>(s) * (head_dim + 2);
    if (ps[0] > -INFINITY) L += ps[1] * expf(ps[0] - mx);
  }
  const float inv = L > 0.f ? 1.f / L : 0.f;
  float* oh = out + static_cast<size_t>(th) * head_dim;
  for (int i = lane; i < head_dim; i += 32) {
    float a = 0.f;
    for (int s = 0; s < n_split; s++) {
      const float* ps = p + static_cast<size_t>(s) * (head_dim + 2);
      if (ps[0] > -INFINITY) a += ps[2 + i] * expf(ps[0] - mx);
    }
    oh[i] = a * inv;
  }
}

template <int EPL>
cudaError_t launch_attention_epl(const float* q, KvPages cache, float* out, float* partials, int T, const int* pos0,
                                 int n_head, int n_head_kv, int head_dim,
                                 int window, float scale, float softcap, int n_split, cudaStream_t s) {
  const int warps = T * n_head * n_split;
  const unsigned blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  PHASELAB_LAUNCH(attention_kernel<EPL>, blocks, 32 * kWarpsPerBlock, 0, s)(q, cache, out, partials, T, pos0, n_head,
                                                               n_head_kv, head_dim, window, scale, softcap, n_split);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess || n_split == 1) return e;
  const unsigned mblocks = static_cast<unsigned>((T * n_head + kWarpsPerBlock - 1) / kWarpsPerBlock);
  PHASELAB_LAUNCH(attention_merge_kernel, mblocks, 32 * kWarpsPerBlock, 0, s)(partials, out, T, n_head, head_dim, n_split);
  return cudaGetLastError();
}

}  // namespace

size_t attention_partials_floats(int T, int n_head, int head_dim, int n_split) {
  return n_split > 1 ? static_cast<size_t>(T) * n_head * n_split * (head_dim + 2) : 0;
}

int attention_splits(int T, int n_head, int n_ctx) {
  if (T * n_head >= 1024) return 1;
  const int by_keys = (n_ctx + 255) / 256;
  return by_keys < 1 ? 1 : by_keys > 32 ? 32 : by_keys;
}

cudaError_t launch_attention(const float* q, KvPages cache, float* out, float* partials, int T, const int* pos0,
                             int n_head, int n_head_kv, int head_dim, int window, float scale,
                             float softcap, int n_split, cudaStream_t s) {
  if (n_split < 1 || (n_split > 1 && !partials) || head_dim > 512 || n_head % n_head_kv != 0 || !cache.table)
    return cudaErrorInvalidValue;
  const int epl = (head_dim + 31) / 32;
#define PHASELAB_ATTN(E) \
  launch_attention_epl<E>(q, cache, out, partials, T, pos0, n_head, n_head_kv, head_dim, window, scale, softcap, n_split, s)
  if (epl <= 1) return PHASELAB_ATTN(1);
  if (epl <= 2) return PHASELAB_ATTN(2);
  if (epl <= 4) return PHASELAB_ATTN(4);
  if (epl <= 8) return PHASELAB_ATTN(8);
  return PHASELAB_ATTN(16);
#undef PHASELAB_ATTN
}

}  // namespace phaselab::cuda
