// Launch functions of PhaseLab's CUDA kernels. Plain functions on raw device
// pointers with shapes and a stream; they know nothing of models. Every
// matrix is [n_in, n_out] in the GGUF layout: n_out rows of n_in values,
// row_bytes apart, in the tensor's own block format.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "phaselab/formats/tensor_type_id.h"

namespace phaselab::cuda {

// Scratch for the matrix-vector kernels' integer path: the input rows in
// 8 bits per block of 32 values (q: T * n_in int8, d: a float scale per
// block, max |x| / 127, values rounded to nearest even), quantized once per
// launch. With it, the block formats of q8_dot_supported take dp4a dot
// products of their quants with these (4 multiply-adds per instruction,
// the weights read as 32-bit words); the others, and launches without it
// (q == nullptr) or whose input exceeds cap values, take the float path.
// The result differs from the float path's by that rounding of x alone.
struct Q8Act {
  int8_t* q = nullptr;
  float* d = nullptr;
  size_t cap = 0;      // values q holds (d holds cap / 32 scales)
  bool ready = false;  // q and d already hold the input's quantization (written with it: launch_rmsnorm's q8_out)
};
bool q8_dot_supported(TensorType type);
// x (T, n) in 8 bits (n a multiple of 32; T * n <= q8.cap).
cudaError_t launch_quantize_q8(const float* x, int T, int n, Q8Act q8, cudaStream_t s);

// x[t, :] = dequant(embd row tokens[t]) * scale          x: (T, n_embd)
cudaError_t launch_embedding(const uint8_t* embd, TensorType type, size_t row_bytes, const int32_t* tokens, int T,
                             int n_embd, float scale, float* x, cudaStream_t s);

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w   x, out: (rows, n); w: (n); out may alias x
// q8_out (q8_out.q non-null; n a multiple of 32, rows * n <= cap): out is
// also written in 8 bits for the matrix-vector kernels that read it next
// (as launch_quantize_q8 would: pass them q8_out with ready set).
cudaError_t launch_rmsnorm(const float* x, const float* w, float* out, int rows, int n, float eps, cudaStream_t s,
                           Q8Act q8_out = {});

// out[i, :] = x[rows[i], :] for n_rows rows of n values   rows: device memory
cudaError_t launch_gather_rows(const float* x, const int* rows, int n_rows, int n, float* out, cudaStream_t s);

// x += y' with y' = rmsnorm(y) * post_w (or y when post_w is null), then
// out = rmsnorm(x) * w: a block's residual add between its post-norm and the
// next pre-norm in one pass.   x, y, out: (rows, n)
cudaError_t launch_add_rmsnorm(float* x, const float* y, const float* post_w, const float* w, float* out, int rows,
                               int n, float eps, cudaStream_t s, Q8Act q8_out = {});

// One layer of the paged K/V cache, laid out as the host's KvPool: blocks of
// kKvBlockTokens positions, each (n_layer, kKvBlockTokens, n_embd_kv); a
// sequence's block table (device memory, read by the kernels, so a captured
// graph stays valid as it grows) gives the block of every kKvBlockTokens
// positions. The row of position p: k + table[p / kKvBlockTokens] *
// block_stride + (p % kKvBlockTokens) * n_embd_kv.
constexpr int kKvBlockTokens = 16;
// How the cache stores its values (the host pool's KvType): F32, IEEE half
// or bfloat16, converted to and from F32 (round to nearest even) as the
// kernels read and write them, or Q8_0 blocks of 32 values (an F16 scale
// and 32 int8: 34 bytes), quantized as the CPU quantizes them (then heads
// must be whole blocks: head_dim a multiple of 32). Values are indexed
// alike in every type: value i of a Q8_0 cache is in block i / 32.
enum class KvElem : int { f32 = 0, f16 = 1, bf16 = 2, q8_0 = 3 };
// Bytes of n values (n a multiple of 32 for Q8_0).
__host__ __device__ inline size_t kv_values_bytes(KvElem e, size_t n) {
  return e == KvElem::f32 ? 4 * n : e == KvElem::q8_0 ? n / 32 * 34 : 2 * n;
}
struct KvPages {
  void* k = nullptr;           // the pool's K at this layer's first row of block 0
  void* v = nullptr;           // the same for V
  const int* table = nullptr;  // the batch's block tables: the block of each kKvBlockTokens positions
  size_t block_stride = 0;     // values from one block to the next
  KvElem elem = KvElem::f32;
};

// Where the rows of a batch belong. A batch holds the tokens of one or more
// sequences (continuous batching): row t is position pos[t] of the sequence
// whose block table begins at entry table_at[t] of KvPages::table. Both
// live in device memory, read by the kernels, so that a captured CUDA graph
// stays valid from one decode step to the next. One sequence: table_at[t] =
// 0 and pos[t] = pos[0] + t.
struct RowMap {
  const int* pos = nullptr;       // (T)
  const int* table_at = nullptr;  // (T)
};

// For each token: RMSNorm of every q and k head (q_norm / k_norm: (head_dim),
// or null to skip), RoPE at its row's position; q is updated in place, the
// k head (k itself is left as it was) and the v head are written to the
// cache row of that position. cos and sin are scaled by mscale (phi3's
// rope.scaling.attn_factor; 1 elsewhere).   q: (T, n_head, head_dim);
// k, v: (T, n_head_kv, head_dim); cache rows: (n_head_kv * head_dim)
// inv_freq (device memory, n_rot / 2 doubles: base^(-2i / n_rot), divided
// by freq_factors[i] where the model has them), or null: computed here, a
// double pow per pair of dimensions (slow: it was most of this kernel's
// 7.5 us per layer in Gemma 3 270M's decode on an H200). With the table the
// angle is reduced in double and its sine and cosine taken in float.
cudaError_t launch_qk_norm_rope_store(float* q, float* k, const float* v, const float* q_norm, const float* k_norm,
                                      KvPages cache, RowMap rows, int T, int n_head, int n_head_kv, int head_dim,
                                      int n_rot, float base, const float* freq_factors, float mscale, bool neox,
                                      float eps, cudaStream_t s, const double* inv_freq = nullptr);
// The table launch_qk_norm_rope_store takes, on the host (n_rot / 2 values).
void rope_inv_freq(double base, int n_rot, const float* freq_factors, double* out);
// launch_qk_norm_rope_store's arguments but q, k, v and T: what a
// launch_matvec3 of Q, K and V does after its products (its tail).
// head_counters: n_head + n_head_kv unsigneds of device memory, zero before
// the first use and left at zero.
struct QkRope {
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  KvPages cache{};
  RowMap rows{};
  int n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  float base = 0.f;
  const float* freq_factors = nullptr;
  float mscale = 1.f;
  bool neox = false;
  float eps = 0.f;
  const double* inv_freq = nullptr;
  unsigned* head_counters = nullptr;
};

// A gated feed-forward's activation: out = act(g) * u, or gpt-oss's clamped
// form g' * sigmoid(1.702 g') * (u' + 1) with g' = min(g, 7), u' = clamp(u,
// -7, 7) (the CPU reference's Activation).
enum class GateAct : int { silu = 0, gelu_tanh = 1, swiglu_oai = 2 };

// g = act(g) * u over n values (act: GELU-tanh or SiLU)
cudaError_t launch_gated_act(float* g, const float* u, size_t n, bool gelu, cudaStream_t s);
// x[t, :] += b over T rows of n values
cudaError_t launch_add_bias(float* x, const float* b, int T, int n, cudaStream_t s);
// y = cap * tanh(y / cap) over n values
cudaError_t launch_softcap(float* y, size_t n, float cap, cudaStream_t s);

// out[t, r] = W.row(r) . x[t, :] for T tokens: one warp per row, the weight
// row read once for up to 8 tokens at a time.   x: (T, n_in); out: (T, n_out)
//
// tail (optional): then launch_add_rmsnorm(tail->x, out, tail->post_w,
// tail->w, tail->out, T, n_out, tail->eps, s, tail->q8_out). For one row
// (T == 1) and a width add_norm_tail_fits, the launch's last block to
// finish does it instead of a launch of its own: a decoded token's residual
// adds and norms after the output projection and the FFN down cost no
// launch, with the values launch_add_rmsnorm gives, bitwise. counter: one
// unsigned of device memory, zero before the first use; the last block
// leaves it at zero again (one counter serves every launch of a stream,
// which run one after another).
struct AddNormTail {
  float* x = nullptr;  // the residual stream (T, n_out), updated
  const float* post_w = nullptr;
  const float* w = nullptr;
  float* out = nullptr;  // (T, n_out)
  float eps = 0.f;
  Q8Act q8_out{};
  unsigned* counter = nullptr;
};
// Whether a product of n_out rows can take its tail in its last block.
bool add_norm_tail_fits(int n_out);
cudaError_t launch_matvec(const uint8_t* w, TensorType type, size_t row_bytes, int n_in, int n_out, const float* x,
                          int T, float* out, cudaStream_t s, Q8Act q8 = {}, const AddNormTail* tail = nullptr);

// One matrix of a launch_matvec3: n_out rows in its block format, and where
// its (T, n_out) products go. n_out = 0: no matrix.
struct MatvecOut {
  const uint8_t* w = nullptr;
  TensorType type = TensorType::F32;
  size_t row_bytes = 0;
  int n_out = 0;
  float* out = nullptr;
};
// Three matrix-vector products of the same input in one launch (Q, K, V).
// rope (optional): then launch_qk_norm_rope_store(a.out, b.out, c.out, ...)
// with its arguments; for one row (T == 1) done by the launch itself, each
// head by the last of its rows' blocks to finish (the K head's with the V
// head's), with the values the separate launch gives, bitwise.
cudaError_t launch_matvec3(MatvecOut a, MatvecOut b, MatvecOut c, int n_in, const float* x, int T, cudaStream_t s,
                           Q8Act q8 = {}, const QkRope* rope = nullptr);

// out[t, r] = act(W_gate.row(r) . x[t, :]) * (W_up.row(r) . x[t, :]): the
// gated feed-forward's two products and its activation in one kernel.
// q8_out (optional; its own buffer, not q8's, and n_out a multiple of 32):
// out also in 8 bits for the down product (pass it q8_out with ready set),
// each 32 rows quantized by the last of their blocks to finish.
// group_counters: n_out / 32 unsigneds of device memory, zero before the
// first use and left at zero.
cudaError_t launch_matvec_gated(const uint8_t* w_gate, TensorType gate_type, size_t gate_row_bytes, const uint8_t* w_up,
                                TensorType up_type, size_t up_row_bytes, int n_in, int n_out, const float* x, int T,
                                bool gelu, float* out, cudaStream_t s, Q8Act q8 = {}, Q8Act q8_out = {},
                                unsigned* group_counters = nullptr);

// Causal attention of T queries over the paged cache, each at its row's
// position over its own sequence's keys (rows of any sequences), flash style: one warp per (query, head, split) streams its keys with
// an online softmax, so no score matrix is ever stored. With n_split > 1 the
// keys of each query are cut into n_split ranges (long contexts: more warps
// at work) whose partial results partials (attention_partials_floats) holds
// until a second kernel merges them.
// q: (T, n_head, head_dim); cache rows: (n_head_kv, head_dim);
// out: (T, n_head, head_dim). window > 0: keys at
// pos - k_pos >= window are masked. head_dim <= 512.
// q8_out (head_dim % 32 == 0): out is also written in 8 bits, as
// launch_rmsnorm's q8_out. head_counters (optional; T * n_head unsigneds of
// device memory, zero before the first use and left at zero): the merge is
// done by the kernel itself, by the last block of each query and head's
// ranges to finish, where n_split is a multiple of 4 (the same values).
// sinks (optional; n_head floats of device memory, gpt-oss): each head's
// learned logit joins its softmax's maximum and denominator (the weights
// sum to less than 1), as the CPU reference does.
cudaError_t launch_attention(const float* q, KvPages cache, RowMap rows, float* out, float* partials, int T, int n_head,
                             int n_head_kv, int head_dim, int window, float scale, float softcap, int n_split,
                             cudaStream_t s, Q8Act q8_out = {}, unsigned* head_counters = nullptr,
                             const float* sinks = nullptr);
// The same for a prefill chunk, tiled: the T rows are one sequence's, at
// consecutive positions (rows.pos[0] + t). One block per (tile of queries, KV
// head, key range) loads each tile of key and value rows into shared memory
// once for all its queries and the heads sharing the KV head (up to 16
// rows), so K/V leave global memory once per tile of queries rather than
// once per query and head. No score matrix either. With n_split > 1 the
// keys are cut into ranges (more blocks at work when there are few query
// tiles) merged as launch_attention does, partials sized by
// attention_partials_floats. Only where attention_tiled_fits (at most 16
// heads per KV head, head_dim <= 512).
cudaError_t launch_attention_tiled(const float* q, KvPages cache, RowMap rows, float* out, float* partials, int T,
                                   int n_head, int n_head_kv, int head_dim, int window, float scale, float softcap,
                                   int n_split, cudaStream_t s, const float* sinks = nullptr);
bool attention_tiled_fits(int n_head, int n_head_kv, int head_dim);
// Key ranges for the tiled kernel: about 4 blocks per SM, at least 64 of the
// n_keys keys per range, at most 32 ranges.
int attention_tiled_splits(int T, int n_head, int n_head_kv, int n_keys, int sm_count);
// Floats of partials for T queries and n_split ranges (0 when n_split == 1).
size_t attention_partials_floats(int T, int n_head, int head_dim, int n_split);
// Ranges per query: 1 when T * n_head warps already fill the GPU, else
// enough for about 256 warps in all, each range at least 16 of n_ctx keys,
// at most 64 (what the merge takes). (One warp walks its keys one after
// another: Gemma 3 270M's 4 heads in one range each took 19 us per layer on
// an H200 at 128 keys; at depth 2000, its 64 ranges decode 1101-1107
// tokens/s against 923-930 with at most 32, and 679-681 with 16.)
int attention_splits(int T, int n_head, int n_ctx);


// ---- mixture of experts ------------------------------------------------------
// An expert tensor (ffn_{gate,up,down}_exps): n_expert matrices of n_out rows
// of n_in values one after another, row_bytes apart; expert e's rows start
// at row e * n_out.
struct ExpertMats {
  const uint8_t* w = nullptr;
  TensorType type = TensorType::F32;
  size_t row_bytes = 0;
  int n_out = 0;  // rows per expert
  const float* bias = nullptr;  // (n_expert * n_out) each expert's bias (gpt-oss), or null
};
// The (token, slot) pairs of a pass grouped by expert (pair p = t * K + j:
// token t's j-th chosen expert), made on the device by launch_moe_group:
// order (T * K): the pairs, expert by expert, ascending within each;
// offsets, counts (E): where each expert's pairs start and how many;
// active (E + 1): the experts with pairs, ascending, then their number.
struct MoeGroups {
  int* order = nullptr;
  int* offsets = nullptr;
  int* counts = nullptr;
  int* active = nullptr;
};
constexpr int kMoeMaxUsed = 16;  // experts per token at most (Qwen3 MoE: 8, Mixtral: 2)
// The router's choice: from its logits (T, E), softmax over the E experts,
// the K most likely (ties: the lower index), their probabilities
// (renormalised to sum 1 when norm), by ascending expert id. top_k_first
// (gpt-oss's ExpertGating::softmax_top_k): the K largest logits, then a
// softmax over those K.
// sel, w: (T, K).
cudaError_t launch_moe_route(const float* logits, int T, int E, int K, bool norm, bool top_k_first, int* sel, float* w,
                             cudaStream_t s);
// g from sel (T, K).
cudaError_t launch_moe_group(const int* sel, int T, int K, int E, MoeGroups g, cudaStream_t s);
// out[p, r] = act(gate_e.row(r) . x[p / K], up_e.row(r) . x[p / K]) for
// each pair p of each expert e (each product plus its expert's bias where
// the matrices have one), each expert's rows read once for up to 8 of its
// pairs.   x: (T, n_in); out: (T * K, n_out). q8: as launch_matvec's.
cudaError_t launch_moe_gated(ExpertMats gate, ExpertMats up, int n_in, const float* x, int T, int K, MoeGroups g, int E,
                             GateAct act, float* out, cudaStream_t s, Q8Act q8 = {});
// out[p, :] = down_e . h[p, :] (+ its bias) for each pair p of each expert e.
// h: (T * K, n_in); out: (T * K, n_out). q8: for T * K rows.
cudaError_t launch_moe_down(ExpertMats down, int n_in, const float* h, int T, int K, MoeGroups g, int E, float* out,
                            cudaStream_t s, Q8Act q8 = {});
// out[t, :] = sum over j of w[t, j] * y[t * K + j, :] (j in order).
// y: (T * K, D); w: (T, K); out: (T, D).
cudaError_t launch_moe_combine(const float* y, const float* w, int T, int K, int D, float* out, cudaStream_t s);

// ---- prefill matrix products through cuBLAS -------------------------------
// out (T, n_out) = x (T, n_in) . W^T on the tensor cores: W dequantized to
// BF16 in slabs of rows (w16: at least n_in values; the more, the fewer GEMM
// calls), x converted to BF16 (x16: T * n_in values), FP32 accumulation and
// output. BF16 rather than FP16: Gemma 3's activations overflow FP16's range
// (65504) in other engines. The handle must be bound to stream s.
cudaError_t launch_gemm_bf16(cublasHandle_t handle, const uint8_t* w, TensorType type, size_t row_bytes, int n_in,
                             int n_out, const float* x, int T, float* out, __nv_bfloat16* w16, size_t w16_elems,
                             __nv_bfloat16* x16, cudaStream_t s);
// The same with W already BF16 (w16: n_out rows of n_in, resident): x
// converted (x16: T * n_in values), one GEMM.
cudaError_t launch_gemm_bf16_resident(cublasHandle_t handle, const __nv_bfloat16* w16, int n_in, int n_out,
                                      const float* x, int T, float* out, __nv_bfloat16* x16, cudaStream_t s);
// rows x n_in values of W (from its first row) as BF16, row-major.
cudaError_t launch_dequant_bf16(const uint8_t* w, TensorType type, size_t row_bytes, int n_in, int rows,
                                __nv_bfloat16* out, cudaStream_t s);
// out = (bf16) x over n values.
cudaError_t launch_to_bf16(const float* x, size_t n, __nv_bfloat16* out, cudaStream_t s);

// ---- sampling on the device ----------------------------------------------
// *out = argmax x[0..n) (the lowest index among equal maxima).
cudaError_t launch_argmax(const float* x, int n, int* out, cudaStream_t s);
// out[r] = argmax x[r * n .. (r + 1) * n) for n_rows rows (batched greedy decoding).
cudaError_t launch_argmax_rows(const float* x, int n_rows, int n, int* out, cudaStream_t s);
// Sampled decoding's passes over the vocabulary, where the logits are: for
// each drawn row, what the host sampler (engine/sampling/sampler.cpp) would
// compute of the whole row, bitwise (the same float operations in the same
// order: its exp polynomial, its 16 lanes per block of 1024, its double
// sums), so that a token drawn from it is the token the host draws.
// Untruncated rows (top-k, top-p and min-p off) are drawn here with the
// host's uniform number; the others come back as the tokens at or above a
// cutoff (at most cap of them), from which the host cuts and draws.
struct DrawRule {
  int32_t row;          // the row of x it reads
  int32_t untruncated;  // 1: no rule truncates: draw here at temperature 1/inv_t
  int32_t top_k;        // 0: off (else 0 < top_k < n)
  int32_t use_min_p;    // min-p on: its threshold is max + log_min_p
  float top_p;          // 1: off
  float log_min_p;      // log(min_p), as the host computes it
  float inv_t;          // 1 / temperature (untruncated rows; else unused)
  float pad = 0.f;
  double u;             // the draw's uniform number in [0, 1) (untruncated rows)
};
struct DrawResult {
  int32_t token;     // >= 0: the token (untruncated rows, or no finite logit); -1: the candidates
  int32_t complete;  // the cutoff is -inf or min-p's threshold: every token the rules may keep
  float max_logit;   // the row's largest logit (NaN ignored)
  float cutoff;      // the candidates are every token at or above it
  double total;      // sum exp(x - max) over the row, as the host sums it (at temperature 1/inv_t when untruncated)
  uint32_t n_cand;   // how many tokens are at or above cutoff (more than cap: only cap written)
  uint32_t pad = 0;
};
struct DrawCand {
  float logit;
  int32_t id;
};
// Bytes of work space for n_rows rows of n values.
size_t vocab_draw_work_bytes(int n_rows, int n);
// Where candidate j of row r goes in cand, for a launch of n_rows rows
// with room for cap candidates a row, head of them (1..cap) in front: every
// row's first head together (what most rows need: one copy brings them
// back), then each row's rest.
__host__ __device__ inline size_t draw_cand_index(int n_rows, int cap, int head, int r, int j) {
  return j < head ? static_cast<size_t>(r) * head + j
                  : static_cast<size_t>(n_rows) * head + static_cast<size_t>(r) * (cap - head) + (j - head);
}
// rules, res: n_rows entries; cand: n_rows * cap (draw_cand_index; in no
// particular order within a row); x: rows of n values; all device memory.
cudaError_t launch_vocab_draw(const float* x, int n, const DrawRule* rules, int n_rows, DrawResult* res,
                              DrawCand* cand, int cap, int head, void* work, cudaStream_t s);

}  // namespace phaselab::cuda
