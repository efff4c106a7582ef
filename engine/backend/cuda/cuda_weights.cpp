// The CUDA backend's device memory: the weights' upload, the work buffers' sizes
// and the allocations it keeps (freed with the backend).

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
  }
  return Status::ok();
}

uint64_t CudaDevice::work_bytes() const {
  const uint64_t B = max_batch_;
  const uint64_t max_in = std::max({c_.n_embd, c_.n_embd_q(), c_.n_ff});
  const uint64_t gemm = max_batch_ >= gemm_min_tokens_ ? 2 * (std::max<uint64_t>(kW16Elems, max_in * 64) + B * max_in) : 0;
  return 4 * B * (3ull * c_.n_embd + c_.n_embd_q() + 2ull * c_.n_embd_kv() + 2ull * c_.n_ff + c_.n_vocab) + gemm;
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
