// The OpenAI API's requests (phaselab/openai_api.h): every field checked,
// the prompt rendered; the responses are written in openai_response.cpp.
#include "phaselab/openai_api.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdio>
#include <random>

#include "phaselab/json_bounded.h"
#include "phaselab/prompt.h"

namespace phaselab::openai {

using nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return dump(json{{"error", err}});
}

namespace {

// Each checker fills *err (naming the field) and returns false on a bad value.
struct Checker {
  const json& j;
  ApiError* err;
  // The same body with its objects' keys in the order sent, where it holds
  // what a template renders as JSON (tools, calls' arguments); else null.
  const nlohmann::ordered_json* ordered = nullptr;

  bool fail(const std::string& field, const std::string& what) {
    err->http_status = 400;
    err->param = field;
    err->message = "'" + field + "' " + what;
    return false;
  }
  bool has(const char* f) const { return j.contains(f) && !j[f].is_null(); }
  bool number(const char* f, double lo, double hi, float* out) {
    if (!has(f)) return true;
    if (!j[f].is_number()) return fail(f, "must be a number");
    const double v = j[f].get<double>();
    if (!(v >= lo && v <= hi)) {
      char b[96];
      std::snprintf(b, sizeof b, "must be from %g to %g (got %g)", lo, hi, v);
      return fail(f, b);
    }
    *out = static_cast<float>(v);
    return true;
  }
  bool integer(const char* f, long long lo, long long hi, long long* out) {
    if (!has(f)) return true;
    const json& x = j[f];
    if (!x.is_number_integer()) return fail(f, "must be an integer");
    // An unsigned value above INT64_MAX read as long long would wrap (and be
    // shown negative): it is out of range, shown as it was sent.
    const bool huge = x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(LLONG_MAX);
    const long long v = huge ? 0 : x.get<long long>();
    if (huge || v < lo || v > hi)
      return fail(f, "must be from " + std::to_string(lo) + " to " + std::to_string(hi) + " (got " + x.dump() + ")");
    *out = v;
    return true;
  }
  bool boolean(const char* f, bool* out) {
    if (!has(f)) return true;
    if (!j[f].is_boolean()) return fail(f, "must be true or false");
    *out = j[f].get<bool>();
    return true;
  }
  template <typename Pred>
  bool of_type(const char* f, Pred ok, const char* what) {
    return !has(f) || ok(j[f]) || fail(f, what);
  }
};

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
bool content_text(const json& c, const std::string& field, Checker& ck, std::string* out) {
  if (c.is_string()) {
    *out = c.get<std::string>();
    return true;
  }
  if (!c.is_array()) return ck.fail(field, "must be a string or an array of text parts");
  out->clear();
  for (const auto& part : c) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      return ck.fail(field, "may only hold text parts ({\"type\": \"text\", \"text\": ...}): this model reads text");
    *out += part["text"].get<std::string>();
  }
  return true;
}

// The fields PhaseLab reads. Anything else is refused by name rather than
// ignored: a client relying on a field it believes honoured (json_schema,
// tools, suffix) learns at once that it is not.
enum FieldScope : uint8_t { kBoth, kChat, kCompletions };
struct Field {
  const char* name;
  FieldScope scope;
};
constexpr Field kFields[] = {
    {"model", kBoth}, {"stream", kBoth}, {"stream_options", kBoth}, {"temperature", kBoth}, {"top_p", kBoth},
    {"frequency_penalty", kBoth}, {"presence_penalty", kBoth}, {"seed", kBoth}, {"n", kBoth}, {"max_tokens", kBoth},
    {"stop", kBoth}, {"logprobs", kBoth}, {"logit_bias", kBoth},
    // Extensions other local servers (llama-server, vLLM) accept.
    {"top_k", kBoth}, {"min_p", kBoth}, {"repeat_penalty", kBoth}, {"ignore_eos", kBoth},
    // Descriptions of the client that change nothing in the answer.
    {"user", kBoth}, {"metadata", kBoth}, {"store", kBoth}, {"service_tier", kBoth},
    {"messages", kChat}, {"max_completion_tokens", kChat}, {"top_logprobs", kChat}, {"response_format", kChat},
    {"tools", kChat}, {"tool_choice", kChat}, {"parallel_tool_calls", kChat}, {"modalities", kChat},
    {"prompt", kCompletions}, {"echo", kCompletions}, {"best_of", kCompletions},
};

bool check_field_names(Endpoint ep, bool batch, Checker& ck) {
  const FieldScope mine = ep == Endpoint::chat ? kChat : kCompletions;
  for (const auto& [name, value] : ck.j.items()) {
    const Field* f = nullptr;
    for (const Field& k : kFields)
      if (name == k.name) f = &k;
    if (f && (f->scope == kBoth || f->scope == mine)) continue;
    std::string why = std::string("is not supported by ") + (batch ? "phaselab-cli batch" : "PhaseLab's server");
    if (f) why += ep == Endpoint::chat ? " in a chat request (it is a field of /v1/completions)"
                                       : " in a completions request (it is a field of /v1/chat/completions)";
    return ck.fail(name, why);
  }
  return true;
}

// logit_bias: {"token id": bias}, ids as decimal strings (OpenAI's form).
bool parse_logit_bias(Checker& ck, const Tokenizer& tok, SamplingParams* sp) {
  if (!ck.has("logit_bias")) return true;
  const json& b = ck.j["logit_bias"];
  if (!b.is_object()) return ck.fail("logit_bias", "must be an object of token ids (as strings) to numbers from -100 to 100");
  for (const auto& [key, v] : b.items()) {
    int32_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    // The canonical spelling only ("7", not "07" or "+7"), so that one token
    // cannot appear under two keys.
    if (ec != std::errc() || end != key.data() + key.size() || std::to_string(id) != key || id < 0 ||
        id >= tok.n_vocab())
      return ck.fail("logit_bias", "holds the key '" + key + "', which is not a token id of the vocabulary (0.." +
                                      std::to_string(tok.n_vocab() - 1) + ")");
    if (!v.is_number() || !(v.get<double>() >= -100 && v.get<double>() <= 100))
      return ck.fail("logit_bias", "gives token " + key + " the bias " + v.dump() + ": a bias must be a number from -100 to 100");
    sp->logit_bias.emplace_back(id, v.get<float>());
  }
  return true;
}

// A text of this many bytes makes more tokens than the context holds,
// whatever they are (Tokenizer::max_token_text_bytes).
bool cannot_fit(size_t bytes, const Tokenizer& tok, const ApiLimits& limits) {
  const size_t per_token = tok.max_token_text_bytes();
  return per_token > 0 && bytes / per_token >= static_cast<size_t>(limits.n_ctx);
}

bool context_exceeded(Checker& ck, bool batch, const char* field, const std::string& size, const ApiLimits& limits) {
  ck.fail(field, "is " + size + "; the context holds " + std::to_string(limits.n_ctx) +
                     (batch ? " (shorten it or raise --ctx-size)"
                            : " (shorten it or restart the server with a larger --ctx-size)"));
  ck.err->code = "context_length_exceeded";
  return false;
}

bool text_fits(Checker& ck, bool batch, const char* field, size_t bytes, const Tokenizer& tok, const ApiLimits& limits) {
  if (!cannot_fit(bytes, tok, limits)) return true;
  return context_exceeded(ck, batch, field,
                          std::to_string(bytes) + " bytes, at least " +
                              std::to_string(bytes / tok.max_token_text_bytes()) + " tokens",
                          limits);
}

// Fields that describe the client, or ask for nothing PhaseLab lacks: only
// their types (or their one harmless value) are checked.
bool check_client_fields(Checker& ck) {
  const json& j = ck.j;
  const auto is_string = [](const json& x) { return x.is_string(); };
  const auto is_bool = [](const json& x) { return x.is_boolean(); };
  if (!ck.of_type("user", is_string, "must be a string")) return false;
  if (!ck.of_type("metadata", [](const json& x) { return x.is_object(); }, "must be an object")) return false;
  if (!ck.of_type("store", is_bool, "must be true or false")) return false;
  if (!ck.of_type("service_tier", is_string, "must be a string")) return false;
  if (!ck.of_type("parallel_tool_calls", is_bool, "must be true or false")) return false;
  if (ck.has("modalities") && j["modalities"] != json::array({"text"}))
    return ck.fail("modalities", "must be [\"text\"]: PhaseLab's models read and write text");
  if (ck.has("response_format")) {
    const json& rf = j["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
      return ck.fail("response_format", "must be an object such as {\"type\": \"text\"}");
    if (rf["type"] != "text")
      return ck.fail("response_format", "type '" + rf["type"].get<std::string>() +
                                            "' is not supported: PhaseLab does not constrain output yet (only {\"type\": \"text\"})");
  }
  if (ck.has("echo") && !(j["echo"].is_boolean() && !j["echo"].get<bool>()))
    return ck.fail("echo", "is not supported by PhaseLab's server (the answer never repeats the prompt)");
  return true;
}

bool valid_function_name(const json& n) { return is_function_name(n); }

constexpr size_t kMaxTools = 128;

// tools and tool_choice: the functions offered (checked, kept as the JSON
// the template reads) where the model's template has a call syntax PhaseLab
// parses; "auto" (the default) lets the model choose, "none" offers nothing.
// A choice that forces a call ("required", a named function) needs
// constrained decoding, which PhaseLab does not have: refused.
bool parse_tools(Checker& ck, Endpoint ep, bool batch, const ChatFormat& format, std::string* tools, bool* parse_calls,
                 std::vector<std::string>* names) {
  const json& j = ck.j;
  *parse_calls = false;
  tools->clear();
  names->clear();
  if (ck.has("tool_choice")) {
    const json& tc = j["tool_choice"];
    if (tc != "none" && tc != "auto") {
      if (tc == "required" || tc.is_object())
        return ck.fail("tool_choice", "can only be \"auto\" or \"none\": PhaseLab cannot force a call (it does not "
                                      "constrain what the model writes yet); with \"auto\" the model decides");
      return ck.fail("tool_choice", "must be \"auto\" or \"none\"");
    }
  }
  if (!ck.has("tools")) return true;
  const json& ts = j["tools"];
  if (!ts.is_array()) return ck.fail("tools", "must be an array of {\"type\": \"function\", \"function\": {...}}");
  if (ts.empty() || (ck.has("tool_choice") && j["tool_choice"] == "none")) return true;
  if (batch) return ck.fail("tools", "is not supported by phaselab-cli batch yet (its output lines hold text)");
  (void)ep;
  if (ts.size() > kMaxTools) return ck.fail("tools", "holds " + std::to_string(ts.size()) + " functions; at most " +
                                                       std::to_string(kMaxTools) + " are accepted");
  for (size_t i = 0; i < ts.size(); i++) {
    const std::string f = "tools[" + std::to_string(i) + "]";
    const json& t = ts[i];
    if (!t.is_object() || !t.contains("type") || t["type"] != "function" || !t.contains("function") ||
        !t["function"].is_object())
      return ck.fail(f, "must be {\"type\": \"function\", \"function\": {\"name\", \"description\", \"parameters\"}}");
    const json& fn = t["function"];
    if (!fn.contains("name") || !valid_function_name(fn["name"]))
      return ck.fail(f + ".function.name", "must be 1 to 64 letters, digits, '_' or '-'");
    if (fn.contains("description") && !fn["description"].is_string())
      return ck.fail(f + ".function.description", "must be a string");
    if (fn.contains("parameters") && !fn["parameters"].is_object())
      return ck.fail(f + ".function.parameters", "must be a JSON Schema object");
    if (fn.contains("strict") && !fn["strict"].is_boolean()) return ck.fail(f + ".function.strict", "must be true or false");
  }
  if (format.tool_calls == ToolCallSyntax::none)
    return ck.fail("tools", format.jinja ? "cannot be offered to this model: its chat template does not write calls in "
                                           "a syntax PhaseLab reads (<tool_call> JSON </tool_call>: Qwen 2.5, Qwen 3, "
                                           "QwQ, Hermes; harmony's to=functions: gpt-oss; a bare JSON reply: Llama 3.x)"
                                         : "cannot be offered to this model: it has no chat template of its own, so "
                                           "nothing tells it how to call a function");
  *tools = ck.ordered ? ck.ordered->at("tools").dump(-1, ' ', false, json::error_handler_t::replace) : dump(ts);
  for (const json& t : ts) names->push_back(t["function"]["name"].get<std::string>());
  *parse_calls = true;
  return true;
}

bool parse_sampling(Checker& ck, const RequestDefaults& defaults, const Tokenizer& tok, SamplingParams* sp) {
  const json& j = ck.j;
  if (!ck.number("temperature", 0, 2, &sp->temperature)) return false;
  if (!ck.number("top_p", 0, 1, &sp->top_p)) return false;
  if (ck.has("top_p") && sp->top_p <= 0.f) return ck.fail("top_p", "must be above 0");
  if (!ck.number("frequency_penalty", -2, 2, &sp->frequency_penalty)) return false;
  if (!ck.number("presence_penalty", -2, 2, &sp->presence_penalty)) return false;
  if (!ck.number("min_p", 0, 0.999, &sp->min_p)) return false;
  if (!ck.number("repeat_penalty", 0.01, 10, &sp->repeat_penalty)) return false;
  long long v = 0;
  if (!ck.integer("top_k", 0, 1 << 20, &v)) return false;
  if (ck.has("top_k")) sp->top_k = static_cast<int>(v);
  if (ck.has("seed")) {
    if (!j["seed"].is_number_integer()) return ck.fail("seed", "must be an integer");
    sp->seed = j["seed"].is_number_unsigned() ? j["seed"].get<uint64_t>()
                                              : static_cast<uint64_t>(j["seed"].get<long long>());
  } else if (defaults.random_seed) {
    sp->seed = std::random_device{}();
  }
  return parse_logit_bias(ck, tok, sp);
}

// max_tokens (or chat's max_completion_tokens, or batch's "n"), n choices
// and best_of, and the log-probabilities asked for.
bool parse_counts(Checker& ck, Endpoint ep, const ApiLimits& limits, const RequestDefaults& defaults,
                  ParsedRequest* out) {
  const json& j = ck.j;
  const bool batch = defaults.batch_dialect;
  const char* mt = ck.has("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (batch && ck.has("n")) {
    if (ck.has(mt)) return ck.fail("n", "is batch's name for '" + std::string(mt) + "': give one of them");
    mt = "n";
  }
  long long max_tokens = defaults.options.n_predict;
  if (!ck.integer(mt, 1, limits.max_tokens_cap, &max_tokens)) {
    if (!batch)
      ck.err->message += ": the server's limit is " + std::to_string(limits.max_tokens_cap) +
                         " (phaselab-cli serve --max-tokens)";
    return false;
  }
  out->options.n_predict = static_cast<int>(std::min<long long>(max_tokens, limits.max_tokens_cap));

  if (!batch) {
    long long n = 1;
    if (!ck.integer("n", 1, kMaxChoices, &n)) return false;
    out->n = static_cast<int>(n);
  }
  if (ck.has("best_of") && !(j["best_of"].is_number_integer() && j["best_of"] == out->n))
    return ck.fail("best_of", "must equal n (" + std::to_string(out->n) +
                                  "): PhaseLab returns every sequence it generates, it does not rank extra ones");

  // Chat: logprobs (bool) and top_logprobs (0..20); completions: logprobs,
  // the number of alternatives (0..5).
  if (ep == Endpoint::chat) {
    bool want = false;
    if (!ck.boolean("logprobs", &want)) return false;
    long long top = 0;
    if (!ck.integer("top_logprobs", 0, kMaxTopLogprobs, &top)) return false;
    if (ck.has("top_logprobs") && !want) return ck.fail("top_logprobs", "needs 'logprobs': true");
    out->options.logprobs = want ? static_cast<int>(top) : -1;
  } else if (ck.has("logprobs")) {
    long long top = 0;
    if (j["logprobs"].is_boolean())
      return ck.fail("logprobs", "must be an integer from 0 to 5 (the alternatives per token)");
    if (!ck.integer("logprobs", 0, kMaxCompletionLogprobs, &top)) return false;
    out->options.logprobs = static_cast<int>(top);
  }
  // Batch's output lines have no place for them: refused, not dropped.
  if (batch && out->options.logprobs >= 0)
    return ck.fail("logprobs", "is not written by phaselab-cli batch yet (its output lines hold the text and counts)");
  return true;
}

bool parse_stop(Checker& ck, std::vector<std::string>* stop) {
  if (!ck.has("stop")) return true;
  const json& s = ck.j["stop"];
  if (s.is_string()) stop->push_back(s.get<std::string>());
  else if (s.is_array() && s.size() <= 16 && std::all_of(s.begin(), s.end(), [](const json& x) { return x.is_string(); }))
    for (const auto& x : s) stop->push_back(x.get<std::string>());
  else return ck.fail("stop", "must be a string or an array of at most 16 strings");
  for (const auto& x : *stop)
    if (x.empty()) return ck.fail("stop", "must not hold an empty string");
  return true;
}

// A chat or a text through the engine's render_prompt, the rendered text
// measured in bytes before it is tokenized; the template's stop strings join
// the request's.
// need_template: the chat holds what only the model's template can render
// (functions offered, calls, their results): a fallback to the built-in
// family would silently drop them, so it is an error instead.
bool render_into(const PromptInput& in, Checker& ck, bool batch, const char* field, const Tokenizer& tok,
                 const ChatFormat& format, const ApiLimits& limits, ParsedRequest* out, bool need_template = false) {
  auto rendered = render_prompt(tok, format, in, [&](size_t bytes) { return text_fits(ck, batch, field, bytes, tok, limits); });
  if (!rendered) return false;
  if (need_template && !rendered->from_template)
    return ck.fail(field, "holds function calls or their results, and the model's chat template could not render them" +
                              (rendered->template_fallback.empty() ? std::string(" (it has none)")
                                                                   : ": " + rendered->template_fallback));
  out->prompt = std::move(rendered->tokens);
  for (auto& s : rendered->stop) out->options.stop.push_back(s);
  return true;
}

// An assistant message's tool_calls as OpenAI sends them back: [{"id",
// "type": "function", "function": {"name", "arguments" (a string)}}].
bool check_tool_calls(Checker& ck, const std::string& f, const json& calls) {
  if (!calls.is_array() || calls.empty() || calls.size() > kMaxTools)
    return ck.fail(f, "must be a non-empty array of the calls the assistant made");
  for (size_t k = 0; k < calls.size(); k++) {
    const std::string fk = f + "[" + std::to_string(k) + "]";
    const json& c = calls[k];
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
      return ck.fail(fk, "must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
    if (c.contains("id") && !c["id"].is_string()) return ck.fail(fk + ".id", "must be a string");
    if (c.contains("type") && c["type"] != "function") return ck.fail(fk + ".type", "must be \"function\"");
    const json& fn = c["function"];
    if (!fn.contains("name") || !valid_function_name(fn["name"]))
      return ck.fail(fk + ".function.name", "must be 1 to 64 letters, digits, '_' or '-'");
    // (Text of arguments goes to the template as an object where it is one,
    // parsed with its nesting bounded: render_chat.)
    if (!fn.contains("arguments") || !(fn["arguments"].is_string() || fn["arguments"].is_object()))
      return ck.fail(fk + ".function.arguments", "must be the arguments' JSON text");
  }
  return true;
}

// The prompt: chat messages rendered with the model's chat format, or the
// completion's text or token ids.
bool parse_prompt(Checker& ck, Endpoint ep, bool batch, const Tokenizer& tok, const ChatFormat& format,
                  const ApiLimits& limits, const std::string& tools, ParsedRequest* out) {
  const json& j = ck.j;
  const char* field = ep == Endpoint::chat ? "messages" : "prompt";
  if (ep == Endpoint::chat) {
    if (!ck.has("messages")) return ck.fail("messages", "is required");
    const auto& ms = j["messages"];
    if (!ms.is_array() || ms.empty()) return ck.fail("messages", "must be a non-empty array");
    std::vector<ChatMessage> msgs;
    bool tool_turns = false;  // calls or their results, which only the model's template renders
    for (size_t i = 0; i < ms.size(); i++) {
      const std::string f = "messages[" + std::to_string(i) + "]";
      const auto& m = ms[i];
      if (!m.is_object()) return ck.fail(f, "must be an object with 'role' and 'content'");
      if (!m.contains("role") || !m["role"].is_string()) return ck.fail(f + ".role", "must be a string");
      std::string role = m["role"].get<std::string>();
      if (role == "developer") role = "system";
      if (role != "system" && role != "user" && role != "assistant" && role != "tool")
        return ck.fail(f + ".role", "must be system, developer, user, assistant or tool (not '" + role + "')");
      ChatMessage msg{role, {}};
      // (An empty list, as some clients send for a turn without calls, is none.)
      const bool calls = role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null() &&
                         !(m["tool_calls"].is_array() && m["tool_calls"].empty());
      if (calls) {
        if (!check_tool_calls(ck, f + ".tool_calls", m["tool_calls"])) return false;
        msg.tool_calls = ck.ordered ? ck.ordered->at("messages").at(i).at("tool_calls").dump(
                                          -1, ' ', false, json::error_handler_t::replace)
                                    : dump(m["tool_calls"]);
      }
      if (role == "tool") {
        if (!m.contains("tool_call_id") || !m["tool_call_id"].is_string())
          return ck.fail(f + ".tool_call_id", "is required: the id of the call this message answers");
        msg.tool_call_id = m["tool_call_id"].get<std::string>();
        if (m.contains("name")) {
          if (!m["name"].is_string()) return ck.fail(f + ".name", "must be a string");
          msg.name = m["name"].get<std::string>();
        }
      }
      tool_turns = tool_turns || calls || role == "tool";
      // (An assistant's calls may come without text: content null or absent.)
      if (!m.contains("content") || m["content"].is_null()) {
        if (!calls) return ck.fail(f + ".content", "is required");
      } else if (!content_text(m["content"], f + ".content", ck, &msg.content)) {
        return false;
      }
      msgs.push_back(std::move(msg));
    }
    PromptInput in = PromptInput::chat_of(std::move(msgs));
    in.tools = tools;
    if (!render_into(in, ck, batch, field, tok, format, limits, out, tool_turns || !tools.empty())) return false;
  } else {
    if (!ck.has("prompt")) return ck.fail("prompt", "is required");
    const auto& p = j["prompt"];
    const json* text = p.is_string() ? &p : p.is_array() && p.size() == 1 && p[0].is_string() ? &p[0] : nullptr;
    if (text) {
      if (!render_into(PromptInput::text_of(text->get<std::string>()), ck, batch, field, tok, format, limits, out))
        return false;
    } else if (p.is_array() && !p.empty() &&
               std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number_integer(); })) {
      for (const auto& x : p) {
        const long long id = x.is_number_unsigned() && x.get<uint64_t>() > INT32_MAX ? -1 : x.get<long long>();
        if (id < 0 || id >= tok.n_vocab())
          return ck.fail("prompt", "holds token id " + x.dump() + ", outside the vocabulary (0.." +
                                       std::to_string(tok.n_vocab() - 1) + ")");
        out->prompt.push_back(static_cast<int32_t>(id));
      }
    } else {
      return ck.fail("prompt", "must be a string, or an array of token ids (one prompt per request)");
    }
  }
  if (out->prompt.empty()) return ck.fail(field, "gives an empty prompt");
  if (static_cast<int>(out->prompt.size()) >= limits.n_ctx)
    return context_exceeded(ck, batch, field, std::to_string(out->prompt.size()) + " tokens", limits);
  return true;
}

}  // namespace

RequestDefaults server_defaults(const ApiLimits& limits) {
  RequestDefaults d;
  SamplingParams& sp = d.options.sampling;
  sp.temperature = 1.0f;
  sp.top_p = 1.0f;
  sp.top_k = 0;
  sp.min_p = 0.0f;
  d.options.n_predict = limits.max_tokens_cap;
  d.random_seed = true;
  return d;
}

RequestDefaults batch_defaults(const GenerateOptions& flags) {
  RequestDefaults d;
  d.options = flags;
  d.random_seed = false;  // --seed (or the one drawn for the run) for every line
  d.batch_dialect = true;
  return d;
}

bool parse_request(Endpoint ep, const std::string& body, const Tokenizer& tok, const ChatFormat& format,
                   const ApiLimits& limits, ParsedRequest* out, ApiError* err) {
  return parse_request(ep, body, tok, format, limits, server_defaults(limits), out, err);
}

namespace {
struct TooDeep {};
}  // namespace

bool parse_json(const std::string& text, json* out, std::string* error) {
  try {
    // The nesting is bounded while parsing: 100000 '[' would otherwise build
    // as many nested arrays (memory, and recursion when they are destroyed).
    *out = json::parse(text, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) throw TooDeep{};
      return true;
    });
    return true;
  } catch (const json::exception& e) {
    *error = std::string("not valid JSON: ") + e.what();
  } catch (const TooDeep&) {
    *error = "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels: no request needs that";
  }
  return false;
}

namespace {
bool parse_checked(Endpoint ep, const json& j, const nlohmann::ordered_json* ordered, const Tokenizer& tok,
                   const ChatFormat& format, const ApiLimits& limits, const RequestDefaults& defaults,
                   ParsedRequest* out, ApiError* err);
}  // namespace

bool parse_request(Endpoint ep, const std::string& body, const Tokenizer& tok, const ChatFormat& format,
                   const ApiLimits& limits, const RequestDefaults& defaults, ParsedRequest* out, ApiError* err) {
  json j;
  std::string why;
  if (!parse_json(body, &j, &why)) {
    err->http_status = 400;
    err->message = "the body is " + why;
    return false;
  }
  // Functions and calls reach the template with their keys in the order
  // sent (as transformers renders them), not sorted: the body once more,
  // keeping it, where it may hold them.
  nlohmann::ordered_json ordered;
  if (j.is_object() && ep == Endpoint::chat && body.find("tool") != std::string::npos)
    ordered = parse_json_bounded<nlohmann::ordered_json>(body, kMaxJsonDepth);
  return parse_checked(ep, j, ordered.is_object() ? &ordered : nullptr, tok, format, limits, defaults, out, err);
}

bool parse_request(Endpoint ep, const json& j, const Tokenizer& tok, const ChatFormat& format,
                   const ApiLimits& limits, const RequestDefaults& defaults, ParsedRequest* out, ApiError* err) {
  return parse_checked(ep, j, nullptr, tok, format, limits, defaults, out, err);
}

namespace {
bool parse_checked(Endpoint ep, const json& j, const nlohmann::ordered_json* ordered, const Tokenizer& tok,
                   const ChatFormat& format, const ApiLimits& limits, const RequestDefaults& defaults,
                   ParsedRequest* out, ApiError* err) {
  if (!j.is_object()) {
    err->http_status = 400;
    err->message = "the body must be a JSON object";
    return false;
  }
  Checker ck{j, err, ordered};
  if (!check_field_names(ep, defaults.batch_dialect, ck)) return false;
  *out = ParsedRequest{};
  out->endpoint = ep;
  out->options = defaults.options;
  if (ck.has("model")) {
    if (!j["model"].is_string()) return ck.fail("model", "must be a string");
    out->model = j["model"].get<std::string>();
  }
  if (!ck.boolean("stream", &out->stream)) return false;
  if (ck.has("stream_options")) {
    const auto& so = j["stream_options"];
    if (!so.is_object()) return ck.fail("stream_options", "must be an object");
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean()) return ck.fail("stream_options.include_usage", "must be true or false");
      out->include_usage = so["include_usage"].get<bool>();
    }
  }
  if (!ck.boolean("ignore_eos", &out->options.ignore_eos)) return false;
  // A completion is the text as written; a chat reply's <think> block goes
  // out as reasoning_content.
  out->options.think_is_reasoning = ep == Endpoint::chat;
  if (!check_client_fields(ck)) return false;
  if (!parse_sampling(ck, defaults, tok, &out->options.sampling)) return false;
  if (!parse_counts(ck, ep, limits, defaults, out)) return false;
  if (!parse_stop(ck, &out->options.stop)) return false;
  std::string tools;
  if (!parse_tools(ck, ep, defaults.batch_dialect, format, &tools, &out->tool_calls, &out->tool_names)) return false;
  out->bare_json_calls = out->tool_calls && format.tool_calls == ToolCallSyntax::json;
  if (!parse_prompt(ck, ep, defaults.batch_dialect, tok, format, limits, tools, out)) return false;
  // Every field was checked above; this catches defaults out of range (a
  // caller's RequestDefaults), which no field of the request is to blame for.
  if (Status st = out->options.sampling.validate(tok.n_vocab()); !st) {
    err->http_status = 400;
    err->param.clear();
    err->message = "the sampling parameters are out of range: " + st.message();
    return false;
  }
  return true;
}

}  // namespace

bool parse_batch_line(const std::string& line, const Tokenizer& tok, const ChatFormat& format,
                      const ApiLimits& limits, const RequestDefaults& defaults, ParsedRequest* out, ApiError* err) {
  json j;
  if (std::string why; !parse_json(line, &j, &why)) {
    err->message = why;
    return false;
  }
  if (!j.is_object()) {
    err->message = "not a JSON object";
    return false;
  }
  const bool has_prompt = j.contains("prompt"), has_messages = j.contains("messages");
  if (has_prompt == has_messages) {
    err->message = "give exactly one of \"prompt\" (text) and \"messages\" (a chat)";
    return false;
  }
  return parse_request(has_messages ? Endpoint::chat : Endpoint::completions, j, tok, format, limits, defaults, out,
                       err);
}

GenerateOptions options_for_choice(const ParsedRequest& pr, int i) {
  GenerateOptions o = pr.options;
  o.sampling.seed += static_cast<uint64_t>(i);
  return o;
}

}  // namespace phaselab::openai
