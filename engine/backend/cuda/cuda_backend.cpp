// The CUDA backend's host side, built into libphaselab_cuda.so and loaded at
// run time (engine/backend/cuda_loader.cpp), so that PhaseLab runs where CUDA
// or a GPU is missing. The forward pass mirrors the CPU reference step by
// step; weights are uploaded once, still quantized, and dequantized inside the
// kernels.
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
// GEMMs (weights dequantized in slabs) from PHASELAB_CUDA_GEMM_MIN rows on
// (default 16). A decode pass (one token per sequence, last logits) is
// captured once per batch-size bucket (1, 2, 4, ... max_batch) as a CUDA
// graph and replayed, padded to its bucket: the rows' tokens, positions and
// changed block-table entries travel through pinned memory before the
// replay, and the only synchronisation is the one for the logits.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "phaselab/backend.h"

namespace phaselab {

namespace {

Status cuda_status(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return Status::ok();
  return internal_error(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in " + what +
                        " at " + file + ":" + std::to_string(line));
}
#define CUDA_TRY(expr) PHASELAB_TRY(cuda_status((expr), #expr, __FILE__, __LINE__))

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && std::atoi(v) > 0 ? std::atoi(v) : fallback;
}

struct DevWeight {
  uint8_t* data = nullptr;
  TensorType type = TensorType::F32;
  int n_in = 0, n_out = 0;
  size_t row_bytes = 0;
};

struct DevLayer {
  float *attn_norm = nullptr, *bq = nullptr, *bk = nullptr, *bv = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  float *post_attn_norm = nullptr, *ffn_norm = nullptr, *post_ffw_norm = nullptr;
  DevWeight wq, wk, wv, wo, w_gate, w_up, w_down;
};

// PHASELAB_CUDA_PROFILE=1: where the time of a forward pass goes. CUDA
// events between the steps of every forward (the decode graph is off then,
// so each step is timed on its own, launch gaps included), summed by phase
// (prefill: a batch; decode: one token) and step over all layers, and
// printed to stderr when the backend goes.
class StepProfile {
 public:
  StepProfile() {
    const char* v = std::getenv("PHASELAB_CUDA_PROFILE");
    on_ = v && std::strcmp(v, "0") != 0;
  }
  ~StepProfile() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  bool on() const { return on_; }

  // Starts a forward pass's timeline on stream s.
  Status begin(cudaStream_t s) {
    used_ = 0;
    return mark(nullptr, s);
  }
  // The time since the previous mark was step name's.
  Status mark(const char* name, cudaStream_t s) {
    if (!on_) return Status::ok();
    if (used_ == static_cast<int>(events_.size())) {
      cudaEvent_t e = nullptr;
      if (cudaEventCreate(&e) != cudaSuccess) return internal_error("CUDA profile: cudaEventCreate failed");
      events_.push_back(e);
      names_.push_back(nullptr);
    }
    names_[used_] = name;
    if (cudaEventRecord(events_[used_], s) != cudaSuccess) return internal_error("CUDA profile: cudaEventRecord failed");
    used_++;
    return Status::ok();
  }
  // After the stream has synchronised: adds this pass's steps to the totals
  // of its phase ("prefill": a pass with a prompt chunk; "decode": one token
  // per sequence), T rows.
  void collect(const char* phase, int T) {
    if (!on_) return;
    for (int i = 1; i < used_; i++) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, events_[i - 1], events_[i]) != cudaSuccess) continue;
      Total& t = totals_[phase][names_[i]];
      t.ms += ms;
      t.calls++;
    }
    passes_[phase]++;
    tokens_[phase] += T;
    used_ = 0;
  }
  void print() const {
    for (const auto& [phase, steps] : totals_) {
      double sum = 0;
      for (const auto& [name, t] : steps) sum += t.ms;
      std::vector<std::pair<std::string, Total>> rows(steps.begin(), steps.end());
      std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
      std::fprintf(stderr, "\nCUDA profile, %s: %ld passes, %ld tokens, %.3f ms per pass\n", phase.c_str(),
                   passes_.at(phase), tokens_.at(phase), sum / std::max(1L, passes_.at(phase)));
      std::fprintf(stderr, "| step | ms per pass | share | us per launch group |\n| --- | ---: | ---: | ---: |\n");
      for (const auto& [name, t] : rows)
        std::fprintf(stderr, "| %s | %.4f | %.1f%% | %.2f |\n", name.c_str(), t.ms / std::max(1L, passes_.at(phase)),
                     100.0 * t.ms / std::max(sum, 1e-12), 1e3 * t.ms / std::max(1L, t.calls));
    }
  }

 private:
  struct Total {
    double ms = 0;
    long calls = 0;
  };
  bool on_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> names_;
  int used_ = 0;
  std::map<std::string, std::map<std::string, Total>> totals_;
  std::map<std::string, long> passes_, tokens_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(std::shared_ptr<const Model> model, int max_batch)
      : model_(std::move(model)), c_(model_->config()), max_batch_(max_batch) {}

  ~CudaBackend() override {
    if (prof_.on()) {
      cudaStreamSynchronize(stream_);
      prof_.print();
    }
    drop_graphs();
    if (cublas_) cublasDestroy(cublas_);
    for (void* p : allocations_) cudaFree(p);
    if (meta_stage_) cudaFreeHost(meta_stage_);
    if (tables_stage_) cudaFreeHost(tables_stage_);
    if (wtables_stage_) cudaFreeHost(wtables_stage_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status init() {
    if (prof_.on()) use_graph_ = false;  // each step timed on its own
    CUDA_TRY(cudaSetDevice(0));
    CUDA_TRY(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, 0));
    // Check the memory before touching it: weights plus work buffers.
    size_t free_b = 0, total_b = 0;
    CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    const uint64_t need = model_->weight_bytes() + work_bytes() + (64ull << 20);
    if (need > free_b)
      return out_of_memory("the model needs about " + std::to_string(need >> 20) + " MiB of GPU memory, " +
                           std::to_string(free_b >> 20) + " MiB are free: use a smaller model or the CPU backend");
    CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    const ModelWeights& w = model_->weights();
    PHASELAB_TRY(upload(w.tok_embd, &tok_embd_));
    output_ = tok_embd_;
    if (!w.tied_output) PHASELAB_TRY(upload(w.output, &output_));
    PHASELAB_TRY(upload_vec(w.output_norm, &output_norm_));
    PHASELAB_TRY(upload_vec(w.rope_freq_factors, &rope_ff_));
    layers_.resize(c_.n_layer);
    for (int il = 0; il < c_.n_layer; il++) {
      const LayerWeights& L = w.layers[il];
      DevLayer& d = layers_[il];
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
    const size_t B = static_cast<size_t>(max_batch_);
    PHASELAB_TRY(alloc(&x_, B * c_.n_embd));
    PHASELAB_TRY(alloc(&xb_, B * std::max(c_.n_embd, c_.n_embd_q())));
    PHASELAB_TRY(alloc(&xb2_, B * c_.n_embd));
    PHASELAB_TRY(alloc(&q_, B * c_.n_embd_q()));
    PHASELAB_TRY(alloc(&k_, B * c_.n_embd_kv()));
    PHASELAB_TRY(alloc(&v_, B * c_.n_embd_kv()));
    PHASELAB_TRY(alloc(&hb_, B * c_.n_ff));
    PHASELAB_TRY(alloc(&hb2_, B * c_.n_ff));
    PHASELAB_TRY(alloc(&logits_, B * c_.n_vocab));
    // The rows' metadata (RowMap, tokens, logits rows) and the argmaxes, and
    // its pinned staging copy: one upload per pass.
    CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&meta_), kMetaFields * B * sizeof(int32_t)));
    allocations_.push_back(meta_);
    CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&meta_stage_), kMetaFields * B * sizeof(int32_t)));
    next_ = meta_ + kNextField * B;
    parts_.reserve(B);
    tiled_.reserve(B);
    // cuBLAS for prefill: BF16 copies of a slab of weight rows and of the batch.
    if (max_batch_ >= gemm_min_tokens_) {
      if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) return internal_error("cuBLAS could not be initialised");
      if (cublasSetStream(cublas_, stream_) != CUBLAS_STATUS_SUCCESS) return internal_error("cuBLAS: cublasSetStream failed");
      const size_t max_in = std::max({c_.n_embd, c_.n_embd_q(), c_.n_ff});
      w16_elems_ = std::max<size_t>(kW16Elems, max_in * 64);
      CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&w16_), w16_elems_ * sizeof(__nv_bfloat16)));
      allocations_.push_back(w16_);
      CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&x16_), B * max_in * sizeof(__nv_bfloat16)));
      allocations_.push_back(x16_);
    }
    // The uploads (pageable memory, legacy stream) finish before stream_'s
    // first kernel reads them.
    CUDA_TRY(cudaDeviceSynchronize());
    return Status::ok();
  }

  std::string name() const override { return "cuda"; }
  int max_batch() const override { return max_batch_; }
  bool batched_forward() const override { return true; }
  // The device holds K/V; the host pools made for this backend keep the books.
  KvStorage kv_storage() const override { return KvStorage::device; }
  uint64_t device_kv_bytes(const KvPool& pool) const override { return layout_of(pool).bytes(); }

  Status forward(const int32_t* tokens, int T, KvCache& kv, float* logits, LogitsMode mode) override {
    const SeqChunk chunk{&kv, tokens, T, mode, logits};
    return forward_batch(&chunk, 1);
  }

  // The chunks' tokens are the rows of one pass (see plan()): every matrix
  // product reads the weights once for all of them, attention runs per row
  // through its own sequence's block table. A pass of one token per
  // sequence, each wanting its last logits (batched decode), replays the
  // graph captured for its batch-size bucket.
  Status forward_batch(const SeqChunk* chunks, int n_chunks) override {
    int T = 0;
    PHASELAB_TRY(check_batch(chunks, n_chunks, c_.n_vocab, max_batch_, true, &T));
    bool decode = true;
    for (int i = 0; i < n_chunks; i++) {
      const SeqChunk& ch = chunks[i];
      if (&ch.kv->pool() != &chunks[0].kv->pool())
        return invalid_argument("the sequences of one batch must share one KV pool");
      decode = decode && ch.n_tokens == 1 && ch.mode == LogitsMode::last;
    }
    PHASELAB_TRY(ensure_pool(*chunks[0].kv));
    for (int i = 0; i < n_chunks; i++) PHASELAB_TRY(prepare(*chunks[i].kv));
    for (int i = 0; i < n_chunks; i++) PHASELAB_TRY(reserve(*chunks[i].kv, chunks[i].n_tokens));
    parts_.clear();
    for (int i = 0; i < n_chunks; i++) {
      const SeqChunk& ch = chunks[i];
      parts_.push_back(Part{ch.kv, ch.tokens, ch.kv->n_past(), ch.n_tokens, ch.mode});
    }
    PHASELAB_TRY(decode && use_graph_ ? run_decode_graph() : run_pass());
    if (Status st = copy_outputs(chunks, n_chunks); !st.is_ok()) return after_sync(st);
    CUDA_TRY(cudaStreamSynchronize(stream_));
    prof_.collect(decode ? "decode" : "prefill", T);
    for (int i = 0; i < n_chunks; i++) {
      if (chunks[i].argmax && chunks[i].mode == LogitsMode::last) *chunks[i].argmax = meta_stage_[kNextField * max_batch_ + i];
      chunks[i].kv->append(chunks[i].tokens, chunks[i].n_tokens);
    }
    return Status::ok();
  }

  // After a pass over the chunks: their logits, in the order plan() gave them
  // rows, queued for the host; the argmax where a chunk asks for it (one
  // launch for all of them in a greedy decode pass) instead.
  Status copy_outputs(const SeqChunk* chunks, int n_chunks) {
    int n_greedy = 0;
    for (int i = 0; i < n_chunks; i++) n_greedy += chunks[i].argmax && chunks[i].mode == LogitsMode::last;
    if (n_greedy == n_chunks) CUDA_TRY(cuda::launch_argmax_rows(logits_, n_chunks, c_.n_vocab, next_, stream_));
    for (int i = 0, row = 0; i < n_chunks; i++) {
      const SeqChunk& ch = chunks[i];
      const int n = ch.mode == LogitsMode::last ? 1 : ch.mode == LogitsMode::all ? ch.n_tokens : 0;
      const float* rows = logits_ + static_cast<size_t>(row) * c_.n_vocab;
      if (ch.argmax && ch.mode == LogitsMode::last) {
        if (n_greedy < n_chunks) CUDA_TRY(cuda::launch_argmax_rows(rows, 1, c_.n_vocab, next_ + i, stream_));
      } else if (n > 0) {
        CUDA_TRY(cudaMemcpyAsync(ch.logits, rows, static_cast<size_t>(n) * c_.n_vocab * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
      }
      row += n;
    }
    // (n_greedy == n_chunks: the argmaxes are next_[0, n_chunks); otherwise
    // next_[i] for the chunks that asked.)
    if (n_greedy > 0) {
      PHASELAB_TRY(prof_.mark("argmax", stream_));
      CUDA_TRY(cudaMemcpyAsync(meta_stage_ + kNextField * max_batch_, next_, n_chunks * sizeof(int32_t),
                               cudaMemcpyDeviceToHost, stream_));
    }
    return Status::ok();
  }

  bool has_device_greedy() const override { return true; }
  uint64_t positions_computed() const override { return computed_; }
  Status forward_greedy(int32_t token, KvCache& kv, int32_t* next) override {
    if (token < 0 || token >= c_.n_vocab) return invalid_argument("token id " + std::to_string(token) + " is outside the vocabulary");
    PHASELAB_TRY(ensure_pool(kv));
    PHASELAB_TRY(prepare(kv));
    PHASELAB_TRY(reserve(kv, 1));
    parts_.clear();
    parts_.push_back(Part{&kv, &token, kv.n_past(), 1, LogitsMode::last});
    PHASELAB_TRY(use_graph_ ? run_decode_graph() : run_pass());
    const SeqChunk chunk{&kv, &token, 1, LogitsMode::last, nullptr, next};
    if (Status st = copy_outputs(&chunk, 1); !st.is_ok()) return after_sync(st);
    CUDA_TRY(cudaStreamSynchronize(stream_));
    prof_.collect("decode", 1);
    *next = meta_stage_[kNextField * max_batch_];
    kv.append(&token, 1);
    return Status::ok();
  }

 private:
  // One sequence's rows in a pass: tokens at positions p0 .. p0 + n.
  struct Part {
    const KvCache* kv = nullptr;
    const int32_t* tokens = nullptr;
    int p0 = 0, n = 0;
    LogitsMode mode = LogitsMode::none;
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

  // Makes the device hold what the host holds for kv: recomputes, from the
  // host's tokens, the positions of its blocks the device has not computed
  // (from the first block whose slots it lacks). Where a block of those
  // positions, or of their window, has no window part (the pool gave it
  // back: the sequence had moved past it), the local layers' K/V go to a
  // ring of parts allocated for the recomputation (ring mode), from which
  // each pass copies what the blocks with parts keep, and the recomputation
  // starts from the beginning (the ring holds no earlier window). (The device
  // lacks positions when its pool was made for another cache since; it
  // then lacks them all.)
  Status prepare(const KvCache& kv) {
    const int n = kv.n_past();
    const std::vector<int>& table = kv.block_table();
    const KvPool& pool = kv.pool();
    int p = n;
    for (int i = 0; i * kBlock < n; i++) {
      const int have = filled(kv, table[i]);
      const int need = std::min(kBlock, n - i * kBlock);
      if (have < need) {
        p = i * kBlock + have;
        break;
      }
    }
    if (p >= n) return Status::ok();
    const int n_table = (n + kBlock - 1) / kBlock;
    bool ring = false;
    if (layout_.n_local > 0)
      for (int i = kv.first_window_block(p); i < n_table && !ring; i++) ring = pool.window_slot(table[i]) < 0;
    if (ring) {
      p = 0;
      if (Status st = make_ring(); !st) {
        free_ring();
        return st;
      }
    }
    ring_mode_ = ring;
    Status st = Status::ok();
    while (p < n && st.is_ok()) {
      const int c = std::min(ring ? ring_chunk() : max_batch_, n - p);
      parts_.clear();
      parts_.push_back(Part{&kv, kv.tokens().data() + p, p, c, LogitsMode::none});
      st = run_pass();
      // The slots this pass wrote, into the window parts of blocks that
      // have one (only those: the rest of a shared block's part is another
      // sequence's).
      for (int i = p / kBlock; ring && st.is_ok() && i * kBlock < p + c; i++)
        if (const int w = pool.window_slot(table[i]); w >= 0)
          st = copy_ring_slots(w, i % layout_.ring, std::max(p, i * kBlock) - i * kBlock,
                               std::min(p + c, (i + 1) * kBlock) - i * kBlock);
      if (st.is_ok()) st = cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", __FILE__, __LINE__);
      prof_.collect("prefill", c);
      p += c;
    }
    ring_mode_ = false;
    if (ring) free_ring();
    if (!st) {  // what the failed passes marked computed may not have reached the window parts
      cudaStreamSynchronize(stream_);
      for (int i = 0; i < n_table; i++) set_filled(kv, table[i], 0);
    }
    return st;
  }

  // Slots [s0, s1) of every local layer, from ring part r to window part w.
  Status copy_ring_slots(int w, int r, int s0, int s1) {
    const size_t part = layout_.window_block_bytes();
    if (s0 == 0 && s1 == kBlock) return copy_part(pool_wk_, pool_wv_, ring_k_, ring_v_, part, w, r);
    const size_t row = cuda::kv_values_bytes(layout_.elem, layout_.n_embd_kv), layer = kBlock * row;
    for (int li = 0; li < layout_.n_local; li++) {
      const size_t at = li * layer + s0 * row, bytes = (s1 - s0) * row;
      CUDA_TRY(cudaMemcpyAsync(pool_wk_ + w * part + at, ring_k_ + r * part + at, bytes, cudaMemcpyDeviceToDevice, stream_));
      CUDA_TRY(cudaMemcpyAsync(pool_wv_ + w * part + at, ring_v_ + r * part + at, bytes, cudaMemcpyDeviceToDevice, stream_));
    }
    return Status::ok();
  }

  void free_ring() {
    cudaStreamSynchronize(stream_);  // nothing queued may still use it
    for (void* r : {static_cast<void*>(ring_k_), static_cast<void*>(ring_v_), static_cast<void*>(ring_table_)})
      free_device(r);
    ring_k_ = ring_v_ = nullptr;
    ring_table_ = nullptr;
  }

  // The ring of window parts for a recomputation (prepare()), and its
  // table: position p's rows in part (p / kBlock) % ring.
  Status make_ring() {
    free_ring();  // one a failed make_ring left
    const size_t bytes = layout_.window_block_bytes() * layout_.ring;
    size_t free_b = 0, total_b = 0;
    CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    if (2 * bytes + table_cap_ * sizeof(int32_t) > free_b)
      return out_of_memory("recomputing a conversation's K/V on the GPU needs " + std::to_string((2 * bytes) >> 20) +
                           " MiB more, " + std::to_string(free_b >> 20) + " MiB are free: lower the context size");
    for (uint8_t** r : {&ring_k_, &ring_v_}) {
      CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(r), bytes));
      allocations_.push_back(*r);
    }
    CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&ring_table_), table_cap_ * sizeof(int32_t)));
    allocations_.push_back(ring_table_);
    std::vector<int32_t> t(table_cap_);
    for (int e = 0; e < table_cap_; e++) t[e] = e % layout_.ring;
    // On the stream the passes take (a plain cudaMemcpy would not be ordered
    // before them), and done before t goes.
    CUDA_TRY(cudaMemcpyAsync(ring_table_, t.data(), t.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    CUDA_TRY(cudaStreamSynchronize(stream_));
    return Status::ok();
  }

  // kv.reserve(T), mirrored: blocks new to the table hold nothing the device
  // computed, except the host's copy of a shared or published, partly filled
  // last block (copy on write), whose filled slots the device copies too.
  Status reserve(KvCache& kv, int T) {
    const int n = kv.n_past(), first = n / kBlock;
    const int old_tail = n % kBlock ? kv.block_table()[first] : -1;
    // (Read before the host's reserve, which may give the old block's part to
    // a new block; its K/V stay there until the pass writes.)
    const int old_wslot = old_tail >= 0 ? kv.pool().window_slot(old_tail) : -1;
    // Mirrored even when the reserve fails part way: the host may have made
    // its copy of the last block already.
    const Status reserved = kv.reserve(T);
    const std::vector<int>& table = kv.block_table();
    const int last = std::min((n + T - 1) / kBlock, static_cast<int>(table.size()) - 1);
    for (int i = first; i <= last; i++) {
      const int b = table[i];
      if (i == first && old_tail >= 0) {
        if (b != old_tail) {
          PHASELAB_TRY(copy_part(pool_k_, pool_v_, pool_k_, pool_v_, layout_.full_block_bytes(), b, old_tail));
          const int wslot = kv.pool().window_slot(b);
          if (wslot >= 0 && old_wslot >= 0)
            PHASELAB_TRY(copy_part(pool_wk_, pool_wv_, pool_wk_, pool_wv_, layout_.window_block_bytes(), wslot,
                                   old_wslot));
          set_filled(kv, b, n % kBlock);
        }
        continue;
      }
      set_filled(kv, b, 0);
    }
    return reserved;
  }

  // K and V of part src of one store (the blocks', the window parts' or the
  // ring's: parts of `bytes` each) copied to part dst of another, or the same.
  Status copy_part(uint8_t* dk, uint8_t* dv, const uint8_t* sk, const uint8_t* sv, size_t bytes, int dst, int src) {
    if (bytes == 0) return Status::ok();
    CUDA_TRY(cudaMemcpyAsync(dk + dst * bytes, sk + src * bytes, bytes, cudaMemcpyDeviceToDevice, stream_));
    CUDA_TRY(cudaMemcpyAsync(dv + dst * bytes, sv + src * bytes, bytes, cudaMemcpyDeviceToDevice, stream_));
    return Status::ok();
  }

  // How many leading slots of block b hold K/V the device computed in the
  // block's present life (0 after the host handed it out again).
  int filled(const KvCache& kv, int b) const {
    return filled_[b].generation == kv.pool().generation(b) ? filled_[b].slots : 0;
  }
  void set_filled(const KvCache& kv, int b, int slots) {
    filled_[b] = BlockFill{kv.pool().generation(b), static_cast<uint8_t>(slots)};
  }

  // A failed step's status, once the stream has finished what it had (the
  // staged copies must be done before the staging buffers are reused).
  Status after_sync(Status st) {
    cudaStreamSynchronize(stream_);
    return st;
  }

  // Lays out parts_ as the rows of one pass and uploads what the kernels
  // read: each row's token, position and block table (RowMap), and the rows
  // whose logits are wanted. Parts of fewer than kTiledAttentionMin tokens
  // (decode) come first, so that one launch of the per-query attention
  // serves them all; each longer part (prefill) follows with rows of its
  // own for the tiled kernel. Logits rows follow the parts' order. Part i's
  // block table (and window-slot table) is in slot i; only entries that
  // changed since the slot's last upload travel. pad_to > T: rows T .. pad_to are padding (token 0 at
  // position 0 of the pad slot, whose one block no sequence has) for a
  // captured graph's fixed batch size.
  Status plan(int pad_to) {
    const int n_parts = static_cast<int>(parts_.size());
    PHASELAB_TRY(ensure_slots(n_parts));
    const int B = max_batch_;
    int32_t* tok = meta_stage_;
    int32_t* pos = meta_stage_ + B;
    int32_t* at = meta_stage_ + 2 * B;
    int32_t* lrows = meta_stage_ + 3 * B;
    pass_ = Pass{};
    tiled_.clear();
    int T = 0;
    for (int tiled = 0; tiled < 2; tiled++)
      for (int i = 0; i < n_parts; i++) {
        Part& p = parts_[i];
        const bool wants_tiled = use_tiled_attention_ && p.n >= kTiledAttentionMin && tiled_fits_;
        if (wants_tiled != (tiled == 1)) continue;
        if (wants_tiled) tiled_.push_back(TiledChunk{T, p.n, p.p0 + p.n});
        row_of_[i] = T;
        for (int j = 0; j < p.n; j++, T++) {
          tok[T] = p.tokens[j];
          pos[T] = p.p0 + j;
          at[T] = i * table_cap_;
        }
        if (!wants_tiled) pass_.n_small = T;
        pass_.split_ctx = std::max(pass_.split_ctx, std::min(p.kv->n_ctx(), table_cap_ * kBlock));
      }
    for (; T < pad_to; T++) {
      tok[T] = 0;
      pos[T] = 0;
      at[T] = n_slots_ * table_cap_;  // the pad slot
    }
    pass_.T = T;
    if (pad_to > 0) pass_.n_small = T;  // padding only with no tiled parts
    bool decode = true;
    for (const Part& p : parts_) decode = decode && p.n == 1;
    pass_.gemm = cublas_ && !decode && T >= gemm_min_tokens_;
    bool contiguous = true;
    for (int i = 0; i < n_parts; i++) {
      const Part& p = parts_[i];
      const int first = p.mode == LogitsMode::last ? p.n - 1 : 0;
      const int n = p.mode == LogitsMode::last ? 1 : p.mode == LogitsMode::all ? p.n : 0;
      for (int j = first; j < first + n; j++) {
        lrows[pass_.n_logits] = row_of_[i] + j;
        contiguous = contiguous && lrows[pass_.n_logits] == lrows[0] + pass_.n_logits;
        pass_.n_logits++;
      }
    }
    if (pad_to > 0) pass_.n_logits = T;  // a graph computes every row's (padding's too)
    pass_.logits_first = pad_to > 0 ? 0 : pass_.n_logits > 0 && contiguous ? lrows[0] : -1;
    CUDA_TRY(cudaMemcpyAsync(meta_, meta_stage_, kUploadFields * B * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    for (int i = 0; i < n_parts; i++) {
      const std::vector<int>& table = parts_[i].kv->block_table();
      std::vector<int>& up = slot_uploaded_[i];
      const int used = (parts_[i].p0 + parts_[i].n + kBlock - 1) / kBlock;
      if (used > table_cap_ || used > static_cast<int>(table.size()))
        return internal_error("a block table longer than its pool (" + std::to_string(used) + " entries)");
      int from = 0;
      while (from < used && from < static_cast<int>(up.size()) && up[from] == table[from]) from++;
      if (from == used) continue;
      int32_t* stage = tables_stage_ + static_cast<size_t>(i) * table_cap_;
      std::memcpy(stage + from, table.data() + from, (used - from) * sizeof(int32_t));
      CUDA_TRY(cudaMemcpyAsync(tables_ + static_cast<size_t>(i) * table_cap_ + from, stage + from,
                               (used - from) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
      up.assign(table.begin(), table.begin() + used);
    }
    if (layout_.n_local > 0 && !ring_mode_)
      for (int i = 0; i < n_parts; i++) PHASELAB_TRY(upload_window_table(i));
    return Status::ok();
  }

  // Part i's window-slot table, for the blocks the pass reads or writes in
  // the local layers ([first_window_block(p0), the last one written]): the
  // slot of each block's window part (outside prepare()'s ring mode, each of
  // them has one). Entries before are stale and never read.
  Status upload_window_table(int i) {
    const Part& p = parts_[i];
    const std::vector<int>& table = p.kv->block_table();
    const KvPool& pool = p.kv->pool();
    std::vector<int>& up = wslot_uploaded_[i];
    int32_t* stage = wtables_stage_ + static_cast<size_t>(i) * table_cap_;
    const int used = (p.p0 + p.n + kBlock - 1) / kBlock;
    int lo = -1, hi = -1;
    for (int e = p.kv->first_window_block(p.p0); e < used; e++) {
      const int w = pool.window_slot(table[e]);
      const int slot = w >= 0 ? w : layout_.pad_window_part();  // (never: the host holds them)
      if (up[e] == slot) continue;
      stage[e] = up[e] = slot;
      if (lo < 0) lo = e;
      hi = e;
    }
    if (lo < 0) return Status::ok();
    CUDA_TRY(cudaMemcpyAsync(wtables_ + static_cast<size_t>(i) * table_cap_ + lo, stage + lo,
                             (hi - lo + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    return Status::ok();
  }

  // After a pass over parts_: the blocks hold the positions it wrote, and
  // nothing after them.
  void mark_written() {
    for (const Part& p : parts_) {
      const std::vector<int>& table = p.kv->block_table();
      for (int i = p.p0 / kBlock; i * kBlock < p.p0 + p.n; i++)
        set_filled(*p.kv, table[i], std::min(kBlock, p.p0 + p.n - i * kBlock));
      computed_ += static_cast<uint64_t>(p.n);
    }
  }

  // parts_ as one pass of plain launches (no synchronisation: the caller
  // copies the logits and waits).
  Status run_pass() {
    if (Status st = plan(0); !st.is_ok()) return after_sync(st);
    if (Status st = enqueue(pass_); !st.is_ok()) return after_sync(st);
    mark_written();
    return Status::ok();
  }

  // The smallest batch-size bucket (a power of two, or max_batch) for n
  // rows of one token each.
  int bucket_for(int n) const {
    int b = 1;
    while (b < n) b *= 2;
    return std::min(b, max_batch_);
  }

  // parts_ (one token each, last logits) through the graph captured for its
  // bucket (captured on first use, and again after the device pool or the
  // tables are reallocated); rows beyond the parts are padding. If capture
  // fails, decoding continues with plain launches from then on, and the
  // reason is logged.
  Status run_decode_graph() {
    const int bucket = bucket_for(static_cast<int>(parts_.size()));
    if (Status st = plan(bucket); !st.is_ok()) return after_sync(st);
    cudaGraphExec_t& exec = graphs_[bucket];
    if (!exec) {
      cudaGraph_t graph = nullptr;
      if (cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal); e != cudaSuccess)
        return after_sync(cuda_status(e, "cudaStreamBeginCapture", __FILE__, __LINE__));
      const Status st = enqueue(pass_);
      const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
      cudaError_t inst = cudaErrorUnknown;
      if (st.is_ok() && end == cudaSuccess) inst = cudaGraphInstantiate(&exec, graph, 0);
      if (graph) cudaGraphDestroy(graph);
      if (!st.is_ok() || end != cudaSuccess || inst != cudaSuccess) {
        graphs_.erase(bucket);
        use_graph_ = false;
        (void)cudaGetLastError();  // clear the capture's error
        std::fprintf(stderr, "phaselab: CUDA graph capture failed (%s); decoding without graphs\n",
                     !st.is_ok() ? st.message().c_str() : cudaGetErrorString(end != cudaSuccess ? end : inst));
        return run_pass();
      }
    }
    if (cudaError_t e = cudaGraphLaunch(exec, stream_); e != cudaSuccess)
      return after_sync(cuda_status(e, "cudaGraphLaunch", __FILE__, __LINE__));
    mark_written();
    return Status::ok();
  }

  void drop_graphs() {
    for (auto& [bucket, exec] : graphs_)
      if (exec) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }

  static constexpr size_t kW16Elems = size_t{32} << 20;  // 64 MiB of BF16 weight rows per GEMM slab

  uint64_t work_bytes() const {
    const uint64_t B = max_batch_;
    const uint64_t max_in = std::max({c_.n_embd, c_.n_embd_q(), c_.n_ff});
    const uint64_t gemm = max_batch_ >= gemm_min_tokens_ ? 2 * (std::max<uint64_t>(kW16Elems, max_in * 64) + B * max_in) : 0;
    return 4 * B * (3ull * c_.n_embd + c_.n_embd_q() + 2ull * c_.n_embd_kv() + 2ull * c_.n_ff + c_.n_vocab) + gemm;
  }

  // The most partial-result floats any batch size needs for n_ctx keys.
  size_t partials_floats(int n_ctx) const {
    size_t most = 0;
    for (int T = 1; T <= max_batch_; T++) {
      most = std::max(most, cuda::attention_partials_floats(T, c_.n_head, c_.head_dim,
                                                            cuda::attention_splits(T, c_.n_head, n_ctx)));
      if (T >= kTiledAttentionMin)  // the tiled kernel's ranges, at most n_ctx keys
        most = std::max(most, cuda::attention_partials_floats(
                                  T, c_.n_head, c_.head_dim,
                                  cuda::attention_tiled_splits(T, c_.n_head, c_.n_head_kv, n_ctx, sm_count_)));
    }
    return most;
  }

  Status alloc(float** p, size_t n) {
    CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(p), std::max<size_t>(n, 1) * sizeof(float)));
    allocations_.push_back(*p);
    return Status::ok();
  }
  void free_device(void* p) {
    if (!p) return;
    cudaFree(p);
    allocations_.erase(std::remove(allocations_.begin(), allocations_.end(), p), allocations_.end());
  }

  Status upload(const WeightView& w, DevWeight* d) {
    const size_t bytes = w.row_bytes * static_cast<size_t>(w.n_out);
    CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&d->data), bytes));
    allocations_.push_back(d->data);
    CUDA_TRY(cudaMemcpy(d->data, w.data, bytes, cudaMemcpyHostToDevice));
    d->type = w.type;
    d->n_in = static_cast<int>(w.n_in);
    d->n_out = static_cast<int>(w.n_out);
    d->row_bytes = w.row_bytes;
    return Status::ok();
  }

  Status upload_vec(const std::vector<float>& v, float** d) {
    if (v.empty()) {
      *d = nullptr;
      return Status::ok();
    }
    PHASELAB_TRY(alloc(d, v.size()));
    CUDA_TRY(cudaMemcpy(*d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return Status::ok();
  }

  static constexpr int kBlock = cuda::kKvBlockTokens;
  static_assert(kBlock == KvPool::kBlockTokens, "the device pool mirrors the host's blocks");

  // The positions of each pass with which prepare() recomputes through the
  // ring (which holds the window and one such pass).
  int ring_chunk() const { return std::min(max_batch_, 64); }

  // How the device stores a pool's K/V, each of K and V in two stores laid
  // out as the host pool's: the full-attention layers' part of every block,
  // (n_blocks + 1, n_full, kBlock, n_embd_kv), the last for padding rows;
  // and the sliding-window layers' window parts, (n_window + 1, n_local,
  // kBlock, n_embd_kv): the pool's window parts by their slots
  // (KvPool::window_slot), then one for padding rows. While prepare()
  // recomputes positions in blocks whose parts the pool gave back, a ring of
  // `ring` parts more (as many as one of its passes reads: a window and a
  // chunk) holds the local layers' K/V.
  struct KvLayout {
    cuda::KvElem elem = cuda::KvElem::f32;
    int n_full = 0, n_local = 0;  // layers in each store
    int n_blocks = 0;             // the pool's blocks
    int n_window = 0, ring = 0;   // the pool's window parts; prepare()'s ring's
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
  KvLayout layout_of(const KvPool& pool) const {
    KvLayout l;
    l.elem = elem_of(pool.type());
    l.n_local = pool.n_local_layers();
    l.n_full = c_.n_layer - l.n_local;
    l.n_blocks = pool.n_blocks();
    l.n_embd_kv = static_cast<size_t>(c_.n_embd_kv());
    if (l.n_local > 0) {
      l.n_window = pool.n_window_blocks();
      l.ring = (pool.window() + ring_chunk() - 2) / kBlock + 2;
    }
    return l;
  }
  static cuda::KvElem elem_of(KvType t) {
    return t == KvType::f16    ? cuda::KvElem::f16
           : t == KvType::bf16 ? cuda::KvElem::bf16
           : t == KvType::q8_0 ? cuda::KvElem::q8_0
                               : cuda::KvElem::f32;
  }

  // The device pool mirroring kv's host pool (as many blocks, its value
  // type, one more block that only padding rows write), and attention
  // scratch for its positions; made anew (all blocks empty) when the pool
  // changes.
  Status ensure_pool(const KvCache& kv) {
    const KvPool& pool = kv.pool();
    if (pool.id() == pool_id_ && pool.n_blocks() == layout_.n_blocks) return Status::ok();
    drop_graphs();                              // the graphs hold the old buffers' addresses
    CUDA_TRY(cudaStreamSynchronize(stream_));  // nothing in flight may still use the old buffers
    for (void* p : {static_cast<void*>(pool_k_), static_cast<void*>(pool_v_), static_cast<void*>(pool_wk_),
                    static_cast<void*>(pool_wv_), static_cast<void*>(scratch_)})
      free_device(p);
    pool_k_ = pool_v_ = pool_wk_ = pool_wv_ = nullptr;
    scratch_ = nullptr;
    pool_id_ = 0;  // until the new buffers exist
    // A sequence's table has at most as many entries as the pool has blocks.
    const int table_cap = pool.n_blocks();
    const KvLayout layout = layout_of(pool);
    size_t free_b = 0, total_b = 0;
    CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    const size_t scratch_n = std::max<size_t>(partials_floats(table_cap * kBlock), 1);
    const size_t need = layout.bytes() + scratch_n * sizeof(float) + 4 * static_cast<size_t>(table_cap) * sizeof(int32_t);
    if (need > free_b)
      return out_of_memory("the KV cache for " + std::to_string(pool.n_blocks() * kBlock) + " positions needs " +
                           std::to_string(need >> 20) + " MiB of GPU memory, " + std::to_string(free_b >> 20) +
                           " MiB are free: lower the context size");
    for (const auto& [store, window] : {std::pair{&pool_k_, false}, std::pair{&pool_v_, false},
                                        std::pair{&pool_wk_, true}, std::pair{&pool_wv_, true}}) {
      const uint64_t bytes = layout.store_bytes(window);
      if (bytes == 0) continue;
      CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(store), bytes));
      allocations_.push_back(*store);
    }
    layout_ = layout;
    layer_local_.assign(c_.n_layer, 0);
    layer_index_.assign(c_.n_layer, 0);
    for (int il = 0; il < c_.n_layer; il++) {
      layer_local_[il] = pool.is_local(il) ? 1 : 0;
      layer_index_[il] = pool.layer_index(il);
    }
    PHASELAB_TRY(alloc(&scratch_, scratch_n));
    filled_.assign(pool.n_blocks(), BlockFill{});
    pool_id_ = pool.id();
    table_cap_ = table_cap;
    n_slots_ = 0;  // the tables are made for the new capacity
    return ensure_slots(1);
  }

  // Block tables for n sequences per pass (slots 0 .. n - 1) and the pad
  // slot after them; grown by doubling (which drops the graphs).
  Status ensure_slots(int n) {
    if (n <= n_slots_) return Status::ok();
    const int slots = std::max(n, std::min(2 * n_slots_, max_batch_));
    drop_graphs();
    CUDA_TRY(cudaStreamSynchronize(stream_));
    for (int32_t** t : {&tables_, &wtables_}) {
      free_device(*t);
      *t = nullptr;
    }
    for (int32_t** t : {&tables_stage_, &wtables_stage_}) {
      if (*t) cudaFreeHost(*t);
      *t = nullptr;
    }
    n_slots_ = 0;
    const size_t entries = static_cast<size_t>(slots + 1) * table_cap_;
    for (int32_t** t : {&tables_, &wtables_}) {
      CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(t), entries * sizeof(int32_t)));
      allocations_.push_back(*t);
    }
    for (int32_t** t : {&tables_stage_, &wtables_stage_})
      CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(t), entries * sizeof(int32_t)));
    slot_uploaded_.assign(slots, std::vector<int>());
    for (auto& up : slot_uploaded_) up.reserve(table_cap_);
    wslot_uploaded_.assign(slots, std::vector<int>(layout_.n_local > 0 ? table_cap_ : 0, -1));
    row_of_.assign(slots, 0);
    // The pad slot: its first entry is the extra block (the pool's n_blocks), and
    // in the window-slot tables the extra window part.
    const size_t pad_at = static_cast<size_t>(slots) * table_cap_;
    tables_stage_[pad_at] = layout_.n_blocks;
    wtables_stage_[pad_at] = layout_.pad_window_part();
    CUDA_TRY(cudaMemcpyAsync(tables_ + pad_at, tables_stage_ + pad_at, sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    CUDA_TRY(cudaMemcpyAsync(wtables_ + pad_at, wtables_stage_ + pad_at, sizeof(int32_t), cudaMemcpyHostToDevice,
                             stream_));
    n_slots_ = slots;
    return Status::ok();
  }

  // Layer il of the paged cache, for the kernels: the full layers' store
  // through the block tables, or the window parts' through the window-slot
  // tables.
  cuda::KvPages pages(int il) const {
    const size_t rows = kBlock * layout_.n_embd_kv;  // values of one layer's part of a block
    const size_t layer = cuda::kv_values_bytes(layout_.elem, layer_index_[il] * rows);
    if (layer_local_[il] && ring_mode_)  // (one sequence: its table_at is 0)
      return cuda::KvPages{ring_k_ + layer, ring_v_ + layer, ring_table_, layout_.n_local * rows, layout_.elem};
    if (layer_local_[il])
      return cuda::KvPages{pool_wk_ + layer, pool_wv_ + layer, wtables_, layout_.n_local * rows, layout_.elem};
    return cuda::KvPages{pool_k_ + layer, pool_v_ + layer, tables_, layout_.n_full * rows, layout_.elem};
  }
  // Rows [r, ...) of the pass.
  cuda::RowMap row_map(int r = 0) const { return cuda::RowMap{meta_ + max_batch_ + r, meta_ + 2 * max_batch_ + r}; }

  // out (T, n_out) = x (T, n_in) . W^T: cuBLAS where the pass says so
  // (Pass::gemm), else the matrix-vector kernel.
  Status matvec(const DevWeight& w, const float* x, int T, float* out, bool gemm) {
    if (gemm) {
      CUDA_TRY(cuda::launch_gemm_bf16(cublas_, w.data, w.type, w.row_bytes, w.n_in, w.n_out, x, T, out, w16_, w16_elems_,
                                     x16_, stream_));
      return Status::ok();
    }
    CUDA_TRY(cuda::launch_matvec(w.data, w.type, w.row_bytes, w.n_in, w.n_out, x, T, out, stream_));
    return Status::ok();
  }

  // Attention of layer il for the pass's rows: one launch of the per-query
  // kernel for rows [0, n_small), the tiled kernel for each prefill part.
  Status attention(int il, const Pass& ps) {
    const int NQ = c_.n_embd_q(), HD = c_.head_dim, window = c_.window_of(il);
    if (ps.n_small > 0)
      CUDA_TRY(cuda::launch_attention(q_, pages(il), row_map(), xb_, scratch_, ps.n_small, c_.n_head, c_.n_head_kv, HD,
                                      window, c_.attn_scale, c_.attn_logit_softcap,
                                      cuda::attention_splits(ps.n_small, c_.n_head, ps.split_ctx), stream_));
    for (const TiledChunk& t : tiled_) {
      const size_t off = static_cast<size_t>(t.row) * NQ;
      CUDA_TRY(cuda::launch_attention_tiled(
          q_ + off, pages(il), row_map(t.row), xb_ + off, scratch_, t.n, c_.n_head, c_.n_head_kv, HD, window,
          c_.attn_scale, c_.attn_logit_softcap,
          cuda::attention_tiled_splits(t.n, c_.n_head, c_.n_head_kv, t.n_keys, sm_count_), stream_));
    }
    return Status::ok();
  }

  // Every kernel of a forward pass over the rows plan() uploaded, with no
  // host synchronisation (so it can be captured).
  Status enqueue(const Pass& ps) {
    const int T = ps.T, D = c_.n_embd, NQ = c_.n_embd_q(), NKV = c_.n_embd_kv(), HD = c_.head_dim;
    PHASELAB_TRY(prof_.begin(stream_));
    CUDA_TRY(cuda::launch_embedding(tok_embd_.data, tok_embd_.type, tok_embd_.row_bytes, meta_, T, D, c_.embd_scale, x_,
                                    stream_));
    // xb = the first layer's attention input; later layers get theirs from
    // the previous layer's closing add_rmsnorm.
    CUDA_TRY(cuda::launch_rmsnorm(x_, layers_[0].attn_norm, xb_, T, D, c_.rms_eps, stream_));
    PHASELAB_TRY(prof_.mark("embedding + first norm", stream_));
    const bool gelu = c_.act == Activation::gelu_tanh;
    for (int il = 0; il < c_.n_layer; il++) {
      const DevLayer& L = layers_[il];
      if (ps.gemm) {
        PHASELAB_TRY(matvec(L.wq, xb_, T, q_, true));
        PHASELAB_TRY(matvec(L.wk, xb_, T, k_, true));
        PHASELAB_TRY(matvec(L.wv, xb_, T, v_, true));
      } else {  // Q, K and V in one launch
        auto part = [](const DevWeight& w, float* out) {
          return cuda::MatvecOut{w.data, w.type, w.row_bytes, w.n_out, out};
        };
        CUDA_TRY(cuda::launch_matvec3(part(L.wq, q_), part(L.wk, k_), part(L.wv, v_), D, xb_, T, stream_));
      }
      PHASELAB_TRY(prof_.mark("Q, K, V products", stream_));
      if (c_.attn_bias) {
        CUDA_TRY(cuda::launch_add_bias(q_, L.bq, T, NQ, stream_));
        CUDA_TRY(cuda::launch_add_bias(k_, L.bk, T, NKV, stream_));
        CUDA_TRY(cuda::launch_add_bias(v_, L.bv, T, NKV, stream_));
        PHASELAB_TRY(prof_.mark("Q, K, V biases", stream_));
      }
      // QK-norm, RoPE and the K/V cache writes in one kernel.
      const float base = c_.rope_base_of(il);
      CUDA_TRY(cuda::launch_qk_norm_rope_store(q_, k_, v_, c_.qk_norm ? L.q_norm : nullptr, c_.qk_norm ? L.k_norm : nullptr,
                                               pages(il), row_map(), T, c_.n_head, c_.n_head_kv, HD, c_.n_rot, base,
                                               rope_ff_, c_.rope_neox, c_.rms_eps, stream_));
      PHASELAB_TRY(prof_.mark("QK-norm + RoPE + K/V store", stream_));
      PHASELAB_TRY(attention(il, ps));
      PHASELAB_TRY(prof_.mark("attention", stream_));
      PHASELAB_TRY(matvec(L.wo, xb_, T, xb2_, ps.gemm));
      PHASELAB_TRY(prof_.mark("output projection", stream_));
      // Post-attention norm, residual add and the feed-forward's norm in one pass.
      CUDA_TRY(cuda::launch_add_rmsnorm(x_, xb2_, c_.post_norms ? L.post_attn_norm : nullptr, L.ffn_norm, xb_, T, D,
                                        c_.rms_eps, stream_));
      PHASELAB_TRY(prof_.mark("norms + residual adds", stream_));
      if (ps.gemm) {
        PHASELAB_TRY(matvec(L.w_gate, xb_, T, hb_, true));
        PHASELAB_TRY(matvec(L.w_up, xb_, T, hb2_, true));
        CUDA_TRY(cuda::launch_gated_act(hb_, hb2_, static_cast<size_t>(T) * c_.n_ff, gelu, stream_));
      } else {  // both products and the activation in one kernel
        CUDA_TRY(cuda::launch_matvec_gated(L.w_gate.data, L.w_gate.type, L.w_gate.row_bytes, L.w_up.data, L.w_up.type,
                                           L.w_up.row_bytes, L.w_gate.n_in, L.w_gate.n_out, xb_, T, gelu, hb_, stream_));
      }
      PHASELAB_TRY(prof_.mark("FFN gate + up + activation", stream_));
      PHASELAB_TRY(matvec(L.w_down, hb_, T, xb2_, ps.gemm));
      PHASELAB_TRY(prof_.mark("FFN down", stream_));
      // Post-FFN norm, residual add and the next layer's attention norm (the
      // output norm after the last layer) in one pass.
      const float* next_norm = il + 1 < c_.n_layer ? layers_[il + 1].attn_norm : output_norm_;
      CUDA_TRY(cuda::launch_add_rmsnorm(x_, xb2_, c_.post_norms ? L.post_ffw_norm : nullptr, next_norm, xb_, T, D,
                                        c_.rms_eps, stream_));
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

  std::shared_ptr<const Model> model_;
  const ModelConfig& c_;
  int max_batch_;
  StepProfile prof_;  // PHASELAB_CUDA_PROFILE
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
  DevWeight tok_embd_, output_;
  float *output_norm_ = nullptr, *rope_ff_ = nullptr;
  std::vector<DevLayer> layers_;
  // Work buffers for a batch of T <= max_batch rows (as in the CPU backend).
  float *x_ = nullptr, *xb_ = nullptr, *xb2_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr;
  float *hb_ = nullptr, *hb2_ = nullptr, *logits_ = nullptr;
  // The rows of a pass, max_batch entries per field: tokens, positions,
  // table offsets (the RowMap), logits rows; then the argmaxes. meta_stage_:
  // its pinned host copy (the first kUploadFields fields travel per pass).
  static constexpr int kMetaFields = 5, kUploadFields = 4, kNextField = 4;
  int32_t* meta_ = nullptr;
  int32_t* meta_stage_ = nullptr;
  int32_t* next_ = nullptr;  // meta_'s argmax field
  // cuBLAS for prefill (null below gemm_min_tokens_ batches)
  cublasHandle_t cublas_ = nullptr;
  // At least 2 (Pass::gemm keeps cuBLAS out of every decode pass, and so of the graphs).
  int gemm_min_tokens_ = std::max(2, env_int("PHASELAB_CUDA_GEMM_MIN", 16));
  __nv_bfloat16 *w16_ = nullptr, *x16_ = nullptr;
  size_t w16_elems_ = 0;
  // Prefill attention from kTiledAttentionMin tokens of a sequence: the
  // tiled kernel (PHASELAB_CUDA_ATTN_TILED=0: the one-warp-per-query kernel
  // throughout).
  static constexpr int kTiledAttentionMin = 4;
  int sm_count_ = 1;  // the GPU's multiprocessors (the tiled attention's key ranges)
  bool use_tiled_attention_ = std::getenv("PHASELAB_CUDA_ATTN_TILED") == nullptr ||
                              std::strcmp(std::getenv("PHASELAB_CUDA_ATTN_TILED"), "0") != 0;
  const bool tiled_fits_ = cuda::attention_tiled_fits(c_.n_head, c_.n_head_kv, c_.head_dim);
  // The decode graphs, one per batch-size bucket (valid for the current
  // device pool and tables).
  std::map<int, cudaGraphExec_t> graphs_;
  bool use_graph_ = std::getenv("PHASELAB_CUDA_GRAPHS") == nullptr || std::strcmp(std::getenv("PHASELAB_CUDA_GRAPHS"), "0") != 0;
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
  // prepare()'s ring (ring_mode_: the local layers' K/V go there).
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
  struct BlockFill {
    uint32_t generation = 0;  // the KvPool::generation the slots were computed in
    uint8_t slots = 0;        // leading slots computed
  };
  std::vector<BlockFill> filled_;
  uint64_t computed_ = 0;  // positions_computed()
};

void copy_message(const std::string& m, char* buf, size_t n) {
  if (!buf || n == 0) return;
  std::snprintf(buf, n, "%s", m.c_str());
}

}  // namespace

}  // namespace phaselab

// ---- the library's C entry points (see cuda_loader.cpp) ----------------------

#define PHASELAB_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

PHASELAB_CUDA_EXPORT int phaselab_cuda_abi() { return phaselab::kCudaLibraryAbi; }

// Returns 1 and a description of device 0 when it is usable, else 0 and the reason.
PHASELAB_CUDA_EXPORT int phaselab_cuda_probe(char* buf, size_t n, double* peak_gbps, double* peak_tflops,
                                             size_t* total_mem, size_t* free_mem) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    phaselab::copy_message(std::string("no usable CUDA device: ") + cudaGetErrorString(e), buf, n);
    return 0;
  }
  if (count == 0) {
    phaselab::copy_message("no CUDA device found", buf, n);
    return 0;
  }
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, 0);
  int mem_clock_khz = 0, bus_bits = 0, sm_clock_khz = 0;
  cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, 0);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
  cudaDeviceGetAttribute(&sm_clock_khz, cudaDevAttrClockRate, 0);
  // DDR: two transfers per clock.
  if (peak_gbps) *peak_gbps = 2.0 * mem_clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  // FP32 lanes per SM by generation (an estimate for the phase meter).
  const int lanes = p.major >= 8 ? 128 : 64;
  if (peak_tflops) *peak_tflops = 2.0 * p.multiProcessorCount * lanes * sm_clock_khz * 1e3 / 1e12;
  size_t fr = 0, tot = 0;
  cudaSetDevice(0);
  cudaMemGetInfo(&fr, &tot);
  if (total_mem) *total_mem = tot;
  if (free_mem) *free_mem = fr;
  phaselab::copy_message(std::string(p.name) + " (compute " + std::to_string(p.major) + "." + std::to_string(p.minor) + ", " +
                             std::to_string(tot >> 20) + " MiB)",
                         buf, n);
  return 1;
}

PHASELAB_CUDA_EXPORT phaselab::Backend* phaselab_cuda_create(const std::shared_ptr<const phaselab::Model>* model,
                                                             int max_batch, char* err, size_t n) {
  try {
    auto b = std::make_unique<phaselab::CudaBackend>(*model, max_batch);
    if (phaselab::Status st = b->init(); !st.is_ok()) {
      phaselab::copy_message(st.message(), err, n);
      return nullptr;
    }
    return b.release();
  } catch (const std::exception& e) {
    phaselab::copy_message(std::string("CUDA backend: ") + e.what(), err, n);
    return nullptr;
  }
}
