// The CUDA backend's forward pass: every kernel of a pass over the rows
// plan() uploaded, in the order of the CPU reference.

#include "cuda_backend_impl.h"

namespace phaselab {

// out (T, n_out) = x (T, n_in) . W^T: cuBLAS where the pass says so
// (Pass::gemm), else the matrix-vector kernel.
Status CudaDevice::matvec(const DevWeight& w, const float* x, int T, float* out, bool gemm, bool x_q8,
                          const cuda::AddNormTail* tail, const cuda::Q8Act* q8_in) {
  if (gemm) {
    if (w.bf16)
      CUDA_TRY(cuda::launch_gemm_bf16_resident(cublas_, w.bf16, w.n_in, w.n_out, x, T, out, x16_, stream_));
    else
      CUDA_TRY(cuda::launch_gemm_bf16(cublas_, w.data, w.type, w.row_bytes, w.n_in, w.n_out, x, T, out, w16_,
                                     w16_elems_, x16_, stream_));
    if (tail)
      CUDA_TRY(cuda::launch_add_rmsnorm(tail->x, out, tail->post_w, tail->w, tail->out, T, w.n_out, tail->eps, stream_,
                                        tail->q8_out));
    return Status::ok();
  }
  cuda::Q8Act q8 = q8_in ? *q8_in : q8_;
  q8.ready = x_q8;
  CUDA_TRY(cuda::launch_matvec(w.data, w.type, w.row_bytes, w.n_in, w.n_out, x, T, out, stream_, q8, tail));
  return Status::ok();
}

// A mixture-of-experts FFN for the pass's T rows (xb_: their normed input)
// into xb2_: the router's logits, its choice per row, the pairs grouped by
// expert, the chosen experts' gated products and down products (each
// expert's rows read once for up to 8 of its pairs), each row's weighted
// sum. Sizes stay on the device: a captured graph serves any choice.
Status CudaDevice::moe_block(const DevLayer& L, int T, bool gemm, cuda::Q8Act xb_q8) {
  const int D = c_.n_embd, E = c_.n_expert, K = c_.n_expert_used, F = c_.n_ff_exp;
  PHASELAB_TRY(matvec(L.router, xb_, T, router_, gemm));  // (T, E)
  if (L.router_b) CUDA_TRY(cuda::launch_add_bias(router_, L.router_b, T, E, stream_));
  CUDA_TRY(cuda::launch_moe_route(router_, T, E, K, c_.expert_weights_norm != 0, c_.expert_top_k_first != 0, moe_sel_,
                                  moe_w_, stream_));
  CUDA_TRY(cuda::launch_moe_group(moe_sel_, T, K, E, moe_groups_, stream_));
  CUDA_TRY(cuda::launch_moe_gated(experts(L.gate_exps, F, L.gate_exps_b), experts(L.up_exps, F, L.up_exps_b), D, xb_,
                                  T, K, moe_groups_, E, static_cast<cuda::GateAct>(c_.expert_act), moe_h_, stream_,
                                  xb_q8));
  CUDA_TRY(cuda::launch_moe_down(experts(L.down_exps, D, L.down_exps_b), F, moe_h_, T, K, moe_groups_, E, moe_y_,
                                 stream_, q8_));
  CUDA_TRY(cuda::launch_moe_combine(moe_y_, moe_w_, T, K, D, xb2_, stream_));
  return Status::ok();
}

// Attention of layer il for the pass's rows: one launch of the per-query
// kernel for rows [0, n_small), the tiled kernel for each prefill part.
Status CudaDevice::attention(int il, const Pass& ps, cuda::Q8Act q8_out) {
  const int NQ = c_.n_embd_q(), HD = c_.head_dim, window = layer_window_[il];
  if (ps.n_small > 0)
    CUDA_TRY(cuda::launch_attention(q_, pages(il), row_map(), xb_, scratch_, ps.n_small, c_.n_head, c_.n_head_kv, HD,
                                    window, c_.attn_scale, c_.attn_logit_softcap,
                                    cuda::attention_splits(ps.n_small, c_.n_head, ps.split_ctx), stream_, q8_out,
                                    fused_tails_ & kTailAttnMerge ? attn_counters_ : nullptr,
                                    layers_[il].attn_sinks));
  for (const TiledChunk& t : tiled_) {
    const size_t off = static_cast<size_t>(t.row) * NQ;
    CUDA_TRY(cuda::launch_attention_tiled(
        q_ + off, pages(il), row_map(t.row), xb_ + off, scratch_, t.n, c_.n_head, c_.n_head_kv, HD, window,
        c_.attn_scale, c_.attn_logit_softcap,
        cuda::attention_tiled_splits(t.n, c_.n_head, c_.n_head_kv, t.n_keys, sm_count_), stream_,
        layers_[il].attn_sinks));
  }
  return Status::ok();
}

// Layer il's QK-norm, RoPE and K/V store arguments for the pass's rows.
cuda::QkRope CudaDevice::qk_rope(int il) const {
  const DevLayer& L = layers_[il];
  cuda::QkRope r;
  r.q_norm = c_.qk_norm ? L.q_norm : nullptr;
  r.k_norm = c_.qk_norm ? L.k_norm : nullptr;
  r.cache = pages(il);
  r.rows = row_map();
  r.n_head = c_.n_head;
  r.n_head_kv = c_.n_head_kv;
  r.head_dim = c_.head_dim;
  r.n_rot = c_.n_rot;
  r.base = layer_rope_base_[il];
  r.freq_factors = rope_ff_;
  r.mscale = L.rope_mscale;
  r.neox = c_.rope_neox;
  r.eps = c_.rms_eps;
  r.inv_freq = L.rope_inv_freq;
  r.head_counters = head_counters_;
  return r;
}

// Every kernel of a forward pass over the rows plan() uploaded, with no
// host synchronisation (so it can be captured).
Status CudaDevice::enqueue(const Pass& ps) {
  const int T = ps.T, D = c_.n_embd, NQ = c_.n_embd_q(), NKV = c_.n_embd_kv(), HD = c_.head_dim;
  PHASELAB_TRY(prof_.begin(stream_));
  CUDA_TRY(cuda::launch_embedding(tok_embd_.data, tok_embd_.type, tok_embd_.row_bytes, meta_, T, D, c_.embd_scale, x_,
                                  stream_));
  // xb = the first layer's attention input; later layers get theirs from
  // the previous layer's closing add_rmsnorm. In a pass of matrix-vector
  // products (not cuBLAS) the norms also write xb in 8 bits for the
  // integer path of the products that read it next (norm_q8 to the norm,
  // xb_q8 to those products).
  const bool fuse_q8 = q8_.q && !ps.gemm && D % 32 == 0 && static_cast<size_t>(T) * D <= q8_.cap;
  const cuda::Q8Act norm_q8 = fuse_q8 ? q8_ : cuda::Q8Act{};
  cuda::Q8Act xb_q8 = q8_;
  xb_q8.ready = fuse_q8;
  CUDA_TRY(cuda::launch_rmsnorm(x_, layers_[0].attn_norm, xb_, T, D, c_.rms_eps, stream_, norm_q8));
  PHASELAB_TRY(prof_.mark("embedding + first norm", stream_));
  const bool gelu = c_.gelu != 0;
  // A pass of matrix-vector products may run the norms after the output
  // projection and the FFN down in those products' last blocks
  // (kTailNorms; one row only: launch_matvec launches them apart otherwise).
  const bool fuse_tails = (fused_tails_ & kTailNorms) && !ps.gemm;
  auto norm_tail = [&](const float* post_w, const float* w, cuda::Q8Act q8_out) {
    return cuda::AddNormTail{x_, c_.post_norms ? post_w : nullptr, w, xb_, c_.rms_eps, q8_out, tail_counter_};
  };
  for (int il = 0; il < c_.n_layer; il++) {
    const DevLayer& L = layers_[il];
    // QK-norm, RoPE and the K/V cache writes: the Q/K/V product's tails
    // where tails are fused (and no biases come between), else one kernel.
    const cuda::QkRope rope = qk_rope(il);
    const bool rope_in_product = (fused_tails_ & kTailRope) && !ps.gemm && !c_.attn_bias;
    if (ps.gemm) {
      PHASELAB_TRY(matvec(L.wq, xb_, T, q_, true));
      PHASELAB_TRY(matvec(L.wk, xb_, T, k_, true));
      PHASELAB_TRY(matvec(L.wv, xb_, T, v_, true));
    } else {  // Q, K and V in one launch
      auto part = [](const DevWeight& w, float* out) {
        return cuda::MatvecOut{w.data, w.type, w.row_bytes, w.n_out, out};
      };
      CUDA_TRY(cuda::launch_matvec3(part(L.wq, q_), part(L.wk, k_), part(L.wv, v_), D, xb_, T, stream_, xb_q8,
                                    rope_in_product ? &rope : nullptr));
    }
    PHASELAB_TRY(prof_.mark(rope_in_product ? "Q, K, V products + QK-norm, RoPE, K/V store" : "Q, K, V products",
                            stream_));
    if (c_.attn_bias) {
      CUDA_TRY(cuda::launch_add_bias(q_, L.bq, T, NQ, stream_));
      CUDA_TRY(cuda::launch_add_bias(k_, L.bk, T, NKV, stream_));
      CUDA_TRY(cuda::launch_add_bias(v_, L.bv, T, NKV, stream_));
      PHASELAB_TRY(prof_.mark("Q, K, V biases", stream_));
    }
    if (!rope_in_product) {
      CUDA_TRY(cuda::launch_qk_norm_rope_store(q_, k_, v_, rope.q_norm, rope.k_norm, rope.cache, rope.rows, T,
                                               c_.n_head, c_.n_head_kv, HD, c_.n_rot, rope.base, rope.freq_factors,
                                               rope.mscale, rope.neox, rope.eps, stream_, rope.inv_freq));
      PHASELAB_TRY(prof_.mark("QK-norm + RoPE + K/V store", stream_));
    }
    // In a pass of matrix-vector products with no tiled (prefill) part the
    // attention kernels write their output in 8 bits too, for wo.
    const bool attn_q8 = fuse_q8 && tiled_.empty() && HD % 32 == 0;
    PHASELAB_TRY(attention(il, ps, attn_q8 ? q8_ : cuda::Q8Act{}));
    PHASELAB_TRY(prof_.mark("attention", stream_));
    // Then the post-attention norm, residual add and the feed-forward's norm
    // in one pass: the projection's tail, or a launch of its own.
    const cuda::AddNormTail attn_tail = norm_tail(L.post_attn_norm, L.ffn_norm, norm_q8);
    if (fuse_tails && !L.bo) {
      PHASELAB_TRY(matvec(L.wo, xb_, T, xb2_, false, attn_q8, &attn_tail));
      PHASELAB_TRY(prof_.mark("output projection + norms", stream_));
    } else {
      PHASELAB_TRY(matvec(L.wo, xb_, T, xb2_, ps.gemm, attn_q8));
      if (L.bo) CUDA_TRY(cuda::launch_add_bias(xb2_, L.bo, T, D, stream_));
      PHASELAB_TRY(prof_.mark("output projection", stream_));
      CUDA_TRY(cuda::launch_add_rmsnorm(x_, xb2_, attn_tail.post_w, L.ffn_norm, xb_, T, D, c_.rms_eps, stream_,
                                        norm_q8));
      PHASELAB_TRY(prof_.mark("norms + residual adds", stream_));
    }
    if (L.moe()) {
      PHASELAB_TRY(moe_block(L, T, ps.gemm, xb_q8));
      PHASELAB_TRY(prof_.mark("experts (router, gate + up, down, sum)", stream_));
    } else if (ps.gemm) {
      PHASELAB_TRY(matvec(L.w_gate, xb_, T, hb_, true));
      PHASELAB_TRY(matvec(L.w_up, xb_, T, hb2_, true));
      CUDA_TRY(cuda::launch_gated_act(hb_, hb2_, static_cast<size_t>(T) * c_.n_ff, gelu, stream_));
      PHASELAB_TRY(prof_.mark("FFN gate + up + activation", stream_));
    }
    // Post-FFN norm, residual add and the next layer's attention norm (the
    // output norm after the last layer) in one pass. (After the last layer
    // xb's rows go to the logits, gathered or not: that product quantizes
    // its own input.)
    const float* next_norm = il + 1 < c_.n_layer ? layers_[il + 1].attn_norm : output_norm_;
    const cuda::AddNormTail ffn_tail =
        norm_tail(L.post_ffw_norm, next_norm, il + 1 < c_.n_layer ? norm_q8 : cuda::Q8Act{});
    if (!L.moe() && !ps.gemm) {  // both products and the activation in one kernel, then down
      // The activation in 8 bits (q8_ffn_) for the down product, written by
      // the gated kernel (kTailFfnQ8).
      const bool ffn_q8 = (fused_tails_ & kTailFfnQ8) && q8_ffn_.q && cuda::q8_dot_supported(L.w_down.type) &&
                          static_cast<size_t>(T) * c_.n_ff <= q8_ffn_.cap;
      CUDA_TRY(cuda::launch_matvec_gated(L.w_gate.data, L.w_gate.type, L.w_gate.row_bytes, L.w_up.data, L.w_up.type,
                                         L.w_up.row_bytes, L.w_gate.n_in, L.w_gate.n_out, xb_, T, gelu, hb_, stream_,
                                         xb_q8, ffn_q8 ? q8_ffn_ : cuda::Q8Act{}, ffn_group_counters_));
      PHASELAB_TRY(prof_.mark("FFN gate + up + activation", stream_));
      if (fuse_tails) {
        PHASELAB_TRY(matvec(L.w_down, hb_, T, xb2_, false, ffn_q8, &ffn_tail, ffn_q8 ? &q8_ffn_ : nullptr));
        PHASELAB_TRY(prof_.mark("FFN down + norms", stream_));
        continue;
      }
      PHASELAB_TRY(matvec(L.w_down, hb_, T, xb2_, false, ffn_q8, nullptr, ffn_q8 ? &q8_ffn_ : nullptr));
      PHASELAB_TRY(prof_.mark("FFN down", stream_));
    } else if (!L.moe()) {
      PHASELAB_TRY(matvec(L.w_down, hb_, T, xb2_, true));
      PHASELAB_TRY(prof_.mark("FFN down", stream_));
    }
    CUDA_TRY(cuda::launch_add_rmsnorm(x_, xb2_, ffn_tail.post_w, next_norm, xb_, T, D, c_.rms_eps, stream_,
                                      ffn_tail.q8_out));
    PHASELAB_TRY(prof_.mark("norms + residual adds", stream_));
  }
  if (ps.n_logits > 0) {
    // The rows that want logits, gathered where they are not one run of rows.
    const float* rows = xb_ + static_cast<size_t>(std::max(ps.logits_first, 0)) * D;
    if (ps.logits_first < 0) {
      CUDA_TRY(cuda::launch_gather_rows(xb_, meta_ + 3 * max_batch_, ps.n_logits, D, xb2_, stream_));
      rows = xb2_;
    }
    PHASELAB_TRY(matvec(output_, rows, ps.n_logits, logits_, ps.gemm && ps.n_logits >= gemm_min_tokens_));
    if (c_.final_logit_softcap > 0)
      CUDA_TRY(cuda::launch_softcap(logits_, static_cast<size_t>(ps.n_logits) * c_.n_vocab, c_.final_logit_softcap,
                                    stream_));
    PHASELAB_TRY(prof_.mark("logits", stream_));
  }
  return Status::ok();
}

}  // namespace phaselab
