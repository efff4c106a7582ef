// The CPU forward pass, in two flavours that share everything but the
// innermost arithmetic:
//  - reference: weights dequantized a row at a time to F32, float dot
//    products in plain C++. The oracle.
//  - fast (the default "cpu" backend): activations quantized once per matrix
//    product to 8 bits per block of 32, integer dot products against the
//    weights' own block formats with SIMD kernels chosen for the CPU.
// Every buffer is allocated once. Batched prefill and token-by-token decode do
// the same arithmetic in the same order for every token, so their results are
// bitwise equal in both flavours.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <unordered_map>

#include <sys/mman.h>
#include <unistd.h>

#include "phaselab/backend.h"
#include "phaselab/quant.h"
#include "phaselab/sampler.h"
#include "phaselab/thread_pool.h"
#include "cpu_kernels.h"
#include "ref_ops.h"

namespace phaselab {

namespace {

class CpuBackend final : public Backend {
 public:
  static constexpr int kMaxGroup = 64;  // query heads per KV head
  // repack: rewrite the matrices for the grouped kernels at load
  // (CpuSwitches::repack; off keeps the file's layout, for comparisons).
  CpuBackend(std::shared_ptr<const Model> model, int n_threads, int max_batch, const cpu::Kernels* kernels, bool repack)
      : model_(std::move(model)), c_(model_->config()), w_(model_->weights()), pool_(n_threads), max_batch_(max_batch),
        k_fast_(kernels), repack_(repack) {}

  Status init() {
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
      const int64_t max_in = std::max<int64_t>({c_.n_embd, c_.n_ff, c_.n_embd_q()});
      row_buf_.assign(pool_.size(), std::vector<float>(max_in));
      rope_cs_.resize(static_cast<size_t>(2) * B * c_.n_rot);
      tok_kv_.resize(B);
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
        resid_.resize(static_cast<size_t>(B) * max_in);
        if (k_fast_->dot_q4_k_r8_x1 && repack_) {
          act_g_.resize(static_cast<size_t>(B) * (max_in / 256 + 1));
          act_lo_g_.resize(static_cast<size_t>(B) * (max_in / 256 + 1));
          repack_weights();
        }
      }
    } catch (const std::bad_alloc&) {
      return out_of_memory("not enough memory for the work buffers of a batch of " + std::to_string(B) + " tokens");
    }
    return Status::ok();
  }

  std::string name() const override { return k_fast_ ? std::string("cpu-") + k_fast_->isa : "cpu-reference"; }
  int max_batch() const override { return max_batch_; }
  uint64_t positions_computed() const override { return computed_; }

  Status forward(const int32_t* tokens, int T, KvCache& kv, float* logits, LogitsMode mode) override {
    const SeqChunk chunk{&kv, tokens, T, mode, logits};
    return forward_batch(&chunk, 1);
  }

  bool batched_forward() const override { return true; }

  // The tokens of every chunk, one after another, are the rows t = 0..T-1 of
  // every buffer below; tok_kv_[t] and tok_pos_[t] say whose and where.
  Status forward_batch(const SeqChunk* chunks, int n_chunks) override {
    int T = 0, n_ctx_max = 0, n_logit_rows = 0;
    PHASELAB_TRY(check_batch(chunks, n_chunks, c_.n_vocab, max_batch_, false, &T));
    for (int i = 0; i < n_chunks; i++) {
      const SeqChunk& ch = chunks[i];
      if (ch.kv->pool().storage() != KvStorage::host)
        return invalid_argument("this KV cache keeps its K/V on a GPU (it was made for the CUDA backend), not in host "
                                "memory: make the session or scheduler with the CPU backend to run it there");
      n_ctx_max = std::max(n_ctx_max, ch.kv->n_ctx());
      n_logit_rows += ch.mode == LogitsMode::last ? 1 : ch.mode == LogitsMode::all ? ch.n_tokens : 0;
    }
    for (int i = 0; i < n_chunks; i++) PHASELAB_TRY(chunks[i].kv->reserve(chunks[i].n_tokens));  // copy on write
    for (int i = 0, t = 0; i < n_chunks; i++)
      for (int j = 0; j < chunks[i].n_tokens; j++, t++) {
        tok_kv_[t] = chunks[i].kv;
        tok_pos_[t] = chunks[i].kv->n_past() + j;
        tok_id_[t] = chunks[i].tokens[j];
      }
    const size_t score_size = static_cast<size_t>(c_.n_head / c_.n_head_kv) * n_ctx_max;
    for (auto& s : score_buf_)
      if (s.size() < score_size) s.resize(score_size);
    for (auto& v : vrow_buf_)
      if (static_cast<int>(v.size()) < n_ctx_max) v.resize(n_ctx_max);
    for (auto& v : qrow_buf_)
      if (static_cast<int>(v.size()) < n_ctx_max) v.resize(n_ctx_max);
    for (auto& v : hrow_buf_)
      if (static_cast<int>(v.size()) < n_ctx_max) v.resize(n_ctx_max);
    if (k_fast_) {
      // Partial attention results of long rows' key parts: a tile of rows'
      // per thread, and up to pool-size rows' for the split decode.
      const size_t part = static_cast<size_t>(c_.n_head / c_.n_head_kv) * (c_.head_dim + 2);
      const size_t parts = static_cast<size_t>((n_ctx_max + kAttnPartKeys - 1) / kAttnPartKeys);
      for (auto& v : part_buf_)
        if (v.size() < kAttnTileTokens * parts * part) v.resize(kAttnTileTokens * parts * part);
      if (split_buf_.size() < static_cast<size_t>(pool_.size()) * parts * part)
        split_buf_.resize(static_cast<size_t>(pool_.size()) * parts * part);
    }

    const int D = c_.n_embd, HD = c_.head_dim, NQ = c_.n_embd_q(), NKV = c_.n_embd_kv();
    rope_ready_ = 0;
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

    for (int il = 0; il < c_.n_layer; il++) {
      const LayerWeights& L = w_.layers[il];
      // ---- attention ----
      per_token(T, [&](int t) { ref::rmsnorm(&xb_[t * D], &x_[t * D], L.attn_norm.data(), D, c_.rms_eps); });
      // Q and K meet in the softmax of sharp attention scores: the products
      // most sensitive to 8-bit activations (on Gemma 3 they alone take the
      // logits' NMSE from ~6e-4 to ~1.5e-4). The fast path gives them twice
      // the activation precision (see matmul_fast); V and the rest need not.
      matmul(L.wq, xb_.data(), q_.data(), T, false, true);  // q: (T, n_head*head_dim)
      matmul(L.wk, xb_.data(), k_.data(), T, true, true);   // k: (T, n_head_kv*head_dim)
      matmul(L.wv, xb_.data(), v_.data(), T, true);  // v: (T, n_head_kv*head_dim)
      if (c_.attn_bias)
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
        for (int t = 0; t < T; t++) ref::rope_angles(&rope_cs_[(which * max_batch_ + t) * c_.n_rot], c_.n_rot, tok_pos_[t], base, ff);
        rope_ready_ |= 1 << which;
      }
      per_token(T, [&](int t) {
        const float* cs = &rope_cs_[(which * max_batch_ + t) * c_.n_rot];
        for (int h = 0; h < c_.n_head; h++) {
          float* qh = &q_[t * NQ + h * HD];
          if (c_.qk_norm) ref::rmsnorm(qh, qh, L.q_norm.data(), HD, c_.rms_eps);
          ref::rope_apply(qh, c_.n_rot, cs, c_.rope_neox);
        }
        for (int h = 0; h < c_.n_head_kv; h++) {
          float* kh = &k_[t * NKV + h * HD];
          if (c_.qk_norm) ref::rmsnorm(kh, kh, L.k_norm.data(), HD, c_.rms_eps);
          ref::rope_apply(kh, c_.n_rot, cs, c_.rope_neox);
        }
        store_kv(*tok_kv_[t], tok_kv_[t]->k(il, tok_pos_[t]), &k_[t * NKV], NKV);
        store_kv(*tok_kv_[t], tok_kv_[t]->v(il, tok_pos_[t]), &v_[t * NKV], NKV);
      });
      attention(il, T, n_ctx_max);  // -> xb: (T, n_head*head_dim)
      matmul(L.wo, xb_.data(), xb2_.data(), T);
      per_token(T, [&](int t) {
        if (c_.post_norms) ref::rmsnorm(&xb2_[t * D], &xb2_[t * D], L.post_attn_norm.data(), D, c_.rms_eps);
        ref::add(&x_[t * D], &xb2_[t * D], D);
        // ---- feed-forward ----
        ref::rmsnorm(&xb_[t * D], &x_[t * D], L.ffn_norm.data(), D, c_.rms_eps);
      });
      matmul(L.w_gate, xb_.data(), hb_.data(), T);  // (T, n_ff)
      matmul(L.w_up, xb_.data(), hb2_.data(), T, true);  // (T, n_ff)
      const size_t nh = static_cast<size_t>(T) * c_.n_ff;
      if (k_fast_) {
        // Token by token: a vector kernel's tail is computed differently, and
        // a token's result must not depend on where it sits in the batch.
        const auto gate = c_.act == Activation::gelu_tanh ? k_fast_->gelu_mul : k_fast_->silu_mul;
        per_token(T, [&](int t) { gate(&hb_[static_cast<size_t>(t) * c_.n_ff], &hb2_[static_cast<size_t>(t) * c_.n_ff], c_.n_ff); });
      } else if (c_.act == Activation::gelu_tanh) {
        for (size_t i = 0; i < nh; i++) hb_[i] = ref::gelu_tanh(hb_[i]) * hb2_[i];
      } else {
        for (size_t i = 0; i < nh; i++) hb_[i] = ref::silu(hb_[i]) * hb2_[i];
      }
      matmul(L.w_down, hb_.data(), xb2_.data(), T);  // (T, n_embd)
      per_token(T, [&](int t) {
        if (c_.post_norms) ref::rmsnorm(&xb2_[t * D], &xb2_[t * D], L.post_ffw_norm.data(), D, c_.rms_eps);
        ref::add(&x_[t * D], &xb2_[t * D], D);
      });
    }
    for (int i = 0; i < n_chunks; i++) chunks[i].kv->append(chunks[i].tokens, chunks[i].n_tokens);
    computed_ += static_cast<uint64_t>(T);

    if (n_logit_rows == 0) return Status::ok();
    // The rows that want logits, normed into xb_ one after another, go
    // through the output matrix together (the largest matrix of a small
    // model: read once for the whole batch).
    int r = 0;
    for (int i = 0, t0 = 0; i < n_chunks; t0 += chunks[i].n_tokens, i++) {
      const SeqChunk& ch = chunks[i];
      const int first = ch.mode == LogitsMode::last ? ch.n_tokens - 1 : ch.mode == LogitsMode::all ? 0 : ch.n_tokens;
      for (int t = t0 + first; t < t0 + ch.n_tokens; t++, r++)
        ref::rmsnorm(&xb_[static_cast<size_t>(r) * D], &x_[static_cast<size_t>(t) * D], w_.output_norm.data(), D, c_.rms_eps);
    }
    const size_t n_logits = static_cast<size_t>(n_logit_rows) * c_.n_vocab;
    float* out = chunks[0].logits;
    if (n_chunks > 1) {
      if (logits_buf_.size() < n_logits) logits_buf_.resize(n_logits);  // grows to the largest batch once
      out = logits_buf_.data();
    }
    matmul(w_.output, xb_.data(), out, n_logit_rows);  // (n_logit_rows, n_vocab)
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
    return Status::ok();
  }

 private:
  // One K or V row into the cache, in its type (half, bfloat16: rounded to
  // nearest even; Q8_0: quantized as a weight row is).
  void store_kv(const KvCache& kv, void* dst, const float* src, int n) const {
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
  // Scores of the G query heads q (G, head_dim) sharing KV head kvh
  // against the keys [a, b] of layer il: s[g * ss + j - a]; and the sum of
  // the value rows [a, b] weighted by p[g * ps + j - a], added to out[g *
  // os ..]. The fast kernels of the cache's type, the key and value rows by
  // pointer (the cache is paged).
  void scores_of(const KvCache& kv, int il, int a, int b, int kvh, const float* q, int G, float* s, int ss,
                 int thread) {
    const int HD = c_.head_dim, n = b - a + 1;
    switch (kv.type()) {
      case KvType::q8_0: {
        const uint8_t** rows = qrow_buf_[thread].data();
        kv.k_rows(il, a, b, kvh * HD, rows);
        return k_fast_->scores_q8_0(s, ss, G, q, rows, n, HD, c_.attn_scale);
      }
      case KvType::f32: {
        const float** rows = vrow_buf_[thread].data();
        kv.k_rows(il, a, b, kvh * HD, rows);
        return k_fast_->scores(s, ss, G, q, rows, n, HD, c_.attn_scale);
      }
      default: {
        const uint16_t** rows = hrow_buf_[thread].data();
        kv.k_rows(il, a, b, kvh * HD, rows);
        return (kv.type() == KvType::bf16 ? k_fast_->scores_bf16 : k_fast_->scores_f16)(s, ss, G, q, rows, n, HD,
                                                                                          c_.attn_scale);
      }
    }
  }
  void weighted_sum_of(const KvCache& kv, int il, int a, int b, int kvh, const float* p, int ps, int G, float* out,
                       int os, int thread) {
    const int HD = c_.head_dim, n = b - a + 1;
    switch (kv.type()) {
      case KvType::q8_0: {
        const uint8_t** rows = qrow_buf_[thread].data();
        kv.v_rows(il, a, b, kvh * HD, rows);
        return k_fast_->weighted_sum_q8_0(out, os, G, p, ps, rows, n, HD);
      }
      case KvType::f32: {
        const float** rows = vrow_buf_[thread].data();
        kv.v_rows(il, a, b, kvh * HD, rows);
        return k_fast_->weighted_sum(out, os, G, p, ps, rows, n, HD);
      }
      default: {
        const uint16_t** rows = hrow_buf_[thread].data();
        kv.v_rows(il, a, b, kvh * HD, rows);
        return (kv.type() == KvType::bf16 ? k_fast_->weighted_sum_bf16 : k_fast_->weighted_sum_f16)(out, os, G, p, ps,
                                                                                                      rows, n, HD);
      }
    }
  }

  // Splits rows [0, n) into chunks claimed by the pool's threads:
  // body(r0, r1, thread). Several chunks per thread, so that a thread the OS
  // has not scheduled leaves little behind.
  // body(t) for each token t < T: on the pool for a prefill batch (the
  // per-token element-wise work would otherwise leave the other threads
  // idle), inline for a decode step.
  template <typename F>
  void per_token(int T, F&& body) {
    if (T < kPerTokenParallelMin) {
      for (int t = 0; t < T; t++) body(t);
      return;
    }
    pool_.parallel_for(T, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; t++) body(static_cast<int>(t));
    });
  }
  static constexpr int kPerTokenParallelMin = 8;

  template <typename F>
  void for_rows(int64_t n, F&& body) {
    const int64_t n_chunks = std::clamp<int64_t>(n / 16, 1, 2 * pool_.size());
    const int64_t per = (n + n_chunks - 1) / n_chunks;
    pool_.for_chunks(static_cast<int>(n_chunks), [&](int c, int thread) {
      const int64_t r0 = c * per, r1 = std::min(n, r0 + per);
      if (r0 < r1) body(r0, r1, thread);
    });
  }

  // out[t, r] = W.row(r) · in[t, :] for T tokens. Each weight row is read
  // once per tile of tokens (token_tile) and used for every token of the
  // tile while it is in L1.
  // same_input: in is what the previous matmul read (its quantized form is
  // still in act_).
  void matmul(const WeightView& W, const float* in, float* out, int T, bool same_input = false, bool precise = false) {
    if (k_fast_) return matmul_fast(W, in, out, T, same_input, precise);
    const int64_t n_in = W.n_in, n_out = W.n_out;
    for_rows(n_out, [&](int64_t r0, int64_t r1, int thread) {
      float* row = row_buf_[thread].data();
      for (int64_t r = r0; r < r1; r++) {
        (void)dequantize_row(W.type, W.row(r), row, n_in);  // types were checked at load
        for (int t = 0; t < T; t++) out[t * n_out + r] = ref::dot(row, in + t * n_in, n_in);
      }
    });
  }

  // precise: the activations are quantized twice, x ~= d1*q1 + d2*q2 with q2
  // the 8-bit quantization of the residual x - d1*q1 (about 15 bits in all),
  // at the cost of a second integer dot product per row. The dot is linear in
  // the activations, so the two parts simply add.
  void matmul_fast(const WeightView& W, const float* in, float* out, int T, bool same_input, bool precise = false) {
    const int64_t n_in = W.n_in, n_out = W.n_out;
    const int type = static_cast<int>(W.type);
    if (!same_input) act_of_ = lo_of_ = nullptr;
    if (auto rp = repacked_.find(W.data); rp != repacked_.end()) return matmul_repacked(W, rp->second, in, out, T, precise);
    if (!cpu::uses_q8_activations(W.type)) {
      const cpu::DotF32Fn dot = k_fast_->dot_f32[type];
      for_rows(n_out, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++)
          for (int t = 0; t < T; t++) out[t * n_out + r] = dot(W.row(r), in + t * n_in, n_in);
      });
      return;
    }
    const int64_t nb = n_in / 32;  // activation blocks per token
    quantize_input(in, T, n_in, precise);
    const cpu::DotQ8Fn dot = k_fast_->dot_q8[type];
    const cpu::DotQ8x4Fn dot4 = k_fast_->dot_q8_x4[type];
    const int tile = token_tile(nb * static_cast<int64_t>(sizeof(cpu::ActQ8)) * (precise ? 2 : 1));
    for_rows(n_out, [&](int64_t r0, int64_t r1, int) {
      float v4[4], lo4[4];
      for (int t0 = 0; t0 < T; t0 += tile) {
        const int t1 = std::min(T, t0 + tile);
        for (int64_t r = r0; r < r1; r++) {
          const uint8_t* row = W.row(r);
          int t = t0;
          // Four tokens per pass over the row: its blocks are unpacked once.
          for (; dot4 && t + 4 <= t1; t += 4) {
            dot4(row, &act_[t * nb], nb, n_in, v4);
            if (precise) dot4(row, &act_lo_[t * nb], nb, n_in, lo4);
            for (int j = 0; j < 4; j++) out[(t + j) * n_out + r] = precise ? v4[j] + lo4[j] : v4[j];
          }
          for (; t < t1; t++) {
            float v = dot(row, &act_[t * nb], n_in);
            if (precise) v += dot(row, &act_lo_[t * nb], n_in);
            out[t * n_out + r] = v;
          }
        }
      }
    });
  }

  // Quantizes in (T, n_in) into act_ (and its residual into act_lo_ when
  // precise), unless they already hold it.
  void quantize_input(const float* in, int T, int64_t n_in, bool precise) {
    if (act_of_ == in && (!precise || lo_of_ == in)) return;
    const int64_t nb = n_in / 32;
    pool_.parallel_for(T, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; t++) {
        cpu::ActQ8* a = &act_[t * nb];
        k_fast_->quantize_act(in + t * n_in, a, n_in);
        if (!precise) continue;
        float* r = &resid_[t * n_in];
        for (int64_t i = 0; i < n_in; i++) r[i] = in[t * n_in + i] - a[i / 32].d * a[i / 32].qs[i % 32];
        k_fast_->quantize_act(r, &act_lo_[t * nb], n_in);
      }
    });
    act_of_ = in;
    lo_of_ = precise ? in : nullptr;
    groups_of_ = lo_groups_of_ = nullptr;
  }

  // Q4_0, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K rows rewritten for the grouped
  // kernels (cpu_kernels.h).
  // The original pages are released: this backend never reads them again.
  struct Repacked {
    std::vector<uint8_t> data;
    cpu::RepackedFormat f;
  };
  void repack_weights() {
    auto repack = [&](const WeightView& W) {
      if (repacked_.count(W.data)) return;
      Repacked rp;
      rp.f = cpu::repacked_format(*k_fast_, W.type, W.n_in);
      if (!rp.f.repack) return;
      const size_t rb = rp.f.row_bytes;
      rp.data.resize(rb * static_cast<size_t>(W.n_out));
      // The file's pages are released slab by slab as they are rewritten,
      // so that a large matrix is not resident twice: Gemma 3 270M's tied
      // output matrix (178 MB) took peak RSS from ~320 to ~490 MiB. Each
      // release starts at the matrix's start, so no page at a slab's edge is kept.
      constexpr int64_t kSlabRows = 4096;
      for (int64_t r0 = 0; r0 < W.n_out; r0 += kSlabRows) {
        const int64_t r1 = std::min(W.n_out, r0 + kSlabRows);
        for (int64_t r = r0; r < r1; r++) rp.f.repack(W.row(r), rp.data.data() + r * rb, W.n_in);
        release_pages(W.data, W.row_bytes * static_cast<size_t>(r1));
      }
      repacked_.emplace(W.data, std::move(rp));
    };
    for (const LayerWeights& L : w_.layers)
      for (const WeightView* W : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) repack(*W);
    // The output matrix too: with a large vocabulary it is the largest
    // product of a decode pass over many sequences. Tied to the token
    // embedding, its original rows are still read for the embedding lookup;
    // the lookup then reads the repacked rows (a tied Q8_0 matrix: Gemma 3),
    // so that the file's copy, released, is never read again (from the
    // file's pages, 8000 random tokens had brought 160 MiB of it back).
    repack(w_.output);
    if (auto rp = repacked_.find(w_.output.data);
        rp != repacked_.end() && w_.output.data == w_.tok_embd.data && w_.tok_embd.type == TensorType::Q8_0) {
      embd_repacked_ = rp->second.data.data();
      embd_row_bytes_ = rp->second.f.row_bytes;
    }
  }

  static void release_pages(const uint8_t* p, size_t n) {
    const long page = sysconf(_SC_PAGESIZE);
    const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
    const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
    if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
  }

  // The activations' groups for repacked rows, built once per input.
  void build_groups(const std::vector<cpu::ActQ8>& act, std::vector<cpu::ActGroup>& groups, int64_t nb, int64_t gs,
                    int T) {
    for (int t = 0; t < T; t++) cpu::group_act(&act[t * nb], &groups[t * gs], nb);
  }

  // Prefill takes the tokens in tiles whose quantized activations stay in L1
  // while every row of a thread's chunk passes over them (a row is a few
  // hundred bytes; 512 tokens of activations are hundreds of KiB, which
  // would otherwise come from L2 for every row): 1.3x on pp512.
  static constexpr int kMaxRows = 4;  // bound on Kernels::repacked_rows
  static constexpr int64_t kL1TileBytes = 16 * 1024;  // half of a 32 KiB L1d (48 KiB on recent cores)
  // Tokens per tile for tok_bytes of activations per token: a multiple of 4.
  static int token_tile(int64_t tok_bytes) {
    return static_cast<int>(std::max<int64_t>(4, kL1TileBytes / tok_bytes / 4 * 4));
  }

  // The rows a decode batch (of at most kPrefetchMaxTokens tokens, so one
  // tile) needs next, asked for ahead of time: with 4 to 32 tokens per row
  // the kernels dwell on each row long enough that the hardware prefetcher
  // lets the weight stream stall (perf put 20% of the output matrix's time
  // at batch 16 on one weight load); Gemma 3 270M batch 16 decode +12%
  // (median of 4 alternating runs). Prefill (rows reused by every tile)
  // was 6% slower with it.
  static constexpr int kPrefetchRows = 8;
  static constexpr int kPrefetchMaxTokens = 32;
  static void prefetch_rows(const uint8_t* p, size_t n, const uint8_t* end) {
    for (size_t i = 0; i < n && p + i < end; i += 64) __builtin_prefetch(p + i, 0, 0);
  }

  void matmul_repacked(const WeightView& W, const Repacked& rp, const float* in, float* out, int T, bool precise) {
    const int64_t n_in = W.n_in, n_out = W.n_out, nb = n_in / 32;
    const int64_t gs = std::max<int64_t>(cpu::act_groups(nb), 1);
    quantize_input(in, T, n_in, precise);
    if (groups_of_ != in) {
      build_groups(act_, act_g_, nb, gs, T);
      groups_of_ = in;
    }
    if (precise && lo_groups_of_ != in) {
      build_groups(act_lo_, act_lo_g_, nb, gs, T);
      lo_groups_of_ = in;
    }
    const cpu::DotR8Fn dot1 = rp.f.dot1, dot4 = rp.f.dot4;
    const cpu::DotR8RowsFn dot_rows4 = rp.f.dot_rows4;
    const size_t row_bytes = rp.f.row_bytes;
    const int tile = token_tile(gs * static_cast<int64_t>(sizeof(cpu::ActGroup)) * (precise ? 2 : 1));
    for_rows(n_out, [&](int64_t r0, int64_t r1, int) {
      float v4[4], lo4[4];
      for (int t0 = 0; t0 < T; t0 += tile) {
        const int t1 = std::min(T, t0 + tile);
        int64_t r = r0;
        // Several rows at once where the kernels take them: each token's
        // activations are loaded once for all of them.
        const int R = k_fast_->repacked_rows;
        if (R > 1 && dot_rows4 && (t1 - t0) >= 4)
          for (; r + R <= r1; r += R) {
            const uint8_t* row = rp.data.data() + r * row_bytes;
            if (T <= kPrefetchMaxTokens)
              prefetch_rows(row + kPrefetchRows * row_bytes, R * row_bytes, rp.data.data() + r1 * row_bytes);
            float vr[4 * kMaxRows], lor[4 * kMaxRows];
            int t = t0;
            for (; t + 4 <= t1; t += 4) {
              dot_rows4(row, row_bytes, &act_g_[t * gs], gs, &act_[t * nb], nb, n_in, vr);
              if (precise) dot_rows4(row, row_bytes, &act_lo_g_[t * gs], gs, &act_lo_[t * nb], nb, n_in, lor);
              for (int i = 0; i < R; i++)
                for (int j = 0; j < 4; j++)
                  out[(t + j) * n_out + r + i] = precise ? vr[i * 4 + j] + lor[i * 4 + j] : vr[i * 4 + j];
            }
            for (; t < t1; t++)
              for (int i = 0; i < R; i++) {
                dot1(row + i * row_bytes, &act_g_[t * gs], 0, &act_[t * nb], 0, n_in, v4);
                if (precise) dot1(row + i * row_bytes, &act_lo_g_[t * gs], 0, &act_lo_[t * nb], 0, n_in, lo4);
                out[t * n_out + r + i] = precise ? v4[0] + lo4[0] : v4[0];
              }
          }
        for (; r < r1; r++) {
          const uint8_t* row = rp.data.data() + r * row_bytes;
          int t = t0;
          for (; t + 4 <= t1; t += 4) {
            dot4(row, &act_g_[t * gs], gs, &act_[t * nb], nb, n_in, v4);
            if (precise) dot4(row, &act_lo_g_[t * gs], gs, &act_lo_[t * nb], nb, n_in, lo4);
            for (int j = 0; j < 4; j++) out[(t + j) * n_out + r] = precise ? v4[j] + lo4[j] : v4[j];
          }
          for (; t < t1; t++) {
            dot1(row, &act_g_[t * gs], 0, &act_[t * nb], 0, n_in, v4);
            if (precise) dot1(row, &act_lo_g_[t * gs], 0, &act_lo_[t * nb], 0, n_in, lo4);
            out[t * n_out + r] = precise ? v4[0] + lo4[0] : v4[0];
          }
        }
      }
    });
  }

  float dot(const float* a, const float* b, int64_t n) const { return k_fast_ ? k_fast_->dot(a, b, n) : ref::dot(a, b, n); }

  // Causal attention of the T queries of the batch, each over its own
  // sequence's cache (tok_kv_, tok_pos_) of layer il. The query heads that
  // share a KV head are done together, so each K and V row is read once for
  // the whole group.
  // score_stride: the largest n_ctx of the batch's sequences (a query
  // head's scores are that far apart in the per-thread buffer).
  //
  // A row that sees more than kAttnPartKeys keys is attended in parts of
  // kAttnPartKeys keys (as flash decoding does): each part's scores, its
  // softmax numerators against its own maximum and its weighted sum of value
  // rows, then the parts merged in order. The parts depend on the row's
  // position and window alone, so a row gets bitwise the same result
  // whether its parts run on one thread (prefill, batches) or on several
  // (the decode of fewer sequences than threads: with one KV head, as
  // Gemma 3 270M has, a decode step would otherwise attend on one core while
  // the others wait).
  static constexpr int kAttnPartKeys = 1024;
  static constexpr int kAttnTileTokens = 4;  // rows of one sequence that share each part's K/V (prefill)
  void attention(int il, int T, int score_stride) {
    const int group = c_.n_head / c_.n_head_kv;
    const int window = c_.window_of(il);
    const int n_work = T * c_.n_head_kv;
    const size_t part_size = static_cast<size_t>(group) * (c_.head_dim + 2);
    auto first_key = [&](int t) { return window > 0 ? std::max(0, tok_pos_[t] - window + 1) : 0; };
    auto n_parts = [&](int t) { return k_fast_ ? (tok_pos_[t] - first_key(t)) / kAttnPartKeys + 1 : 1; };
    // The parts of row wi = (token, KV head) into parts (part_size floats each).
    auto attend_parts = [&](int wi, int p0, int p1, float* parts, int thread) {
      const int t = wi / c_.n_head_kv, kvh = wi % c_.n_head_kv, j0 = first_key(t);
      for (int p = p0; p < p1; p++)
        attend_part(il, t, kvh, j0 + p * kAttnPartKeys, std::min(tok_pos_[t], j0 + (p + 1) * kAttnPartKeys - 1),
                    parts + (p - p0) * part_size, thread, score_stride);
    };
    int split_rows = 0;
    if (n_work < std::min(pool_.size(), kMaxSplitRows))
      for (int wi = 0; wi < n_work; wi++) split_rows += n_parts(wi / c_.n_head_kv) > 1;
    if (split_rows == 0) {
      // One chunk per (tile of tokens, KV head): later tokens attend over
      // more keys, and claiming chunks one by one balances that. Rows of
      // several parts go in tiles of up to kAttnTileTokens consecutive
      // tokens of one sequence (a prompt's): part by part, each part's keys
      // and values (1 MiB in F16 for Gemma 3's head) serve every token of
      // the tile while they are in the core's L2, where one row at a time
      // streamed the whole context from L3 or memory for every token
      // (pp512 @ d32000 ran at 0.74x llama.cpp). The parts and merges are the
      // calls of one row at a time, so the results are bitwise the same.
      int n_tiles = 0;
      for (int t = 0; t < T;) {
        int n = 1;
        if (n_parts(t) > 1)
          while (n < kAttnTileTokens && t + n < T && tok_kv_[t + n] == tok_kv_[t] && tok_pos_[t + n] == tok_pos_[t] + n) n++;
        tile_first_[n_tiles] = t;
        tile_len_[n_tiles++] = n;
        t += n;
      }
      pool_.for_chunks(n_tiles * c_.n_head_kv, [&](int item, int thread) {
        const int ti = item / c_.n_head_kv, kvh = item % c_.n_head_kv;
        const int t0 = tile_first_[ti], n = tile_len_[ti];
        if (n_parts(t0) == 1) return attend_row(il, t0 * c_.n_head_kv + kvh, thread, score_stride);
        const int P_last = n_parts(t0 + n - 1);  // the most: positions grow along the tile
        float* parts = part_buf_[thread].data();  // (tile token, P_last, part_size)
        for (int p = 0; p < P_last; p++)
          for (int i = 0; i < n; i++) {
            const int t = t0 + i, j0 = first_key(t);
            if (p >= n_parts(t)) continue;
            attend_part(il, t, kvh, j0 + p * kAttnPartKeys, std::min(tok_pos_[t], j0 + (p + 1) * kAttnPartKeys - 1),
                        parts + (static_cast<size_t>(i) * P_last + p) * part_size, thread, score_stride);
          }
        for (int i = 0; i < n; i++)
          merge_parts((t0 + i) * c_.n_head_kv + kvh, parts + static_cast<size_t>(i) * P_last * part_size, n_parts(t0 + i));
      });
      return;
    }
    // Few rows (decode): one chunk per part of every row, then the merges.
    int first[kMaxSplitRows + 1];
    first[0] = 0;
    for (int wi = 0; wi < n_work; wi++) first[wi + 1] = first[wi] + n_parts(wi / c_.n_head_kv);
    pool_.for_chunks(first[n_work], [&](int item, int thread) {
      int wi = 0;
      while (first[wi + 1] <= item) wi++;
      if (first[wi + 1] - first[wi] == 1) return attend_row(il, wi, thread, score_stride);
      const int p = item - first[wi];
      attend_parts(wi, p, p + 1, split_buf_.data() + item * part_size, thread);
    });
    for (int wi = 0; wi < n_work; wi++)
      if (first[wi + 1] - first[wi] > 1) merge_parts(wi, split_buf_.data() + first[wi] * part_size, first[wi + 1] - first[wi]);
  }
  static constexpr int kMaxSplitRows = 64;  // rows split among threads at most

  // Keys [a, b] of row (t, kvh): the part's unnormalised output (group,
  // head_dim), then its maxima (group) and sums of exponentials (group).
  void attend_part(int il, int t, int kvh, int a, int b, float* out, int thread, int n_ctx) {
    const int HD = c_.head_dim, NQ = c_.n_embd_q(), group = c_.n_head / c_.n_head_kv, h0 = kvh * group, n = b - a + 1;
    const KvCache& kv = *tok_kv_[t];
    float* scores = score_buf_[thread].data();  // (group, n_ctx)
    const float* q = &q_[t * NQ + h0 * HD];
    scores_of(kv, il, a, b, kvh, q, group, scores + a, n_ctx, thread);
    float *mx = out + group * HD, *sum = mx + group;
    for (int g = 0; g < group; g++) {
      float* sg = scores + g * n_ctx;
      if (c_.attn_logit_softcap > 0)
        for (int j = a; j <= b; j++) sg[j] = c_.attn_logit_softcap * std::tanh(sg[j] / c_.attn_logit_softcap);
      mx[g] = *std::max_element(sg + a, sg + b + 1);
      sum[g] = k_fast_->exp_sum(sg + a, n, mx[g]);
    }
    std::fill(out, out + group * HD, 0.f);
    weighted_sum_of(kv, il, a, b, kvh, scores + a, n_ctx, group, out, HD, thread);
  }

  // Row wi's P parts (attend_part's layout, in key order) into its output:
  // each part weighted by exp(its maximum - the row's) / the row's sum.
  void merge_parts(int wi, const float* parts, int P) {
    const int HD = c_.head_dim, NQ = c_.n_embd_q(), group = c_.n_head / c_.n_head_kv;
    const int t = wi / c_.n_head_kv, h0 = (wi % c_.n_head_kv) * group;
    const size_t part_size = static_cast<size_t>(group) * (HD + 2);
    for (int g = 0; g < group; g++) {
      auto mx = [&](int p) { return parts[p * part_size + group * HD + g]; };
      auto sum = [&](int p) { return parts[p * part_size + group * HD + group + g]; };
      float m = mx(0);
      for (int p = 1; p < P; p++) m = std::max(m, mx(p));
      float total = 0;
      for (int p = 0; p < P; p++) total += sum(p) * std::exp(mx(p) - m);
      float* out = &xb_[t * NQ + (h0 + g) * HD];
      std::fill(out, out + HD, 0.f);
      for (int p = 0; p < P; p++) k_fast_->axpy(out, std::exp(mx(p) - m) / total, parts + p * part_size + g * HD, HD);
    }
  }

  // Row wi = (token, KV head) over all its keys in one pass.
  void attend_row(int il, int wi, int thread, int n_ctx) {
    const int HD = c_.head_dim, NQ = c_.n_embd_q();
    const int group = c_.n_head / c_.n_head_kv;
    const int window = c_.window_of(il);
    float* scores = score_buf_[thread].data();  // (group, n_ctx)
    const int t = wi / c_.n_head_kv, kvh = wi % c_.n_head_kv;
    const KvCache& kv = *tok_kv_[t];
    const int pos = tok_pos_[t];
    const int h0 = kvh * group;
    // Keys in [j0, pos]: a local layer sees only the last sliding_window.
    const int j0 = window > 0 ? std::max(0, pos - window + 1) : 0;
    const KvType type = kv.type();
    float* row = kv_row_buf_[thread].data();  // (head_dim) one K or V row widened (reference path)
    // Head kvh of a K/V row of the cache, as floats (the reference path widens 16-bit and Q8_0 rows).
    auto row_f32 = [&](const void* r) -> const float* {
      const uint8_t* h = static_cast<const uint8_t*>(r) + kv_row_bytes(type, kvh * HD);
      if (type == KvType::f32) return reinterpret_cast<const float*>(h);
      if (type == KvType::q8_0) {
        (void)dequantize_row(TensorType::Q8_0, h, row, HD);
        return row;
      }
      const uint16_t* u = reinterpret_cast<const uint16_t*>(h);
      for (int i = 0; i < HD; i++) row[i] = type == KvType::bf16 ? bf16_to_fp32(u[i]) : fp16_to_fp32(u[i]);
      return row;
    };
    if (k_fast_) {
      scores_of(kv, il, j0, pos, kvh, &q_[t * NQ + h0 * HD], group, scores + j0, n_ctx, thread);
    } else {
      for (int j = j0; j <= pos; j++) {
        const float* kj = row_f32(kv.k(il, j));
        for (int g = 0; g < group; g++) scores[g * n_ctx + j] = dot(&q_[t * NQ + (h0 + g) * HD], kj, HD) * c_.attn_scale;
      }
    }
    if (c_.attn_logit_softcap > 0)
      for (int g = 0; g < group; g++)
        for (int j = j0; j <= pos; j++)
          scores[g * n_ctx + j] = c_.attn_logit_softcap * std::tanh(scores[g * n_ctx + j] / c_.attn_logit_softcap);
    float inv_sum[kMaxGroup];
    for (int g = 0; g < group; g++) {
      float* sg = scores + g * n_ctx;
      const float mx = *std::max_element(sg + j0, sg + pos + 1);
      float sum = 0;
      if (k_fast_) {
        sum = k_fast_->exp_sum(sg + j0, pos + 1 - j0, mx);
      } else {
        for (int j = j0; j <= pos; j++) {
          sg[j] = std::exp(sg[j] - mx);
          sum += sg[j];
        }
      }
      inv_sum[g] = 1.f / sum;
      std::fill(&xb_[t * NQ + (h0 + g) * HD], &xb_[t * NQ + (h0 + g) * HD] + HD, 0.f);
    }
    if (k_fast_) {
      // Probabilities in place, the value rows by pointer (the cache is paged).
      for (int g = 0; g < group; g++)
        for (int j = j0; j <= pos; j++) scores[g * n_ctx + j] *= inv_sum[g];
      weighted_sum_of(kv, il, j0, pos, kvh, scores + j0, n_ctx, group, &xb_[t * NQ + h0 * HD], HD, thread);
      return;
    }
    for (int j = j0; j <= pos; j++) {
      const float* vj = row_f32(kv.v(il, j));
      for (int g = 0; g < group; g++) {
        float* out = &xb_[t * NQ + (h0 + g) * HD];
        const float a = scores[g * n_ctx + j] * inv_sum[g];
        for (int i = 0; i < HD; i++) out[i] += a * vj[i];
      }
    }
  }

  std::shared_ptr<const Model> model_;
  const ModelConfig& c_;
  const ModelWeights& w_;
  ThreadPool pool_;
  int max_batch_;
  uint64_t computed_ = 0;  // positions_computed()
  // Scratch, allocated once (shapes for a batch of T <= max_batch tokens):
  std::vector<float> x_;    // (T, n_embd) residual stream
  std::vector<float> xb_;   // (T, max(n_embd, n_head*head_dim)) normed input / attention output
  std::vector<float> xb2_;  // (T, n_embd) branch output
  std::vector<float> q_;    // (T, n_head*head_dim)
  std::vector<float> k_;    // (T, n_head_kv*head_dim)
  std::vector<float> v_;    // (T, n_head_kv*head_dim)
  std::vector<float> hb_;   // (T, n_ff) gate, then gated hidden
  std::vector<float> hb2_;  // (T, n_ff) up
  std::vector<std::vector<float>> row_buf_;      // per thread: one dequantized weight row
  std::vector<std::vector<float>> score_buf_;    // per thread: (group, n_ctx) attention scores
  std::vector<std::vector<const float*>> vrow_buf_;  // per thread: (n_ctx) K or V rows of one KV head (F32 cache)
  std::vector<std::vector<const uint16_t*>> hrow_buf_;  // per thread: the same for an F16 cache
  std::vector<std::vector<const uint8_t*>> qrow_buf_;   // and for a Q8_0 cache
  std::vector<std::vector<float>> part_buf_;  // per thread: (tile tokens, parts, group, head_dim + 2) a tile's key parts
  std::vector<int> tile_first_, tile_len_;   // (max_batch) attention's tiles of tokens: first row, rows
  const uint8_t* embd_repacked_ = nullptr;  // a tied Q8_0 embedding's repacked rows (null: read the file's)
  size_t embd_row_bytes_ = 0;
  std::vector<float> split_buf_;  // (rows < pool size, parts, group, head_dim + 2) parts split among threads
  std::vector<std::vector<float>> kv_row_buf_;        // per thread: (head_dim) one widened row (reference path)
  std::vector<KvCache*> tok_kv_;  // (T) the sequence of each token of the batch
  std::vector<int> tok_pos_;      // (T) its position in that sequence
  std::vector<int32_t> tok_id_;   // (T) the token
  std::vector<float> logits_buf_;  // (rows, n_vocab) logits of a batch of several sequences
  std::vector<float> rope_cs_;  // (2 bases, T, n_rot) cos/sin pairs of this forward's positions
  int rope_ready_ = 0;          // bit b: rope_cs_ of base b filled for this forward
  const cpu::Kernels* k_fast_;                   // null: the reference path
  bool repack_;                                  // repack the matrices at load (fast path)
  std::vector<cpu::ActQ8> act_;                  // (T, n_in / 32) quantized input of the last matmul
  const float* act_of_ = nullptr;                // which input act_ holds (null: none)
  std::vector<cpu::ActQ8> act_lo_;               // (T, n_in / 32) residual quantization (precise products)
  const float* lo_of_ = nullptr;                 // which input act_lo_ holds
  std::unordered_map<const uint8_t*, Repacked> repacked_;  // original data -> repacked rows
  std::vector<cpu::ActGroup> act_g_, act_lo_g_;  // (T, groups) of act_ and act_lo_ for repacked rows
  const float* groups_of_ = nullptr;             // which input act_g_ holds
  const float* lo_groups_of_ = nullptr;
  std::vector<float> resid_;                     // (T, n_in) the residual itself
};

}  // namespace

namespace {

Result<std::unique_ptr<Backend>> make_cpu(std::shared_ptr<const Model> model, int n_threads, int max_batch,
                                         const cpu::Kernels* kernels, bool repack) {
  if (!model) return invalid_argument("no model");
  if (n_threads < 1 || n_threads > 256) return invalid_argument("threads must be from 1 to 256");
  if (max_batch < 1) return invalid_argument("batch size must be at least 1");
  auto b = std::make_unique<CpuBackend>(std::move(model), n_threads, max_batch, kernels, repack);
  PHASELAB_TRY(b->init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace

std::string cpu_kernels_isa(const std::string& isa_cap) { return cpu::best_kernels(isa_cap).isa; }

Result<std::unique_ptr<Backend>> make_cpu_reference_backend(std::shared_ptr<const Model> model, int n_threads, int max_batch) {
  return make_cpu(std::move(model), n_threads, max_batch, nullptr, false);
}

Result<std::unique_ptr<Backend>> make_cpu_backend(std::shared_ptr<const Model> model, int n_threads, int max_batch,
                                                  bool portable_only, const CpuSwitches& sw) {
  return make_cpu(std::move(model), n_threads, max_batch,
                  portable_only ? &cpu::portable_kernels() : &cpu::best_kernels(sw.isa_cap), sw.repack);
}

}  // namespace phaselab
