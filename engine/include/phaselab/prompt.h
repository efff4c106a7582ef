// A request's prompt, rendered the one way every front end needs it: a chat
// through the chat template (its special markers parsed, the template's stop
// strings added), or a text encoded as written (special markers in it stay
// text, no stop strings); the BOS token as the model's tokenizer specifies.
// phaselab-cli generate/chat, the GUI's engine worker, the OpenAI server (and
// so phaselab-cli batch, which reads its lines with the server's parser),
// bench and compare all call render_prompt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "phaselab/chat_template.h"
#include "phaselab/tokenizer.h"

namespace phaselab {

// What a front end asks for: a chat, or a text the model continues.
struct PromptInput {
  bool chat = true;
  std::vector<ChatMessage> messages;  // chat: the turns, oldest first (system turns allowed)
  std::string system;                 // chat: a system prompt put before the turns; empty: none
  std::string tools;                  // chat: the functions offered, a JSON array in OpenAI's shape; empty: none
  std::string text;                   // not chat: the text, as written

  static PromptInput chat_of(std::vector<ChatMessage> messages, std::string system = {});
  static PromptInput text_of(std::string text);
  // The chat as a server that applies its own template receives it: the
  // system prompt (when given), then the messages.
  std::vector<ChatMessage> conversation() const;
};

struct RenderedPrompt {
  std::vector<int32_t> tokens;    // what the model reads (BOS first where the tokenizer adds one)
  std::vector<std::string> stop;  // stop strings of the chat template; none for a text
  bool from_template = false;     // a chat rendered by the model's own template
  std::string template_fallback;  // why the model's template did not render it (its error), else ""
};

// Renders and encodes in. fits, when given, is shown the rendered text's
// length in bytes before it is encoded (a text too long for the context is
// refused without the cost of tokenizing it): false gives nullopt.
// A chat goes through format: the model's template when it has one (its
// BOS text at the start is dropped where the tokenizer adds the BOS token,
// so there is one), else the family.
std::optional<RenderedPrompt> render_prompt(const Tokenizer& tok, const ChatFormat& format, const PromptInput& in,
                                            const std::function<bool(size_t text_bytes)>& fits);
RenderedPrompt render_prompt(const Tokenizer& tok, const ChatFormat& format, const PromptInput& in);

}  // namespace phaselab
