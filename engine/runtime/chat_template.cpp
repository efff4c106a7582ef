#include "phaselab/chat_template.h"

#include "phaselab/jinja.h"
#include "phaselab/json_bounded.h"

namespace phaselab {

std::string chat_format_name(const ChatFormat& format) {
  if (format.jinja) return std::string("Jinja template, ") + chat_template_family_name(format.family) + " stops";
  return chat_template_family_name(format.family);
}

namespace {
using ojson = nlohmann::ordered_json;

// A message as templates read it.
ojson message_json(const ChatMessage& m) {
  ojson j = {{"role", m.role}, {"content", m.content}};
  if (!m.tool_calls.empty()) {
    ojson calls = ojson::parse(m.tool_calls);
    for (auto& c : calls)
      if (c.contains("function") && c["function"].contains("arguments") && c["function"]["arguments"].is_string()) {
        ojson& a = c["function"]["arguments"];
        const ojson parsed = parse_json_bounded<ojson>(a.get<std::string>());
        if (parsed.is_object()) a = parsed;
      }
    j["tool_calls"] = std::move(calls);
  }
  if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
  if (!m.name.empty()) j["name"] = m.name;
  return j;
}
}  // namespace

ToolCallSyntax detect_tool_call_syntax(const jinja::Template& t) {
  const ojson args = {{"k", "v"}};
  ojson ctx;
  ctx["messages"] = ojson::array(
      {{{"role", "user"}, {"content", "Probe?"}},
       {{"role", "assistant"},
        {"content", ""},
        {"tool_calls",
         ojson::array({{{"id", "call_probe"}, {"type", "function"}, {"function", {{"name", "probe_fn"}, {"arguments", args}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "call_probe"}, {"name", "probe_fn"}, {"content", "ok"}}});
  ctx["tools"] = ojson::array(
      {{{"type", "function"},
        {"function",
         {{"name", "probe_fn"},
          {"description", "A probe."},
          {"parameters", {{"type", "object"}, {"properties", {{"k", {{"type", "string"}}}}}}}}}}});
  ctx["add_generation_prompt"] = true;
  ctx["bos_token"] = "";
  ctx["eos_token"] = "";
  // The template's text for ctx; nullopt where it fails on the probe.
  const auto render = [&]() -> std::optional<std::string> {
    try {
      return t.render(ctx);
    } catch (const jinja::Error&) {
      return std::nullopt;
    } catch (const nlohmann::json::exception&) {
      return std::nullopt;
    }
  };
  const std::optional<std::string> text = render();
  if (!text) return ToolCallSyntax::none;
  const std::string_view s = *text;
  const auto is_args = [&](std::string_view a) { return parse_json_bounded<ojson>(a) == args; };
  // hermes: <tool_call> {"name": "probe_fn", "arguments": {"k": "v"}} </tool_call>
  // (the call's block, after the system prompt's description of the form),
  // read as the front ends read a model's reply
  for (const ToolCallBlock& b : tool_call_blocks(s)) {
    if (!b.closed) break;
    const auto call = parse_tool_call(s.substr(b.body_begin, b.body_end - b.body_begin));
    if (call && call->name == "probe_fn" && is_args(call->arguments)) return ToolCallSyntax::hermes;
  }
  // harmony: ... to=functions.probe_fn ... <|message|>{"k": "v"}<|call|>
  if (const size_t to = s.find("to=functions.probe_fn"); to != std::string_view::npos) {
    const size_t msg = s.find("<|message|>", to), call = s.find("<|call|>", to);
    if (msg != std::string_view::npos && call != std::string_view::npos && msg < call) {
      const size_t body = msg + std::string_view("<|message|>").size();
      if (is_args(s.substr(body, call - body))) return ToolCallSyntax::harmony;
    }
  }
  // json: <|end_header_id|>\n\n{"name": "probe_fn", "parameters": {"k": "v"}}<|eot_id|>
  // -- the object written where the assistant's text would be (the same
  // text before it as before an answer "probe_answer"), and nothing after it
  // but the end of the turn (a special token): a reply that is nothing but
  // the call. Not a call in a role of its own (GigaChat's "function call"),
  // in a list ([TOOL_CALLS] [...]) or in a tool description.
  ctx["messages"] = ojson::array({ctx["messages"][0], {{"role", "assistant"}, {"content", "probe_answer"}}});
  const std::optional<std::string> answered = render();
  const size_t content_at = answered ? answered->find("probe_answer") : std::string::npos;
  if (content_at == std::string::npos) return ToolCallSyntax::none;
  const auto space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  const auto rtrim = [&](std::string_view v) {
    while (!v.empty() && space(v.back())) v.remove_suffix(1);
    return v;
  };
  const std::string_view before_answer = rtrim(std::string_view(*answered).substr(0, content_at));
  constexpr std::string_view kName = "{\"name\"";
  for (size_t open = s.find(kName); open != std::string_view::npos; open = s.find(kName, open + 1)) {
    const size_t len = json_object_length(s, open, 4096);  // (the probe's call is under 100 bytes)
    if (len == 0 || rtrim(s.substr(0, open)) != before_answer) continue;
    size_t after = open + len;
    while (after < s.size() && space(s[after])) after++;
    if (after < s.size() && s[after] != '<') continue;
    const auto call = parse_tool_call(s.substr(open, len));
    if (call && call->name == "probe_fn" && is_args(call->arguments)) return ToolCallSyntax::json;
  }
  return ToolCallSyntax::none;
}

size_t json_object_length(std::string_view text, size_t begin, size_t max_len) {
  if (begin >= text.size() || text[begin] != '{') return 0;
  int depth = 0;
  bool in_string = false;
  for (size_t i = begin; i < text.size() && i - begin < max_len; i++) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') i++;  // the escaped character
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      depth++;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return c == '}' ? i - begin + 1 : 0;
    }
  }
  return 0;
}

std::vector<ToolCallBlock> tool_call_blocks(std::string_view text) {
  constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
  std::vector<ToolCallBlock> blocks;
  for (size_t pos = text.find(kOpen); pos != std::string_view::npos; pos = text.find(kOpen, pos)) {
    ToolCallBlock b;
    b.begin = pos;
    b.body_begin = pos + kOpen.size();
    const size_t close = text.find(kClose, b.body_begin);
    b.closed = close != std::string_view::npos;
    b.body_end = b.closed ? close : text.size();
    b.end = b.closed ? close + kClose.size() : text.size();
    blocks.push_back(b);
    pos = b.end;
  }
  return blocks;
}

std::optional<ToolCallText> parse_tool_call(std::string_view body) {
  const ojson j = parse_json_bounded<ojson>(body);
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const char* key = j.contains("arguments") ? "arguments" : "parameters";
  const ojson args = j.contains(key) ? j[key] : ojson::object();
  if (!args.is_object() && !args.is_string()) return std::nullopt;
  return ToolCallText{j["name"].get<std::string>(),
                      args.is_string() ? args.get<std::string>() : args.dump(-1, ' ', false, ojson::error_handler_t::replace)};
}

RenderedChat render_chat(const ChatFormat& format, const std::vector<ChatMessage>& messages,
                         bool add_generation_prompt, const std::string& tools) {
  RenderedChat out;
  if (format.jinja) {
    try {
      ojson ctx;
      ctx["messages"] = ojson::array();
      for (const auto& m : messages) ctx["messages"].push_back(message_json(m));
      ctx["add_generation_prompt"] = add_generation_prompt;
      ctx["bos_token"] = format.bos_token;
      ctx["eos_token"] = format.eos_token;
      if (!tools.empty()) ctx["tools"] = ojson::parse(tools);
      out.text = format.jinja->render(ctx);
      out.from_template = true;
      return out;
    } catch (const jinja::Error& e) {
      out.fallback = e.what();
    } catch (const nlohmann::json::exception& e) {  // a message that is not UTF-8 cannot be a JSON string
      out.fallback = e.what();
    }
  }
  out.text = apply_chat_template(format.family, messages, add_generation_prompt);
  return out;
}

ChatTemplateFamily detect_chat_template(std::string_view s) {
  if (s.find("<start_of_turn>") != std::string_view::npos) return ChatTemplateFamily::gemma;
  if (s.find("<|im_start|>") != std::string_view::npos) return ChatTemplateFamily::chatml;
  if (s.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplateFamily::llama3;
  if (s.find("[INST]") != std::string_view::npos) return ChatTemplateFamily::llama2;
  // Phi-3/3.5/4-mini: <|user|> turns closed by <|end|> (Zephyr's <|user|>
  // turns end with </s> instead).
  if (s.find("<|user|>") != std::string_view::npos && s.find("<|end|>") != std::string_view::npos)
    return ChatTemplateFamily::phi3;
  return ChatTemplateFamily::plain;
}

const char* chat_template_family_name(ChatTemplateFamily f) {
  switch (f) {
    case ChatTemplateFamily::plain: return "plain";
    case ChatTemplateFamily::plain_fewshot: return "plain-fewshot";
    case ChatTemplateFamily::gemma: return "gemma";
    case ChatTemplateFamily::chatml: return "chatml";
    case ChatTemplateFamily::llama3: return "llama3";
    case ChatTemplateFamily::llama2: return "llama2";
    case ChatTemplateFamily::phi3: return "phi3";
  }
  return "plain";
}

std::optional<ChatTemplateFamily> chat_template_family_from_name(std::string_view name) {
  for (ChatTemplateFamily f : chat_template_families())
    if (name == chat_template_family_name(f)) return f;
  return std::nullopt;
}

std::vector<ChatTemplateFamily> chat_template_families() {
  return {ChatTemplateFamily::gemma,  ChatTemplateFamily::chatml, ChatTemplateFamily::llama3,
          ChatTemplateFamily::llama2, ChatTemplateFamily::phi3,   ChatTemplateFamily::plain,
          ChatTemplateFamily::plain_fewshot};
}

namespace {

// Gemma has no system role: the system prompt opens the first user turn.
std::string render_gemma(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out, pending_system;
  for (const auto& m : msgs) {
    if (m.role == "system") {
      pending_system += m.content;
      continue;
    }
    const bool user = m.role != "assistant";
    out += std::string("<start_of_turn>") + (user ? "user" : "model") + "\n";
    if (user && !pending_system.empty()) {
      out += pending_system + "\n\n";
      pending_system.clear();
    }
    out += m.content + "<end_of_turn>\n";
  }
  if (gen) out += "<start_of_turn>model\n";
  return out;
}

std::string render_chatml(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out;
  for (const auto& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

// Phi-3: <|role|>\n text <|end|>\n per turn (an empty system turn left
// out, as Phi-3.5's template does).
std::string render_phi3(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out;
  for (const auto& m : msgs) {
    if (m.role == "system" && m.content.empty()) continue;
    out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
  }
  if (gen) out += "<|assistant|>\n";
  return out;
}

std::string render_llama3(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out;
  for (const auto& m : msgs) out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Llama 2 / Mistral: [INST] user [/INST] answer</s><s>[INST] ...; the system
// prompt sits in <<SYS>> inside the first instruction.
std::string render_llama2(const std::vector<ChatMessage>& msgs, bool /*gen*/) {
  std::string out, system;
  bool first = true;
  for (const auto& m : msgs) {
    if (m.role == "system") {
      system = m.content;
    } else if (m.role == "user") {
      if (!first) out += "<s>";
      out += "[INST] ";
      if (!system.empty()) {
        out += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
        system.clear();
      }
      out += m.content + " [/INST]";
      first = false;
    } else {
      out += " " + m.content + " </s>";
    }
  }
  return out;
}

std::string render_plain(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out;
  for (const auto& m : msgs) {
    const char* who = m.role == "system" ? "System" : m.role == "assistant" ? "Assistant" : "User";
    // An answer generated after "Assistant:" begins with the space the model
    // chose (" The sky ..."): a second one would make the next turn's prompt
    // differ from the cached tokens where the answer began, and every turn
    // would prefill the whole previous answer again.
    const bool spaced = !m.content.empty() && m.content.front() == ' ';
    out += std::string(who) + (spaced ? ":" : ": ") + m.content + "\n";
  }
  if (gen) out += "Assistant:";
  return out;
}

// The examples answer questions unlike the ones people test with first (no
// capitals of countries), so a right answer is the model's, not a copy. Chosen
// on eight test questions with Gemma 3 270M (greedy): examples about what
// things are made of were copied into unrelated answers ("the sky is blue
// because it is made of hydrogen and oxygen"); these three were not.
constexpr const char* kFewShotPreamble =
    "The following is a conversation between a person and a helpful assistant. The assistant answers "
    "each question accurately and briefly.\n"
    "\n"
    "User: How many legs does a spider have?\n"
    "Assistant: A spider has eight legs.\n"
    "User: What is the boiling point of water at sea level?\n"
    "Assistant: Water boils at 100 degrees Celsius (212 degrees Fahrenheit) at sea level.\n"
    "User: Who painted the Mona Lisa?\n"
    "Assistant: Leonardo da Vinci painted the Mona Lisa in the early 1500s.\n";

// A system prompt replaces the preamble's first sentence: it says who the
// assistant is; the examples still show what an answer looks like.
std::string render_plain_fewshot(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out = kFewShotPreamble, system;
  std::vector<ChatMessage> turns;
  for (const auto& m : msgs) {
    if (m.role == "system") system += m.content;
    else turns.push_back(m);
  }
  if (!system.empty()) {
    const std::string_view p = kFewShotPreamble;
    out = system + "\n" + std::string(p.substr(p.find("\n\n") + 1));
  }
  return out + render_plain(turns, gen);
}

}  // namespace

std::string apply_chat_template(ChatTemplateFamily family, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  switch (family) {
    case ChatTemplateFamily::gemma: return render_gemma(messages, add_generation_prompt);
    case ChatTemplateFamily::chatml: return render_chatml(messages, add_generation_prompt);
    case ChatTemplateFamily::llama3: return render_llama3(messages, add_generation_prompt);
    case ChatTemplateFamily::llama2: return render_llama2(messages, add_generation_prompt);
    case ChatTemplateFamily::phi3: return render_phi3(messages, add_generation_prompt);
    case ChatTemplateFamily::plain_fewshot: return render_plain_fewshot(messages, add_generation_prompt);
    case ChatTemplateFamily::plain: break;
  }
  return render_plain(messages, add_generation_prompt);
}

std::vector<std::string> chat_stop_strings(ChatTemplateFamily family) {
  switch (family) {
    case ChatTemplateFamily::gemma: return {"<end_of_turn>", "<start_of_turn>"};
    case ChatTemplateFamily::chatml: return {"<|im_end|>", "<|im_start|>"};
    case ChatTemplateFamily::llama3: return {"<|eot_id|>", "<|start_header_id|>"};
    case ChatTemplateFamily::llama2: return {"[INST]", "</s>"};
    case ChatTemplateFamily::phi3: return {"<|end|>", "<|user|>"};
    // A base model may also start another "Assistant:" line of its own.
    case ChatTemplateFamily::plain:
    case ChatTemplateFamily::plain_fewshot: return {"\nUser:", "\nSystem:", "\nAssistant:"};
  }
  return {};
}

}  // namespace phaselab
