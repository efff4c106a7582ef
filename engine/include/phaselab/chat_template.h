// Chat templates: PhaseLab recognises the family of a model's
// tokenizer.chat_template (a Jinja program we do not execute) and renders
// conversations with its own implementation of that family's format.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace phaselab {

// plain: a "User: / Assistant:" transcript. plain_fewshot: the same
// transcript after a short preamble with three example exchanges, for base
// (pre-trained) models: without examples a base model continues the
// transcript as any text ("Hello, my name is ..."), with them it answers.
enum class ChatTemplateFamily { plain, plain_fewshot, gemma, chatml, llama3, llama2 };

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

}  // namespace phaselab
