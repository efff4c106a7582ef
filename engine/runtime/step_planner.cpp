// EngineLoop's planning: which sequences run in the next pass, with how many
// tokens (see engine_loop.h).
//
// 1. Cancelled sequences end before the pass and free their blocks.
// 2. The running sequences, oldest first: every decoding sequence's next
//    token (with its speculative drafts, verified in the same pass) first,
//    then chunks of the prompts still being prefilled with what the token
//    budget leaves, so that a long prompt never stalls the decodes beside it
//    (LoopOptions::prefill_before_decode turns this round for the benchmark).
//    Blocks come from the pool; when it is out, the newest running sequence
//    is preempted (never one already in this pass): its blocks are freed and
//    it goes back to the front of the queue, to be recomputed (prompt and
//    the tokens it had generated) when there is room again.
// 3. Waiting sequences are admitted in arrival order while the budget, the
//    sequence limit and the pool allow; each reuses what the pool has
//    published of its tokens (a shared system prompt, an earlier turn).
//    Prompt work goes shortest remaining first: waiting prompts shorter
//    than every running prefill are admitted before the running prefills'
//    chunks, and those go shortest first, so a chat prompt arriving while
//    a long document is being prefilled gets its first token within a few
//    passes instead of after the whole document.
//    Under chunked:auto (LoopOptions::prefill_share) a pass with decodes
//    takes only the prompt tokens that fit its share of a decode pass's
//    time, as the loop has timed them (PassTimer).
#include <algorithm>
#include <limits>
#include <string>

#include "engine_loop.h"

namespace phaselab {

void EngineLoop::plan() {
  chunks_.clear();
  chunk_seq_.clear();
  chunk_prompt_.clear();
  plan_status_ = Status::ok();
  cancel_marked();
  int budget = opt_.token_budget;
  bool hold_decodes = false;
  if (opt_.prefill_before_decode) {
    for (const auto& s : running_) hold_decodes = hold_decodes || s->status == SeqStatus::prefilling;
    hold_decodes = hold_decodes || (!waiting_.empty() && n_running() < opt_.max_seqs);
  }
  if (!hold_decodes) plan_running(0, &budget);
  // chunked:auto: beside decodes, only the prompt tokens that keep the pass
  // within its share of a decode pass's time.
  if (opt_.prefill_share > 0 && !chunks_.empty()) {
    const int prompt = timer_.prompt_tokens_for(opt_.prefill_share);
    if (prompt >= 0) budget = std::min(budget, prompt);
  }
  // Prompt work, shortest remaining first: waiting prompts shorter than
  // every running prefill, then the running prefills (shortest first), then
  // whatever else waits.
  int shortest_running = std::numeric_limits<int>::max();
  for (const auto& s : running_)
    if (s->remaining() > 1 && !in_pass(*s)) shortest_running = std::min(shortest_running, s->remaining());
  admit(&budget, shortest_running);
  plan_running(1, &budget);
  admit(&budget, std::numeric_limits<int>::max());
  // Held decodes run when no prompt could take the pass (the pool is out of
  // blocks for them): better than a pass of nothing.
  if (hold_decodes && chunks_.empty()) plan_running(0, &budget);
}

// pass 0: the decoding sequences (one token, or a verification); pass 1: the
// ones still prefilling.
void EngineLoop::plan_running(int pass, int* budget) {
  if (pass == 1) {
    // The prefilling sequences by remaining prompt, shortest first (a chat
    // turn's chunks before a long document's); one that finds no blocks
    // waits, and the loop below deals with a pass that would be empty.
    std::vector<Sequence*> order;
    for (const auto& s : running_)
      if (s->remaining() > 1 && !in_pass(*s)) order.push_back(s.get());
    std::stable_sort(order.begin(), order.end(),
                     [](const Sequence* a, const Sequence* b) { return a->remaining() < b->remaining(); });
    for (Sequence* s : order) {
      if (*budget <= 0) break;
      if (!add_chunk(*s, std::min(s->remaining(), *budget), budget) && chunks_.empty()) break;
    }
  }
  for (size_t i = 0; i < running_.size() && *budget > 0;) {
    Sequence& s = *running_[i];
    // Pass 1 skips the prompts given a chunk above or admitted before it.
    if ((s.remaining() == 1) != (pass == 0) || (pass == 1 && in_pass(s))) {
      i++;
      continue;
    }
    if (pass == 0 && add_verify_chunk(s, budget)) {
      i++;
      continue;
    }
    const int n = std::min(s.remaining(), *budget);
    if (add_chunk(s, n, budget)) {
      i++;
      continue;
    }
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
    if (i == 0 && chunks_.empty())
      end_for_kv_full(std::move(self), "this sequence alone: raise the KV pool size or lower the context");
    else
      preempt(std::move(self));
  }
}

bool EngineLoop::in_pass(const Sequence& s) const {
  return std::find(chunk_seq_.begin(), chunk_seq_.end(), &s) != chunk_seq_.end();
}

void EngineLoop::admit(int* budget, int shorter_than) {
  for (size_t w = 0; *budget > 0 && w < waiting_.size() && n_running() < opt_.max_seqs;) {
    Sequence& s = *waiting_[w];
    if (!s.kv) {
      s.own_kv = KvCache::create_in(pool_, opt_.n_ctx);
      s.kv = s.own_kv.get();
    }
    const bool publish = opt_.prefix_cache && s.options.prefix_cache;
    s.kv->set_prefix_cache(publish);
    // Reuse what the cache holds of this sequence (at least one token is
    // computed, for its logits); without reuse it starts empty.
    int reuse = 0;
    if (publish && s.options.use_kv_cache)
      reuse = s.kv->reuse_prefix(s.tokens.data(), static_cast<int>(s.tokens.size()) - 1);
    else
      s.kv->truncate(0);
    auto give_back = [&] {
      if (s.own_kv) {
        s.own_kv.reset();
        s.kv = nullptr;
      }
    };
    if (s.remaining() >= shorter_than) {  // after the running prompts' chunks
      give_back();
      w++;
      continue;
    }
    if (s.preemptions == 0) s.res.metrics.n_reused = reuse;  // its first admission
    const int n = std::min(s.remaining(), *budget);
    if (!add_chunk(s, n, budget)) {
      give_back();
      if (running_.empty() && chunks_.empty()) {
        auto self = std::move(waiting_[w]);
        waiting_.erase(waiting_.begin() + static_cast<long>(w));
        end_for_kv_full(std::move(self), "this prompt: raise the KV pool size");
        continue;
      }
      break;  // room comes back as running sequences finish
    }
    running_.push_back(std::move(waiting_[w]));
    waiting_.erase(waiting_.begin() + static_cast<long>(w));
  }
}

// Reserves s's next n tokens and adds them to the pass; false (nothing
// reserved) when the pool is out of blocks.
bool EngineLoop::add_chunk(Sequence& s, int n, int* budget) {
  if (!s.kv->reserve(n)) {
    s.kv->truncate(s.kv->n_past());  // give back what the failed reservation took
    return false;
  }
  const int p = s.kv->n_past();
  const bool last = p + n == static_cast<int>(s.tokens.size());
  const bool generated = s.res.metrics.n_generated > 0;
  SeqChunk ch;
  ch.kv = s.kv;
  ch.tokens = s.tokens.data() + p;
  ch.n_tokens = n;
  ch.mode = last ? LogitsMode::last : LogitsMode::none;
  ch.logits = last ? logits_.data() + chunks_.size() * static_cast<size_t>(n_vocab_) : nullptr;
  // Plain greedy on a backend that picks the argmax itself: one int per
  // sequence comes back instead of its logits (so not when the request wants
  // log-probabilities or the drafting distribution, which need the row).
  if (last && device_greedy_ && s.options.sampling.plain_greedy() && !s.wants_logprobs() && !s.draw_dists) {
    ch.argmax = &argmax_[chunks_.size()];
  } else if (last && device_draws_ && s.sampler.device_drawable() && !s.wants_logprobs() && !s.draw_dists) {
    // Sampled likewise: a few thousand candidates instead of the row (its
    // uniform number drawn now, for whichever draw comes next).
    DeviceDraw& d = draws_[chunks_.size()];
    s.sampler.prepare_device_draw(&d);
    ch.draw = &d;
  }
  chunks_.push_back(ch);
  chunk_seq_.push_back(&s);
  // A chunk of prompt tokens, or of the history a recomputation (preemption,
  // the KV-off mode) computes again; a decode is the one token fed back.
  const bool prompt_tokens = !(generated && n == 1 && last);
  chunk_prompt_.push_back(prompt_tokens ? 1 : 0);
  *budget -= n;
  if (!generated) s.prefilled += n;  // prompt tokens computed before the first token
  if (generated) s.res.metrics.target_passes++;
  s.status = last && generated && n == 1 ? SeqStatus::decoding : SeqStatus::prefilling;
  return true;
}

// A decoding sequence with a draft source: [its last token, d1..dk] in one
// chunk whose logits are all kept; row j predicts the token after the j-th.
// False when there is no draft (or no room for one): a plain decode then.
bool EngineLoop::add_verify_chunk(Sequence& s, int* budget) {
  s.verify.clear();
  DraftSource* source = s.draft_source();
  if (!source || s.res.metrics.n_generated == 0) return false;
  const RequestMetrics& m = s.res.metrics;
  // How many tokens a verification may add: the answer's, the context's and
  // the pass's room.
  const int room = std::min({s.options.n_predict - m.n_generated, opt_.n_ctx - static_cast<int>(s.tokens.size()) - 1,
                             *budget - 1, std::min(s.options.spec_k, kMaxSpecK)});
  if (room <= 0) return false;
  const Status st = source->drafts_on_target()
                        ? source->propose_on_target(backend_, *s.kv, s.tokens, room, s.options.sampling, &s.draft)
                        : source->propose(s.tokens, room, s.options.sampling, &s.draft);
  if (!st) {
    plan_status_ = st;
    return false;
  }
  if (s.draft.tokens.empty()) return false;
  if (static_cast<int>(s.draft.tokens.size()) > room) s.draft.tokens.resize(room);
  const int k = static_cast<int>(s.draft.tokens.size());
  if (!s.kv->reserve(k + 1)) {
    s.kv->truncate(s.kv->n_past());
    return false;  // try the plain decode (with its preemption)
  }
  s.verify.push_back(s.tokens.back());
  s.verify.insert(s.verify.end(), s.draft.tokens.begin(), s.draft.tokens.end());
  s.verify_logits.resize(static_cast<size_t>(k + 1) * n_vocab_);
  SeqChunk ch;
  ch.kv = s.kv;
  ch.tokens = s.verify.data();
  ch.n_tokens = k + 1;
  ch.mode = LogitsMode::all;
  ch.logits = s.verify_logits.data();
  chunks_.push_back(ch);
  chunk_seq_.push_back(&s);
  chunk_prompt_.push_back(0);
  *budget -= k + 1;
  s.res.metrics.target_passes++;
  s.status = SeqStatus::decoding;
  return true;
}

void EngineLoop::preempt(std::unique_ptr<Sequence> s) {
  if (!s->own_kv) {  // a borrowed cache (Session's) is not the loop's to free
    end_for_kv_full(std::move(s), "this sequence alone: lower the context");
    return;
  }
  s->own_kv.reset();  // frees its blocks (full ones stay published: a cheap recompute if not evicted)
  s->kv = nullptr;
  s->preemptions++;
  s->status = SeqStatus::waiting;
  preemptions_++;
  waiting_.push_front(std::move(s));
}

void EngineLoop::end_for_kv_full(std::unique_ptr<Sequence> s, const std::string& what) {
  const int positions = (s->kv ? s->kv->pool().n_blocks() : pool_->n_blocks()) * KvPool::kBlockTokens;
  finish(std::move(s), StopReason::kv_full,
         out_of_memory("the KV pool (" + std::to_string(positions) + " positions) cannot hold " + what));
}

void EngineLoop::cancel_marked() {
  // Running and waiting sequences alike (a running one frees its blocks).
  auto end_cancelled = [this](auto& list) {
    for (auto it = list.begin(); it != list.end();) {
      if (!(*it)->cancelled) {
        ++it;
        continue;
      }
      auto s = std::move(*it);
      it = list.erase(it);
      finish(std::move(s), StopReason::cancelled);
    }
  };
  end_cancelled(running_);
  end_cancelled(waiting_);
}

}  // namespace phaselab
