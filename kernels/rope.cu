#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {
// One block per (token, head); thread i turns pair i. Angles in double, as
// the CPU reference computes them.
__global__ void rope_kernel(float* x, int n_heads, int head_dim, int row_stride, int n_rot, const int* pos0p,
                            float base, const float* freq_factors, bool neox) {
  const int pos0 = *pos0p;
  const int t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  float* xh = x + static_cast<size_t>(t) * row_stride + h * head_dim;
  const int half = n_rot / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double freq = pow(static_cast<double>(base), -2.0 * i / n_rot);
    if (freq_factors) freq /= freq_factors[i];
    const double theta = (pos0 + t) * freq;
    const float c = static_cast<float>(cos(theta)), sn = static_cast<float>(sin(theta));
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = xh[a], x1 = xh[b];
    xh[a] = x0 * c - x1 * sn;
    xh[b] = x0 * sn + x1 * c;
  }
}
}  // namespace

cudaError_t launch_rope(float* x, int T, int n_heads, int head_dim, int row_stride, int n_rot, const int* pos0,
                        float base, const float* freq_factors, bool neox, cudaStream_t s) {
  rope_kernel<<<T * n_heads, 128, 0, s>>>(x, n_heads, head_dim, row_stride, n_rot, pos0, base, freq_factors, neox);
  return cudaGetLastError();
}

}  // namespace phaselab::cuda
