// The OpenAI API's responses (phaselab/openai_api.h): whole answers, streamed
// chunks, log-probabilities, and the function calls parsed out of answers.
// The requests are read in openai_api.cpp.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <utility>

#include "phaselab/chat_template.h"
#include "phaselab/json_bounded.h"
#include "phaselab/openai_api.h"

namespace phaselab::openai {

using nlohmann::json;

bool is_function_name(const json& n) {
  if (!n.is_string()) return false;
  const std::string& s = n.get_ref<const std::string&>();
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '-';
  });
}

const char* finish_reason(StopReason stop_reason) {
  if (stop_reason == StopReason::length || stop_reason == StopReason::context_full) return "length";
  return "stop";
}

json usage_json(const RequestMetrics& m) {
  json u = {{"prompt_tokens", m.n_prompt},
            {"completion_tokens", m.n_generated},
            {"total_tokens", m.n_prompt + m.n_generated}};
  u["prompt_tokens_details"] = {{"cached_tokens", m.n_reused}};
  return u;
}

json timings_json(const RequestMetrics& m, int preemptions) {
  return {{"ttft_ms", m.ttft_ms},
          {"prefill_ms", m.prefill_ms},
          {"prefill_tokens_per_s", m.prefill_tps},
          {"decode_ms", m.decode_ms},
          {"decode_tokens_per_s", m.decode_tps},
          {"tpot_ms", m.tpot_ms},
          {"prompt_tokens_reused", m.n_reused},
          {"preemptions", preemptions},
          {"stop_reason", to_string(m.stop_reason)}};
}

ResponseHead make_head(Endpoint ep, const std::string& model, uint64_t request_id) {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) | rd();
  char id[64];
  std::snprintf(id, sizeof id, "%s-%016llx-%llu", ep == Endpoint::chat ? "chatcmpl" : "cmpl",
                static_cast<unsigned long long>(r), static_cast<unsigned long long>(request_id));
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return {id, std::chrono::duration_cast<std::chrono::seconds>(now).count(), model};
}

namespace {
json head_json(Endpoint ep, const ResponseHead& h, bool chunk) {
  const char* object = ep == Endpoint::chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}, {"system_fingerprint", "phaselab"}};
}
}  // namespace

namespace {

// OpenAI writes the log-probability of an impossible token as -9999.0 (JSON
// has no infinity).
double logprob_value(float lp) { return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0; }

// A token as logprobs show it: its text (special tokens by name, so that an
// end-of-text alternative is not an empty string) and its bytes.
json token_entry(const Tokenizer& tok, int32_t id, float lp) {
  const std::string piece = tok.token_to_piece(id, true);
  json bytes = json::array();
  for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
  return {{"token", piece}, {"logprob", logprob_value(lp)}, {"bytes", std::move(bytes)}};
}

// logprobs of n tokens in the endpoint's shape. text_offset: characters of
// the answer before the first of them (completions).
json logprobs_json(Endpoint ep, const TokenLogprob* lps, size_t n, const Tokenizer& tok, size_t text_offset) {
  if (ep == Endpoint::chat) {
    json content = json::array();
    for (size_t i = 0; i < n; i++) {
      json e = token_entry(tok, lps[i].id, lps[i].logprob);
      json top = json::array();
      for (const auto& [id, lp] : lps[i].top) top.push_back(token_entry(tok, id, lp));
      e["top_logprobs"] = std::move(top);
      content.push_back(std::move(e));
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  size_t offset = text_offset;
  for (size_t i = 0; i < n; i++) {
    tokens.push_back(tok.token_to_piece(lps[i].id, true));
    token_logprobs.push_back(logprob_value(lps[i].logprob));
    // OpenAI's completions list the chosen token among the alternatives too
    // (up to logprobs + 1 of them).
    json top = json::object();
    for (const auto& [id, lp] : lps[i].top) top.emplace(tok.token_to_piece(id, true), logprob_value(lp));
    top.emplace(tok.token_to_piece(lps[i].id, true), logprob_value(lps[i].logprob));
    top_logprobs.push_back(std::move(top));
    offsets.push_back(offset);
    offset += utf8_chars(tok.token_to_piece(lps[i].id));  // the text as the answer holds it
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

json choice_json(Endpoint ep, int index, const GenerateResult& r, const Tokenizer* tok, bool tool_calls,
                 const std::vector<std::string>* bare_json_offered) {
  json choice = {{"index", index}, {"finish_reason", finish_reason(r.metrics.stop_reason)}, {"logprobs", nullptr}};
  if (ep == Endpoint::chat) {
    json message = {{"role", "assistant"}, {"content", r.text}};
    if (tool_calls) {  // functions were offered: the answer's calls parsed out of its text
      ToolCallSplit split = bare_json_offered ? split_bare_json_call(r.text, *bare_json_offered) : split_tool_calls(r.text);
      const bool made = !split.calls.empty();
      // (content null only beside calls, as OpenAI answers)
      message["content"] = split.content.empty() && made ? json(nullptr) : json(split.content);
      if (made) message["tool_calls"] = std::move(split.calls);
      choice["finish_reason"] = finish_reason(r, made);
    }
    // A reasoning model's reasoning (gpt-oss, a <think> block), as llama-server and vLLM return it.
    if (!r.reasoning.empty()) message["reasoning_content"] = r.reasoning;
    choice["message"] = std::move(message);
  } else {
    choice["text"] = r.text;
  }
  if (tok && !r.logprobs.empty()) choice["logprobs"] = logprobs_json(ep, r.logprobs.data(), logprob_tokens(r), *tok, 0);
  return choice;
}

json response_of(Endpoint ep, const ResponseHead& h, const std::vector<GenerateResult>& choices, int preemptions,
                 const Tokenizer* tok, bool tool_calls, const std::vector<std::string>* bare_json_offered) {
  json j = head_json(ep, h, false);
  json cs = json::array();
  std::vector<RequestMetrics> m;
  for (size_t i = 0; i < choices.size(); i++) {
    cs.push_back(choice_json(ep, static_cast<int>(i), choices[i], tok, tool_calls, bare_json_offered));
    m.push_back(choices[i].metrics);
  }
  j["choices"] = std::move(cs);
  j["usage"] = usage_json(m);
  j["timings"] = timings_json(choices.empty() ? RequestMetrics{} : choices[0].metrics, preemptions);
  return j;
}

}  // namespace

json usage_json(const std::vector<RequestMetrics>& choices) {
  if (choices.empty()) return usage_json(RequestMetrics{});
  RequestMetrics sum = choices[0];
  for (size_t i = 1; i < choices.size(); i++) sum.n_generated += choices[i].n_generated;
  return usage_json(sum);
}

size_t logprob_tokens(const GenerateResult& r) {
  size_t n = std::min(r.logprobs.size(), r.tokens.size());
  if (n > 0 && n == r.tokens.size() && r.metrics.stop_reason == StopReason::eos) n--;
  return n;
}

json response_json(Endpoint ep, const ResponseHead& h, const std::vector<GenerateResult>& choices, int preemptions,
                   const Tokenizer& tok, bool tool_calls, const std::vector<std::string>* bare_json_offered) {
  return response_of(ep, h, choices, preemptions, &tok, tool_calls, bare_json_offered);
}

namespace {
constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// "call_" and 24 random hex digits, as OpenAI's ids look.
std::string call_id() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (counter++ * 0x9E3779B97F4A7C15ull);
  char id[40];
  std::snprintf(id, sizeof id, "call_%016llx%08x", static_cast<unsigned long long>(r), static_cast<unsigned>(rd()));
  return id;
}

// A block's body as a call (parse_tool_call, a valid function name), or null.
json call_of(std::string_view body) {
  const auto call = parse_tool_call(body);
  if (!call || !is_function_name(call->name)) return nullptr;
  return {{"id", call_id()}, {"type", "function"}, {"function", {{"name", call->name}, {"arguments", call->arguments}}}};
}
}  // namespace

ToolCallSplit split_tool_calls(std::string_view text) {
  ToolCallSplit out;
  std::string content;
  size_t pos = 0;
  for (const ToolCallBlock& b : tool_call_blocks(text)) {
    json call = call_of(text.substr(b.body_begin, b.body_end - b.body_begin));
    content.append(text.substr(pos, b.begin - pos));
    if (call.is_null()) content.append(text.substr(b.begin, b.end - b.begin));  // not a call: kept as written
    else out.calls.push_back(std::move(call));
    pos = b.end;
  }
  if (pos < text.size()) content.append(text.substr(pos));
  out.content = std::string(trim(content));
  return out;
}

ToolCallSplit split_bare_json_call(std::string_view text, const std::vector<std::string>& offered) {
  ToolCallSplit out;
  const std::string_view t = trim(text);
  out.content = std::string(t);
  if (t.empty() || t.front() != '{' || json_object_length(t, 0, t.size()) != t.size()) return out;
  json call = call_of(t);
  if (call.is_null()) return out;
  const std::string& name = call["function"]["name"].get_ref<const std::string&>();
  if (std::find(offered.begin(), offered.end(), name) == offered.end()) return out;  // an answer in JSON
  out.calls.push_back(std::move(call));
  out.content.clear();
  return out;
}

const char* finish_reason(const GenerateResult& r, bool made_calls) {
  const StopReason s = r.metrics.stop_reason;
  if (made_calls && s != StopReason::length && s != StopReason::context_full) return "tool_calls";
  return finish_reason(s);
}

std::string ToolCallStream::push(std::string_view delta) {
  if (in_call_) {
    held_.append(delta);
    return {};
  }
  if (bare_json_) {  // the reply's first visible character decides: '{' may be a call
    if (decided_) return std::string(delta);
    held_.append(delta);
    const std::string_view t = trim(held_);
    if (t.empty()) return {};
    decided_ = true;
    if (t.front() == '{') {
      in_call_ = true;
      return {};
    }
    return std::exchange(held_, {});
  }
  std::string text = held_ + std::string(delta);
  held_.clear();
  if (const size_t open = text.find(kCallOpen); open != std::string::npos) {
    in_call_ = true;
    held_ = text.substr(open);
    return text.substr(0, open);
  }
  // The longest end of the text that could still become "<tool_call>".
  for (size_t n = std::min(text.size(), kCallOpen.size() - 1); n > 0; n--)
    if (std::string_view(text).substr(text.size() - n) == kCallOpen.substr(0, n)) {
      held_ = text.substr(text.size() - n);
      text.resize(text.size() - n);
      break;
    }
  return text;
}

ToolCallSplit ToolCallStream::finish() {
  // Text held only because it might have begun a call goes out as it was
  // (its whitespace included: it follows text already sent).
  ToolCallSplit split;
  if (in_call_) split = bare_json_ ? split_bare_json_call(held_, offered_) : split_tool_calls(held_);
  else split.content = held_;
  held_.clear();
  in_call_ = false;
  return split;
}

json chunk_json(Endpoint ep, const ResponseHead& h, int index, const std::string& text, bool first,
                const std::vector<TokenLogprob>* logprobs, const Tokenizer* tok, size_t text_offset,
                const std::string& reasoning) {
  json j = head_json(ep, h, true);
  json choice = {{"index", index}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
  if (ep == Endpoint::chat) {
    json delta = {{"content", text}};
    if (first) delta["role"] = "assistant";
    if (!reasoning.empty()) delta["reasoning_content"] = reasoning;  // a harmony model's analysis (gpt-oss)
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  if (logprobs && tok) choice["logprobs"] = logprobs_json(ep, logprobs->data(), logprobs->size(), *tok, text_offset);
  j["choices"] = json::array({choice});
  return j;
}

json tool_calls_chunk_json(const ResponseHead& h, int index, const json& calls) {
  json j = head_json(Endpoint::chat, h, true);
  json list = json::array();
  for (size_t k = 0; k < calls.size(); k++) {
    json c = calls[k];
    c["index"] = static_cast<int>(k);
    list.push_back(std::move(c));
  }
  j["choices"] = json::array(
      {{{"index", index}, {"delta", {{"tool_calls", std::move(list)}}}, {"finish_reason", nullptr}, {"logprobs", nullptr}}});
  return j;
}

json final_chunk_json(Endpoint ep, const ResponseHead& h, int index, const GenerateResult& r, int preemptions,
                      bool made_calls) {
  json j = head_json(ep, h, true);
  json choice = {{"index", index}, {"finish_reason", finish_reason(r, made_calls)}, {"logprobs", nullptr}};
  if (ep == Endpoint::chat) choice["delta"] = json::object();
  else choice["text"] = "";
  j["choices"] = json::array({choice});
  j["timings"] = timings_json(r.metrics, preemptions);
  return j;
}

json usage_chunk_json(Endpoint ep, const ResponseHead& h, const std::vector<RequestMetrics>& choices) {
  json j = head_json(ep, h, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(choices);
  return j;
}

size_t utf8_chars(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;  // every byte but a continuation byte starts a character
  return n;
}

std::string sse_event(const json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace phaselab::openai
