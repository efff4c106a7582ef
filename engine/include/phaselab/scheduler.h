// Continuous batching: many requests share forward passes.
//
// Requests arrive (submit, from any thread) and leave (finished, cancelled)
// at any step. The Scheduler is the thread-safe queue around the engine's one
// generation loop (engine/runtime/engine_loop.h), which plans each pass under
// a token budget (decodes first, then chunks of prompts; admission in
// arrival order), preempts the newest sequence when the paged KV pool runs
// out of blocks (it is recomputed later, its output unchanged) and reuses
// the prompt prefixes sequences publish (a shared system prompt, an earlier
// turn).
//
// A sequence's tokens are the same as Session::generate() gives it alone:
// the backend computes every row of a batch exactly as it would alone, and
// each request has its own sampler.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "phaselab/backend.h"
#include "phaselab/kv_cache.h"
#include "phaselab/model.h"
#include "phaselab/schedule_policy.h"
#include "phaselab/session.h"
#include "phaselab/status.h"

namespace phaselab {

class EngineLoop;
struct Sequence;
struct StepReport;

struct SchedulerOptions {
  int n_ctx = 0;         // positions per sequence; <= 0: the model's trained context, capped at 4096
  int kv_positions = 0;  // positions in the shared KV pool; <= 0: n_ctx (one full-length sequence, or many short ones)
  int max_seqs = 16;     // sequences in one pass at most
  int token_budget = 0;  // tokens per pass; <= 0: the backend's max_batch()
  bool prefix_cache = true;  // reuse published blocks across sequences
  KvType kv_type = KvType::f16;
  // How passes are shared between prompts and decodes (schedule_policy.h).
  // chunked:N caps token_budget at N; disaggregated needs a prefill backend
  // (create's prefill_backend, or create_scheduler below).
  SchedulePolicy policy;
};

struct BatchRequest {
  std::vector<int32_t> prompt;  // the whole sequence to continue (a rendered chat, or plain text)
  GenerateOptions options;      // n_predict, sampling, stop, ignore_eos, logprobs (draft, use_kv_cache: not used)
  // Called on the stepping thread (disaggregated: the first token on the
  // prefill worker's thread, the others on the stepping thread; never two at
  // once for one request); TokenEvent::t_ms since submit.
  TokenCallback on_token;
};

struct BatchOutcome {
  uint64_t id = 0;
  Status status;          // an error of this request alone (the pool cannot hold it)
  GenerateResult result;  // metrics.stop_reason as in Session, with StopReason::cancelled for cancel()
  int preemptions = 0;    // times it was preempted and recomputed
};

class Scheduler {
 public:
  // prefill_backend: the disaggregated policy's prefill worker (backend is
  // then the decode worker); both must hand K/V over
  // (Backend::can_transfer_kv: the CPU and CUDA backends). Null for the
  // other policies.
  static Result<std::unique_ptr<Scheduler>> create(std::shared_ptr<const Model> model, std::unique_ptr<Backend> backend,
                                                   const SchedulerOptions& opt,
                                                   std::unique_ptr<Backend> prefill_backend = nullptr);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; its id, or why it cannot run (checked here: an empty
  // prompt, a prompt longer than the context, bad sampling parameters).
  // Thread-safe.
  Result<uint64_t> submit(BatchRequest req);
  // Ends a request at the next step, with StopReason::cancelled (its blocks
  // are freed then). Unknown or finished ids are ignored. Thread-safe.
  void cancel(uint64_t id);

  // One forward pass (or none when there is nothing to do). Only one thread
  // steps. An error here is the backend's and ends nothing by itself.
  Status step();
  // Steps until every submitted request has finished (or *stop turns true).
  Status run(const std::atomic<bool>* stop = nullptr);
  // Nothing waiting or running. Thread-safe.
  bool idle() const;
  // The requests finished since the last call, in the order they finished.
  // Thread-safe.
  std::vector<BatchOutcome> take_finished();

  struct Stats {
    int running = 0, waiting = 0;
    int kv_blocks_used = 0, kv_blocks_cached = 0, kv_blocks_total = 0;
    uint64_t steps = 0, preemptions = 0, finished = 0;
    uint64_t tokens_computed = 0;   // rows of every pass (recomputation included)
    int last_batch_tokens = 0, last_batch_seqs = 0;
    KvTransferStats kv_transfer;    // disaggregated: what the prefill worker handed over
  };
  Stats stats() const;  // thread-safe
  // Tests: every block's reference count equals the number of running
  // sequences' tables that hold it, and every free or cached block is held by
  // none. The first mismatch, or ok. Stepping thread only.
  Status check_invariants() const;

  const Model& model() const { return *model_; }
  Backend& backend() { return *backend_; }
  const KvPool& pool() const { return *pool_; }
  int n_ctx() const { return n_ctx_; }
  int max_seqs() const { return opt_.max_seqs; }
  const SchedulePolicy& policy() const { return opt_.policy; }
  // Where the disaggregated policy's workers run: "prefill on CPU 0, decode
  // on CPU 1", or why they are not pinned; "" for the other policies.
  const std::string& placement() const { return placement_; }

 private:
  Scheduler() = default;
  void drain_incoming();
  void collect_finished(EngineLoop& loop);
  void update_stats(const StepReport* pass);
  // The disaggregated policy (scheduler_disaggregated.cpp).
  struct Handoff;
  Status start_prefill_worker(std::unique_ptr<Backend> prefill_backend, const SchedulerOptions& opt, int budget);
  void prefill_worker();
  void prefill_step();
  Status import_handoffs();
  Status step_disaggregated();
  bool disaggregated() const { return prefill_loop_ != nullptr; }

  std::shared_ptr<const Model> model_;
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<KvPool> pool_;
  std::unique_ptr<EngineLoop> loop_;  // stepping thread only
  SchedulerOptions opt_;
  int n_ctx_ = 0;
  int budget_ = 0;  // tokens per pass of the (decode) loop

  // Disaggregated: the prefill worker's backend, pool and loop (its thread
  // only), and the hand-offs the stepping thread has taken but not yet
  // imported (no room yet).
  std::unique_ptr<Backend> prefill_backend_;
  std::shared_ptr<KvPool> prefill_pool_;
  std::unique_ptr<EngineLoop> prefill_loop_;
  std::thread prefill_thread_;
  std::vector<std::unique_ptr<Handoff>> to_import_;
  std::vector<int> decode_cpus_;  // pinned on the first step
  bool decode_pinned_ = false;
  std::string placement_;

  mutable std::mutex mu_;  // guards what follows
  std::condition_variable wake_;  // incoming work for the prefill worker; hand-offs and ends for the stepper
  std::vector<std::unique_ptr<Sequence>> incoming_;
  std::vector<uint64_t> cancels_;
  std::vector<uint64_t> prefill_cancels_;          // disaggregated: the prefill worker's copy
  std::vector<std::unique_ptr<Handoff>> handoffs_;  // prefill worker -> stepping thread
  std::vector<BatchOutcome> finished_;
  Status prefill_error_;  // the prefill worker's last backend error, reported by the next step()
  bool stopping_ = false;
  int prefill_running_ = 0, prefill_waiting_ = 0;
  uint64_t next_id_ = 1;
  int active_ = 0;  // submitted and not finished
  Stats stats_;
};

// A scheduler with the backend(s) its policy runs on, made from bo (the
// kind, the switches, the batch size): for disaggregated:P+D a prefill
// backend of P threads and a decode backend of D threads (with the CUDA
// kind, two CUDA backends: two streams of the GPU), else one backend of
// bo.n_threads.
// *fallback_reason (when given) says why a CUDA kind fell back to the CPU.
Result<std::unique_ptr<Scheduler>> create_scheduler(std::shared_ptr<const Model> model, BackendOptions bo,
                                                    const SchedulerOptions& opt, std::string* fallback_reason = nullptr);

}  // namespace phaselab
