#include "phaselab/serving_http.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

namespace phaselab {

namespace {

using Clock = std::chrono::steady_clock;

// The run's shared state: the traces (in arrival order), the counts the
// end of the run depends on, and the clock.
struct HttpRunState {
  HttpRunState(const ServingWorkload& w_, const PromptSource& p, const ServingProgressFn& f, const std::atomic<bool>* c)
      : w(w_), prompts(p.for_run(w_)), progress(f), cancel(c), stream_done(w_.streams, 0) {}
  const ServingWorkload& w;
  const PromptSource prompts;  // this run's set
  const ServingProgressFn& progress;
  const std::atomic<bool>* cancel;
  Clock::time_point t0 = Clock::now();
  std::mutex mu;
  std::vector<RequestTrace> traces;
  std::vector<int> stream_done;
  int long_done = 0, done = 0;
  std::atomic<bool> stop_chat{false};

  double now_ms() const { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
  bool cancelled() const { return cancel && cancel->load(); }
};

// Sends one request and records it.
void send_request(HttpRunState& st, RemoteClient* client, const Status& connect_error, ServingKind kind, int stream,
                  int index) {
  const bool chat = kind == ServingKind::chat;
  const ServingPrompt p = st.prompts.prompt(kind, stream, index);
  const GenerateOptions opt = serving_generate_options(st.w, kind);
  RequestTrace tr;
  tr.stream = stream;
  tr.kind = kind;
  tr.n_prompt = p.tokens.empty() ? 0 : static_cast<int>(p.tokens.size());
  tr.arrive_ms = st.now_ms();
  if (client == nullptr) {
    tr.error = connect_error.message();
  } else {
    std::vector<double> times;
    auto r = client->complete(p.text, opt, [&](const TokenEvent& e) { times.push_back(tr.arrive_ms + e.t_ms); },
                              st.cancel);
    tr.token_ms = std::move(times);
    if (!r) {
      tr.error = r.status().message();
    } else {
      const RequestMetrics& m = r->result.metrics;
      if (m.n_prompt > 0) tr.n_prompt = m.n_prompt;
      tr.tokens = std::max(m.n_generated, static_cast<int>(tr.token_ms.size()));
      tr.ok = m.stop_reason != StopReason::cancelled && !tr.token_ms.empty();
      if (!tr.ok) tr.error = m.stop_reason == StopReason::cancelled ? "cancelled" : "no token arrived";
    }
  }
  std::lock_guard lock(st.mu);
  st.traces.push_back(std::move(tr));
  if (chat) st.stream_done[stream]++;
  else st.long_done++;
  st.done++;
  if (st.progress) st.progress({0, 0, "", st.now_ms() / 1000.0, st.done});
}

Result<std::unique_ptr<RemoteClient>> connect_client(const RemoteEndpoint& ep) { return RemoteClient::connect(ep); }

}  // namespace

Result<ServingRow> run_serving_http(const RemoteEndpoint& ep, const ServingRun& run, const PromptSource& prompts,
                                    const ServingProgressFn& progress, const std::atomic<bool>* cancel) {
  PHASELAB_TRY(validate_workload(run.workload));
  const ServingWorkload& w = run.workload;
  // Reach the server (and learn its model) before the clock starts.
  auto probe = connect_client(ep);
  if (!probe) return probe.status();
  RemoteEndpoint resolved = ep;
  resolved.model = (*probe)->model();

  HttpRunState st(w, prompts, progress, cancel);
  const auto run_with_client = [&](auto&& body) {
    auto c = connect_client(resolved);
    body(c ? c->get() : nullptr, c ? Status::ok() : c.status());
  };
  std::vector<std::thread> threads;
  const std::vector<double> arrivals = long_arrivals_s(w);
  for (size_t k = 0; k < arrivals.size(); k++)
    threads.emplace_back([&, k] {
      run_with_client([&](RemoteClient* c, const Status& err) {
        const auto at = st.t0 + std::chrono::microseconds(static_cast<long long>(arrivals[k] * 1e6));
        while (Clock::now() < at && !st.cancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        if (!st.cancelled()) send_request(st, c, err, ServingKind::long_doc, w.streams + static_cast<int>(k), static_cast<int>(k));
      });
    });
  std::vector<std::thread> streams;
  for (int s = 0; s < w.streams; s++)
    streams.emplace_back([&, s] {
      run_with_client([&](RemoteClient* c, const Status& err) {
        for (int i = 0; !st.stop_chat.load() && !st.cancelled(); i++) {
          send_request(st, c, err, ServingKind::chat, s, i);
          if (c == nullptr) break;  // the error is recorded once
        }
      });
    });
  // The end of the run: as run_serving_in_process's. Progress every 250 ms
  // besides every finished request.
  for (auto last = Clock::now();;) {
    {
      std::lock_guard lock(st.mu);
      if (progress && Clock::now() - last >= std::chrono::milliseconds(250)) {
        last = Clock::now();
        progress({0, 0, "", st.now_ms() / 1000.0, st.done});
      }
      const bool streams_ran = std::all_of(st.stream_done.begin(), st.stream_done.end(), [](int n) { return n > 0; });
      if (st.cancelled() || (st.long_done >= w.long_count && streams_ran && st.now_ms() >= w.duration_s * 1000.0)) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  st.stop_chat.store(true);
  for (auto& t : threads) t.join();
  for (auto& t : streams) t.join();
  if (st.cancelled()) return cancelled("the serving benchmark was stopped");
  ServingRow row;
  row.duration_s = st.now_ms() / 1000.0;
  row.policy = row.target = ep.url;
  row.label = run.label == run.policy.name() ? ep.url : run.label;
  std::stable_sort(st.traces.begin(), st.traces.end(),
                   [](const RequestTrace& a, const RequestTrace& b) { return a.arrive_ms < b.arrive_ms; });
  row.requests = std::move(st.traces);
  return row;
}

}  // namespace phaselab
