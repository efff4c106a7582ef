#include <type_traits>

#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kKeysAtOnce = 4;  // keys a decode warp takes per step
constexpr int kPrefetchKeys = 32;  // K/V rows a decode warp asks of L2 before the previous kernel ends

// One warp per (query t, head h, split s). Lane l holds dims l, l+32, ... of
// the query and of the output (EPL of them): each key row is read by the
// warp in coalesced 128-byte pieces, its score summed across lanes, and the
// running maximum m, normalizer l and output rescaled as keys stream past
// (online softmax). partials (n_split > 1): per warp [m, l, out[head_dim]].
// The merge of those (merge_partials) as the kernel's tail (kMerge: the
// last block of each (query, head)'s ranges to finish; n_split a multiple
// of kWarpsPerBlock, head_counters: T * n_head counters), or a second
// kernel's work.
__device__ __forceinline__ void merge_partials(const float* partials, float* out, int th, int head_dim, int n_split,
                                               int8_t* q8, float* q8d);
template <int EPL, KvElem E, bool kMerge = false>
__global__ void attention_kernel(const float* q, KvPages cache, RowMap rows, float* out, float* partials, int T,
                                 int n_head, int n_head_kv, int head_dim, int window, float scale, float softcap,
                                 int n_split, int8_t* q8, float* q8d, unsigned* head_counters, const float* sinks) {
  const int warp = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= T * n_head * n_split) {  // (never with kMerge: whole blocks)
    grid_dependency_sync();
    return;
  }
  const int split = warp % n_split, th = warp / n_split;
  const int t = th / n_head, h = th % n_head;
  const int kvh = h / (n_head / n_head_kv);
  const int n_embd_kv = n_head_kv * head_dim;
  // (The rows' positions and block tables come from the host before the
  // pass, not from the previous kernel: read before its end.)
  const int pos = rows.pos[t];
  const int* table = cache.table + rows.table_at[t];
  const int j0 = window > 0 ? max(0, pos - window + 1) : 0;
  const int n_keys = pos + 1 - j0;
  const int chunk = (n_keys + n_split - 1) / n_split;
  const int js = j0 + split * chunk, je = min(pos + 1, js + chunk);
  // The range's K and V rows into L2 while the previous kernel ends, all
  // but the row of pos itself, which that kernel writes; at most
  // kPrefetchKeys of them (a range of a whole long context would stall the
  // warp here and overflow L2).
  {
    const size_t row_bytes = kv_values_bytes(E, head_dim);
    const int jp = min(min(je, pos), js + kPrefetchKeys);
    for (int j = js; j < jp; j++) {
      const size_t r = kv_row(table, cache.block_stride, j, n_embd_kv) + kvh * head_dim;
      prefetch_l2(static_cast<const uint8_t*>(cache.k) + kv_values_bytes(E, r), row_bytes, lane);
      prefetch_l2(static_cast<const uint8_t*>(cache.v) + kv_values_bytes(E, r), row_bytes, lane);
    }
  }
  grid_dependency_sync();

  const float* qh = q + (static_cast<size_t>(t) * n_head + h) * head_dim;
  float qv[EPL], acc[EPL];
#pragma unroll
  for (int e = 0; e < EPL; e++) {
    const int i = lane + 32 * e;
    qv[e] = i < head_dim ? qh[i] : 0.f;
    acc[e] = 0.f;
  }
  // kKeysAtOnce keys per step, their loads and warp sums independent of
  // each other (one key at a time waited on each load and each sum in turn).
  // A head's sink logit (gpt-oss) starts the first range's softmax as a key
  // of weight exp(sink) and no value: in its maximum and denominator once.
  float m = -INFINITY, l = 0.f;
  if (sinks && split == 0) {
    m = sinks[h];
    l = 1.f;
  }
  for (int j0 = js; j0 < je; j0 += kKeysAtOnce) {
    size_t row[kKeysAtOnce];
    float s[kKeysAtOnce];
#pragma unroll
    for (int u = 0; u < kKeysAtOnce; u++) {
      const int j = j0 + u < je ? j0 + u : je - 1;  // (past the range: a repeat, weighted 0 below)
      row[u] = kv_row(table, cache.block_stride, j, n_embd_kv) + kvh * head_dim;
      s[u] = 0.f;
#pragma unroll
      for (int e = 0; e < EPL; e++) {
        const int i = lane + 32 * e;
        if (i < head_dim) s[u] += qv[e] * kv_get<E>(cache.k, row[u] + i);
      }
    }
    float m_new = m;
#pragma unroll
    for (int u = 0; u < kKeysAtOnce; u++) {
      s[u] = warp_sum(s[u]) * scale;
      if (softcap > 0.f) s[u] = softcap * tanhf(s[u] / softcap);
      if (j0 + u < je) m_new = fmaxf(m_new, s[u]);
    }
    const float corr = expf(m - m_new);  // 0 for the first keys (m = -inf)
    float p[kKeysAtOnce];
#pragma unroll
    for (int u = 0; u < kKeysAtOnce; u++) {
      p[u] = j0 + u < je ? expf(s[u] - m_new) : 0.f;
      l = (u == 0 ? l * corr : l) + p[u];
    }
#pragma unroll
    for (int e = 0; e < EPL; e++) {
      const int i = lane + 32 * e;
      float a = acc[e] * corr;
      if (i < head_dim) {
#pragma unroll
        for (int u = 0; u < kKeysAtOnce; u++) a += p[u] * kv_get<E>(cache.v, row[u] + i);
      }
      acc[e] = a;
    }
    m = m_new;
  }
  if (n_split == 1) {
    float* oh = out + (static_cast<size_t>(t) * n_head + h) * head_dim;
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
      const int i = lane + 32 * e;
      if (i >= head_dim) break;  // (head_dim % 32 == 0 where q8: whole warps)
      oh[i] = acc[e] * inv;
      if (q8) q8_store(acc[e] * inv, q8, q8d, (static_cast<size_t>(t) * n_head + h) * head_dim + i);
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
  if constexpr (kMerge) {
    const int th0 = blockIdx.x * kWarpsPerBlock / n_split;  // the block's (query, head)
    if (!last_block_done(head_counters + th0, n_split / kWarpsPerBlock)) return;
    merge_partials(partials, out, th0, head_dim, n_split, q8, q8d);
  }
}

// Merges (query, head) th's n_split (<= 64) partial results (read through
// L2: other blocks may have written them) by the threads of a block. The
// first warp turns each range's [m, l] into its weight exp(m - max) / L
// (lane s: ranges s and s + 32); then each thread sums its dimensions over
// the ranges, the loads independent of each other (a warp walking the
// ranges one after another waited on each: 37 us per layer for Gemma 3
// 270M's decode on an H200). Every dimension's sum runs over the ranges in
// order, whatever the block's size: the same values in either kernel.
__device__ __forceinline__ void merge_partials(const float* partials, float* out, int th, int head_dim, int n_split,
                                               int8_t* q8, float* q8d) {
  __shared__ float weight[64];
  const size_t stride = static_cast<size_t>(head_dim) + 2;
  const float* p = partials + static_cast<size_t>(th) * n_split * stride;
  if (threadIdx.x < 32) {  // lane s: ranges s and s + 32
    const int s = threadIdx.x;
    float m[2], l[2];
    for (int h = 0; h < 2; h++) {
      const int r = s + 32 * h;
      m[h] = r < n_split ? __ldcg(p + r * stride) : -INFINITY;  // -inf: an empty range
      l[h] = r < n_split ? __ldcg(p + r * stride + 1) : 0.f;
    }
    float mx = fmaxf(m[0], m[1]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float e[2], L = 0.f;
    for (int h = 0; h < 2; h++) {
      e[h] = m[h] > -INFINITY ? expf(m[h] - mx) : 0.f;
      L += l[h] * e[h];
    }
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    for (int h = 0; h < 2; h++) weight[s + 32 * h] = L > 0.f ? e[h] / L : 0.f;
  }
  __syncthreads();
  // (head_dim % 32 == 0 where q8: whole warps, lane i % 32)
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float a = 0.f;
#pragma unroll 8
    for (int s = 0; s < n_split; s++) a += weight[s] * __ldcg(p + s * stride + 2 + i);
    out[static_cast<size_t>(th) * head_dim + i] = a;
    if (q8) q8_store(a, q8, q8d, static_cast<size_t>(th) * head_dim + i);
  }
}

// One block per (query, head), a thread per dimension.
__global__ void attention_merge_kernel(const float* partials, float* out, int T, int n_head, int head_dim,
                                       int n_split, int8_t* q8, float* q8d) {
  grid_dependency_sync();
  merge_partials(partials, out, blockIdx.x, head_dim, n_split, q8, q8d);
}

// After a launch of either attention kernel (its error e): with n_split > 1
// the merge of the partial results into out.
cudaError_t merge_after(cudaError_t e, const float* partials, float* out, int T, int n_head, int head_dim, int n_split,
                        cudaStream_t s, int8_t* q8 = nullptr, float* q8d = nullptr) {
  if (e != cudaSuccess || n_split == 1) return e;
  if (n_split > 64) return cudaErrorInvalidValue;
  const unsigned threads = static_cast<unsigned>(std::max(32, (head_dim + 31) / 32 * 32));
  PHASELAB_LAUNCH(attention_merge_kernel, static_cast<unsigned>(T * n_head), threads, 0, s)(partials, out, T, n_head,
                                                                                         head_dim, n_split, q8, q8d);
  return cudaGetLastError();
}

// ---- prefill: query tiles sharing K/V tiles in shared memory -------------

constexpr int kTiledWarps = 4;
constexpr int kTiledRowsPerWarp = 4;  // rows (query, head) a warp keeps in registers
constexpr int kTiledRows = kTiledWarps * kTiledRowsPerWarp;

// One block per (tile of qtile queries, KV head): its rows are the qtile
// queries x the G heads that share the KV head (row r: query t0 + r / G,
// head kvh * G + r % G), warp w owning rows w, w + 4, ... The block loads
// kt key and value rows at a time into shared memory, once for all its
// rows, so a key row leaves global memory once per tile of queries instead
// of once per query and head; each row streams them with the online softmax
// of attention_kernel (lane l holds dims l, l+32, ... of its q and output).
//
// With n_split > 1 (blockIdx.z: the split) the block takes the split-th of
// n_split ranges of its keys, and each row's [m, l, out] goes to partials
// in attention_kernel's layout, for attention_merge_kernel.
template <int EPL, KvElem E>
__global__ void attention_tiled_kernel(const float* q, KvPages cache, RowMap rows, float* out, float* partials, int T,
                                       int n_head, int n_head_kv, int head_dim, int window,
                                       float scale, float softcap, int qtile, int kt, int n_split,
                                       const float* sinks) {
  grid_dependency_sync();
  PHASELAB_DYNAMIC_SHARED(float, tile);  // K rows then V rows: (2, kt, head_dim)
  float* ks = tile;
  float* vs = tile + static_cast<size_t>(kt) * head_dim;
  const int G = n_head / n_head_kv, kvh = blockIdx.y, t0 = blockIdx.x * qtile;
  const int n_tok = min(qtile, T - t0), n_rows = n_tok * G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // One sequence at consecutive positions (launch_attention_tiled).
  const int n_embd_kv = n_head_kv * head_dim, pos0 = rows.pos[0];
  const int* table = cache.table + rows.table_at[0];

  float qv[kTiledRowsPerWarp][EPL], acc[kTiledRowsPerWarp][EPL], m[kTiledRowsPerWarp], l[kTiledRowsPerWarp];
  int pos[kTiledRowsPerWarp], lo[kTiledRowsPerWarp];
  int mine = 0;  // rows of this warp (the same for all its lanes)
#pragma unroll
  for (int k = 0; k < kTiledRowsPerWarp; k++) {
    const int r = warp + k * kTiledWarps;
    const bool have = r < n_rows;
    const int t = t0 + (have ? r / G : 0), h = kvh * G + (have ? r % G : 0);
    pos[k] = pos0 + t;
    lo[k] = window > 0 ? max(0, pos[k] - window + 1) : 0;
    const bool sink = sinks && have && blockIdx.z == 0;  // (as attention_kernel: the first range's)
    m[k] = sink ? sinks[h] : -INFINITY;
    l[k] = sink ? 1.f : 0.f;
    const float* qh = q + (static_cast<size_t>(t) * n_head + h) * head_dim;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
      const int i = lane + 32 * e;
      qv[k][e] = have && i < head_dim ? qh[i] : 0.f;
      acc[k][e] = 0.f;
    }
    mine += have;
  }
  // The keys any row of the block needs, [first, last], and this split's share.
  const int block_last = pos0 + t0 + n_tok - 1;
  const int block_first = window > 0 ? max(0, pos0 + t0 - window + 1) : 0;
  const int chunk = (block_last - block_first + n_split) / n_split;
  const int first = block_first + static_cast<int>(blockIdx.z) * chunk;
  const int last = min(block_last, first + chunk - 1);
  for (int j0 = first; j0 <= last; j0 += kt) {
    const int nk = min(kt, last + 1 - j0);
    __syncthreads();  // the previous tile has been used
    for (int i = threadIdx.x; i < nk * head_dim; i += blockDim.x) {
      const int jj = i / head_dim, d = i % head_dim;
      const size_t row = kv_row(table, cache.block_stride, j0 + jj, n_embd_kv) + kvh * head_dim;
      ks[i] = kv_get<E>(cache.k, row + d);
      vs[i] = kv_get<E>(cache.v, row + d);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTiledRowsPerWarp; k++) {
      if (k >= mine) break;
      const int jb = max(j0, lo[k]), je = min(j0 + nk - 1, pos[k]);  // this row's keys in the tile
      for (int j = jb; j <= je; j++) {
        const float* kj = ks + static_cast<size_t>(j - j0) * head_dim;
        const float* vj = vs + static_cast<size_t>(j - j0) * head_dim;
        float sc = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
          const int i = lane + 32 * e;
          if (i < head_dim) sc += qv[k][e] * kj[i];
        }
        sc = warp_sum(sc) * scale;
        if (softcap > 0.f) sc = softcap * tanhf(sc / softcap);
        const float m_new = fmaxf(m[k], sc);
        const float corr = expf(m[k] - m_new), p = expf(sc - m_new);
        l[k] = l[k] * corr + p;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
          const int i = lane + 32 * e;
          acc[k][e] = acc[k][e] * corr + (i < head_dim ? p * vj[i] : 0.f);
        }
        m[k] = m_new;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kTiledRowsPerWarp; k++) {
    if (k >= mine) break;
    const int r = warp + k * kTiledWarps;
    const int t = t0 + r / G, h = kvh * G + r % G;
    if (n_split > 1) {
      float* part = partials + ((static_cast<size_t>(t) * n_head + h) * n_split + blockIdx.z) * (head_dim + 2);
      if (lane == 0) {
        part[0] = m[k];  // -inf for a row with no keys in this range
        part[1] = l[k];
      }
#pragma unroll
      for (int e = 0; e < EPL; e++) {
        const int i = lane + 32 * e;
        if (i < head_dim) part[2 + i] = acc[k][e];
      }
      continue;
    }
    float* oh = out + (static_cast<size_t>(t) * n_head + h) * head_dim;
    const float inv = l[k] > 0.f ? 1.f / l[k] : 0.f;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
      const int i = lane + 32 * e;
      if (i < head_dim) oh[i] = acc[k][e] * inv;
    }
  }
}

int tiled_query_tile(int n_head, int n_head_kv) { return max(1, kTiledRows / (n_head / n_head_kv)); }

template <int EPL, KvElem E>
cudaError_t launch_attention_tiled_epl(const float* q, KvPages cache, RowMap rows, float* out, float* partials, int T,
                                       int n_head, int n_head_kv, int head_dim, int window,
                                       float scale, float softcap, int n_split, cudaStream_t s, const float* sinks) {
  const int qtile = tiled_query_tile(n_head, n_head_kv);
  const int kt = head_dim <= 256 ? 16 : 8;  // two tiles of kt rows within 48 KiB
  const dim3 grid(static_cast<unsigned>((T + qtile - 1) / qtile), static_cast<unsigned>(n_head_kv),
                  static_cast<unsigned>(n_split));
  const size_t smem = 2 * static_cast<size_t>(kt) * head_dim * sizeof(float);
  auto* const attention_tiled = &attention_tiled_kernel<EPL, E>;  // (no comma in the macro's argument)
  PHASELAB_LAUNCH(attention_tiled, grid, 32 * kTiledWarps, smem, s)(
      q, cache, rows, out, partials, T, n_head, n_head_kv, head_dim, window, scale, softcap, qtile, kt, n_split, sinks);
  return merge_after(cudaGetLastError(), partials, out, T, n_head, head_dim, n_split, s);
}

template <int EPL, KvElem E>
cudaError_t launch_attention_epl(const float* q, KvPages cache, RowMap rows, float* out, float* partials, int T,
                                 int n_head, int n_head_kv, int head_dim,
                                 int window, float scale, float softcap, int n_split, cudaStream_t s,
                                 int8_t* q8, float* q8d, unsigned* head_counters, const float* sinks) {
  const int warps = T * n_head * n_split;
  const unsigned blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (head_counters && n_split > 1 && n_split % kWarpsPerBlock == 0 && n_split <= 64) {  // the merge as the tail
    auto* const attention = &attention_kernel<EPL, E, true>;
    PHASELAB_LAUNCH(attention, blocks, 32 * kWarpsPerBlock, 0, s)(q, cache, rows, out, partials, T, n_head,
                                                                 n_head_kv, head_dim, window, scale, softcap, n_split,
                                                                 q8, q8d, head_counters, sinks);
    return cudaGetLastError();
  }
  auto* const attention = &attention_kernel<EPL, E>;
  PHASELAB_LAUNCH(attention, blocks, 32 * kWarpsPerBlock, 0, s)(q, cache, rows, out, partials, T, n_head,
                                                               n_head_kv, head_dim, window, scale, softcap, n_split,
                                                               n_split == 1 ? q8 : nullptr, q8d, nullptr, sinks);
  return merge_after(cudaGetLastError(), partials, out, T, n_head, head_dim, n_split, s, q8, q8d);
}

// f(std::integral_constant<int, E>) for the smallest E of 1, 2, 4, 8, 16 with
// 32 E >= head_dim: the kernels' values per lane.
template <typename F>
cudaError_t with_epl(int head_dim, F&& f) {
  const int epl = (head_dim + 31) / 32;
  if (epl <= 1) return f(std::integral_constant<int, 1>{});
  if (epl <= 2) return f(std::integral_constant<int, 2>{});
  if (epl <= 4) return f(std::integral_constant<int, 4>{});
  if (epl <= 8) return f(std::integral_constant<int, 8>{});
  return f(std::integral_constant<int, 16>{});
}

// f(std::integral_constant<KvElem, E>) for the cache's element type.
template <typename F>
cudaError_t with_elem(KvElem e, F&& f) {
  if (e == KvElem::f16) return f(std::integral_constant<KvElem, KvElem::f16>{});
  if (e == KvElem::bf16) return f(std::integral_constant<KvElem, KvElem::bf16>{});
  if (e == KvElem::q8_0) return f(std::integral_constant<KvElem, KvElem::q8_0>{});
  return f(std::integral_constant<KvElem, KvElem::f32>{});
}

}  // namespace

size_t attention_partials_floats(int T, int n_head, int head_dim, int n_split) {
  return n_split > 1 ? static_cast<size_t>(T) * n_head * n_split * (head_dim + 2) : 0;
}

int attention_splits(int T, int n_head, int n_ctx) {
  if (T * n_head >= 1024) return 1;
  const int by_warps = (256 + T * n_head - 1) / (T * n_head);
  const int by_keys = (n_ctx + 15) / 16;
  const int n = by_warps < by_keys ? by_warps : by_keys;
  return n < 1 ? 1 : n > 64 ? 64 : n;
}

cudaError_t launch_attention(const float* q, KvPages cache, RowMap rows, float* out, float* partials, int T, int n_head, int n_head_kv, int head_dim, int window, float scale,
                             float softcap, int n_split, cudaStream_t s, Q8Act q8_out, unsigned* head_counters,
                             const float* sinks) {
  if (n_split < 1 || (n_split > 1 && !partials) || head_dim > 512 || n_head % n_head_kv != 0 || !cache.table ||
      !rows.pos || !rows.table_at || (cache.elem == KvElem::q8_0 && head_dim % 32 != 0) ||
      (q8_out.q && (head_dim % 32 != 0 || static_cast<size_t>(T) * n_head * head_dim > q8_out.cap)))
    return cudaErrorInvalidValue;
  return with_epl(head_dim, [&](auto epl) {
    return with_elem(cache.elem, [&](auto elem) {
      return launch_attention_epl<decltype(epl)::value, decltype(elem)::value>(
          q, cache, rows, out, partials, T, n_head, n_head_kv, head_dim, window, scale, softcap, n_split, s, q8_out.q,
          q8_out.d, head_counters, sinks);
    });
  });
}

bool attention_tiled_fits(int n_head, int n_head_kv, int head_dim) {
  return n_head_kv > 0 && n_head % n_head_kv == 0 && n_head / n_head_kv <= kTiledRows && head_dim <= 512;
}

int attention_tiled_splits(int T, int n_head, int n_head_kv, int n_keys, int sm_count) {
  const int blocks = (T + tiled_query_tile(n_head, n_head_kv) - 1) / tiled_query_tile(n_head, n_head_kv) * n_head_kv;
  const int for_gpu = (4 * max(sm_count, 1) + blocks - 1) / max(blocks, 1);  // about 4 blocks per SM
  const int for_keys = max(1, n_keys / 64);                                   // at least 64 keys per range
  return max(1, min(32, min(for_gpu, for_keys)));
}

cudaError_t launch_attention_tiled(const float* q, KvPages cache, RowMap rows, float* out, float* partials, int T,
                                   int n_head, int n_head_kv, int head_dim, int window, float scale, float softcap,
                                   int n_split, cudaStream_t s, const float* sinks) {
  if (!attention_tiled_fits(n_head, n_head_kv, head_dim) || !cache.table || !rows.pos || !rows.table_at || T < 1 ||
      n_split < 1 || (cache.elem == KvElem::q8_0 && head_dim % 32 != 0) ||
      (n_split > 1 && !partials))
    return cudaErrorInvalidValue;
  return with_epl(head_dim, [&](auto epl) {
    return with_elem(cache.elem, [&](auto elem) {
      return launch_attention_tiled_epl<decltype(epl)::value, decltype(elem)::value>(
          q, cache, rows, out, partials, T, n_head, n_head_kv, head_dim, window, scale, softcap, n_split, s, sinks);
    });
  });
}

}  // namespace phaselab::cuda
