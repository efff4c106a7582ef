#include "phaselab/openai_api.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

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
    if (!j[f].is_number_integer()) return fail(f, "must be an integer");
    const long long v = j[f].get<long long>();
    if (v < lo || v > hi) return fail(f, "must be from " + std::to_string(lo) + " to " + std::to_string(hi) +
                                             " (got " + std::to_string(v) + ")");
    *out = v;
    return true;
  }
  bool boolean(const char* f, bool* out) {
    if (!has(f)) return true;
    if (!j[f].is_boolean()) return fail(f, "must be true or false");
    *out = j[f].get<bool>();
    return true;
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

}  // namespace

bool parse_request(Endpoint ep, const std::string& body, const Tokenizer& tok, ChatTemplateFamily family,
                   const ApiLimits& limits, ParsedRequest* out, ApiError* err) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    err->http_status = 400;
    err->message = std::string("the body is not valid JSON: ") + e.what();
    return false;
  }
  if (!j.is_object()) {
    err->http_status = 400;
    err->message = "the body must be a JSON object";
    return false;
  }
  Checker ck{j, err};
  *out = ParsedRequest{};
  out->endpoint = ep;
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

  // Sampling: OpenAI's defaults, not the CLI's.
  SamplingParams& sp = out->options.sampling;
  sp.temperature = 1.0f;
  sp.top_p = 1.0f;
  sp.top_k = 0;
  sp.min_p = 0.0f;
  if (!ck.number("temperature", 0, 2, &sp.temperature)) return false;
  if (!ck.number("top_p", 0, 1, &sp.top_p)) return false;
  if (ck.has("top_p") && sp.top_p <= 0.f) return ck.fail("top_p", "must be above 0");
  if (!ck.number("frequency_penalty", -2, 2, &sp.frequency_penalty)) return false;
  if (!ck.number("presence_penalty", -2, 2, &sp.presence_penalty)) return false;
  if (!ck.number("min_p", 0, 0.999, &sp.min_p)) return false;
  if (!ck.number("repeat_penalty", 0.01, 10, &sp.repeat_penalty)) return false;
  long long v = 0;
  if (!ck.integer("top_k", 0, 1 << 20, &v)) return false;
  if (ck.has("top_k")) sp.top_k = static_cast<int>(v);
  if (ck.has("seed")) {
    if (!j["seed"].is_number_integer()) return ck.fail("seed", "must be an integer");
    sp.seed = j["seed"].is_number_unsigned() ? j["seed"].get<uint64_t>()
                                             : static_cast<uint64_t>(j["seed"].get<long long>());
  } else {
    sp.seed = std::random_device{}();
  }
  if (ck.has("n")) {
    long long n = 0;
    if (!ck.integer("n", 1, 1 << 20, &n)) return false;
    if (n != 1) return ck.fail("n", "must be 1: PhaseLab returns one choice per request (send parallel requests instead)");
  }
  for (const char* f : {"logprobs", "echo"}) {
    if (ck.has(f) && !(j[f].is_boolean() && !j[f].get<bool>()) && !(j[f].is_number_integer() && j[f] == 0))
      return ck.fail(f, "is not supported by PhaseLab's server");
  }
  if (ck.has("best_of") && !(j["best_of"].is_number_integer() && j["best_of"] == 1))
    return ck.fail("best_of", "must be 1");
  if (ck.has("tools") && !(j["tools"].is_array() && j["tools"].empty()))
    return ck.fail("tools", "is not supported by PhaseLab's server (no tool calling yet)");

  // Length: max_tokens (or chat's newer max_completion_tokens).
  const char* mt = ck.has("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  long long max_tokens = limits.max_tokens_cap;
  if (!ck.integer(mt, 1, limits.max_tokens_cap, &max_tokens)) {
    err->message += ": the server's limit is " + std::to_string(limits.max_tokens_cap) +
                    " (phaselab-cli serve --max-tokens)";
    return false;
  }
  out->options.n_predict = static_cast<int>(max_tokens);

  if (ck.has("stop")) {
    const auto& s = j["stop"];
    if (s.is_string()) out->options.stop.push_back(s.get<std::string>());
    else if (s.is_array() && s.size() <= 16 && std::all_of(s.begin(), s.end(), [](const json& x) { return x.is_string(); }))
      for (const auto& x : s) out->options.stop.push_back(x.get<std::string>());
    else return ck.fail("stop", "must be a string or an array of at most 16 strings");
    for (const auto& x : out->options.stop)
      if (x.empty()) return ck.fail("stop", "must not hold an empty string");
  }

  const char* prompt_field = ep == Endpoint::chat ? "messages" : "prompt";
  if (ep == Endpoint::chat) {
    if (!ck.has("messages")) return ck.fail("messages", "is required");
    const auto& ms = j["messages"];
    if (!ms.is_array() || ms.empty()) return ck.fail("messages", "must be a non-empty array");
    std::vector<ChatMessage> msgs;
    for (size_t i = 0; i < ms.size(); i++) {
      const std::string f = "messages[" + std::to_string(i) + "]";
      const auto& m = ms[i];
      if (!m.is_object()) return ck.fail(f, "must be an object with 'role' and 'content'");
      if (!m.contains("role") || !m["role"].is_string()) return ck.fail(f + ".role", "must be a string");
      std::string role = m["role"].get<std::string>();
      if (role == "developer") role = "system";
      if (role != "system" && role != "user" && role != "assistant")
        return ck.fail(f + ".role", "must be system, developer, user or assistant (not '" + role + "')");
      if (!m.contains("content") || m["content"].is_null()) return ck.fail(f + ".content", "is required");
      std::string text;
      if (!content_text(m["content"], f + ".content", ck, &text)) return false;
      msgs.push_back({role, std::move(text)});
    }
    out->prompt = tok.encode(apply_chat_template(family, msgs), true, true);
    for (auto& s : chat_stop_strings(family)) out->options.stop.push_back(s);
  } else {
    if (!ck.has("prompt")) return ck.fail("prompt", "is required");
    const auto& p = j["prompt"];
    if (p.is_string()) {
      out->prompt = tok.encode(p.get<std::string>(), true, false);
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      out->prompt = tok.encode(p[0].get<std::string>(), true, false);
    } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number_integer(); })) {
      for (const auto& x : p) {
        const long long id = x.get<long long>();
        if (id < 0 || id >= tok.n_vocab())
          return ck.fail("prompt", "holds token id " + std::to_string(id) + ", outside the vocabulary (0.." +
                                       std::to_string(tok.n_vocab() - 1) + ")");
        out->prompt.push_back(static_cast<int32_t>(id));
      }
    } else {
      return ck.fail("prompt", "must be a string, or an array of token ids (one prompt per request)");
    }
  }
  if (out->prompt.empty()) return ck.fail(prompt_field, "gives an empty prompt");
  if (static_cast<int>(out->prompt.size()) >= limits.n_ctx) {
    ck.fail(prompt_field, "is " + std::to_string(out->prompt.size()) + " tokens; the context holds " +
                              std::to_string(limits.n_ctx) + " (shorten it or restart the server with a larger --ctx-size)");
    err->code = "context_length_exceeded";
    return false;
  }
  if (Status st = sp.validate(); !st) return ck.fail("temperature", st.message());
  return true;
}

const char* finish_reason(const std::string& stop_reason) {
  if (stop_reason == "length" || stop_reason == "context_full") return "length";
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
          {"stop_reason", m.stop_reason}};
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

json response_json(Endpoint ep, const ResponseHead& h, const GenerateResult& r, int preemptions) {
  json j = head_json(ep, h, false);
  json choice = {{"index", 0}, {"finish_reason", finish_reason(r.metrics.stop_reason)}, {"logprobs", nullptr}};
  if (ep == Endpoint::chat) choice["message"] = {{"role", "assistant"}, {"content", r.text}};
  else choice["text"] = r.text;
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(r.metrics);
  j["timings"] = timings_json(r.metrics, preemptions);
  return j;
}

json chunk_json(Endpoint ep, const ResponseHead& h, const std::string& text, bool first) {
  json j = head_json(ep, h, true);
  json choice = {{"index", 0}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
  if (ep == Endpoint::chat) {
    json delta = {{"content", text}};
    if (first) delta["role"] = "assistant";
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  return j;
}

json final_chunk_json(Endpoint ep, const ResponseHead& h, const GenerateResult& r, int preemptions) {
  json j = head_json(ep, h, true);
  json choice = {{"index", 0}, {"finish_reason", finish_reason(r.metrics.stop_reason)}, {"logprobs", nullptr}};
  if (ep == Endpoint::chat) choice["delta"] = json::object();
  else choice["text"] = "";
  j["choices"] = json::array({choice});
  j["timings"] = timings_json(r.metrics, preemptions);
  return j;
}

json usage_chunk_json(Endpoint ep, const ResponseHead& h, const RequestMetrics& m) {
  json j = head_json(ep, h, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(m);
  return j;
}

std::string sse_event(const json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace phaselab::openai
