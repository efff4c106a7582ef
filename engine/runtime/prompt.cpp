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

std::optional<RenderedPrompt> render_prompt(const Tokenizer& tok, const ChatFormat& format, const PromptInput& in,
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
  RenderedChat chat = render_chat(format, in.system.empty() ? in.messages : in.conversation(), true, in.tools);
  std::string_view text = chat.text;
  // Most templates write the BOS text themselves; the tokenizer adds the
  // token too: one of them goes, or the model would read two.
  const std::string& bos = format.bos_token;
  if (chat.from_template && tok.add_bos() && !bos.empty() && text.substr(0, bos.size()) == bos)
    text.remove_prefix(bos.size());
  if (fits && !fits(text.size())) return std::nullopt;
  out.tokens = tok.encode(text, true, true);
  out.stop = chat_stop_strings(format.family);
  out.from_template = chat.from_template;
  out.template_fallback = std::move(chat.fallback);
  return out;
}

RenderedPrompt render_prompt(const Tokenizer& tok, const ChatFormat& format, const PromptInput& in) {
  return *render_prompt(tok, format, in, {});
}

}  // namespace phaselab
