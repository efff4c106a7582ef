#include "phaselab/session.h"

#include "phaselab/memory.h"

#include <algorithm>
#include <chrono>

#include "phaselab/speculative.h"
#include "answer_builder.h"

namespace phaselab {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

void RequestMetrics::update_rates(double t_first_ms, double t_last_ms) {
  decode_ms = t_last_ms - t_first_ms;
  decode_tps = tpot_ms = 0;
  if (n_generated > 1 && decode_ms > 0) {
    decode_tps = (n_generated - 1) / (decode_ms / 1000.0);
    tpot_ms = decode_ms / (n_generated - 1);
  }
  spec_acceptance = spec_drafted > 0 ? static_cast<double>(spec_accepted) / spec_drafted : 0;
  tokens_per_pass = target_passes > 0 ? static_cast<double>(n_generated - 1) / target_passes : 0;
}

Result<std::unique_ptr<Session>> Session::create(std::shared_ptr<const Model> model, std::unique_ptr<Backend> backend,
                                                 int n_ctx, KvType kv_type, bool chat) {
  if (!model || !backend) return invalid_argument("a session needs a model and a backend");
  if (n_ctx <= 0) n_ctx = std::min(model->config().n_ctx_train, 4096);
  if (n_ctx > model->config().n_ctx_train)
    return invalid_argument("context size " + std::to_string(n_ctx) + " exceeds the " +
                            std::to_string(model->config().n_ctx_train) + " tokens the model was trained for");
  // Too little memory is refused here, with the numbers, before the KV cache
  // is allocated (Linux would "allocate" it and kill the process later).
  {
    const ModelConfig& c = model->config();
    MemoryNeed need;
    need.weights = model->weight_bytes();
    need.kv = KvCache::bytes_for(c, n_ctx, kv_type, backend->max_batch(), backend->kv_storage(), chat);
    need.work = static_cast<uint64_t>(backend->max_batch()) *
                (static_cast<uint64_t>(c.n_vocab) + 4ull * c.n_ff + 8ull * c.n_embd) * sizeof(float);
    if (Status st = check_memory(need, available_memory_bytes()); !st) return st;
  }
  auto kv = KvCache::create(model->config(), n_ctx, kv_type, backend->max_batch(), backend->kv_storage(), chat);
  if (!kv) return kv.status();
  std::unique_ptr<Session> s(new Session());
  s->model_ = std::move(model);
  s->backend_ = std::move(backend);
  s->kv_ = std::move(*kv);
  s->logits_.resize(s->model_->config().n_vocab);
  return s;
}

Status Session::prefill(const int32_t* tokens, int n, bool want_logits) {
  const int B = backend_->max_batch();
  for (int i = 0; i < n; i += B) {
    const int m = std::min(B, n - i);
    const bool last = i + m == n;
    PHASELAB_TRY(backend_->forward(tokens + i, m, *kv_, logits_.data(),
                                   last && want_logits ? LogitsMode::last : LogitsMode::none));
  }
  return Status::ok();
}

int Session::reusable_prefix(const std::vector<int32_t>& prompt, const GenerateOptions& opt) const {
  if (!opt.use_kv_cache || !opt.prefix_cache || prompt.empty()) return 0;
  return kv_->reusable_prefix(prompt.data(), static_cast<int>(prompt.size()) - 1);
}

Status Session::eval(const std::vector<int32_t>& tokens, std::vector<float>* logits_last) {
  if (tokens.empty()) return invalid_argument("nothing to evaluate");
  PHASELAB_TRY(prefill(tokens.data(), static_cast<int>(tokens.size()), true));
  if (logits_last) *logits_last = logits_;
  return Status::ok();
}

Result<GenerateResult> Session::generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                         const TokenCallback& on_token, const std::atomic<bool>* cancel) {
  const auto t0 = Clock::now();
  if (prompt.empty()) return invalid_argument("the prompt is empty (nothing to continue from)");
  if (opt.n_predict < 1) return invalid_argument("the token limit must be at least 1");
  PHASELAB_TRY(opt.sampling.validate(model_->config().n_vocab));
  if (opt.logprobs < -1 || opt.logprobs > kMaxTopLogprobs)
    return invalid_argument("logprobs must be -1 (none) or from 0 to " + std::to_string(kMaxTopLogprobs) +
                            " alternatives (got " + std::to_string(opt.logprobs) + ")");
  // Verification picks tokens from rows of a multi-token pass; their
  // log-probabilities are not wired through it.
  if (opt.logprobs >= 0 && opt.draft && opt.use_kv_cache)
    return invalid_argument("logprobs are not computed with speculative decoding: turn the draft off");
  const int n_prompt = static_cast<int>(prompt.size());
  if (n_prompt >= n_ctx())
    return Status(StatusCode::context_full, "the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                                                std::to_string(n_ctx()) + ": shorten it or raise the context size");
  const Tokenizer& tok = model_->tokenizer();

  GenerateResult res;
  RequestMetrics& m = res.metrics;
  m.n_prompt = n_prompt;
  m.kv_capacity = static_cast<uint64_t>(n_ctx());

  // Reuse the longest common prefix of the cache (at least one token is
  // always computed, to get logits).
  int reuse = 0;
  if (opt.use_kv_cache && opt.prefix_cache) {
    kv_->set_prefix_cache(true);
    reuse = kv_->reuse_prefix(prompt.data(), n_prompt - 1);
  } else {
    kv_->set_prefix_cache(opt.prefix_cache);
    kv_->truncate(0);
  }
  m.n_reused = reuse;
  PHASELAB_TRY(prefill(prompt.data() + reuse, n_prompt - reuse, true));
  // The next turn (or regenerate) starts again about here.
  if (opt.use_kv_cache) kv_->pin_window();

  Sampler sampler(opt.sampling, model_->config().n_vocab);
  std::vector<int32_t> history;
  history.reserve(static_cast<size_t>(n_prompt + opt.n_predict));
  history.assign(prompt.begin(), prompt.end());
  res.tokens.reserve(opt.n_predict);
  AnswerBuilder answer(tok, opt, res, history, n_ctx());
  const int n_vocab = model_->config().n_vocab;
  // Log-probabilities come from the logits before the sampler changes them
  // in place (bias, penalties): a copy of the row, allocated once here.
  const bool want_logprobs = opt.logprobs >= 0;
  std::vector<float> raw_row(want_logprobs ? n_vocab : 0);  // (n_vocab)
  TokenLogprob logprob;
  if (want_logprobs) {
    res.logprobs.reserve(opt.n_predict);
    logprob.top.reserve(static_cast<size_t>(opt.logprobs));
  }
  // Appends one chosen token to the answer; true when generation must stop.
  auto emit = [&](int32_t id) -> bool {
    if (answer.push(id, ms_since(t0), n_prompt - reuse, static_cast<uint64_t>(kv_->n_past()), on_token,
                    want_logprobs ? &logprob : nullptr))
      return true;
    if (cancel && cancel->load(std::memory_order_relaxed)) {
      m.stop_reason = "cancelled";
      return true;
    }
    return false;
  };

  DraftSource* draft = opt.use_kv_cache ? opt.draft : nullptr;
  // Plain greedy decoding (no penalties, which need the logits) on a backend
  // that can pick the argmax itself.
  const SamplingParams& sp = opt.sampling;
  const bool device_greedy = backend_->has_device_greedy() && sp.plain_greedy() && !want_logprobs;
  int32_t forced = -1;  // a token already chosen by verification
  for (;;) {
    if (want_logprobs) std::copy_n(logits_.data(), n_vocab, raw_row.data());
    const int32_t id = forced >= 0 ? forced : sampler.sample(logits_.data(), history);
    if (want_logprobs) token_logprobs(raw_row.data(), n_vocab, id, opt.logprobs, &logprob);
    forced = -1;
    if (emit(id)) break;

    if (!opt.use_kv_cache) {
      kv_->clear();  // recompute everything: slow on purpose
      PHASELAB_TRY(prefill(history.data(), static_cast<int>(history.size()), true));
      continue;
    }
    // How many tokens a verification may add: the answer's and the context's room.
    const int room = std::min(opt.n_predict - m.n_generated, n_ctx() - static_cast<int>(history.size()) - 1);
    if (draft && room > 0) PHASELAB_TRY(draft->propose(history, std::min(opt.spec_k, room), opt.sampling, &draft_));
    if (!draft || room <= 0 || draft_.tokens.empty()) {
      if (device_greedy) {
        // The next token is chosen where the logits are (one int comes back).
        const SeqChunk chunk{kv_.get(), &id, 1, LogitsMode::last, logits_.data(), &forced};
        PHASELAB_TRY(backend_->forward_batch(&chunk, 1));
      } else {
        PHASELAB_TRY(backend_->forward(&id, 1, *kv_, logits_.data(), LogitsMode::last));
      }
      m.target_passes++;
      continue;
    }
    // Verify: [id, d1..dk] in one pass; logits row j predicts the token after
    // the j-th of them.
    const int k = static_cast<int>(draft_.tokens.size());
    const int base = kv_->n_past();
    verify_.assign(1, id);
    verify_.insert(verify_.end(), draft_.tokens.begin(), draft_.tokens.end());
    spec_logits_.resize(static_cast<size_t>(k + 1) * n_vocab);
    PHASELAB_TRY(backend_->forward(verify_.data(), k + 1, *kv_, spec_logits_.data(), LogitsMode::all));
    m.target_passes++;
    m.spec_drafted += k;
    int accepted = 0;
    bool stop = false;
    for (int j = 0; j < k; j++) {
      float* lj = spec_logits_.data() + static_cast<size_t>(j) * n_vocab;
      const int32_t d = draft_.tokens[j];
      int32_t replacement;
      if (opt.sampling.greedy()) {
        const int32_t pick = sampler.sample(lj, history);
        replacement = pick == d ? -1 : pick;
      } else {
        sampler.distribution(lj, history, &p_dist_);
        replacement = speculative_accept_or_resample(p_dist_, j < static_cast<int>(draft_.probs.size()) ? draft_.probs[j] : TokenDist{},
                                                     d, sampler, &resid_dist_);
      }
      if (replacement >= 0) {
        forced = replacement;
        break;
      }
      accepted++;
      m.spec_accepted++;
      if (emit(d)) {
        stop = true;
        break;
      }
    }
    // Keep id and the accepted drafts in the cache; drop the rest.
    kv_->truncate(base + 1 + accepted);
    if (stop) break;
    if (forced < 0) {
      // Every draft was accepted: the last row predicts the next token.
      std::copy_n(spec_logits_.data() + static_cast<size_t>(k) * n_vocab, n_vocab, logits_.data());
    }
  }
  answer.finish();
  m.kv_used = static_cast<uint64_t>(kv_->n_past());
  const KvPool& pool = kv_->pool();
  m.kv_blocks_total = pool.n_blocks();
  m.kv_blocks_used = pool.n_used();
  m.kv_blocks_cached = pool.n_cached();
  m.kv_blocks_shared = pool.n_shared();
  return res;
}

}  // namespace phaselab
