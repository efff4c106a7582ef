#include <type_traits>

#include "common.cuh"
#include "kernels.h"
#include "matvec_rows.cuh"
#include "rope_head.cuh"

namespace phaselab::cuda {

namespace {
constexpr int kRowsPerBlock = 4;  // one warp per row
// The tails (AddNormTail) run on one block of the product's launch: the
// rows of up to kTailPer * 32 * kRowsPerBlock values in registers (norm.cu's
// launch_add_rmsnorm takes rows of that width with the same code and as
// many threads: the same values).
constexpr int kTailPer = 8;

// One warp per 32 values: max |x| / 127 and the values rounded to nearest even.
__global__ void quantize_q8_kernel(const float* x, size_t n_blocks, int8_t* q, float* d) {
  grid_dependency_sync();
  const size_t blk = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (blk >= n_blocks) return;  // (whole warps leave together)
  q8_store(x[blk * 32 + lane], q, d, blk * 32 + lane);
}

// The kernels come in variants (Path, kT): Path::q8 (every matrix of the
// launch on the integer path) carries no float path and so fewer
// registers, more warps per SM and more loads in flight; Path::any picks
// per matrix. kT = 1: a decode launch (one input row), else up to
// kMaxTokens rows (T at run time).
enum class Path { any, q8 };
template <Path P, typename RowOf>
__device__ __forceinline__ void row_product(const uint8_t* wr, TensorType type, int n_in, const float* x,
                                            const int8_t* xq, const float* xd, int T, int lane, float* acc,
                                            RowOf row_of) {
  if constexpr (P == Path::q8) row_partials_q8(wr, type, n_in, xq, xd, T, lane, acc, row_of);
  else row_dot_rows(wr, type, n_in, x, xq, xd, T, lane, acc, row_of);
}

// One warp per output row. kType >= 0: the weights' type known at compile
// time (the integer path's decoding of one format alone: fewer registers,
// more warps in flight; the logits' product is the largest of a decode
// step); -1: type at run time. kTail: the launch's last block to finish
// then runs the AddNormTail on the T rows of out. Each warp first asks L2
// for its weight row, before the previous kernel's end (the weights do
// not depend on it). (Rows staged through shared memory with 16-byte
// loads did not speed up the logits' product, 94 us against 96 on an
// H200: not kept.)
template <Path P, int kT, int kType = -1, bool kTail = false>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    matvec_kernel(const uint8_t* w, TensorType type_, size_t row_bytes, int n_in, int n_out, const float* x,
                  const int8_t* xq, const float* xd, int T_, float* out, AddNormTail tail) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const uint8_t* wr = w + static_cast<size_t>(row) * row_bytes;
  if (row < n_out) prefetch_l2(wr, row_bytes, lane);
  grid_dependency_sync();
  const int T = kT == 1 ? 1 : T_;
  const TensorType type = kType >= 0 ? static_cast<TensorType>(kType) : type_;
  if (row < n_out) {  // (not a return: a tail's block waits for all its threads)
    float acc[kT];
    for (int t = 0; t < kT; t++) acc[t] = 0.f;
    row_product<P>(wr, type, n_in, x, xq, xd, T, lane, acc, IdentityRows{});
    for (int t = 0; t < T; t++) {
      const float r = warp_sum(acc[t]);
      if (lane == 0) out[static_cast<size_t>(t) * n_out + row] = r;
    }
  }
  if constexpr (kTail) {
    if (!last_block_done(tail.counter, gridDim.x)) return;
    __shared__ float shared[32];
    for (int t = 0; t < T; t++) {
      const size_t off = static_cast<size_t>(t) * n_out;
      add_rmsnorm_row<kTailPer>(tail.x + off, out + off, tail.post_w, tail.w, tail.out + off, n_out, tail.eps,
                                tail.q8_out.q, tail.q8_out.d, off, shared);
    }
  }
}

// Up to three matrices with the same input in one launch (Q, K and V):
// the warps take the rows of a, then b, then c. kRope (one token): the last
// block of each head's rows to finish (the K head's and the V head's
// together) then runs its QK-norm, RoPE and cache store (QkRope).
static_assert(32 * kRowsPerBlock == kQkRopeThreads, "a head's tail runs as rope.cu's block does");
template <Path P, int kT, int kType = -1, bool kRope = false>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    matvec3_kernel(MatvecOut a, MatvecOut b, MatvecOut c, int n_in, const float* x, const int8_t* xq, const float* xd,
                   int T_, QkRope rope) {
  int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  MatvecOut m = a;
  if (row >= a.n_out) {
    row -= a.n_out;
    m = b;
    if (row >= b.n_out) {
      row -= b.n_out;
      m = c;
    }
  }
  const bool in = row < m.n_out;
  if (in) prefetch_l2(m.w + static_cast<size_t>(row) * m.row_bytes, m.row_bytes, lane);
  grid_dependency_sync();
  if (in) {  // (not a return: a head's last block waits for all its threads)
    const int T = kT == 1 ? 1 : T_;
    float acc[kT];
    for (int t = 0; t < kT; t++) acc[t] = 0.f;
    const TensorType type = kType >= 0 ? static_cast<TensorType>(kType) : m.type;
    row_product<P>(m.w + static_cast<size_t>(row) * m.row_bytes, type, n_in, x, xq, xd, T, lane, acc,
                   IdentityRows{});
    for (int t = 0; t < T; t++) {
      const float r = warp_sum(acc[t]);
      if (lane == 0) m.out[static_cast<size_t>(t) * m.n_out + row] = r;
    }
  }
  if constexpr (kRope) {
    // This block's head (its rows lie in one head: head_dim % kRowsPerBlock
    // == 0): q heads 0 .. n_head - 1, then the k heads, each counting the
    // blocks of its K rows and of its V rows.
    const int r0 = blockIdx.x * kRowsPerBlock, HD = rope.head_dim, per_head = HD / kRowsPerBlock;
    const bool q_head = r0 < a.n_out;
    const int group = q_head ? r0 / HD : rope.n_head + (r0 - a.n_out) % b.n_out / HD;
    if (!last_block_done(rope.head_counters + group, q_head ? per_head : 2 * per_head)) return;
    PHASELAB_DYNAMIC_SHARED(float, head);  // head_dim floats
    __shared__ float shared[32];
    qk_norm_rope_store_head(a.out, b.out, c.out, rope, 0, group, head, shared);
  }
}

// The gate and up rows r of a gated feed-forward in one warp:
// out[t, r] = act(gate_r . x_t) * (up_r . x_t). kQ8Out: the last of each
// 32 rows' blocks to finish (group_counters, one per 32 rows) writes those
// rows of out in 8 bits too (n_out % 32 == 0).
template <Path P, int kT, int kType = -1, bool kQ8Out = false>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    gated_matvec_kernel(const uint8_t* wg, TensorType tg_, size_t rbg, const uint8_t* wu, TensorType tu_, size_t rbu,
                        int n_in, int n_out, const float* x, const int8_t* xq, const float* xd, int T_, bool gelu,
                        float* out, int8_t* out_q, float* out_d, unsigned* group_counters) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row < n_out) {
    prefetch_l2(wg + static_cast<size_t>(row) * rbg, rbg, lane);
    prefetch_l2(wu + static_cast<size_t>(row) * rbu, rbu, lane);
  }
  grid_dependency_sync();
  const int T = kT == 1 ? 1 : T_;
  const TensorType tg = kType >= 0 ? static_cast<TensorType>(kType) : tg_;
  const TensorType tu = kType >= 0 ? static_cast<TensorType>(kType) : tu_;
  if (row < n_out) {  // (not a return: kQ8Out's blocks wait for all their threads)
    float ag[kT], au[kT];
    for (int t = 0; t < kT; t++) ag[t] = au[t] = 0.f;
    row_product<P>(wg + static_cast<size_t>(row) * rbg, tg, n_in, x, xq, xd, T, lane, ag, IdentityRows{});
    row_product<P>(wu + static_cast<size_t>(row) * rbu, tu, n_in, x, xq, xd, T, lane, au, IdentityRows{});
    for (int t = 0; t < T; t++) {
      const float g = warp_sum(ag[t]), u = warp_sum(au[t]);
      if (lane == 0) out[static_cast<size_t>(t) * n_out + row] = (gelu ? gelu_tanh(g) : silu(g)) * u;
    }
  }
  if constexpr (kQ8Out) {
    constexpr int kBlocksPerGroup = 32 / kRowsPerBlock;
    const unsigned group = blockIdx.x / kBlocksPerGroup;
    if (!last_block_done(group_counters + group, kBlocksPerGroup)) return;
    for (int t = threadIdx.x / 32; t < T; t += kRowsPerBlock) {  // a warp per token
      const size_t i = static_cast<size_t>(t) * n_out + group * 32 + lane;
      q8_store(__ldcg(out + i), out_q, out_d, i);
    }
  }
}

// Calls f with the variant's constants: Path::q8 where the input is
// quantized and every matrix takes the integer path; kT 1 for one row.
template <typename F>
cudaError_t with_variant(bool all_q8, int T, F&& f) {
  if (all_q8) return T == 1 ? f(std::integral_constant<Path, Path::q8>{}, std::integral_constant<int, 1>{})
                            : f(std::integral_constant<Path, Path::q8>{}, std::integral_constant<int, kMaxTokens>{});
  return T == 1 ? f(std::integral_constant<Path, Path::any>{}, std::integral_constant<int, 1>{})
                : f(std::integral_constant<Path, Path::any>{}, std::integral_constant<int, kMaxTokens>{});
}
// go(std::integral_constant<int, type>) for the integer path's formats
// when P is Path::q8 and every matrix has that one format (same_type);
// else go(std::integral_constant<int, -1>) (the type read at run time).
template <Path P, typename G>
cudaError_t with_type(bool same_type, TensorType type, G&& go) {
  if constexpr (P == Path::q8) {
    if (same_type) switch (type) {
        case TensorType::Q8_0: return go(std::integral_constant<int, static_cast<int>(TensorType::Q8_0)>{});
        case TensorType::Q4_0: return go(std::integral_constant<int, static_cast<int>(TensorType::Q4_0)>{});
        case TensorType::Q5_0: return go(std::integral_constant<int, static_cast<int>(TensorType::Q5_0)>{});
        case TensorType::Q4_K: return go(std::integral_constant<int, static_cast<int>(TensorType::Q4_K)>{});
        case TensorType::Q6_K: return go(std::integral_constant<int, static_cast<int>(TensorType::Q6_K)>{});
        default: break;
      }
  }
  return go(std::integral_constant<int, -1>{});
}
}  // namespace

bool q8_dot_supported(TensorType t) {
  return t == TensorType::Q8_0 || t == TensorType::Q4_0 || t == TensorType::Q5_0 || t == TensorType::Q4_K ||
         t == TensorType::Q6_K || t == TensorType::MXFP4;
}

cudaError_t launch_quantize_q8(const float* x, int T, int n, Q8Act q8, cudaStream_t s) {
  if (n % 32 != 0 || static_cast<size_t>(T) * n > q8.cap) return cudaErrorInvalidValue;
  const size_t n_blocks = static_cast<size_t>(T) * n / 32;
  PHASELAB_LAUNCH(quantize_q8_kernel, static_cast<unsigned>((n_blocks + 7) / 8), 256, 0, s)(x, n_blocks, q8.q, q8.d);
  return cudaGetLastError();
}

bool add_norm_tail_fits(int n_out) { return n_out > 0 && n_out <= kTailPer * 32 * kRowsPerBlock; }

cudaError_t launch_matvec(const uint8_t* w, TensorType type, size_t row_bytes, int n_in, int n_out, const float* x,
                          int T, float* out, cudaStream_t s, Q8Act q8, const AddNormTail* tail) {
  cudaError_t e;
  const Q8Input xq = quantize_for(q8, q8_dot_supported(type), x, T, n_in, s, &e);
  if (e != cudaSuccess) return e;
  // (One row: a tail runs its rows one after another on one block, where
  // launch_add_rmsnorm runs a block per row.)
  const bool fused = tail && T == 1 && add_norm_tail_fits(n_out) && tail->counter &&
                     (!tail->q8_out.q || (n_out % 32 == 0 && static_cast<size_t>(T) * n_out <= tail->q8_out.cap));
  const unsigned blocks = (n_out + kRowsPerBlock - 1) / kRowsPerBlock;
  for (int t0 = 0; t0 < T; t0 += kMaxTokens) {
    const int n = T - t0 < kMaxTokens ? T - t0 : kMaxTokens;
    const cudaError_t e2 = with_variant(xq.q != nullptr, n, [&](auto path, auto kt) {
      constexpr Path P = decltype(path)::value;
      constexpr int KT = decltype(kt)::value;
      const float* xt = x + static_cast<size_t>(t0) * n_in;
      const int8_t* qt = xq.q ? xq.q + static_cast<size_t>(t0) * n_in : nullptr;
      const float* dt = xq.d ? xq.d + static_cast<size_t>(t0) * (n_in / 32) : nullptr;
      float* ot = out + static_cast<size_t>(t0) * n_out;
      // (Loading 8 units per lane at once for a decoded token's 2048-wide
      // rows, Gemma 3 270M's FFN down, took 7.6-8.8 us per launch on an
      // H200 against 7.5-8.3 with 4: not kept.)
      auto go = [&](auto kind) {
        if (fused) {  // the tail on this launch's rows
          const size_t off = static_cast<size_t>(t0) * n_out;
          AddNormTail tt = *tail;
          tt.x += off;
          tt.out += off;
          if (tt.q8_out.q) {
            tt.q8_out.q += off;
            tt.q8_out.d += off / 32;
          }
          PHASELAB_LAUNCH((matvec_kernel<P, KT, decltype(kind)::value, true>), blocks, 32 * kRowsPerBlock, 0, s)(
              w, type, row_bytes, n_in, n_out, xt, qt, dt, n, ot, tt);
        } else {
          PHASELAB_LAUNCH((matvec_kernel<P, KT, decltype(kind)::value>), blocks, 32 * kRowsPerBlock, 0, s)(
              w, type, row_bytes, n_in, n_out, xt, qt, dt, n, ot, AddNormTail{});
        }
        return cudaGetLastError();
      };
      return with_type<P>(true, type, go);
    });
    if (e2 != cudaSuccess) return e2;
  }
  if (tail && !fused)
    return launch_add_rmsnorm(tail->x, out, tail->post_w, tail->w, tail->out, T, n_out, tail->eps, s, tail->q8_out);
  return cudaSuccess;
}

cudaError_t launch_matvec3(MatvecOut a, MatvecOut b, MatvecOut c, int n_in, const float* x, int T, cudaStream_t s,
                           Q8Act q8, const QkRope* rope) {
  // The rope tail for one token where Q, K and V are whole heads.
  const bool rope_fused = rope && T == 1 && rope->head_counters && rope->head_dim % kRowsPerBlock == 0 &&
                          a.n_out == rope->n_head * rope->head_dim && b.n_out == rope->n_head_kv * rope->head_dim &&
                          c.n_out == b.n_out && b.n_out > 0;
  if (rope_fused && !qk_rope_args_ok(*rope)) return cudaErrorInvalidValue;
  cudaError_t e;
  const bool wanted = q8_dot_supported(a.type) || (b.n_out > 0 && q8_dot_supported(b.type)) ||
                      (c.n_out > 0 && q8_dot_supported(c.type));
  const Q8Input xq = quantize_for(q8, wanted, x, T, n_in, s, &e);
  if (e != cudaSuccess) return e;
  const int rows = a.n_out + b.n_out + c.n_out;
  const unsigned blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  for (int t0 = 0; t0 < T; t0 += kMaxTokens) {
    const int n = T - t0 < kMaxTokens ? T - t0 : kMaxTokens;
    MatvecOut a2 = a, b2 = b, c2 = c;
    a2.out += static_cast<size_t>(t0) * a.n_out;
    b2.out += static_cast<size_t>(t0) * b.n_out;
    c2.out += static_cast<size_t>(t0) * c.n_out;
    const bool all_q8 = xq.q && q8_dot_supported(a.type) && (b.n_out == 0 || q8_dot_supported(b.type)) &&
                        (c.n_out == 0 || q8_dot_supported(c.type));
    const bool same = (b.n_out == 0 || b.type == a.type) && (c.n_out == 0 || c.type == a.type);
    const cudaError_t e2 = with_variant(all_q8, n, [&](auto path, auto kt) {
      constexpr Path P = decltype(path)::value;
      constexpr int KT = decltype(kt)::value;
      return with_type<P>(same, a.type, [&](auto kind) {
        const float* xt = x + static_cast<size_t>(t0) * n_in;
        const int8_t* qt = xq.q ? xq.q + static_cast<size_t>(t0) * n_in : nullptr;
        const float* dt = xq.d ? xq.d + static_cast<size_t>(t0) * (n_in / 32) : nullptr;
        if (rope_fused)
          PHASELAB_LAUNCH((matvec3_kernel<P, KT, decltype(kind)::value, true>), blocks, 32 * kRowsPerBlock,
                          rope->head_dim * sizeof(float), s)(a2, b2, c2, n_in, xt, qt, dt, n, *rope);
        else
          PHASELAB_LAUNCH((matvec3_kernel<P, KT, decltype(kind)::value>), blocks, 32 * kRowsPerBlock, 0, s)(
              a2, b2, c2, n_in, xt, qt, dt, n, QkRope{});
        return cudaGetLastError();
      });
    });
    if (e2 != cudaSuccess) return e2;
  }
  if (rope && !rope_fused)
    return launch_qk_norm_rope_store(a.out, b.out, c.out, rope->q_norm, rope->k_norm, rope->cache, rope->rows, T,
                                     rope->n_head, rope->n_head_kv, rope->head_dim, rope->n_rot, rope->base,
                                     rope->freq_factors, rope->mscale, rope->neox, rope->eps, s, rope->inv_freq);
  return cudaSuccess;
}

cudaError_t launch_matvec_gated(const uint8_t* w_gate, TensorType gate_type, size_t gate_row_bytes, const uint8_t* w_up,
                                TensorType up_type, size_t up_row_bytes, int n_in, int n_out, const float* x, int T,
                                bool gelu, float* out, cudaStream_t s, Q8Act q8, Q8Act q8_out,
                                unsigned* group_counters) {
  if (q8_out.q && (n_out % 32 != 0 || static_cast<size_t>(T) * n_out > q8_out.cap)) return cudaErrorInvalidValue;
  cudaError_t e;
  const Q8Input xq = quantize_for(q8, q8_dot_supported(gate_type) || q8_dot_supported(up_type), x, T, n_in, s, &e);
  if (e != cudaSuccess) return e;
  const bool q8_fused = q8_out.q && group_counters;
  const unsigned blocks = (n_out + kRowsPerBlock - 1) / kRowsPerBlock;
  for (int t0 = 0; t0 < T; t0 += kMaxTokens) {
    const int n = T - t0 < kMaxTokens ? T - t0 : kMaxTokens;
    const bool all_q8 = xq.q && q8_dot_supported(gate_type) && q8_dot_supported(up_type);
    const cudaError_t e2 = with_variant(all_q8, n, [&](auto path, auto kt) {
      constexpr Path P = decltype(path)::value;
      constexpr int KT = decltype(kt)::value;
      return with_type<P>(gate_type == up_type, gate_type, [&](auto kind) {
        const size_t off = static_cast<size_t>(t0) * n_out;
        auto* const gated = q8_fused ? &gated_matvec_kernel<P, KT, decltype(kind)::value, true>
                                     : &gated_matvec_kernel<P, KT, decltype(kind)::value>;
        PHASELAB_LAUNCH(gated, blocks, 32 * kRowsPerBlock, 0, s)(
            w_gate, gate_type, gate_row_bytes, w_up, up_type, up_row_bytes, n_in, n_out,
            x + static_cast<size_t>(t0) * n_in, xq.q ? xq.q + static_cast<size_t>(t0) * n_in : nullptr,
            xq.d ? xq.d + static_cast<size_t>(t0) * (n_in / 32) : nullptr, n, gelu, out + off,
            q8_fused ? q8_out.q + off : nullptr, q8_fused ? q8_out.d + off / 32 : nullptr,
            q8_fused ? group_counters : nullptr);
        return cudaGetLastError();
      });
    });
    if (e2 != cudaSuccess) return e2;
  }
  // (Without the counters the 8-bit copy is made by a launch of its own.)
  if (q8_out.q && !q8_fused) return launch_quantize_q8(out, T, n_out, q8_out, s);
  return cudaSuccess;
}

}  // namespace phaselab::cuda
