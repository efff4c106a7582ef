// Reasoning between <think> and </think> (Qwen3, DeepSeek-R1 and its
// distills, SmolLM3 and others): where the vocabulary has both as tokens of
// their own, the text a reply writes between them is its reasoning, not its
// answer. ThinkTags routes each generated token's text the way
// HarmonyChannels does for gpt-oss, so that the window, the saved
// conversation and the server (reasoning_content) keep the two apart.
#pragma once

#include <optional>
#include <string>
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
  // ends with an open tag (apart from whitespace: a generation prompt
  // ending "<think>\n", as DeepSeek-R1's does), else in the answer. A tag
  // earlier in the prompt (typed in a message, an earlier turn) does not count.
  void begin(const std::vector<TokenId>& prompt, const Tokenizer& tok) {
    thinking_ = said_ = paragraph_ = false;
    for (auto it = prompt.rbegin(); it != prompt.rend(); ++it) {
      if (*it == open_id_) thinking_ = true;
      if (*it == open_id_ || *it == close_id_) break;
      // A control token ("<|im_end|>") counts as text here: a tag before one was typed in a message.
      if (tok.token_to_piece(*it, true).find_first_not_of(" \t\r\n") != std::string::npos) break;
    }
    trim_ = thinking_;
    pending_.clear();
  }

  // Token id released piece (its text, possibly empty). The tags themselves
  // are neither answer nor reasoning; the whitespace a model writes after
  // each tag and before a closing one is dropped, and a block after
  // reasoning already written starts on a new paragraph. A closing tag with no block open
  // (a model that began reasoning without its tag) is the answer's text, as
  // written: what came before it was streamed as answer already.
  Route push(TokenId id, std::string_view piece) {
    if (id == open_id_) {
      thinking_ = trim_ = true;
      paragraph_ = said_;
      pending_.clear();
      return {};
    }
    if (id == close_id_ && thinking_) {
      thinking_ = false;
      trim_ = true;
      pending_.clear();  // the reasoning's trailing whitespace
      return {};
    }
    if (trim_) {
      const size_t i = piece.find_first_not_of(" \t\r\n");
      if (i == std::string_view::npos) return {};
      piece.remove_prefix(i);
      trim_ = false;
      if (thinking_ && paragraph_) pending_ = "\n\n";
      paragraph_ = false;
    }
    if (!thinking_) return {piece, {}};
    // Reasoning: whitespace at the piece's end waits for more text, so that
    // none is left before the block's closing tag.
    const size_t keep = piece.find_last_not_of(" \t\r\n");
    if (keep == std::string_view::npos) {
      pending_ += piece;
      return {};
    }
    out_ = pending_;
    out_ += piece.substr(0, keep + 1);
    pending_.assign(piece.substr(keep + 1));
    said_ = true;
    return {{}, out_};
  }

 private:
  TokenId open_id_ = -1, close_id_ = -1;
  bool thinking_ = false;
  bool said_ = false;       // this reply has written reasoning
  bool paragraph_ = false;  // the block being opened follows reasoning already written
  bool trim_ = false;       // at a block's or the answer's start: whitespace is not text yet
  std::string pending_;     // the reasoning's whitespace not released yet
  std::string out_;         // the text a Route points into
};

}  // namespace phaselab
