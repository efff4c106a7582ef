#include <type_traits>

#include "common.cuh"
#include "kernels.h"
#include "matvec_rows.cuh"

namespace phaselab::cuda {

namespace {
constexpr int kRowsPerBlock = 4;  // one warp per row

// One warp per 32 values: max |x| / 127 and the values rounded to nearest even.
__global__ void quantize_q8_kernel(const float* x, size_t n_blocks, int8_t* q, float* d) {
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
// step); -1: type at run time.
template <Path P, int kT, int kType = -1>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    matvec_kernel(const uint8_t* w, TensorType type_, size_t row_bytes, int n_in, int n_out, const float* x,
                  const int8_t* xq, const float* xd, int T_, float* out) {
  const int T = kT == 1 ? 1 : T_;
  const TensorType type = kType >= 0 ? static_cast<TensorType>(kType) : type_;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_out) return;
  float acc[kT];
  for (int t = 0; t < kT; t++) acc[t] = 0.f;
  row_product<P>(w + static_cast<size_t>(row) * row_bytes, type, n_in, x, xq, xd, T, lane, acc, IdentityRows{});
  for (int t = 0; t < T; t++) {
    const float r = warp_sum(acc[t]);
    if (lane == 0) out[static_cast<size_t>(t) * n_out + row] = r;
  }
}

// Up to three matrices with the same input in one launch (Q, K and V):
// the warps take the rows of a, then b, then c.
template <Path P, int kT, int kType = -1>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    matvec3_kernel(MatvecOut a, MatvecOut b, MatvecOut c, int n_in, const float* x, const int8_t* xq, const float* xd,
                   int T_) {
  const int T = kT == 1 ? 1 : T_;
  int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  MatvecOut m = a;
  if (row >= a.n_out) {
    row -= a.n_out;
    m = b;
    if (row >= b.n_out) {
      row -= b.n_out;
      m = c;
      if (row >= c.n_out) return;
    }
  }
  float acc[kT];
  for (int t = 0; t < kT; t++) acc[t] = 0.f;
  const TensorType type = kType >= 0 ? static_cast<TensorType>(kType) : m.type;
  row_product<P>(m.w + static_cast<size_t>(row) * m.row_bytes, type, n_in, x, xq, xd, T, lane, acc, IdentityRows{});
  for (int t = 0; t < T; t++) {
    const float r = warp_sum(acc[t]);
    if (lane == 0) m.out[static_cast<size_t>(t) * m.n_out + row] = r;
  }
}

// The gate and up rows r of a gated feed-forward in one warp:
// out[t, r] = act(gate_r . x_t) * (up_r . x_t).
template <Path P, int kT, int kType = -1>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    gated_matvec_kernel(const uint8_t* wg, TensorType tg_, size_t rbg, const uint8_t* wu, TensorType tu_, size_t rbu,
                        int n_in, int n_out, const float* x, const int8_t* xq, const float* xd, int T_, bool gelu,
                        float* out) {
  const int T = kT == 1 ? 1 : T_;
  const TensorType tg = kType >= 0 ? static_cast<TensorType>(kType) : tg_;
  const TensorType tu = kType >= 0 ? static_cast<TensorType>(kType) : tu_;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_out) return;
  float ag[kT], au[kT];
  for (int t = 0; t < kT; t++) ag[t] = au[t] = 0.f;
  row_product<P>(wg + static_cast<size_t>(row) * rbg, tg, n_in, x, xq, xd, T, lane, ag, IdentityRows{});
  row_product<P>(wu + static_cast<size_t>(row) * rbu, tu, n_in, x, xq, xd, T, lane, au, IdentityRows{});
  for (int t = 0; t < T; t++) {
    const float g = warp_sum(ag[t]), u = warp_sum(au[t]);
    if (lane == 0) out[static_cast<size_t>(t) * n_out + row] = (gelu ? gelu_tanh(g) : silu(g)) * u;
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
         t == TensorType::Q6_K;
}

cudaError_t launch_quantize_q8(const float* x, int T, int n, Q8Act q8, cudaStream_t s) {
  if (n % 32 != 0 || static_cast<size_t>(T) * n > q8.cap) return cudaErrorInvalidValue;
  const size_t n_blocks = static_cast<size_t>(T) * n / 32;
  PHASELAB_LAUNCH(quantize_q8_kernel, static_cast<unsigned>((n_blocks + 7) / 8), 256, 0, s)(x, n_blocks, q8.q, q8.d);
  return cudaGetLastError();
}

cudaError_t launch_matvec(const uint8_t* w, TensorType type, size_t row_bytes, int n_in, int n_out, const float* x,
                          int T, float* out, cudaStream_t s, Q8Act q8) {
  cudaError_t e;
  const Q8Input xq = quantize_for(q8, q8_dot_supported(type), x, T, n_in, s, &e);
  if (e != cudaSuccess) return e;
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
        PHASELAB_LAUNCH((matvec_kernel<P, KT, decltype(kind)::value>), blocks, 32 * kRowsPerBlock, 0, s)(
            w, type, row_bytes, n_in, n_out, xt, qt, dt, n, ot);
        return cudaGetLastError();
      };
      return with_type<P>(true, type, go);
    });
    if (e2 != cudaSuccess) return e2;
  }
  return cudaSuccess;
}

cudaError_t launch_matvec3(MatvecOut a, MatvecOut b, MatvecOut c, int n_in, const float* x, int T, cudaStream_t s,
                           Q8Act q8) {
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
        PHASELAB_LAUNCH((matvec3_kernel<P, KT, decltype(kind)::value>), blocks, 32 * kRowsPerBlock, 0, s)(
            a2, b2, c2, n_in, x + static_cast<size_t>(t0) * n_in,
            xq.q ? xq.q + static_cast<size_t>(t0) * n_in : nullptr,
            xq.d ? xq.d + static_cast<size_t>(t0) * (n_in / 32) : nullptr, n);
        return cudaGetLastError();
      });
    });
    if (e2 != cudaSuccess) return e2;
  }
  return cudaSuccess;
}

cudaError_t launch_matvec_gated(const uint8_t* w_gate, TensorType gate_type, size_t gate_row_bytes, const uint8_t* w_up,
                                TensorType up_type, size_t up_row_bytes, int n_in, int n_out, const float* x, int T,
                                bool gelu, float* out, cudaStream_t s, Q8Act q8) {
  cudaError_t e;
  const Q8Input xq = quantize_for(q8, q8_dot_supported(gate_type) || q8_dot_supported(up_type), x, T, n_in, s, &e);
  if (e != cudaSuccess) return e;
  const unsigned blocks = (n_out + kRowsPerBlock - 1) / kRowsPerBlock;
  for (int t0 = 0; t0 < T; t0 += kMaxTokens) {
    const int n = T - t0 < kMaxTokens ? T - t0 : kMaxTokens;
    const bool all_q8 = xq.q && q8_dot_supported(gate_type) && q8_dot_supported(up_type);
    const cudaError_t e2 = with_variant(all_q8, n, [&](auto path, auto kt) {
      constexpr Path P = decltype(path)::value;
      constexpr int KT = decltype(kt)::value;
      return with_type<P>(gate_type == up_type, gate_type, [&](auto kind) {
        PHASELAB_LAUNCH((gated_matvec_kernel<P, KT, decltype(kind)::value>), blocks, 32 * kRowsPerBlock, 0, s)(
            w_gate, gate_type, gate_row_bytes, w_up, up_type, up_row_bytes, n_in, n_out,
            x + static_cast<size_t>(t0) * n_in, xq.q ? xq.q + static_cast<size_t>(t0) * n_in : nullptr,
            xq.d ? xq.d + static_cast<size_t>(t0) * (n_in / 32) : nullptr, n, gelu,
            out + static_cast<size_t>(t0) * n_out);
        return cudaGetLastError();
      });
    });
    if (e2 != cudaSuccess) return e2;
  }
  return cudaSuccess;
}

}  // namespace phaselab::cuda
