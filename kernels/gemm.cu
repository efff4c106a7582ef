#include "common.cuh"
#include "kernels.h"

namespace phaselab::cuda {

namespace {

// One thread per 32-value sub-block of a block format: dequantized, then
// stored as BF16.
__global__ void dequant_bf16_kernel(const uint8_t* w, TensorType type, size_t row_bytes, int n_in, int rows,
                                    __nv_bfloat16* out) {
  grid_dependency_sync();
  const int per_row = n_in / 32;
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<size_t>(rows) * per_row) return;
  const int r = static_cast<int>(i / per_row), sb = static_cast<int>(i % per_row);
  float v[32];
  dequant_sub32(type, w + static_cast<size_t>(r) * row_bytes, sb, v);
  __nv_bfloat16* o = out + static_cast<size_t>(r) * n_in + 32 * sb;
#pragma unroll
  for (int k = 0; k < 32; k++) o[k] = __float2bfloat16_rn(v[k]);
}

// One thread per value of a float row (F32/F16/BF16: any n_in).
__global__ void float_rows_bf16_kernel(const uint8_t* w, TensorType type, size_t row_bytes, int n_in, int rows,
                                       __nv_bfloat16* out) {
  grid_dependency_sync();
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<size_t>(rows) * n_in) return;
  const int r = static_cast<int>(i / n_in), c = static_cast<int>(i % n_in);
  out[i] = __float2bfloat16_rn(load_float_weight(type, w + static_cast<size_t>(r) * row_bytes, c));
}

__global__ void to_bf16_kernel(const float* x, size_t n, __nv_bfloat16* out) {
  grid_dependency_sync();
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(x[i]);
}

bool is_float_type(TensorType t) { return t == TensorType::F32 || t == TensorType::F16 || t == TensorType::BF16; }

cudaError_t from_cublas(cublasStatus_t st) {
  return st == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

}  // namespace

cudaError_t launch_dequant_bf16(const uint8_t* w, TensorType type, size_t row_bytes, int n_in, int rows,
                                __nv_bfloat16* out, cudaStream_t s) {
  if (is_float_type(type)) {
    const size_t n = static_cast<size_t>(rows) * n_in;
    PHASELAB_LAUNCH(float_rows_bf16_kernel, static_cast<unsigned>((n + 255) / 256), 256, 0, s)(w, type, row_bytes, n_in, rows, out);
    return cudaGetLastError();
  }
  if (n_in % 32 != 0) return cudaErrorInvalidValue;
  const size_t n = static_cast<size_t>(rows) * (n_in / 32);
  PHASELAB_LAUNCH(dequant_bf16_kernel, static_cast<unsigned>((n + 127) / 128), 128, 0, s)(w, type, row_bytes, n_in, rows, out);
  return cudaGetLastError();
}

cudaError_t launch_to_bf16(const float* x, size_t n, __nv_bfloat16* out, cudaStream_t s) {
  PHASELAB_LAUNCH(to_bf16_kernel, static_cast<unsigned>((n + 255) / 256), 256, 0, s)(x, n, out);
  return cudaGetLastError();
}

// Column-major view for cuBLAS: W (n_out rows of n_in) is the n_in x n_out
// matrix A, x (T rows of n_in) the n_in x T matrix B, out (T rows of n_out)
// the n_out x T matrix C; C = A^T B, one slab of rows of W at a time.
cudaError_t launch_gemm_bf16(cublasHandle_t handle, const uint8_t* w, TensorType type, size_t row_bytes, int n_in,
                             int n_out, const float* x, int T, float* out, __nv_bfloat16* w16, size_t w16_elems,
                             __nv_bfloat16* x16, cudaStream_t s) {
  const int slab = static_cast<int>(std::min<size_t>(w16_elems / static_cast<size_t>(n_in), static_cast<size_t>(n_out)));
  if (slab < 1) return cudaErrorInvalidValue;
  if (cudaError_t e = launch_to_bf16(x, static_cast<size_t>(T) * n_in, x16, s); e != cudaSuccess) return e;
  const float alpha = 1.f, beta = 0.f;
  for (int r0 = 0; r0 < n_out; r0 += slab) {
    const int rows = std::min(slab, n_out - r0);
    if (cudaError_t e = launch_dequant_bf16(w + static_cast<size_t>(r0) * row_bytes, type, row_bytes, n_in, rows, w16, s);
        e != cudaSuccess)
      return e;
    const cublasStatus_t st =
        cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, T, n_in, &alpha, w16, CUDA_R_16BF, n_in, x16, CUDA_R_16BF,
                     n_in, &beta, out + r0, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return from_cublas(st);
  }
  return cudaSuccess;
}

cudaError_t launch_gemm_bf16_resident(cublasHandle_t handle, const __nv_bfloat16* w16, int n_in, int n_out,
                                      const float* x, int T, float* out, __nv_bfloat16* x16, cudaStream_t s) {
  if (cudaError_t e = launch_to_bf16(x, static_cast<size_t>(T) * n_in, x16, s); e != cudaSuccess) return e;
  const float alpha = 1.f, beta = 0.f;
  return from_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &alpha, w16, CUDA_R_16BF, n_in, x16,
                                  CUDA_R_16BF, n_in, &beta, out, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
}

}  // namespace phaselab::cuda
