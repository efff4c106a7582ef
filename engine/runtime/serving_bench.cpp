// The serving benchmark's in-process driver: one thread submits the
// workload's requests at their arrival times to a scheduler of the run's
// policy and steps it; every token's time comes from GenerateResult::token_ms.
#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "phaselab/scheduler.h"
#include "phaselab/serving_bench.h"

namespace phaselab {

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kProgressEveryMs = 250;  // besides every finished request

// The scheduler's shape for a workload: a sequence for every stream and every
// long request that may overlap, and a pool that holds them (at most four
// long ones at once; more wait or are preempted, as a server's would).
SchedulerOptions scheduler_options(const InProcessTarget& t, const ServingRun& run) {
  const ServingWorkload& w = run.workload;
  SchedulerOptions o;
  o.n_ctx = t.n_ctx;
  o.kv_type = t.kv_type;
  o.policy = run.policy;
  o.max_seqs = std::clamp(w.streams + w.long_count, 1, 256);
  const long long chat = static_cast<long long>(w.streams) * (w.chat_prompt + w.chat_answer);
  const long long longs = static_cast<long long>(std::min(w.long_count, 4)) * (w.long_prompt + w.long_answer);
  // A block's worth of slack per sequence (partly filled last blocks).
  const long long need = chat + longs + 16LL * o.max_seqs;
  o.kv_positions = static_cast<int>(std::clamp<long long>(need, t.n_ctx, 1 << 22));
  return o;
}

class InProcessDriver {
 public:
  InProcessDriver(Scheduler& s, const ServingRun& run, const PromptSource& prompts, const ServingProgressFn& progress)
      : s_(s), w_(run.workload), prompts_(prompts.for_run(run.workload)), progress_(progress), arrivals_(long_arrivals_s(run.workload)),
        stream_busy_(w_.streams, false), stream_done_(w_.streams, 0), stream_next_(w_.streams, 0) {}

  Result<std::vector<RequestTrace>> run(const std::atomic<bool>* cancel, double* duration_s);

 private:
  double now_ms() const { return std::chrono::duration<double, std::milli>(Clock::now() - t0_).count(); }
  Status submit(ServingKind kind, int stream);
  void collect();
  bool chat_may_stop(double t_ms) const;

  Scheduler& s_;
  const ServingWorkload w_;
  const PromptSource prompts_;  // this run's set
  const ServingProgressFn& progress_;
  const std::vector<double> arrivals_;
  Clock::time_point t0_;
  std::vector<RequestTrace> traces_;
  std::map<uint64_t, size_t> in_flight_;  // request id -> its trace
  std::vector<bool> stream_busy_;
  std::vector<int> stream_done_, stream_next_;
  size_t next_long_ = 0;
  int long_done_ = 0, done_ = 0;
  double last_progress_ms_ = -1e9;
  void report_progress(double t_ms) {
    last_progress_ms_ = t_ms;
    if (progress_) progress_({0, 0, "", t_ms / 1000.0, done_});
  }
};

Status InProcessDriver::submit(ServingKind kind, int stream) {
  const bool chat = kind == ServingKind::chat;
  const int index = chat ? stream_next_[stream]++ : stream - w_.streams;
  ServingPrompt p = prompts_.prompt(kind, stream, index);
  BatchRequest req;
  req.options = serving_generate_options(w_, kind);
  req.prompt = std::move(p.tokens);
  RequestTrace tr;
  tr.stream = stream;
  tr.kind = kind;
  tr.n_prompt = static_cast<int>(req.prompt.size());
  tr.arrive_ms = now_ms();
  auto id = s_.submit(std::move(req));
  if (!id) return id.status().with_context(std::string(to_string(kind)) + " request of stream " + std::to_string(stream));
  in_flight_[*id] = traces_.size();
  traces_.push_back(std::move(tr));
  if (chat) stream_busy_[stream] = true;
  return Status::ok();
}

// The finished requests: their token times (since submit) moved onto the
// run's clock; a chat stream becomes free for its next request.
void InProcessDriver::collect() {
  for (BatchOutcome& o : s_.take_finished()) {
    auto it = in_flight_.find(o.id);
    if (it == in_flight_.end()) continue;
    RequestTrace& tr = traces_[it->second];
    in_flight_.erase(it);
    for (double t : o.result.token_ms) tr.token_ms.push_back(tr.arrive_ms + t);
    tr.tokens = static_cast<int>(o.result.tokens.size());
    const int want = tr.kind == ServingKind::chat ? w_.chat_answer : w_.long_answer;
    tr.ok = o.status.is_ok() && tr.tokens == want;
    if (!o.status.is_ok()) tr.error = o.status.message();
    else if (!tr.ok) tr.error = std::string("stopped early: ") + to_string(o.result.metrics.stop_reason);
    if (tr.kind == ServingKind::chat) {
      stream_busy_[tr.stream] = false;
      stream_done_[tr.stream]++;
    } else {
      long_done_++;
    }
    done_++;
    report_progress(now_ms());
  }
}

// The end of the run for the chat streams: every long request done, every
// stream with a finished request, and the duration passed.
bool InProcessDriver::chat_may_stop(double t_ms) const {
  if (long_done_ < w_.long_count || t_ms < w_.duration_s * 1000.0) return false;
  return std::all_of(stream_done_.begin(), stream_done_.end(), [](int n) { return n > 0; });
}

Result<std::vector<RequestTrace>> InProcessDriver::run(const std::atomic<bool>* cancel, double* duration_s) {
  t0_ = Clock::now();
  bool stopping = false;
  for (;;) {
    if (cancel && cancel->load()) {
      for (const auto& [id, _] : in_flight_) s_.cancel(id);
      return cancelled("the serving benchmark was stopped");
    }
    const double t = now_ms();
    stopping = stopping || chat_may_stop(t);
    if (stopping && in_flight_.empty()) break;
    for (int st = 0; st < w_.streams && !stopping; st++)
      if (!stream_busy_[st]) PHASELAB_TRY(submit(ServingKind::chat, st));
    for (; next_long_ < arrivals_.size() && arrivals_[next_long_] * 1000.0 <= t; next_long_++)
      PHASELAB_TRY(submit(ServingKind::long_doc, w_.streams + static_cast<int>(next_long_)));
    if (s_.idle() && in_flight_.empty()) {
      // Nothing to compute until the next long request arrives.
      const double wake = next_long_ < arrivals_.size() ? arrivals_[next_long_] * 1000.0 : t + 1;
      std::this_thread::sleep_until(t0_ + std::chrono::microseconds(static_cast<long long>(std::min(wake, t + 5) * 1000)));
      continue;
    }
    PHASELAB_TRY(s_.step());
    collect();
    // A long prefill finishes nothing for seconds: the time goes on showing.
    if (now_ms() - last_progress_ms_ >= kProgressEveryMs) report_progress(now_ms());
  }
  *duration_s = now_ms() / 1000.0;
  return std::move(traces_);
}

}  // namespace

Result<ServingRow> run_serving_in_process(const InProcessTarget& target, const ServingRun& run,
                                          const PromptSource& prompts, const ServingProgressFn& progress,
                                          const std::atomic<bool>* cancel) {
  PHASELAB_TRY(validate_workload(run.workload));
  const ServingWorkload& w = run.workload;
  if (w.long_count > 0 && w.long_prompt + w.long_answer > target.n_ctx)
    return invalid_argument("a long request needs " + std::to_string(w.long_prompt + w.long_answer) +
                            " positions but the context is " + std::to_string(target.n_ctx) +
                            ": raise --ctx-size or lower --long-prompt");
  if (w.chat_prompt + w.chat_answer > target.n_ctx)
    return invalid_argument("a chat request needs " + std::to_string(w.chat_prompt + w.chat_answer) +
                            " positions but the context is " + std::to_string(target.n_ctx) + ": raise --ctx-size");
  SchedulerOptions so = scheduler_options(target, run);
  BackendOptions bo = target.backend;
  raise_passes(&bo, so.max_seqs);  // one decode pass takes a token of every sequence
  auto sched = create_scheduler(target.model, bo, so);
  if (!sched) return sched.status().with_context(run.policy.name());
  InProcessDriver driver(**sched, run, prompts, progress);
  ServingRow row;
  // The disaggregated scheduler pins the thread that steps it to the decode
  // worker's cores: a thread of its own, so that the caller (and the
  // backends of the runs after this one, whose threads inherit its CPU mask)
  // stay free to use every core.
  Result<std::vector<RequestTrace>> traces = internal_error("the driver did not run");
  std::thread stepper([&] { traces = driver.run(cancel, &row.duration_s); });
  stepper.join();
  if (!traces) return traces.status();
  row.policy = run.policy.name();
  row.label = run.label;
  row.target = "in-process";
  row.placement = (*sched)->placement();
  row.requests = std::move(*traces);
  row.kv_transfer = (*sched)->stats().kv_transfer;
  return row;
}

}  // namespace phaselab
