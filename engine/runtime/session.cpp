#include "phaselab/session.h"

#include <algorithm>

#include "engine_loop.h"
#include "request_rules.h"

namespace phaselab {

const char* to_string(StopReason r) {
  switch (r) {
    case StopReason::running: return "";
    case StopReason::eos: return "eos";
    case StopReason::stop_string: return "stop_string";
    case StopReason::length: return "length";
    case StopReason::context_full: return "context_full";
    case StopReason::cancelled: return "cancelled";
    case StopReason::kv_full: return "kv_full";
    case StopReason::remote_stop: return "stop";
    case StopReason::unknown: return "unknown";
  }
  return "unknown";
}

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
  auto ctx = resolve_context(model->config(), n_ctx);
  if (!ctx) return ctx.status();
  n_ctx = *ctx;
  // Too little memory is refused here, with the numbers, before the KV cache
  // is allocated (Linux would "allocate" it and kill the process later).
  const ModelConfig& c = model->config();
  PHASELAB_TRY(check_engine_memory(
      *model, *backend, KvCache::bytes_for(c, n_ctx, kv_type, backend->max_batch(), backend->kv_storage(), chat), 1));
  auto kv = KvCache::create(c, n_ctx, kv_type, backend->max_batch(), backend->kv_storage(), chat);
  if (!kv) return kv.status();
  std::unique_ptr<Session> s(new Session());
  s->model_ = std::move(model);
  s->backend_ = std::move(backend);
  s->kv_ = std::move(*kv);
  s->eval_logits_.resize(c.n_vocab);
  LoopOptions lo;
  lo.n_ctx = n_ctx;
  lo.max_seqs = 1;
  lo.token_budget = s->backend_->max_batch();  // prompts in passes of max_batch tokens
  s->loop_ = std::make_unique<EngineLoop>(*s->backend_, *s->model_, nullptr, lo);
  return s;
}

Session::~Session() = default;

int Session::reusable_prefix(const std::vector<int32_t>& prompt, const GenerateOptions& opt) const {
  if (!opt.use_kv_cache || !opt.prefix_cache || prompt.empty()) return 0;
  return kv_->reusable_prefix(prompt.data(), static_cast<int>(prompt.size()) - 1);
}

// Not generation: the logits of the last token after appending tokens, in
// passes of max_batch tokens (tests, perplexity-style callers).
Status Session::eval(const std::vector<int32_t>& tokens, std::vector<float>* logits_last) {
  if (tokens.empty()) return invalid_argument("nothing to evaluate");
  const int n = static_cast<int>(tokens.size()), B = backend_->max_batch();
  for (int i = 0; i < n; i += B) {
    const int m = std::min(B, n - i);
    PHASELAB_TRY(backend_->forward(tokens.data() + i, m, *kv_, eval_logits_.data(),
                                   i + m == n ? LogitsMode::last : LogitsMode::none));
  }
  if (logits_last) *logits_last = eval_logits_;
  return Status::ok();
}

Result<GenerateResult> Session::generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                         const TokenCallback& on_token, const std::atomic<bool>* cancel) {
  PHASELAB_TRY(validate_request(model_->config(), n_ctx(), prompt, opt));
  auto seq = std::make_unique<Sequence>(next_id_++, prompt, opt, on_token, *model_, n_ctx());
  seq->kv = kv_.get();      // the chat's cache: the common prefix of the last request is reused
  seq->keep_window = true;  // and the window at the prompt's end kept for the next turn
  seq->stop = cancel;
  seq->draw_dists = opt.draw_dists;
  loop_->add(std::move(seq));
  while (!loop_->idle()) {
    if (Status st = loop_->step(); !st) {
      loop_->drop_all();
      return st;
    }
  }
  auto done = loop_->take_finished();
  if (done.size() != 1) return internal_error("the session's loop finished " + std::to_string(done.size()) + " requests");
  if (!done[0].status) return done[0].status;
  return std::move(done[0].seq->res);
}

}  // namespace phaselab
