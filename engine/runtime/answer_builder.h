// The answer of one request as its tokens arrive, shared by Session and the
// batch Scheduler: the text (stop strings held back, never streamed), the
// metrics (TTFT, prefill rate, the current rates on every TokenEvent) and the
// stop conditions (end of generation, stop string, token limit, full context).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "phaselab/session.h"
#include "phaselab/tokenizer.h"
#include "harmony_channels.h"
#include "stop_matcher.h"
#include "think_tags.h"

namespace phaselab {

class AnswerBuilder {
 public:
  // res receives the tokens, text and metrics; history (the sequence so far,
  // prompt included) receives every token too; n_ctx bounds its length.
  AnswerBuilder(const Tokenizer& tok, const GenerateOptions& opt, GenerateResult& res, std::vector<int32_t>& history,
                int n_ctx)
      : tok_(tok), opt_(opt), res_(res), history_(history), n_ctx_(n_ctx), detok_(tok), stops_(opt.stop),
        harmony_(HarmonyChannels::of(tok)) {
    if (harmony_) harmony_->begin(history_, tok_);
    if (!harmony_ && opt.think_is_reasoning) think_ = ThinkTags::of(tok);
    if (think_) think_->begin(history_, tok_);
  }

  // Appends the token sampled t_ms after submission. n_prefilled: the prompt
  // tokens computed before the first token (its prefill rate); kv_used: the
  // positions in the cache now; logprob: the token's log-probabilities when
  // the request asked for them, else null. True when the request is done
  // (stop_reason set).
  bool push(int32_t id, double t_ms, int n_prefilled, uint64_t kv_used, const TokenCallback& on_token,
            const TokenLogprob* logprob = nullptr) {
    RequestMetrics& m = res_.metrics;
    const int i = m.n_generated;
    if (i == 0) {
      t_first_ = t_ms;
      m.ttft_ms = t_ms;
      m.prefill_ms = t_ms;
      m.prefill_tps = n_prefilled / std::max(t_ms / 1000.0, 1e-9);
    }
    t_last_ = t_ms;
    res_.tokens.push_back(id);
    res_.token_ms.push_back(t_ms);
    if (logprob) res_.logprobs.push_back(*logprob);
    history_.push_back(id);
    m.n_generated = i + 1;
    m.kv_used = kv_used;
    if (tok_.is_eog(id) && !opt_.ignore_eos) {
      m.stop_reason = StopReason::eos;
      // Text held back as the possible start of a stop string is the
      // answer's after all, and a harmony call that <|call|> ends goes out
      // now (in an event of this token, without its log-probability: the
      // end token is not among an answer's logprobs).
      shown_ = stops_.flush();
      if (harmony_) shown_ += harmony_->end();
      if (!shown_.empty()) {
        res_.text += shown_;
        if (on_token) {
          m.update_rates(t_first_, t_ms);
          on_token(TokenEvent{id, shown_, i, t_ms, &m, nullptr, {}});
        }
      }
      return true;
    }
    piece_ = detok_.push(id);
    // A harmony reply (gpt-oss): only its final channel is the answer; the
    // others are reasoning. A reply with <think> tags (Qwen3, DeepSeek-R1):
    // the text between them is reasoning. Reasoning is outside the stop
    // strings and the answer's text.
    std::string_view answer = piece_, reasoning;
    if (harmony_ || think_) {
      const HarmonyChannels::Route r = harmony_ ? harmony_->push(id, piece_) : think_->push(id, piece_);
      answer = r.answer;
      reasoning = r.reasoning;
      res_.reasoning += reasoning;
    }
    shown_.clear();
    if (stops_.push(answer, &shown_))
      m.stop_reason = StopReason::stop_string;
    else if (m.n_generated >= opt_.n_predict)
      m.stop_reason = StopReason::length;
    else if (static_cast<int>(history_.size()) >= n_ctx_)
      m.stop_reason = StopReason::context_full;
    // Text held back as the possible start of a stop string is the answer's
    // after all when the answer ends otherwise; a harmony call cut off
    // stays text (HarmonyChannels::end(false)).
    if (m.stop_reason != StopReason::running && m.stop_reason != StopReason::stop_string) shown_ += stops_.flush();
    if (m.stop_reason != StopReason::running && harmony_) shown_ += harmony_->end(false);
    res_.text += shown_;
    if (on_token) {
      m.update_rates(t_first_, t_ms);
      on_token(TokenEvent{id, shown_, i, t_ms, &m, logprob, reasoning});
    }
    return m.stop_reason != StopReason::running;
  }

  // The final rates, whatever ended the request.
  void finish() { res_.metrics.update_rates(t_first_, t_last_); }

 private:
  const Tokenizer& tok_;
  const GenerateOptions& opt_;
  GenerateResult& res_;
  std::vector<int32_t>& history_;
  int n_ctx_;
  IncrementalDetokenizer detok_;
  StopMatcher stops_;
  std::optional<HarmonyChannels> harmony_;
  std::optional<ThinkTags> think_;  // only without harmony's markers, and for a chat reply
  std::string piece_, shown_;
  double t_first_ = 0, t_last_ = 0;
};

}  // namespace phaselab
