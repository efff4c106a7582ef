// The CUDA backend's device memory: the weights' upload, the work buffers' sizes
// and the allocations it keeps (freed with the backend).

#include <cstdio>

#include "cuda_backend_impl.h"

namespace phaselab {

// The weights, still quantized, and the small vectors as F32: uploaded once
// (from the engine's views of them, PhlCudaModel).
Status CudaDevice::upload_weights() {
  const PhlCudaModel& w = *model_;
  PHASELAB_TRY(upload(w.tok_embd, &tok_embd_));
  output_ = tok_embd_;
  if (!w.tied_output) PHASELAB_TRY(upload(w.output, &output_));
  PHASELAB_TRY(upload_vec(w.output_norm, &output_norm_));
  PHASELAB_TRY(upload_vec(w.rope_freq_factors, &rope_ff_));
  layers_.resize(c_.n_layer);
  layer_window_.resize(c_.n_layer);
  layer_rope_base_.resize(c_.n_layer);
  for (int il = 0; il < c_.n_layer; il++) {
    const PhlCudaLayer& L = w.layers[il];
    DevLayer& d = layers_[il];
    layer_window_[il] = L.window;
    layer_rope_base_[il] = L.rope_base;
    {  // RoPE's angles per position, in double, once (not a pow per pair per pass)
      const size_t n = std::max(1, c_.n_rot / 2);
      CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&d.rope_inv_freq), n * sizeof(double)));
      allocations_.push_back(d.rope_inv_freq);
      CUDA_TRY(cudaMemcpy(d.rope_inv_freq, L.rope_inv_freq, n * sizeof(double), cudaMemcpyHostToDevice));
      d.rope_mscale = L.rope_mscale;
    }
    PHASELAB_TRY(upload_vec(L.bo, &d.bo));
    PHASELAB_TRY(upload_vec(L.attn_sinks, &d.attn_sinks));
    PHASELAB_TRY(upload_vec(L.router_b, &d.router_b));
    PHASELAB_TRY(upload_vec(L.gate_exps_b, &d.gate_exps_b));
    PHASELAB_TRY(upload_vec(L.up_exps_b, &d.up_exps_b));
    PHASELAB_TRY(upload_vec(L.down_exps_b, &d.down_exps_b));
    PHASELAB_TRY(upload_vec(L.attn_norm, &d.attn_norm));
    PHASELAB_TRY(upload_vec(L.bq, &d.bq));
    PHASELAB_TRY(upload_vec(L.bk, &d.bk));
    PHASELAB_TRY(upload_vec(L.bv, &d.bv));
    PHASELAB_TRY(upload_vec(L.q_norm, &d.q_norm));
    PHASELAB_TRY(upload_vec(L.k_norm, &d.k_norm));
    PHASELAB_TRY(upload_vec(L.post_attn_norm, &d.post_attn_norm));
    PHASELAB_TRY(upload_vec(L.ffn_norm, &d.ffn_norm));
    PHASELAB_TRY(upload_vec(L.post_ffw_norm, &d.post_ffw_norm));
    PHASELAB_TRY(upload(L.wq, &d.wq));
    PHASELAB_TRY(upload(L.wk, &d.wk));
    PHASELAB_TRY(upload(L.wv, &d.wv));
    PHASELAB_TRY(upload(L.wo, &d.wo));
    PHASELAB_TRY(upload(L.w_gate, &d.w_gate));
    PHASELAB_TRY(upload(L.w_up, &d.w_up));
    PHASELAB_TRY(upload(L.w_down, &d.w_down));
    if (L.router.data) {
      PHASELAB_TRY(upload(L.router, &d.router));
      PHASELAB_TRY(upload(L.gate_exps, &d.gate_exps));
      PHASELAB_TRY(upload(L.up_exps, &d.up_exps));
      PHASELAB_TRY(upload(L.down_exps, &d.down_exps));
    }
  }
  return Status::ok();
}

// BF16 copies of every layer matrix, made once on the device from the
// quantized upload, so that a prefill GEMM reads them as they are rather
// than dequantizing slabs per pass (per chunk of 64 tokens: most of a
// prefill's time on a small model). Only where the GPU has room: at most
// half of what is free now, leaving at least 1 GiB for the K/V pools.
Status CudaDevice::make_bf16_weights() {
  // The uploads (cudaMemcpy from pageable memory, the legacy stream) may
  // still be landing: stream_ does not wait for them by itself.
  CUDA_TRY(cudaDeviceSynchronize());
  uint64_t need = 0;
  auto each = [&](auto&& f) {
    for (DevLayer& L : layers_)
      for (DevWeight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
        if (w->data) f(*w);
  };
  each([&](DevWeight& w) { need += 2ull * w.n_in * w.n_out; });
  size_t free_b = 0, total_b = 0;
  CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  if (need == 0 || need > free_b / 2 || free_b - need < (1ull << 30)) return Status::ok();
  Status st = Status::ok();
  each([&](DevWeight& w) {
    if (!st.is_ok()) return;
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, 2ull * w.n_in * w.n_out); e != cudaSuccess) {
      st = cuda_status(e, "cudaMalloc (BF16 weights)", __FILE__, __LINE__);
      return;
    }
    allocations_.push_back(p);
    w.bf16 = static_cast<__nv_bfloat16*>(p);
    st = cuda_status(cuda::launch_dequant_bf16(w.data, w.type, w.row_bytes, w.n_in, w.n_out, w.bf16, stream_),
                     "launch_dequant_bf16", __FILE__, __LINE__);
  });
  if (st.is_ok()) bf16_bytes_ = need;
  return st;
}

// The BF16 copies given back (the K/V cache comes first: mirror_pool calls
// this when a pool does not fit beside them); prefill then dequantizes
// slabs per product again.
void CudaDevice::drop_bf16_weights() {
  if (bf16_bytes_ == 0) return;
  cudaStreamSynchronize(stream_);
  for (DevLayer& L : layers_)
    for (DevWeight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      if (w->bf16) {
        free_device(w->bf16);
        w->bf16 = nullptr;
      }
  std::fprintf(stderr, "phaselab: CUDA: the prefill's BF16 weight copies (%llu MiB) were given back for the K/V cache\n",
               static_cast<unsigned long long>(bf16_bytes_ >> 20));
  bf16_bytes_ = 0;
}

uint64_t CudaDevice::work_bytes() const {
  const uint64_t B = max_batch_;
  const uint64_t max_in = std::max({c_.n_embd, c_.n_embd_q(), c_.n_ff});
  const uint64_t gemm = max_batch_ >= gemm_min_tokens_ ? 2 * (std::max<uint64_t>(kW16Elems, max_in * 64) + B * max_in) : 0;
  const uint64_t E = c_.n_expert, K = c_.n_expert_used;
  const uint64_t moe = E > 0 ? 4 * B * (E + 2 * K + K * c_.n_ff_exp + K * c_.n_embd) + 4 * (B * K + 3 * E + 1) : 0;
  const uint64_t q8 = B * std::max<uint64_t>(max_in, K * c_.n_ff_exp) * 9 / 8;
  // The tails' 8-bit FFN activations and counters (CudaSwitches::fused_tails).
  const uint64_t tails =
      fused_tails_ != 0 ? B * c_.n_ff * 9 / 8 + 4 * (1 + c_.n_ff / 32 + c_.n_head + c_.n_head_kv + B * c_.n_head) : 0;
  return 4 * B * (3ull * c_.n_embd + c_.n_embd_q() + 2ull * c_.n_embd_kv() + 2ull * c_.n_ff + c_.n_vocab) + gemm + moe +
         q8 + tails + draw_bytes();
}

// Sampled draws on the device: a group's rules, results and candidates, and
// the kernels' work space.
size_t CudaDevice::draw_bytes() const {
  if (!use_draws_) return 0;
  const size_t R = static_cast<size_t>(std::min(max_batch_, kDrawRows));
  return R * (sizeof(cuda::DrawRule) + sizeof(cuda::DrawResult) + kDrawCap * sizeof(cuda::DrawCand)) +
         cuda::vocab_draw_work_bytes(static_cast<int>(R), c_.n_vocab);
}

Status CudaDevice::alloc(float** p, size_t n) {
  CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(p), std::max<size_t>(n, 1) * sizeof(float)));
  allocations_.push_back(*p);
  return Status::ok();
}

void CudaDevice::free_device(void* p) {
  if (!p) return;
  cudaFree(p);
  allocations_.erase(std::remove(allocations_.begin(), allocations_.end(), p), allocations_.end());
}

Status CudaDevice::upload(const PhlCudaWeight& w, DevWeight* d) {
  const size_t bytes = w.row_bytes * static_cast<size_t>(w.n_out);
  if (bytes == 0 || !w.data) {  // a matrix the layer does not have (a MoE layer's dense FFN)
    *d = DevWeight{};
    return Status::ok();
  }
  CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&d->data), bytes));
  allocations_.push_back(d->data);
  CUDA_TRY(cudaMemcpy(d->data, w.data, bytes, cudaMemcpyHostToDevice));
  d->type = static_cast<TensorType>(w.type);
  d->n_in = w.n_in;
  d->n_out = w.n_out;
  d->row_bytes = w.row_bytes;
  return Status::ok();
}

Status CudaDevice::upload_vec(const PhlCudaVector& v, float** d) {
  if (v.n == 0) {
    *d = nullptr;
    return Status::ok();
  }
  PHASELAB_TRY(alloc(d, static_cast<size_t>(v.n)));
  CUDA_TRY(cudaMemcpy(*d, v.data, static_cast<size_t>(v.n) * sizeof(float), cudaMemcpyHostToDevice));
  return Status::ok();
}

}  // namespace phaselab
