// Loads the CUDA backend (libphaselab_cuda.so) at run time, so that the rest
// of PhaseLab neither links CUDA nor needs a GPU. Every way this can fail is
// turned into a reason the user can read; callers then fall back to the CPU.
//
// The library speaks plain C (engine/backend/cuda/cuda_abi.h): its table is
// checked here (size, version, the size of every struct) before anything is
// called, and CudaHostBackend, the Backend the engine sees, translates the
// Model, the KvCache books and the SeqChunks into that table's POD views.
// The host bookkeeping (checking a batch, KvCache::reserve and append) stays
// on this side; the library owns the device.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>

#include "backend/cpu/ref_ops.h"
#include "backend/cuda/cuda_abi.h"
#include "phaselab/backend.h"
#include "phaselab/machine.h"
#include "phaselab/sampler.h"
#include "phaselab/thread_pool.h"

namespace phaselab {

static_assert(KvPool::kBlockTokens == PHASELAB_CUDA_KV_BLOCK_TOKENS, "the device pool mirrors the host's blocks");
static_assert(static_cast<int>(KvType::f32) == 0 && static_cast<int>(KvType::f16) == 1 &&
                  static_cast<int>(KvType::bf16) == 2 && static_cast<int>(KvType::q8_0) == 3,
              "PhlCudaPool::kv_type numbers KvType");
static_assert(static_cast<int>(LogitsMode::none) == 0 && static_cast<int>(LogitsMode::last) == 1 &&
                  static_cast<int>(LogitsMode::all) == 2,
              "PhlCudaChunk::logits_mode numbers LogitsMode");

namespace {

struct Library {
  void* handle = nullptr;  // kept open for the life of the process
  const PhlCudaTable* table = nullptr;
  std::string error;
};

std::string executable_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  return std::filesystem::path(buf).parent_path().string();
}

// Why the table t (from library c) cannot be used, or "" when it can: the
// library must have been built with this side's cuda_abi.h.
std::string table_mismatch(const PhlCudaTable* t) {
  if (!t) return "its table is missing";
  if (t->abi_version != PHASELAB_CUDA_ABI_VERSION)
    return "it speaks version " + std::to_string(t->abi_version) + " of the CUDA library interface, PhaseLab version " +
           std::to_string(PHASELAB_CUDA_ABI_VERSION) + " (install the libphaselab_cuda.so of this PhaseLab)";
  if (t->size != sizeof(PhlCudaTable))
    return "its table has " + std::to_string(t->size) + " bytes, PhaseLab's " + std::to_string(sizeof(PhlCudaTable));
  const struct {
    const char* name;
    uint32_t theirs;
    size_t ours;
  } sizes[] = {{"PhlCudaWeight", t->weight_size, sizeof(PhlCudaWeight)},
               {"PhlCudaVector", t->vector_size, sizeof(PhlCudaVector)},
               {"PhlCudaLayer", t->layer_size, sizeof(PhlCudaLayer)},
               {"PhlCudaConfig", t->config_size, sizeof(PhlCudaConfig)},
               {"PhlCudaModel", t->model_size, sizeof(PhlCudaModel)},
               {"PhlCudaSwitches", t->switches_size, sizeof(PhlCudaSwitches)},
               {"PhlCudaPool", t->pool_size, sizeof(PhlCudaPool)},
               {"PhlCudaSeq", t->seq_size, sizeof(PhlCudaSeq)},
               {"PhlCudaReserve", t->reserve_size, sizeof(PhlCudaReserve)},
               {"PhlCudaChunk", t->chunk_size, sizeof(PhlCudaChunk)},
               {"PhlCudaProbe", t->probe_size, sizeof(PhlCudaProbe)},
               {"PhlCudaDraw", t->draw_size, sizeof(PhlCudaDraw)}};
  for (const auto& s : sizes)
    if (s.theirs != s.ours)
      return std::string("its ") + s.name + " has " + std::to_string(s.theirs) + " bytes, PhaseLab's " +
             std::to_string(s.ours) + " (built from another cuda_abi.h)";
  if (!t->probe || !t->create || !t->destroy || !t->kv_bytes || !t->positions_computed || !t->mirror_pool ||
      !t->restore || !t->reserved || !t->forward || !t->kv_rows || !t->fetch_logits)
    return "its table lacks a function";
  return "";
}

// The library at path (CudaSwitches::library), or the installed one for "":
// loaded at the first use of each and kept open for the life of the process.
const Library& library(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, Library> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = loaded.try_emplace(path);
  Library& lib = it->second;
  if (!fresh) return lib;
  std::vector<std::string> candidates;
  // A library named by the caller is the one to use (no fallback: whoever
  // names one, the tests of the CUDA emulator for one, wants that library).
  if (!path.empty()) {
    candidates.push_back(path);
    if (!std::filesystem::exists(path)) {
      lib.error = "the CUDA backend is not available (the CUDA library asked for, " + path +
                  ", does not exist: check PHASELAB_CUDA_LIB)";
      return lib;
    }
  } else {
    const std::string dir = executable_dir();
    candidates.push_back(dir + "/libphaselab_cuda.so");
    candidates.push_back(dir + "/../kernels/libphaselab_cuda.so");  // build tree: app/ and kernels/ side by side
    candidates.push_back(dir + "/../lib/phaselab/libphaselab_cuda.so");
    candidates.push_back("libphaselab_cuda.so");
  }
  std::string errors;
  for (const auto& c : candidates) {
    if (c.find('/') != std::string::npos && !std::filesystem::exists(c)) continue;
    void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      errors += std::string(errors.empty() ? "" : "; ") + dlerror();
      continue;
    }
    auto table_fn = reinterpret_cast<PhlCudaTableFn>(dlsym(h, PHASELAB_CUDA_TABLE_SYMBOL));
    const std::string why = table_fn ? table_mismatch(table_fn()) : "it exports no " PHASELAB_CUDA_TABLE_SYMBOL;
    if (!why.empty()) {
      errors += std::string(errors.empty() ? "" : "; ") + c + " is not a compatible PhaseLab CUDA library: " + why;
      dlclose(h);
      continue;
    }
    lib.handle = h;
    lib.table = table_fn();
    return lib;
  }
  lib.error = "the CUDA backend is not available (PhaseLab was built without CUDA, or " +
              std::string(errors.empty() ? "libphaselab_cuda.so was not found" : errors) + ")";
  return lib;
}

// A call's error code and message as a Status (as the library worded it).
struct ErrorBuffer {
  char text[1024] = {0};
  Status status(int32_t code) const {
    if (code == 0) return Status::ok();
    return Status(static_cast<StatusCode>(code), text);
  }
};

PhlCudaWeight weight_view(const WeightView& w) {
  return PhlCudaWeight{w.data, static_cast<uint32_t>(w.type), static_cast<int32_t>(w.n_in),
                       static_cast<int32_t>(w.n_out), w.row_bytes};
}
// An expert tensor's per-expert views as one matrix of all their rows (the
// file holds them one after another: Model checks the 3-D tensor's shape).
PhlCudaWeight experts_view(const std::vector<WeightView>& e) {
  if (e.empty()) return PhlCudaWeight{};
  PhlCudaWeight w = weight_view(e[0]);
  w.n_out = static_cast<int32_t>(e[0].n_out * static_cast<int64_t>(e.size()));
  return w;
}

// Whether the experts' views are one tensor's consecutive slices (the layout
// experts_view hands over).
bool experts_contiguous(const std::vector<WeightView>& e) {
  for (size_t i = 1; i < e.size(); i++)
    if (e[i].data != e[0].data + i * static_cast<size_t>(e[0].n_out) * e[0].row_bytes || e[i].type != e[0].type)
      return false;
  return true;
}

PhlCudaVector vector_view(const std::vector<float>& v) {
  return PhlCudaVector{v.empty() ? nullptr : v.data(), static_cast<int64_t>(v.size())};
}

// The model as the library reads it during create(): the weights stay where
// the model maps them (the library copies them to the device).
struct ModelView {
  std::vector<PhlCudaLayer> layers;
  std::vector<std::vector<double>> rope_freqs;  // per layer: ref::rope_pair_freqs
  PhlCudaModel model{};

  explicit ModelView(const Model& m) {
    const ModelConfig& c = m.config();
    const ModelWeights& w = m.weights();
    const int expert_act = c.expert_act == Activation::swiglu_oai ? 2 : c.expert_act == Activation::gelu_tanh ? 1 : 0;
    model.config = PhlCudaConfig{c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab, c.n_rot,
                                 c.rms_eps, c.embd_scale, c.attn_scale, c.attn_logit_softcap, c.final_logit_softcap,
                                 c.rope_attn_factor,
                                 c.act == Activation::gelu_tanh, c.attn_bias, c.qk_norm, c.rope_neox, c.post_norms,
                                 c.n_expert, c.n_expert_used, c.n_ff_exp, c.expert_weights_norm,
                                 c.expert_gating == ExpertGating::softmax_top_k, expert_act};
    rope_freqs.resize(c.n_layer);
    for (int il = 0; il < c.n_layer; il++) {
      const LayerWeights& L = w.layers[il];
      // The CPU's angles (CpuBackend's rope_angles) as a table per layer.
      ref::RopeScaling rs;
      rs.freq_scale = c.rope_freq_scale_of(il);
      rs.ext_factor = c.yarn_ext_factor;
      rs.beta_fast = c.yarn_beta_fast;
      rs.beta_slow = c.yarn_beta_slow;
      rs.n_ctx_orig = c.n_ctx_orig;
      rope_freqs[il].resize(std::max(1, c.n_rot / 2));
      const float mscale = ref::rope_pair_freqs(
          rope_freqs[il].data(), c.n_rot, c.rope_base_of(il),
          w.rope_freq_factors.empty() ? nullptr : w.rope_freq_factors.data(), c.rope_attn_factor,
          rs.freq_scale != 1.f || rs.ext_factor != 0.f ? &rs : nullptr);
      layers.push_back(PhlCudaLayer{vector_view(L.attn_norm), vector_view(L.bq), vector_view(L.bk), vector_view(L.bv),
                                    vector_view(L.q_norm), vector_view(L.k_norm), vector_view(L.post_attn_norm),
                                    vector_view(L.ffn_norm), vector_view(L.post_ffw_norm), weight_view(L.wq),
                                    weight_view(L.wk), weight_view(L.wv), weight_view(L.wo), weight_view(L.w_gate),
                                    weight_view(L.w_up), weight_view(L.w_down), weight_view(L.router),
                                    experts_view(L.gate_exps), experts_view(L.up_exps), experts_view(L.down_exps),
                                    c.window_of(il), c.rope_base_of(il), vector_view(L.bo),
                                    vector_view(L.attn_sinks), vector_view(L.router_b), vector_view(L.gate_exps_b),
                                    vector_view(L.up_exps_b), vector_view(L.down_exps_b), rope_freqs[il].data(),
                                    mscale});
    }
    model.tok_embd = weight_view(w.tok_embd);
    model.output = weight_view(w.output);
    model.tied_output = w.tied_output;
    model.output_norm = vector_view(w.output_norm);
    model.rope_freq_factors = vector_view(w.rope_freq_factors);
    model.layers = layers.data();
    model.weight_bytes = m.weight_bytes();
  }
};

// A pool's geometry (its per-layer arrays kept here).
struct PoolView {
  std::vector<uint8_t> local;
  std::vector<int32_t> index;
  PhlCudaPool pool{};

  explicit PoolView(const KvPool& p, int n_layer) : local(n_layer), index(n_layer) {
    for (int il = 0; il < n_layer; il++) {
      local[il] = p.is_local(il) ? 1 : 0;
      index[il] = p.layer_index(il);
    }
    pool = PhlCudaPool{p.id(), p.n_blocks(), static_cast<int32_t>(p.type()), p.n_local_layers(),
                       p.n_window_blocks(), p.window(), n_layer, local.data(), index.data()};
  }
};

// A sequence's books as they are now: its block table with each block's
// generation and window part.
struct SeqView {
  std::vector<uint32_t> generation;
  std::vector<int32_t> window_slot;
  PhlCudaSeq seq{};

  void fill(const KvCache& kv) {
    const std::vector<int>& table = kv.block_table();
    const KvPool& pool = kv.pool();
    generation.resize(table.size());
    window_slot.resize(table.size());
    for (size_t i = 0; i < table.size(); i++) {
      generation[i] = pool.generation(table[i]);
      window_slot[i] = pool.window_slot(table[i]);
    }
    static_assert(sizeof(int) == sizeof(int32_t));
    seq = PhlCudaSeq{kv.tokens().data(), kv.n_past(), kv.n_ctx(), static_cast<int32_t>(table.size()),
                     reinterpret_cast<const int32_t*>(table.data()), generation.data(), window_slot.data()};
  }
};

// The Backend the engine sees: the host's books here, the device there.
class CudaHostBackend final : public Backend {
 public:
  CudaHostBackend(std::shared_ptr<const Model> model, int max_batch, const PhlCudaTable* t, PhlCudaDevice* dev,
                  int host_threads, bool device_sampling)
      : model_(std::move(model)),
        max_batch_(max_batch),
        t_(t),
        dev_(dev),
        device_sampling_(device_sampling),
        host_pool_(host_threads) {}
  ~CudaHostBackend() override { t_->destroy(dev_); }

  std::string name() const override { return "cuda"; }
  int max_batch() const override { return max_batch_; }
  bool batched_forward() const override { return true; }
  bool has_device_greedy() const override { return true; }
  // Sampled draws' passes over the vocabulary on the device too
  // (CudaSwitches::device_sampling): the engine loop finishes each from the
  // candidates that come back (Sampler::sample_device).
  bool has_device_sampling() const override { return device_sampling_; }
  Status fetch_logits(int i, float* out) override {
    ErrorBuffer err;
    return err.status(t_->fetch_logits(dev_, i, out, err.text, sizeof err.text));
  }
  // The sampled tokens' draws (EngineLoop::postprocess) on the host's
  // threads: a pass's sequences each on one, a lone sequence's passes over
  // the vocabulary in slices (Sampler::sample with HostTasks). One after
  // another they took 0.13 ms a sequence for Gemma 3's 262144 logits at
  // t=1, top-p 0.95 on one Zen 4 core, beside a decode pass of well under a
  // millisecond on a GPU.
  void run_host_tasks(int n, const std::function<void(int)>& fn) override {
    host_pool_.for_chunks(n, [&](int i, int) { fn(i); });
  }
  uint64_t positions_computed() const override { return t_->positions_computed(dev_); }
  // The device holds K/V; the host pools made for this backend keep the books.
  KvStorage kv_storage() const override { return KvStorage::device; }
  uint64_t kv_bytes(const KvPool& pool) const override {
    const PoolView v(pool, model_->config().n_layer);
    return t_->kv_bytes(dev_, &v.pool);
  }

  Status forward(const int32_t* tokens, int T, KvCache& kv, float* logits, LogitsMode mode) override {
    const SeqChunk chunk{&kv, tokens, T, mode, logits};
    return forward_batch(&chunk, 1);
  }

  // In the order the device needs: its pool for the chunks' host pool, the
  // positions it lacks restored (from the books before this pass), each
  // sequence's reserve mirrored as the host makes it, the pass, and the
  // host's append once the pass is done.
  Status forward_batch(const SeqChunk* chunks, int n_chunks) override {
    int T = 0;
    PHASELAB_TRY(check_batch(chunks, n_chunks, model_->config().n_vocab, max_batch_, true, &T));
    for (int i = 0; i < n_chunks; i++)
      if (&chunks[i].kv->pool() != &chunks[0].kv->pool())
        return invalid_argument("the sequences of one batch must share one KV pool");
      else if (chunks[i].draw && !device_sampling_)
        return unsupported("cuda backend: made without draws on the device (CudaSwitches::device_sampling)");
    ErrorBuffer err;
    const PoolView pool(chunks[0].kv->pool(), model_->config().n_layer);
    PHASELAB_TRY(err.status(t_->mirror_pool(dev_, &pool.pool, err.text, sizeof err.text)));
    views_.resize(std::max<size_t>(views_.size(), n_chunks));
    for (int i = 0; i < n_chunks; i++) {
      PHASELAB_TRY(mirror_planned_copy(*chunks[i].kv, views_[i]));
      views_[i].fill(*chunks[i].kv);
      PHASELAB_TRY(err.status(t_->restore(dev_, &views_[i].seq, err.text, sizeof err.text)));
    }
    for (int i = 0; i < n_chunks; i++) PHASELAB_TRY(reserve(*chunks[i].kv, chunks[i].n_tokens, views_[i]));
    pass_.clear();
    draws_.resize(std::max<size_t>(draws_.size(), n_chunks));
    for (int i = 0; i < n_chunks; i++) {  // (the books after every reserve: one may change another's window parts)
      const SeqChunk& ch = chunks[i];
      views_[i].fill(*ch.kv);
      pass_.push_back(PhlCudaChunk{&views_[i].seq, ch.tokens, ch.n_tokens, static_cast<int32_t>(ch.mode), ch.logits,
                                   ch.argmax, ch.draw ? to_abi(*ch.draw, &draws_[i]) : nullptr});
    }
    PHASELAB_TRY(err.status(t_->forward(dev_, pass_.data(), n_chunks, err.text, sizeof err.text)));
    for (int i = 0; i < n_chunks; i++)
      if (chunks[i].draw) from_abi(draws_[i], chunks[i].draw);
    for (int i = 0; i < n_chunks; i++) chunks[i].kv->append(chunks[i].tokens, chunks[i].n_tokens);
    return Status::ok();
  }

  // The KV transfer: the device's rows, after restoring what it lacks.
  bool can_transfer_kv() const override { return true; }
  Status read_kv_rows(const KvCache& kv, int pos0, int n, const KvRows& rows) override {
    ErrorBuffer err;
    const PoolView pool(kv.pool(), model_->config().n_layer);
    PHASELAB_TRY(err.status(t_->mirror_pool(dev_, &pool.pool, err.text, sizeof err.text)));
    SeqView view;
    view.fill(kv);
    PHASELAB_TRY(err.status(t_->restore(dev_, &view.seq, err.text, sizeof err.text)));
    return err.status(t_->kv_rows(dev_, &view.seq, pos0, n, rows.first, rows.k, rows.v, 0, err.text, sizeof err.text));
  }
  Status append_kv_rows(KvCache& kv, const int32_t* tokens, int n, const KvRows& rows) override {
    ErrorBuffer err;
    const PoolView pool(kv.pool(), model_->config().n_layer);
    PHASELAB_TRY(err.status(t_->mirror_pool(dev_, &pool.pool, err.text, sizeof err.text)));
    SeqView view;
    PHASELAB_TRY(mirror_planned_copy(kv, view));
    view.fill(kv);
    PHASELAB_TRY(err.status(t_->restore(dev_, &view.seq, err.text, sizeof err.text)));
    const int p = kv.n_past();
    if (Status st = reserve(kv, n, view); !st) {
      kv.truncate(p);
      return st;
    }
    PHASELAB_TRY(err.status(t_->kv_rows(dev_, &view.seq, p, n, rows.first, rows.k, rows.v, 1, err.text, sizeof err.text)));
    kv.append(tokens, n);
    return Status::ok();
  }

 private:
  // kv.reserve(T), mirrored on the device even when it fails part way (the
  // host may have made its copy of the last block already). What the device
  // needs of the books before it (the partly filled last block and its
  // window part) is read first: the reserve may give that part away.
  // A copy on write the engine loop's planning made (its KvCache::reserve,
  // before this pass), mirrored before restore(), which would otherwise
  // compute the copied positions again: n_tokens 0, the copy alone.
  Status mirror_planned_copy(KvCache& kv, SeqView& view) {
    const KvCache::TailCopy c = kv.take_tail_copy();
    if (c.index < 0 || c.index != kv.n_past() / KvPool::kBlockTokens) return Status::ok();
    const PhlCudaReserve r{kv.n_past(), 0, c.src, c.src_window_slot, c.src_generation};
    view.fill(kv);
    ErrorBuffer err;
    return err.status(t_->reserved(dev_, &view.seq, &r, err.text, sizeof err.text));
  }

  Status reserve(KvCache& kv, int T, SeqView& view) {
    const int n = kv.n_past();
    const int old_tail = n % KvPool::kBlockTokens ? kv.block_table()[n / KvPool::kBlockTokens] : -1;
    const PhlCudaReserve r{n, T, old_tail, old_tail >= 0 ? kv.pool().window_slot(old_tail) : -1,
                           old_tail >= 0 ? kv.pool().generation(old_tail) : 0u};
    const Status reserved = kv.reserve(T);
    kv.take_tail_copy();  // (a copy this reserve made: r names its source)
    view.fill(kv);
    ErrorBuffer err;
    PHASELAB_TRY(err.status(t_->reserved(dev_, &view.seq, &r, err.text, sizeof err.text)));
    return reserved;
  }

  std::shared_ptr<const Model> model_;
  int max_batch_;
  const PhlCudaTable* t_;
  PhlCudaDevice* dev_;
  std::vector<SeqView> views_;       // per chunk of the pass being run
  std::vector<PhlCudaChunk> pass_;
  std::vector<PhlCudaDraw> draws_;  // (a chunk's draw as the library sees it)
  bool device_sampling_;

  // A draw's rules as the library takes them; its candidates land in d's.
  static PhlCudaDraw* to_abi(DeviceDraw& d, PhlCudaDraw* out) {
    static_assert(sizeof(std::pair<float, int32_t>) == 2 * sizeof(float), "the library writes (float, int32) pairs");
    if (d.cand.size() < DeviceDraw::kMaxCandidates) d.cand.resize(DeviceDraw::kMaxCandidates);  // (the engine loop's are)
    *out = PhlCudaDraw{d.untruncated ? 1 : 0, d.top_k, d.use_min_p ? 1 : 0, d.top_p, d.log_min_p, d.inv_t, d.u, -1, 0,
                       0.f, 0.f, 0.0, 0u, static_cast<uint32_t>(d.cand.size()), d.cand.data()};
    return out;
  }
  static void from_abi(const PhlCudaDraw& a, DeviceDraw* d) {
    d->token = a.token;
    d->complete = a.complete != 0;
    d->max_logit = a.max_logit;
    d->cutoff = a.cutoff;
    d->total = a.total;
    d->n_cand = a.n_cand;
    d->n_back = a.token < 0 && a.n_cand <= a.cap ? a.n_cand : 0;
  }
  ThreadPool host_pool_;  // run_host_tasks (the caller is one of its threads)
};

}  // namespace

CudaProbe probe_cuda(const std::string& library_path) {
  CudaProbe p;
  const Library& lib = library(library_path);
  if (!lib.handle) {
    p.reason = lib.error;
    return p;
  }
  char buf[512] = {0};
  PhlCudaProbe found{};
  p.available = lib.table->probe(&found, buf, sizeof buf) == 1;
  (p.available ? p.description : p.reason) = buf;
  p.peak_gbps = found.peak_gbps;
  p.peak_tflops = found.peak_tflops;
  p.total_mem = found.total_mem;
  p.free_mem = found.free_mem;
  return p;
}

Result<std::unique_ptr<Backend>> make_cuda_backend(std::shared_ptr<const Model> model, int max_batch,
                                                   const CudaSwitches& sw, int host_threads) {
  if (!model) return invalid_argument("no model");
  if (max_batch < 1) return invalid_argument("batch size must be at least 1");
  const ModelConfig& mc = model->config();
  if (mc.act == Activation::swiglu_oai)  // (gpt-oss's gate is its experts'; no dense model has it)
    return unsupported("CUDA: a dense feed-forward with gpt-oss's gate runs on the CPU backends only; use --backend cpu");
  if (mc.is_moe()) {
    if (mc.n_expert_used > 16 || mc.n_expert_used < 1)
      return unsupported("CUDA: at most 16 experts per token (the model has " + std::to_string(mc.n_expert_used) +
                         "); use --backend cpu");
    for (const LayerWeights& L : model->weights().layers)
      if (!experts_contiguous(L.gate_exps) || !experts_contiguous(L.up_exps) || !experts_contiguous(L.down_exps))
        return unsupported("CUDA: expert tensors not laid out one expert after another; use --backend cpu");
  }
  const CudaProbe probe = probe_cuda(sw.library);
  if (!probe.available) return unsupported("CUDA: " + probe.reason);
  const PhlCudaTable* t = library(sw.library).table;
  const ModelView view(*model);
  const PhlCudaSwitches s{sw.graphs,       sw.tiled_attention, sw.gemm_min_rows, sw.profile,
                          sw.q8_act,       sw.bf16_weights,    sw.fused_tails,   sw.device_sampling};
  PhlCudaDevice* dev = nullptr;
  char err[1024] = {0};
  // (Any failure here is "unsupported": the caller may fall back to the CPU.)
  if (t->create(&view.model, max_batch, &s, &dev, err, sizeof err) != 0 || !dev)
    return Status(StatusCode::unsupported, std::string("CUDA: ") + err);
  // (Capped whatever the caller asks: the front ends pass their CPU thread
  // count, one per core by default, and the draws use a few at most.)
  host_threads = std::clamp(host_threads > 0 ? host_threads : default_thread_count(), 1, kCudaHostThreads);
  return std::unique_ptr<Backend>(
      std::make_unique<CudaHostBackend>(std::move(model), max_batch, t, dev, host_threads, sw.device_sampling));
}

}  // namespace phaselab
