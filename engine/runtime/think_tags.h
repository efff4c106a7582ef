// Reasoning between <think> and </think> (Qwen3, DeepSeek-R1 and its
// distills, SmolLM3 and others): where the vocabulary has both as tokens of
// their own, the text a reply writes between them is its reasoning, not its
// answer. ThinkTags routes each generated token's text the way
// HarmonyChannels does for gpt-oss, so that the window, the saved
// conversation and the server (reasoning_content) keep the two apart.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "harmony_channels.h"
#include "phaselab/tokenizer.h"

namespace phaselab {

class ThinkTags {
 public:
  using Route = HarmonyChannels::Route;  // answer, reasoning

  // The vocabulary's tags; nullopt when it lacks either (its text is all answer).
  static std::optional<ThinkTags> of(const Tokenizer& tok) {
    const auto open = tok.find_token("<think>"), close = tok.find_token("</think>");
    if (!open || !close) return std::nullopt;
    ThinkTags t;
    t.open_id_ = *open, t.close_id_ = *close;
    return t;
  }

  // Where the reply starts, from its prompt: inside a block when the prompt
  // opened one it did not close (a generation prompt ending "<think>\n", as
  // DeepSeek-R1's does), else in the answer (Qwen3's "<think>\n\n</think>"
  // with thinking off closes it).
  void begin(const std::vector<TokenId>& prompt) {
    thinking_ = false;
    for (TokenId id : prompt) {
      if (id == open_id_) thinking_ = true;
      if (id == close_id_) thinking_ = false;
    }
    trim_ = thinking_;
  }

  // Token id released piece (its text, possibly empty). The tags themselves
  // are neither answer nor reasoning, and the blank lines a model writes
  // after each (the reasoning's first, the answer's first) are dropped.
  Route push(TokenId id, std::string_view piece) {
    if (id == open_id_ || id == close_id_) {
      thinking_ = id == open_id_;
      trim_ = true;
      return {};
    }
    if (trim_) {
      const size_t i = piece.find_first_not_of(" \t\r\n");
      if (i == std::string_view::npos) return {};
      piece.remove_prefix(i);
      trim_ = false;
    }
    if (thinking_) return {{}, piece};
    return {piece, {}};
  }

 private:
  TokenId open_id_ = -1, close_id_ = -1;
  bool thinking_ = false;
  bool trim_ = false;  // at a block's or the answer's start: whitespace is not text yet
};

}  // namespace phaselab
