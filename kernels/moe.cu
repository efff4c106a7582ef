// Mixture of experts on the device: the router's choice per token, the
// (token, slot) pairs grouped by expert, the chosen experts' products (each
// expert's weight rows read once for up to 8 of its pairs) and each token's
// weighted sum. Every step reads its sizes from device memory (how many
// pairs each expert has, which experts have any), so a captured graph stays
// valid whatever the router picks.
#include <type_traits>

#include "common.cuh"
#include "kernels.h"
#include "matvec_rows.cuh"

namespace phaselab::cuda {

namespace {

constexpr int kRowsPerBlock = 4;  // one warp per weight row
constexpr int kPairsAtOnce = 8;   // pairs of an expert sharing one read of its rows

// One warp per token: softmax over the E logits, the K largest (ties: the
// lower index), their probabilities (renormalised to sum 1 when norm,
// dividing by at least 6.1e-5 as the CPU does), sorted by expert id. With
// top_k_first (gpt-oss) the K largest logits, then a softmax over those K.
__global__ void moe_route_kernel(const float* logits, int T, int E, int K, bool norm, bool top_k_first, int* sel,
                                 float* w) {
  grid_dependency_sync();
  const int t = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (t >= T) return;  // (whole warps)
  const float* p = logits + static_cast<size_t>(t) * E;
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, p[e]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.f;
  for (int e = lane; e < E; e += 32) sum += expf(p[e] - mx);
  sum = warp_sum(sum);
  int chosen[kMoeMaxUsed];
  float prob[kMoeMaxUsed];
  float wsum = 0.f;
  for (int k = 0; k < K; k++) {
    float best = -INFINITY;
    int best_e = E;
    for (int e = lane; e < E; e += 32) {
      bool taken = false;
      for (int j = 0; j < k; j++) taken = taken || chosen[j] == e;
      if (!taken && (p[e] > best || best_e == E)) {
        best = p[e];
        best_e = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (oe < E && (best_e == E || ob > best || (ob == best && oe < best_e))) {
        best = ob;
        best_e = oe;
      }
    }
    chosen[k] = best_e;
    prob[k] = top_k_first ? best : expf(best - mx) / sum;
    wsum += prob[k];
  }
  if (lane != 0) return;
  if (top_k_first) {  // (as the CPU: the first chosen is the largest)
    const float top = prob[0];
    float s = 0.f;
    for (int k = 0; k < K; k++) s += (prob[k] = expf(prob[k] - top));
    for (int k = 0; k < K; k++) prob[k] /= s;
    wsum = 1.f;  // (they sum to 1: a renormalisation changes nothing)
  }
  const float inv = norm ? 1.f / fmaxf(wsum, 6.1e-5f) : 1.f;
  for (int k = 0; k < K; k++) prob[k] *= inv;
  for (int k = 1; k < K; k++)  // ascending expert order (insertion sort: K is small)
    for (int i = k; i > 0 && chosen[i] < chosen[i - 1]; i--) {
      const int ce = chosen[i];
      chosen[i] = chosen[i - 1];
      chosen[i - 1] = ce;
      const float cp = prob[i];
      prob[i] = prob[i - 1];
      prob[i - 1] = cp;
    }
  for (int k = 0; k < K; k++) {
    sel[static_cast<size_t>(t) * K + k] = chosen[k];
    w[static_cast<size_t>(t) * K + k] = prob[k];
  }
}

// One block: each expert's pairs counted, the offsets, the list of experts
// with pairs, then each expert's pairs in ascending order (thread per expert).
__global__ void moe_group_kernel(const int* sel, int n_pairs, int E, MoeGroups g) {
  grid_dependency_sync();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int c = 0;
    for (int p = 0; p < n_pairs; p++) c += sel[p] == e;
    g.counts[e] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int off = 0, n_active = 0;
    for (int e = 0; e < E; e++) {
      g.offsets[e] = off;
      off += g.counts[e];
      if (g.counts[e] > 0) g.active[n_active++] = e;
    }
    g.active[E] = n_active;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int o = g.offsets[e];
    for (int p = 0; p < n_pairs; p++)
      if (sel[p] == e) g.order[o++] = p;
  }
}

// Block (row block, a): the a-th expert with pairs (g.active); warp w its
// row r. For up to kP of the expert's pairs at a time: the pair's input row
// (pair / in_div: the token's for gate and up, the pair's own for down)
// against row r of the expert's matrix (or both matrices, gated). Variants
// as matvec.cu's: kQ8 (the integer path only), kType (the format known at
// compile time, or -1), kP 1 for a decoded token (one pair per expert).
template <bool kGated, bool kQ8, int kType, int kP>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    moe_matvec_kernel(ExpertMats a, ExpertMats b, int n_in, const float* x, const int8_t* xq, const float* xd,
                      int in_div, MoeGroups g, int E, GateAct act, float* out) {
  grid_dependency_sync();
  const int slot = blockIdx.y;
  if (slot >= g.active[E]) return;
  const int e = g.active[slot];
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.n_out) return;
  const TensorType ta = kType >= 0 ? static_cast<TensorType>(kType) : a.type;
  const TensorType tb = kType >= 0 ? static_cast<TensorType>(kType) : b.type;
  const uint8_t* wa = a.w + (static_cast<size_t>(e) * a.n_out + row) * a.row_bytes;
  const uint8_t* wb = kGated ? b.w + (static_cast<size_t>(e) * b.n_out + row) * b.row_bytes : nullptr;
  const int n = g.counts[e], off = g.offsets[e];
  for (int p0 = 0; p0 < n; p0 += kP) {
    const int m = n - p0 < kP ? n - p0 : kP;
    int pair[kP], in_row[kP];
#pragma unroll
    for (int i = 0; i < kP; i++) {
      pair[i] = i < m ? g.order[off + p0 + i] : 0;
      in_row[i] = pair[i] / in_div;
    }
    const auto row_of = [&](int t) { return in_row[t]; };
    float acc_a[kP], acc_b[kP];
#pragma unroll
    for (int i = 0; i < kP; i++) acc_a[i] = acc_b[i] = 0.f;
    if constexpr (kQ8) {
      row_partials_q8(wa, ta, n_in, xq, xd, m, lane, acc_a, row_of);
      if (kGated) row_partials_q8(wb, tb, n_in, xq, xd, m, lane, acc_b, row_of);
    } else {
      row_dot_rows(wa, ta, n_in, x, xq, xd, m, lane, acc_a, row_of);
      if (kGated) row_dot_rows(wb, tb, n_in, x, xq, xd, m, lane, acc_b, row_of);
    }
    // (Each expert's biases, where the model has them, before the activation.)
    const float bias_a = a.bias ? a.bias[static_cast<size_t>(e) * a.n_out + row] : 0.f;
    const float bias_b = kGated && b.bias ? b.bias[static_cast<size_t>(e) * b.n_out + row] : 0.f;
    for (int i = 0; i < m; i++) {
      float v = warp_sum(acc_a[i]) + bias_a;
      if (kGated) v = gate_act(act, v, warp_sum(acc_b[i]) + bias_b);
      if (lane == 0) out[static_cast<size_t>(pair[i]) * a.n_out + row] = v;
    }
  }
}

// f(kQ8, kType, kP) as integral constants: the integer path alone where x
// is quantized and every matrix takes it, compiled for its format where
// the matrices share one; one pair at a time for a decoded token.
template <typename F>
cudaError_t with_moe_variant(bool all_q8, bool same_type, TensorType type, int T, F&& f) {
  auto by_pairs = [&](auto q8, auto kind) {
    return T == 1 ? f(q8, kind, std::integral_constant<int, 1>{}) : f(q8, kind, std::integral_constant<int, kPairsAtOnce>{});
  };
  using Yes = std::integral_constant<bool, true>;
  if (all_q8 && same_type) switch (type) {
      case TensorType::Q8_0: return by_pairs(Yes{}, std::integral_constant<int, static_cast<int>(TensorType::Q8_0)>{});
      case TensorType::Q4_0: return by_pairs(Yes{}, std::integral_constant<int, static_cast<int>(TensorType::Q4_0)>{});
      case TensorType::Q5_0: return by_pairs(Yes{}, std::integral_constant<int, static_cast<int>(TensorType::Q5_0)>{});
      case TensorType::Q4_K: return by_pairs(Yes{}, std::integral_constant<int, static_cast<int>(TensorType::Q4_K)>{});
      case TensorType::Q6_K: return by_pairs(Yes{}, std::integral_constant<int, static_cast<int>(TensorType::Q6_K)>{});
      case TensorType::MXFP4: return by_pairs(Yes{}, std::integral_constant<int, static_cast<int>(TensorType::MXFP4)>{});
      default: break;
    }
  if (all_q8) return by_pairs(Yes{}, std::integral_constant<int, -1>{});
  return by_pairs(std::integral_constant<bool, false>{}, std::integral_constant<int, -1>{});
}

// out[t, i] = sum over j of w[t, j] * y[t * K + j, i], in the order of j.
__global__ void moe_combine_kernel(const float* y, const float* w, int T, int K, int D, float* out) {
  grid_dependency_sync();
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<size_t>(T) * D) return;
  const size_t t = idx / D, i = idx % D;
  float s = 0.f;
  for (int j = 0; j < K; j++) s += w[t * K + j] * y[(t * K + j) * D + i];
  out[idx] = s;
}

}  // namespace

cudaError_t launch_moe_route(const float* logits, int T, int E, int K, bool norm, bool top_k_first, int* sel, float* w,
                             cudaStream_t s) {
  if (K < 1 || K > kMoeMaxUsed || K > E) return cudaErrorInvalidValue;
  PHASELAB_LAUNCH(moe_route_kernel, static_cast<unsigned>((T + 3) / 4), 128, 0, s)(logits, T, E, K, norm, top_k_first,
                                                                                  sel, w);
  return cudaGetLastError();
}

cudaError_t launch_moe_group(const int* sel, int T, int K, int E, MoeGroups g, cudaStream_t s) {
  PHASELAB_LAUNCH(moe_group_kernel, 1, 256, 0, s)(sel, T * K, E, g);
  return cudaGetLastError();
}

cudaError_t launch_moe_gated(ExpertMats gate, ExpertMats up, int n_in, const float* x, int T, int K, MoeGroups g, int E,
                             GateAct act, float* out, cudaStream_t s, Q8Act q8) {
  if (gate.n_out != up.n_out) return cudaErrorInvalidValue;
  cudaError_t e;
  const Q8Input xq = quantize_for(q8, q8_dot_supported(gate.type) || q8_dot_supported(up.type), x, T, n_in, s, &e);
  if (e != cudaSuccess) return e;
  const dim3 grid((gate.n_out + kRowsPerBlock - 1) / kRowsPerBlock, std::min(E, T * K));
  const bool all_q8 = xq.q && q8_dot_supported(gate.type) && q8_dot_supported(up.type);
  return with_moe_variant(all_q8, gate.type == up.type, gate.type, T, [&](auto q8v, auto kind, auto kp) {
    PHASELAB_LAUNCH((moe_matvec_kernel<true, decltype(q8v)::value, decltype(kind)::value, decltype(kp)::value>), grid,
                    32 * kRowsPerBlock, 0, s)(gate, up, n_in, x, xq.q, xq.d, K, g, E, act, out);
    return cudaGetLastError();
  });
}

cudaError_t launch_moe_down(ExpertMats down, int n_in, const float* h, int T, int K, MoeGroups g, int E, float* out,
                            cudaStream_t s, Q8Act q8) {
  cudaError_t e;
  const Q8Input hq = quantize_for(q8, q8_dot_supported(down.type), h, T * K, n_in, s, &e);
  if (e != cudaSuccess) return e;
  const dim3 grid((down.n_out + kRowsPerBlock - 1) / kRowsPerBlock, std::min(E, T * K));
  const bool all_q8 = hq.q && q8_dot_supported(down.type);
  return with_moe_variant(all_q8, true, down.type, T, [&](auto q8v, auto kind, auto kp) {
    PHASELAB_LAUNCH((moe_matvec_kernel<false, decltype(q8v)::value, decltype(kind)::value, decltype(kp)::value>), grid,
                    32 * kRowsPerBlock, 0, s)(down, down, n_in, h, hq.q, hq.d, 1, g, E, GateAct::silu, out);
    return cudaGetLastError();
  });
}

cudaError_t launch_moe_combine(const float* y, const float* w, int T, int K, int D, float* out, cudaStream_t s) {
  const size_t n = static_cast<size_t>(T) * D;
  PHASELAB_LAUNCH(moe_combine_kernel, static_cast<unsigned>((n + 255) / 256), 256, 0, s)(y, w, T, K, D, out);
  return cudaGetLastError();
}

}  // namespace phaselab::cuda
