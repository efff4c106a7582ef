// Session: one sequence on one backend. generate() runs a request end to end:
// reuse of the cached prefix, prefill in batches, decode with sampling, stop
// conditions, streaming text deltas, and the per-request metrics.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "phaselab/backend.h"
#include "phaselab/model.h"
#include "phaselab/sampler.h"
#include "phaselab/speculative.h"
#include "phaselab/status.h"

namespace phaselab {

// The most tokens a draft proposes per target pass (--spec-k's limit).
inline constexpr int kMaxSpecK = 32;

struct GenerateOptions {
  int n_predict = 256;             // token limit of the answer
  SamplingParams sampling;
  std::vector<std::string> stop;   // stop strings (not included in the text)
  bool use_kv_cache = true;        // false: recompute the whole sequence every step
  bool ignore_eos = false;         // benchmarks: run to n_predict
  bool prefix_cache = true;        // reuse cached blocks of earlier requests (else prefill everything)
  DraftSource* draft = nullptr;    // speculative decoding (needs the KV cache); null: off
  int spec_k = 4;                  // tokens drafted per target pass (the CLI's --spec-k: at most kMaxSpecK)
  // A chat reply's <think> block (Qwen3, DeepSeek-R1) is its reasoning
  // (GenerateResult::reasoning), not its text. false: the <think> block
  // stays in the text, tags included (raw completions, a notebook). A
  // harmony reply (gpt-oss) is split by its channels either way.
  bool think_is_reasoning = true;
  // Log-probabilities of the generated tokens (GenerateResult::logprobs,
  // TokenEvent::logprob): -1 none; 0..kMaxTopLogprobs the chosen token's and
  // that many most likely alternatives'. Not with a draft (speculative decoding).
  int logprobs = -1;
  // Drafting for speculative decoding (a draft model's Session): each token is
  // drawn from the distribution the sampler builds, which is appended here
  // (empty for greedy: one-hot on the token).
  std::vector<TokenDist>* draw_dists = nullptr;
};

// Definitions as in docs/architecture.md: TTFT = request submitted -> first
// token ready; decode tokens/s = (generated - 1) / (t_last - t_first);
// TPOT = its inverse; prefill tokens/s = tokens prefilled / prefill time.
// Why a request ended (running while it has not).
enum class StopReason {
  running,
  eos,           // an end-of-generation token
  stop_string,   // a stop string (not part of the text)
  length,        // the token limit
  context_full,  // no room left in the context
  cancelled,     // the caller cancelled it
  kv_full,       // the KV pool cannot hold the sequence (a Scheduler's)
  remote_stop,   // a remote endpoint's "stop" (end of generation or a stop string: it does not say which)
  unknown,       // a remote endpoint gave no reason
};
// "eos", "stop_string", "length", "context_full", "cancelled", "kv_full",
// "stop", "unknown"; "" while running.
const char* to_string(StopReason r);

struct RequestMetrics {
  int n_prompt = 0;      // prompt tokens
  int n_reused = 0;      // of which came from the cache (common prefix)
  int n_generated = 0;   // tokens sampled, the stop token included
  double ttft_ms = 0;
  double prefill_ms = 0;
  double prefill_tps = 0;
  double decode_ms = 0;  // first token -> last token
  double decode_tps = 0;
  double tpot_ms = 0;
  uint64_t kv_used = 0, kv_capacity = 0;  // positions
  // Paged KV pool after the request: blocks referenced by a sequence, kept
  // for reuse, shared by more than one reference, and in all.
  int kv_blocks_used = 0, kv_blocks_cached = 0, kv_blocks_shared = 0, kv_blocks_total = 0;
  // Speculative decoding: tokens drafted and accepted, target forward passes
  // during decode, and generated tokens per pass (1 without speculation).
  int spec_drafted = 0, spec_accepted = 0, target_passes = 0;
  double spec_acceptance = 0, tokens_per_pass = 0;
  // Sampled tokens whose passes over the vocabulary ran on the device
  // (Backend::has_device_sampling), and of those, the ones whose logits row
  // had to be fetched after all (too many candidates).
  int device_draws = 0, device_draw_fetches = 0;
  StopReason stop_reason = StopReason::running;

  // The rates from the counters and the times of the first and the latest
  // token (ms since submission): decode_ms, decode_tps, tpot_ms,
  // spec_acceptance, tokens_per_pass. The engine keeps them current for every
  // TokenEvent, so front ends display them and never compute their own.
  void update_rates(double t_first_ms, double t_last_ms);
};

struct TokenEvent {
  int32_t id;
  std::string_view text;  // the complete-UTF-8 text this token released (may be empty)
  int index;              // 0 for the first generated token
  double t_ms;            // since the request was submitted
  const RequestMetrics* metrics = nullptr;  // the request's metrics so far (rates current, see update_rates)
  const TokenLogprob* logprob = nullptr;    // when GenerateOptions::logprobs >= 0; valid during the callback only
  // Reasoning this token released (a harmony model's analysis channel, a
  // chat reply's <think> block), not part of text; empty for other models.
  std::string_view reasoning;
};
using TokenCallback = std::function<void(const TokenEvent&)>;

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (the stop token included)
  std::string text;             // generated text (stop string excluded)
  std::string reasoning;        // gpt-oss's text outside its final channel, a chat reply's <think> block; else empty
  RequestMetrics metrics;
  std::vector<TokenLogprob> logprobs;  // one per token of tokens when GenerateOptions::logprobs >= 0, else empty
  // When each token of tokens was chosen, in ms since the request was
  // submitted: token_ms[0] is the TTFT, the differences are the inter-token
  // gaps (ITL) the serving statistics are made of.
  std::vector<double> token_ms;
};

class EngineLoop;

// A batch of one on the engine loop (engine/runtime/engine_loop.h), its chat
// cache kept between requests.
class Session {
 public:
  // n_ctx <= 0 takes the model's trained context, capped at 4096. K/V are
  // stored as kv_type (F16 by default, as llama.cpp's cache). chat: the
  // cache keeps room for the window at each prompt's end (KvCache's
  // turn_window), so that a chat's next turn or a regenerate after an answer
  // longer than a sliding window reuses the prompt (Gemma 3 270M: 7.8 MiB at
  // F16); one-shot uses (bench, perplexity, a single generate) pass false.
  static Result<std::unique_ptr<Session>> create(std::shared_ptr<const Model> model, std::unique_ptr<Backend> backend,
                                                 int n_ctx, KvType kv_type = KvType::f16, bool chat = true);

  // Runs one request. The prompt is the whole sequence (e.g. a rendered chat);
  // the part already in the cache is not computed again. cancel is read
  // between steps.
  Result<GenerateResult> generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                  const TokenCallback& on_token = {}, const std::atomic<bool>* cancel = nullptr);

  // How many prompt tokens generate() would take from the cache (for a
  // front end's "prefilling N tokens" before the request runs).
  int reusable_prefix(const std::vector<int32_t>& prompt, const GenerateOptions& opt) const;

  // Lower level, for tests and the benchmark: logits of the last token after
  // appending tokens to the cache.
  Status eval(const std::vector<int32_t>& tokens, std::vector<float>* logits_last);

  ~Session();

  const Model& model() const { return *model_; }
  const std::shared_ptr<const Model>& shared_model() const { return model_; }
  Backend& backend() { return *backend_; }
  KvCache& kv() { return *kv_; }
  // K/V memory wherever it lives: what the backend holds for the cache's pool
  // (host memory or its device's).
  uint64_t kv_bytes() const { return backend_->kv_bytes(kv_->pool()); }
  int n_ctx() const { return kv_->n_ctx(); }

 private:
  Session() = default;

  std::shared_ptr<const Model> model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<EngineLoop> loop_;
  std::vector<float> eval_logits_;  // (n_vocab) eval()'s, allocated once
  uint64_t next_id_ = 1;
};

}  // namespace phaselab
