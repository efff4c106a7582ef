#include "phaselab/scheduler.h"

#include <algorithm>
#include <chrono>
#include <unordered_set>

#include "engine_loop.h"
#include "phaselab/memory.h"
#include "phaselab/thread_pool.h"
#include "request_rules.h"

namespace phaselab {

namespace {
double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

// A sequence on its way from the prefill worker to the decode worker: its
// first token chosen, its K/V as bytes (the prefill pool's blocks already
// given back).
struct Scheduler::Handoff {
  std::unique_ptr<Sequence> seq;
  KvBlob blob;
  double export_ms = 0;
};

Result<std::unique_ptr<Scheduler>> Scheduler::create(std::shared_ptr<const Model> model, std::unique_ptr<Backend> backend,
                                                     const SchedulerOptions& opt,
                                                     std::unique_ptr<Backend> prefill_backend) {
  if (!model || !backend) return invalid_argument("a scheduler needs a model and a backend");
  const ModelConfig& c = model->config();
  auto ctx = resolve_context(c, opt.n_ctx);
  if (!ctx) return ctx.status();
  const int n_ctx = *ctx;
  if (opt.max_seqs < 1 || opt.max_seqs > 4096) return invalid_argument("parallel sequences must be from 1 to 4096");
  const SchedulePolicy& policy = opt.policy;
  const bool disaggregated = policy.kind == SchedulePolicy::Kind::disaggregated;
  if (disaggregated != (prefill_backend != nullptr))
    return invalid_argument(disaggregated ? "the disaggregated policy needs a prefill backend (create_scheduler makes one)"
                                          : "a prefill backend is for the disaggregated policy only");
  int budget = opt.token_budget > 0 ? std::min(opt.token_budget, backend->max_batch()) : backend->max_batch();
  if (policy.kind == SchedulePolicy::Kind::chunked && policy.chunk_tokens > 0) {
    if (policy.chunk_tokens > backend->max_batch())
      return invalid_argument(policy.name() + " needs passes of " + std::to_string(policy.chunk_tokens) +
                              " tokens: raise the batch size (--batch-size) to at least that");
    budget = std::min(budget, policy.chunk_tokens);
  }
  const int positions = opt.kv_positions > 0 ? opt.kv_positions : n_ctx;
  const int n_blocks = (positions + KvPool::kBlockTokens - 1) / KvPool::kBlockTokens;
  // Sliding-window layers keep about a window per running sequence.
  const int window_blocks = KvPool::window_blocks_for(c, opt.max_seqs, budget);
  uint64_t kv_bytes = KvPool::bytes_for(c, n_blocks, opt.kv_type, window_blocks, backend->kv_storage());
  if (disaggregated)  // the prefill worker's pool, as large
    kv_bytes += KvPool::bytes_for(c, n_blocks, opt.kv_type,
                                  KvPool::window_blocks_for(c, opt.max_seqs, prefill_backend->max_batch()),
                                  prefill_backend->kv_storage());
  PHASELAB_TRY(check_engine_memory(*model, *backend, kv_bytes, opt.max_seqs));
  auto pool = KvPool::create(c, n_blocks, opt.kv_type, window_blocks, backend->kv_storage());
  if (!pool) return pool.status();
  std::unique_ptr<Scheduler> s(new Scheduler());
  s->model_ = std::move(model);
  s->backend_ = std::move(backend);
  s->pool_ = std::move(*pool);
  s->opt_ = opt;
  s->n_ctx_ = n_ctx;
  s->budget_ = budget;
  LoopOptions lo;
  lo.n_ctx = n_ctx;
  lo.max_seqs = opt.max_seqs;
  lo.token_budget = budget;
  lo.prefix_cache = opt.prefix_cache;
  lo.prefill_before_decode = policy.kind == SchedulePolicy::Kind::prefill_first;
  if (policy.kind == SchedulePolicy::Kind::chunked && policy.timed) lo.prefill_share = SchedulePolicy::kAutoPrefillShare;
  s->loop_ = std::make_unique<EngineLoop>(*s->backend_, *s->model_, s->pool_, lo);
  s->stats_.kv_blocks_total = n_blocks;
  if (disaggregated) PHASELAB_TRY(s->start_prefill_worker(std::move(prefill_backend), opt, n_blocks));
  return s;
}

Scheduler::~Scheduler() {
  if (prefill_thread_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    prefill_thread_.join();
  }
  // Sequences hold blocks of the pools: free them before the pools go.
  to_import_.clear();
  handoffs_.clear();
  prefill_loop_.reset();
  loop_.reset();
  incoming_.clear();
}

Result<uint64_t> Scheduler::submit(BatchRequest req) {
  PHASELAB_TRY(validate_request(model_->config(), n_ctx_, req.prompt, req.options));
  // Not for batches: speculation (one draft source cannot serve many
  // sequences) and the KV-off demonstration mode.
  req.options.draft = nullptr;
  req.options.use_kv_cache = true;
  uint64_t id;
  {
    std::lock_guard lock(mu_);
    id = next_id_++;
    incoming_.push_back(
        std::make_unique<Sequence>(id, std::move(req.prompt), req.options, std::move(req.on_token), *model_, n_ctx_));
    active_++;
    stats_.waiting++;
  }
  wake_.notify_all();
  return id;
}

void Scheduler::cancel(uint64_t id) {
  {
    std::lock_guard lock(mu_);
    cancels_.push_back(id);
    if (disaggregated()) prefill_cancels_.push_back(id);
  }
  wake_.notify_all();
}

bool Scheduler::idle() const {
  std::lock_guard lock(mu_);
  return active_ == 0;
}

std::vector<BatchOutcome> Scheduler::take_finished() {
  std::lock_guard lock(mu_);
  return std::exchange(finished_, {});
}

Scheduler::Stats Scheduler::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Scheduler::drain_incoming() {
  std::vector<std::unique_ptr<Sequence>> incoming;
  std::vector<uint64_t> cancels;
  {
    std::lock_guard lock(mu_);
    incoming.swap(incoming_);
    cancels.swap(cancels_);
  }
  for (auto& s : incoming) loop_->add(std::move(s));
  for (uint64_t id : cancels) loop_->cancel(id);
}

void Scheduler::collect_finished(EngineLoop& loop) {
  auto done = loop.take_finished();
  if (done.empty()) return;
  {
    std::lock_guard lock(mu_);
    for (auto& f : done) {
      BatchOutcome out;
      out.id = f.seq->id;
      out.status = std::move(f.status);
      out.result = std::move(f.seq->res);
      out.preemptions = f.seq->preemptions;
      finished_.push_back(std::move(out));
      active_--;
      stats_.finished++;
    }
  }
  wake_.notify_all();
}

Status Scheduler::step() {
  if (disaggregated()) return step_disaggregated();
  drain_incoming();
  StepReport pass;
  Status st = loop_->step(&pass);
  collect_finished(*loop_);
  update_stats(st.is_ok() ? &pass : nullptr);
  return st;
}

void Scheduler::update_stats(const StepReport* pass) {
  std::lock_guard lock(mu_);
  if (pass) {
    stats_.steps += pass->n_seqs > 0 ? 1 : 0;
    stats_.tokens_computed += static_cast<uint64_t>(pass->n_tokens);
    stats_.last_batch_tokens = pass->n_tokens;
    stats_.last_batch_seqs = pass->n_seqs;
  }
  stats_.preemptions = loop_->preemptions();
  stats_.running = loop_->n_running() + prefill_running_;
  stats_.waiting = loop_->n_waiting() + static_cast<int>(incoming_.size()) + prefill_waiting_ +
                   static_cast<int>(to_import_.size() + handoffs_.size());
  stats_.kv_blocks_used = pool_->n_used();
  stats_.kv_blocks_cached = pool_->n_cached();
  stats_.kv_blocks_total = pool_->n_blocks();
}

Status Scheduler::run(const std::atomic<bool>* stop) {
  while (!idle()) {
    if (stop && stop->load(std::memory_order_relaxed)) return Status::ok();
    PHASELAB_TRY(step());
  }
  return Status::ok();
}

Status Scheduler::check_invariants() const { return loop_->check_invariants(); }

// ---- The disaggregated policy ---------------------------------------------
//
// Two workers, each with its own backend, KV pool and engine loop. The
// prefill worker (a thread of the Scheduler) admits the submitted requests,
// computes their prompts and first tokens, and hands each one over: its K/V
// exported as bytes (export_kv), its prefill blocks given back. The stepping
// thread (step()) is the decode worker: it imports the hand-offs into its
// own pool (import_kv) when it has room and runs the decodes. A decode pass
// never carries a prompt's tokens, so no stream waits for a prefill.

Status Scheduler::start_prefill_worker(std::unique_ptr<Backend> prefill_backend, const SchedulerOptions& opt,
                                       int n_blocks) {
  if (!prefill_backend->can_transfer_kv() || !backend_->can_transfer_kv())
    return unsupported(prefill_backend->name() + " and " + backend_->name() +
                       " backends: the disaggregated policy needs backends that can hand K/V over (cpu, cuda); use "
                       "chunked:N with this one");
  const ModelConfig& c = model_->config();
  const int budget = prefill_backend->max_batch();
  auto pool = KvPool::create(c, n_blocks, opt.kv_type, KvPool::window_blocks_for(c, opt.max_seqs, budget),
                             prefill_backend->kv_storage());
  if (!pool) return pool.status();
  prefill_pool_ = std::move(*pool);
  prefill_backend_ = std::move(prefill_backend);
  LoopOptions lo;
  lo.n_ctx = n_ctx_;
  lo.max_seqs = opt.max_seqs;
  lo.token_budget = budget;
  lo.prefix_cache = opt.prefix_cache;
  lo.hand_off_first_token = true;
  prefill_loop_ = std::make_unique<EngineLoop>(*prefill_backend_, *model_, prefill_pool_, lo);

  // Cores of their own: the first P CPUs the process may use for the
  // prefill worker, the next D for the decode worker.
  const int P = opt.policy.prefill_threads, D = opt.policy.decode_threads;
  const std::vector<int> cpus = allowed_cpus();
  std::vector<int> prefill_cpus;
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int x : v) {
      if (!s.empty()) s += ',';
      s += std::to_string(x);
    }
    return s;
  };
  if (static_cast<int>(cpus.size()) >= P + D) {
    prefill_cpus.assign(cpus.begin(), cpus.begin() + P);
    decode_cpus_.assign(cpus.begin() + P, cpus.begin() + P + D);
    const bool pinned = prefill_backend_->pin_threads(prefill_cpus) & backend_->pin_threads(decode_cpus_);
    placement_ = "prefill on CPU " + list(prefill_cpus) + ", decode on CPU " + list(decode_cpus_) +
                 (pinned || P + D == 2 ? "" : " (the worker threads could not be pinned)");
    if (backend_->kv_storage() == KvStorage::device)
      placement_ = "prefill and decode on two streams of the GPU (their host threads: " + placement_ + ")";
  } else {
    placement_ = "not pinned: " + std::to_string(P + D) + " threads asked for, " + std::to_string(cpus.size()) +
                 " CPUs allowed (the workers share them)";
  }
  prefill_thread_ = std::thread([this, prefill_cpus] {
    if (!prefill_cpus.empty()) pin_this_thread(prefill_cpus[0]);
    prefill_worker();
  });
  return Status::ok();
}

void Scheduler::prefill_worker() {
  for (;;) {
    std::vector<std::unique_ptr<Sequence>> incoming;
    std::vector<uint64_t> cancels;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] {
        return stopping_ || !incoming_.empty() || !prefill_cancels_.empty() || prefill_running_ + prefill_waiting_ > 0;
      });
      if (stopping_) return;
      incoming.swap(incoming_);
      cancels.swap(prefill_cancels_);
    }
    for (auto& s : incoming) prefill_loop_->add(std::move(s));
    for (uint64_t id : cancels) prefill_loop_->cancel(id);
    prefill_step();
  }
}

void Scheduler::prefill_step() {
  StepReport pass;
  const Status st = prefill_loop_->step(&pass);
  std::vector<std::unique_ptr<Handoff>> out;
  for (auto& s : prefill_loop_->take_handoffs()) {
    auto h = std::make_unique<Handoff>();
    const auto t0 = std::chrono::steady_clock::now();
    const Status exported = export_kv(*prefill_backend_, *s->kv, &h->blob);
    h->export_ms = ms_between(t0, std::chrono::steady_clock::now());
    s->own_kv.reset();  // the prefill pool's blocks go back
    s->kv = nullptr;
    h->seq = std::move(s);
    if (!exported) h->blob.tokens.clear();  // import_handoffs ends it with this error
    out.push_back(std::move(h));
  }
  collect_finished(*prefill_loop_);
  {
    std::lock_guard lock(mu_);
    for (auto& h : out) handoffs_.push_back(std::move(h));
    prefill_running_ = prefill_loop_->n_running();
    prefill_waiting_ = prefill_loop_->n_waiting();
    stats_.tokens_computed += static_cast<uint64_t>(pass.n_tokens);
    if (!st) {
      prefill_error_ = st;
      // A backend error ends nothing by itself: the sequences wait for the
      // next try (a stepping caller sees the error and decides).
    }
  }
  wake_.notify_all();
  if (!st) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

Status Scheduler::step_disaggregated() {
  if (!decode_pinned_) {
    if (!decode_cpus_.empty()) pin_this_thread(decode_cpus_[0]);
    decode_pinned_ = true;
  }
  std::vector<uint64_t> cancels;
  Status prefill_error;
  {
    std::unique_lock lock(mu_);
    // Nothing to decode: wait for a hand-off (or the end) instead of spinning.
    if (loop_->idle() && to_import_.empty())
      wake_.wait_for(lock, std::chrono::milliseconds(20), [&] {
        return !handoffs_.empty() || !cancels_.empty() || active_ == 0 || !prefill_error_.is_ok();
      });
    for (auto& h : handoffs_) to_import_.push_back(std::move(h));
    handoffs_.clear();
    cancels.swap(cancels_);
    prefill_error = std::exchange(prefill_error_, Status::ok());
  }
  for (uint64_t id : cancels) loop_->cancel(id);
  // A cancel may meet its request between the workers.
  for (auto& h : to_import_)
    if (std::find(cancels.begin(), cancels.end(), h->seq->id) != cancels.end()) h->seq->cancelled = true;
  import_handoffs();
  StepReport pass;
  Status st = loop_->step(&pass);
  collect_finished(*loop_);
  update_stats(st.is_ok() ? &pass : nullptr);
  return st.is_ok() ? prefill_error : st;
}

// The hand-offs in arrival order while the decode loop has room: each one's
// K/V go into a KvCache of the decode pool and it decodes from the next pass.
Status Scheduler::import_handoffs() {
  size_t done = 0;
  for (; done < to_import_.size() && loop_->has_room(); done++) {
    Handoff& h = *to_import_[done];
    std::unique_ptr<Sequence>& s = h.seq;
    Status st = h.blob.tokens.empty() ? internal_error("the prefill worker could not export this sequence's K/V")
                                      : Status::ok();
    const auto t0 = std::chrono::steady_clock::now();
    if (st.is_ok()) {
      s->own_kv = KvCache::create_in(pool_, n_ctx_);
      s->kv = s->own_kv.get();
      s->kv->set_prefix_cache(opt_.prefix_cache && s->options.prefix_cache);
      st = import_kv(*backend_, *s->kv, h.blob, budget_);
    }
    const double import_ms = ms_between(t0, std::chrono::steady_clock::now());
    if (st.is_ok()) {
      {
        std::lock_guard lock(mu_);
        stats_.kv_transfer.transfers++;
        stats_.kv_transfer.bytes += h.blob.bytes.size();
        stats_.kv_transfer.ms += h.export_ms + import_ms;
      }
      loop_->adopt(s);
      continue;
    }
    s->own_kv.reset();
    s->kv = nullptr;
    // Out of blocks: room comes back as the running decodes finish.
    if (st.code() == StatusCode::out_of_memory && !loop_->idle()) break;
    s->res.metrics.stop_reason = st.code() == StatusCode::out_of_memory ? StopReason::kv_full : StopReason::cancelled;
    {
      std::lock_guard lock(mu_);
      BatchOutcome outcome;
      outcome.id = s->id;
      outcome.status = std::move(st);
      outcome.result = std::move(s->res);
      finished_.push_back(std::move(outcome));
      active_--;
      stats_.finished++;
    }
  }
  to_import_.erase(to_import_.begin(), to_import_.begin() + static_cast<long>(done));
  return Status::ok();
}

Result<std::unique_ptr<Scheduler>> create_scheduler(std::shared_ptr<const Model> model, BackendOptions bo,
                                                    const SchedulerOptions& opt, std::string* fallback_reason) {
  if (!model) return invalid_argument("a scheduler needs a model");
  const SchedulePolicy& p = opt.policy;
  if (p.kind == SchedulePolicy::Kind::chunked) raise_passes(&bo, p.chunk_tokens);
  auto make = [&](int threads) -> Result<std::unique_ptr<Backend>> {
    bo.n_threads = threads;
    auto b = make_backend(model, bo);
    if (!b) return b.status();
    if (fallback_reason && !b->fallback_reason.empty()) *fallback_reason = b->fallback_reason;
    return std::move(b->backend);
  };
  if (p.kind != SchedulePolicy::Kind::disaggregated) {
    auto b = make(bo.n_threads);
    if (!b) return b.status();
    return Scheduler::create(std::move(model), std::move(*b), opt);
  }
  auto decode = make(p.decode_threads);
  if (!decode) return decode.status();
  auto prefill = make(p.prefill_threads);
  if (!prefill) return prefill.status();
  return Scheduler::create(std::move(model), std::move(*decode), opt, std::move(*prefill));
}

}  // namespace phaselab
