// The CPU backend (cpu_backend.h): set-up, the forward pass step by step,
// and the factories. Matrix products are in cpu_matmul.cpp, attention in
// cpu_attention.cpp.
#include "cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

#include "phaselab/quant.h"
#include "phaselab/sampler.h"

namespace phaselab {

Status CpuBackend::init() {
  const int B = max_batch_;
  if (c_.n_head / c_.n_head_kv > kMaxGroup)
    return unsupported("more than " + std::to_string(kMaxGroup) + " query heads per KV head");
  try {
    x_.resize(static_cast<size_t>(B) * c_.n_embd);
    xb_.resize(static_cast<size_t>(B) * std::max(c_.n_embd, c_.n_embd_q()));
    xb2_.resize(static_cast<size_t>(B) * c_.n_embd);
    q_.resize(static_cast<size_t>(B) * c_.n_embd_q());
    k_.resize(static_cast<size_t>(B) * c_.n_embd_kv());
    v_.resize(static_cast<size_t>(B) * c_.n_embd_kv());
    hb_.resize(static_cast<size_t>(B) * c_.n_ff);
    hb2_.resize(static_cast<size_t>(B) * c_.n_ff);
    if (c_.is_moe()) {
      router_.resize(static_cast<size_t>(B) * c_.n_expert);
      moe_x_.resize(static_cast<size_t>(B) * c_.n_embd);
      // (A decoded token's k experts use k rows of these.)
      moe_h_.resize(static_cast<size_t>(std::max(B, c_.n_expert_used)) * c_.n_ff_exp);
      moe_h2_.resize(static_cast<size_t>(std::max(B, c_.n_expert_used)) * c_.n_ff_exp);
      moe_jobs_.resize(2 * c_.n_expert_used);
      moe_inputs_.resize(c_.n_expert_used);
      moe_y_.resize(static_cast<size_t>(B) * c_.n_embd);
      moe_slot_.resize(static_cast<size_t>(B) * c_.n_expert_used * c_.n_embd);
      moe_sel_.resize(static_cast<size_t>(B) * c_.n_expert_used);
      moe_w_.resize(static_cast<size_t>(B) * c_.n_expert_used);
      exp_rows_.assign(c_.n_expert, {});
      for (auto& r : exp_rows_) r.reserve(B);
    }
    const int64_t max_in = std::max<int64_t>({c_.n_embd, c_.n_ff, c_.n_ff_exp, c_.n_embd_q()});
    row_buf_.assign(pool_.size(), std::vector<float>(max_in));
    rope_cs_.resize(static_cast<size_t>(2) * B * c_.n_rot);
    tok_kv_.resize(B);
    tok_bytes_.resize(B);
    tok_pos_.resize(B);
    tok_id_.resize(B);
    tile_first_.resize(B);
    tile_len_.resize(B);
    score_buf_.assign(pool_.size(), std::vector<float>());
    vrow_buf_.assign(pool_.size(), std::vector<const float*>());
    hrow_buf_.assign(pool_.size(), std::vector<const uint16_t*>());
    qrow_buf_.assign(pool_.size(), std::vector<const uint8_t*>());
    part_buf_.assign(pool_.size(), std::vector<float>());
    kv_row_buf_.assign(pool_.size(), std::vector<float>(c_.head_dim));
    if (k_fast_) {
      act_.resize(static_cast<size_t>(B) * (max_in / 32));
      // Sized for any input, so that any product may be refined.
      act_lo_.resize(static_cast<size_t>(B) * (max_in / 32));
      if (c_.is_moe()) {
        many_act_.resize(static_cast<size_t>(c_.n_expert_used) * (max_in / 32));
        many_act_g_.resize(static_cast<size_t>(c_.n_expert_used) * (cpu::act_groups(max_in / 32) + 1));
      }
      resid_.resize(static_cast<size_t>(B) * max_in);
      if (k_fast_->dot_q4_k_r8_x1 && repack_) {
        act_g_.resize(static_cast<size_t>(B) * (max_in / 256 + 1));
        act_lo_g_.resize(static_cast<size_t>(B) * (max_in / 256 + 1));
        act2_.resize(static_cast<size_t>(2) * (max_in / 32));
        act2_g_.resize(static_cast<size_t>(2) * (max_in / 256 + 1));
        act_p_.resize(static_cast<size_t>(B / 2) * (max_in / 256 + 1));
        act_lo_p_.resize(static_cast<size_t>(B / 2) * (max_in / 256 + 1));
        repack_weights();
      }
    }
  } catch (const std::bad_alloc&) {
    return out_of_memory("not enough memory for the work buffers of a batch of " + std::to_string(B) + " tokens");
  }
  return Status::ok();
}

Status CpuBackend::forward_batch(const SeqChunk* chunks, int n_chunks) {
  int T = 0, n_ctx_max = 0, n_logit_rows = 0;
  PHASELAB_TRY(begin_batch(chunks, n_chunks, &T, &n_ctx_max, &n_logit_rows));
  PHASELAB_TRY(embed(T));
  rope_ready_ = 0;
  const size_t stream = static_cast<size_t>(T) * c_.n_embd;
  if (capture_) std::copy_n(x_.data(), stream, capture_);
  for (int il = 0; il < c_.n_layer; il++) {
    if (skip_ && skip_[il]) continue;
    attention_block(il, T, n_ctx_max);
    if (w_.layers[il].moe()) moe_block(il, T);
    else ffn_block(il, T);
    if (capture_) std::copy_n(x_.data(), stream, capture_ + (il + 1) * stream);
  }
  for (int i = 0; i < n_chunks; i++) chunks[i].kv->append(chunks[i].tokens, chunks[i].n_tokens);
  computed_ += static_cast<uint64_t>(T);
  if (n_logit_rows > 0) output_logits(chunks, n_chunks, n_logit_rows);
  return Status::ok();
}

Status CpuBackend::begin_batch(const SeqChunk* chunks, int n_chunks, int* T, int* n_ctx_max, int* n_logit_rows) {
  PHASELAB_TRY(check_batch(chunks, n_chunks, c_.n_vocab, max_batch_, false, T));
  for (int i = 0; i < n_chunks; i++) {
    const SeqChunk& ch = chunks[i];
    if (ch.kv->pool().storage() != KvStorage::host)
      return invalid_argument("this KV cache keeps its K/V on a GPU (it was made for the CUDA backend), not in host "
                              "memory: make the session or scheduler with the CPU backend to run it there");
    *n_ctx_max = std::max(*n_ctx_max, ch.kv->n_ctx());
    *n_logit_rows += ch.mode == LogitsMode::last ? 1 : ch.mode == LogitsMode::all ? ch.n_tokens : 0;
  }
  for (int i = 0; i < n_chunks; i++) PHASELAB_TRY(chunks[i].kv->reserve(chunks[i].n_tokens));  // copy on write
  for (int i = 0, t = 0; i < n_chunks; i++) {
    // The pool's K/V, with the reserves' copies on write (this pass's and
    // the engine loop's, which reserves while it plans) made before any
    // row is written.
    auto bytes = kv_store_.prepare(chunks[i].kv->pool());
    if (!bytes) return bytes.status();
    for (int j = 0; j < chunks[i].n_tokens; j++, t++) {
      tok_kv_[t] = chunks[i].kv;
      tok_bytes_[t] = *bytes;
      tok_pos_[t] = chunks[i].kv->n_past() + j;
      tok_id_[t] = chunks[i].tokens[j];
    }
  }
  const int n_ctx = *n_ctx_max;
  const size_t score_size = static_cast<size_t>(c_.n_head / c_.n_head_kv) * n_ctx;
  for (auto& s : score_buf_)
    if (s.size() < score_size) s.resize(score_size);
  for (auto& v : vrow_buf_)
    if (static_cast<int>(v.size()) < n_ctx) v.resize(n_ctx);
  for (auto& v : qrow_buf_)
    if (static_cast<int>(v.size()) < n_ctx) v.resize(n_ctx);
  for (auto& v : hrow_buf_)
    if (static_cast<int>(v.size()) < n_ctx) v.resize(n_ctx);
  if (k_fast_) {
    // Partial attention results of long rows' key parts: a tile of rows'
    // per thread, and up to pool-size rows' for the split decode.
    const size_t part = static_cast<size_t>(c_.n_head / c_.n_head_kv) * (c_.head_dim + 2);
    const size_t parts = static_cast<size_t>((n_ctx + kAttnPartKeys - 1) / kAttnPartKeys);
    for (auto& v : part_buf_)
      if (v.size() < kAttnTileTokens * parts * part) v.resize(kAttnTileTokens * parts * part);
    if (split_buf_.size() < static_cast<size_t>(pool_.size()) * parts * part)
      split_buf_.resize(static_cast<size_t>(pool_.size()) * parts * part);
  }
  return Status::ok();
}

Status CpuBackend::embed(int T) {
  const int D = c_.n_embd;
  // x: (T, n_embd) the residual stream
  for (int t = 0; t < T; t++) {
    if (embd_repacked_)
      cpu::dequantize_q8_0_u8_row(embd_repacked_ + static_cast<size_t>(tok_id_[t]) * embd_row_bytes_,
                                  &x_[static_cast<size_t>(t) * D], D);
    else
      PHASELAB_TRY(dequantize_row(w_.tok_embd.type, w_.tok_embd.row(tok_id_[t]), &x_[static_cast<size_t>(t) * D], D));
    if (c_.embd_scale != 1.f)
      for (int i = 0; i < D; i++) x_[static_cast<size_t>(t) * D + i] *= c_.embd_scale;
  }
  return Status::ok();
}

void CpuBackend::attention_block(int il, int T, int n_ctx_max) {
  const LayerWeights& L = w_.layers[il];
  const int D = c_.n_embd, HD = c_.head_dim, NQ = c_.n_embd_q(), NKV = c_.n_embd_kv();
  per_token(T, [&](int t) { rmsnorm(&xb_[t * D], &x_[t * D], L.attn_norm.data(), D); });
  // Q and K meet in the softmax of sharp attention scores: the products
  // most sensitive to 8-bit activations (on Gemma 3 they alone take the
  // logits' NMSE from ~6e-4 to ~1.5e-4). The fast path gives them twice
  // the activation precision (see matmul_fast); V and the rest need not.
  const MatmulJob qkv[] = {{&L.wq, q_.data(), true},    // q: (T, n_head*head_dim)
                           {&L.wk, k_.data(), true},    // k: (T, n_head_kv*head_dim)
                           {&L.wv, v_.data(), false}};  // v: (T, n_head_kv*head_dim)
  matmul_jobs(qkv, 3, xb_.data(), T, false);
  if (!L.bq.empty())
    for (int t = 0; t < T; t++) {
      ref::add(&q_[t * NQ], L.bq.data(), NQ);
      ref::add(&k_[t * NKV], L.bk.data(), NKV);
      ref::add(&v_[t * NKV], L.bv.data(), NKV);
    }
  // Angles for these positions, computed once per forward and base.
  const int which = c_.is_swa(il) ? 1 : 0;  // the angles of the two bases are kept apart
  if (!(rope_ready_ & (1 << which))) {
    const float base = c_.rope_base_of(il);
    const float* ff = w_.rope_freq_factors.empty() ? nullptr : w_.rope_freq_factors.data();
    ref::RopeScaling rs;
    rs.freq_scale = c_.rope_freq_scale_of(il);  // (the same for every layer of this base)
    rs.ext_factor = c_.yarn_ext_factor;
    rs.beta_fast = c_.yarn_beta_fast;
    rs.beta_slow = c_.yarn_beta_slow;
    rs.n_ctx_orig = c_.n_ctx_orig;
    for (int t = 0; t < T; t++)
      ref::rope_angles(&rope_cs_[(which * max_batch_ + t) * c_.n_rot], c_.n_rot, tok_pos_[t], base, ff, c_.rope_attn_factor,
                       rs.freq_scale != 1.f || rs.ext_factor != 0.f ? &rs : nullptr);
    rope_ready_ |= 1 << which;
  }
  per_token(T, [&](int t) {
    const float* cs = &rope_cs_[(which * max_batch_ + t) * c_.n_rot];
    for (int h = 0; h < c_.n_head; h++) {
      float* qh = &q_[t * NQ + h * HD];
      if (c_.qk_norm) rmsnorm(qh, qh, L.q_norm.data(), HD);
      ref::rope_apply(qh, c_.n_rot, cs, c_.rope_neox);
    }
    for (int h = 0; h < c_.n_head_kv; h++) {
      float* kh = &k_[t * NKV + h * HD];
      if (c_.qk_norm) rmsnorm(kh, kh, L.k_norm.data(), HD);
      ref::rope_apply(kh, c_.n_rot, cs, c_.rope_neox);
    }
    const SeqKv kv = seq_kv(t);
    store_kv(*tok_kv_[t], kv.k(il, tok_pos_[t]), &k_[t * NKV], NKV);
    store_kv(*tok_kv_[t], kv.v(il, tok_pos_[t]), &v_[t * NKV], NKV);
  });
  attention(il, T, n_ctx_max);  // -> xb: (T, n_head*head_dim)
  matmul(L.wo, xb_.data(), xb2_.data(), T);
  per_token(T, [&](int t) {
    if (!L.bo.empty()) ref::add(&xb2_[t * D], L.bo.data(), D);
    if (c_.post_norms) rmsnorm(&xb2_[t * D], &xb2_[t * D], L.post_attn_norm.data(), D);
    ref::add(&x_[t * D], &xb2_[t * D], D);
    // The feed-forward's norm, in the same pass over the tokens.
    rmsnorm(&xb_[t * D], &x_[t * D], L.ffn_norm.data(), D);
  });
}

void CpuBackend::gate_rows(const float* gate, float* up, int rows, int width, Activation act) {
  if (act == Activation::swiglu_oai) {  // (the same scalar code on both paths)
    per_token(rows, [&](int t) {
      const float* g = &gate[static_cast<size_t>(t) * width];
      float* u = &up[static_cast<size_t>(t) * width];
      for (int i = 0; i < width; i++) u[i] = ref::swiglu_oai(g[i], u[i]);
    });
    return;
  }
  if (k_fast_) {
    // Row by row: a vector kernel's tail is computed differently, and a
    // token's result must not depend on where it sits in the batch.
    const auto fn = act == Activation::gelu_tanh ? k_fast_->gelu_mul : k_fast_->silu_mul;
    per_token(rows, [&](int t) { fn(&gate[static_cast<size_t>(t) * width], &up[static_cast<size_t>(t) * width], width); });
    return;
  }
  const size_t n = static_cast<size_t>(rows) * width;
  if (act == Activation::gelu_tanh)
    for (size_t i = 0; i < n; i++) up[i] = ref::gelu_tanh(gate[i]) * up[i];
  else
    for (size_t i = 0; i < n; i++) up[i] = ref::silu(gate[i]) * up[i];
}

void CpuBackend::ffn_block(int il, int T) {
  const LayerWeights& L = w_.layers[il];
  const int D = c_.n_embd;
  const MatmulJob gate_up[] = {{&L.w_gate, hb_.data()}, {&L.w_up, hb2_.data()}};  // (T, n_ff) each
  matmul_jobs(gate_up, 2, xb_.data(), T, false);
  gate_rows(hb_.data(), hb2_.data(), T, c_.n_ff, c_.act);  // -> hb2_ (why there: gate_rows)
  if (ffn_sq_) {  // FFN pruning's measurement: sum of h^2 per neuron
    double* sq = ffn_sq_ + static_cast<size_t>(il) * c_.n_ff;
    for (int t = 0; t < T; t++)
      for (int j = 0; j < c_.n_ff; j++) {
        const double h = hb2_[static_cast<size_t>(t) * c_.n_ff + j];
        sq[j] += h * h;
      }
  }
  matmul(L.w_down, hb2_.data(), xb2_.data(), T);  // (T, n_embd)
  per_token(T, [&](int t) {
    if (c_.post_norms) rmsnorm(&xb2_[t * D], &xb2_[t * D], L.post_ffw_norm.data(), D);
    ref::add(&x_[t * D], &xb2_[t * D], D);
  });
}

void CpuBackend::moe_block(int il, int T) {
  const LayerWeights& L = w_.layers[il];
  const int D = c_.n_embd, E = c_.n_expert, K = c_.n_expert_used, F = c_.n_ff_exp;
  matmul(L.router, xb_.data(), router_.data(), T);  // (T, n_expert)
  // Routing (ModelConfig::expert_gating): softmax over all experts, the K
  // most likely (ties: the lower index), renormalised to sum 1 (dividing by
  // at least 6.1e-5, as llama.cpp does); or (gpt-oss) the router's bias
  // added, the K largest logits, a softmax over those K.
  const bool top_k_first = c_.expert_gating == ExpertGating::softmax_top_k;
  for (auto& r : exp_rows_) r.clear();
  for (int t = 0; t < T; t++) {
    float* p = &router_[static_cast<size_t>(t) * E];
    if (!L.router_b.empty()) ref::add(p, L.router_b.data(), E);
    if (!top_k_first) {
      const float mx = *std::max_element(p, p + E);
      double sum = 0;
      for (int e = 0; e < E; e++) sum += (p[e] = std::exp(p[e] - mx));
      for (int e = 0; e < E; e++) p[e] = static_cast<float>(p[e] / sum);
    }
    int* sel = &moe_sel_[static_cast<size_t>(t) * K];
    float* w = &moe_w_[static_cast<size_t>(t) * K];
    float wsum = 0;
    for (int j = 0; j < K; j++) {  // K is small: selection by repeated scans
      int best = -1;
      for (int e = 0; e < E; e++) {
        if (std::find(sel, sel + j, e) != sel + j) continue;
        if (best < 0 || p[e] > p[best]) best = e;
      }
      sel[j] = best;
      w[j] = p[best];
      wsum += p[best];
    }
    if (top_k_first) {
      const float mx = w[0];  // the largest
      float sum = 0;
      for (int j = 0; j < K; j++) sum += (w[j] = std::exp(w[j] - mx));
      for (int j = 0; j < K; j++) w[j] /= sum;
      wsum = 1.f;  // (they sum to 1: a renormalisation changes nothing; wsum held logits)
    }
    if (c_.expert_weights_norm) {
      const float inv = 1.f / std::max(wsum, 6.1e-5f);
      for (int j = 0; j < K; j++) w[j] *= inv;
    }
    // Ascending expert order from here on: each token's sum below runs in
    // it whatever the batch (insertion sort: K is small).
    for (int j = 1; j < K; j++)
      for (int i = j; i > 0 && sel[i] < sel[i - 1]; i--) std::swap(sel[i], sel[i - 1]), std::swap(w[i], w[i - 1]);
    for (int j = 0; j < K; j++) exp_rows_[sel[j]].push_back(t * K + j);
  }
  // Each expert's output rows wait in moe_slot_ until each token's sum is
  // made in its own order below: slot t * K + j holds expert sel[j]'s output
  // for token t.
  const bool one_dispatch = k_fast_ && T == 1 && D % 32 == 0 && F % 32 == 0;
  if (one_dispatch) {  // a decoded token: its k experts' products in two dispatches
    const int* sel = moe_sel_.data();
    moe_inputs_[0] = xb_.data();
    for (int j = 0; j < K; j++) {
      moe_jobs_[2 * j] = {&L.gate_exps[sel[j]], 0, &moe_h_[static_cast<size_t>(j) * F]};
      moe_jobs_[2 * j + 1] = {&L.up_exps[sel[j]], 0, &moe_h2_[static_cast<size_t>(j) * F]};
    }
    matvec_many(moe_jobs_.data(), 2 * K, moe_inputs_.data(), 1);
    for (int j = 0; j < K; j++) {
      add_expert_bias(L.gate_exps_b, sel[j], &moe_h_[static_cast<size_t>(j) * F], 1, F);
      add_expert_bias(L.up_exps_b, sel[j], &moe_h2_[static_cast<size_t>(j) * F], 1, F);
    }
    gate_rows(moe_h_.data(), moe_h2_.data(), K, F, c_.expert_act);
    for (int j = 0; j < K; j++) {
      moe_inputs_[j] = &moe_h2_[static_cast<size_t>(j) * F];
      moe_jobs_[j] = {&L.down_exps[sel[j]], j, &moe_slot_[static_cast<size_t>(j) * D]};
    }
    matvec_many(moe_jobs_.data(), K, moe_inputs_.data(), K);
    for (int j = 0; j < K; j++) add_expert_bias(L.down_exps_b, sel[j], &moe_slot_[static_cast<size_t>(j) * D], 1, D);
  }
  for (int e = 0; e < E && !one_dispatch; e++) {
    const std::vector<int>& rows = exp_rows_[e];
    const int n = static_cast<int>(rows.size());
    if (n == 0) continue;
    for (int i = 0; i < n; i++)
      std::copy_n(&xb_[static_cast<size_t>(rows[i] / K) * D], D, &moe_x_[static_cast<size_t>(i) * D]);
    matmul(L.gate_exps[e], moe_x_.data(), moe_h_.data(), n);        // (n, n_ff_exp)
    matmul(L.up_exps[e], moe_x_.data(), moe_h2_.data(), n, true);   // (n, n_ff_exp)
    add_expert_bias(L.gate_exps_b, e, moe_h_.data(), n, F);
    add_expert_bias(L.up_exps_b, e, moe_h2_.data(), n, F);
    gate_rows(moe_h_.data(), moe_h2_.data(), n, F, c_.expert_act);
    matmul(L.down_exps[e], moe_h2_.data(), moe_y_.data(), n);  // (n, n_embd)
    add_expert_bias(L.down_exps_b, e, moe_y_.data(), n, D);
    for (int i = 0; i < n; i++) std::copy_n(&moe_y_[static_cast<size_t>(i) * D], D, &moe_slot_[static_cast<size_t>(rows[i]) * D]);
  }
  // Each token's weighted sum (its experts are in ascending order), then the residual.
  per_token(T, [&](int t) {
    const float* w = &moe_w_[static_cast<size_t>(t) * K];
    float* out = &xb2_[static_cast<size_t>(t) * D];
    std::fill_n(out, D, 0.f);
    for (int j = 0; j < K; j++) {
      const float* y = &moe_slot_[(static_cast<size_t>(t) * K + j) * D];
      for (int i = 0; i < D; i++) out[i] += w[j] * y[i];
    }
    ref::add(&x_[static_cast<size_t>(t) * D], out, D);
  });
}

// The rows that want logits, normed into xb_ one after another, go through
// the output matrix together (the largest matrix of a small model: read once
// for the whole batch).
void CpuBackend::output_logits(const SeqChunk* chunks, int n_chunks, int n_logit_rows) {
  const int D = c_.n_embd;
  int r = 0;
  for (int i = 0, t0 = 0; i < n_chunks; t0 += chunks[i].n_tokens, i++) {
    const SeqChunk& ch = chunks[i];
    const int first = ch.mode == LogitsMode::last ? ch.n_tokens - 1 : ch.mode == LogitsMode::all ? 0 : ch.n_tokens;
    for (int t = t0 + first; t < t0 + ch.n_tokens; t++, r++)
      rmsnorm(&xb_[static_cast<size_t>(r) * D], &x_[static_cast<size_t>(t) * D], w_.output_norm.data(), D);
  }
  const WeightView& W = head_ ? *head_ : w_.output;  // (one chunk when head_ is set)
  const size_t n_logits = static_cast<size_t>(n_logit_rows) * W.n_out;
  float* out = chunks[0].logits;
  if (n_chunks > 1) {
    if (logits_buf_.size() < n_logits) logits_buf_.resize(n_logits);  // grows to the largest batch once
    out = logits_buf_.data();
  }
  matmul(W, xb_.data(), out, n_logit_rows);  // (n_logit_rows, n_vocab)
  if (c_.final_logit_softcap > 0) {
    const float cap = c_.final_logit_softcap;
    for (size_t i = 0; i < n_logits; i++) out[i] = cap * std::tanh(out[i] / cap);
  }
  if (n_chunks > 1)
    for (int i = 0, row = 0; i < n_chunks; i++) {
      const SeqChunk& ch = chunks[i];
      const int n = ch.mode == LogitsMode::last ? 1 : ch.mode == LogitsMode::all ? ch.n_tokens : 0;
      std::copy_n(out + static_cast<size_t>(row) * c_.n_vocab, static_cast<size_t>(n) * c_.n_vocab, ch.logits);
      row += n;
    }
  for (int i = 0; i < n_chunks; i++)
    if (chunks[i].argmax && chunks[i].mode == LogitsMode::last) *chunks[i].argmax = argmax(chunks[i].logits, c_.n_vocab);
}

// One K or V row into the cache, in its type (half, bfloat16: rounded to
// nearest even; Q8_0: quantized as a weight row is).
void CpuBackend::store_kv(const KvCache& kv, void* dst, const float* src, int n) const {
  uint16_t* h = static_cast<uint16_t*>(dst);
  if (kv.type() == KvType::q8_0) {
    (void)quantize_row(TensorType::Q8_0, src, dst, n);  // n is whole blocks (KvPool::create checks)
  } else if (kv.type() == KvType::f32) {
    std::memcpy(dst, src, sizeof(float) * n);
  } else if (kv.type() == KvType::bf16) {
    if (k_fast_) k_fast_->to_bf16(src, h, n);
    else for (int i = 0; i < n; i++) h[i] = fp32_to_bf16(src[i]);
  } else if (k_fast_) {
    k_fast_->to_f16(src, h, n);
  } else {
    for (int i = 0; i < n; i++) h[i] = fp32_to_fp16(src[i]);
  }
}

namespace {

Result<std::unique_ptr<Backend>> make_cpu(std::shared_ptr<const Model> model, int n_threads, int max_batch,
                                         const cpu::Kernels* kernels, const CpuSwitches& sw) {
  if (!model) return invalid_argument("no model");
  if (n_threads < 1 || n_threads > 256) return invalid_argument("threads must be from 1 to 256");
  if (max_batch < 1) return invalid_argument("batch size must be at least 1");
  auto b = std::make_unique<CpuBackend>(std::move(model), n_threads, max_batch, kernels, sw);
  PHASELAB_TRY(b->init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace

HostKvStore* host_kv_store(Backend& backend) {
  auto* cpu = dynamic_cast<CpuBackend*>(&backend);
  return cpu ? &cpu->kv_store() : nullptr;
}

std::string cpu_kernels_isa(const std::string& isa_cap) { return cpu::best_kernels(isa_cap).isa; }

Result<std::unique_ptr<Backend>> make_cpu_reference_backend(std::shared_ptr<const Model> model, int n_threads, int max_batch) {
  CpuSwitches sw;
  sw.repack = false;
  return make_cpu(std::move(model), n_threads, max_batch, nullptr, sw);
}

Result<std::unique_ptr<Backend>> make_cpu_backend(std::shared_ptr<const Model> model, int n_threads, int max_batch,
                                                  bool portable_only, const CpuSwitches& sw) {
  return make_cpu(std::move(model), n_threads, max_batch,
                  portable_only ? &cpu::portable_kernels() : &cpu::best_kernels(sw.isa_cap), sw);
}

}  // namespace phaselab
