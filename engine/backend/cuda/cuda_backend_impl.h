// The CUDA backend's host side, built into libphaselab_cuda.so and loaded at
// run time (engine/backend/cuda_loader.cpp), so that PhaseLab runs where CUDA
// or a GPU is missing. Only plain C crosses between the two (cuda_abi.h):
// the engine side keeps the host's books and hands this side views of them.
// The forward pass mirrors the CPU reference step by step; weights are
// uploaded once, still quantized, and dequantized inside the kernels.
//
// The K/V cache on the device is paged like the host's KvPool, block for
// block (same ids, same layout, the pool's value type; a pool is known by
// KvPool::id and a block's life by KvPool::generation): the full-attention
// layers' K/V in a part of every block, the sliding-window layers' in the
// pool's window parts, by the pool's window slots, so that those layers keep
// only their window on the device too. The kernels read it through each
// sequence's block table (and its window-slot table for the local layers):
// the host KvCache stays the bookkeeper (allocation, prefix reuse, copy on
// write, which window parts are given back) and its decisions hold for the
// device's K/V as they are. Pools made for this backend
// (kv_storage() = device) allocate no host K/V. Only what the host does to its own memory is mirrored: the
// copy of a partly filled block before it is written. The device records
// how many leading slots of each block it computed; positions the host holds
// but the device did not compute (a block from before the device pool
// existed) are recomputed from the host's tokens.
//
// A pass holds the tokens of one or more sequences (continuous batching):
// each is a row of every matrix product, so the weights are read once for
// all of them, and the kernels find each row's position and its sequence's
// block table in device memory (cuda::RowMap). Matrix products:
// quantized matrix-vector kernels for decode and small batches, cuBLAS BF16
// GEMMs (weights dequantized in slabs) from CudaSwitches::gemm_min_rows rows
// on (default 16). A decode pass (one token per sequence, last logits) is
// captured once per batch-size bucket (1, 2, 4, ... max_batch) as a CUDA
// graph and replayed, padded to its bucket: the rows' tokens, positions and
// changed block-table entries travel through pinned memory before the
// replay, and the only synchronisation is the one for the logits.
//
// The class is split by concern over the files of this directory (this
// header is private to them): cuda_backend.cpp (set-up, forward, the
// outputs, the library's C entry points), cuda_weights.cpp, cuda_device_kv.cpp,
// cuda_plan.cpp, cuda_graphs.cpp, cuda_forward_pass.cpp, cuda_profile.cpp.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda_abi.h"
#include "cuda_profile.h"
#include "kernels/kernels.h"
#include "phaselab/status.h"

namespace phaselab {

Status cuda_status(cudaError_t e, const char* what, const char* file, int line);
#define CUDA_TRY(expr) PHASELAB_TRY(cuda_status((expr), #expr, __FILE__, __LINE__))

// PhlCudaChunk::logits_mode (phaselab::LogitsMode's numbers).
constexpr int kLogitsNone = 0, kLogitsLast = 1, kLogitsAll = 2;

// What the passes read of the model's config.
struct DevConfig : PhlCudaConfig {
  int n_embd_kv() const { return n_head_kv * head_dim; }
  int n_embd_q() const { return n_head * head_dim; }
};

struct DevWeight {
  uint8_t* data = nullptr;
  TensorType type = TensorType::F32;
  int n_in = 0, n_out = 0;
  size_t row_bytes = 0;
  __nv_bfloat16* bf16 = nullptr;  // a resident BF16 copy for the prefill GEMMs (CudaSwitches::bf16_weights), or null
};

struct DevLayer {
  float *attn_norm = nullptr, *bq = nullptr, *bk = nullptr, *bv = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  float *post_attn_norm = nullptr, *ffn_norm = nullptr, *post_ffw_norm = nullptr;
  DevWeight wq, wk, wv, wo, w_gate, w_up, w_down;
  // A mixture-of-experts layer: the router, and each expert tensor as one
  // matrix of all the experts' rows (PhlCudaLayer).
  DevWeight router, gate_exps, up_exps, down_exps;
  bool moe() const { return router.data != nullptr; }
  double* rope_inv_freq = nullptr;  // (n_rot / 2) PhlCudaLayer::rope_inv_freq
  float rope_mscale = 1.f;          // PhlCudaLayer::rope_mscale
  // gpt-oss (null elsewhere): the attention output's bias, the heads' sink
  // logits, the router's and the experts' biases (PhlCudaLayer).
  float *bo = nullptr, *attn_sinks = nullptr, *router_b = nullptr;
  float *gate_exps_b = nullptr, *up_exps_b = nullptr, *down_exps_b = nullptr;

};

// The library's side of cuda_abi.h (PhlCudaDevice): the device, driven by
// the engine's CudaHostBackend (cuda_loader.cpp), which keeps the books.
class CudaDevice {
 public:
  // model: valid until init() returns (the weights are copied to the
  // device). sw: the switches make_cuda_backend's caller chose (the backend
  // reads no environment; backend_options_from_environment() is where the
  // PHASELAB_CUDA_* variables become them).
  CudaDevice(const PhlCudaModel& model, int max_batch, const PhlCudaSwitches& sw)
      : model_(&model),
        c_{model.config},
        max_batch_(max_batch),
        prof_(sw.profile),
        gemm_min_tokens_(std::max(2, sw.gemm_min_rows)),
        use_tiled_attention_(sw.tiled_attention != 0),
        use_graph_(sw.graphs != 0),
        use_q8_(sw.q8_act != 0),
        fused_tails_(sw.fused_tails),
        use_bf16_weights_(sw.bf16_weights != 0),
        use_draws_(sw.device_sampling != 0) {}

  ~CudaDevice() {
    if (prof_.on()) {
      cudaStreamSynchronize(stream_);
      prof_.print();
    }
    drop_graphs();
    if (cublas_) cublasDestroy(cublas_);
    for (void* p : allocations_) cudaFree(p);
    if (meta_stage_) cudaFreeHost(meta_stage_);
    if (draw_stage_) cudaFreeHost(draw_stage_);
    if (tables_stage_) cudaFreeHost(tables_stage_);
    if (wtables_stage_) cudaFreeHost(wtables_stage_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // cuda_backend.cpp: set-up, the pass over a batch and its outputs. The
  // table's calls, in the order cuda_abi.h gives: mirror_pool (in
  // cuda_device_kv.cpp, with restore and reserved), forward.
  Status init();
  Status forward(const PhlCudaChunk* chunks, int n_chunks);
  Status copy_outputs(const PhlCudaChunk* chunks, int n_chunks);
  // The sampled draws of a pass (PhlCudaChunk::draw): their passes over the
  // vocabulary (cuda::launch_vocab_draw) queued, in groups of kDrawRows
  // rows; take_draws gives each chunk its results once the stream is done.
  Status queue_draws(const PhlCudaChunk* chunks, int group);
  Status take_draws(const PhlCudaChunk* chunks, int group);
  Status fetch_logits(int i, float* out);

  Status mirror_pool(const PhlCudaPool& pool);
  Status restore(const PhlCudaSeq& seq);
  Status reserved(const PhlCudaSeq& seq, const PhlCudaReserve& r);
  // The KV transfer: rows of seq copied out (write false) or in (cuda_abi.h).
  Status kv_rows(const PhlCudaSeq& seq, int pos0, int n, const int32_t* first, uint8_t* const* k, uint8_t* const* v,
                 bool write);
  // Bytes of K/V the device holds (or will hold) for the pool.
  uint64_t kv_bytes(const PhlCudaPool& pool) const { return layout_of(pool).bytes(); }
  uint64_t positions_computed() const { return computed_; }

 private:
  // One sequence's rows in a pass: tokens at positions p0 .. p0 + n.
  struct Part {
    const PhlCudaSeq* seq = nullptr;  // its books (block table and all)
    const int32_t* tokens = nullptr;
    int p0 = 0, n = 0;
    int mode = kLogitsNone;
  };
  // A chunk whose attention takes the tiled kernel: rows [row, row + n),
  // whose last query sees n_keys keys.
  struct TiledChunk {
    int row = 0, n = 0, n_keys = 0;
  };
  // What enqueue() launches for the rows plan() laid out.
  struct Pass {
    int T = 0;              // rows
    int n_small = 0;        // rows [0, n_small): the one-warp-per-query attention
    int n_logits = 0;       // logits rows, in the parts' order
    int logits_first = -1;  // >= 0: they are rows [logits_first, + n_logits); else gathered by logit_rows
    int split_ctx = 0;      // keys the longest sequence may reach (the attention's key ranges)
    // cuBLAS for the matrix products: passes with a prompt chunk from
    // gemm_min_tokens_ rows on. A decode pass (one token per sequence, the
    // graphs' kind, padded or not) keeps the quantized matrix-vector kernels,
    // which read the weights as stored rather than a BF16 copy of them.
    bool gemm = false;
  };

  // cuda_device_kv.cpp: the device's K/V, mirroring the host pool (recomputation, ring, copy on write).
  Status copy_ring_slots(int w, int r, int s0, int s1);
  void free_ring();
  Status make_ring();
  Status copy_part(uint8_t* dk, uint8_t* dv, const uint8_t* sk, const uint8_t* sv, size_t bytes, int dst, int src);

  // How many leading slots of block b hold K/V the device computed in the
  // block's present life (0 after the host handed it out again).
  // (generation: the block's present one, PhlCudaSeq::generation.)
  int filled(int b, uint32_t generation) const {
    return filled_[b].generation == generation ? filled_[b].slots : 0;
  }
  void set_filled(int b, uint32_t generation, int slots) {
    filled_[b] = BlockFill{generation, static_cast<uint8_t>(slots)};
  }
  // The block of the first key that the query at position n sees in a
  // sliding-window layer (KvCache::first_window_block).
  int first_window_block(int n) const { return pool_window_ > 0 ? std::max(0, n - pool_window_ + 1) / kBlock : 0; }

  // A failed step's status, once the stream has finished what it had (the
  // staged copies must be done before the staging buffers are reused).
  Status after_sync(Status st) {
    cudaStreamSynchronize(stream_);
    return st;
  }

  // cuda_plan.cpp: the rows of a pass and what the kernels read of them.
  Status plan(int pad_to);
  Status upload_window_table(int i);
  void mark_written();

  // cuda_graphs.cpp: a pass as plain launches, or replayed from a captured graph.
  Status run_pass();

  // The smallest batch-size bucket (a power of two, or max_batch) for n
  // rows of one token each.
  int bucket_for(int n) const {
    int b = 1;
    while (b < n) b *= 2;
    return std::min(b, max_batch_);
  }

  Status run_decode_graph();
  void drop_graphs();

  static constexpr size_t kW16Elems = size_t{32} << 20;  // 64 MiB of BF16 weight rows per GEMM slab

  // cuda_weights.cpp: the weights' upload and the device allocations.
  Status upload_weights();
  uint64_t work_bytes() const;
  Status alloc(float** p, size_t n);
  void free_device(void* p);
  Status upload(const PhlCudaWeight& w, DevWeight* d);
  Status upload_vec(const PhlCudaVector& v, float** d);
  // The layer matrices' resident BF16 copies, where memory allows
  // (CudaSwitches::bf16_weights); bytes they take (0: none made).
  Status make_bf16_weights();
  void drop_bf16_weights();
  uint64_t bf16_bytes_ = 0;

  size_t partials_floats(int n_ctx) const;  // (cuda_device_kv.cpp)

  static constexpr int kBlock = cuda::kKvBlockTokens;
  static_assert(kBlock == PHASELAB_CUDA_KV_BLOCK_TOKENS, "the device pool mirrors the host's blocks");

  // The positions of each pass with which restore() recomputes through the
  // ring (which holds the window and one such pass).
  int ring_chunk() const { return std::min(max_batch_, 64); }

  // How the device stores a pool's K/V, each of K and V in two stores laid
  // out as the host pool's: the full-attention layers' part of every block,
  // (n_blocks + 1, n_full, kBlock, n_embd_kv), the last for padding rows;
  // and the sliding-window layers' window parts, (n_window + 1, n_local,
  // kBlock, n_embd_kv): the pool's window parts by their slots
  // (KvPool::window_slot), then one for padding rows. While restore()
  // recomputes positions in blocks whose parts the pool gave back, a ring of
  // `ring` parts more (as many as one of its passes reads: a window and a
  // chunk) holds the local layers' K/V.
  struct KvLayout {
    cuda::KvElem elem = cuda::KvElem::f32;
    int n_full = 0, n_local = 0;  // layers in each store
    int n_blocks = 0;             // the pool's blocks
    int n_window = 0, ring = 0;   // the pool's window parts; restore()'s ring's
    size_t n_embd_kv = 0;
    size_t full_block_bytes() const { return cuda::kv_values_bytes(elem, n_full * kBlock * n_embd_kv); }
    size_t window_block_bytes() const { return cuda::kv_values_bytes(elem, n_local * kBlock * n_embd_kv); }
    int full_parts() const { return n_blocks + 1; }
    int window_parts() const { return n_local > 0 ? n_window + 1 : 0; }
    int pad_window_part() const { return n_window; }
    uint64_t store_bytes(bool window) const {
      return window ? uint64_t{window_block_bytes()} * window_parts() : uint64_t{full_block_bytes()} * full_parts();
    }
    uint64_t bytes() const { return 2 * (store_bytes(false) + store_bytes(true)); }  // K and V
  };
  KvLayout layout_of(const PhlCudaPool& pool) const;
  // PhlCudaPool::kv_type (phaselab::KvType's numbers) as the kernels name it.
  static cuda::KvElem elem_of(int kv_type) {
    return kv_type == 1   ? cuda::KvElem::f16
           : kv_type == 2 ? cuda::KvElem::bf16
           : kv_type == 3 ? cuda::KvElem::q8_0
                          : cuda::KvElem::f32;
  }

  // (cuda_device_kv.cpp)
  Status ensure_slots(int n);
  cuda::KvPages pages(int il) const;
  // Rows [r, ...) of the pass.
  cuda::RowMap row_map(int r = 0) const { return cuda::RowMap{meta_ + max_batch_ + r, meta_ + 2 * max_batch_ + r}; }

  // cuda_forward_pass.cpp: every kernel of a pass.
  // x_q8: x's 8-bit copy is already in q8 (q8_ where null; written by the
  // kernel that wrote x). tail: the residual add and norms after the
  // product (cuda::AddNormTail), in its last block where the pass is one of
  // matrix-vector products, else launched after it.
  Status matvec(const DevWeight& w, const float* x, int T, float* out, bool gemm, bool x_q8 = false,
                const cuda::AddNormTail* tail = nullptr, const cuda::Q8Act* q8 = nullptr);
  Status attention(int il, const Pass& ps, cuda::Q8Act q8_out = {});
  cuda::QkRope qk_rope(int il) const;
  Status enqueue(const Pass& ps);

  const PhlCudaModel* model_;  // until init() returns
  DevConfig c_;
  std::vector<int> layer_window_;       // (n_layer) ModelConfig::window_of
  std::vector<float> layer_rope_base_;  // (n_layer) ModelConfig::rope_base_of
  int max_batch_;
  StepProfile prof_;  // CudaSwitches::profile
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
  DevWeight tok_embd_, output_;
  float *output_norm_ = nullptr, *rope_ff_ = nullptr;
  std::vector<DevLayer> layers_;
  // Work buffers for a batch of T <= max_batch rows (as in the CPU backend).
  float *x_ = nullptr, *xb_ = nullptr, *xb2_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr;
  float *hb_ = nullptr, *hb2_ = nullptr, *logits_ = nullptr;
  // Mixture of experts (c_.n_expert > 0), for B rows of K chosen experts:
  // the router's logits (B, E), the choice and its weights (B, K), the
  // pairs grouped by expert, the experts' hidden rows (B * K, n_ff_exp) and
  // outputs (B * K, n_embd).
  float *router_ = nullptr, *moe_w_ = nullptr, *moe_h_ = nullptr, *moe_y_ = nullptr;
  int32_t* moe_sel_ = nullptr;
  cuda::MoeGroups moe_groups_{};
  Status moe_block(const DevLayer& L, int T, bool gemm, cuda::Q8Act xb_q8);
  static cuda::ExpertMats experts(const DevWeight& w, int rows_per_expert, const float* bias) {
    return cuda::ExpertMats{w.data, w.type, w.row_bytes, rows_per_expert, bias};
  }
  // The rows of a pass, max_batch entries per field: tokens, positions,
  // table offsets (the RowMap), logits rows; then the argmaxes. meta_stage_:
  // its pinned host copy (the first kUploadFields fields travel per pass).
  static constexpr int kMetaFields = 5, kUploadFields = 4, kNextField = 4;
  int32_t* meta_ = nullptr;
  int32_t* meta_stage_ = nullptr;
  int32_t* next_ = nullptr;  // meta_'s argmax field
  // The logits row of each chunk of the last pass (-1: none), for fetch_logits.
  std::vector<int> chunk_rows_;
  // Sampled draws on the device (CudaSwitches::device_sampling): up to
  // kDrawRows rows at a time, each with kDrawCap candidates' room. Device:
  // the rules, results and candidates, and the kernels' work space;
  // draw_stage_: the pinned host copy of the first three, one after another.
  // The first draw_head_ candidates of each row come back with the results,
  // the rest (where a row has more) by a second copy: kDrawHead, or an
  // eighth of a small vocabulary (so that the test model's rows take the
  // second copy too).
  static constexpr int kDrawRows = 64, kDrawCap = 4096, kDrawHead = 512;
  bool use_draws_;
  int draw_rows_ = 0;  // rows per group: min(max_batch, kDrawRows)
  int draw_head_ = kDrawHead;
  cuda::DrawRule* draw_rules_ = nullptr;
  cuda::DrawResult* draw_res_ = nullptr;
  cuda::DrawCand* draw_cand_ = nullptr;
  void* draw_work_ = nullptr;
  uint8_t* draw_stage_ = nullptr;
  std::vector<int> draw_chunks_;  // the chunks with a draw, in order
  size_t draw_bytes() const;      // device bytes of the above
  // cuBLAS for prefill (null below gemm_min_tokens_ batches)
  cublasHandle_t cublas_ = nullptr;
  // At least 2 (Pass::gemm keeps cuBLAS out of every decode pass, and so of the graphs).
  int gemm_min_tokens_;  // CudaSwitches::gemm_min_rows
  __nv_bfloat16 *w16_ = nullptr, *x16_ = nullptr;
  size_t w16_elems_ = 0;
  // The matrix-vector kernels' integer path (CudaSwitches::q8_act): the
  // input rows in 8 bits; q8_.q null when off.
  cuda::Q8Act q8_{};
  bool use_q8_;
  // Fused tails (CudaSwitches::fused_tails): in a decode pass of one token
  // the matrix-vector kernels' last blocks run the norms after the output
  // projection and the FFN down (tail_counter_: their count of finished
  // blocks), and the Q/K/V product's last block of each head its QK-norm,
  // RoPE and cache store (head_counters_); in any pass of matrix-vector
  // products the gated FFN kernel writes its activation in 8 bits for the
  // down product (q8_ffn_, beside q8_, which holds its input meanwhile;
  // ffn_group_counters_: one per 32 rows), and the attention kernel merges
  // its key ranges itself (attn_counters_: one per row and head).
  int fused_tails_;  // the mask: kTailNorms, kTailRope, kTailFfnQ8, kTailAttnMerge
  static constexpr int kTailNorms = 1, kTailRope = 2, kTailFfnQ8 = 4, kTailAttnMerge = 8;
  cuda::Q8Act q8_ffn_{};
  unsigned* tail_counter_ = nullptr;
  unsigned* ffn_group_counters_ = nullptr;
  unsigned* head_counters_ = nullptr;
  unsigned* attn_counters_ = nullptr;
  bool use_bf16_weights_;
  // Prefill attention from kTiledAttentionMin tokens of a sequence: the
  // tiled kernel (CudaSwitches::tiled_attention off: the one-warp-per-query
  // kernel throughout).
  static constexpr int kTiledAttentionMin = 4;
  int sm_count_ = 1;  // the GPU's multiprocessors (the tiled attention's key ranges)
  bool use_tiled_attention_;  // CudaSwitches::tiled_attention
  const bool tiled_fits_ = cuda::attention_tiled_fits(c_.n_head, c_.n_head_kv, c_.head_dim);
  // The decode graphs, one per batch-size bucket (valid for the current
  // device pool and tables).
  std::map<int, cudaGraphExec_t> graphs_;
  bool use_graph_;  // CudaSwitches::graphs
  // The pass being built: its parts (one per sequence), the row each part
  // starts at, the tiled attention's parts, and the layout.
  std::vector<Part> parts_;
  std::vector<int> row_of_;
  std::vector<TiledChunk> tiled_;
  Pass pass_;
  // The paged K/V pool mirroring the host's (KvLayout): the full layers'
  // parts of the blocks (pool_k_, pool_v_) and the window parts (pool_wk_,
  // pool_wv_), values of layout_.elem (the host pool's type); per layer whether it
  // is a local one and its index in its store; filled_: leading slots of
  // each block the device computed. scratch_: attention's partial results.
  uint8_t *pool_k_ = nullptr, *pool_v_ = nullptr, *pool_wk_ = nullptr, *pool_wv_ = nullptr;
  KvLayout layout_;
  // restore()'s ring (ring_mode_: the local layers' K/V go there).
  uint8_t *ring_k_ = nullptr, *ring_v_ = nullptr;
  int32_t* ring_table_ = nullptr;
  bool ring_mode_ = false;
  std::vector<uint8_t> layer_local_;
  std::vector<int> layer_index_;
  float* scratch_ = nullptr;
  // Block tables and window-slot tables: n_slots_ + 1 slots of table_cap_
  // entries each (the last is the pad slot), their pinned staging, and what
  // each slot holds on the device (-1: unknown).
  int32_t *tables_ = nullptr, *wtables_ = nullptr;
  int32_t *tables_stage_ = nullptr, *wtables_stage_ = nullptr;
  std::vector<std::vector<int>> slot_uploaded_, wslot_uploaded_;
  int n_slots_ = 0, table_cap_ = 0;
  uint64_t pool_id_ = 0;  // the host pool mirrored (KvPool::id)
  int pool_window_ = 0;   // its window (KvPool::window; 0: none)
  struct BlockFill {
    uint32_t generation = 0;  // the KvPool::generation the slots were computed in
    uint8_t slots = 0;        // leading slots computed
  };
  std::vector<BlockFill> filled_;
  uint64_t computed_ = 0;  // positions_computed()
};

}  // namespace phaselab
