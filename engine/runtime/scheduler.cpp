#include "phaselab/scheduler.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "phaselab/memory.h"
#include "phaselab/sampler.h"
#include "phaselab/tokenizer.h"
#include "answer_builder.h"

namespace phaselab {

namespace {
using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

// One request from submit to finish. Not movable (the matcher and the
// detokenizer hold references into it): always behind a unique_ptr.
struct Scheduler::Seq {
  Seq(uint64_t id_, BatchRequest r, const Tokenizer& tok, int n_vocab, int n_ctx)
      : id(id_),
        req(std::move(r)),
        sampler(req.options.sampling, n_vocab),
        tokens(req.prompt),
        answer(tok, req.options, res, tokens, n_ctx) {}
  uint64_t id;
  BatchRequest req;
  Sampler sampler;
  std::vector<int32_t> tokens;  // prompt, then every token generated (what a recomputation prefills)
  GenerateResult res;
  AnswerBuilder answer;         // text, metrics and stop conditions (shared with Session)
  int n_prompt = 0;
  std::unique_ptr<KvCache> kv;  // while running
  bool cancelled = false;
  int preemptions = 0;
  int prefilled = 0;            // prompt tokens computed before the first token (reuse excluded)
  Clock::time_point t_submit;
  TokenLogprob logprob;         // the latest token's, when the request asks (top keeps its capacity)

  bool wants_logprobs() const { return req.options.logprobs >= 0; }

  int remaining() const { return static_cast<int>(tokens.size()) - kv->n_past(); }
};

Result<std::unique_ptr<Scheduler>> Scheduler::create(std::shared_ptr<const Model> model, std::unique_ptr<Backend> backend,
                                                     const SchedulerOptions& opt) {
  if (!model || !backend) return invalid_argument("a scheduler needs a model and a backend");
  const ModelConfig& c = model->config();
  int n_ctx = opt.n_ctx > 0 ? opt.n_ctx : std::min(c.n_ctx_train, 4096);
  if (n_ctx > c.n_ctx_train)
    return invalid_argument("context size " + std::to_string(n_ctx) + " exceeds the " + std::to_string(c.n_ctx_train) +
                            " tokens the model was trained for");
  if (opt.max_seqs < 1 || opt.max_seqs > 4096) return invalid_argument("parallel sequences must be from 1 to 4096");
  const int budget = opt.token_budget > 0 ? std::min(opt.token_budget, backend->max_batch()) : backend->max_batch();
  const int positions = opt.kv_positions > 0 ? opt.kv_positions : n_ctx;
  const int n_blocks = (positions + KvPool::kBlockTokens - 1) / KvPool::kBlockTokens;
  // Sliding-window layers keep about a window per running sequence.
  const int window_blocks = KvPool::window_blocks_for(c, opt.max_seqs, budget);
  {
    MemoryNeed need;
    need.weights = model->weight_bytes();
    need.kv = KvPool::bytes_for(c, n_blocks, opt.kv_type, window_blocks, backend->kv_storage());
    need.work = static_cast<uint64_t>(backend->max_batch()) *
                    (static_cast<uint64_t>(c.n_vocab) + 4ull * c.n_ff + 8ull * c.n_embd) * sizeof(float) +
                static_cast<uint64_t>(opt.max_seqs) * c.n_vocab * sizeof(float);
    if (Status st = check_memory(need, available_memory_bytes()); !st) return st;
  }
  auto pool = KvPool::create(c, n_blocks, opt.kv_type, window_blocks, backend->kv_storage());
  if (!pool) return pool.status();
  std::unique_ptr<Scheduler> s(new Scheduler());
  s->model_ = std::move(model);
  s->backend_ = std::move(backend);
  s->pool_ = std::move(*pool);
  s->opt_ = opt;
  s->n_ctx_ = n_ctx;
  s->budget_ = budget;
  s->logits_.resize(static_cast<size_t>(opt.max_seqs) * c.n_vocab);
  s->argmax_.resize(opt.max_seqs);
  s->raw_row_.resize(c.n_vocab);
  s->device_greedy_ = s->backend_->has_device_greedy();
  s->chunks_.reserve(opt.max_seqs);
  s->chunk_seq_.reserve(opt.max_seqs);
  s->running_.reserve(opt.max_seqs);
  s->stats_.kv_blocks_total = n_blocks;
  return s;
}

Scheduler::~Scheduler() {
  // Sequences hold blocks of pool_: free them before it goes.
  running_.clear();
  waiting_.clear();
}

Result<uint64_t> Scheduler::submit(BatchRequest req) {
  if (req.prompt.empty()) return invalid_argument("the prompt is empty (nothing to continue from)");
  if (req.options.n_predict < 1) return invalid_argument("the token limit must be at least 1");
  PHASELAB_TRY(req.options.sampling.validate(model_->config().n_vocab));
  if (req.options.logprobs < -1 || req.options.logprobs > kMaxTopLogprobs)
    return invalid_argument("logprobs must be -1 (none) or from 0 to " + std::to_string(kMaxTopLogprobs) +
                            " alternatives (got " + std::to_string(req.options.logprobs) + ")");
  const int n_prompt = static_cast<int>(req.prompt.size());
  if (n_prompt >= n_ctx_)
    return Status(StatusCode::context_full, "the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                                                std::to_string(n_ctx_) + ": shorten it or raise the context size");
  for (int32_t t : req.prompt)
    if (t < 0 || t >= model_->config().n_vocab)
      return invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary");
  std::lock_guard lock(mu_);
  const uint64_t id = next_id_++;
  auto s = std::make_unique<Seq>(id, std::move(req), model_->tokenizer(), model_->config().n_vocab, n_ctx_);
  s->n_prompt = n_prompt;
  s->tokens.reserve(static_cast<size_t>(n_prompt + s->req.options.n_predict));
  s->t_submit = Clock::now();
  s->res.metrics.n_prompt = n_prompt;
  s->res.metrics.kv_capacity = static_cast<uint64_t>(n_ctx_);
  s->res.tokens.reserve(s->req.options.n_predict);
  if (s->wants_logprobs()) {
    s->res.logprobs.reserve(s->req.options.n_predict);
    s->logprob.top.reserve(static_cast<size_t>(s->req.options.logprobs));
  }
  incoming_.push_back(std::move(s));
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
  std::vector<uint64_t> cancels;
  {
    std::lock_guard lock(mu_);
    for (auto& s : incoming_) waiting_.push_back(std::move(s));
    incoming_.clear();
    cancels.swap(cancels_);
  }
  for (uint64_t id : cancels) {
    for (auto& s : running_)
      if (s->id == id) s->cancelled = true;
    for (auto& s : waiting_)
      if (s->id == id) s->cancelled = true;
  }
  // Cancelled sequences end here, before the pass, and free their blocks.
  for (size_t i = 0; i < running_.size();) {
    if (!running_[i]->cancelled) {
      i++;
      continue;
    }
    auto s = std::move(running_[i]);
    running_.erase(running_.begin() + static_cast<long>(i));
    finish(std::move(s), "cancelled");
  }
  for (size_t i = 0; i < waiting_.size();) {
    if (!waiting_[i]->cancelled) {
      i++;
      continue;
    }
    auto s = std::move(waiting_[i]);
    waiting_.erase(waiting_.begin() + static_cast<long>(i));
    finish(std::move(s), "cancelled");
  }
}

void Scheduler::preempt(std::unique_ptr<Seq> s) {
  s->kv.reset();  // frees its blocks (full ones stay published: a cheap recompute if not evicted)
  s->preemptions++;
  {
    std::lock_guard lock(mu_);
    stats_.preemptions++;
  }
  waiting_.push_front(std::move(s));
}

void Scheduler::finish(std::unique_ptr<Seq> s, const std::string& reason, Status st) {
  RequestMetrics& m = s->res.metrics;
  if (m.stop_reason.empty()) m.stop_reason = reason;
  m.target_passes = std::max(0, m.n_generated - 1);  // one pass per token after the first (no speculation)
  s->answer.finish();
  if (s->kv) m.kv_used = static_cast<uint64_t>(s->kv->n_past());
  s->kv.reset();
  m.kv_blocks_total = pool_->n_blocks();
  m.kv_blocks_used = pool_->n_used();
  m.kv_blocks_cached = pool_->n_cached();
  m.kv_blocks_shared = pool_->n_shared();
  BatchOutcome out;
  out.id = s->id;
  out.status = std::move(st);
  out.result = std::move(s->res);
  out.preemptions = s->preemptions;
  std::lock_guard lock(mu_);
  finished_.push_back(std::move(out));
  active_--;
  stats_.finished++;
}

// Appends a sampled token (AnswerBuilder: text, metrics, stop conditions,
// the callback). True when the sequence is done (stop_reason set).
bool Scheduler::append_token(Seq& s, int32_t id) {
  s.res.metrics.target_passes = s.res.metrics.n_generated;  // one pass per token after the first
  return s.answer.push(id, ms_between(s.t_submit, Clock::now()), s.prefilled, static_cast<uint64_t>(s.kv->n_past()),
                       s.req.on_token, s.wants_logprobs() ? &s.logprob : nullptr);
}

Status Scheduler::step() {
  drain_incoming();
  chunks_.clear();
  chunk_seq_.clear();
  int budget = budget_;
  const int n_vocab = model_->config().n_vocab;
  auto add_chunk = [&](Seq& s, int n) {
    const int p = s.kv->n_past();
    const bool last = p + n == static_cast<int>(s.tokens.size());
    SeqChunk ch;
    ch.kv = s.kv.get();
    ch.tokens = s.tokens.data() + p;
    ch.n_tokens = n;
    ch.mode = last ? LogitsMode::last : LogitsMode::none;
    ch.logits = last ? logits_.data() + chunks_.size() * static_cast<size_t>(n_vocab) : nullptr;
    // Plain greedy on a backend that picks the argmax itself: one int per
    // sequence comes back instead of its logits (so not when the request
    // wants log-probabilities, which need the whole row).
    if (last && device_greedy_ && s.req.options.sampling.plain_greedy() && !s.wants_logprobs())
      ch.argmax = &argmax_[chunks_.size()];
    chunks_.push_back(ch);
    chunk_seq_.push_back(&s);
    budget -= n;
    if (s.res.metrics.n_generated == 0) s.prefilled += n;  // prompt tokens computed before the first token
  };

  // 1. The running sequences, oldest first: every decoding sequence's next
  // token first, then chunks of the prompts still being prefilled with what
  // the budget leaves, so that a long prompt never stalls the decodes beside
  // it. Blocks come from the pool; when it is out, the newest running
  // sequence is preempted (never one already in this pass).
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < running_.size() && budget > 0;) {
      Seq& s = *running_[i];
      if ((s.remaining() == 1) != (pass == 0)) {
        i++;
        continue;
      }
      const int n = std::min(s.remaining(), budget);
      if (s.kv->reserve(n)) {
        add_chunk(s, n);
        i++;
        continue;
      }
      s.kv->truncate(s.kv->n_past());  // give back what the failed reservation took
      if (pass == 1 && !chunks_.empty()) {
        i++;  // the prefill waits for blocks; the decodes in this pass go on
        continue;
      }
      if (running_.size() > i + 1) {
        auto newest = std::move(running_.back());
        running_.pop_back();
        preempt(std::move(newest));
        continue;  // and try s again
      }
      // s is the newest itself: wait for older ones to finish, unless it is
      // alone (the pool cannot hold even one sequence of this length).
      auto self = std::move(running_[i]);
      running_.erase(running_.begin() + static_cast<long>(i));
      if (i == 0 && chunks_.empty()) {
        finish(std::move(self), "kv_full",
               out_of_memory("the KV pool (" + std::to_string(pool_->n_blocks() * KvPool::kBlockTokens) +
                             " positions) cannot hold this sequence alone: raise the KV pool size or lower the context"));
      } else {
        preempt(std::move(self));
      }
    }
  }

  // 2. Admit waiting requests in order while the budget, the sequence limit
  // and the pool allow.
  while (budget > 0 && !waiting_.empty() && static_cast<int>(running_.size()) < opt_.max_seqs) {
    Seq& s = *waiting_.front();
    s.kv = KvCache::create_in(pool_, n_ctx_);
    s.kv->set_prefix_cache(opt_.prefix_cache);
    // Reuse what the pool has published of this sequence (at least one
    // token is computed, for its logits).
    const int reuse = opt_.prefix_cache ? s.kv->reuse_prefix(s.tokens.data(), static_cast<int>(s.tokens.size()) - 1) : 0;
    if (s.preemptions == 0) s.res.metrics.n_reused = reuse;  // its first admission
    const int n = std::min(s.remaining(), budget);
    if (!s.kv->reserve(n)) {
      s.kv.reset();
      if (running_.empty() && chunks_.empty()) {
        auto self = std::move(waiting_.front());
        waiting_.pop_front();
        finish(std::move(self), "kv_full",
               out_of_memory("the KV pool (" + std::to_string(pool_->n_blocks() * KvPool::kBlockTokens) +
                             " positions) cannot hold this prompt: raise the KV pool size"));
        continue;
      }
      break;  // room comes back as running sequences finish
    }
    add_chunk(s, n);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }

  int n_tokens = 0;
  for (const SeqChunk& ch : chunks_) n_tokens += ch.n_tokens;
  if (!chunks_.empty()) {
    if (Status st = backend_->forward_batch(chunks_.data(), static_cast<int>(chunks_.size())); !st) {
      for (const SeqChunk& ch : chunks_) ch.kv->truncate(ch.kv->n_past());
      update_stats();
      return st;
    }
  }

  // 3. Sample for every sequence whose pass reached its last token; retire
  // the finished ones.
  for (size_t c = 0; c < chunks_.size(); c++) {
    if (chunks_[c].mode != LogitsMode::last) continue;
    Seq& s = *chunk_seq_[c];
    float* row = chunks_[c].logits;  // (n_vocab)
    // The sampler changes the row in place (bias, penalties): log-probabilities
    // come from a copy of the model's own logits.
    if (s.wants_logprobs()) std::copy_n(row, n_vocab, raw_row_.data());
    const int32_t id = chunks_[c].argmax ? *chunks_[c].argmax : s.sampler.sample(row, s.tokens);
    if (s.wants_logprobs()) token_logprobs(raw_row_.data(), n_vocab, id, s.req.options.logprobs, &s.logprob);
    append_token(s, id);  // sets stop_reason when the sequence is done
  }
  for (size_t i = 0; i < running_.size();) {
    Seq& s = *running_[i];
    if (s.res.metrics.stop_reason.empty()) {
      i++;
      continue;
    }
    const std::string reason = s.res.metrics.stop_reason;
    auto done = std::move(running_[i]);
    running_.erase(running_.begin() + static_cast<long>(i));
    finish(std::move(done), reason);
  }
  {
    std::lock_guard lock(mu_);
    stats_.steps += chunks_.empty() ? 0 : 1;
    stats_.tokens_computed += static_cast<uint64_t>(n_tokens);
    stats_.last_batch_tokens = n_tokens;
    stats_.last_batch_seqs = static_cast<int>(chunks_.size());
  }
  update_stats();
  return Status::ok();
}

void Scheduler::update_stats() {
  std::lock_guard lock(mu_);
  stats_.running = static_cast<int>(running_.size());
  stats_.waiting = static_cast<int>(waiting_.size() + incoming_.size());
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

Status Scheduler::check_invariants() const {
  std::map<int, int> refs, window_refs;
  for (const auto& s : running_) {
    if (!s->kv) return internal_error("running sequence " + std::to_string(s->id) + " has no KV cache");
    const std::vector<int>& table = s->kv->block_table();
    for (size_t i = 0; i < table.size(); i++) {
      refs[table[i]]++;
      if (s->kv->holds_window(static_cast<int>(i))) window_refs[table[i]]++;
    }
    // The blocks its next query sees in a sliding-window layer are held.
    const int n = s->kv->n_past();
    if (pool_->windowed())
      for (int i = s->kv->first_window_block(n); i * KvPool::kBlockTokens < n; i++)
        if (!s->kv->holds_window(i))
          return internal_error("running sequence " + std::to_string(s->id) + " lacks the window part of its block " +
                                std::to_string(i));
  }
  for (const auto& s : waiting_)
    if (s->kv) return internal_error("waiting sequence " + std::to_string(s->id) + " holds KV blocks");
  int free_or_cached = 0;
  for (int b = 0; b < pool_->n_blocks(); b++) {
    const int want = refs.count(b) ? refs[b] : 0;
    if (pool_->refcount(b) != want)
      return internal_error("block " + std::to_string(b) + " has reference count " + std::to_string(pool_->refcount(b)) +
                            " but " + std::to_string(want) + " tables hold it");
    if (want == 0) free_or_cached++;
    const int want_window = window_refs.count(b) ? window_refs[b] : 0;
    if (pool_->window_refcount(b) != want_window)
      return internal_error("block " + std::to_string(b) + "'s window part has " +
                            std::to_string(pool_->window_refcount(b)) + " holders but " + std::to_string(want_window) +
                            " tables hold it");
  }
  if (pool_->n_free() + pool_->n_cached() != free_or_cached)
    return internal_error("the pool counts " + std::to_string(pool_->n_free() + pool_->n_cached()) +
                          " unreferenced blocks but " + std::to_string(free_or_cached) + " are");
  return Status::ok();
}

}  // namespace phaselab
