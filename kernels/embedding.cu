#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {
__global__ void embedding_kernel(const uint8_t* embd, TensorType type, size_t row_bytes, const int32_t* tokens,
                                 int n_embd, float scale, float* x) {
  grid_dependency_sync();
  const int t = blockIdx.x;
  const uint8_t* row = embd + static_cast<size_t>(tokens[t]) * row_bytes;
  float v[32];
  for (int sb = threadIdx.x; sb < n_embd / 32; sb += blockDim.x) {
    dequant_sub32(type, row, sb, v);
    for (int i = 0; i < 32; i++) x[static_cast<size_t>(t) * n_embd + sb * 32 + i] = v[i] * scale;
  }
  for (int i = n_embd / 32 * 32 + threadIdx.x; i < n_embd; i += blockDim.x)  // float rows' last n_embd % 32
    x[static_cast<size_t>(t) * n_embd + i] = load_float_weight(type, row, i) * scale;
}

// One block per output row.
__global__ void gather_rows_kernel(const float* x, const int* rows, int n, float* out) {
  grid_dependency_sync();
  const float* src = x + static_cast<size_t>(rows[blockIdx.x]) * n;
  float* dst = out + static_cast<size_t>(blockIdx.x) * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}
}  // namespace

cudaError_t launch_gather_rows(const float* x, const int* rows, int n_rows, int n, float* out, cudaStream_t s) {
  if (n_rows < 1) return cudaSuccess;
  PHASELAB_LAUNCH(gather_rows_kernel, n_rows, 128, 0, s)(x, rows, n, out);
  return cudaGetLastError();
}

cudaError_t launch_embedding(const uint8_t* embd, TensorType type, size_t row_bytes, const int32_t* tokens, int T,
                             int n_embd, float scale, float* x, cudaStream_t s) {
  PHASELAB_LAUNCH(embedding_kernel, T, 64, 0, s)(embd, type, row_bytes, tokens, n_embd, scale, x);
  return cudaGetLastError();
}

}  // namespace phaselab::cuda
