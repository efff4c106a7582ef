// The one generation loop of the engine. Session (a batch of one, its chat
// cache kept between requests), the Scheduler (the thread-safe queue of many
// requests) and the batch benchmark all run their sequences through it:
//
//   step():  plan (step_planner.cpp)   which sequences run in this pass and
//                                      with how many tokens: admission in
//                                      arrival order, the token budget,
//                                      chunked prefill, preemption when the
//                                      KV pool is out of blocks, speculative
//                                      drafts for the decoding sequences
//            forward                   one Backend::forward_batch over the
//                                      chunks
//            postprocess (here)        sample (or take the backend's argmax),
//                                      or verify a speculative chunk (one
//                                      whose logits are all kept); append
//                                      the tokens (text, metrics, stop
//                                      conditions); retire the finished
//
// Every sequence's tokens are those it would get alone: the backends compute
// every row of a pass exactly as they would alone, and each sequence has its
// own sampler. The loop is single-threaded; Scheduler adds the locking.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "phaselab/backend.h"
#include "phaselab/kv_cache.h"
#include "phaselab/model.h"
#include "phaselab/sampler.h"
#include "phaselab/session.h"
#include "phaselab/speculative.h"
#include "answer_builder.h"

namespace phaselab {

enum class SeqStatus {
  waiting,     // queued (or preempted: its blocks freed, to be recomputed)
  prefilling,  // running; prompt (or recomputed) tokens still to compute
  decoding,    // running; one sampled token to feed back (or a draft to verify)
  finished,    // stop_reason set; its blocks given back
};

// One request from submission to finish. Not movable (the answer builder
// holds references into it): always behind a unique_ptr.
struct Sequence {
  using Clock = std::chrono::steady_clock;
  Sequence(uint64_t id_, std::vector<int32_t> prompt, const GenerateOptions& opt, TokenCallback cb, const Model& model,
           int n_ctx);

  uint64_t id;
  SeqStatus status = SeqStatus::waiting;
  GenerateOptions options;
  TokenCallback on_token;
  Sampler sampler;
  std::vector<int32_t> tokens;  // prompt, then every token generated (what a recomputation prefills)
  GenerateResult res;
  AnswerBuilder answer;         // text, metrics and stop conditions
  int n_prompt = 0;
  Clock::time_point t_submit;

  // Its KV cache: a borrowed one (Session's chat cache, kept after the
  // request) or, while running, its own in the loop's pool.
  KvCache* kv = nullptr;
  std::unique_ptr<KvCache> own_kv;
  bool keep_window = false;                   // pin the chat window after the prompt (Session)
  const std::atomic<bool>* stop = nullptr;    // read after every token: "cancelled"
  std::vector<TokenDist>* draw_dists = nullptr;  // drafting: draw from the distribution, keep it (draft model)
  bool cancelled = false;                     // cancel(): ends before the next pass
  int preemptions = 0;
  int prefilled = 0;            // prompt tokens computed before the first token (reuse excluded)
  TokenLogprob logprob;         // the latest token's, when the request asks (top keeps its capacity)

  // Speculative decoding: the drafts of this pass, the verified chunk
  // [last token, drafts...], its logits (k + 1, n_vocab).
  Draft draft;
  std::vector<int32_t> verify;
  std::vector<float> verify_logits;
  TokenDist p_dist, resid_dist;

  bool wants_logprobs() const { return options.logprobs >= 0; }
  DraftSource* draft_source() const { return options.use_kv_cache ? options.draft : nullptr; }
  int remaining() const { return static_cast<int>(tokens.size()) - kv->n_past(); }
  bool ended() const { return res.metrics.stop_reason != StopReason::running; }
};

struct LoopOptions {
  int n_ctx = 0;            // positions per sequence
  int max_seqs = 1;         // sequences in one pass at most
  int token_budget = 0;     // tokens per pass (<= backend.max_batch())
  bool prefix_cache = true; // reuse published blocks across sequences
  // Every admitted sequence's prompt is computed before any sequence decodes
  // (the batch benchmark, which times the phases apart); otherwise decodes go
  // first and prompts take what the budget leaves (no stalled decodes).
  bool prefill_before_decode = false;
  // The disaggregated policy's prefill worker: a sequence leaves the loop
  // after its first token (take_handoffs), its K/V still in the pool, for
  // the decode worker's loop to adopt.
  bool hand_off_first_token = false;
  // chunked:auto. > 0: a pass that carries decodes takes prompt tokens worth
  // at most this fraction of a decode-only pass, as the loop times its own
  // passes (PassTimer); the token budget still caps it. 0: the budget alone.
  double prefill_share = 0;
};

// What the loop has measured of its passes (chunked:auto): a decode-only
// pass's time (a running average), and what a prompt token adds to a pass
// that decodes too: the excess of such passes over the decode pass, summed,
// over the prompt tokens they carried, summed (both fading), so that a pass
// of one or two tokens, whose excess is mostly noise, weighs little.
// Before any mixed pass, a prefill-only pass's time per token stands in.
struct PassTimer {
  double decode_pass_ms = 0;
  double excess_ms = 0, excess_tokens = 0;  // mixed passes, fading sums
  double prefill_token_ms = 0;              // prefill-only passes (the stand-in)
  void record(int decode_rows, int prompt_tokens, double ms);
  double prompt_token_ms() const;  // 0: not measured
  // Prompt tokens for a pass that decodes too; -1: not measured yet.
  int prompt_tokens_for(double share) const;
};

// What one step did.
struct StepReport {
  int n_tokens = 0, n_seqs = 0;  // rows and sequences of the pass (0: no pass)
  bool prefill = false;          // a chunk computed prompt (or recomputed) tokens
};

class EngineLoop {
 public:
  // pool: where sequences without a cache of their own get one (may be null
  // when every sequence brings its cache, as Session's does).
  EngineLoop(Backend& backend, const Model& model, std::shared_ptr<KvPool> pool, const LoopOptions& opt);
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues a sequence (validated by the caller: request_rules.h).
  void add(std::unique_ptr<Sequence> s);
  // Marks a sequence to end ("cancelled") before the next pass.
  void cancel(uint64_t id);
  // One forward pass (none when nothing can run). An error is the backend's:
  // the pass's sequences keep their state from before it.
  Status step(StepReport* report = nullptr);
  bool idle() const { return running_.empty() && waiting_.empty(); }
  // Forgets every sequence without finishing it (their own blocks go back):
  // after an error that ends the caller's use (Session::generate).
  void drop_all() {
    running_.clear();
    waiting_.clear();
  }
  int n_running() const { return static_cast<int>(running_.size()); }
  int n_waiting() const { return static_cast<int>(waiting_.size()); }
  uint64_t preemptions() const { return preemptions_; }
  // The sequences finished since the last call, in the order they finished
  // (stop_reason set, metrics final, blocks given back). status: an error of
  // that sequence alone (the pool cannot hold it), else ok.
  struct Finished {
    std::unique_ptr<Sequence> seq;
    Status status;
  };
  std::vector<Finished> take_finished() { return std::exchange(finished_, {}); }
  // hand_off_first_token: the sequences that got their first token since
  // the last call, still running (their KvCache holds the prompt's K/V).
  std::vector<std::unique_ptr<Sequence>> take_handoffs() { return std::exchange(handoffs_, {}); }
  // Takes a decoding sequence whose K/V are already in its own KvCache in
  // this loop's pool (a hand-off, imported): it runs from the next pass.
  // False (s untouched) when the loop runs max_seqs sequences already.
  bool adopt(std::unique_ptr<Sequence>& s);
  bool has_room() const { return n_running() < opt_.max_seqs; }
  // Tests: block reference counts match the running sequences' tables.
  Status check_invariants() const;

 private:
  // step_planner.cpp: fills chunks_ for this pass.
  void plan();
  void plan_running(int pass, int* budget);
  void admit(int* budget, int shorter_than);  // the waiting prompts with fewer tokens left than shorter_than
  bool in_pass(const Sequence& s) const;  // s has a chunk in this pass already
  bool add_chunk(Sequence& s, int n, int* budget);
  bool add_verify_chunk(Sequence& s, int* budget);
  void preempt(std::unique_ptr<Sequence> s);
  void end_for_kv_full(std::unique_ptr<Sequence> s, const std::string& what);
  // engine_loop.cpp: after the pass.
  Status postprocess();
  // drawn >= 0: the token already drawn for the chunk (postprocess's
  // parallel draws); otherwise it is chosen here.
  void sample_and_append(Sequence& s, size_t chunk, int32_t drawn = -1);
  void verify_and_append(Sequence& s);
  bool append(Sequence& s, int32_t id);  // true: the sequence is done
  void after_tokens(Sequence& s);
  void retire_finished();
  void hand_off_started();  // hand_off_first_token: running sequences with a token -> handoffs_
  void finish(std::unique_ptr<Sequence> s, StopReason reason, Status st = Status::ok());
  void cancel_marked();

  Backend& backend_;
  const Model& model_;
  std::shared_ptr<KvPool> pool_;
  LoopOptions opt_;
  int n_vocab_ = 0;
  bool device_greedy_ = false;  // the backend picks greedy tokens itself (SeqChunk::argmax)
  bool device_draws_ = false;   // and makes sampled draws' passes over the vocabulary (SeqChunk::draw)

  std::vector<std::unique_ptr<Sequence>> running_;  // admission order, oldest first
  std::deque<std::unique_ptr<Sequence>> waiting_;   // preempted ones at the front
  std::vector<Finished> finished_;
  std::vector<std::unique_ptr<Sequence>> handoffs_;
  uint64_t preemptions_ = 0;

  // This pass.
  std::vector<SeqChunk> chunks_;
  std::vector<Sequence*> chunk_seq_;
  std::vector<uint8_t> chunk_prompt_;  // 1: the chunk's tokens are prompt or recomputed ones
  std::vector<float> logits_;          // (max_seqs, n_vocab) the mode-last rows
  std::vector<int32_t> argmax_;        // (max_seqs) greedy picks made by the backend
  std::vector<DeviceDraw> draws_;      // (max_seqs, where device_draws_) sampled draws made there
  std::vector<float> raw_row_;         // (n_vocab) a row's logits before sampling, for logprobs
  std::vector<size_t> draw_chunks_;    // (max_seqs) the chunks whose tokens are drawn in parallel
  std::vector<int32_t> drawn_;         // (max_seqs) their tokens, by chunk; -1: not drawn yet
  Status plan_status_;                 // a draft source's error while planning
  PassTimer timer_;                    // chunked:auto's measurements
};

}  // namespace phaselab
