// Attention of the CPU backend (cpu_backend.h): each query row over its own
// sequence's paged K/V cache, the query heads of a KV head together, long
// rows in parts of kAttnPartKeys keys merged in order.
#include <algorithm>
#include <cmath>

#include "cpu_backend.h"
#include "phaselab/quant.h"

namespace phaselab {

namespace {

constexpr int kMaxSplitRows = 64;  // rows split among threads at most

}  // namespace


// Scores of the G query heads q (G, head_dim) sharing KV head kvh
// against the keys [a, b] of layer il: s[g * ss + j - a]; and the sum of
// the value rows [a, b] weighted by p[g * ps + j - a], added to out[g *
// os ..]. The fast kernels of the cache's type, the key and value rows by
// pointer (the cache is paged).
void CpuBackend::scores_of(const SeqKv& kv, int il, int a, int b, int kvh, const float* q, int G, float* s, int ss,
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

void CpuBackend::weighted_sum_of(const SeqKv& kv, int il, int a, int b, int kvh, const float* p, int ps, int G,
                                 float* out, int os, int thread) {
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
void CpuBackend::attention(int il, int T, int score_stride) {
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
    // and values (256 KiB in F16 for Gemma 3's head) serve every token of
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
        merge_parts(il, (t0 + i) * c_.n_head_kv + kvh, parts + static_cast<size_t>(i) * P_last * part_size, n_parts(t0 + i));
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
    if (first[wi + 1] - first[wi] > 1) merge_parts(il, wi, split_buf_.data() + first[wi] * part_size, first[wi + 1] - first[wi]);
}

// Keys [a, b] of row (t, kvh): the part's unnormalised output (group,
// head_dim), then its maxima (group) and sums of exponentials (group).
void CpuBackend::attend_part(int il, int t, int kvh, int a, int b, float* out, int thread, int n_ctx) {
  const int HD = c_.head_dim, NQ = c_.n_embd_q(), group = c_.n_head / c_.n_head_kv, h0 = kvh * group, n = b - a + 1;
  const SeqKv kv = seq_kv(t);
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
// each part weighted by exp(its maximum - the row's) / the row's sum (with
// the head's sink logit in both, where the model has sinks).
void CpuBackend::merge_parts(int il, int wi, const float* parts, int P) {
  const std::vector<float>& sinks = w_.layers[il].attn_sinks;
  const int HD = c_.head_dim, NQ = c_.n_embd_q(), group = c_.n_head / c_.n_head_kv;
  const int t = wi / c_.n_head_kv, h0 = (wi % c_.n_head_kv) * group;
  const size_t part_size = static_cast<size_t>(group) * (HD + 2);
  for (int g = 0; g < group; g++) {
    auto mx = [&](int p) { return parts[p * part_size + group * HD + g]; };
    auto sum = [&](int p) { return parts[p * part_size + group * HD + group + g]; };
    float m = mx(0);
    for (int p = 1; p < P; p++) m = std::max(m, mx(p));
    if (!sinks.empty()) m = std::max(m, sinks[h0 + g]);
    float total = 0;
    for (int p = 0; p < P; p++) total += sum(p) * std::exp(mx(p) - m);
    if (!sinks.empty()) total += std::exp(sinks[h0 + g] - m);
    float* out = &xb_[t * NQ + (h0 + g) * HD];
    std::fill(out, out + HD, 0.f);
    for (int p = 0; p < P; p++) k_fast_->axpy(out, std::exp(mx(p) - m) / total, parts + p * part_size + g * HD, HD);
  }
}

// Row wi = (token, KV head) over all its keys in one pass.
void CpuBackend::attend_row(int il, int wi, int thread, int n_ctx) {
  const int HD = c_.head_dim, NQ = c_.n_embd_q();
  const int group = c_.n_head / c_.n_head_kv;
  const int window = c_.window_of(il);
  float* scores = score_buf_[thread].data();  // (group, n_ctx)
  const int t = wi / c_.n_head_kv, kvh = wi % c_.n_head_kv;
  const SeqKv kv = seq_kv(t);
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
  // gpt-oss: each head's sink logit joins the softmax's maximum and sum
  // (a key that every row sees and whose value is zero).
  const std::vector<float>& sinks = w_.layers[il].attn_sinks;
  float inv_sum[kMaxGroup];
  for (int g = 0; g < group; g++) {
    float* sg = scores + g * n_ctx;
    float mx = *std::max_element(sg + j0, sg + pos + 1);
    if (!sinks.empty()) mx = std::max(mx, sinks[h0 + g]);
    float sum = 0;
    if (k_fast_) {
      sum = k_fast_->exp_sum(sg + j0, pos + 1 - j0, mx);
    } else {
      for (int j = j0; j <= pos; j++) {
        sg[j] = std::exp(sg[j] - mx);
        sum += sg[j];
      }
    }
    if (!sinks.empty()) sum += std::exp(sinks[h0 + g] - mx);
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

}  // namespace phaselab
