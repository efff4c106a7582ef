// The OpenAI HTTP API's JSON, as PhaseLab's server reads and writes it:
// request bodies of /v1/chat/completions and /v1/completions become a
// prompt and GenerateOptions (every field checked, an error naming the bad
// one), and results become response objects and server-sent-event chunks.
// No networking here; the server (openai_server.h) and the tests use it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
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
  int max_tokens_cap = 4096;  // the largest max_tokens accepted
};

constexpr int kMaxChoices = 16;             // the largest "n"
constexpr int kMaxCompletionLogprobs = 5;   // /v1/completions' "logprobs" (chat: top_logprobs up to kMaxTopLogprobs)

// What an absent field means. The server takes OpenAI's (server_defaults);
// phaselab-cli batch takes its command line's sampling flags and -n, and
// reads "n" in its own dialect.
struct RequestDefaults {
  GenerateOptions options;     // sampling (seed included), n_predict, stop (requests add theirs), ignore_eos
  bool random_seed = true;     // an absent "seed" draws a fresh one; false: options.sampling.seed stays
  // phaselab-cli batch: "n" is the answer's token limit (batch's documented
  // alias of max_tokens), not a number of choices.
  bool batch_dialect = false;
};
// Temperature 1, top_p 1, no top-k or min-p cut, no penalties, max_tokens
// up to the cap (and the cap when absent), a random seed.
RequestDefaults server_defaults(const ApiLimits& limits);
// phaselab-cli batch's: its command line's options (the same seed for every
// line), in batch's dialect.
RequestDefaults batch_defaults(const GenerateOptions& flags);

struct ParsedRequest {
  Endpoint endpoint = Endpoint::chat;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  std::string model;           // as the client named it (PhaseLab serves one model)
  int n = 1;                   // choices: n sequences, choice i with options_for_choice(*this, i)
  std::vector<int32_t> prompt;
  GenerateOptions options;     // options.logprobs: -1 none, else the alternatives per token
  bool tool_calls = false;     // functions were offered: the answers' calls are parsed out (split_tool_calls)
  // The template's syntax is a bare JSON reply (ToolCallSyntax::json): read
  // by split_bare_json_call against the names of the functions offered.
  bool bare_json_calls = false;
  std::vector<std::string> tool_names;
};

// Parses and checks a request body: every field is one PhaseLab reads (an
// explicit list; any other is a 400 naming it), each value in range (a 400
// naming the field and the range). OpenAI's defaults apply where a field is
// absent (temperature 1, top_p 1, no top-k or min-p cut, max_tokens up to
// the cap); top_k, min_p, repeat_penalty and ignore_eos are accepted as
// extensions, as other local servers do. The chat template and its stop
// strings come from format (the model's template, or a family). A prompt whose byte length alone proves it
// cannot fit the context is refused before it is tokenized
// (Tokenizer::max_token_text_bytes), with the same context_length_exceeded
// error as one refused after.
bool parse_request(Endpoint ep, const std::string& body, const Tokenizer& tok, const ChatFormat& format,
                   const ApiLimits& limits, ParsedRequest* out, ApiError* err);
// The same with other defaults (phaselab-cli batch), and from a parsed body.
bool parse_request(Endpoint ep, const std::string& body, const Tokenizer& tok, const ChatFormat& format,
                   const ApiLimits& limits, const RequestDefaults& defaults, ParsedRequest* out, ApiError* err);
bool parse_request(Endpoint ep, const nlohmann::json& body, const Tokenizer& tok, const ChatFormat& format,
                   const ApiLimits& limits, const RequestDefaults& defaults, ParsedRequest* out, ApiError* err);

// One line of phaselab-cli batch's input: {"prompt": ...} is read as
// /v1/completions' body, {"messages": [...]} as /v1/chat/completions' (exactly
// one of the two), by parse_request with defaults (batch_defaults). The
// error's message says what is wrong with the line.
bool parse_batch_line(const std::string& line, const Tokenizer& tok, const ChatFormat& format,
                      const ApiLimits& limits, const RequestDefaults& defaults, ParsedRequest* out, ApiError* err);

// Choice i's options: the request's, with seed + i (so that n sampled
// choices differ and each is reproducible from the seed).
GenerateOptions options_for_choice(const ParsedRequest& pr, int i);

// "stop" for an end of generation, "length" for max_tokens or the context.
const char* finish_reason(StopReason stop_reason);

// usage {prompt_tokens, completion_tokens, total_tokens} and PhaseLab's
// timings {ttft_ms, prefill_tokens_per_s, decode_tokens_per_s, tpot_ms,
// prompt_tokens_reused, preemptions}.
nlohmann::json usage_json(const RequestMetrics& m);
// n choices of one request: completion tokens added up, the prompt counted
// once (choice 0's prompt and cached tokens).
nlohmann::json usage_json(const std::vector<RequestMetrics>& choices);
nlohmann::json timings_json(const RequestMetrics& m, int preemptions);

// Identity of one response: "chatcmpl-..." or "cmpl-...", the creation time
// and the model name.
struct ResponseHead {
  std::string id;
  int64_t created = 0;
  std::string model;
};
ResponseHead make_head(Endpoint ep, const std::string& model, uint64_t request_id);

// The tokens a result's logprobs list: every generated token (those of a
// stop string included, though their text is not in the answer) but the
// end-of-generation token that ended it.
size_t logprob_tokens(const GenerateResult& r);

// ---- function calls (ParsedRequest::tool_calls) ----------------------------
// A function's name as OpenAI allows it: a string of 1 to 64 of a-z, A-Z,
// 0-9, _ and -.
bool is_function_name(const nlohmann::json& name);
// A reply split into its text and its calls: each <tool_call> ... </tool_call>
// block (the last may lack its closing tag where the reply ended there) whose
// body is a JSON object {"name": a function name, "arguments": an object or
// its text} becomes a call {"id": "call_...", "type": "function", "function":
// {"name", "arguments": the arguments' JSON text}}; a block that is not one
// stays in the text as written. The text is what is left, trimmed.
struct ToolCallSplit {
  std::string content;
  nlohmann::json calls = nlohmann::json::array();
};
ToolCallSplit split_tool_calls(std::string_view text);
// A reply in ToolCallSyntax::json (Llama 3.x): the whole reply, trimmed, one
// JSON object {"name": one of the offered names, "parameters" (or
// "arguments"): an object or its text} becomes a call as above; anything
// else (other text, an object naming no offered function: an answer in
// JSON) stays the content.
ToolCallSplit split_bare_json_call(std::string_view text, const std::vector<std::string>& offered);
// "tool_calls" where a reply made calls and ended by itself (not cut by
// max_tokens or the context), else finish_reason(stop_reason).
const char* finish_reason(const GenerateResult& r, bool made_calls);

// A streamed reply's text with its calls held back: push() returns what may
// go out as content now (text before a <tool_call>, and before what could
// still become one at the end), finish() the rest, split.
// With bare_json_offered (ToolCallSyntax::json: the functions offered) a
// reply whose first visible character is '{' is held whole and read by
// split_bare_json_call at the end; any other reply streams as it comes.
class ToolCallStream {
 public:
  ToolCallStream() = default;
  explicit ToolCallStream(std::vector<std::string> bare_json_offered)
      : bare_json_(true), offered_(std::move(bare_json_offered)) {}
  std::string push(std::string_view delta);
  ToolCallSplit finish();

 private:
  std::string held_;
  bool in_call_ = false;  // a <tool_call> began (or, bare JSON, the reply began with '{'): held to the end
  bool bare_json_ = false;
  bool decided_ = false;  // bare JSON: the reply's first visible character was seen
  std::vector<std::string> offered_;
};

// The whole (non-streamed) response: choices[i] is choice i. usage as
// usage_json(vector); timings are choice 0's, with preemptions (those of
// every choice, added up by the caller). A choice with logprobs (its
// GenerateResult::logprobs non-empty) gets them in OpenAI's shape: chat
// {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
// "logprob", "bytes"}]}]}, completions {"tokens", "token_logprobs",
// "top_logprobs": [{token: logprob}] (the chosen token included, as OpenAI
// does), "text_offset" (characters from the start of the answer)}; a
// log-probability of minus infinity is written -9999.0, as OpenAI does.
// tool_calls (ParsedRequest::tool_calls): each chat choice's calls parsed
// out (split_tool_calls): "tool_calls" in its message (content null when no
// text is left) and finish_reason "tool_calls".
// bare_json_offered (ParsedRequest::bare_json_calls): the calls are read by
// split_bare_json_call against these names instead.
nlohmann::json response_json(Endpoint ep, const ResponseHead& h, const std::vector<GenerateResult>& choices,
                             int preemptions, const Tokenizer& tok, bool tool_calls = false,
                             const std::vector<std::string>* bare_json_offered = nullptr);
// One streamed chunk of choice index: a piece of text (the first chat chunk
// of a choice also carries the role). logprobs: those of the tokens whose
// text is in this chunk (TokenEvent::logprob of each event since the last
// chunk; an event without text still has one, so a chunk with empty text
// may carry them), in the shape above; nullptr: "logprobs": null.
// text_offset (completions): characters of the answer before this chunk.
// reasoning (chat): the text of a harmony model's other channels this chunk carries (gpt-oss's analysis), sent as
// delta.reasoning_content beside the answer's content, as llama-server and vLLM do.
nlohmann::json chunk_json(Endpoint ep, const ResponseHead& h, int index, const std::string& text, bool first,
                          const std::vector<TokenLogprob>* logprobs, const Tokenizer* tok, size_t text_offset = 0,
                          const std::string& reasoning = "");
// A chat chunk of choice index carrying its calls (ToolCallStream::finish),
// each whole, with its index among them.
nlohmann::json tool_calls_chunk_json(const ResponseHead& h, int index, const nlohmann::json& calls);
// The last chunk of choice index: finish_reason (and timings), no text.
// made_calls: the choice sent calls (finish_reason "tool_calls").
nlohmann::json final_chunk_json(Endpoint ep, const ResponseHead& h, int index, const GenerateResult& r,
                                int preemptions, bool made_calls = false);
// stream_options.include_usage: the chunk after the last, empty choices,
// with usage_json(vector) of every choice.
nlohmann::json usage_chunk_json(Endpoint ep, const ResponseHead& h, const std::vector<RequestMetrics>& choices);

// Parses a request body or a batch line, nested at most kMaxJsonDepth
// levels; false with *error ("not valid JSON: ...") otherwise.
constexpr int kMaxJsonDepth = 32;
bool parse_json(const std::string& text, nlohmann::json* out, std::string* error);

// "data: <json>\n\n" (invalid UTF-8 replaced, so a split character cannot break the JSON).
std::string sse_event(const nlohmann::json& j);
std::string dump(const nlohmann::json& j);
// Characters (UTF-8 code points) in s: completions' text_offset counts them.
size_t utf8_chars(std::string_view s);

}  // namespace phaselab::openai
