#include "phaselab/scheduler.h"

#include <algorithm>

#include "engine_loop.h"
#include "request_rules.h"

namespace phaselab {

Result<std::unique_ptr<Scheduler>> Scheduler::create(std::shared_ptr<const Model> model, std::unique_ptr<Backend> backend,
                                                     const SchedulerOptions& opt) {
  if (!model || !backend) return invalid_argument("a scheduler needs a model and a backend");
  const ModelConfig& c = model->config();
  auto ctx = resolve_context(c, opt.n_ctx);
  if (!ctx) return ctx.status();
  const int n_ctx = *ctx;
  if (opt.max_seqs < 1 || opt.max_seqs > 4096) return invalid_argument("parallel sequences must be from 1 to 4096");
  const int budget = opt.token_budget > 0 ? std::min(opt.token_budget, backend->max_batch()) : backend->max_batch();
  const int positions = opt.kv_positions > 0 ? opt.kv_positions : n_ctx;
  const int n_blocks = (positions + KvPool::kBlockTokens - 1) / KvPool::kBlockTokens;
  // Sliding-window layers keep about a window per running sequence.
  const int window_blocks = KvPool::window_blocks_for(c, opt.max_seqs, budget);
  PHASELAB_TRY(check_engine_memory(
      *model, *backend, KvPool::bytes_for(c, n_blocks, opt.kv_type, window_blocks, backend->kv_storage()), opt.max_seqs));
  auto pool = KvPool::create(c, n_blocks, opt.kv_type, window_blocks, backend->kv_storage());
  if (!pool) return pool.status();
  std::unique_ptr<Scheduler> s(new Scheduler());
  s->model_ = std::move(model);
  s->backend_ = std::move(backend);
  s->pool_ = std::move(*pool);
  s->opt_ = opt;
  s->n_ctx_ = n_ctx;
  LoopOptions lo;
  lo.n_ctx = n_ctx;
  lo.max_seqs = opt.max_seqs;
  lo.token_budget = budget;
  lo.prefix_cache = opt.prefix_cache;
  s->loop_ = std::make_unique<EngineLoop>(*s->backend_, *s->model_, s->pool_, lo);
  s->stats_.kv_blocks_total = n_blocks;
  return s;
}

Scheduler::~Scheduler() {
  // Sequences hold blocks of pool_: free them before it goes.
  loop_.reset();
  incoming_.clear();
}

Result<uint64_t> Scheduler::submit(BatchRequest req) {
  PHASELAB_TRY(validate_request(model_->config(), n_ctx_, req.prompt, req.options));
  // Not for batches: speculation (one draft source cannot serve many
  // sequences) and the KV-off demonstration mode.
  req.options.draft = nullptr;
  req.options.use_kv_cache = true;
  std::lock_guard lock(mu_);
  const uint64_t id = next_id_++;
  incoming_.push_back(
      std::make_unique<Sequence>(id, std::move(req.prompt), req.options, std::move(req.on_token), *model_, n_ctx_));
  active_++;
  stats_.waiting++;
  return id;
}

void Scheduler::cancel(uint64_t id) {
  std::lock_guard lock(mu_);
  cancels_.push_back(id);
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

void Scheduler::collect_finished() {
  auto done = loop_->take_finished();
  if (done.empty()) return;
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

Status Scheduler::step() {
  drain_incoming();
  StepReport pass;
  Status st = loop_->step(&pass);
  collect_finished();
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
  stats_.running = loop_->n_running();
  stats_.waiting = loop_->n_waiting() + static_cast<int>(incoming_.size());
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

}  // namespace phaselab
