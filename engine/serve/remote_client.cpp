#include "phaselab/remote_client.h"

#include <httplib.h>

#include <chrono>
#include <csignal>

namespace phaselab {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr double kMinDecodeSpanMs = 1.0;

namespace {

// The "message" of an OpenAI-style error body, or the body itself (shortened).
std::string error_message_of(const std::string& body) {
  try {
    const json j = json::parse(body);
    if (j.contains("error")) {
      const json& e = j["error"];
      if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
      if (e.is_string()) return e.get<std::string>();
    }
    if (j.contains("detail") && j["detail"].is_string()) return j["detail"].get<std::string>();  // FastAPI (vLLM)
  } catch (const json::exception&) {
  }
  return body.size() > 300 ? body.substr(0, 300) + "..." : body;
}

Status http_status_error(int status, const std::string& body, const std::string& url) {
  const std::string msg = error_message_of(body);
  if (status == 401 || status == 403)
    return invalid_argument("the server at " + url + " refused the request (HTTP " + std::to_string(status) + "): " + msg +
                            " (check --remote-key / the API key setting)");
  if (status == 404)
    return invalid_argument("the server at " + url + " has no such endpoint or model (HTTP 404): " + msg +
                            " (is the URL the API's base, e.g. http://host:8000/v1?)");
  return io_error("the server at " + url + " answered HTTP " + std::to_string(status) + ": " + msg);
}

Status transport_error(httplib::Error e, const std::string& url) {
  return io_error("cannot reach " + url + " (" + httplib::to_string(e) +
                  " error): is the server running, and is the address right?");
}

}  // namespace

json remote_sampling_fields(const GenerateOptions& opt) {
  const SamplingParams& s = opt.sampling;
  json j;
  j["max_tokens"] = opt.n_predict;
  j["temperature"] = s.temperature;
  if (s.temperature > 0) {
    j["top_p"] = s.top_p;
    // Extensions vLLM, SGLang, llama-server and PhaseLab read; others ignore them.
    if (s.top_k > 0) j["top_k"] = s.top_k;
    if (s.min_p > 0) j["min_p"] = s.min_p;
  }
  if (s.frequency_penalty != 0) j["frequency_penalty"] = s.frequency_penalty;
  if (s.presence_penalty != 0) j["presence_penalty"] = s.presence_penalty;
  if (s.repeat_penalty != 1.0f) j["repeat_penalty"] = s.repeat_penalty;
  j["seed"] = static_cast<int64_t>(s.seed & 0x7fffffffffffffffULL);
  if (!opt.stop.empty()) j["stop"] = opt.stop;
  // Fixed-length answers for benchmarks (PhaseLab, llama-server and vLLM read it).
  if (opt.ignore_eos) j["ignore_eos"] = true;
  return j;
}

RemoteClient::~RemoteClient() = default;

std::string RemoteClient::describe() const { return "remote: " + ep_.model + " at " + ep_.url; }

Result<std::unique_ptr<RemoteClient>> RemoteClient::connect(RemoteEndpoint ep) {
  // scheme://host[:port][/path]
  const std::string& u = ep.url;
  const size_t scheme_end = u.find("://");
  if (scheme_end == std::string::npos || (u.compare(0, scheme_end, "http") != 0 && u.compare(0, scheme_end, "https") != 0))
    return invalid_argument("the remote URL '" + u + "' must start with http:// or https:// (e.g. http://127.0.0.1:8080/v1)");
  const size_t path_start = u.find('/', scheme_end + 3);
  std::unique_ptr<RemoteClient> c(new RemoteClient());
  c->origin_ = u.substr(0, path_start);
  if (c->origin_.size() <= scheme_end + 3) return invalid_argument("the remote URL '" + u + "' names no host");
  std::string path = path_start == std::string::npos ? "" : u.substr(path_start);
  while (!path.empty() && path.back() == '/') path.pop_back();
  c->base_path_ = path.empty() ? "/v1" : path;
  if (ep.timeout_s < 1) return invalid_argument("the remote timeout must be at least 1 s");
  // A server that closes the connection must not kill the process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  c->http_ = std::make_unique<httplib::Client>(c->origin_);
  if (!c->http_->is_valid()) return invalid_argument("the remote URL '" + u + "' is not one PhaseLab can connect to");
  c->http_->set_connection_timeout(10, 0);
  c->http_->set_read_timeout(ep.timeout_s, 0);
  c->http_->set_write_timeout(30, 0);
  if (!ep.api_key.empty()) c->http_->set_bearer_token_auth(ep.api_key);
  c->ep_ = std::move(ep);
  c->ep_.url = c->origin_ + c->base_path_;
  auto models = c->list_models();
  if (!models) return models.status();
  if (c->ep_.model.empty()) {
    if (models->empty()) return invalid_argument("the server at " + c->ep_.url + " lists no model: give one with --remote-model");
    c->ep_.model = models->front();
  } else if (std::find(models->begin(), models->end(), c->ep_.model) == models->end()) {
    std::string list;
    for (const auto& m : *models) list += (list.empty() ? "" : ", ") + m;
    return invalid_argument("the server at " + c->ep_.url + " does not serve '" + c->ep_.model + "' (it lists: " + list + ")");
  }
  return c;
}

Result<std::vector<std::string>> RemoteClient::list_models() {
  auto res = http_->Get(base_path_ + "/models");
  if (!res) return transport_error(res.error(), ep_.url);
  if (res->status != 200) return http_status_error(res->status, res->body, ep_.url);
  std::vector<std::string> out;
  try {
    const json j = json::parse(res->body);
    for (const auto& m : j.at("data"))
      if (m.contains("id") && m["id"].is_string()) out.push_back(m["id"].get<std::string>());
  } catch (const json::exception& e) {
    return io_error("the server at " + ep_.url + " sent a model list PhaseLab cannot read (" + e.what() +
                    "): is it an OpenAI-compatible server?");
  }
  return out;
}

Result<RemoteResult> RemoteClient::chat(const std::vector<ChatMessage>& messages, const GenerateOptions& opt,
                                        const TokenCallback& on_token, const std::atomic<bool>* cancel) {
  json body = remote_sampling_fields(opt);
  json msgs = json::array();
  for (const auto& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  body["messages"] = msgs;
  return stream("/chat/completions", std::move(body), true, on_token, cancel);
}

Result<RemoteResult> RemoteClient::complete(const std::string& prompt, const GenerateOptions& opt,
                                            const TokenCallback& on_token, const std::atomic<bool>* cancel) {
  json body = remote_sampling_fields(opt);
  body["prompt"] = prompt;
  return stream("/completions", std::move(body), false, on_token, cancel);
}

namespace {

// One streamed answer as it arrives: its server-sent events parsed, the text
// and usage gathered, and the metrics measured from the arrival times.
class AnswerStream {
 public:
  AnswerStream(bool chat, const TokenCallback& on_token) : chat_(chat), on_token_(on_token) {}
  AnswerStream(const AnswerStream&) = delete;  // m_ points into out_
  AnswerStream& operator=(const AnswerStream&) = delete;

  // Bytes of the event stream, as they arrive.
  void feed(const char* data, size_t len);
  // The stream ended normally: the stop reason and the final rates.
  void finish();
  // An error event the server sent (ok when none).
  const Status& error() const { return error_; }
  RemoteResult& result() { return out_; }

 private:
  void on_event(const std::string& data);
  void update_rates();

  const bool chat_;  // chat completions (delta.content) or completions (text)
  const TokenCallback& on_token_;
  RemoteResult out_;
  RequestMetrics& m_ = out_.result.metrics;
  std::string pending_;  // bytes of an event not yet complete
  std::string finish_;   // the last finish_reason
  int n_pieces_ = 0;
  Status error_;
  const Clock::time_point t0_ = Clock::now();
  double t_first_ = 0, t_last_ = 0;
};

void AnswerStream::feed(const char* data, size_t len) {
  // Events end with a blank line; each line of one is "field: value".
  // Lines may end in CRLF: the CRs go as the data arrives, so an event is
  // found whichever ending the server uses, the last one included.
  for (size_t i = 0; i < len; i++)
    if (data[i] != '\r') pending_.push_back(data[i]);
  for (size_t end; (end = pending_.find("\n\n")) != std::string::npos;) {
    std::string event = pending_.substr(0, end);
    pending_.erase(0, end + 2);
    size_t pos = 0;
    while (pos <= event.size()) {
      size_t nl = event.find('\n', pos);
      if (nl == std::string::npos) nl = event.size();
      std::string line = event.substr(pos, nl - pos);
      if (line.rfind("data:", 0) == 0) {
        std::string d = line.substr(5);
        if (!d.empty() && d.front() == ' ') d.erase(0, 1);
        on_event(d);
      }
      pos = nl + 1;
    }
  }
}

// One "data: ..." event of the stream.
void AnswerStream::on_event(const std::string& data) {
  if (data == "[DONE]") return;
  json j;
  try {
    j = json::parse(data);
  } catch (const json::exception&) {
    return;  // a keep-alive comment or a line we do not know: skip it
  }
  if (j.contains("error")) {
    error_ = io_error("the server ended the answer with an error: " + error_message_of(data));
    return;
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const json& u = j["usage"];
    m_.n_prompt = u.value("prompt_tokens", 0);
    m_.n_generated = u.value("completion_tokens", 0);
    if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object())
      m_.n_reused = u["prompt_tokens_details"].value("cached_tokens", 0);
  }
  if (j.contains("timings") && j["timings"].is_object()) out_.server_timings = j["timings"];
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return;
  const json& c = j["choices"][0];
  std::string text;
  if (chat_ && c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") &&
      c["delta"]["content"].is_string())
    text = c["delta"]["content"].get<std::string>();
  else if (!chat_ && c.contains("text") && c["text"].is_string())
    text = c["text"].get<std::string>();
  const bool has_text = chat_ ? c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") &&
                                    c["delta"]["content"].is_string() && !c["delta"].contains("role")
                              : c.contains("text") && c["text"].is_string();
  // A reasoning model's thinking (gpt-oss through llama-server or vLLM,
  // PhaseLab's own server): delta.reasoning_content (vLLM's newer
  // delta.reasoning), kept apart from the answer.
  std::string reasoning;
  if (chat_ && c.contains("delta") && c["delta"].is_object())
    for (const char* key : {"reasoning_content", "reasoning"})
      if (c["delta"].contains(key) && c["delta"][key].is_string()) {
        reasoning = c["delta"][key].get<std::string>();
        break;
      }
  const bool final_chunk = c.contains("finish_reason") && c["finish_reason"].is_string();
  if (final_chunk) finish_ = c["finish_reason"].get<std::string>();
  // A token: a piece of text, or an empty one that is neither the role
  // announcement nor the closing chunk (servers that send an event per token,
  // PhaseLab among them, send "" for a token without text of its own yet).
  if (text.empty() && reasoning.empty() && (!has_text || final_chunk)) return;
  const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0_).count();
  if (n_pieces_ == 0) {
    t_first_ = t;
    m_.ttft_ms = t;
  }
  t_last_ = t;
  out_.result.text += text;
  out_.result.reasoning += reasoning;
  m_.n_generated = std::max(m_.n_generated, n_pieces_ + 1);
  update_rates();
  if (on_token_) on_token_(TokenEvent{-1, text, n_pieces_, t, &m_, nullptr, reasoning});
  n_pieces_++;
}

// Decode rates from arrival times. Tokens that arrive together (a fast
// model on loopback: the server's writes meet in one read) give no
// measurable interval; the rates are then left at 0 ("not measured"), not
// turned into an absurd figure.
void AnswerStream::update_rates() {
  m_.update_rates(t_first_, t_last_);
  if (m_.n_generated > 1 && t_last_ - t_first_ < kMinDecodeSpanMs) m_.decode_tps = m_.tpot_ms = 0;
}

void AnswerStream::finish() {
  m_.stop_reason = finish_ == "length" ? StopReason::length : finish_.empty() ? StopReason::unknown : StopReason::remote_stop;
  update_rates();
}

}  // namespace

Result<RemoteResult> RemoteClient::stream(const std::string& path, json body, bool chat, const TokenCallback& on_token,
                                          const std::atomic<bool>* cancel) {
  body["model"] = ep_.model;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};

  AnswerStream answer(chat, on_token);
  std::string error_body;
  int status = 0;
  bool cancelled_here = false;

  httplib::Request req;
  req.method = "POST";
  req.path = base_path_ + path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (cancel && cancel->load()) {
      cancelled_here = true;
      return false;  // closes the connection: the server cancels the sequence
    }
    if (status != 200) {
      error_body.append(data, len);
      return error_body.size() < (1u << 20);
    }
    answer.feed(data, len);
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = http_->send(req, res, err);
  if (cancelled_here) {
    answer.result().result.metrics.stop_reason = StopReason::cancelled;
    return std::move(answer.result());
  }
  if (!ok && status == 0) return transport_error(err, ep_.url);
  if (status != 200) return http_status_error(status, error_body.empty() ? res.body : error_body, ep_.url);
  if (!answer.error().is_ok()) return answer.error();
  if (!ok) return io_error("the connection to " + ep_.url + " broke mid-answer: " + httplib::to_string(err));
  answer.finish();
  return std::move(answer.result());
}

}  // namespace phaselab
