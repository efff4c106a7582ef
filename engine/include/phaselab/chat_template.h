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
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

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
// role and content; add_generation_prompt; bos_token; eos_token), else as
// the family does. A template that fails (raise_exception, a limit, a
// feature outside the interpreter) falls back to the family, saying why.
RenderedChat render_chat(const ChatFormat& format, const std::vector<ChatMessage>& messages,
                         bool add_generation_prompt = true);

}  // namespace phaselab
