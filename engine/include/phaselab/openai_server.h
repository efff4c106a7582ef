// PhaseLab's OpenAI-compatible HTTP server (on PhaseLab's own HTTP/1.1
// layer, phaselab/http_server.h: limits, deadlines and connection caps for
// hostile clients).
//
//   GET  /health               {"status": "ok"} (no key needed)
//   GET  /v1/models            the one model served
//   POST /v1/chat/completions  chat, streamed (server-sent events, "[DONE]") or not
//   POST /v1/completions       plain text continuation, streamed or not
//   GET  /metrics              Prometheus text: TTFT/TPOT histograms, tokens,
//                              KV blocks, running/waiting, speculation
//
// Every request becomes a sequence of one continuous-batching Scheduler,
// stepped by the server's own thread: concurrent requests share forward
// passes. A client that goes away, streaming or not, cancels its sequences
// (their KV blocks are freed at the next step). Bodies are parsed and
// tokenized by a few worker threads; no thread waits for an answer. Past
// max_queued requests, and while stopping, requests get 503 with
// Retry-After; a request the server never ran is never answered 200.
//
// Safe by default: loopback only unless an API key is set (check_bind); the
// key is compared in constant time; a Host header naming anything but the
// bound address, localhost or a loopback literal is refused (DNS
// rebinding: host_allowed), and so is a browser's
// cross-origin request unless its Origin is allowed; bodies, prompts and
// max_tokens are limited.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "phaselab/model.h"
#include "phaselab/scheduler.h"
#include "phaselab/server_metrics.h"
#include "phaselab/status.h"

namespace phaselab::openai {
struct ApiError;
}  // namespace phaselab::openai

namespace phaselab::http {
class Server;
class Responder;
struct Request;
}  // namespace phaselab::http

namespace phaselab {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port (see OpenAiServer::port())
  std::string api_key;                   // empty: none (then only a loopback host may be bound)
  std::vector<std::string> cors_origins; // browser origins allowed ("*" for any)
  std::string model_id;                  // the name /v1/models gives; empty: the model file's name
  size_t max_body_bytes = 4u << 20;      // a larger body gets 413 (chunked or not)
  int max_tokens = 0;                    // the largest max_tokens; <= 0: the context size
  int workers = 2;                       // threads that parse and tokenize request bodies
  int max_queued = 0;                    // requests accepted and not finished; past it 503 (0: 32 x max_seqs)
  int header_timeout_ms = 10000;         // a request's headers must arrive within this
  int body_timeout_ms = 30000;           // ... and its body within this after them
  int max_connections = 1024;            // in all (past it: 503)
  int max_connections_per_client = 512;  // per client address (past it its longest-waiting idle one is closed)
};

// Refuses a host that is not loopback when there is no API key: the message
// says how to serve on the network. ok otherwise.
Status check_bind(const std::string& host, const std::string& api_key);
// Exactly "localhost", an IPv4 literal in 127.0.0.0/8 or ::1 (brackets
// allowed); "127.0.0.1.evil.com" is not.
bool is_loopback_host(const std::string& host);
// Whether a Host header value ("name" or "name:port", "[v6]" or "[v6]:port")
// names this server: a loopback name, or the bound host itself. Anything
// malformed (a bad port, "user@host", spaces) is not.
bool host_allowed(const std::string& header_value, const std::string& bound_host);
// a == b without a timing difference that depends on where they differ.
bool constant_time_equal(const std::string& a, const std::string& b);

class OpenAiServer {
 public:
  // The server owns the scheduler (and so the backend). The chat template is
  // the model's.
  static Result<std::unique_ptr<OpenAiServer>> create(std::unique_ptr<Scheduler> scheduler, ServerOptions opt);
  ~OpenAiServer();  // stop()s
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  // Binds (an error names the address when it is taken or not allowed) and
  // starts the HTTP and scheduling threads; returns once requests are served.
  Status start();
  // Stops accepting, cancels what runs, joins the threads. Idempotent.
  void stop();

  int port() const { return port_; }  // the bound port (useful with port 0)
  std::string base_url() const;       // http://HOST:PORT/v1
  const std::string& model_id() const { return opt_.model_id; }
  Scheduler::Stats stats() const { return scheduler_->stats(); }
  std::string metrics_text() const;

  struct Call;  // one completion request: its choices' sequences and its responder

 private:
  struct Job;
  OpenAiServer();
  // Runs on the HTTP thread: checks, cheap routes, and completions queued for a worker.
  void handle(http::Request&& req, std::shared_ptr<http::Responder> res);
  void worker_loop();
  void run_completion(Job& job);
  void step_loop();
  // Submits a call's sequences under the registry lock: no outcome can
  // finish before it is registered. False: answered with the error.
  bool submit(const std::shared_ptr<Call>& call, std::vector<BatchRequest> reqs);
  void cancel(const std::shared_ptr<Call>& call);
  void on_token(Call& call, int index, const TokenEvent& e);
  std::string chunk_event(Call& call, int index, const std::string& text, const std::string& reasoning = "");
  void finish(BatchOutcome o);
  void answer_error(Call& call, const openai::ApiError& e);
  void start_event_stream(Call& call);

  std::unique_ptr<Scheduler> scheduler_;
  ServerOptions opt_;
  std::unique_ptr<http::Server> http_;
  ServerMetrics metrics_;
  int port_ = 0;
  int n_ctx_ = 0, max_tokens_ = 0, max_queued_ = 0;
  std::thread step_thread_;
  std::vector<std::thread> workers_;
  std::atomic<bool> stopping_{false}, started_{false};
  std::atomic<int> inflight_{0};  // completions accepted and not yet answered
  std::atomic<uint64_t> next_call_{1};

  std::mutex jobs_mu_;  // guards jobs_
  std::condition_variable jobs_cv_;
  std::deque<std::unique_ptr<Job>> jobs_;

  std::mutex mu_;  // guards calls_ and wakes the scheduling thread
  std::condition_variable work_cv_;
  std::map<uint64_t, std::pair<std::shared_ptr<Call>, int>> calls_;  // sequence id -> (call, choice index)
};

}  // namespace phaselab
