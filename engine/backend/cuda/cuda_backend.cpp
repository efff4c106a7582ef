// The CUDA backend's host side, built into libphaselab_cuda.so and loaded at
// run time (engine/backend/cuda_loader.cpp), so that PhaseLab runs where CUDA
// or a GPU is missing. The forward pass mirrors the CPU reference step by
// step; weights are uploaded once, still quantized, and dequantized inside the
// kernels.
//
// The K/V cache on the device is paged like the host's KvPool, block for
// block (same ids, same layout; a pool is known by KvPool::id and a block's
// life by KvPool::generation), and the kernels read it through the
// sequence's block table: the host KvCache stays the bookkeeper (allocation,
// prefix reuse, copy on write) and its decisions hold for the device's K/V
// as they are. Only what the host does to its own memory is mirrored: the
// copy of a partly filled block before it is written. The device records
// how many leading slots of each block it computed; positions the host holds
// but the device did not compute (a block from before the device pool
// existed) are recomputed from the host's tokens.
//
// Matrix products: quantized matrix-vector kernels for decode and small
// batches, cuBLAS BF16 GEMMs (weights dequantized in slabs) from
// PHASELAB_CUDA_GEMM_MIN tokens on (default 16). A decode step (one token,
// last logits) is captured once as a CUDA graph and replayed: the token and
// its position travel to the device through pinned memory before the
// replay, the kernels read the position from device memory, and the only
// synchronisation is the one for the logits.
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
  // After the stream has synchronised: adds this pass's steps to the totals.
  void collect(int T) {
    if (!on_) return;
    const std::string phase = T > 1 ? "prefill" : "decode";
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
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    if (cublas_) cublasDestroy(cublas_);
    for (void* p : allocations_) cudaFree(p);
    if (stage_) cudaFreeHost(stage_);
    if (table_stage_) cudaFreeHost(table_stage_);
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
    CUDA_TRY(cudaMalloc(&tokens_, (B + 2) * sizeof(int32_t)));  // the batch's tokens, its first position, an argmax
    allocations_.push_back(tokens_);
    pos_ = tokens_ + B;
    next_ = tokens_ + B + 1;
    CUDA_TRY(cudaMallocHost(&stage_, (B + 1) * sizeof(int32_t)));
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

  Status forward(const int32_t* tokens, int T, KvCache& kv, float* logits, LogitsMode mode) override {
    if (T < 1 || T > max_batch_) return invalid_argument("batch of " + std::to_string(T) + " tokens (1.." + std::to_string(max_batch_) + ")");
    PHASELAB_TRY(prepare(tokens, T, kv));
    const int p0 = kv.n_past();
    PHASELAB_TRY(reserve(kv, T));
    if (T == 1 && mode == LogitsMode::last && logits && use_graph_)
      PHASELAB_TRY(run_decode_graph(kv, tokens[0], p0, logits, nullptr));
    else
      PHASELAB_TRY(run(kv, tokens, T, p0, logits, mode));
    kv.append(tokens, T);
    return Status::ok();
  }

  bool has_device_greedy() const override { return true; }
  uint64_t positions_computed() const override { return computed_; }
  Status forward_greedy(int32_t token, KvCache& kv, int32_t* next) override {
    PHASELAB_TRY(prepare(&token, 1, kv));
    const int p0 = kv.n_past();
    PHASELAB_TRY(reserve(kv, 1));
    if (use_graph_) {
      PHASELAB_TRY(run_decode_graph(kv, token, p0, nullptr, next));
    } else {
      PHASELAB_TRY(upload_batch(kv, &token, 1, p0));
      if (Status st = enqueue(1, LogitsMode::last, p0 + 1); !st.is_ok()) return after_sync(st);
      mark_written(kv, p0, 1);
      computed_++;
      PHASELAB_TRY(download_argmax(next));
    }
    kv.append(&token, 1);
    return Status::ok();
  }

 private:
  // Checks the tokens; makes the device pool mirror the host's, and
  // recomputes the positions the host holds that the device has not
  // computed (from the first block whose slots it lacks).
  Status prepare(const int32_t* tokens, int T, KvCache& kv) {
    for (int t = 0; t < T; t++)
      if (tokens[t] < 0 || tokens[t] >= c_.n_vocab) return invalid_argument("token id " + std::to_string(tokens[t]) + " is outside the vocabulary");
    PHASELAB_TRY(ensure_pool(kv));
    const int n = kv.n_past();
    const std::vector<int>& table = kv.block_table();
    int p = n;
    for (int i = 0; i * kBlock < n; i++) {
      const int have = filled(kv, table[i]);
      const int need = std::min(kBlock, n - i * kBlock);
      if (have < need) {
        p = i * kBlock + have;
        break;
      }
    }
    while (p < n) {
      const int c = std::min(max_batch_, n - p);
      PHASELAB_TRY(run(kv, kv.tokens().data() + p, c, p, nullptr, LogitsMode::none));
      p += c;
    }
    return Status::ok();
  }

  // kv.reserve(T), mirrored: blocks new to the table hold nothing the device
  // computed, except the host's copy of a shared or published, partly filled
  // last block (copy on write), whose filled slots the device copies too.
  Status reserve(KvCache& kv, int T) {
    const int n = kv.n_past(), first = n / kBlock;
    const int old_tail = n % kBlock ? kv.block_table()[first] : -1;
    // Mirrored even when the reserve fails part way: the host may have made
    // its copy of the last block already.
    const Status reserved = kv.reserve(T);
    const std::vector<int>& table = kv.block_table();
    const int last = std::min((n + T - 1) / kBlock, static_cast<int>(table.size()) - 1);
    for (int i = first; i <= last; i++) {
      const int b = table[i];
      if (i == first && old_tail >= 0) {
        if (b != old_tail) {
          const size_t bytes = block_floats() * sizeof(float);
          CUDA_TRY(cudaMemcpyAsync(pool_k_ + b * block_floats(), pool_k_ + old_tail * block_floats(), bytes,
                                   cudaMemcpyDeviceToDevice, stream_));
          CUDA_TRY(cudaMemcpyAsync(pool_v_ + b * block_floats(), pool_v_ + old_tail * block_floats(), bytes,
                                   cudaMemcpyDeviceToDevice, stream_));
          set_filled(kv, b, n % kBlock);
        }
        continue;
      }
      set_filled(kv, b, 0);
    }
    return reserved;
  }

  // After a forward's kernels wrote positions [p0, p0 + T): the blocks hold
  // them, and nothing after them.
  void mark_written(const KvCache& kv, int p0, int T) {
    const std::vector<int>& table = kv.block_table();
    for (int i = p0 / kBlock; i * kBlock < p0 + T; i++) set_filled(kv, table[i], std::min(kBlock, p0 + T - i * kBlock));
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

  // The batch's tokens and first position to tokens_ / pos_, and the block
  // table entries for positions [0, p0 + T) that changed since the last
  // upload, through pinned staging buffers (asynchronous; every forward
  // synchronises before it returns, so the buffers are free again).
  Status upload_batch(const KvCache& kv, const int32_t* tokens, int T, int p0) {
    std::memcpy(stage_, tokens, T * sizeof(int32_t));
    stage_[max_batch_] = p0;
    CUDA_TRY(cudaMemcpyAsync(tokens_, stage_, T * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    CUDA_TRY(cudaMemcpyAsync(pos_, stage_ + max_batch_, sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    const std::vector<int>& table = kv.block_table();
    const int used = (p0 + T + kBlock - 1) / kBlock;
    int from = 0;
    while (from < used && from < static_cast<int>(table_uploaded_.size()) && table_uploaded_[from] == table[from]) from++;
    if (from < used) {
      std::memcpy(table_stage_ + from, table.data() + from, (used - from) * sizeof(int32_t));
      CUDA_TRY(cudaMemcpyAsync(table_dev_ + from, table_stage_ + from, (used - from) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream_));
      table_uploaded_.assign(table.begin(), table.begin() + used);
    }
    return Status::ok();
  }

  // The argmax of the last logits row, picked on the device; waits for it.
  Status download_argmax(int32_t* next) {
    CUDA_TRY(cuda::launch_argmax(logits_, c_.n_vocab, next_, stream_));
    PHASELAB_TRY(prof_.mark("argmax", stream_));
    CUDA_TRY(cudaMemcpyAsync(stage_ + max_batch_, next_, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    CUDA_TRY(cudaStreamSynchronize(stream_));
    prof_.collect(1);
    *next = stage_[max_batch_];
    return Status::ok();
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
  size_t block_floats() const { return static_cast<size_t>(c_.n_layer) * kBlock * c_.n_embd_kv(); }

  // The device pool mirroring kv's host pool (as many blocks, same layout),
  // the block table and attention scratch for its context; made anew (all
  // blocks empty) when the sequence's pool or context changes.
  Status ensure_pool(const KvCache& kv) {
    const KvPool& pool = kv.pool();
    if (pool.id() == pool_id_ && pool.n_blocks() == pool_blocks_ && kv.n_ctx() == pool_ctx_) return Status::ok();
    if (graph_exec_) {  // the graph holds the old buffers' addresses
      cudaGraphExecDestroy(graph_exec_);
      graph_exec_ = nullptr;
    }
    CUDA_TRY(cudaStreamSynchronize(stream_));  // nothing in flight may still use the old buffers
    for (void* p : {static_cast<void*>(pool_k_), static_cast<void*>(pool_v_), static_cast<void*>(scratch_),
                    static_cast<void*>(table_dev_)})
      if (p) {
        cudaFree(p);
        allocations_.erase(std::remove(allocations_.begin(), allocations_.end(), p), allocations_.end());
      }
    if (table_stage_) cudaFreeHost(table_stage_);
    pool_k_ = pool_v_ = scratch_ = nullptr;
    table_dev_ = table_stage_ = nullptr;
    pool_id_ = 0;  // until the new buffers exist
    table_uploaded_.clear();
    const int n_ctx = kv.n_ctx();
    const size_t n = static_cast<size_t>(pool.n_blocks()) * block_floats();
    const int table_cap = (n_ctx + kBlock - 1) / kBlock;
    size_t free_b = 0, total_b = 0;
    CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    const size_t scratch_n = std::max<size_t>(partials_floats(n_ctx), 1);
    const size_t need = (2 * n + scratch_n) * sizeof(float) + table_cap * sizeof(int32_t);
    if (need > free_b)
      return out_of_memory("the KV cache for " + std::to_string(n_ctx) + " tokens needs " + std::to_string(need >> 20) +
                           " MiB of GPU memory, " + std::to_string(free_b >> 20) + " MiB are free: lower the context size");
    PHASELAB_TRY(alloc(&pool_k_, n));
    PHASELAB_TRY(alloc(&pool_v_, n));
    PHASELAB_TRY(alloc(&scratch_, scratch_n));
    CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&table_dev_), table_cap * sizeof(int32_t)));
    allocations_.push_back(table_dev_);
    CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&table_stage_), table_cap * sizeof(int32_t)));
    table_uploaded_.reserve(table_cap);
    filled_.assign(pool.n_blocks(), BlockFill{});
    pool_id_ = pool.id();
    pool_blocks_ = pool.n_blocks();
    pool_ctx_ = n_ctx;
    return Status::ok();
  }

  // Layer il of the paged cache, for the kernels.
  cuda::KvPages pages(int il) const {
    const size_t layer = static_cast<size_t>(il) * kBlock * c_.n_embd_kv();
    return cuda::KvPages{pool_k_ + layer, pool_v_ + layer, table_dev_, block_floats()};
  }

  // out (T, n_out) = x (T, n_in) . W^T: the matrix-vector kernel for small
  // batches, cuBLAS from gemm_min_tokens_ on.
  Status matvec(const DevWeight& w, const float* x, int T, float* out) {
    if (cublas_ && T >= gemm_min_tokens_) {
      CUDA_TRY(cuda::launch_gemm_bf16(cublas_, w.data, w.type, w.row_bytes, w.n_in, w.n_out, x, T, out, w16_, w16_elems_,
                                     x16_, stream_));
      return Status::ok();
    }
    CUDA_TRY(cuda::launch_matvec(w.data, w.type, w.row_bytes, w.n_in, w.n_out, x, T, out, stream_));
    return Status::ok();
  }

  // The layers for T tokens at positions p0..; logits to the host as mode says.
  Status run(const KvCache& kv, const int32_t* tokens, int T, int p0, float* logits_host, LogitsMode mode) {
    PHASELAB_TRY(upload_batch(kv, tokens, T, p0));
    if (Status st = enqueue(T, mode, p0 + T); !st.is_ok()) return after_sync(st);
    mark_written(kv, p0, T);
    computed_ += static_cast<uint64_t>(T);
    if (mode != LogitsMode::none && logits_host) {
      const int n_out = mode == LogitsMode::last ? 1 : T;
      CUDA_TRY(cudaMemcpyAsync(logits_host, logits_, static_cast<size_t>(n_out) * c_.n_vocab * sizeof(float),
                               cudaMemcpyDeviceToHost, stream_));
    }
    CUDA_TRY(cudaStreamSynchronize(stream_));
    prof_.collect(T);
    return Status::ok();
  }

  // One decode step through the captured graph (captured on first use, and
  // again after the cache is reallocated). If capture fails the step runs
  // as plain launches from then on, and the reason is logged.
  // Either logits_host (the logits) or next (their argmax, picked on the
  // device) is filled.
  Status run_decode_graph(const KvCache& kv, int32_t token, int p0, float* logits_host, int32_t* next) {
    if (!graph_exec_) {
      cudaGraph_t graph = nullptr;
      CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      const Status st = enqueue(1, LogitsMode::last, 1);
      const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
      cudaError_t inst = cudaErrorUnknown;
      if (st.is_ok() && end == cudaSuccess) inst = cudaGraphInstantiate(&graph_exec_, graph, 0);
      if (graph) cudaGraphDestroy(graph);
      if (!st.is_ok() || end != cudaSuccess || inst != cudaSuccess) {
        graph_exec_ = nullptr;
        use_graph_ = false;
        (void)cudaGetLastError();  // clear the capture's error
        std::fprintf(stderr, "phaselab: CUDA graph capture failed (%s); decoding without graphs\n",
                     !st.is_ok() ? st.message().c_str() : cudaGetErrorString(end != cudaSuccess ? end : inst));
        if (logits_host) return run(kv, &token, 1, p0, logits_host, LogitsMode::last);
        PHASELAB_TRY(run(kv, &token, 1, p0, nullptr, LogitsMode::last));
        return download_argmax(next);
      }
    }
    PHASELAB_TRY(upload_batch(kv, &token, 1, p0));
    if (cudaError_t e = cudaGraphLaunch(graph_exec_, stream_); e != cudaSuccess)
      return after_sync(cuda_status(e, "cudaGraphLaunch", __FILE__, __LINE__));
    mark_written(kv, p0, 1);
    computed_++;
    if (!logits_host) return download_argmax(next);
    CUDA_TRY(cudaMemcpyAsync(logits_host, logits_, static_cast<size_t>(c_.n_vocab) * sizeof(float),
                             cudaMemcpyDeviceToHost, stream_));
    CUDA_TRY(cudaStreamSynchronize(stream_));
    return Status::ok();
  }

  // Every kernel of a forward pass over the tokens and position already in
  // tokens_ / pos_, with no host synchronisation (so it can be captured).
  // n_keys: how many keys the last token sees (a hint for the tiled
  // attention's key ranges; the kernels read the position from the device).
  Status enqueue(int T, LogitsMode mode, int n_keys) {
    const int D = c_.n_embd, NQ = c_.n_embd_q(), NKV = c_.n_embd_kv(), HD = c_.head_dim;
    const int n_split = cuda::attention_splits(T, c_.n_head, pool_ctx_);
    const bool tiled_attention = use_tiled_attention_ && T >= kTiledAttentionMin &&
                                 cuda::attention_tiled_fits(c_.n_head, c_.n_head_kv, c_.head_dim);
    const int tiled_splits =
        tiled_attention ? cuda::attention_tiled_splits(T, c_.n_head, c_.n_head_kv, n_keys, sm_count_) : 1;
    PHASELAB_TRY(prof_.begin(stream_));
    CUDA_TRY(cuda::launch_embedding(tok_embd_.data, tok_embd_.type, tok_embd_.row_bytes, tokens_, T, D, c_.embd_scale, x_, stream_));
    // xb = the first layer's attention input; later layers get theirs from
    // the previous layer's closing add_rmsnorm.
    CUDA_TRY(cuda::launch_rmsnorm(x_, layers_[0].attn_norm, xb_, T, D, c_.rms_eps, stream_));
    PHASELAB_TRY(prof_.mark("embedding + first norm", stream_));
    const bool gelu = c_.act == Activation::gelu_tanh;
    for (int il = 0; il < c_.n_layer; il++) {
      const DevLayer& L = layers_[il];
      if (cublas_ && T >= gemm_min_tokens_) {
        PHASELAB_TRY(matvec(L.wq, xb_, T, q_));
        PHASELAB_TRY(matvec(L.wk, xb_, T, k_));
        PHASELAB_TRY(matvec(L.wv, xb_, T, v_));
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
                                               pages(il), T, c_.n_head, c_.n_head_kv, HD, c_.n_rot, pos_, base, rope_ff_,
                                               c_.rope_neox, c_.rms_eps, stream_));
      PHASELAB_TRY(prof_.mark("QK-norm + RoPE + K/V store", stream_));
      const int window = c_.window_of(il);
      if (tiled_attention)  // prefill batches: query tiles share K/V tiles
        CUDA_TRY(cuda::launch_attention_tiled(q_, pages(il), xb_, scratch_, T, pos_, c_.n_head, c_.n_head_kv, HD, window,
                                              c_.attn_scale, c_.attn_logit_softcap, tiled_splits, stream_));
      else
        CUDA_TRY(cuda::launch_attention(q_, pages(il), xb_, scratch_, T, pos_, c_.n_head, c_.n_head_kv, HD, window,
                                        c_.attn_scale, c_.attn_logit_softcap, n_split, stream_));
      PHASELAB_TRY(prof_.mark("attention", stream_));
      PHASELAB_TRY(matvec(L.wo, xb_, T, xb2_));
      PHASELAB_TRY(prof_.mark("output projection", stream_));
      // Post-attention norm, residual add and the feed-forward's norm in one pass.
      CUDA_TRY(cuda::launch_add_rmsnorm(x_, xb2_, c_.post_norms ? L.post_attn_norm : nullptr, L.ffn_norm, xb_, T, D,
                                        c_.rms_eps, stream_));
      PHASELAB_TRY(prof_.mark("norms + residual adds", stream_));
      if (cublas_ && T >= gemm_min_tokens_) {
        PHASELAB_TRY(matvec(L.w_gate, xb_, T, hb_));
        PHASELAB_TRY(matvec(L.w_up, xb_, T, hb2_));
        CUDA_TRY(cuda::launch_gated_act(hb_, hb2_, static_cast<size_t>(T) * c_.n_ff, gelu, stream_));
      } else {  // both products and the activation in one kernel
        CUDA_TRY(cuda::launch_matvec_gated(L.w_gate.data, L.w_gate.type, L.w_gate.row_bytes, L.w_up.data, L.w_up.type,
                                           L.w_up.row_bytes, L.w_gate.n_in, L.w_gate.n_out, xb_, T, gelu, hb_, stream_));
      }
      PHASELAB_TRY(prof_.mark("FFN gate + up + activation", stream_));
      PHASELAB_TRY(matvec(L.w_down, hb_, T, xb2_));
      PHASELAB_TRY(prof_.mark("FFN down", stream_));
      // Post-FFN norm, residual add and the next layer's attention norm (the
      // output norm after the last layer) in one pass.
      const float* next_norm = il + 1 < c_.n_layer ? layers_[il + 1].attn_norm : output_norm_;
      CUDA_TRY(cuda::launch_add_rmsnorm(x_, xb2_, c_.post_norms ? L.post_ffw_norm : nullptr, next_norm, xb_, T, D,
                                        c_.rms_eps, stream_));
      PHASELAB_TRY(prof_.mark("norms + residual adds", stream_));
    }
    if (mode != LogitsMode::none) {
      const int first = mode == LogitsMode::last ? T - 1 : 0;
      const int n_out = T - first;
      PHASELAB_TRY(matvec(output_, xb_ + static_cast<size_t>(first) * D, n_out, logits_));
      if (c_.final_logit_softcap > 0)
        CUDA_TRY(cuda::launch_softcap(logits_, static_cast<size_t>(n_out) * c_.n_vocab, c_.final_logit_softcap, stream_));
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
  // Work buffers for a batch of T <= max_batch tokens (as in the CPU backend).
  float *x_ = nullptr, *xb_ = nullptr, *xb2_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr;
  float *hb_ = nullptr, *hb2_ = nullptr, *logits_ = nullptr;
  int32_t* tokens_ = nullptr;  // (max_batch) tokens of the batch, then pos_
  int32_t* pos_ = nullptr;     // position of the batch's first token (device)
  int32_t* next_ = nullptr;    // the argmax of forward_greedy (device)
  int32_t* stage_ = nullptr;   // pinned host staging of the same (max_batch + 1)
  // cuBLAS prefill (null below gemm_min_tokens_ batches)
  cublasHandle_t cublas_ = nullptr;
  // At least 2: cuBLAS stays out of the captured one-token decode graph.
  int gemm_min_tokens_ = std::max(2, env_int("PHASELAB_CUDA_GEMM_MIN", 16));
  __nv_bfloat16 *w16_ = nullptr, *x16_ = nullptr;
  size_t w16_elems_ = 0;
  // Prefill attention from kTiledAttentionMin tokens: the tiled kernel
  // (PHASELAB_CUDA_ATTN_TILED=0: the one-warp-per-query kernel throughout).
  static constexpr int kTiledAttentionMin = 4;
  int sm_count_ = 1;  // the GPU's multiprocessors (the tiled attention's key ranges)
  bool use_tiled_attention_ = std::getenv("PHASELAB_CUDA_ATTN_TILED") == nullptr ||
                              std::strcmp(std::getenv("PHASELAB_CUDA_ATTN_TILED"), "0") != 0;
  // The decode step's graph (valid for the current cache)
  cudaGraphExec_t graph_exec_ = nullptr;
  bool use_graph_ = std::getenv("PHASELAB_CUDA_GRAPHS") == nullptr || std::strcmp(std::getenv("PHASELAB_CUDA_GRAPHS"), "0") != 0;
  // The paged K/V pool mirroring the host's: (n_blocks, n_layer, kBlock,
  // n_embd_kv) each; filled_: leading slots of each block the device
  // computed. scratch_: attention's partial results.
  float *pool_k_ = nullptr, *pool_v_ = nullptr, *scratch_ = nullptr;
  int32_t* table_dev_ = nullptr;     // the sequence's block table (pool_ctx_ / kBlock entries)
  int32_t* table_stage_ = nullptr;   // pinned staging of the same
  std::vector<int> table_uploaded_;  // what table_dev_ holds
  uint64_t pool_id_ = 0;             // the host pool mirrored (KvPool::id)
  int pool_blocks_ = 0, pool_ctx_ = 0;
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

PHASELAB_CUDA_EXPORT int phaselab_cuda_abi() { return 2; }  // 2: Backend::positions_computed

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
