#include "phaselab/openai_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <deque>

#include "phaselab/log.h"
#include "phaselab/openai_api.h"

namespace phaselab {

using nlohmann::json;
using namespace std::chrono_literals;

bool is_loopback_host(const std::string& host) {
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  return h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
}

Status check_bind(const std::string& host, const std::string& api_key) {
  if (host.empty()) return invalid_argument("--host is empty: give an address such as 127.0.0.1");
  if (!is_loopback_host(host) && api_key.empty())
    return invalid_argument("refusing to serve on " + host +
                            " without an API key: anyone who can reach it could use the model. Add --api-key KEY "
                            "(clients send 'Authorization: Bearer KEY'), or keep the default --host 127.0.0.1");
  return Status::ok();
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Every byte of the longer string is visited whatever the contents: the
  // time depends on the lengths only.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; i++) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// One request's events: text pieces from the scheduling thread (on_token),
// then its outcome; the HTTP thread serving it waits on cv.
struct OpenAiServer::Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> pieces;
  bool done = false;
  BatchOutcome outcome;
};

namespace {

void reply_error(httplib::Response& res, const openai::ApiError& e) {
  res.status = e.http_status;
  res.set_content(openai::error_body(e), "application/json");
}

openai::ApiError api_error(int status, std::string message, std::string type, std::string code = {}) {
  openai::ApiError e;
  e.http_status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

// The name part of a Host header value: "[::1]:8080" -> "::1", "a.b:80" -> "a.b".
std::string host_name_of(const std::string& value) {
  if (!value.empty() && value.front() == '[') {
    const size_t close = value.find(']');
    return close == std::string::npos ? value : value.substr(1, close - 1);
  }
  const size_t colon = value.rfind(':');
  return colon == std::string::npos ? value : value.substr(0, colon);
}

bool is_wildcard(const std::string& host) { return host == "0.0.0.0" || host == "::" || host == "[::]"; }

std::string model_name_of(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
  return name.empty() ? "phaselab" : name;
}

}  // namespace

Result<std::unique_ptr<OpenAiServer>> OpenAiServer::create(std::unique_ptr<Scheduler> scheduler, ServerOptions opt) {
  if (!scheduler) return invalid_argument("OpenAiServer needs a scheduler");
  if (Status st = check_bind(opt.host, opt.api_key); !st) return st;
  if (opt.port < 0 || opt.port > 65535) return invalid_argument("--port must be from 0 to 65535");
  if (opt.http_threads < 1 || opt.http_threads > 4096) return invalid_argument("http threads must be from 1 to 4096");
  std::unique_ptr<OpenAiServer> s(new OpenAiServer());
  s->n_ctx_ = scheduler->n_ctx();
  s->max_tokens_ = opt.max_tokens > 0 ? std::min(opt.max_tokens, s->n_ctx_) : s->n_ctx_;
  if (opt.model_id.empty()) opt.model_id = model_name_of(scheduler->model().path());
  s->bound_name_ = host_name_of(opt.host + ":0");  // the Host name besides localhost that requests may carry
  s->scheduler_ = std::move(scheduler);
  s->opt_ = std::move(opt);
  s->http_ = std::make_unique<httplib::Server>();
  s->install_routes();
  return s;
}

OpenAiServer::~OpenAiServer() { stop(); }

std::string OpenAiServer::base_url() const {
  std::string h = opt_.host;
  if (h.find(':') != std::string::npos && h.front() != '[') h = "[" + h + "]";
  return "http://" + h + ":" + std::to_string(port_) + "/v1";
}

std::string OpenAiServer::metrics_text() const { return metrics_.render(scheduler_->stats()); }

Result<uint64_t> OpenAiServer::submit(BatchRequest req, const std::shared_ptr<Stream>& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return cancelled("the server is stopping");
  auto id = scheduler_->submit(std::move(req));
  if (id) streams_.emplace_back(*id, s);
  work_cv_.notify_all();
  return id;
}

void OpenAiServer::cancel(uint64_t id) {
  scheduler_->cancel(id);
  work_cv_.notify_all();
}

Status OpenAiServer::start() {
  if (started_.exchange(true)) return invalid_argument("the server is already started");
  // A client that closes its connection must not kill the process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  const int threads = opt_.http_threads;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(opt_.max_body_bytes);
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  http_->set_keep_alive_timeout(5);
  // cpp-httplib's default options add SO_REUSEPORT, with which a second
  // server on a taken port binds "successfully" and the kernel splits the
  // connections between the two. SO_REUSEADDR alone never shares a listening
  // port (it only allows a restart while old connections linger).
  http_->set_socket_options([](auto sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  bool bound = false;
  if (opt_.port == 0) {
    port_ = http_->bind_to_any_port(opt_.host);
    bound = port_ > 0;
  } else {
    port_ = opt_.port;
    bound = http_->bind_to_port(opt_.host, opt_.port);
  }
  if (!bound) {
    started_ = false;
    return io_error("cannot listen on " + opt_.host + ":" + std::to_string(opt_.port) +
                    ": the port is in use or the address is not one of this machine's (choose another --port or --host)");
  }
  step_thread_ = std::thread([this] { step_loop(); });
  http_thread_ = std::thread([this] { http_->listen_after_bind(); });
  for (int i = 0; i < 500 && !http_->is_running(); i++) std::this_thread::sleep_for(2ms);
  spdlog::info("serving {} at {}", opt_.model_id, base_url());
  return Status::ok();
}

void OpenAiServer::stop() {
  if (stopping_.exchange(true)) return;
  // The scheduling thread first: it cancels what runs and answers those
  // requests; then whatever raced with the stop; then the HTTP threads, which
  // are free by then (no handler is left waiting for an outcome).
  work_cv_.notify_all();
  if (step_thread_.joinable()) step_thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, s] : streams_) {
      std::lock_guard<std::mutex> sl(s->mu);
      s->outcome.id = id;
      s->outcome.status = cancelled("the server is stopping");
      s->done = true;
      s->cv.notify_all();
    }
    streams_.clear();
  }
  if (http_) http_->stop();
  if (http_thread_.joinable()) http_thread_.join();
}

void OpenAiServer::step_loop() {
  auto finish_stream = [this](BatchOutcome o) {
    std::shared_ptr<Stream> s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = std::find_if(streams_.begin(), streams_.end(), [&](const auto& p) { return p.first == o.id; });
      if (it == streams_.end()) return;
      s = it->second;
      streams_.erase(it);
    }
    const std::string how = !o.status ? "error"
                            : o.result.metrics.stop_reason == "cancelled" ? "cancelled"
                                                                          : openai::finish_reason(o.result.metrics.stop_reason);
    metrics_.record(o.result.metrics, how);
    std::lock_guard<std::mutex> sl(s->mu);
    s->outcome = std::move(o);
    s->done = true;
    s->cv.notify_all();
  };
  while (!stopping_) {
    if (scheduler_->idle()) {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait_for(lock, 100ms, [&] { return stopping_ || !scheduler_->idle(); });
      continue;
    }
    if (Status st = scheduler_->step(); !st) {
      // A backend failure: every request in flight ends with it.
      spdlog::error("server: forward pass failed: {}", st.message());
      std::vector<uint64_t> ids;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& p : streams_) ids.push_back(p.first);
      }
      for (uint64_t id : ids) {
        scheduler_->cancel(id);
        BatchOutcome o;
        o.id = id;
        o.status = internal_error("the forward pass failed: " + st.message());
        finish_stream(std::move(o));
      }
      (void)scheduler_->step();  // lets the cancellations free their blocks
    }
    for (auto& o : scheduler_->take_finished()) finish_stream(std::move(o));
  }
  // Stopping: end every sequence so that their blocks are freed.
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& p : streams_) scheduler_->cancel(p.first);
  }
  for (int i = 0; i < 4 && !scheduler_->idle(); i++) (void)scheduler_->step();
  for (auto& o : scheduler_->take_finished()) finish_stream(std::move(o));
}

void OpenAiServer::install_routes() {
  httplib::Server& h = *http_;

  // Every request passes here first: Host, Origin and the API key.
  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    using HR = httplib::Server::HandlerResponse;
    if (req.has_header("Host") && !is_wildcard(opt_.host)) {
      const std::string name = host_name_of(req.get_header_value("Host"));
      if (!is_loopback_host(name) && name != bound_name_) {
        metrics_.record_rejected();
        reply_error(res, api_error(403, "Host '" + name + "' is not this server's address (" + opt_.host +
                                            " or localhost): refused to protect against DNS rebinding",
                                   "invalid_request_error", "host_not_allowed"));
        return HR::Handled;
      }
    }
    if (req.has_header("Origin")) {
      const std::string origin = req.get_header_value("Origin");
      const auto& allowed = opt_.cors_origins;
      const bool ok = std::find(allowed.begin(), allowed.end(), origin) != allowed.end() ||
                      std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
      if (!ok) {
        metrics_.record_rejected();
        reply_error(res, api_error(403, "cross-origin request from " + origin +
                                            " refused: start the server with --cors " + origin + " to allow it",
                                   "invalid_request_error", "origin_not_allowed"));
        return HR::Handled;
      }
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Vary", "Origin");
      if (req.method == "OPTIONS") {  // a preflight
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
        res.set_header("Access-Control-Max-Age", "600");
        res.status = 204;
        return HR::Handled;
      }
    }
    if (!opt_.api_key.empty() && req.path != "/health") {
      const std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      const bool ok = auth.rfind(prefix, 0) == 0 && constant_time_equal(auth.substr(prefix.size()), opt_.api_key);
      if (!ok) {
        metrics_.record_rejected();
        reply_error(res, api_error(401, auth.empty() ? "an API key is needed: send 'Authorization: Bearer KEY'"
                                                     : "the API key is not the one this server was started with",
                                   "invalid_request_error", "invalid_api_key"));
        return HR::Handled;
      }
    }
    return HR::Unhandled;
  });

  h.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg;
    if (res.status == 404)
      msg = "no endpoint " + req.method + " " + req.path +
            ": PhaseLab serves GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions, GET /metrics";
    else if (res.status == 413)
      msg = "the request body is larger than the server accepts (phaselab-cli serve --max-body)";
    else if (res.status == 405)
      msg = "method " + req.method + " is not allowed on " + req.path;
    else
      msg = "HTTP error " + std::to_string(res.status);
    res.set_content(openai::error_body(api_error(res.status, msg, res.status == 404 ? "not_found_error" : "invalid_request_error")),
                    "application/json");
  });
  h.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    reply_error(res, api_error(500, "internal error: " + what, "server_error"));
  });

  h.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  auto models = [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", opt_.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "phaselab"}};
    m["meta"] = {{"n_ctx", n_ctx_}, {"max_tokens", max_tokens_}, {"backend", scheduler_->backend().name()},
                 {"path", scheduler_->model().path()}};
    res.set_content(openai::dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
  };
  h.Get("/v1/models", models);
  h.Get("/models", models);
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });

  auto completion = [this](openai::Endpoint ep) {
    return [this, ep](const httplib::Request& req, httplib::Response& res) {
      const Model& model = scheduler_->model();
      openai::ParsedRequest pr;
      openai::ApiError err;
      const openai::ApiLimits limits{n_ctx_, max_tokens_};
      if (!openai::parse_request(ep, req.body, model.tokenizer(), model.chat_template(), limits, &pr, &err)) {
        metrics_.record_rejected();
        reply_error(res, err);
        return;
      }
      auto stream = std::make_shared<Stream>();
      BatchRequest br;
      br.prompt = std::move(pr.prompt);
      br.options = std::move(pr.options);
      // Only a streamed answer needs its pieces; a whole one takes the outcome's text.
      if (pr.stream) br.on_token = [stream](const TokenEvent& e) {
        if (e.text.empty()) return;
        std::lock_guard<std::mutex> lock(stream->mu);
        stream->pieces.emplace_back(e.text);
        stream->cv.notify_all();
      };
      auto id = submit(std::move(br), stream);
      if (!id) {
        metrics_.record_rejected();
        reply_error(res, api_error(400, id.status().message(), "invalid_request_error"));
        return;
      }
      const uint64_t rid = *id;
      const openai::ResponseHead head = openai::make_head(ep, opt_.model_id, rid);

      auto outcome_error = [](const BatchOutcome& o) {
        // The pool cannot hold the request even alone (kv_full), or the server stops / a pass failed.
        const bool too_big = o.result.metrics.stop_reason == "kv_full";
        return api_error(too_big ? 400 : 503, o.status.message(), too_big ? "invalid_request_error" : "server_error",
                         too_big ? "context_length_exceeded" : "");
      };

      if (!pr.stream) {
        std::unique_lock<std::mutex> lock(stream->mu);
        stream->cv.wait(lock, [&] { return stream->done; });
        const BatchOutcome& o = stream->outcome;
        if (!o.status) {
          reply_error(res, outcome_error(o));
          return;
        }
        res.set_content(openai::dump(openai::response_json(ep, head, o.result, o.preemptions)), "application/json");
        return;
      }

      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
      const bool include_usage = pr.include_usage;
      auto first = std::make_shared<bool>(true);
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, stream, ep, head, rid, include_usage, first, outcome_error](size_t, httplib::DataSink& sink) {
            std::string out;
            bool done = false;
            BatchOutcome o;
            {
              std::unique_lock<std::mutex> lock(stream->mu);
              stream->cv.wait_for(lock, 100ms, [&] { return !stream->pieces.empty() || stream->done; });
              for (; !stream->pieces.empty(); stream->pieces.pop_front()) {
                out += openai::sse_event(openai::chunk_json(ep, head, stream->pieces.front(), *first));
                *first = false;
              }
              done = stream->done;
              if (done) o = stream->outcome;
            }
            if (done) {
              if (!o.status) {
                out += "data: " + openai::error_body(outcome_error(o)) + "\n\n";
              } else {
                if (*first) out += openai::sse_event(openai::chunk_json(ep, head, "", true));
                out += openai::sse_event(openai::final_chunk_json(ep, head, o.result, o.preemptions));
                if (include_usage) out += openai::sse_event(openai::usage_chunk_json(ep, head, o.result.metrics));
              }
              out += "data: [DONE]\n\n";
            }
            // A write that fails, or a socket that cannot be written, is a
            // client gone: its sequence is cancelled and its blocks freed.
            if (!out.empty() ? !sink.write(out.data(), out.size()) : !sink.is_writable()) {
              cancel(rid);
              return false;
            }
            if (done) sink.done();
            return true;
          },
          [this, rid](bool success) {
            if (!success) cancel(rid);
          });
    };
  };
  h.Post("/v1/chat/completions", completion(openai::Endpoint::chat));
  h.Post("/v1/completions", completion(openai::Endpoint::completions));
  // Some clients leave out the /v1 prefix.
  h.Post("/chat/completions", completion(openai::Endpoint::chat));
  h.Post("/completions", completion(openai::Endpoint::completions));
}

}  // namespace phaselab
