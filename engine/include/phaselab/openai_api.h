// The OpenAI HTTP API's JSON, as PhaseLab's server reads and writes it:
// request bodies of /v1/chat/completions and /v1/completions become a
// prompt and GenerateOptions (every field checked, an error naming the bad
// one), and results become response objects and server-sent-event chunks.
// No networking here; the server (openai_server.h) and the tests use it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "phaselab/chat_template.h"
#include "phaselab/session.h"
#include "phaselab/tokenizer.h"

namespace phaselab::openai {

enum class Endpoint { chat, completions };

// An error the client caused (HTTP 4xx) or the server met (5xx), written as
// OpenAI's {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string param;  // the request field at fault; empty when none
  std::string type = "invalid_request_error";
  std::string code;   // e.g. "context_length_exceeded"; empty when none
};
std::string error_body(const ApiError& e);

struct ApiLimits {
  int n_ctx = 4096;           // positions per sequence: prompt + answer must fit
  int max_tokens_cap = 4096;  // the largest max_tokens accepted (and the default)
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::chat;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  std::string model;           // as the client named it (PhaseLab serves one model)
  std::vector<int32_t> prompt;
  GenerateOptions options;
};

// Parses and checks a request body. OpenAI's defaults apply where a field is
// absent (temperature 1, top_p 1, no top-k or min-p cut, max_tokens up to the
// cap); top_k, min_p and repeat_penalty are accepted as extensions, as other
// local servers do. Unknown fields are ignored. The chat template and its
// stop strings come from family.
bool parse_request(Endpoint ep, const std::string& body, const Tokenizer& tok, ChatTemplateFamily family,
                   const ApiLimits& limits, ParsedRequest* out, ApiError* err);

// "stop" for an end of generation, "length" for max_tokens or the context.
const char* finish_reason(const std::string& stop_reason);

// usage {prompt_tokens, completion_tokens, total_tokens} and PhaseLab's
// timings {ttft_ms, prefill_tokens_per_s, decode_tokens_per_s, tpot_ms,
// prompt_tokens_reused, preemptions}.
nlohmann::json usage_json(const RequestMetrics& m);
nlohmann::json timings_json(const RequestMetrics& m, int preemptions);

// Identity of one response: "chatcmpl-..." or "cmpl-...", the creation time
// and the model name.
struct ResponseHead {
  std::string id;
  int64_t created = 0;
  std::string model;
};
ResponseHead make_head(Endpoint ep, const std::string& model, uint64_t request_id);

// The whole (non-streamed) response.
nlohmann::json response_json(Endpoint ep, const ResponseHead& h, const GenerateResult& r, int preemptions);
// One streamed chunk: a piece of text (the first chat chunk also carries the
// role), or the last one with finish_reason (and timings) and no text.
nlohmann::json chunk_json(Endpoint ep, const ResponseHead& h, const std::string& text, bool first);
nlohmann::json final_chunk_json(Endpoint ep, const ResponseHead& h, const GenerateResult& r, int preemptions);
// stream_options.include_usage: the chunk after the last, empty choices, with usage.
nlohmann::json usage_chunk_json(Endpoint ep, const ResponseHead& h, const RequestMetrics& m);
// "data: <json>\n\n" (invalid UTF-8 replaced, so a split character cannot break the JSON).
std::string sse_event(const nlohmann::json& j);
std::string dump(const nlohmann::json& j);

}  // namespace phaselab::openai
