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
#include "phaselab/model.h"
#include "phaselab/sampler.h"
#include "phaselab/status.h"

namespace phaselab {

using TokenDist = std::vector<std::pair<float, int32_t>>;  // (probability, id), sums to 1

// Where drafts come from: nowhere, earlier n-grams of the context, or a
// smaller model. to_string gives the spelling of the CLI's --spec flag, the
// GUI's stored setting and DraftSource::name(): "none" | "lookup" | "draft".
enum class SpeculativeMode { off, prompt_lookup, draft_model };
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
};

// Prompt lookup: the longest n-gram (max_ngram down to min_ngram) that ends
// the context and occurred earlier in it; proposes what followed it then.
std::unique_ptr<DraftSource> make_prompt_lookup_draft(int max_ngram = 3, int min_ngram = 1);

// A smaller model with the same vocabulary as the target (refused with a
// message otherwise), decoding k tokens on its own KV cache.
Result<std::unique_ptr<DraftSource>> make_draft_model_source(std::shared_ptr<const Model> draft,
                                                             std::unique_ptr<Backend> backend, int n_ctx,
                                                             const Model& target);

// The sampling-mode acceptance test for one drafted token d: p is the
// target's distribution, q the draft's (empty: one-hot on d). Returns -1 when
// d is accepted, else the replacement token drawn from max(0, p - q).
int32_t speculative_accept_or_resample(const TokenDist& p, const TokenDist& q, int32_t d, Sampler& rng,
                                       TokenDist* scratch);

}  // namespace phaselab
