// The CPU backend's class, shared by the files of its forward pass (internal
// to engine/backend/cpu):
//   cpu_backend.cpp    set-up, the forward pass step by step, the factories
//   cpu_matmul.cpp     matrix products: reference, 8-bit activations, repacked rows
//   cpu_attention.cpp  attention over each sequence's paged K/V cache
//   host_kv_store.h    the K/V bytes of the pools it runs
// Two flavours share everything but the innermost arithmetic:
//  - reference: weights dequantized a row at a time to F32, float dot
//    products in plain C++. The oracle.
//  - fast (the default "cpu" backend): activations quantized once per matrix
//    product to 8 bits per block of 32, integer dot products against the
//    weights' own block formats with SIMD kernels chosen for the CPU.
// Every buffer is allocated once. Batched prefill and token-by-token decode do
// the same arithmetic in the same order for every token, so their results are
// bitwise equal in both flavours.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <deque>
#include <unordered_map>
#include <vector>

#include "cpu_kernels.h"
#include "host_kv_store.h"
#include "phaselab/backend.h"
#include "phaselab/thread_pool.h"
#include "ref_ops.h"

namespace phaselab {

// Whether prefill's products may ask for lines for writing (cpu_matmul.cpp):
// on x86 whether CPUID has PREFETCHW; elsewhere true (a write hint).
bool cpu_has_prefetchw();

class CpuBackend final : public Backend {
 public:
  static constexpr int kMaxGroup = 64;  // query heads per KV head
  // kernels: null for the reference path. repack: rewrite the matrices for
  // the grouped kernels at load (CpuSwitches::repack; off keeps the file's
  // layout, for comparisons).
  CpuBackend(std::shared_ptr<const Model> model, int n_threads, int max_batch, const cpu::Kernels* kernels,
             const CpuSwitches& sw)
      : model_(std::move(model)), c_(model_->config()), w_(model_->weights()), pool_(n_threads), max_batch_(max_batch),
        k_fast_(kernels), repack_(sw.repack), huge_pages_(sw.huge_pages), decode_prefetch_bytes_(sw.decode_prefetch_bytes),
        decode_prefetch_hint_(sw.decode_prefetch_l2 ? cpu::PrefetchHint::t1 : cpu::PrefetchHint::nta),
        stream_prefetch_bytes_(sw.stream_prefetch_bytes), stream_ways_(std::clamp(sw.stream_ways, 1, kMaxStreamWays)),
        stream_chunks_(std::clamp(sw.stream_chunks, 1, kMaxStreamChunks)),
        row_tiles_(sw.row_tiles), decode_rows_(sw.decode_rows) {}

  // Allocates the work buffers (and repacks the weights): once.
  Status init();

  std::string name() const override { return k_fast_ ? std::string("cpu-") + k_fast_->isa : "cpu-reference"; }
  int max_batch() const override { return max_batch_; }
  uint64_t positions_computed() const override { return computed_; }
  // K/V of a host pool live in kv_store_ from its first pass (all of it).
  uint64_t kv_bytes(const KvPool& pool) const override {
    return pool.storage() == KvStorage::host ? pool.copy_bytes() : 0;
  }
  HostKvStore& kv_store() { return kv_store_; }
  bool pin_threads(const std::vector<int>& cpus) override { return pool_.pin(cpus); }
  bool apply_cpu_switches(const CpuSwitches& sw) override {
    if (!k_fast_) return false;  // the reference path has no such kernels
    decode_rows_ = sw.decode_rows;
    row_tiles_ = sw.row_tiles;
    decode_prefetch_bytes_ = std::clamp(sw.decode_prefetch_bytes, 0, kMaxPrefetchBytes);
    decode_prefetch_hint_ = sw.decode_prefetch_l2 ? cpu::PrefetchHint::t1 : cpu::PrefetchHint::nta;
    stream_prefetch_bytes_ = std::clamp(sw.stream_prefetch_bytes, 0, kMaxPrefetchBytes);
    stream_ways_ = std::clamp(sw.stream_ways, 1, kMaxStreamWays);
    stream_chunks_ = std::clamp(sw.stream_chunks, 1, kMaxStreamChunks);
    return true;
  }
  void run_host_tasks(int n, const std::function<void(int)>& fn) override {
    pool_.for_chunks(n, [&](int i, int) { fn(i); });
  }
  // The KV transfer (cpu_kv_rows.cpp).
  bool can_transfer_kv() const override { return true; }
  Status read_kv_rows(const KvCache& kv, int pos0, int n, const KvRows& rows) override;
  Status append_kv_rows(KvCache& kv, const int32_t* tokens, int n, const KvRows& rows) override;

  Status forward(const int32_t* tokens, int T, KvCache& kv, float* logits, LogitsMode mode) override {
    const SeqChunk chunk{&kv, tokens, T, mode, logits};
    return forward_batch(&chunk, 1);
  }

  bool batched_forward() const override { return true; }

  Status forward_residuals(const SeqChunk& chunk, std::vector<float>* residuals) override {
    residuals->assign(static_cast<size_t>(c_.n_layer + 1) * chunk.n_tokens * c_.n_embd, 0.f);
    capture_ = residuals->data();
    Status st = forward_batch(&chunk, 1);
    capture_ = nullptr;
    return st;
  }

  Status forward_ffn_activations(const SeqChunk& chunk, std::vector<double>* sumsq) override {
    if (sumsq->size() != static_cast<size_t>(c_.n_layer) * c_.n_ff)
      return invalid_argument("the activation sums need n_layer x n_ff entries");
    ffn_sq_ = sumsq->data();
    Status st = forward_batch(&chunk, 1);
    ffn_sq_ = nullptr;
    return st;
  }

  bool can_skip_layers() const override { return true; }
  Status forward_skipping(const SeqChunk& chunk, const std::vector<uint8_t>& skip,
                          const WeightView* head = nullptr) override {
    if (static_cast<int>(skip.size()) != c_.n_layer)
      return invalid_argument("a layer mask of " + std::to_string(skip.size()) + " entries for a model of " +
                              std::to_string(c_.n_layer) + " layers");
    if (head && (head->n_in != c_.n_embd || head->n_out < 1 || chunk.argmax))
      return invalid_argument("a draft's output matrix must take n_embd values and give its own logits (no argmax)");
    skip_ = skip.data();
    head_ = head;
    Status st = forward_batch(&chunk, 1);
    skip_ = nullptr;
    head_ = nullptr;
    return st;
  }

  // The tokens of every chunk, one after another, are the rows t = 0..T-1 of
  // every buffer below; tok_kv_[t] and tok_pos_[t] say whose and where.
  Status forward_batch(const SeqChunk* chunks, int n_chunks) override;

 private:
  // ---- the forward pass, step by step (cpu_backend.cpp) ----
  // Checks the batch, reserves its positions and lays its tokens out as rows
  // (tok_kv_, tok_pos_, tok_id_); grows the attention buffers to the longest
  // context. T: the rows; n_ctx_max: the largest n_ctx; n_logit_rows: the
  // rows that want logits.
  Status begin_batch(const SeqChunk* chunks, int n_chunks, int* T, int* n_ctx_max, int* n_logit_rows);
  Status embed(int T);  // x_ = the tokens' embeddings (T, n_embd)
  // Layer il's attention: x_ += attention(norm(x_)) with this batch's K/V
  // stored; then xb_ = the FFN's norm of x_ (in the same pass over the tokens).
  void attention_block(int il, int T, int n_ctx_max);
  // Layer il's feed-forward: x_ += ffn(xb_).
  void ffn_block(int il, int T);
  // A mixture-of-experts layer's feed-forward: x_ += moe(xb_). Each token's
  // experts from the router; then expert by expert (ascending), the rows
  // routed to it gathered and run through its three matrices as one batch,
  // so a decoded token reads only its experts and a batch reads each chosen
  // expert once. A token's sum over its experts is added in ascending expert
  // order whatever the batch, so batched and token-by-token passes agree
  // bitwise.
  void moe_block(int il, int T);
  // rows (n, width) += expert e's bias, b[e * width ..] (gpt-oss; none when b is empty).
  static void add_expert_bias(const std::vector<float>& b, int e, float* rows, int n, int width) {
    if (b.empty()) return;
    for (int i = 0; i < n; i++) ref::add(rows + static_cast<size_t>(i) * width, &b[static_cast<size_t>(e) * width], width);
  }
  // up = act(gate) * up over rows of width values (a gated FFN's hidden).
  // The result goes into the up rows, not the gate rows: in the fused
  // gate/up dispatch (matmul_jobs) the calling thread usually claims the
  // first chunk, so the pool's other threads mostly write the later rows,
  // the up matrix's (with two threads and a gate and up of one format, the
  // whole up matrix), and the calling thread runs this step of a decode
  // step. Lines another thread wrote and this one only read stay shared in
  // both cores' caches, and the writer's next store to each must first
  // take them back; where this thread writes them, the writer's next store
  // misses, and misses are fetched ahead. Gemma 3 270M, Zen 4 vCPUs on two
  // CCDs: the gate/up dispatch 0.83-0.85x the time it took with the result
  // in the gate rows (tokens alternating in one process; one CCD
  // 0.99-1.01x).
  void gate_rows(const float* gate, float* up, int rows, int width, Activation act);
  // The rows that want logits through the output matrix, into the chunks'
  // logits (and argmax).
  void output_logits(const SeqChunk* chunks, int n_chunks, int n_logit_rows);
  // One K or V row into the cache, in its type (half, bfloat16: rounded to
  // nearest even; Q8_0: quantized as a weight row is).
  void store_kv(const KvCache& kv, void* dst, const float* src, int n) const;
  SeqKv seq_kv(int t) const { return SeqKv(*tok_kv_[t], *tok_bytes_[t]); }  // token t's sequence's K/V

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

  // Chunks per thread of a product of T tokens: for decode (fewer than 4
  // tokens: memory-bound, each chunk's stream restarting cold) one (Gemma 3
  // 270M's layers -1% to -7% per token on Zen 5); for more tokens two, so
  // that a thread the OS has not scheduled leaves little behind.
  static int chunks_per_thread(int T) { return T < 4 ? 1 : 2; }
  // The same for a product whose matrix streams from memory (stream: over
  // kDecodeRowsMaxBytes, cpu_matmul.cpp): for fewer than 4 tokens (a decode
  // step; a prompt's last-token logits) stream_chunks_ a thread
  // (CpuSwitches::stream_chunks), claimed in turn so that the threads
  // finish together; one thread reads them in one.
  int chunks_per_thread(int T, bool stream) const {
    return T < 4 && stream && pool_.size() > 1 ? stream_chunks_ : chunks_per_thread(T);
  }
  // Splits rows [0, n) into chunks claimed by the pool's threads:
  // body(r0, r1, thread), per_thread chunks per thread (chunks_per_thread).
  // Chunks start at multiples of align.
  template <typename F>
  void for_rows(int64_t n, F&& body, int64_t align = 1, int per_thread = 2) {
    const int64_t n_chunks = std::clamp<int64_t>(n / 16, 1, per_thread * pool_.size());
    const int64_t per = ((n + n_chunks - 1) / n_chunks + align - 1) / align * align;
    pool_.for_chunks(static_cast<int>(n_chunks), [&](int c, int thread) {
      const int64_t r0 = c * per, r1 = std::min(n, r0 + per);
      if (r0 < r1) body(r0, r1, thread);
    });
  }

  // ---- matrix products (cpu_matmul.cpp) ----
  // Q4_0, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K rows rewritten for the grouped
  // kernels (cpu_kernels.h).
  // Memory for repacked weights: anonymous pages of its own, in 2 MiB pages
  // where asked and the kernel allows (MADV_HUGEPAGE on the 2 MiB-aligned
  // range, before the first write, so that faults take huge pages).
  class WeightBuffer {
   public:
    WeightBuffer() = default;
    WeightBuffer(WeightBuffer&& o) noexcept : p_(o.p_), n_(o.n_), map_(o.map_), map_n_(o.map_n_) {
      o.p_ = nullptr, o.map_ = nullptr, o.n_ = o.map_n_ = 0;
    }
    WeightBuffer& operator=(WeightBuffer&&) = delete;
    WeightBuffer(const WeightBuffer&) = delete;
    ~WeightBuffer();
    bool allocate(size_t n, bool huge_pages);  // once; false when the OS refuses
    uint8_t* data() { return p_; }
    const uint8_t* data() const { return p_; }
    size_t size() const { return n_; }

   private:
    uint8_t* p_ = nullptr;
    size_t n_ = 0;
    void* map_ = nullptr;
    size_t map_n_ = 0;
  };
  // A matrix's repacked rows: n_out rows of f.row_bytes at rows, in
  // repack_buffers_ (one buffer for all of a model's matrices, one after
  // another: repack_weights).
  struct Repacked {
    const uint8_t* rows = nullptr;
    cpu::RepackedFormat f;
  };
  // out[t, r] = W.row(r) · in[t, :] for T tokens. same_input: in is what the
  // previous matmul read (its quantized form is still in act_). precise: twice
  // the activation precision (matmul_fast).
  void matmul(const WeightView& W, const float* in, float* out, int T, bool same_input = false, bool precise = false);
  void matmul_fast(const WeightView& W, const float* in, float* out, int T, bool same_input, bool precise = false);
  void quantize_input(const float* in, int T, int64_t n_in, bool precise);
  void repack_weights();
  static void release_pages(const uint8_t* p, size_t n);
  // rows2: a refined product will run on the refined decode rows
  // (RepackedFormat::dot1_rows2): a lone token's act2_ and act2_g_ are filled.
  void prepare_repacked(const float* in, int T, int64_t n_in, bool precise, bool pairs, bool groups = true,
                        bool rows2 = false);
  // Whether rp's product with T tokens goes to the row tiles
  // (RepackedFormat::dot_row_tile, prefill-sized passes), its last rows
  // short of a tile to the other kernels.
  bool takes_row_tiles(const Repacked& rp, int T) const;
  // Whether it is all row tiles (n_out rows, a multiple of kRowTile, split
  // at multiples of it), which read act_ alone.
  bool row_tiled(const Repacked& rp, int T, int64_t n_out) const;
  cpu::DotPairsFn pairs_kernel(const Repacked& rp, int T) const;
  // pf_end (a lone token): where the rows' stream ends for the prefetch, past r1
  // where the chunk goes on into the next matrix in memory (matmul_jobs);
  // null: at row r1.
  void repacked_rows(const Repacked& rp, int64_t n_in, int64_t n_out, float* out, int T, bool precise, int64_t r0,
                     int64_t r1, int thread, const uint8_t* pf_end = nullptr);
  int64_t row_tiles(const Repacked& rp, int64_t n_in, int64_t n_out, float* out, int T, bool precise, int64_t r0,
                    int64_t r1, int thread);
  void repacked_tiles(const Repacked& rp, const uint8_t* trows, size_t tb, int64_t tr0, uint8_t* each, int64_t n_in,
                      int64_t n_out, float* out, int T, bool precise, int64_t r0, int64_t r1,
                      const uint8_t* pf_end = nullptr);
  // out_j = W_j · in for products of one input, in one parallel dispatch
  // (the fast path's repacked matrices; otherwise one matmul() each).
  struct MatmulJob {
    const WeightView* W;
    float* out;
    bool precise = false;
  };
  static constexpr int kMaxMatmulJobs = 4;
  void matmul_jobs(const MatmulJob* jobs, int n_jobs, const float* in, int T, bool same_input);
  void matmul_repacked(const WeightView& W, const Repacked& rp, const float* in, float* out, int T, bool precise);
  // One token through several matrices of the same n_in in one dispatch
  // (fast path only): out = W · inputs[input] for each job.
  struct MatvecJob {
    const WeightView* W;
    int input;        // index into the inputs
    float* out;       // (W->n_out)
    int64_t first_row = 0;        // (filled in) its rows' place among all jobs'
    const Repacked* rp = nullptr; // (filled in) its repacked rows, if any
  };
  void matvec_many(MatvecJob* jobs, int n_jobs, const float* const* inputs, int n_inputs);

  // ---- attention (cpu_attention.cpp) ----
  // A row that sees more than kAttnPartKeys keys is attended in parts of
  // that many keys (see attention()). 256: a decode step of a layer with a
  // 512-key window (Gemma 3's local layers) splits over two threads, each
  // reading half the K/V from memory, where with 1024 one thread attended
  // alone (Gemma 3 270M tg128 @ d2000 +5-9% on Zen 4, alternating builds;
  // pp512 @ d2000 level, 0.99-1.01).
  static constexpr int kAttnPartKeys = 256;
  static constexpr int kAttnTileTokens = 4;  // rows of one sequence that share each part's K/V (prefill)
  void attention(int il, int T, int score_stride);  // -> xb_: (T, n_head*head_dim)
  void scores_of(const SeqKv& kv, int il, int a, int b, int kvh, const float* q, int G, float* s, int ss, int thread);
  void weighted_sum_of(const SeqKv& kv, int il, int a, int b, int kvh, const float* p, int ps, int G, float* out,
                       int os, int thread);
  void attend_part(int il, int t, int kvh, int a, int b, float* out, int thread, int n_ctx);
  void merge_parts(int il, int wi, const float* parts, int P);
  void attend_row(int il, int wi, int thread, int n_ctx);
  float dot(const float* a, const float* b, int64_t n) const { return k_fast_ ? k_fast_->dot(a, b, n) : ref::dot(a, b, n); }
  // RMS norm of n values (out may alias x): the kernel set's (a sum in
  // lanes, no chain of dependent adds), the reference path's own.
  void rmsnorm(float* out, const float* x, const float* w, int64_t n) const {
    if (k_fast_)
      k_fast_->rms_norm(out, x, w, n, c_.rms_eps);
    else
      ref::rmsnorm(out, x, w, n, c_.rms_eps);
  }

  std::shared_ptr<const Model> model_;
  const ModelConfig& c_;
  const ModelWeights& w_;
  ThreadPool pool_;
  int max_batch_;
  uint64_t computed_ = 0;  // positions_computed()
  const uint8_t* skip_ = nullptr;  // (n_layer) during forward_skipping: the layers left out
  const WeightView* head_ = nullptr;  // during forward_skipping: the output matrix in w_.output's place
  float* capture_ = nullptr;  // during forward_residuals: (n_layer + 1, T, n_embd)
  double* ffn_sq_ = nullptr;  // during forward_ffn_activations: (n_layer, n_ff) sums of h^2
  // Scratch, allocated once (shapes for a batch of T <= max_batch tokens):
  std::vector<float> x_;    // (T, n_embd) residual stream
  std::vector<float> xb_;   // (T, max(n_embd, n_head*head_dim)) normed input / attention output
  std::vector<float> xb2_;  // (T, n_embd) branch output
  std::vector<float> q_;    // (T, n_head*head_dim)
  std::vector<float> k_;    // (T, n_head_kv*head_dim)
  std::vector<float> v_;    // (T, n_head_kv*head_dim)
  std::vector<float> hb_;   // (T, n_ff) gate
  std::vector<float> hb2_;  // (T, n_ff) up, then the gated hidden (gate_rows)
  // Mixture of experts (allocated for MoE models only):
  std::vector<float> router_;   // (T, n_expert) router logits, then probabilities
  std::vector<float> moe_x_;    // (T, n_embd) the rows routed to one expert, gathered
  std::vector<float> moe_h_;    // (T, n_ff_exp) its gate
  std::vector<float> moe_h2_;   // (T, n_ff_exp) its up, then the gated hidden
  std::vector<float> moe_y_;    // (T, n_embd) its output rows
  std::vector<float> moe_slot_;  // (T, n_expert_used, n_embd) each token's experts' outputs
  std::vector<int> moe_sel_;    // (T, n_expert_used) each token's experts
  std::vector<float> moe_w_;    // (T, n_expert_used) their weights
  std::vector<std::vector<int>> exp_rows_;  // (n_expert) the slots t * k + j routed to each expert (capacity T)
  std::vector<MatvecJob> moe_jobs_;        // (2 * n_expert_used) a decoded token's expert products
  std::vector<const float*> moe_inputs_;   // (n_expert_used) their inputs
  std::vector<cpu::ActQ8> many_act_;       // (n_expert_used, max_in / 32) matvec_many's quantized inputs
  std::vector<cpu::ActGroup> many_act_g_;  // (n_expert_used, groups) and their groups
  std::vector<std::vector<float>> row_buf_;      // per thread: one dequantized weight row
  // Per thread: rows stored packed (Q5_0 on AVX-512) rewritten for the tile
  // kernels (RepackedFormat::unpack), kUnpackRows of them, 64-byte aligned.
  std::vector<std::vector<uint8_t>> unpack_buf_;
  // Per thread: a row tile (RepackedFormat::tile_rows) and, for packed rows,
  // the kRowTile rows unpacked (sized at load for the widest), 64-byte aligned.
  std::vector<std::vector<uint8_t>> tile_buf_;
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
  HostKvStore kv_store_;          // K/V of the pools run here
  std::vector<KvCache*> tok_kv_;  // (T) the sequence of each token of the batch
  std::vector<HostKv*> tok_bytes_;  // (T) its pool's K/V
  std::vector<int> tok_pos_;      // (T) its position in that sequence
  std::vector<int32_t> tok_id_;   // (T) the token
  std::vector<float> logits_buf_;  // (rows, n_vocab) logits of a batch of several sequences
  std::vector<float> rope_cs_;  // (2 bases, T, n_rot) cos/sin pairs of this forward's positions
  int rope_ready_ = 0;          // bit b: rope_cs_ of base b filled for this forward
  const cpu::Kernels* k_fast_;                   // null: the reference path
  bool repack_;                                  // repack the matrices at load (fast path)
  bool huge_pages_;                              // ... into 2 MiB pages (CpuSwitches::huge_pages)
  int decode_prefetch_bytes_;                    // CpuSwitches::decode_prefetch_bytes
  cpu::PrefetchHint decode_prefetch_hint_;       // CpuSwitches::decode_prefetch_l2
  int stream_prefetch_bytes_;                    // CpuSwitches::stream_prefetch_bytes
  int stream_ways_;                              // CpuSwitches::stream_ways
  int stream_chunks_;                            // CpuSwitches::stream_chunks
  bool row_tiles_;                               // CpuSwitches::row_tiles
  const bool prefetch_w_ = cpu_has_prefetchw();  // prefill's output lines asked for writing (cpu_matmul.cpp)
  bool decode_rows_;                             // CpuSwitches::decode_rows
  // Rows of row_bytes in decode_prefetch_bytes_ (rounded up; 0: none).
  int64_t decode_prefetch_rows(size_t row_bytes) const {
    return (decode_prefetch_bytes_ + static_cast<int64_t>(row_bytes) - 1) / static_cast<int64_t>(row_bytes);
  }
  // The same at stream_prefetch_bytes_ (matrices over kDecodeRowsMaxBytes).
  int64_t stream_prefetch_rows(size_t row_bytes) const {
    return (stream_prefetch_bytes_ + static_cast<int64_t>(row_bytes) - 1) / static_cast<int64_t>(row_bytes);
  }
  std::vector<cpu::ActQ8> act_;                  // (T, n_in / 32) quantized input of the last matmul
  const float* act_of_ = nullptr;                // which input act_ holds (null: none)
  std::vector<cpu::ActQ8> act_lo_;               // (T, n_in / 32) residual quantization (precise products)
  const float* lo_of_ = nullptr;                 // which input act_lo_ holds
  std::unordered_map<const uint8_t*, Repacked> repacked_;  // original data -> repacked rows
  std::deque<WeightBuffer> repack_buffers_;                 // the memory repacked_ points into
  std::vector<cpu::ActGroup> act_g_, act_lo_g_;  // (T, groups) of act_ and act_lo_ for repacked rows
  const float* groups_of_ = nullptr;             // which input act_g_ holds
  const float* lo_groups_of_ = nullptr;
  // A lone token's act_ and act_lo_ one after the other (2, n_in / 32), and
  // its act_g_ and act_lo_g_ (2, groups), for the refined decode rows
  // (RepackedFormat::dot1_rows2); act2_of_: which input they hold.
  std::vector<cpu::ActQ8> act2_;
  std::vector<cpu::ActGroup> act2_g_;
  const float* act2_of_ = nullptr;
  std::vector<cpu::ActPair> act_p_, act_lo_p_;   // (T / 2, groups) of act_g_ and act_lo_g_ in pairs of tokens
  const float* pairs_of_ = nullptr;              // which input act_p_ holds
  const float* lo_pairs_of_ = nullptr;
  std::vector<float> resid_;                     // (T, n_in) the residual itself
};

}  // namespace phaselab
