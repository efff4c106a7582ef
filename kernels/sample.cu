#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {

constexpr int kThreads = 1024;

// The larger of two (value, index) pairs; ties go to the lower index.
__device__ __forceinline__ void keep_max(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

// Block-wide argmax over x[0, n): the largest value, the lowest index among
// equals; NaN never wins (keep_max's comparisons are false), so a row of
// NaN leaves idx = n.
__device__ void block_argmax(const float* x, int n, float* sv, int* si, float* v_out, int* i_out) {
  float v = -INFINITY;
  int idx = n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) keep_max(v, idx, x[i], i);
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    keep_max(v, idx, v2, i2);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? sv[lane] : -INFINITY;
    idx = lane < static_cast<int>(blockDim.x / 32) ? si[lane] : n;
    for (int o = 16; o > 0; o >>= 1) {
      const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
      const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
      keep_max(v, idx, v2, i2);
    }
    if (lane == 0) {
      *v_out = v;
      *i_out = idx;
    }
  }
  __syncthreads();
}

// One block per row of n values.
__global__ void argmax_kernel(const float* x, int n, int* out) {
  grid_dependency_sync();
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ float bv;
  __shared__ int bi;
  block_argmax(x + static_cast<size_t>(blockIdx.x) * n, n, sv, si, &bv, &bi);
  if (threadIdx.x == 0) out[blockIdx.x] = bi < n ? bi : 0;  // all NaN: token 0, as on the CPU
}

// ---- sampled decoding's passes over the vocabulary (launch_vocab_draw) ------
//
// Three grids of (spans of the row, rows): the largest logit; the softmax
// sum's blocks and a tally of the logits near the largest; then the
// cutoff, chosen from the tally, and the gathering of the tokens at or
// above it (or, for an untruncated row, the draw). The host sampler's
// arithmetic is repeated operation for operation (__f*_rn: no fused
// multiply-add), so the sums are its sums, bitwise.

constexpr int kExpBlock = 1024;  // engine/sampling/vocab_passes.h: the float lanes' blocks
constexpr int kLanes = 16;       // its lanes per block
constexpr int kSpanBlocks = 8;   // blocks per thread block of a grid
constexpr int kSpan = kSpanBlocks * kExpBlock;
constexpr int kDrawThreads = kSpanBlocks * kLanes;  // a group of 16 threads per block of 1024
constexpr int kSumsShared = 1024;  // block sums a thread block holds in shared memory (8 KiB)
// The tally's bands: [max - d_k, max - d_{k-1}) for cutoffs d_k nats below
// the largest (any cutoff gives the host's result, as long as the tokens at
// or above it hold what the rules keep: the finer near the top, the fewer
// candidates copied back; the host's own start 8 nats down gathers
// thousands on a peaked row, which top-k 40 does not need), then the rest
// (not NaN), then the tokens at or above min-p's threshold.
constexpr int kNearBands = 22;
constexpr int kRestBand = kNearBands, kMinBand = kNearBands + 1, kTally = kNearBands + 2;
__device__ __forceinline__ float band_nats(int k) {
  constexpr float d[kNearBands] = {0.25f, 0.5f, 1.f,  1.5f, 2.f,  3.f,  4.f,  5.f,  6.f,  7.f,  8.f,
                                   9.f,   10.f, 11.f, 12.f, 14.f, 16.f, 20.f, 24.f, 32.f, 48.f, 64.f};
  return d[k];
}

int draw_spans(int n) { return std::max(1, (n + kSpan - 1) / kSpan); }

// The work space, carved the same way by every grid (rows: the launch's).
struct DrawWork {
  double* block_sums;  // (rows, n / kExpBlock + 1): each block's sum, then the tail's
  float* part_max;     // (rows, spans)
  unsigned* counts;    // (rows, spans, kTally)
  float* masses;       // (rows, spans, kNearBands): exp(x - max) summed per band
  unsigned* gathered;  // (rows) the gather's counter
};
__host__ __device__ inline size_t draw_work_layout(int rows, int n, char* base, DrawWork* w) {
  const size_t R = static_cast<size_t>(rows), P = static_cast<size_t>((n + kSpan - 1) / kSpan > 1 ? (n + kSpan - 1) / kSpan : 1);
  const size_t nb1 = static_cast<size_t>(n / kExpBlock + 1);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    char* p = base ? base + at : nullptr;
    at += (bytes + 255) / 256 * 256;
    return p;
  };
  char* bs = take(R * nb1 * sizeof(double));
  char* pm = take(R * P * sizeof(float));
  char* ct = take(R * P * kTally * sizeof(unsigned));
  char* ms = take(R * P * kNearBands * sizeof(float));
  char* ga = take(R * sizeof(unsigned));
  if (w) *w = DrawWork{reinterpret_cast<double*>(bs), reinterpret_cast<float*>(pm), reinterpret_cast<unsigned*>(ct),
                       reinterpret_cast<float*>(ms), reinterpret_cast<unsigned*>(ga)};
  return at;
}

// The host's exp_nonpositive (vocab_passes.h), operation for operation.
__device__ __forceinline__ float exp_nonpositive(float x) {
  const bool in_range = x >= -87.f;
  x = in_range ? x : -87.f;
  const float n = __fsub_rn(__fadd_rn(__fmul_rn(x, 1.44269504f), 12582912.f), 12582912.f);
  const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.693145752f)), __fmul_rn(n, 1.42860677e-6f));
  float q = __fadd_rn(8.3333338e-3f, __fmul_rn(r, 1.3888889e-3f));
  q = __fadd_rn(4.1666668e-2f, __fmul_rn(r, q));
  q = __fadd_rn(1.6666667e-1f, __fmul_rn(r, q));
  q = __fadd_rn(0.5f, __fmul_rn(r, q));
  q = __fadd_rn(1.f, __fmul_rn(r, q));
  q = __fadd_rn(1.f, __fmul_rn(r, q));
  const float scale = __uint_as_float(static_cast<unsigned>(static_cast<int>(n) + 127) << 23);
  return in_range ? __fmul_rn(q, scale) : 0.f;
}

// The sampler's term for logit v: exp((v - mx) * inv_t).
__device__ __forceinline__ float draw_term(float v, float mx, float inv_t) {
  return exp_nonpositive(__fmul_rn(__fsub_rn(v, mx), inv_t));
}

// The largest of the row's span maxima (as the host folds its lanes: NaN
// never, -inf when none).
__device__ float fold_max(const float* part, int P) {
  float best = -INFINITY;
  for (int p = 0; p < P; p++) best = part[p] > best ? part[p] : best;
  return best;
}

// What each thread block of the three grids starts from: the work space,
// its span p of the P of row r (the launch's), the rule and the logits row.
struct DrawBlock {
  DrawWork w;
  int P, r, p;
  DrawRule rule;
  const float* row;
};
__device__ DrawBlock draw_block(const float* x, int n, const DrawRule* rules, void* work) {
  DrawBlock b;
  draw_work_layout(gridDim.y, n, static_cast<char*>(work), &b.w);
  b.P = gridDim.x;
  b.r = blockIdx.y;
  b.p = blockIdx.x;
  b.rule = rules[b.r];
  b.row = x + static_cast<size_t>(b.rule.row) * n;
  return b;
}

__global__ void __launch_bounds__(kDrawThreads) draw_max_kernel(const float* x, int n, const DrawRule* rules, void* work) {
  grid_dependency_sync();
  const auto [w, P, r, p, rule, row] = draw_block(x, n, rules, work);
  const int end = min(n, (p + 1) * kSpan);
  float best = -INFINITY;
  for (int i = p * kSpan + threadIdx.x; i < end; i += blockDim.x) best = row[i] > best ? row[i] : best;
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    best = v > best ? v : best;
  }
  __shared__ float warp_max[kDrawThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    w.part_max[r * P + p] = fold_max(warp_max, kDrawThreads / 32);
    if (p == 0) w.gathered[r] = 0;
  }
}

// The tally of one logit v (term e) of a truncated row: its band, and e
// into the band's mass.
__device__ __forceinline__ void tally(float v, float e, const float* below, float min_cut, bool use_min,
                                      unsigned* counts, float* masses) {
  if (v != v) return;  // NaN: never a candidate
  if (use_min && v >= min_cut) counts[kMinBand]++;
  if (!(v >= below[kNearBands - 1])) {
    counts[kRestBand]++;
    return;
  }
  int k = 0;
  while (!(v >= below[k])) k++;
  counts[k]++;
  masses[k] = __fadd_rn(masses[k], e);
}

// A sum over the thread block in a fixed order (deterministic).
template <typename T>
__device__ T block_sum(T v, T* smem) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
  __syncthreads();
  T s = 0;
  for (int k = 0; k < kDrawThreads / 32; k++) s += smem[k];
  return s;
}

__global__ void __launch_bounds__(kDrawThreads) draw_sums_kernel(const float* x, int n, const DrawRule* rules, void* work) {
  grid_dependency_sync();
  const auto [w, P, r, p, rule, row] = draw_block(x, n, rules, work);
  const float mx = fold_max(w.part_max + r * P, P);
  if (!(mx > -INFINITY && mx < INFINITY)) return;  // no finite maximum: the argmax (draw_pick_kernel)
  const bool chain = !rule.untruncated;
  const float inv_t = chain ? 1.f : rule.inv_t;
  float below[kNearBands];
  for (int k = 0; k < kNearBands; k++) below[k] = __fsub_rn(mx, band_nats(k));
  const float min_cut = __fadd_rn(mx, rule.log_min_p);
  const bool use_min = chain && rule.use_min_p;
  unsigned counts[kTally] = {};
  float masses[kNearBands] = {};
  // Group g's 16 threads sum block p * kSpanBlocks + g in the host's lanes:
  // lane l adds the terms of values l, l + 16, l + 32, ... in order.
  const int nb = n / kExpBlock;
  const int g = threadIdx.x / kLanes, l = threadIdx.x % kLanes;
  const int blk = p * kSpanBlocks + g;
  float lane = 0.f;
  if (blk < nb) {
    const float* xb = row + static_cast<size_t>(blk) * kExpBlock;
    for (int m = 0; m < kExpBlock / kLanes; m++) {
      const float v = xb[l + kLanes * m];
      const float e = draw_term(v, mx, inv_t);
      lane = __fadd_rn(lane, e);
      if (chain) tally(v, e, below, min_cut, use_min, counts, masses);
    }
  }
  __shared__ float lanes[kDrawThreads];
  lanes[threadIdx.x] = lane;
  __syncthreads();
  double* sums = w.block_sums + static_cast<size_t>(r) * (nb + 1);
  if (l == 0 && blk < nb) {
    double b = 0;
    for (int k = 0; k < kLanes; k++) b += lanes[g * kLanes + k];
    sums[blk] = b;
  }
  if (p == P - 1 && threadIdx.x == 0) {  // the tail after the last whole block, in order
    double t = 0;
    for (int i = nb * kExpBlock; i < n; i++) {
      const float e = draw_term(row[i], mx, inv_t);
      t += e;
      if (chain) tally(row[i], e, below, min_cut, use_min, counts, masses);
    }
    sums[nb] = t;
  }
  if (!chain) return;
  __shared__ unsigned count_smem[kDrawThreads / 32];
  __shared__ float mass_smem[kDrawThreads / 32];
  unsigned* out_counts = w.counts + (static_cast<size_t>(r) * P + p) * kTally;
  float* out_masses = w.masses + (static_cast<size_t>(r) * P + p) * kNearBands;
  for (int k = 0; k < kTally; k++) {
    const unsigned c = block_sum(counts[k], count_smem);
    if (threadIdx.x == 0) out_counts[k] = c;
  }
  for (int k = 0; k < kNearBands; k++) {
    const float m = block_sum(masses[k], mass_smem);
    if (threadIdx.x == 0) out_masses[k] = m;
  }
}

__global__ void __launch_bounds__(kDrawThreads) draw_pick_kernel(const float* x, int n, const DrawRule* rules,
                                                                 DrawResult* res, DrawCand* cand, int cap, int head,
                                                                 void* work) {
  grid_dependency_sync();
  const auto [w, P, r, p, rule, row] = draw_block(x, n, rules, work);
  const float mx = fold_max(w.part_max + r * P, P);
  const int nb = n / kExpBlock;
  const double* sums = w.block_sums + static_cast<size_t>(r) * (nb + 1);
  __shared__ int first[kDrawThreads];
  if (!(mx > -INFINITY && mx < INFINITY)) {
    // No finite maximum: the host's argmax, the first logit at or above
    // it (none, every one NaN: token 0).
    if (p != 0) return;
    int f = n;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      if (row[i] >= mx) {
        f = i;
        break;
      }
    first[threadIdx.x] = f;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 1; k < kDrawThreads; k++) f = min(f, first[k]);
      res[r] = DrawResult{f < n ? f : 0, 1, mx, mx, 0.0, 0u};
    }
    return;
  }
  // The blocks' sums added in order on one thread (the host's order), from
  // shared memory where they fit (every vocabulary up to a million tokens):
  // one round trip to fetch them, not one per block.
  __shared__ double sums_smem[kSumsShared];
  __shared__ double total_smem;
  if (nb + 1 <= kSumsShared) {
    for (int b = threadIdx.x; b <= nb; b += blockDim.x) sums_smem[b] = sums[b];
    __syncthreads();
    sums = sums_smem;
  }
  if (threadIdx.x == 0) {
    double sum = 0;
    for (int b = 0; b < nb; b++) sum += sums[b];
    total_smem = sum + sums[nb];
  }
  __syncthreads();
  const double total = total_smem;
  if (rule.untruncated) {
    // Sampler::draw_untruncated: r = u * total, walked over the blocks'
    // sums, then over the terms of the block it falls in.
    if (p != 0) return;
    __shared__ float terms[kExpBlock];
    __shared__ int b_smem;
    __shared__ double cum_smem;
    const double target = rule.u * total;
    if (threadIdx.x == 0) {
      const int n_sums = nb + (sums[nb] > 0 ? 1 : 0);  // (the tail counts where it has weight)
      double cum = 0;
      int b = 0;
      while (b + 1 < n_sums && target >= cum + sums[b]) cum += sums[b++];
      b_smem = b;
      cum_smem = cum;
    }
    __syncthreads();
    const int a0 = b_smem * kExpBlock, end = min(n, a0 + kExpBlock);
    for (int i = a0 + threadIdx.x; i < end; i += blockDim.x) terms[i - a0] = draw_term(row[i], mx, rule.inv_t);
    __syncthreads();
    if (threadIdx.x != 0) return;
    double cum = cum_smem;
    int tok = -1;
    for (int i = a0; i < end && tok < 0; i++) {
      cum += terms[i - a0];
      if (target < cum) tok = i;
    }
    // (Rounding left the target past the block's terms: its last token with
    // any weight, else the vocabulary's, as the host.)
    for (int i = end - 1; i >= a0 && tok < 0; i--)
      if (terms[i - a0] > 0) tok = i;
    for (int i = n - 1; i >= 0 && tok < 0; i--)
      if (draw_term(row[i], mx, rule.inv_t) > 0) tok = i;
    res[r] = DrawResult{tok >= 0 ? tok : n - 1, 1, mx, -INFINITY, total, 0u};
    return;
  }
  // A truncated row: the first of the cutoffs (band_nats below the maximum,
  // then every token; min-p's threshold where it bounds the kept tokens) at
  // which its rules surely hold what they keep: top-k's k, or top-p's share
  // of the mass (the tally's float sums, with a margin
  // the host's exact check then confirms).
  __shared__ float cut_smem;
  // The spans' tallies, each band's folded by a thread of its own (in span
  // order: every thread block of the row gets the same floats).
  __shared__ unsigned cnt[kTally];
  __shared__ float mass[kNearBands];
  static_assert(kTally + kNearBands <= kDrawThreads);
  if (threadIdx.x < kTally) {
    unsigned c = 0;
    for (int q = 0; q < P; q++) c += w.counts[(static_cast<size_t>(r) * P + q) * kTally + threadIdx.x];
    cnt[threadIdx.x] = c;
  } else if (threadIdx.x < kTally + kNearBands) {
    const int k = threadIdx.x - kTally;
    float m = 0.f;
    for (int q = 0; q < P; q++) m = __fadd_rn(m, w.masses[(static_cast<size_t>(r) * P + q) * kNearBands + k]);
    mass[k] = m;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool use_k = rule.top_k > 0, use_p = rule.top_p < 1.f, use_min = rule.use_min_p != 0;
    const bool min_bounds = use_min && !(use_k && use_p), top_p_alone = use_p && !use_k;
    const float min_cut = __fadd_rn(mx, rule.log_min_p);
    unsigned c = 0, at = 0;
    float m = 0.f, cut = -INFINITY;
    bool complete = false;
    for (int k = 0; k <= kNearBands; k++) {
      if (k < kNearBands) {
        at += cnt[k];
        m = __fadd_rn(m, mass[k]);
        cut = __fsub_rn(mx, band_nats(k));
        c = at;
      } else {
        cut = -INFINITY;
        c = at + cnt[kRestBand];
        complete = true;
      }
      if (min_bounds && min_cut >= cut) {
        cut = min_cut;
        c = cnt[kMinBand];
        complete = true;
      }
      if (complete || (use_k && c >= static_cast<unsigned>(rule.top_k)) ||
          (top_p_alone && static_cast<double>(m) >= static_cast<double>(rule.top_p) * total * (1 + 1e-4)))
        break;
    }
    cut_smem = cut;
    if (p == 0) res[r] = DrawResult{-1, complete ? 1 : 0, mx, cut, total, c};
  }
  __syncthreads();
  const float cut = cut_smem;
  const int end = min(n, (p + 1) * kSpan);
  for (int i = p * kSpan + threadIdx.x; i < end; i += blockDim.x) {
    const float v = row[i];
    if (v >= cut) {
      const unsigned slot = atomicAdd(&w.gathered[r], 1u);
      if (slot < static_cast<unsigned>(cap)) cand[draw_cand_index(gridDim.y, cap, head, r, static_cast<int>(slot))] = DrawCand{v, i};
    }
  }
}

}  // namespace

cudaError_t launch_argmax(const float* x, int n, int* out, cudaStream_t s) { return launch_argmax_rows(x, 1, n, out, s); }

cudaError_t launch_argmax_rows(const float* x, int n_rows, int n, int* out, cudaStream_t s) {
  if (n_rows < 1) return cudaSuccess;
  PHASELAB_LAUNCH(argmax_kernel, n_rows, kThreads, 0, s)(x, n, out);
  return cudaGetLastError();
}

size_t vocab_draw_work_bytes(int n_rows, int n) { return draw_work_layout(n_rows, n, nullptr, nullptr); }

cudaError_t launch_vocab_draw(const float* x, int n, const DrawRule* rules, int n_rows, DrawResult* res,
                              DrawCand* cand, int cap, int head, void* work, cudaStream_t s) {
  if (n_rows < 1) return cudaSuccess;
  if (n < 1 || cap < 1 || head < 1 || head > cap) return cudaErrorInvalidValue;
  const dim3 grid(draw_spans(n), n_rows);
  PHASELAB_LAUNCH(draw_max_kernel, grid, kDrawThreads, 0, s)(x, n, rules, work);
  PHASELAB_LAUNCH(draw_sums_kernel, grid, kDrawThreads, 0, s)(x, n, rules, work);
  PHASELAB_LAUNCH(draw_pick_kernel, grid, kDrawThreads, 0, s)(x, n, rules, res, cand, cap, head, work);
  return cudaGetLastError();
}

}  // namespace phaselab::cuda
