// The harmony format's channels (gpt-oss): a reply is a series of messages,
// each "<|channel|>NAME<|message|>TEXT<|end|>", the last ended by <|return|>
// or <|call|>, later ones opened by "<|start|>ROLE". The "final" channel is
// the answer; "analysis" (the reasoning) and "commentary" (tool preambles)
// are not. HarmonyChannels routes each generated token's text by the channel
// it is in, so that the answer the window shows and the server returns is
// the final channel's text alone, the rest kept apart as reasoning.
//
// A message addressed to a function ("<|start|>assistant to=functions.NAME
// <|channel|>commentary json<|message|>ARGS<|call|>", the recipient in the
// header or after the channel's name) is a call: it becomes answer text in
// the one syntax the front ends parse (ToolCallSyntax::hermes), "<tool_call>
// {"name": NAME, "arguments": ARGS}</tool_call>", given out whole when the
// message ends (end(): its <|call|> ends the reply).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "phaselab/json_bounded.h"
#include "phaselab/tokenizer.h"

namespace phaselab {

class HarmonyChannels {
 public:
  // The vocabulary's harmony markers; nullopt when it has none (every other
  // model: its text is all answer).
  static std::optional<HarmonyChannels> of(const Tokenizer& tok) {
    const auto start = tok.find_token("<|start|>"), channel = tok.find_token("<|channel|>"),
               message = tok.find_token("<|message|>"), end = tok.find_token("<|end|>");
    if (!start || !channel || !message || !end) return std::nullopt;
    HarmonyChannels h;
    h.start_id_ = *start, h.channel_id_ = *channel, h.message_id_ = *message, h.end_id_ = *end;
    h.constrain_id_ = tok.find_token("<|constrain|>").value_or(-1);
    return h;
  }

  struct Route {
    std::string_view answer;     // text of the final channel (or of a message without a channel)
    std::string_view reasoning;  // text of any other channel
  };

  // Where the reply starts, from its prompt: after a chat's generation
  // prompt ("...<|start|>assistant") in a message's header; after a prompt
  // that opened a message ("<|channel|>final<|message|>") in that channel;
  // after text without markers (a raw prompt, a notebook) in a message
  // without a channel, which is answer.
  void begin(const std::vector<TokenId>& prompt, const Tokenizer& tok) {
    state_ = State::content;
    channel_.clear();
    header_.clear();
    in_call_ = false;
    for (TokenId id : prompt) {
      if (is_marker(id)) (void)push(id, {});
      else if (state_ == State::channel_name) channel_ += tok.token_to_piece(id);
    }
  }

  // Token id released piece (its text, possibly empty).
  Route push(TokenId id, std::string_view piece) {
    if (id == start_id_ || id == end_id_) {
      const std::string_view call = end();  // (a call closed by <|end|>)
      state_ = State::header;
      channel_.clear();
      header_.clear();
      return {call, {}};
    }
    if (id == channel_id_) {
      state_ = State::channel_name;
      channel_.clear();
      return {};
    }
    if (id == constrain_id_) {
      state_ = State::header;
      return {};
    }
    if (id == message_id_) {
      state_ = State::content;
      call_name_ = recipient_function(header_ + " " + channel_);
      in_call_ = !call_name_.empty();
      call_args_.clear();
      return {};
    }
    switch (state_) {
      case State::header: header_ += piece; return {};  // the role's name, a recipient, a content type
      case State::channel_name: channel_ += piece; return {};
      case State::content: break;
    }
    if (in_call_) {
      call_args_ += piece;
      return {};
    }
    if (channel_.empty() || channel_ == "final") return {piece, {}};
    return {{}, piece};
  }

  // The call being written, as answer text, when the reply ends in it (or
  // its message ends); "" when none. Valid until the next push or end.
  // complete false (the reply was cut off in it: max_tokens, the context, a
  // stop string): the block's start and the arguments as far as they came,
  // unclosed, so that they stay text rather than becoming a call.
  std::string_view end(bool complete = true) {
    if (!in_call_) return {};
    in_call_ = false;
    using ojson = nlohmann::ordered_json;
    const auto json_text = [](const ojson& j) {
      // '<' escaped (JSON allows it anywhere it occurs, inside strings), so
      // that no "</tool_call>" in the arguments can end the block early.
      std::string out;
      for (char c : j.dump(-1, ' ', false, ojson::error_handler_t::replace)) out += c == '<' ? std::string("\\u003c") : std::string(1, c);
      return out;
    };
    if (!complete) {
      call_text_ = "<tool_call>{\"name\":" + json_text(call_name_) + ",\"arguments\":" + call_args_;
      return call_text_;
    }
    ojson args = parse_json_bounded<ojson>(call_args_);
    if (!args.is_object()) args = call_args_;  // not JSON: the text as written, a string
    call_text_ = "<tool_call>" + json_text(ojson{{"name", call_name_}, {"arguments", args}}) + "</tool_call>";
    return call_text_;
  }

 private:
  // NAME of a "to=functions.NAME" in a message's header ("" when the
  // message is not a call).
  static std::string recipient_function(const std::string& header) {
    constexpr std::string_view kTo = "to=functions.";
    const size_t at = header.find(kTo);
    if (at == std::string::npos) return {};
    size_t end = at + kTo.size();
    while (end < header.size() && header[end] != ' ' && header[end] != '<' && header[end] != '\n') end++;
    return header.substr(at + kTo.size(), end - at - kTo.size());
  }

  bool is_marker(TokenId id) const {
    return id == start_id_ || id == end_id_ || id == channel_id_ || id == message_id_ || id == constrain_id_;
  }

  enum class State { header, channel_name, content };
  TokenId start_id_ = -1, channel_id_ = -1, message_id_ = -1, end_id_ = -1, constrain_id_ = -1;
  State state_ = State::header;
  std::string channel_;  // the current message's channel name
  std::string header_;   // the current message's header text (role, recipient, content type)
  bool in_call_ = false;  // the current message is a call to call_name_
  std::string call_name_, call_args_, call_text_;
};

}  // namespace phaselab
