// A client of any OpenAI-compatible server (PhaseLab's own, vLLM, SGLang,
// llama-server, NVIDIA Dynamo): chat and completions, streamed, measured on
// the client side the way PhaseLab measures its own engine: TTFT is request
// sent -> first text received, decode tokens/s counts the streamed tokens
// between the first and the last (0 when they arrive together, within 1 ms,
// as a fast model over loopback can do; the server's usage gives the counts when it
// sends one). What only the server knows (prefill time, KV blocks) is absent:
// RemoteResult::server_timings holds what the server reported, if anything.
#pragma once

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "phaselab/chat_template.h"
#include "phaselab/session.h"
#include "phaselab/status.h"

namespace httplib {
class Client;
}

namespace phaselab {

struct RemoteEndpoint {
  std::string url;      // http(s)://host[:port][/base]; "/v1" is added when there is no path
  std::string api_key;  // sent as "Authorization: Bearer KEY"; empty: none
  std::string model;    // empty: the first model the server lists
  int timeout_s = 600;  // read timeout of one request
};

struct RemoteResult {
  GenerateResult result;         // text, metrics (client-side), tokens empty (ids are the server's)
  nlohmann::json server_timings; // the response's "timings" object, when the server sends one
};

class RemoteClient {
 public:
  // Checks the URL and asks the server for its models (an error says whether
  // the server could not be reached, refused the key, or lacks the model).
  static Result<std::unique_ptr<RemoteClient>> connect(RemoteEndpoint ep);
  ~RemoteClient();

  Result<std::vector<std::string>> list_models();
  // POST {base}/chat/completions, streamed. opt: n_predict, sampling
  // (temperature, top_p, top_k, min_p, penalties, seed), stop. on_token gets
  // one event per streamed piece of text. cancel is read between pieces and
  // closes the connection (the server then cancels the sequence).
  Result<RemoteResult> chat(const std::vector<ChatMessage>& messages, const GenerateOptions& opt,
                            const TokenCallback& on_token, const std::atomic<bool>* cancel = nullptr);
  // POST {base}/completions, streamed: plain text continuation.
  Result<RemoteResult> complete(const std::string& prompt, const GenerateOptions& opt, const TokenCallback& on_token,
                                const std::atomic<bool>* cancel = nullptr);

  const std::string& model() const { return ep_.model; }
  const std::string& url() const { return ep_.url; }
  // "remote: MODEL at URL"
  std::string describe() const;

 private:
  RemoteClient() = default;
  Result<RemoteResult> stream(const std::string& path, nlohmann::json body, bool chat, const TokenCallback& on_token,
                              const std::atomic<bool>* cancel);

  RemoteEndpoint ep_;
  std::string origin_;    // scheme://host:port
  std::string base_path_; // e.g. /v1
  std::unique_ptr<httplib::Client> http_;
};

// The request body's sampling fields from GenerateOptions (shared by chat and
// completions; tests check it).
nlohmann::json remote_sampling_fields(const GenerateOptions& opt);

}  // namespace phaselab
