// Speculative decoding: a DraftSource proposes k tokens, the target model
// verifies them in one forward pass.
//  - Greedy: a drafted token is kept while it equals what greedy decoding
//    would pick; the first mismatch is replaced by that pick. Because the
//    backends compute a batch bit for bit like single tokens, the output is
//    identical to plain greedy decoding.
//  - Sampling: the rejection scheme of Leviathan et al. (2023): keep d with
//    probability min(1, p(d) / q(d)); on rejection draw from
//    normalize(max(0, p - q)). The output follows the target distribution p.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "phaselab/backend.h"
#include "phaselab/kv_cache.h"
#include "phaselab/model.h"
#include "phaselab/model_config.h"
#include "phaselab/sampler.h"
#include "phaselab/status.h"

namespace phaselab {

using TokenDist = std::vector<std::pair<float, int32_t>>;  // (probability, id), sums to 1

// Where drafts come from: nowhere, earlier n-grams of the context, a
// smaller model, or the target itself with layers skipped. to_string gives
// the spelling of the CLI's --spec flag, the GUI's stored setting and
// DraftSource::name(): "none" | "lookup" | "draft" | "self".
enum class SpeculativeMode { off, prompt_lookup, draft_model, self_draft };
const char* to_string(SpeculativeMode m);
// The mode to_string() spells; nullopt for anything else.
std::optional<SpeculativeMode> speculative_mode_from_string(std::string_view s);

struct Draft {
  std::vector<int32_t> tokens;
  // Per drafted token, the distribution it was drawn from (q). Empty: the
  // source is deterministic (q is one-hot on the token).
  std::vector<TokenDist> probs;
  void clear() {
    tokens.clear();
    probs.clear();
  }
};

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  virtual std::string name() const = 0;
  // Proposes up to k tokens that continue context (every token so far);
  // fewer, or none, when it has no good guess.
  virtual Status propose(const std::vector<int32_t>& context, int k, const SamplingParams& sampling, Draft* out) = 0;
  // A source that drafts with the target's own backend on the sequence's own
  // cache (self-speculation) says so here; the engine loop then calls
  // propose_on_target with them instead of propose. kv holds context but
  // its last token (kv.n_past() == context.size() - 1) and holds exactly
  // that again when it returns.
  virtual bool drafts_on_target() const { return false; }
  virtual Status propose_on_target(Backend& backend, KvCache& kv, const std::vector<int32_t>& context, int k,
                                   const SamplingParams& sampling, Draft* out) {
    (void)backend, (void)kv;
    return propose(context, k, sampling, out);
  }
};

// Prompt lookup: the longest n-gram (max_ngram down to min_ngram) that ends
// the context and occurred earlier in it; proposes what followed it then.
std::unique_ptr<DraftSource> make_prompt_lookup_draft(int max_ngram = 3, int min_ngram = 1);

// A smaller model with the same vocabulary as the target (refused with a
// message otherwise), decoding k tokens on its own KV cache.
Result<std::unique_ptr<DraftSource>> make_draft_model_source(std::shared_ptr<const Model> draft,
                                                             std::unique_ptr<Backend> backend, int n_ctx,
                                                             const Model& target);

// Self-speculation (LayerSkip, Draft & Verify): the draft is the target with
// the layers where skip[il] != 0 left out, run by the target's backend on the
// sequence's own KV cache — the layers it runs keep their rows of the context
// (the full model's), the drafted positions are rolled back after drafting
// and the verification pass writes every layer's. No second model, no second
// cache. The backend must can_skip_layers(); the engine loop gives it.
//
// The draft's output matrix is a short list of the vocabulary (as FR-Spec
// does): on a small model with a large vocabulary the output matrix is most
// of a decode pass (Gemma 3 270M: 262144 x 640 of its ~270M parameters), so
// skipping layers alone saves little. The list: the first short_list ids
// (SentencePiece and BPE vocabularies put their frequent pieces first), the
// single characters of Latin scripts, punctuation and digits wherever they
// sit, the end-of-text tokens, and every token of the context so far (added
// as they appear: copies stay draftable). A model with a vocabulary not
// above twice short_list drafts over all of it. The verification always
// uses the whole vocabulary, so this changes the acceptance, never the output.
struct SelfDraftOptions {
  std::vector<uint8_t> skip;  // (n_layer) 1 = left out
  int short_list = 16384;
};
Result<std::unique_ptr<DraftSource>> make_self_draft(std::shared_ptr<const Model> model, SelfDraftOptions options);

// Which layers a self-draft skips, from the --spec-skip spelling: a list of
// layers and inclusive ranges ("8-13", "3,5,9-11"), counted from 0. Refuses
// layers outside the model, none at all, and every layer.
Result<std::vector<uint8_t>> parse_layer_skip(std::string_view spec, int n_layer);
// The default skip for a model of n_layer layers: the one layer just before
// the middle ("8" of Gemma 3 270M's 18: there a draft without it was
// accepted 81-100% of the time, one without 9-15 only 3%; see
// docs/benchmarks.md).
std::string default_self_skip(int n_layer);
// --spec-skip auto: which layers to skip, by measurement. A short greedy
// answer to prompt (n_predict tokens, k drafted per pass) is generated on s
// plainly, then with each single layer but the first and last skipped, then
// with the best single layer grown by a neighbour while that is faster (up
// to four layers). The skip with the highest measured decode tokens/s wins;
// every trial is reported. Each trial's output equals the plain one (a
// difference is an error: it would be a bug). Needs s's backend to
// can_skip_layers().
struct SelfSkipTrial {
  std::string skip;  // layer_skip_to_string
  double tokens_per_s = 0, acceptance = 0, tokens_per_pass = 0;
};
struct SelfSkipChoice {
  std::vector<uint8_t> skip;  // the fastest
  double plain_tokens_per_s = 0;
  std::vector<SelfSkipTrial> trials;  // in the order run
};
class Session;
Result<SelfSkipChoice> calibrate_self_skip(Session& s, const std::vector<int32_t>& prompt, int k, int n_predict = 32);
// The calibration's prompt for a model: a chat turn through its template
// (a transcript for a base model).
std::vector<int32_t> self_skip_calibration_prompt(const Model& model);

// The spelling parse_layer_skip reads back ("8-13", "3,5,9-11").
std::string layer_skip_to_string(const std::vector<uint8_t>& skip);

// The sampling-mode acceptance test for one drafted token d: p is the
// target's distribution, q the draft's (empty: one-hot on d). Returns -1 when
// d is accepted, else the replacement token drawn from max(0, p - q).
int32_t speculative_accept_or_resample(const TokenDist& p, const TokenDist& q, int32_t d, Sampler& rng,
                                       TokenDist* scratch);

}  // namespace phaselab
