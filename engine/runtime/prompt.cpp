#include "phaselab/prompt.h"

namespace phaselab {

PromptInput PromptInput::chat_of(std::vector<ChatMessage> messages, std::string system) {
  PromptInput in;
  in.chat = true;
  in.messages = std::move(messages);
  in.system = std::move(system);
  return in;
}

PromptInput PromptInput::text_of(std::string text) {
  PromptInput in;
  in.chat = false;
  in.text = std::move(text);
  return in;
}

std::vector<ChatMessage> PromptInput::conversation() const {
  std::vector<ChatMessage> out;
  out.reserve(messages.size() + 1);
  if (!system.empty()) out.push_back({"system", system});
  out.insert(out.end(), messages.begin(), messages.end());
  return out;
}

std::optional<RenderedPrompt> render_prompt(const Tokenizer& tok, ChatTemplateFamily family, const PromptInput& in,
                                            const std::function<bool(size_t text_bytes)>& fits) {
  RenderedPrompt out;
  if (!in.chat) {
    // The person's text is plain text: markers such as <start_of_turn> in it
    // are not special tokens (parse_special = false), and no template ends it.
    if (fits && !fits(in.text.size())) return std::nullopt;
    out.tokens = tok.encode(in.text, true, false);
    return out;
  }
  // A rendered chat holds the template's markers as text: parse_special = true.
  const std::string rendered =
      apply_chat_template(family, in.system.empty() ? in.messages : in.conversation());
  if (fits && !fits(rendered.size())) return std::nullopt;
  out.tokens = tok.encode(rendered, true, true);
  out.stop = chat_stop_strings(family);
  return out;
}

RenderedPrompt render_prompt(const Tokenizer& tok, ChatTemplateFamily family, const PromptInput& in) {
  return *render_prompt(tok, family, in, {});
}

}  // namespace phaselab
