// The CUDA backend's set-up, its pass over a batch and the library's C entry
// points (the design: cuda_backend_impl.h).
#include <cstdio>

#include "cuda_backend_impl.h"

namespace phaselab {

Status cuda_status(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return Status::ok();
  return internal_error(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in " + what +
                        " at " + file + ":" + std::to_string(line));
}

Status CudaDevice::init() {
  if (prof_.on()) use_graph_ = false;  // each step timed on its own
  CUDA_TRY(cudaSetDevice(0));
  CUDA_TRY(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, 0));
  // Check the memory before touching it: weights plus work buffers.
  size_t free_b = 0, total_b = 0;
  CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  const uint64_t need = model_->weight_bytes + work_bytes() + (64ull << 20);
  if (need > free_b)
    return out_of_memory("the model needs about " + std::to_string(need >> 20) + " MiB of GPU memory, " +
                         std::to_string(free_b >> 20) + " MiB are free: use a smaller model or the CPU backend");
  CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  PHASELAB_TRY(upload_weights());
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
  chunk_rows_.reserve(B);
  if (use_draws_) {
    draw_rows_ = std::min(max_batch_, kDrawRows);
    draw_head_ = std::clamp(c_.n_vocab / 8, 1, kDrawHead);
    const size_t R = static_cast<size_t>(draw_rows_);
    const size_t stage = R * (sizeof(cuda::DrawRule) + sizeof(cuda::DrawResult) + kDrawCap * sizeof(cuda::DrawCand));
    CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&draw_stage_), stage));
    void* d = nullptr;
    CUDA_TRY(cudaMalloc(&d, stage));
    allocations_.push_back(d);
    draw_rules_ = static_cast<cuda::DrawRule*>(d);
    draw_res_ = reinterpret_cast<cuda::DrawResult*>(draw_rules_ + R);
    draw_cand_ = reinterpret_cast<cuda::DrawCand*>(draw_res_ + R);
    CUDA_TRY(cudaMalloc(&draw_work_, cuda::vocab_draw_work_bytes(draw_rows_, c_.n_vocab)));
    allocations_.push_back(draw_work_);
    draw_chunks_.reserve(B);
  }
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
    if (use_bf16_weights_) PHASELAB_TRY(make_bf16_weights());
  }
  if (c_.n_expert > 0) {
    const size_t E = c_.n_expert, K = c_.n_expert_used;
    PHASELAB_TRY(alloc(&router_, B * E));
    PHASELAB_TRY(alloc(&moe_w_, B * K));
    PHASELAB_TRY(alloc(&moe_h_, B * K * c_.n_ff_exp));
    PHASELAB_TRY(alloc(&moe_y_, B * K * c_.n_embd));
    int32_t* ints = nullptr;  // sel (B * K), order (B * K), offsets, counts (E), active (E + 1)
    const size_t n_ints = 2 * B * K + 3 * E + 1;
    CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&ints), n_ints * sizeof(int32_t)));
    allocations_.push_back(ints);
    moe_sel_ = ints;
    moe_groups_ = cuda::MoeGroups{ints + B * K, ints + 2 * B * K, ints + 2 * B * K + E, ints + 2 * B * K + 2 * E};
  }
  // The integer path's 8-bit input rows (a decode pass's products; the
  // padded graphs' too).
  if (use_q8_) {
    const size_t max_in = std::max({c_.n_embd, c_.n_embd_q(), c_.n_ff});
    // (The experts' hidden rows too: B * K rows of n_ff_exp.)
    q8_.cap = B * std::max(max_in, static_cast<size_t>(c_.n_expert_used) * c_.n_ff_exp);
    CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&q8_.q), q8_.cap));
    allocations_.push_back(q8_.q);
    PHASELAB_TRY(alloc(&q8_.d, q8_.cap / 32 + 1));
  }
  if (fused_tails_ != 0) {
    const size_t n_groups = c_.n_ff > 0 && c_.n_ff % 32 == 0 ? c_.n_ff / 32 : 0;
    if (use_q8_ && n_groups > 0) {
      q8_ffn_.cap = B * c_.n_ff;
      CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&q8_ffn_.q), q8_ffn_.cap));
      allocations_.push_back(q8_ffn_.q);
      PHASELAB_TRY(alloc(&q8_ffn_.d, q8_ffn_.cap / 32 + 1));
    }
    const size_t n_counters = 1 + n_groups + c_.n_head + c_.n_head_kv + B * c_.n_head;
    CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&tail_counter_), n_counters * sizeof(unsigned)));
    allocations_.push_back(tail_counter_);
    CUDA_TRY(cudaMemset(tail_counter_, 0, n_counters * sizeof(unsigned)));
    ffn_group_counters_ = tail_counter_ + 1;
    head_counters_ = ffn_group_counters_ + n_groups;
    attn_counters_ = head_counters_ + c_.n_head + c_.n_head_kv;
  }
  // The uploads (pageable memory, legacy stream) finish before stream_'s
  // first kernel reads them.
  CUDA_TRY(cudaDeviceSynchronize());
  return Status::ok();
}

// The chunks' tokens are the rows of one pass (see plan()): every matrix
// product reads the weights once for all of them, attention runs per row
// through its own sequence's block table. A pass of one token per
// sequence, each wanting its last logits (batched decode), replays the
// graph captured for its batch-size bucket. (The engine side has checked
// the batch, mirrored the pool, restored and reserved every sequence: see
// CudaHostBackend::forward_batch; it appends the tokens after this.)
Status CudaDevice::forward(const PhlCudaChunk* chunks, int n_chunks) {
  int T = 0;
  bool decode = true;
  parts_.clear();
  for (int i = 0; i < n_chunks; i++) {
    const PhlCudaChunk& ch = chunks[i];
    T += ch.n_tokens;
    decode = decode && ch.n_tokens == 1 && ch.logits_mode == kLogitsLast;
    parts_.push_back(Part{ch.seq, ch.tokens, ch.seq->n_past, ch.n_tokens, ch.logits_mode});
  }
  PHASELAB_TRY(decode && use_graph_ ? run_decode_graph() : run_pass());
  if (Status st = copy_outputs(chunks, n_chunks); !st.is_ok()) return after_sync(st);
  CUDA_TRY(cudaStreamSynchronize(stream_));
  prof_.collect(decode ? "decode" : "prefill", T);
  for (int i = 0; i < n_chunks; i++)
    if (chunks[i].argmax && chunks[i].logits_mode == kLogitsLast)
      *chunks[i].argmax = meta_stage_[kNextField * max_batch_ + i];
  if (Status st = take_draws(chunks, 0); !st.is_ok()) return after_sync(st);
  for (int g = 1; g * draw_rows_ < static_cast<int>(draw_chunks_.size()); g++) {  // (more draws than a group)
    if (Status st = queue_draws(chunks, g); !st.is_ok()) return after_sync(st);
    CUDA_TRY(cudaStreamSynchronize(stream_));
    if (Status st = take_draws(chunks, g); !st.is_ok()) return after_sync(st);
  }
  return Status::ok();
}

// Group g of the pass's draws (draw_chunks_): their rules up, the passes
// over their logits rows, the results and every row's first kDrawHead
// candidates down into draw_stage_ (laid out as on the device).
Status CudaDevice::queue_draws(const PhlCudaChunk* chunks, int g) {
  const int first = g * draw_rows_;
  const int n = std::min(draw_rows_, static_cast<int>(draw_chunks_.size()) - first);
  if (n <= 0) return Status::ok();
  auto* rules = reinterpret_cast<cuda::DrawRule*>(draw_stage_);
  auto* results = reinterpret_cast<cuda::DrawResult*>(rules + draw_rows_);
  auto* cands = reinterpret_cast<cuda::DrawCand*>(results + draw_rows_);
  for (int j = 0; j < n; j++) {
    const int i = draw_chunks_[first + j];
    const PhlCudaDraw& d = *chunks[i].draw;
    rules[j] = cuda::DrawRule{chunk_rows_[i], d.untruncated, d.top_k, d.use_min_p, d.top_p, d.log_min_p, d.inv_t, 0.f, d.u};
  }
  CUDA_TRY(cudaMemcpyAsync(draw_rules_, rules, n * sizeof(cuda::DrawRule), cudaMemcpyHostToDevice, stream_));
  CUDA_TRY(cuda::launch_vocab_draw(logits_, c_.n_vocab, draw_rules_, n, draw_res_, draw_cand_, kDrawCap, draw_head_,
                                   draw_work_, stream_));
  PHASELAB_TRY(prof_.mark("draw", stream_));
  CUDA_TRY(cudaMemcpyAsync(results, draw_res_, n * sizeof(cuda::DrawResult), cudaMemcpyDeviceToHost, stream_));
  CUDA_TRY(cudaMemcpyAsync(cands, draw_cand_, static_cast<size_t>(n) * draw_head_ * sizeof(cuda::DrawCand),
                           cudaMemcpyDeviceToHost, stream_));
  return Status::ok();
}

// Group g's results, once the stream has done them, into their chunks'
// draws; first the rest of the candidates of the rows that have more than
// kDrawHead (few: 40 for the median Gemma 3 row at top-p 0.95), one more
// copy each and one wait.
Status CudaDevice::take_draws(const PhlCudaChunk* chunks, int g) {
  const int first = g * draw_rows_;
  const int n = std::min(draw_rows_, static_cast<int>(draw_chunks_.size()) - first);
  if (n <= 0) return Status::ok();
  const auto* results = reinterpret_cast<const cuda::DrawResult*>(draw_stage_ + draw_rows_ * sizeof(cuda::DrawRule));
  auto* cands = const_cast<cuda::DrawCand*>(reinterpret_cast<const cuda::DrawCand*>(results + draw_rows_));
  auto kept = [&](int j) {  // the candidates that come back for draw j: all of them, or none
    const cuda::DrawResult& r = results[j];
    const PhlCudaDraw& d = *chunks[draw_chunks_[first + j]].draw;
    const bool fit = d.cand && r.n_cand <= std::min(d.cap, static_cast<uint32_t>(kDrawCap));
    return r.token < 0 && fit ? r.n_cand : 0u;
  };
  bool more = false;
  for (int j = 0; j < n; j++)
    if (const uint32_t k = kept(j); k > static_cast<uint32_t>(draw_head_)) {
      const size_t at = cuda::draw_cand_index(n, kDrawCap, draw_head_, j, draw_head_);
      CUDA_TRY(cudaMemcpyAsync(cands + at, draw_cand_ + at, (k - draw_head_) * sizeof(cuda::DrawCand),
                               cudaMemcpyDeviceToHost, stream_));
      more = true;
    }
  if (more) CUDA_TRY(cudaStreamSynchronize(stream_));
  for (int j = 0; j < n; j++) {
    PhlCudaDraw& d = *chunks[draw_chunks_[first + j]].draw;
    const cuda::DrawResult& r = results[j];
    d.token = r.token;
    d.complete = r.complete;
    d.max_logit = r.max_logit;
    d.cutoff = r.cutoff;
    d.total = r.total;
    d.n_cand = r.n_cand;
    const uint32_t k = kept(j);
    if (k == 0) continue;
    auto* out = static_cast<cuda::DrawCand*>(d.cand);
    const uint32_t head = std::min(k, static_cast<uint32_t>(draw_head_));
    std::memcpy(out, cands + cuda::draw_cand_index(n, kDrawCap, draw_head_, j, 0), head * sizeof(cuda::DrawCand));
    if (k > head)
      std::memcpy(out + head, cands + cuda::draw_cand_index(n, kDrawCap, draw_head_, j, draw_head_),
                  (k - head) * sizeof(cuda::DrawCand));
  }
  return Status::ok();
}

Status CudaDevice::fetch_logits(int i, float* out) {
  if (i < 0 || i >= static_cast<int>(chunk_rows_.size()) || chunk_rows_[i] < 0)
    return invalid_argument("fetch_logits: chunk " + std::to_string(i) + " of the last pass has no logits row");
  CUDA_TRY(cudaMemcpyAsync(out, logits_ + static_cast<size_t>(chunk_rows_[i]) * c_.n_vocab, c_.n_vocab * sizeof(float),
                           cudaMemcpyDeviceToHost, stream_));
  CUDA_TRY(cudaStreamSynchronize(stream_));
  return Status::ok();
}

// After a pass over the chunks: their logits, in the order plan() gave them
// rows, queued for the host; the argmax where a chunk asks for it (one
// launch for all of them in a greedy decode pass) instead.
Status CudaDevice::copy_outputs(const PhlCudaChunk* chunks, int n_chunks) {
  int n_greedy = 0;
  for (int i = 0; i < n_chunks; i++) n_greedy += chunks[i].argmax && chunks[i].logits_mode == kLogitsLast;
  if (n_greedy == n_chunks) CUDA_TRY(cuda::launch_argmax_rows(logits_, n_chunks, c_.n_vocab, next_, stream_));
  chunk_rows_.assign(n_chunks, -1);
  draw_chunks_.clear();
  for (int i = 0, row = 0; i < n_chunks; i++) {
    const PhlCudaChunk& ch = chunks[i];
    const int n = ch.logits_mode == kLogitsLast ? 1 : ch.logits_mode == kLogitsAll ? ch.n_tokens : 0;
    const float* rows = logits_ + static_cast<size_t>(row) * c_.n_vocab;
    if (n == 1) chunk_rows_[i] = row;
    if (ch.draw && ch.logits_mode == kLogitsLast) {
      if (!use_draws_) return invalid_argument("a draw on the device, which this backend was made without");
      draw_chunks_.push_back(i);
    } else if (ch.argmax && ch.logits_mode == kLogitsLast) {
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
  return queue_draws(chunks, 0);
}

namespace {

void copy_message(const std::string& m, char* buf, size_t n) {
  if (!buf || n == 0) return;
  std::snprintf(buf, n, "%s", m.c_str());
}

// A call's status as cuda_abi.h returns it: 0, or the StatusCode with its
// message in the caller's buffer. Nothing thrown leaves the library.
template <typename F>
int32_t guarded(char* err, size_t n, F&& f) {
  try {
    const Status st = f();
    if (st.is_ok()) return 0;
    copy_message(st.message(), err, n);
    return static_cast<int32_t>(st.code());
  } catch (const std::exception& e) {
    copy_message(std::string("CUDA backend: ") + e.what(), err, n);
    return static_cast<int32_t>(StatusCode::internal);
  }
}

CudaDevice* device(PhlCudaDevice* d) { return reinterpret_cast<CudaDevice*>(d); }
const CudaDevice* device(const PhlCudaDevice* d) { return reinterpret_cast<const CudaDevice*>(d); }

// Device 0's description and peaks when it is usable, else the reason.
int32_t probe(PhlCudaProbe* out, char* buf, size_t n) {
  *out = PhlCudaProbe{};
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    copy_message(std::string("no usable CUDA device: ") + cudaGetErrorString(e), buf, n);
    return 0;
  }
  if (count == 0) {
    copy_message("no CUDA device found", buf, n);
    return 0;
  }
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, 0);
  int mem_clock_khz = 0, bus_bits = 0, sm_clock_khz = 0;
  cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, 0);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
  cudaDeviceGetAttribute(&sm_clock_khz, cudaDevAttrClockRate, 0);
  // DDR: two transfers per clock.
  out->peak_gbps = 2.0 * mem_clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  // FP32 lanes per SM by generation (an estimate for the phase meter).
  const int lanes = p.major >= 8 ? 128 : 64;
  out->peak_tflops = 2.0 * p.multiProcessorCount * lanes * sm_clock_khz * 1e3 / 1e12;
  size_t fr = 0, tot = 0;
  cudaSetDevice(0);
  cudaMemGetInfo(&fr, &tot);
  out->total_mem = tot;
  out->free_mem = fr;
  copy_message(std::string(p.name) + " (compute " + std::to_string(p.major) + "." + std::to_string(p.minor) + ", " +
                   std::to_string(tot >> 20) + " MiB)",
               buf, n);
  return 1;
}

int32_t create(const PhlCudaModel* model, int32_t max_batch, const PhlCudaSwitches* sw, PhlCudaDevice** out, char* err,
               size_t n) {
  *out = nullptr;
  return guarded(err, n, [&] {
    auto d = std::make_unique<CudaDevice>(*model, max_batch, *sw);
    PHASELAB_TRY(d->init());
    *out = reinterpret_cast<PhlCudaDevice*>(d.release());
    return Status::ok();
  });
}

void destroy(PhlCudaDevice* d) { delete device(d); }

uint64_t kv_bytes(const PhlCudaDevice* d, const PhlCudaPool* pool) { return device(d)->kv_bytes(*pool); }

uint64_t positions_computed(const PhlCudaDevice* d) { return device(d)->positions_computed(); }

int32_t mirror_pool(PhlCudaDevice* d, const PhlCudaPool* pool, char* err, size_t n) {
  return guarded(err, n, [&] { return device(d)->mirror_pool(*pool); });
}

int32_t restore(PhlCudaDevice* d, const PhlCudaSeq* seq, char* err, size_t n) {
  return guarded(err, n, [&] { return device(d)->restore(*seq); });
}

int32_t reserved(PhlCudaDevice* d, const PhlCudaSeq* seq, const PhlCudaReserve* r, char* err, size_t n) {
  return guarded(err, n, [&] { return device(d)->reserved(*seq, *r); });
}

int32_t forward(PhlCudaDevice* d, const PhlCudaChunk* chunks, int32_t n_chunks, char* err, size_t n) {
  return guarded(err, n, [&] { return device(d)->forward(chunks, n_chunks); });
}

int32_t kv_rows(PhlCudaDevice* d, const PhlCudaSeq* seq, int32_t pos0, int32_t n_pos, const int32_t* first,
                uint8_t* const* k, uint8_t* const* v, int32_t write, char* err, size_t n) {
  return guarded(err, n, [&] { return device(d)->kv_rows(*seq, pos0, n_pos, first, k, v, write != 0); });
}

int32_t fetch_logits(PhlCudaDevice* d, int32_t i, float* out, char* err, size_t n) {
  return guarded(err, n, [&] { return device(d)->fetch_logits(i, out); });
}

const PhlCudaTable kTable = {
    sizeof(PhlCudaTable),   PHASELAB_CUDA_ABI_VERSION, sizeof(PhlCudaWeight),   sizeof(PhlCudaVector),
    sizeof(PhlCudaLayer),   sizeof(PhlCudaConfig),     sizeof(PhlCudaModel),    sizeof(PhlCudaSwitches),
    sizeof(PhlCudaPool),    sizeof(PhlCudaSeq),        sizeof(PhlCudaReserve),  sizeof(PhlCudaChunk),
    sizeof(PhlCudaProbe),   sizeof(PhlCudaDraw),       &probe,                  &create,
    &destroy,               &kv_bytes,                 &positions_computed,     &mirror_pool,
    &restore,               &reserved,                 &forward,                &kv_rows,
    &fetch_logits,
};

}  // namespace

}  // namespace phaselab

// ---- the library's one export (cuda_abi.h; the loader: cuda_loader.cpp) -------

extern "C" __attribute__((visibility("default"))) const PhlCudaTable* phaselab_cuda_table(void) {
  return &phaselab::kTable;
}
