// Matrix products of the CPU backend (cpu_backend.h): the reference path's
// float rows, the fast path's 8-bit activations against the weights' block
// formats, and against rows repacked at load for the grouped kernels.
#include <algorithm>
#include <cstddef>
#include <unordered_set>

#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "cpu_backend.h"
#include "phaselab/quant.h"

namespace phaselab {

namespace {

// Prefill takes the tokens in tiles whose quantized activations stay in L1
// while every row of a thread's chunk passes over them (a row is a few
// hundred bytes; 512 tokens of activations are hundreds of KiB, which
// would otherwise come from L2 for every row): 1.3x on pp512.
constexpr int kMaxRows = 4;        // bound on Kernels::repacked_rows
constexpr int kMaxTileTokens = 8;  // bound on Kernels::repacked_tokens
// Packed rows unpacked at a time for the tile kernels (repacked_rows): 174
// KB of Gemma 3's 640-wide Q5_0 rows, which stay in L2 while every tile of
// tokens passes over them.
constexpr int64_t kUnpackRows = 256;
// Three quarters of a 32 KiB L1d (48 KiB on recent cores): 16 tokens of
// Gemma 3's 640-wide rows, two calls of the AVX-512 kernels' 8 tokens.
constexpr int64_t kL1TileBytes = 24 * 1024;
// Tokens per tile for tok_bytes of activations per token: a multiple of
// unit (the kernels' tokens per call), at least unit.
int token_tile(int64_t tok_bytes, int unit = 4) {
  return static_cast<int>(std::max<int64_t>(unit, kL1TileBytes / tok_bytes / unit * unit));
}

// The rows a decode batch (of at most kPrefetchMaxTokens tokens, so one
// tile) needs next, asked for ahead of time: with 4 to 32 tokens per row
// the kernels dwell on each row long enough that the hardware prefetcher
// lets the weight stream stall (perf put 20% of the output matrix's time
// at batch 16 on one weight load); Gemma 3 270M batch 16 decode +12%
// (median of 4 alternating runs). Prefill (rows reused by every tile)
// was 6% slower with it (8 rows ahead, past the caches); it asks for the
// next row pair only (prefetch_rows_l1).
constexpr int kPrefetchRows = 8;
constexpr int kPrefetchMaxTokens = 32;
// The largest matrix whose decode takes kDecodeRows rows a call (below);
// a larger one streams from memory (CpuSwitches::stream_*).
constexpr size_t kDecodeRowsMaxBytes = size_t{16} << 20;
bool streamed(int64_t n_out, size_t row_bytes) { return static_cast<size_t>(n_out) * row_bytes > kDecodeRowsMaxBytes; }
template <cpu::PrefetchHint H>
void prefetch_rows_as(const uint8_t* p, size_t n, const uint8_t* end) {
  for (size_t i = 0; i < n && p + i < end; i += 64) __builtin_prefetch(p + i, 0, cpu::prefetch_locality(H));
}
// (hint: decode's, CpuSwitches::decode_prefetch_l2; elsewhere non-temporal.)
void prefetch_rows(const uint8_t* p, size_t n, const uint8_t* end, cpu::PrefetchHint hint = cpu::PrefetchHint::nta) {
  if (hint == cpu::PrefetchHint::t1)
    prefetch_rows_as<cpu::PrefetchHint::t1>(p, n, end);
  else
    prefetch_rows_as<cpu::PrefetchHint::nta>(p, n, end);
}
// Prefill reads each row pair for a whole tile of tokens (3 calls of 8 for
// 24 tokens), then jumps to the next pair, which came from L2 or L3 as the
// first call's loads stalled (perf: 9% of the Q5_0 tile kernel on one weight
// load). Asked for into L1 one pair ahead: Gemma 3 270M pp512 +6% (median of
// 4 alternating runs on Zen 5: 1975 against 1859 tokens/s; 2 and 4 pairs
// ahead, or into L2, measured the same within the noise).
void prefetch_rows_l1(const uint8_t* p, size_t n, const uint8_t* end) {
  for (size_t i = 0; i < n && p + i < end; i += 64) __builtin_prefetch(p + i, 0, 3);
}

// Prefill's products write each token's outputs 16 floats (a line, or two
// where the buffer is not line-aligned) at a time, into lines that the
// last readers of the buffer (the per-token steps, split by token) hold,
// half of them on the other core. Where the two threads sit on two AMD
// CCDs, each such store waits for the other CCD to give the line up (~250
// ns a line). The kernels ask for the lines of the next 16 rows for
// writing (PREFETCHW) while this row tile's dot products run. Zen 4 VM,
// 2 threads, Gemma 3 270M pp512, passes with and without alternating in
// one process: the products took 0.940-0.958x the time without on two
// CCDs (5 runs), 0.93-1.01x on one (31 runs, mean 0.985;
// docs/benchmarks.md).
inline void prefetch_for_write(const float* p) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__ volatile("prefetchw %0" : : "m"(*p));  // (GCC's __builtin_prefetch(p, 1) is prefetcht0 without -mprfchw)
#else
  __builtin_prefetch(p, 1, 3);
#endif
}
// The lines of out[t * n_out + r .. + kRowTile) for tokens [t0, t1).
inline void prefetch_outputs(float* out, int64_t n_out, int t0, int t1, int64_t r) {
  for (int t = t0; t < t1; t++) {
    prefetch_for_write(out + t * n_out + r);
    prefetch_for_write(out + t * n_out + r + cpu::kRowTile - 1);
  }
}

// n stored rows of format f from row, rewritten by f.unpack into dst one after another.
const uint8_t* unpack_rows(const cpu::RepackedFormat& f, const uint8_t* row, int n, int64_t n_in, uint8_t* dst) {
  for (int i = 0; i < n; i++) f.unpack(row + i * f.row_bytes, dst + i * f.unpacked_row_bytes, n_in);
  return dst;
}

}  // namespace

bool cpu_has_prefetchw() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;  // CPUID 0x80000001: ECX bit 8 (PRFCHW; AMD since K10, Intel since Broadwell)
  return __get_cpuid(0x80000001, &a, &b, &c, &d) && (c >> 8 & 1u);
#else
  return true;  // (__builtin_prefetch for writing: PRFM PSTL1KEEP on Arm)
#endif
}

// out[t, r] = W.row(r) · in[t, :] for T tokens. Each weight row is read
// once per tile of tokens (token_tile) and used for every token of the
// tile while it is in L1.
// same_input: in is what the previous matmul read (its quantized form is
// still in act_).
void CpuBackend::matmul(const WeightView& W, const float* in, float* out, int T, bool same_input, bool precise) {
  if (k_fast_) return matmul_fast(W, in, out, T, same_input, precise);
  const int64_t n_in = W.n_in, n_out = W.n_out;
  for_rows(n_out, [&](int64_t r0, int64_t r1, int thread) {
    float* row = row_buf_[thread].data();
    for (int64_t r = r0; r < r1; r++) {
      (void)dequantize_row(W.type, W.row(r), row, n_in);  // types were checked at load
      for (int t = 0; t < T; t++) out[t * n_out + r] = ref::dot(row, in + t * n_in, n_in);
    }
  });
}

// precise: the activations are quantized twice, x ~= d1*q1 + d2*q2 with q2
// the 8-bit quantization of the residual x - d1*q1 (about 15 bits in all),
// at the cost of a second integer dot product per row. The dot is linear in
// the activations, so the two parts simply add.
void CpuBackend::matmul_fast(const WeightView& W, const float* in, float* out, int T, bool same_input, bool precise) {
  const int64_t n_in = W.n_in, n_out = W.n_out;
  const int type = static_cast<int>(W.type);
  if (!same_input) act_of_ = lo_of_ = nullptr;
  if (auto rp = repacked_.find(W.data); rp != repacked_.end()) return matmul_repacked(W, rp->second, in, out, T, precise);
  if (!cpu::uses_q8_activations(W.type)) {
    const cpu::DotF32Fn dot = k_fast_->dot_f32[type];
    for_rows(n_out, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; r++)
        for (int t = 0; t < T; t++) out[t * n_out + r] = dot(W.row(r), in + t * n_in, n_in);
    });
    return;
  }
  const int64_t nb = n_in / 32;  // activation blocks per token
  quantize_input(in, T, n_in, precise);
  const cpu::DotQ8Fn dot = k_fast_->dot_q8[type];
  const cpu::DotQ8x4Fn dot4 = k_fast_->dot_q8_x4[type];
  const int tile = token_tile(nb * static_cast<int64_t>(sizeof(cpu::ActQ8)) * (precise ? 2 : 1));
  for_rows(n_out, [&](int64_t r0, int64_t r1, int) {
    float v4[4], lo4[4];
    for (int t0 = 0; t0 < T; t0 += tile) {
      const int t1 = std::min(T, t0 + tile);
      for (int64_t r = r0; r < r1; r++) {
        const uint8_t* row = W.row(r);
        int t = t0;
        // Four tokens per pass over the row: its blocks are unpacked once.
        for (; dot4 && t + 4 <= t1; t += 4) {
          dot4(row, &act_[t * nb], nb, n_in, v4);
          if (precise) dot4(row, &act_lo_[t * nb], nb, n_in, lo4);
          for (int j = 0; j < 4; j++) out[(t + j) * n_out + r] = precise ? v4[j] + lo4[j] : v4[j];
        }
        for (; t < t1; t++) {
          float v = dot(row, &act_[t * nb], n_in);
          if (precise) v += dot(row, &act_lo_[t * nb], n_in);
          out[t * n_out + r] = v;
        }
      }
    }
  });
}

// Quantizes in (T, n_in) into act_ (and its residual into act_lo_ when
// precise), unless they already hold it.
void CpuBackend::quantize_input(const float* in, int T, int64_t n_in, bool precise) {
  if (act_of_ == in && (!precise || lo_of_ == in)) return;
  const int64_t nb = n_in / 32;
  pool_.parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
      cpu::ActQ8* a = &act_[t * nb];
      k_fast_->quantize_act(in + t * n_in, a, n_in);
      if (!precise) continue;
      float* r = &resid_[t * n_in];
      for (int64_t i = 0; i < n_in; i++) r[i] = in[t * n_in + i] - a[i / 32].d * a[i / 32].qs[i % 32];
      k_fast_->quantize_act(r, &act_lo_[t * nb], n_in);
    }
  });
  act_of_ = in;
  lo_of_ = precise ? in : nullptr;
  groups_of_ = lo_groups_of_ = pairs_of_ = lo_pairs_of_ = act2_of_ = nullptr;
}

// Every layer's matrices and the output matrix rewritten for the grouped
// kernels (Repacked), at load. The original pages are released: this
// backend never reads them again.
void CpuBackend::repack_weights() {
  // First the plan: each matrix (or a layer's experts: the slices of one
  // 3-D tensor, one after another) gets its place in one buffer for all of
  // them, so that small matrices share 2 MiB pages. Each had a mapping of
  // its own before, and a mapping under 2 MiB takes no huge page: all of
  // Gemma 3 270M's layers (69 MB in 126 matrices of 0.1-0.9 MB) sat in 4 KiB
  // pages, and each decode chunk's first 32 rows took ~2.8 us against 0.8
  // at the rows' steady pace.
  struct Planned {
    const WeightView* Ws;
    size_t n;
    cpu::RepackedFormat f;
    size_t at;  // offset in the buffer
  };
  std::vector<Planned> plan;
  std::unordered_set<const uint8_t*> planned;  // (a matrix met twice is repacked once)
  size_t total = 0;
  auto add = [&](const WeightView* Ws, size_t n) {
    if (n == 0 || planned.count(Ws[0].data) || repacked_.count(Ws[0].data)) return;
    cpu::RepackedFormat f = cpu::repacked_format(*k_fast_, Ws[0].type, Ws[0].n_in);
    if (!f.repack) return;
    // (row_tiles_ and decode_rows_ are read where the kernels are chosen:
    // they may change between passes, apply_cpu_switches.)
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
      if (Ws[i].type != Ws[0].type || Ws[i].n_in != Ws[0].n_in) return;  // not one tensor's slices: the file's layout
      bytes += f.row_bytes * static_cast<size_t>(Ws[i].n_out);
    }
    planned.insert(Ws[0].data);
    plan.push_back({Ws, n, f, total});
    total += (bytes + 63) / 64 * 64;  // each matrix on a cache line of its own
  };
  for (const LayerWeights& L : w_.layers) {
    for (const WeightView* W : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      if (W->present()) add(W, 1);
    for (const auto* experts : {&L.gate_exps, &L.up_exps, &L.down_exps})  // the experts' slices
      add(experts->data(), experts->size());
  }
  // The output matrix too: with a large vocabulary it is the largest
  // product of a decode pass over many sequences. Tied to the token
  // embedding, its original rows are still read for the embedding lookup;
  // the lookup then reads the repacked rows (a tied Q8_0 matrix: Gemma 3),
  // so that the file's copy, released, is never read again (from the
  // file's pages, 8000 random tokens had brought 160 MiB of it back).
  add(&w_.output, 1);
  if (plan.empty()) return;
  // (Where the OS refuses the mapping, every matrix stays in the file's
  // layout, read by the kernels that take it, rather than some repacked.)
  WeightBuffer& buf = repack_buffers_.emplace_back();
  if (!buf.allocate(total, huge_pages_)) {
    repack_buffers_.pop_back();
    return;
  }
  size_t tile_scratch = 0;  // a row tile and, for packed rows, the kRowTile rows unpacked
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (const Planned& m : plan) {
    const cpu::RepackedFormat& f = m.f;
    const size_t rb = f.row_bytes;
    uint8_t* dst = buf.data() + m.at;
    const uint8_t* from = m.Ws[0].data;  // the file's bytes not yet released, in W's run of contiguous matrices
    for (size_t i = 0; i < m.n; i++) {
      const WeightView& W = m.Ws[i];
      if (i > 0 && W.data != m.Ws[i - 1].row(m.Ws[i - 1].n_out)) from = W.data;
      // The file's pages are released slab by slab as they are rewritten,
      // so that a large matrix is not resident twice: Gemma 3 270M's tied
      // output matrix (178 MB) took peak RSS from ~320 to ~490 MiB. Each
      // release starts in the page where the last one ended, so no page at
      // a slab's or an expert's edge is kept.
      constexpr int64_t kSlabRows = 4096;
      for (int64_t r0 = 0; r0 < W.n_out; r0 += kSlabRows) {
        const int64_t r1 = std::min(W.n_out, r0 + kSlabRows);
        pool_.parallel_for(r1 - r0, [&](int64_t a, int64_t b) {  // (a 4 GB model took seconds on one thread)
          for (int64_t r = r0 + a; r < r0 + b; r++) f.repack(W.row(r), dst + r * rb, W.n_in);
        });
        const uint8_t* end = W.row(r1);
        release_pages(from, static_cast<size_t>(end - from));
        from = std::max(from, end - reinterpret_cast<uintptr_t>(end) % page);
      }
      repacked_.emplace(W.data, Repacked{dst, f});
      dst += rb * static_cast<size_t>(W.n_out);
    }
    if (f.tile_rows)
      tile_scratch = std::max(tile_scratch, cpu::row_tile_bytes(m.Ws[0].n_in) +
                                                (f.unpack ? cpu::kRowTile * f.unpacked_row_bytes : 0));
  }
  size_t unpacked = 0;  // the scratch the tile kernels need for packed rows
  for (const auto& [data, rp] : repacked_)
    if (rp.f.unpack) unpacked = std::max(unpacked, rp.f.unpacked_row_bytes);
  if (unpacked) unpack_buf_.assign(pool_.size(), std::vector<uint8_t>(kUnpackRows * unpacked + 64));
  if (tile_scratch) tile_buf_.assign(pool_.size(), std::vector<uint8_t>(tile_scratch + 64));
  if (auto rp = repacked_.find(w_.output.data);
      rp != repacked_.end() && w_.output.data == w_.tok_embd.data && w_.tok_embd.type == TensorType::Q8_0) {
    embd_repacked_ = rp->second.rows;
    embd_row_bytes_ = rp->second.f.row_bytes;
  }
}

CpuBackend::WeightBuffer::~WeightBuffer() {
  if (map_) munmap(map_, map_n_);
}

bool CpuBackend::WeightBuffer::allocate(size_t n, bool huge_pages) {
  constexpr size_t kHuge = 2u << 20;
  if (p_ || n == 0) return p_ != nullptr;
  // 2 MiB more than asked, so that the data can start on a 2 MiB boundary.
  map_n_ = n + kHuge;
  void* m = mmap(nullptr, map_n_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    map_n_ = 0;
    return false;
  }
  map_ = m;
  const uintptr_t start = (reinterpret_cast<uintptr_t>(m) + kHuge - 1) / kHuge * kHuge;
  p_ = reinterpret_cast<uint8_t*>(start);
  n_ = n;
  if (huge_pages && n >= kHuge) madvise(p_, n, MADV_HUGEPAGE);  // advice: the kernel may not have huge pages
  return true;
}

void CpuBackend::release_pages(const uint8_t* p, size_t n) {
  const long page = sysconf(_SC_PAGESIZE);
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

// act_, act_g_ (and act_lo_, act_lo_g_ where precise) for input in, and
// the pairs of tokens (0, 1), (2, 3), ... where a paired kernel will read
// them (a last odd token has none: it goes to other kernels), unless they
// hold it. The groups and pairs are built on the pool for a prefill batch,
// two tokens at a time (on one thread they had taken 2% of pp512's samples
// while the other thread waited).
void CpuBackend::prepare_repacked(const float* in, int T, int64_t n_in, bool precise, bool pairs, bool groups_needed,
                                  bool rows2) {
  const int64_t nb = n_in / 32, gs = std::max<int64_t>(cpu::act_groups(nb), 1);
  quantize_input(in, T, n_in, precise);
  if (!groups_needed) return;
  const bool groups = groups_of_ != in, lo_groups = precise && lo_groups_of_ != in;
  const bool pair = pairs && pairs_of_ != in, lo_pair = pairs && precise && lo_pairs_of_ != in;
  // A lone token's refined products on the refined decode rows: both
  // activation rows side by side (a copy of a few KiB).
  const bool two = rows2 && precise && T == 1 && !act2_.empty() && (groups || lo_groups || act2_of_ != in);
  if (!groups && !lo_groups && !pair && !lo_pair && !two) return;
  const auto build = [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; p++) {
      const int64_t t0 = 2 * p, t1 = std::min<int64_t>(T, t0 + 2);
      for (int64_t t = t0; t < t1; t++) {
        if (groups) cpu::group_act(&act_[t * nb], &act_g_[t * gs], nb);
        if (lo_groups) cpu::group_act(&act_lo_[t * nb], &act_lo_g_[t * gs], nb);
      }
      if (t1 - t0 < 2) continue;
      if (pair) cpu::pair_groups(&act_g_[t0 * gs], &act_g_[(t0 + 1) * gs], &act_p_[p * gs], gs);
      if (lo_pair) cpu::pair_groups(&act_lo_g_[t0 * gs], &act_lo_g_[(t0 + 1) * gs], &act_lo_p_[p * gs], gs);
    }
  };
  const int64_t n_pairs = (T + 1) / 2;
  if (T >= kPerTokenParallelMin) pool_.parallel_for(n_pairs, build);
  else build(0, n_pairs);
  groups_of_ = in;
  if (precise) lo_groups_of_ = in;
  if (two) {
    std::copy_n(act_.data(), nb, act2_.data());
    std::copy_n(act_lo_.data(), nb, act2_.data() + nb);
    std::copy_n(act_g_.data(), gs, act2_g_.data());
    std::copy_n(act_lo_g_.data(), gs, act2_g_.data() + gs);
    act2_of_ = in;
  }
  if (pairs) pairs_of_ = in;
  if (pairs && precise) lo_pairs_of_ = in;
}

// The full tiles run on paired activations where the kernels have them
// (each tile of NT tokens starts at an even token: pair t / 2).
cpu::DotPairsFn CpuBackend::pairs_kernel(const Repacked& rp, int T) const {
  return k_fast_->repacked_rows > 1 && T >= k_fast_->repacked_tokens ? rp.f.dot_tile_pairs : nullptr;
}

bool CpuBackend::takes_row_tiles(const Repacked& rp, int T) const {
  return row_tiles_ && rp.f.dot_row_tile && T > kPrefetchMaxTokens;
}

bool CpuBackend::row_tiled(const Repacked& rp, int T, int64_t n_out) const {
  return takes_row_tiles(rp, T) && n_out % cpu::kRowTile == 0;
}

void CpuBackend::matmul_repacked(const WeightView& W, const Repacked& rp, const float* in, float* out, int T,
                                 bool precise) {
  // All row tiles: no groups or pairs to build (a parallel pass fewer).
  const bool tiles = row_tiled(rp, T, W.n_out);
  prepare_repacked(in, T, W.n_in, precise, pairs_kernel(rp, T) != nullptr, !tiles, rp.f.dot1_rows2 != nullptr);
  for_rows(
      W.n_out,
      [&](int64_t r0, int64_t r1, int thread) { repacked_rows(rp, W.n_in, W.n_out, out, T, precise, r0, r1, thread); },
      tiles ? cpu::kRowTile : T < 4 ? cpu::kDecodeRows : 1, chunks_per_thread(T, streamed(W.n_out, rp.f.row_bytes)));
}

// Several products of one input in one parallel dispatch: the rows of all
// of them split into the pool's chunks by cost (below), so that a layer's
// Q, K and V (and its gate and up) take one barrier instead of three (two).
// Each row is computed as matmul() computes it, so the results are bitwise
// the same.
void CpuBackend::matmul_jobs(const MatmulJob* jobs, int n_jobs, const float* in, int T, bool same_input) {
  const Repacked* rps[kMaxMatmulJobs];
  bool fuse = k_fast_ != nullptr && n_jobs <= kMaxMatmulJobs;
  bool precise = false, pairs = false, tiles = true, stream = false, rows2 = false;
  for (int j = 0; fuse && j < n_jobs; j++) {
    const auto it = repacked_.find(jobs[j].W->data);
    fuse = it != repacked_.end() && jobs[j].W->n_in == jobs[0].W->n_in;
    if (!fuse) break;
    rps[j] = &it->second;
    precise = precise || jobs[j].precise;
    rows2 = rows2 || (jobs[j].precise && rps[j]->f.dot1_rows2);
    pairs = pairs || pairs_kernel(*rps[j], T) != nullptr;
    tiles = tiles && row_tiled(*rps[j], T, jobs[j].W->n_out);
    stream = stream || streamed(jobs[j].W->n_out, rps[j]->f.row_bytes);  // (then every job's rows in its chunks)
  }
  if (!fuse) {
    for (int j = 0; j < n_jobs; j++) matmul(*jobs[j].W, in, jobs[j].out, T, same_input || j > 0, jobs[j].precise);
    return;
  }
  if (!same_input) act_of_ = lo_of_ = nullptr;
  const int64_t n_in = jobs[0].W->n_in;
  // All row tiles (their rows split at multiples of kRowTile): no groups or pairs to build.
  prepare_repacked(in, T, n_in, precise, pairs, !tiles, rows2);
  const int64_t align = tiles ? cpu::kRowTile : T < 4 ? cpu::kDecodeRows : 2;  // (decode: whole decode-row calls)
  // Cost units of a row (rows start at multiples of align). For 4 tokens
  // or more the dot products set the pace: a row is 1, a refined row 2.
  // Decode (fewer than 4 tokens) streams the weights from memory: a row
  // costs its stored bytes, a refined row's read once (measured for one
  // token; Gemma 3 270M's Q, K and V: 704 of Q's 1024 refined Q5_0 rows went
  // to one thread, 310 KB, and Q's other 320, K's refined rows and V's
  // Q8_0 rows to the other, 427 KB, which took 27-34 us against the
  // first's 21-26. Split by bytes, the dispatch took 0.93-0.98x the time,
  // mean 0.95, tokens alternating in one process on the Zen 4 VM, on one
  // CCD and two; refined rows weighted 1.5x bytes: mean 0.97).
  const bool by_bytes = T < 4;
  // n_units: the rows in the 1-or-2 units, which size the chunks as before.
  int64_t first[kMaxMatmulJobs + 1], cost[kMaxMatmulJobs], total = 0, n_units = 0;
  for (int j = 0; j < n_jobs; j++) {
    first[j] = total;
    cost[j] = by_bytes ? static_cast<int64_t>(rps[j]->f.row_bytes) : jobs[j].precise ? 2 : 1;
    total += jobs[j].W->n_out * cost[j];
    n_units += jobs[j].W->n_out * (jobs[j].precise ? 2 : 1);
  }
  first[n_jobs] = total;
  const int64_t n_chunks = std::clamp<int64_t>(n_units / 16, 1, chunks_per_thread(T, stream) * pool_.size());
  const int64_t per = (total + n_chunks - 1) / n_chunks;
  pool_.for_chunks(static_cast<int>(n_chunks), [&](int c, int thread) {
    const int64_t u0 = c * per, u1 = std::min(total, u0 + per);
    struct Part {
      int j;
      int64_t r0, r1;
      const uint8_t* pf_end;
    } parts[kMaxMatmulJobs];
    int n_parts = 0;
    for (int j = 0; j < n_jobs; j++) {
      const int64_t a = std::max(u0, first[j]), b = std::min(u1, first[j + 1]);
      if (a >= b) continue;
      const int64_t n_out = jobs[j].W->n_out;
      // The unit range as rows, rounded to a multiple of align so that row
      // pairs (or row tiles) stay whole.
      const auto row_at = [&](int64_t u) {
        return u >= first[j + 1] ? n_out : std::min(n_out, ((u - first[j]) / cost[j] + align / 2) / align * align);
      };
      const int64_t r0 = row_at(a), r1 = row_at(b);
      if (r0 < r1) parts[n_parts++] = {j, r0, r1, nullptr};
    }
    // A lone token (the decode rows' prefetch): where the next part's rows
    // follow this part's in memory (repack_weights puts a layer's matrices
    // one after another, on the next cache line), the prefetch runs on into
    // them as one stream rather than stopping at each matrix's end and
    // starting cold.
    for (int k = n_parts - 2; k >= 0 && T == 1; k--) {
      const Part &p = parts[k], &q = parts[k + 1];
      const Repacked &a = *rps[p.j], &b = *rps[q.j];
      const uint8_t* end = a.rows + p.r1 * a.f.row_bytes;
      const uint8_t* next = b.rows + q.r0 * b.f.row_bytes;
      if (next >= end && next - end < 64) parts[k].pf_end = q.pf_end ? q.pf_end : b.rows + q.r1 * b.f.row_bytes;
    }
    for (int k = 0; k < n_parts; k++) {
      const Part& p = parts[k];
      repacked_rows(*rps[p.j], n_in, jobs[p.j].W->n_out, jobs[p.j].out, T, jobs[p.j].precise, p.r0, p.r1, thread,
                    p.pf_end);
    }
  });
}

// Rows [r0, r1) of the product out (T, n_out) = in (T, n_in) x rp's rows,
// from the activations prepare_repacked() left. Rows stored packed
// (RepackedFormat::unpack: Q5_0 on AVX-512) are read as stored by the
// one-token kernel (decode reads the file's size); for 4 tokens or more they
// are rewritten kUnpackRows at a time into this thread's scratch for the
// other kernels: once per row and product, a small cost beside the row's
// dot products with every token.
void CpuBackend::repacked_rows(const Repacked& rp, int64_t n_in, int64_t n_out, float* out, int T, bool precise,
                               int64_t r0, int64_t r1, int thread, const uint8_t* pf_end) {
  if (takes_row_tiles(rp, T)) {
    r0 = row_tiles(rp, n_in, n_out, out, T, precise, r0, r1, thread);
    if (r0 == r1) return;
  }
  if (!rp.f.unpack || T < 4)
    return repacked_tiles(rp, rp.rows, rp.f.row_bytes, 0, nullptr, n_in, n_out, out, T, precise, r0, r1, pf_end);
  const size_t ub = rp.f.unpacked_row_bytes;
  std::vector<uint8_t>& buf = unpack_buf_[thread];
  uint8_t* scratch = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  // A decode batch (one tile of tokens) passes over each row once: each
  // group of rows is unpacked just before its tiles, into L1 (a block of
  // unpacked rows would push the activations out of L1: batch 16 -10%).
  if (T <= kPrefetchMaxTokens)
    return repacked_tiles(rp, rp.rows, rp.f.row_bytes, 0, scratch, n_in, n_out, out, T, precise, r0, r1);
  for (int64_t b0 = r0; b0 < r1; b0 += kUnpackRows) {
    const int64_t b1 = std::min(r1, b0 + kUnpackRows);
    for (int64_t r = b0; r < b1; r++) {
      const uint8_t* row = rp.rows + r * rp.f.row_bytes;
      prefetch_rows(row + kPrefetchRows * rp.f.row_bytes, rp.f.row_bytes, rp.rows + r1 * rp.f.row_bytes);
      rp.f.unpack(row, scratch + (r - b0) * ub, n_in);
    }
    repacked_tiles(rp, scratch, ub, b0, nullptr, n_in, n_out, out, T, precise, b0, b1);
  }
}

// Prefill's row tiles (RepackedFormat::dot_row_tile): kRowTile rows at a
// time rewritten into this thread's tile (unpacked first where stored
// packed), then multiplied with every token, 4 at a time; each token's
// results for the 16 rows are one store. Gemma 3's 640-wide Q5_0 rows x 64
// tokens on one Zen 5 core: 548 GOP/s against the paired kernel's 400, whose
// 2-row x 8-token tiles fold and scatter their sums at every tile (a
// 640-wide row is only 2.5 groups); Gemma 3 270M pp512 +2% to +13% in
// three alternating rounds (docs/benchmarks.md). Returns the first row left (the last
// r1 - r0 mod kRowTile rows go to the other kernels).
int64_t CpuBackend::row_tiles(const Repacked& rp, int64_t n_in, int64_t n_out, float* out, int T, bool precise,
                              int64_t r0, int64_t r1, int thread) {
  const int64_t nb = n_in / 32;
  std::vector<uint8_t>& buf = tile_buf_[thread];
  uint8_t* tile = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  uint8_t* unpacked = tile + cpu::row_tile_bytes(n_in);
  const size_t rb = rp.f.row_bytes, ub = rp.f.unpack ? rp.f.unpacked_row_bytes : rb;
  constexpr int kTokensPerCall = 4;
  const size_t tile_stored = cpu::kRowTile * rb;
  // The lines of the tile after next, a share before each call: all at
  // once, the prefetches outran the core's miss buffers and stalled it.
  // Offsets in bytes from rp.rows, up to the chunk's end. Non-temporal:
  // into L2 (_MM_HINT_T1) measured 1-8% slower in 3 of 4 alternating rounds
  // on Zen 5 (decode's rows go into L2 on Zen 4, decode_prefetch_l2; this
  // is not measured there, nor on Intel).
  const size_t share = (tile_stored / 64 / ((T + kTokensPerCall - 1) / kTokensPerCall) + 1) * 64;
  const size_t chunk_end = static_cast<size_t>(r1) * rb;
  int64_t r = r0;
  for (; r + cpu::kRowTile <= r1; r += cpu::kRowTile) {
    const uint8_t* rows = rp.rows + r * rb;
    size_t ahead = static_cast<size_t>(r) * rb + 2 * tile_stored;  // the tile after next
    const size_t ahead_end = std::min(chunk_end, ahead + tile_stored);
    if (rp.f.unpack) rows = unpack_rows(rp.f, rows, cpu::kRowTile, n_in, unpacked);
    rp.f.tile_rows(rows, ub, n_in, tile);
    const bool next_out = prefetch_w_ && r + 2 * cpu::kRowTile <= r1;  // the next tile's outputs
    for (int t = 0; t < T; t += kTokensPerCall, ahead += share) {
      for (size_t i = ahead; i < ahead + share && i < ahead_end; i += 64) __builtin_prefetch(rp.rows + i, 0, 0);
      const int w = std::min(kTokensPerCall, T - t);
      if (next_out) prefetch_outputs(out, n_out, t, t + w, r + cpu::kRowTile);
      rp.f.dot_row_tile(tile, &act_[t * nb], nb, n_in, w, out + t * n_out + r, n_out, false);
      if (precise) rp.f.dot_row_tile(tile, &act_lo_[t * nb], nb, n_in, w, out + t * n_out + r, n_out, true);
    }
  }
  return r;
}

// repacked_rows' work, with the rows the kernels other than dot1 read at
// trows + (r - tr0) * tb (dot1 reads the stored rows), or, where each is
// given, the stored rows unpacked into each just before their tiles. Each weight row is
// read once per tile of tokens (token_tile) and used for every token of the
// tile while it is in L1.
void CpuBackend::repacked_tiles(const Repacked& rp, const uint8_t* trows, size_t tb, int64_t tr0, uint8_t* each,
                                int64_t n_in, int64_t n_out, float* out, int T, bool precise, int64_t r0, int64_t r1,
                                const uint8_t* pf_end) {
  const int64_t nb = n_in / 32, gs = std::max<int64_t>(cpu::act_groups(nb), 1);
  const cpu::DotR8Fn dot1 = rp.f.dot1, dot4 = rp.f.dot4;
  const cpu::DotR8RowsFn dot_tile = rp.f.dot_tile, dot_tile4 = rp.f.dot_tile4;
  const int R = k_fast_->repacked_rows, NT = k_fast_->repacked_tokens;
  const cpu::DotPairsFn dot_pairs = pairs_kernel(rp, T);
  const size_t row_bytes = rp.f.row_bytes;
  const uint8_t* tend = trows + (r1 - tr0) * tb;
  // Tiles of activations sized for L1: an ActPair holds two tokens' groups
  // (the lines before half_lo: only the Q6_K kernel reads that one).
  const int64_t pair_bytes = offsetof(cpu::ActPair, half_lo);
  const int64_t tok_bytes = gs * (dot_pairs ? pair_bytes / 2 : static_cast<int64_t>(sizeof(cpu::ActGroup)));
  const int tile = token_tile(tok_bytes * (precise ? 2 : 1), NT);
  float v4[4], lo4[4];
  for (int t0 = 0; t0 < T; t0 += tile) {
    const int t1 = std::min(T, t0 + tile);
    int64_t r = r0;
    // Several rows and tokens at once where the kernels take them: each
    // token's activations are loaded once for all the rows, each row's
    // weights once for all the tokens.
    if (R > 1 && dot_tile && dot_tile4 && (t1 - t0) >= 4)
      for (; r + R <= r1; r += R) {
        const uint8_t* row = rp.rows + r * row_bytes;  // as stored (dot1)
        const uint8_t* trow = trows + (r - tr0) * tb;    // as the tile kernels read it
        if (T <= kPrefetchMaxTokens)
          prefetch_rows(trow + kPrefetchRows * tb, R * tb, tend);
        else  // prefill: the next rows, into L1, while this pair's tiles run
          prefetch_rows_l1(trow + R * tb, R * tb, tend);
        size_t ts = tb;  // the stride of the rows at trow
        if (each) {
          trow = unpack_rows(rp.f, row, R, n_in, each);
          ts = rp.f.unpacked_row_bytes;
        }
        float vr[kMaxTileTokens * kMaxRows], lor[kMaxTileTokens * kMaxRows];
        int t = t0;
        // R rows x w tokens from t with kernel fn (out of fn: [row][token]).
        auto tiles = [&](cpu::DotR8RowsFn fn, int w) {
          for (; t + w <= t1; t += w) {
            fn(trow, ts, &act_g_[t * gs], gs, &act_[t * nb], nb, n_in, vr);
            if (precise) fn(trow, ts, &act_lo_g_[t * gs], gs, &act_lo_[t * nb], nb, n_in, lor);
            for (int i = 0; i < R; i++)
              for (int j = 0; j < w; j++)
                out[(t + j) * n_out + r + i] = precise ? vr[i * w + j] + lor[i * w + j] : vr[i * w + j];
          }
        };
        // Prefill: the next 16 rows' output lines, once every 16 rows.
        if (T > kPrefetchMaxTokens && prefetch_w_ && (r - r0) % cpu::kRowTile == 0 &&
            r + 2 * cpu::kRowTile <= r1)
          prefetch_outputs(out, n_out, t0, t1, r + cpu::kRowTile);
        if (dot_pairs)  // straight into out; the refinement added to it
          for (; t + NT <= t1; t += NT) {
            dot_pairs(trow, ts, &act_p_[t / 2 * gs], gs, &act_[t * nb], nb, n_in, out + t * n_out + r, n_out, false);
            if (precise)
              dot_pairs(trow, ts, &act_lo_p_[t / 2 * gs], gs, &act_lo_[t * nb], nb, n_in, out + t * n_out + r, n_out, true);
          }
        tiles(dot_tile, NT);
        tiles(dot_tile4, 4);
        for (; t < t1; t++)
          for (int i = 0; i < R; i++) {
            dot1(row + i * row_bytes, &act_g_[t * gs], 0, &act_[t * nb], 0, n_in, v4);
            if (precise) dot1(row + i * row_bytes, &act_lo_g_[t * gs], 0, &act_lo_[t * nb], 0, n_in, lo4);
            out[t * n_out + r + i] = precise ? v4[0] + lo4[0] : v4[0];
          }
      }
    // A matrix past kDecodeRowsMaxBytes (the output matrix) streams from
    // memory at its own distance (CpuSwitches::stream_prefetch_bytes).
    const bool stream = streamed(n_out, row_bytes);
    const int64_t ahead = t1 - t0 != 1 ? 0 : stream ? stream_prefetch_rows(row_bytes) : decode_prefetch_rows(row_bytes);
    const uint8_t* end = pf_end ? pf_end : rp.rows + r1 * row_bytes;  // (bounds the prefetches only)
    // Decode's prefetches into L2 where that is the switch's state
    // (decode_prefetch_l2); a streamed matrix's non-temporal.
    const cpu::PrefetchHint hint = stream ? cpu::PrefetchHint::nta : decode_prefetch_hint_;
    // A lone token: the rows before the prefetch distance asked for at once,
    // so that the stream starts full rather than with demand misses.
    if (ahead > 0) prefetch_rows(rp.rows + r * row_bytes, ahead * row_bytes, end, hint);
    // Decode (fewer than 4 tokens): kDecodeRows rows a call, token by token
    // (the rows stay in L1 for the next token; a lone token's refined rows:
    // one call for it and its residual); one call's rows overlap
    // their chains and share one tree of sums. A lone token's prefetch goes
    // into the call, a share at each group (DotRowsPfFn): the four rows'
    // lines asked for around the call, in bursts, had outrun the core's
    // miss buffers (the Qwen3 MoE twin's decode 14% slower than one row a
    // call; with the prefetch in the call, 9% faster). Matrices past
    // kDecodeRowsMaxBytes stream at the memory's pace, where one row a call
    // kept the stream steadier: with Gemma 3 270M's 178 MB output matrix
    // too, decode rows measured 0.94-1.00x, without it 1.00-1.02x (bench
    // --ab decode-rows on Zen 5, in the same minutes); on Zen 4 0.64-0.69x
    // (four rows read side by side, 680 bytes apart, are not one ascending
    // stream to the hardware prefetcher).
    if (t1 - t0 < 4 && rp.f.dot1_rows && decode_rows_ && !stream) {
      const size_t pf = static_cast<size_t>(ahead) * row_bytes;
      float vr[cpu::kDecodeRows], lor[cpu::kDecodeRows], v2[2 * cpu::kDecodeRows];
      // A lone token's refined rows: one call for the token and its
      // residual (act2_: prepare_repacked's copy of this input's act_ and
      // act_lo_), their sums bitwise the two calls', added alike.
      const bool two = precise && T == 1 && rp.f.dot1_rows2 && act2_of_ != nullptr && act2_of_ == act_of_;
      for (; two && r + cpu::kDecodeRows <= r1; r += cpu::kDecodeRows) {
        rp.f.dot1_rows2(rp.rows + r * row_bytes, row_bytes, act2_g_.data(), act2_.data(), n_in, v2, pf, end, hint);
        for (int i = 0; i < cpu::kDecodeRows; i++) out[r + i] = v2[2 * i] + v2[2 * i + 1];
      }
      for (; r + cpu::kDecodeRows <= r1; r += cpu::kDecodeRows) {
        const uint8_t* row = rp.rows + r * row_bytes;
        for (int t = t0; t < t1; t++) {
          rp.f.dot1_rows(row, row_bytes, &act_g_[t * gs], &act_[t * nb], n_in, vr, t == t0 ? pf : 0, end, hint);
          if (precise) rp.f.dot1_rows(row, row_bytes, &act_lo_g_[t * gs], &act_lo_[t * nb], n_in, lor, 0, end, hint);
          for (int i = 0; i < cpu::kDecodeRows; i++) out[t * n_out + r + i] = precise ? vr[i] + lor[i] : vr[i];
        }
      }
    }
    // Row i with every token: dot4 four tokens at a time, then dot1.
    auto one_row = [&](int64_t i) {
      const uint8_t* row = rp.rows + i * row_bytes;
      if (ahead > 0) prefetch_rows(row + ahead * row_bytes, row_bytes, end, hint);
      int t = t0;
      const uint8_t* trow = trows + (i - tr0) * tb;  // (dot4's; dot1 reads the stored row)
      if (each && t1 - t0 >= 4) trow = unpack_rows(rp.f, row, 1, n_in, each);
      for (; t + 4 <= t1; t += 4) {
        dot4(trow, &act_g_[t * gs], gs, &act_[t * nb], nb, n_in, v4);
        if (precise) dot4(trow, &act_lo_g_[t * gs], gs, &act_lo_[t * nb], nb, n_in, lo4);
        for (int j = 0; j < 4; j++) out[(t + j) * n_out + i] = precise ? v4[j] + lo4[j] : v4[j];
      }
      for (; t < t1; t++) {
        dot1(row, &act_g_[t * gs], 0, &act_[t * nb], 0, n_in, v4);
        if (precise) dot1(row, &act_lo_g_[t * gs], 0, &act_lo_[t * nb], 0, n_in, lo4);
        out[t * n_out + i] = precise ? v4[0] + lo4[0] : v4[0];
      }
    };
    // A lone token's chunk of a streamed matrix in stream_ways_ ascending
    // streams a row of each in turn (CpuSwitches::stream_ways): one stream
    // a core left memory bandwidth unused where each core has its own path
    // to memory (Zen 4 vCPUs on two CCDs: four ways 1.04-1.09x one, on one
    // CCD 0.99-1.01x). Each row is one_row's, in another order.
    if (stream && t1 - t0 == 1 && stream_ways_ > 1 && r1 - r >= 2 * stream_ways_) {
      const int W = stream_ways_;
      const int64_t per = (r1 - r) / W;  // rows a way; the last r1 - r - W * per go below
      for (int w = 1; w < W && ahead > 0; w++) prefetch_rows(rp.rows + (r + w * per) * row_bytes, ahead * row_bytes, end);
      for (int64_t k = 0; k < per; k++)
        for (int w = 0; w < W; w++) one_row(r + w * per + k);
      r += W * per;
    }
    for (; r < r1; r++) one_row(r);
  }
}

// One token's products with several matrices in one parallel dispatch
// (fast path): out_j = W_j · in_{input_j}. A decoded MoE token runs its k
// experts' gate and up matrices (one input), then their down matrices (k
// inputs) this way: two dispatches instead of 3k, each over all the rows.
// Each row is computed by the kernel matmul_fast() uses for a lone token, so
// the results are bitwise those of matmul() (the batched path's).
void CpuBackend::matvec_many(MatvecJob* jobs, int n_jobs, const float* const* inputs, int n_inputs) {
  const int64_t n_in = jobs[0].W->n_in, nb = n_in / 32;
  const int64_t gs = std::max<int64_t>(cpu::act_groups(nb), 1);
  // Each input quantized (and grouped) once, into its own slot.
  for (int i = 0; i < n_inputs; i++) {
    k_fast_->quantize_act(inputs[i], &many_act_[i * nb], n_in);
    cpu::group_act(&many_act_[i * nb], &many_act_g_[i * gs], nb);
  }
  act_of_ = lo_of_ = groups_of_ = lo_groups_of_ = pairs_of_ = lo_pairs_of_ = act2_of_ = nullptr;  // act_ is not this input's
  int64_t total = 0;
  for (int j = 0; j < n_jobs; j++) {
    MatvecJob& jb = jobs[j];
    jb.first_row = total;
    total += jb.W->n_out;
    auto rp = repacked_.find(jb.W->data);
    jb.rp = rp == repacked_.end() ? nullptr : &rp->second;
  }
  for_rows(total, [&](int64_t r0, int64_t r1, int) {
    int j = 0;
    while (jobs[j].first_row + jobs[j].W->n_out <= r0) j++;
    float v[4];
    for (int64_t g = r0; g < r1; g++) {
      while (g >= jobs[j].first_row + jobs[j].W->n_out) j++;
      const MatvecJob& jb = jobs[j];
      const WeightView& W = *jb.W;
      const int64_t r = g - jb.first_row;
      const cpu::ActQ8* act = &many_act_[jb.input * nb];
      if (jb.rp && jb.rp->f.dot1_rows && decode_rows_ && g + cpu::kDecodeRows <= r1 &&
          r + cpu::kDecodeRows <= W.n_out) {  // kDecodeRows rows of this matrix at once (repacked_tiles)
        const size_t rb = jb.rp->f.row_bytes;
        const uint8_t* row = jb.rp->rows + r * rb;
        const size_t pf = static_cast<size_t>(decode_prefetch_rows(rb)) * rb;  // as in repacked_tiles
        jb.rp->f.dot1_rows(row, rb, &many_act_g_[jb.input * gs], act, n_in, &jb.out[r], pf, jb.rp->rows + W.n_out * rb,
                           decode_prefetch_hint_);
        g += cpu::kDecodeRows - 1;
      } else if (jb.rp) {
        const size_t rb = jb.rp->f.row_bytes;
        const uint8_t* row = jb.rp->rows + r * rb;
        if (const int64_t ahead = decode_prefetch_rows(rb); ahead > 0)  // as a lone token's matmul does
          prefetch_rows(row + ahead * rb, rb, jb.rp->rows + W.n_out * rb, decode_prefetch_hint_);
        jb.rp->f.dot1(row, &many_act_g_[jb.input * gs], 0, act, 0, n_in, v);
        jb.out[r] = v[0];
      } else if (cpu::uses_q8_activations(W.type)) {
        if (const int64_t ahead = decode_prefetch_rows(W.row_bytes); ahead > 0)  // (MXFP4 experts: the file's layout)
          prefetch_rows(W.row(r) + ahead * W.row_bytes, W.row_bytes, W.row(W.n_out), decode_prefetch_hint_);
        jb.out[r] = k_fast_->dot_q8[static_cast<int>(W.type)](W.row(r), act, n_in);
      } else {
        jb.out[r] = k_fast_->dot_f32[static_cast<int>(W.type)](W.row(r), inputs[jb.input], n_in);
      }
    }
  }, cpu::kDecodeRows, chunks_per_thread(1));
}

}  // namespace phaselab
