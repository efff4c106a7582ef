#include <cmath>

#include "common.cuh"
#include "kernels.h"
#include "rope_head.cuh"

namespace phaselab::cuda {

namespace {
// One block per (token, head) over the q heads then the k heads.
__global__ void qk_norm_rope_store_kernel(float* q, float* k, const float* v, QkRope p) {
  grid_dependency_sync();
  PHASELAB_DYNAMIC_SHARED(float, head);  // head_dim floats
  __shared__ float shared[32];
  const int per_token = p.n_head + p.n_head_kv;
  qk_norm_rope_store_head(q, k, v, p, blockIdx.x / per_token, blockIdx.x % per_token, head, shared);
}
}  // namespace

cudaError_t launch_qk_norm_rope_store(float* q, float* k, const float* v, const float* q_norm, const float* k_norm,
                                      KvPages cache, RowMap rows, int T, int n_head, int n_head_kv, int head_dim,
                                      int n_rot, float base, const float* freq_factors, float mscale, bool neox,
                                      float eps, cudaStream_t s, const double* inv_freq) {
  QkRope p;
  p.q_norm = q_norm;
  p.k_norm = k_norm;
  p.cache = cache;
  p.rows = rows;
  p.n_head = n_head;
  p.n_head_kv = n_head_kv;
  p.head_dim = head_dim;
  p.n_rot = n_rot;
  p.base = base;
  p.freq_factors = freq_factors;
  p.mscale = mscale;
  p.neox = neox;
  p.eps = eps;
  p.inv_freq = inv_freq;
  if (!qk_rope_args_ok(p)) return cudaErrorInvalidValue;
  PHASELAB_LAUNCH(qk_norm_rope_store_kernel, T * (n_head + n_head_kv), kQkRopeThreads, head_dim * sizeof(float), s)(
      q, k, v, p);
  return cudaGetLastError();
}

void rope_inv_freq(double base, int n_rot, const float* freq_factors, double* out) {
  for (int i = 0; i < n_rot / 2; i++) {
    out[i] = std::pow(base, -2.0 * i / n_rot);
    if (freq_factors) out[i] /= freq_factors[i];
  }
}

}  // namespace phaselab::cuda
