#include "phaselab/openai_server.h"

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <csignal>

#include "phaselab/http_server.h"
#include "phaselab/log.h"
#include "phaselab/openai_api.h"

namespace phaselab {

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

using http::lower_ascii;

std::string strip_brackets(const std::string& h) {
  return h.size() > 2 && h.front() == '[' && h.back() == ']' ? h.substr(1, h.size() - 2) : h;
}

bool is_wildcard(const std::string& host) {
  const std::string h = strip_brackets(host);
  return h == "0.0.0.0" || h == "::";
}

// A Host header value split into its name and port: "[::1]:8080" -> ("::1",
// "8080"), "a.b" -> ("a.b", ""). False when it is not of that form.
bool split_host(const std::string& value, std::string* name, std::string* port) {
  if (value.empty()) return false;
  std::string rest;
  if (value.front() == '[') {
    const size_t close = value.find(']');
    if (close == std::string::npos) return false;
    *name = value.substr(1, close - 1);
    rest = value.substr(close + 1);
    if (name->find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos) return false;
  } else {
    const size_t colon = value.find(':');
    if (colon != std::string::npos && value.find(':', colon + 1) != std::string::npos) return false;  // bare IPv6
    *name = value.substr(0, colon);
    rest = colon == std::string::npos ? "" : value.substr(colon);
    // A host name: letters, digits, '-' and '.', nothing else ('@', '/', spaces).
    if (name->empty() || name->find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.") !=
                             std::string::npos)
      return false;
  }
  if (!rest.empty()) {
    if (rest.front() != ':' || rest.size() < 2 || rest.size() > 6) return false;
    if (rest.find_first_not_of("0123456789", 1) != std::string::npos) return false;
    if (std::stoi(rest.substr(1)) > 65535) return false;
    *port = rest.substr(1);
  } else {
    port->clear();
  }
  return true;
}

void reply_error(http::Responder& res, const openai::ApiError& e, const http::Headers& extra = {}) {
  res.reply(e.http_status, "application/json", openai::error_body(e), extra);
}

openai::ApiError api_error(int status, std::string message, std::string type, std::string code = {}) {
  openai::ApiError e;
  e.http_status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

const http::Headers kRetry = {{"Retry-After", "1"}};

// An error of the server's, not the request's: the client may try again.
void reply_retry_later(http::Responder& res, std::string message) {
  reply_error(res, api_error(503, std::move(message), "server_error"), kRetry);
}

std::string model_name_of(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
  return name.empty() ? "phaselab" : name;
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  const std::string h = lower_ascii(strip_brackets(host));
  if (h == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

bool host_allowed(const std::string& header_value, const std::string& bound_host) {
  std::string name, port;
  if (!split_host(header_value, &name, &port)) return false;
  if (is_loopback_host(name)) return true;
  const std::string bound = lower_ascii(strip_brackets(bound_host));
  return !bound.empty() && lower_ascii(name) == bound;
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

// One completion request: its choices' sequences, their outcomes and the
// responder. After submit() only the scheduling thread touches it.
struct OpenAiServer::Call {
  openai::Endpoint ep = openai::Endpoint::chat;
  openai::ResponseHead head;
  bool stream = false, include_usage = false;
  std::shared_ptr<http::Responder> res;
  std::vector<uint64_t> ids;            // the choices' sequences, by index
  std::vector<BatchOutcome> outcomes;   // by index
  std::vector<bool> first_chunk;        // by index: the next chunk is the first (chat: it carries the role)
  bool logprobs = false;                // the client asked for log-probabilities
  std::vector<std::vector<TokenLogprob>> unsent_logprobs;  // by index: tokens whose text has not gone out yet
  std::vector<size_t> text_offset;      // by index: characters of the answer sent (completions' text_offset)
  bool tool_calls = false;              // functions were offered: calls are parsed out of the answers
  std::vector<std::string> bare_json_offered;  // (ParsedRequest::bare_json_calls) the names a bare JSON call may have
  bool bare_json = false;
  std::vector<openai::ToolCallStream> tool_streams;  // by index (streamed with tool_calls): calls held back
  int finished = 0;
  bool answered = false;
  bool stream_started = false;  // the 200 head of the event stream went out (with the first piece)
};

// A completion waiting for a worker: the body is parsed and tokenized there,
// off the HTTP thread.
struct OpenAiServer::Job {
  openai::Endpoint ep;
  http::Request req;
  std::shared_ptr<http::Responder> res;
};

OpenAiServer::OpenAiServer() = default;

Result<std::unique_ptr<OpenAiServer>> OpenAiServer::create(std::unique_ptr<Scheduler> scheduler, ServerOptions opt) {
  if (!scheduler) return invalid_argument("OpenAiServer needs a scheduler");
  if (Status st = check_bind(opt.host, opt.api_key); !st) return st;
  if (opt.port < 0 || opt.port > 65535) return invalid_argument("--port must be from 0 to 65535");
  if (opt.workers < 1 || opt.workers > 64) return invalid_argument("worker threads must be from 1 to 64");
  std::unique_ptr<OpenAiServer> s(new OpenAiServer());
  s->n_ctx_ = scheduler->n_ctx();
  s->max_tokens_ = opt.max_tokens > 0 ? std::min(opt.max_tokens, s->n_ctx_) : s->n_ctx_;
  s->max_queued_ = opt.max_queued > 0 ? opt.max_queued : 32 * std::max(1, scheduler->max_seqs());
  if (opt.model_id.empty()) opt.model_id = model_name_of(scheduler->model().path());
  s->scheduler_ = std::move(scheduler);
  s->opt_ = std::move(opt);
  return s;
}

OpenAiServer::~OpenAiServer() { stop(); }

std::string OpenAiServer::base_url() const {
  std::string h = opt_.host;
  if (h.find(':') != std::string::npos && h.front() != '[') h = "[" + h + "]";
  return "http://" + h + ":" + std::to_string(port_) + "/v1";
}

std::string OpenAiServer::metrics_text() const { return metrics_.render(scheduler_->stats()); }

Status OpenAiServer::start() {
  if (started_.exchange(true)) return invalid_argument("the server is already started");
  // A client that closes its connection must not kill the process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  http::Limits lim;
  lim.max_body_bytes = opt_.max_body_bytes;
  // Bodies buffered at once: enough for half the sequences' worth of the
  // largest body (the workers parse two at a time), so that memory stays
  // near max_body x max_seqs whatever the clients send.
  lim.body_budget_bytes = std::max<size_t>(2 * opt_.max_body_bytes,
                                           opt_.max_body_bytes * static_cast<size_t>(scheduler_->max_seqs()) / 2);
  lim.header_timeout_ms = opt_.header_timeout_ms;
  lim.body_timeout_ms = opt_.body_timeout_ms;
  lim.max_connections = opt_.max_connections;
  lim.max_connections_per_client = opt_.max_connections_per_client;
  auto bound = http::Server::bind(
      opt_.host, opt_.port, lim,
      [this](http::Request&& req, std::shared_ptr<http::Responder> res) { handle(std::move(req), std::move(res)); },
      [](int status, const std::string& message) {
        return http::ErrorResponse{"application/json",
                                   openai::error_body(api_error(status, message, status >= 500 ? "server_error"
                                                                                               : "invalid_request_error"))};
      });
  if (!bound) {
    started_ = false;
    return bound.status();
  }
  http_ = std::move(*bound);
  port_ = http_->port();
  step_thread_ = std::thread([this] { step_loop(); });
  for (int i = 0; i < opt_.workers; i++) workers_.emplace_back([this] { worker_loop(); });
  http_->start();
  spdlog::info("serving {} at {}", opt_.model_id, base_url());
  return Status::ok();
}

void OpenAiServer::stop() {
  if (stopping_.exchange(true)) return;
  // The workers first: what they still hold is answered 503. Then the
  // scheduling thread: it cancels what runs and answers those requests 503
  // (they were not finished); then whatever raced with the stop; then the
  // HTTP thread, which gets a moment to send those answers.
  // (Each flag change is published under the lock its waiters check it
  // under: a notify between a waiter's check and its wait would be lost.)
  { std::lock_guard<std::mutex> lock(jobs_mu_); }
  jobs_cv_.notify_all();
  for (auto& w : workers_)
    if (w.joinable()) w.join();
  // A job queued after the workers left (handle() raced with the stop).
  for (auto& job : jobs_) reply_retry_later(*job->res, "the server is stopping");
  jobs_.clear();
  { std::lock_guard<std::mutex> lock(mu_); }
  work_cv_.notify_all();
  if (step_thread_.joinable()) step_thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, entry] : calls_) {
      Call& c = *entry.first;
      if (!c.answered) {
        c.answered = true;
        answer_error(c, api_error(503, "the server is stopping", "server_error"));
      }
    }
    calls_.clear();
  }
  if (http_) http_->stop(2000);
}

void OpenAiServer::cancel(const std::shared_ptr<Call>& call) {
  for (uint64_t id : call->ids) scheduler_->cancel(id);
  work_cv_.notify_all();
}

bool OpenAiServer::submit(const std::shared_ptr<Call>& call, std::vector<BatchRequest> reqs) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) {
    reply_retry_later(*call->res, "the server is stopping");
    return false;
  }
  for (size_t i = 0; i < reqs.size(); i++) {
    auto id = scheduler_->submit(std::move(reqs[i]));
    if (!id) {
      // Nothing of this call runs: the choices already queued are cancelled
      // (their outcomes find no call and are dropped).
      for (uint64_t done : call->ids) {
        scheduler_->cancel(done);
        calls_.erase(done);
      }
      reply_error(*call->res, api_error(400, id.status().message(), "invalid_request_error"));
      return false;
    }
    call->ids.push_back(*id);
    calls_[*id] = {call, static_cast<int>(i)};
  }
  work_cv_.notify_all();
  return true;
}

void OpenAiServer::handle(http::Request&& req, std::shared_ptr<http::Responder> res) {
  auto refuse = [&](int status, const std::string& message, const char* code) {
    metrics_.record_rejected();
    reply_error(*res, api_error(status, message, "invalid_request_error", code));
  };
  // Host: exactly this server's names (DNS rebinding), unless bound to every
  // address, where the API key guards it.
  if (const std::string* host = req.header("host"); host && !is_wildcard(opt_.host) && !host_allowed(*host, opt_.host))
    return refuse(403, "Host '" + *host + "' is not this server's address (" + opt_.host +
                           ", localhost or a loopback address): refused to protect against DNS rebinding",
                  "host_not_allowed");
  if (const std::string* origin = req.header("origin")) {
    const auto& allowed = opt_.cors_origins;
    const bool ok = req.header_count("origin") == 1 &&
                    (std::find(allowed.begin(), allowed.end(), *origin) != allowed.end() ||
                     std::find(allowed.begin(), allowed.end(), "*") != allowed.end());
    if (!ok)
      return refuse(403, "cross-origin request from " + *origin + " refused: start the server with --cors " + *origin +
                             " to allow it",
                    "origin_not_allowed");
    res->always_send({{"Access-Control-Allow-Origin", *origin}, {"Vary", "Origin"}});
    if (req.method == "OPTIONS") {  // a preflight
      res->reply(204, "", "",
                 {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                  {"Access-Control-Allow-Headers", "Authorization, Content-Type"},
                  {"Access-Control-Max-Age", "600"}});
      return;
    }
  }
  if (!opt_.api_key.empty() && req.path != "/health") {
    const std::string* auth = req.header("authorization");
    if (req.header_count("authorization") > 1)
      return refuse(400, "more than one Authorization header", "invalid_api_key");
    const std::string prefix = "Bearer ";
    const bool ok = auth && auth->size() > prefix.size() && lower_ascii(auth->substr(0, prefix.size())) == "bearer " &&
                    constant_time_equal(auth->substr(prefix.size()), opt_.api_key);
    if (!ok) {
      metrics_.record_rejected();
      reply_error(*res, api_error(401, !auth ? "an API key is needed: send 'Authorization: Bearer KEY'"
                                             : "the API key is not the one this server was started with",
                                  "invalid_request_error", "invalid_api_key"));
      return;
    }
  }

  const std::string& path = req.path;
  const bool get = req.method == "GET";
  auto only = [&](const char* method) {
    reply_error(*res, api_error(405, "method " + req.method + " is not allowed on " + path + " (use " + method + ")",
                                "invalid_request_error"),
                {{"Allow", method}});
  };
  if (path == "/health") {
    if (!get) return only("GET");
    res->reply(200, "application/json", R"({"status":"ok"})");
    return;
  }
  if (path == "/v1/models" || path == "/models") {
    if (!get) return only("GET");
    json m = {{"id", opt_.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "phaselab"}};
    m["meta"] = {{"n_ctx", n_ctx_}, {"max_tokens", max_tokens_}, {"backend", scheduler_->backend().name()},
                 {"path", scheduler_->model().path()}};
    res->reply(200, "application/json", openai::dump(json{{"object", "list"}, {"data", json::array({m})}}));
    return;
  }
  if (path == "/metrics") {
    if (!get) return only("GET");
    res->reply(200, "text/plain; version=0.0.4", metrics_text());
    return;
  }
  const bool chat = path == "/v1/chat/completions" || path == "/chat/completions";
  const bool completions = path == "/v1/completions" || path == "/completions";  // some clients leave out /v1
  if (!chat && !completions) {
    reply_error(*res, api_error(404, "no endpoint " + req.method + " " + path +
                                         ": PhaseLab serves GET /health, GET /v1/models, POST /v1/chat/completions, "
                                         "POST /v1/completions, GET /metrics",
                                "not_found_error"));
    return;
  }
  if (req.method != "POST") return only("POST");
  // Admission: a bounded number of requests accepted and not yet answered;
  // past it the client is told to come back rather than queued forever.
  if (stopping_ || inflight_.load() >= max_queued_) {
    metrics_.record_rejected();
    reply_retry_later(*res, stopping_ ? "the server is stopping"
                                      : "the server is busy (" + std::to_string(max_queued_) +
                                            " requests queued or running): retry shortly");
    return;
  }
  auto job = std::make_unique<Job>();
  job->ep = chat ? openai::Endpoint::chat : openai::Endpoint::completions;
  job->req = std::move(req);
  job->res = res;
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    // Checked again under the lock stop() publishes the flag under: a job
    // is either queued before the workers drain the queue or refused here.
    if (stopping_) {
      reply_retry_later(*res, "the server is stopping");
      return;
    }
    inflight_++;
    jobs_.push_back(std::move(job));
  }
  jobs_cv_.notify_one();
}

void OpenAiServer::worker_loop() {
  for (;;) {
    std::unique_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(jobs_mu_);
      jobs_cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    if (stopping_) {
      reply_retry_later(*job->res, "the server is stopping");
      inflight_--;
      continue;
    }
    run_completion(*job);
  }
}

void OpenAiServer::run_completion(Job& job) {
  const Model& model = scheduler_->model();
  openai::ParsedRequest pr;
  openai::ApiError err;
  const openai::ApiLimits limits{n_ctx_, max_tokens_};
  const bool ok = openai::parse_request(job.ep, job.req.body, model.tokenizer(), model.chat_format(), limits, &pr, &err);
  job.req = http::Request{};  // the body's bytes go back to the budget now
  if (!ok) {
    metrics_.record_rejected();
    reply_error(*job.res, err);
    inflight_--;
    return;
  }
  auto call = std::make_shared<Call>();
  call->ep = job.ep;
  call->stream = pr.stream;
  call->include_usage = pr.include_usage;
  call->res = job.res;
  const int n = pr.n;
  call->outcomes.resize(n);
  call->first_chunk.assign(n, true);
  call->logprobs = pr.options.logprobs >= 0;
  call->unsent_logprobs.resize(n);
  call->text_offset.assign(n, 0);
  call->tool_calls = pr.tool_calls;
  call->bare_json = pr.bare_json_calls;
  call->bare_json_offered = pr.tool_names;
  call->tool_streams.assign(pr.tool_calls && pr.stream ? n : 0,
                            pr.bare_json_calls ? openai::ToolCallStream(pr.tool_names) : openai::ToolCallStream());
  std::vector<BatchRequest> reqs(n);
  for (int i = 0; i < n; i++) {
    BatchRequest& br = reqs[i];
    br.prompt = pr.prompt;
    br.options = openai::options_for_choice(pr, i);  // seed + i: distinct choices, reproducible with a seed
    // Only a streamed answer needs its pieces; a whole one takes the outcomes'.
    if (pr.stream) br.on_token = [this, call, i](const TokenEvent& e) { on_token(*call, i, e); };
  }
  call->head = openai::make_head(job.ep, opt_.model_id, next_call_++);
  if (!submit(call, std::move(reqs))) {
    metrics_.record_rejected();
    inflight_--;
    return;
  }
  // A client that goes away, streamed or not, cancels its sequences.
  std::weak_ptr<Call> weak = call;
  job.res->on_gone([this, weak] {
    if (auto c = weak.lock()) cancel(c);
  });
}

// A stream's 200 head goes out with its first piece, so that a request that
// ends before any (the server stops, the pool cannot hold it) still gets a
// status the client can see.
void OpenAiServer::start_event_stream(Call& call) {
  if (call.stream_started) return;
  call.stream_started = true;
  call.res->start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
}

// One chunk of choice index: text and the log-probabilities of the tokens
// it completes (an event without text, a piece of a character or a held
// back stop string, keeps its log-probability for the next chunk).
std::string OpenAiServer::chunk_event(Call& call, int index, const std::string& text, const std::string& reasoning) {
  const Tokenizer& tok = scheduler_->model().tokenizer();
  std::vector<TokenLogprob>& lps = call.unsent_logprobs[index];
  const bool first = call.first_chunk[index];
  call.first_chunk[index] = false;
  const std::string ev = openai::sse_event(openai::chunk_json(call.ep, call.head, index, text, first,
                                                              call.logprobs ? &lps : nullptr, &tok,
                                                              call.text_offset[index], reasoning));
  for (const TokenLogprob& lp : lps) call.text_offset[index] += openai::utf8_chars(tok.token_to_piece(lp.id));
  lps.clear();
  return ev;
}

void OpenAiServer::on_token(Call& call, int index, const TokenEvent& e) {
  if (call.answered) return;
  if (call.logprobs && e.logprob) call.unsent_logprobs[index].push_back(*e.logprob);
  // One event per token, its text empty when it has none yet (a special
  // token, the first bytes of a character, text a stop string may still
  // take back): a client sees when every token came, which a benchmark's
  // inter-token gaps need (a skipped token would double the next gap).
  start_event_stream(call);
  // A client that is gone is cancelled by the responder's on_gone.
  // With functions offered, a call's text is held back until the end (finish).
  const std::string text = call.tool_calls ? call.tool_streams[index].push(e.text) : std::string(e.text);
  call.res->write_chunk(chunk_event(call, index, text, std::string(e.reasoning)));
}

// A call that ends without its answer: an error status while nothing was
// sent (503s with Retry-After), else an error event ending the stream.
void OpenAiServer::answer_error(Call& call, const openai::ApiError& e) {
  if (!call.stream_started) return reply_error(*call.res, e, e.http_status == 503 ? kRetry : http::Headers{});
  call.res->write_chunk("data: " + openai::error_body(e) + "\n\ndata: [DONE]\n\n");
  call.res->end_stream();
}

void OpenAiServer::finish(BatchOutcome o) {
  std::shared_ptr<Call> call;
  int index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find(o.id);
    if (it == calls_.end()) return;
    call = it->second.first;
    index = it->second.second;
    calls_.erase(it);
  }
  const bool cancelled = o.result.metrics.stop_reason == StopReason::cancelled;
  const std::string how = !o.status ? "error" : cancelled ? "cancelled" : openai::finish_reason(o.result.metrics.stop_reason);
  metrics_.record(o.result.metrics, how);
  call->outcomes[index] = std::move(o);
  if (++call->finished < static_cast<int>(call->ids.size()) || call->answered) return;
  call->answered = true;
  inflight_--;

  // An error of one choice is the call's; a cancellation not asked for by
  // the client (it is gone then, and nothing is sent) is the server stopping:
  // a request that did not run to its end is never answered 200.
  for (const BatchOutcome& oc : call->outcomes) {
    if (!oc.status) {
      const bool too_big = oc.result.metrics.stop_reason == StopReason::kv_full;
      return answer_error(*call, api_error(too_big ? 400 : 503, oc.status.message(),
                                           too_big ? "invalid_request_error" : "server_error",
                                           too_big ? "context_length_exceeded" : ""));
    }
    if (oc.result.metrics.stop_reason == StopReason::cancelled)
      return answer_error(*call, api_error(503, "the server stopped before the answer was complete", "server_error"));
  }
  http::Responder& res = *call->res;
  int preemptions = 0;
  std::vector<RequestMetrics> metrics;
  for (const BatchOutcome& oc : call->outcomes) {
    preemptions += oc.preemptions;
    metrics.push_back(oc.result.metrics);
  }
  if (!call->stream) {
    std::vector<GenerateResult> choices;
    for (BatchOutcome& oc : call->outcomes) choices.push_back(std::move(oc.result));
    res.reply(200, "application/json",
              openai::dump(openai::response_json(call->ep, call->head, choices, preemptions,
                                                 scheduler_->model().tokenizer(), call->tool_calls,
                                                 call->bare_json ? &call->bare_json_offered : nullptr)));
    return;
  }
  start_event_stream(*call);
  std::string out;
  for (size_t i = 0; i < call->outcomes.size(); i++) {
    const int index = static_cast<int>(i);
    // What a choice held back of its text while it might be a call, and
    // the calls it made.
    openai::ToolCallSplit held;
    if (call->tool_calls) held = call->tool_streams[i].finish();
    // A choice that sent nothing yet (chat: the role), or whose last
    // tokens' text was held back (a stop string), still sends them.
    if (call->first_chunk[i] || !call->unsent_logprobs[i].empty() || !held.content.empty())
      out += chunk_event(*call, index, held.content);
    if (!held.calls.empty()) out += openai::sse_event(openai::tool_calls_chunk_json(call->head, index, held.calls));
    out += openai::sse_event(openai::final_chunk_json(call->ep, call->head, index, call->outcomes[i].result,
                                                      call->outcomes[i].preemptions, !held.calls.empty()));
  }
  if (call->include_usage) out += openai::sse_event(openai::usage_chunk_json(call->ep, call->head, metrics));
  out += "data: [DONE]\n\n";
  res.write_chunk(out);
  res.end_stream();
}

void OpenAiServer::step_loop() {
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
        for (auto& p : calls_) ids.push_back(p.first);
      }
      for (uint64_t id : ids) {
        scheduler_->cancel(id);
        BatchOutcome o;
        o.id = id;
        o.status = internal_error("the forward pass failed: " + st.message());
        finish(std::move(o));
      }
      (void)scheduler_->step();  // lets the cancellations free their blocks
    }
    for (auto& o : scheduler_->take_finished()) finish(std::move(o));
  }
  // Stopping: end every sequence so that their blocks are freed; their
  // requests are answered 503 (finish), as they did not run to their end.
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& p : calls_) scheduler_->cancel(p.first);
  }
  for (int i = 0; i < 4 && !scheduler_->idle(); i++) (void)scheduler_->step();
  for (auto& o : scheduler_->take_finished()) finish(std::move(o));
}

}  // namespace phaselab
