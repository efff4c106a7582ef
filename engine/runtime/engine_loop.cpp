#include "engine_loop.h"

#include <algorithm>
#include <map>
#include <new>
#include <string>

namespace phaselab {

namespace {
double ms_since(Sequence::Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Sequence::Clock::now() - t0).count();
}
}  // namespace

Sequence::Sequence(uint64_t id_, std::vector<int32_t> prompt, const GenerateOptions& opt, TokenCallback cb,
                   const Model& model, int n_ctx)
    : id(id_),
      options(opt),
      on_token(std::move(cb)),
      sampler(options.sampling, model.config().n_vocab),
      tokens(std::move(prompt)),
      answer(model.tokenizer(), options, res, tokens, n_ctx),
      n_prompt(static_cast<int>(tokens.size())),
      t_submit(Clock::now()) {
  // Everything a request's answer grows into, allocated here and not in the
  // decode loop.
  tokens.reserve(static_cast<size_t>(n_prompt + options.n_predict));
  res.metrics.n_prompt = n_prompt;
  res.metrics.kv_capacity = static_cast<uint64_t>(n_ctx);
  res.tokens.reserve(options.n_predict);
  res.token_ms.reserve(options.n_predict);
  if (wants_logprobs()) {
    res.logprobs.reserve(options.n_predict);
    logprob.top.reserve(static_cast<size_t>(options.logprobs));
  }
  if (draft_source()) verify.reserve(static_cast<size_t>(options.spec_k) + 1);
}

EngineLoop::EngineLoop(Backend& backend, const Model& model, std::shared_ptr<KvPool> pool, const LoopOptions& opt)
    : backend_(backend), model_(model), pool_(std::move(pool)), opt_(opt) {
  n_vocab_ = model.config().n_vocab;
  if (opt_.token_budget <= 0 || opt_.token_budget > backend.max_batch()) opt_.token_budget = backend.max_batch();
  opt_.max_seqs = std::max(1, opt_.max_seqs);
  device_greedy_ = backend.has_device_greedy();
  if (backend.has_device_sampling()) {
    device_draws_ = true;
    draws_.resize(opt_.max_seqs);
    for (DeviceDraw& d : draws_) d.cand.resize(DeviceDraw::kMaxCandidates);
  }
  logits_.resize(static_cast<size_t>(opt_.max_seqs) * n_vocab_);
  argmax_.resize(opt_.max_seqs);
  raw_row_.resize(n_vocab_);
  chunks_.reserve(opt_.max_seqs);
  chunk_seq_.reserve(opt_.max_seqs);
  draw_chunks_.reserve(opt_.max_seqs);
  drawn_.reserve(opt_.max_seqs);
  chunk_prompt_.reserve(opt_.max_seqs);
  running_.reserve(opt_.max_seqs);
}

EngineLoop::~EngineLoop() {
  // Sequences hold blocks of the pool: free them before it goes.
  handoffs_.clear();
  running_.clear();
  waiting_.clear();
}

void EngineLoop::add(std::unique_ptr<Sequence> s) {
  s->status = SeqStatus::waiting;
  waiting_.push_back(std::move(s));
}

void EngineLoop::cancel(uint64_t id) {
  for (auto& s : running_)
    if (s->id == id) s->cancelled = true;
  for (auto& s : waiting_)
    if (s->id == id) s->cancelled = true;
}

void PassTimer::record(int decode_rows, int prompt_tokens, double ms) {
  constexpr double kWeight = 0.2;  // of the newest pass in the average
  constexpr double kFade = 0.95;   // of the sums, per mixed pass: about the last 20 count
  const auto average = [](double& avg, double v) { avg = avg > 0 ? avg + kWeight * (v - avg) : v; };
  if (prompt_tokens == 0) {
    // A pass something else stretched (the OS, another process) moves the
    // average by at most a fifth: while every pass also carries prompt
    // tokens (a long prefill) nothing corrects it, and an inflated decode
    // pass would make the prompt tokens look free.
    if (decode_rows > 0) average(decode_pass_ms, decode_pass_ms > 0 ? std::min(ms, 2 * decode_pass_ms) : ms);
  } else if (decode_rows == 0) {
    average(prefill_token_ms, ms / prompt_tokens);
  } else if (decode_pass_ms > 0) {
    excess_ms = kFade * excess_ms + (ms - decode_pass_ms);
    excess_tokens = kFade * excess_tokens + prompt_tokens;
  }
}

double PassTimer::prompt_token_ms() const {
  // Enough mixed tokens seen: theirs (a floor against noise that sums
  // below zero); else the prefill-only passes'.
  if (excess_tokens >= 16) return std::max(excess_ms / excess_tokens, 0.01 * decode_pass_ms);
  return prefill_token_ms;
}

int PassTimer::prompt_tokens_for(double share) const {
  const double per_token = prompt_token_ms();
  if (decode_pass_ms <= 0 || per_token <= 0) return -1;
  return std::max(1, static_cast<int>(share * decode_pass_ms / per_token));
}

Status EngineLoop::step(StepReport* report) {
  plan();
  StepReport r;
  int prompt_tokens = 0, decode_rows = 0;  // chunked:auto's timer: what the pass carried
  for (size_t c = 0; c < chunks_.size(); c++) {
    r.n_tokens += chunks_[c].n_tokens;
    r.prefill = r.prefill || chunk_prompt_[c];
    if (chunk_prompt_[c])
      prompt_tokens += chunks_[c].n_tokens;
    else
      decode_rows++;  // a decode or a verification
  }
  r.n_seqs = static_cast<int>(chunks_.size());
  Status st = plan_status_;
  if (st.is_ok() && !chunks_.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    st = backend_.forward_batch(chunks_.data(), static_cast<int>(chunks_.size()));
    if (st.is_ok() && opt_.prefill_share > 0) {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      timer_.record(decode_rows, prompt_tokens, ms);
    }
  }
  if (!st) {
    for (const SeqChunk& ch : chunks_) ch.kv->truncate(ch.kv->n_past());  // the reservations of this pass
    if (report) *report = StepReport{};
    return st;
  }
  if (Status pst = postprocess(); !pst) {
    // (Only a device draw's row that could not be fetched: the pass is
    // undone, its positions computed again by the next.)
    for (const SeqChunk& ch : chunks_) ch.kv->truncate(ch.kv->n_past() - ch.n_tokens);
    if (report) *report = StepReport{};
    return pst;
  }
  retire_finished();
  if (opt_.hand_off_first_token) hand_off_started();
  if (report) *report = r;
  return Status::ok();
}

// After the pass: for every sequence whose chunk reached its last token, the
// next token (sampled, the backend's argmax, or the verification's).
//
// The plain draws (no device argmax, no log-probabilities, no drafting
// distribution to keep) are made first, in parallel on the backend's host
// threads: each sequence has its own sampler, row and history, so the
// tokens are those a serial loop draws. Sampling a 262144-entry vocabulary
// at temperature 1 costs a few hundred microseconds per sequence, a
// noticeable part of a batched pass on a CPU. A lone draw splits its passes
// over the vocabulary among those threads instead (Sampler::sample with
// tasks: the same token): 0.26 ms a token on one Zen 4 core, 5% of a
// decoded token of Gemma 3 270M. A draw made on the device (SeqChunk::draw)
// is finished here from its candidates, in parallel too; where they do not
// suffice, its row is fetched and sampled as any other.
Status EngineLoop::postprocess() {
  draw_chunks_.clear();
  drawn_.assign(chunks_.size(), -1);
  for (size_t c = 0; c < chunks_.size(); c++) {
    const Sequence& s = *chunk_seq_[c];
    if (chunks_[c].mode == LogitsMode::last && !chunks_[c].argmax && !s.wants_logprobs() &&
        (!s.draw_dists || s.options.sampling.greedy()))
      draw_chunks_.push_back(c);
  }
  // A sampler's first draw may allocate (its scratch, its slices), before it
  // changes the row; should that fail, the serial loop below draws again
  // from the row as it was (nothing was consumed yet) and reports it on this
  // thread. tasks: where the draw's vocabulary passes run (empty: one pass).
  auto draw = [&](size_t c, const Sampler::HostTasks& tasks) {
    Sequence& s = *chunk_seq_[c];
    try {
      drawn_[c] = chunks_[c].draw ? s.sampler.sample_device(*chunks_[c].draw)
                                  : s.sampler.sample(chunks_[c].logits, s.tokens, tasks);
    } catch (const std::bad_alloc&) {
      drawn_[c] = -1;
    }
  };
  if (draw_chunks_.size() == 1)
    draw(draw_chunks_[0], [this](int n, const std::function<void(int)>& fn) { backend_.run_host_tasks(n, fn); });
  else if (draw_chunks_.size() >= 2)
    backend_.run_host_tasks(static_cast<int>(draw_chunks_.size()),
                            [&](int j) { draw(draw_chunks_[static_cast<size_t>(j)], {}); });
  for (size_t c = 0; c < chunks_.size(); c++) {
    if (!chunks_[c].draw) continue;
    RequestMetrics& m = chunk_seq_[c]->res.metrics;
    m.device_draws++;
    if (drawn_[c] >= 0) continue;
    m.device_draw_fetches++;
    PHASELAB_TRY(backend_.fetch_logits(static_cast<int>(c), chunks_[c].logits));
  }
  for (size_t c = 0; c < chunks_.size(); c++) {
    Sequence& s = *chunk_seq_[c];
    if (chunks_[c].mode == LogitsMode::all)
      verify_and_append(s);
    else if (chunks_[c].mode == LogitsMode::last)
      sample_and_append(s, c, drawn_[c]);
  }
  return Status::ok();
}

void EngineLoop::sample_and_append(Sequence& s, size_t c, int32_t drawn) {
  const bool prompt_done = s.res.metrics.n_generated == 0;
  // The next turn (or regenerate) of a chat starts again about here.
  if (prompt_done && s.keep_window && s.options.use_kv_cache) s.kv->pin_window();
  float* row = chunks_[c].logits;  // (n_vocab)
  // The sampler changes the row in place (bias, penalties): log-probabilities
  // come from a copy of the model's own logits.
  if (s.wants_logprobs()) std::copy_n(row, n_vocab_, raw_row_.data());
  int32_t id;
  if (drawn >= 0) {
    id = drawn;
    if (s.draw_dists) s.draw_dists->emplace_back();  // greedy: q is one-hot on the token
  } else if (chunks_[c].argmax) {
    id = *chunks_[c].argmax;
    if (s.draw_dists) s.draw_dists->emplace_back();
  } else if (s.draw_dists && !s.options.sampling.greedy()) {
    // Drafting: the token is drawn from the distribution the verification
    // will weigh it by (q), which is kept.
    TokenDist q;
    s.sampler.distribution(row, s.tokens, &q);
    id = s.sampler.draw(q);
    s.draw_dists->push_back(std::move(q));
  } else {
    id = s.sampler.sample(row, s.tokens);
    if (s.draw_dists) s.draw_dists->emplace_back();  // greedy: q is one-hot on the token
  }
  if (s.wants_logprobs()) token_logprobs(raw_row_.data(), n_vocab_, id, s.options.logprobs, &s.logprob);
  if (!append(s, id)) after_tokens(s);
}

// Verification of [t, d1..dk]: a drafted token is kept while it is what the
// target would pick (greedy) or passes the rejection test (sampling); the
// first one that does not is replaced, and when all pass, the last row gives
// the next token. The cache keeps t and the accepted drafts.
void EngineLoop::verify_and_append(Sequence& s) {
  RequestMetrics& m = s.res.metrics;
  const int k = static_cast<int>(s.verify.size()) - 1;
  const int base = s.kv->n_past() - (k + 1);
  m.spec_drafted += k;
  int accepted = 0;
  int32_t forced = -1;
  bool done = false;
  for (int j = 0; j < k && !done; j++) {
    float* lj = s.verify_logits.data() + static_cast<size_t>(j) * n_vocab_;
    const int32_t d = s.draft.tokens[j];
    int32_t replacement;
    if (s.options.sampling.greedy()) {
      const int32_t pick = s.sampler.sample(lj, s.tokens);
      replacement = pick == d ? -1 : pick;
    } else {
      s.sampler.distribution(lj, s.tokens, &s.p_dist);
      replacement = speculative_accept_or_resample(
          s.p_dist, j < static_cast<int>(s.draft.probs.size()) ? s.draft.probs[j] : TokenDist{}, d, s.sampler,
          &s.resid_dist);
    }
    if (replacement >= 0) {
      forced = replacement;
      break;
    }
    accepted++;
    m.spec_accepted++;
    done = append(s, d);
  }
  s.kv->truncate(base + 1 + accepted);
  s.verify.clear();
  if (done) return;
  if (forced < 0) forced = s.sampler.sample(s.verify_logits.data() + static_cast<size_t>(k) * n_vocab_, s.tokens);
  if (!append(s, forced)) after_tokens(s);
}

// Appends a chosen token (AnswerBuilder: text, metrics, stop conditions, the
// callback). True when the sequence is done (stop_reason set).
bool EngineLoop::append(Sequence& s, int32_t id) {
  if (s.answer.push(id, ms_since(s.t_submit), s.prefilled, static_cast<uint64_t>(s.kv->n_past()), s.on_token,
                    s.wants_logprobs() ? &s.logprob : nullptr))
    return true;
  if (s.stop && s.stop->load(std::memory_order_relaxed)) {
    s.res.metrics.stop_reason = StopReason::cancelled;
    return true;
  }
  return false;
}

// A sequence goes on: the KV-off mode computes its whole history again for
// the next token (slow on purpose: what the cache saves).
void EngineLoop::after_tokens(Sequence& s) {
  if (!s.options.use_kv_cache) s.kv->clear();
  s.status = s.remaining() == 1 ? SeqStatus::decoding : SeqStatus::prefilling;
}

void EngineLoop::retire_finished() {
  for (size_t i = 0; i < running_.size();) {
    if (!running_[i]->ended()) {
      i++;
      continue;
    }
    auto done = std::move(running_[i]);
    running_.erase(running_.begin() + static_cast<long>(i));
    const StopReason reason = done->res.metrics.stop_reason;
    finish(std::move(done), reason);
  }
}

void EngineLoop::hand_off_started() {
  for (size_t i = 0; i < running_.size();) {
    if (running_[i]->res.metrics.n_generated == 0) {
      i++;
      continue;
    }
    handoffs_.push_back(std::move(running_[i]));
    running_.erase(running_.begin() + static_cast<long>(i));
  }
}

bool EngineLoop::adopt(std::unique_ptr<Sequence>& s) {
  if (!has_room()) return false;
  s->status = s->remaining() == 1 ? SeqStatus::decoding : SeqStatus::prefilling;
  running_.push_back(std::move(s));
  return true;
}

void EngineLoop::finish(std::unique_ptr<Sequence> s, StopReason reason, Status st) {
  RequestMetrics& m = s->res.metrics;
  if (m.stop_reason == StopReason::running) m.stop_reason = reason;
  s->answer.finish();
  if (s->kv) m.kv_used = static_cast<uint64_t>(s->kv->n_past());
  const KvPool* pool = s->kv ? &s->kv->pool() : pool_.get();
  if (s->own_kv) {
    s->own_kv.reset();  // its blocks go back (full ones stay published)
    s->kv = nullptr;
  }
  if (pool) {
    m.kv_blocks_total = pool->n_blocks();
    m.kv_blocks_used = pool->n_used();
    m.kv_blocks_cached = pool->n_cached();
    m.kv_blocks_shared = pool->n_shared();
  }
  s->status = SeqStatus::finished;
  finished_.push_back(Finished{std::move(s), std::move(st)});
}

Status EngineLoop::check_invariants() const {
  if (!pool_) return Status::ok();
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
