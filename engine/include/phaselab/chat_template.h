// Chat templates. A model's own tokenizer.chat_template (a Jinja program) is
// run by PhaseLab's Jinja interpreter (phaselab/jinja.h); the built-in
// families below render where a model has no template, where its template
// fails, and where the person chooses one. The family of a template is also
// recognised from its text: it gives the stop strings.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace phaselab {

namespace jinja {
class Template;
}

// plain: a "User: / Assistant:" transcript. plain_fewshot: the same
// transcript after a short preamble with three example exchanges, for base
// (pre-trained) models: without examples a base model continues the
// transcript as any text ("Hello, my name is ..."), with them it answers.
enum class ChatTemplateFamily { plain, plain_fewshot, gemma, chatml, llama3, llama2, phi3 };

struct ChatMessage {
  ChatMessage(std::string r = {}, std::string c = {}) : role(std::move(r)), content(std::move(c)) {}  // NOLINT
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  // An assistant turn's function calls, a JSON array in OpenAI's shape
  // ([{"id", "type": "function", "function": {"name", "arguments"}}]); ""
  // none. A tool turn's answer names its call in tool_call_id (and the
  // function in name).
  std::string tool_calls;
  std::string tool_call_id, name;
};

// How a model writes a function call in its reply, as its own chat template
// teaches it (the front ends parse only these): hermes, a JSON object
// {"name", "arguments"} between <tool_call> and </tool_call> (Qwen 2.5,
// Qwen 3, QwQ, Hermes 2 Pro and 3); harmony, a message to "functions.NAME"
// ended by <|call|> (gpt-oss), which HarmonyChannels turns into hermes's
// text; json, the whole reply one bare JSON object {"name", "parameters"}
// (Llama 3.1, 3.2, 3.3), read as a call only when it names a function the
// request offered. none: calls are not parsed (a template without tools, or
// one of another syntax: XML-like parameters, [TOOL_CALLS] lists), so a
// request that offers functions is refused rather than answered with calls
// left as text.
enum class ToolCallSyntax { none, hermes, harmony, json };
// The length of the JSON object that starts at text[begin] ('{'), its
// brackets matched outside strings; 0 where it does not close within
// max_len bytes.
size_t json_object_length(std::string_view text, size_t begin, size_t max_len);
// The template's syntax, found by rendering a probe: a function offered,
// an assistant's call of it with arguments {"k": "v"} and its result; the
// syntax whose form gives that call back from the text (none when neither
// does, or the template fails on the probe).
ToolCallSyntax detect_tool_call_syntax(const jinja::Template& t);

// The <tool_call> ... </tool_call> blocks of a text in hermes's syntax
// (gpt-oss's calls are rewritten into it), in order: each block's bytes
// [begin, end) and its body [body_begin, body_end) between the tags; an
// unclosed last block (closed false) runs to the text's end.
struct ToolCallBlock {
  size_t begin = 0, end = 0, body_begin = 0, body_end = 0;
  bool closed = true;
};
std::vector<ToolCallBlock> tool_call_blocks(std::string_view text);
// A block's body as a call: a JSON object with "name" (a string) and
// "arguments" (or "parameters", as some fine-tunes write; absent: {}), an
// object or a string. arguments: the object's JSON text, or the string as
// given. nullopt: not a call (its JSON nesting is bounded, as everywhere
// model output is parsed).
struct ToolCallText {
  std::string name, arguments;
};
std::optional<ToolCallText> parse_tool_call(std::string_view body);

ChatTemplateFamily detect_chat_template(std::string_view jinja_source);
const char* chat_template_family_name(ChatTemplateFamily f);
// The family of a name chat_template_family_name() returns; nullopt for
// anything else.
std::optional<ChatTemplateFamily> chat_template_family_from_name(std::string_view name);
// The families in the order a template chooser lists them.
std::vector<ChatTemplateFamily> chat_template_families();

// Renders the conversation as prompt text. The BOS token is not included (the
// tokenizer adds it); special markers such as <start_of_turn> are written as
// text, so encode the result with parse_special = true. With
// add_generation_prompt the text ends where the assistant's answer begins.
std::string apply_chat_template(ChatTemplateFamily family, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt = true);

// Text that ends the assistant's turn when it appears in generated text
// (beside the end-of-generation tokens): used as stop strings.
std::vector<std::string> chat_stop_strings(ChatTemplateFamily family);

// How a conversation becomes prompt text: the model's own template when it
// has one (Model::chat_format), else a built-in family. A family converts to
// a format without a template (a family chosen by the person, or a test's).
struct ChatFormat {
  ChatTemplateFamily family = ChatTemplateFamily::plain;  // stop strings; renders without / after a failed template
  std::shared_ptr<const jinja::Template> jinja;           // the model's template, parsed; null: none
  std::string bos_token, eos_token;                       // the vocabulary's texts, given to the template
  ToolCallSyntax tool_calls = ToolCallSyntax::none;       // the template's (detect_tool_call_syntax); none without one

  ChatFormat() = default;
  ChatFormat(ChatTemplateFamily f) : family(f) {}  // NOLINT(google-explicit-constructor): a family is a format
};

// What renders a model's chats, for a label: "Jinja template, chatml stops"
// when its own template runs, else the family's name.
std::string chat_format_name(const ChatFormat& format);

struct RenderedChat {
  std::string text;
  bool from_template = false;  // the model's template rendered it
  std::string fallback;        // why the family rendered instead of a template the model has (its error)
};

// The conversation as the model's template renders it (messages, each with
// role and content, an assistant's tool_calls and a tool's tool_call_id and
// name where given; add_generation_prompt; bos_token; eos_token; tools when
// tools is not empty: a JSON array of OpenAI's function descriptions), else
// as the family does. A template that fails (raise_exception, a limit, a
// feature outside the interpreter) falls back to the family, saying why.
// A call's arguments go to the template as an object where they are a JSON
// object's text (as transformers hands them over), else as written.
RenderedChat render_chat(const ChatFormat& format, const std::vector<ChatMessage>& messages,
                         bool add_generation_prompt = true, const std::string& tools = "");

}  // namespace phaselab
