// Launch functions of PhaseLab's CUDA kernels. Plain functions on raw device
// pointers with shapes and a stream; they know nothing of models. Every
// matrix is [n_in, n_out] in the GGUF layout: n_out rows of n_in values,
// row_bytes apart, in the tensor's own block format.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "phaselab/tensor_type.h"

namespace phaselab::cuda {

// x[t, :] = dequant(embd row tokens[t]) * scale          x: (T, n_embd)
cudaError_t launch_embedding(const uint8_t* embd, TensorType type, size_t row_bytes, const int32_t* tokens, int T,
                             int n_embd, float scale, float* x, cudaStream_t s);

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w   x, out: (rows, n); w: (n); out may alias x
cudaError_t launch_rmsnorm(const float* x, const float* w, float* out, int rows, int n, float eps, cudaStream_t s);

// Rotary embedding in place. x: (T, n_heads, head_dim) with rows row_stride
// floats apart; position of token t is pos0 + t. freq_factors: (n_rot/2) or null.
cudaError_t launch_rope(float* x, int T, int n_heads, int head_dim, int row_stride, int n_rot, int pos0, float base,
                        const float* freq_factors, bool neox, cudaStream_t s);

// g = act(g) * u over n values (act: GELU-tanh or SiLU)
cudaError_t launch_gated_act(float* g, const float* u, size_t n, bool gelu, cudaStream_t s);
// x += y over n values
cudaError_t launch_add(float* x, const float* y, size_t n, cudaStream_t s);
// x[t, :] += b over T rows of n values
cudaError_t launch_add_bias(float* x, const float* b, int T, int n, cudaStream_t s);
// y = cap * tanh(y / cap) over n values
cudaError_t launch_softcap(float* y, size_t n, float cap, cudaStream_t s);

// out[t, r] = W.row(r) . x[t, :] for T tokens: one warp per row, the weight
// row read once for up to 8 tokens at a time.   x: (T, n_in); out: (T, n_out)
cudaError_t launch_matvec(const uint8_t* w, TensorType type, size_t row_bytes, int n_in, int n_out, const float* x,
                          int T, float* out, cudaStream_t s);

// Causal attention of T queries at positions pos0.. over a contiguous cache.
// q: (T, n_head, head_dim); k_cache, v_cache: (n_ctx, n_head_kv, head_dim) of
// this layer; out: (T, n_head, head_dim); scratch: (T, n_head, n_ctx).
// window > 0: keys at pos - k_pos >= window are masked.
cudaError_t launch_attention(const float* q, const float* k_cache, const float* v_cache, float* out, float* scratch,
                             int T, int pos0, int n_head, int n_head_kv, int head_dim, int n_ctx, int window,
                             float scale, float softcap, cudaStream_t s);

// Writes K and V of T tokens into the cache at positions pos0..
// k, v: (T, n_embd_kv); caches: (n_ctx, n_embd_kv)
cudaError_t launch_store_kv(const float* k, const float* v, float* k_cache, float* v_cache, int T, int pos0,
                            int n_embd_kv, cudaStream_t s);

}  // namespace phaselab::cuda
