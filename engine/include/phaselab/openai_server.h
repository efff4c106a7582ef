// PhaseLab's OpenAI-compatible HTTP server (cpp-httplib underneath).
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
// passes. A streaming client that goes away cancels its sequence (its KV
// blocks are freed at the next step).
//
// Safe by default: loopback only unless an API key is set (check_bind); the
// key is compared in constant time; a Host header naming anything but the
// bound address or localhost is refused (DNS rebinding), and so is a browser's
// cross-origin request unless its Origin is allowed; bodies, prompts and
// max_tokens are limited.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "phaselab/model.h"
#include "phaselab/scheduler.h"
#include "phaselab/server_metrics.h"
#include "phaselab/status.h"

namespace httplib {
class Server;
}

namespace phaselab {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port (see OpenAiServer::port())
  std::string api_key;                   // empty: none (then only a loopback host may be bound)
  std::vector<std::string> cors_origins; // browser origins allowed ("*" for any)
  std::string model_id;                  // the name /v1/models gives; empty: the model file's name
  size_t max_body_bytes = 4u << 20;      // a larger body gets 413
  int max_tokens = 0;                    // the largest max_tokens; <= 0: the context size
  int http_threads = 64;                 // connections served at once (a streaming one holds a thread)
};

// Refuses a host that is not loopback when there is no API key: the message
// says how to serve on the network. ok otherwise.
Status check_bind(const std::string& host, const std::string& api_key);
bool is_loopback_host(const std::string& host);
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

  struct Stream;  // one request's events, between the scheduling thread and its HTTP thread

 private:
  OpenAiServer() = default;
  void install_routes();
  void step_loop();
  // Submits under the registry lock: the outcome cannot finish before it is registered.
  Result<uint64_t> submit(BatchRequest req, const std::shared_ptr<Stream>& s);
  void cancel(uint64_t id);

  std::unique_ptr<Scheduler> scheduler_;
  ServerOptions opt_;
  std::unique_ptr<httplib::Server> http_;
  ServerMetrics metrics_;
  int port_ = 0;
  int n_ctx_ = 0, max_tokens_ = 0;
  std::string bound_name_;  // opt_.host as a Host header names it ("::1", not "[::1]")
  std::thread http_thread_, step_thread_;
  std::atomic<bool> stopping_{false}, started_{false};

  std::mutex mu_;  // guards streams_ and wakes the scheduling thread
  std::condition_variable work_cv_;
  std::vector<std::pair<uint64_t, std::shared_ptr<Stream>>> streams_;
};

}  // namespace phaselab
