#include "phaselab/backend.h"

namespace phaselab {

Status check_batch(const SeqChunk* chunks, int n_chunks, int n_vocab, int max_batch, bool argmax_may_replace_logits,
                   int* n_tokens) {
  if (n_chunks < 1) return invalid_argument("an empty batch: nothing to compute");
  int T = 0;
  for (int i = 0; i < n_chunks; i++) {
    const SeqChunk& ch = chunks[i];
    if (!ch.kv || !ch.tokens || ch.n_tokens < 1)
      return invalid_argument("batch chunk " + std::to_string(i) + " has no sequence or no tokens");
    if (ch.draw && !argmax_may_replace_logits)
      return unsupported("batch chunk " + std::to_string(i) + " asks for a draw on the device, which this backend lacks");
    if (ch.draw && (ch.mode != LogitsMode::last || ch.argmax))
      return invalid_argument("batch chunk " + std::to_string(i) + " asks for a device draw without mode last, or with an argmax");
    const bool argmax_only = argmax_may_replace_logits && ch.mode == LogitsMode::last && ch.argmax;
    if (ch.mode != LogitsMode::none && !ch.logits && !argmax_only)
      return invalid_argument("batch chunk " + std::to_string(i) + " asks for logits but gives nowhere to put them");
    for (int j = 0; j < i; j++)
      if (chunks[j].kv == ch.kv) return invalid_argument("a sequence appears twice in one batch");
    for (int t = 0; t < ch.n_tokens; t++)
      if (ch.tokens[t] < 0 || ch.tokens[t] >= n_vocab)
        return invalid_argument("token id " + std::to_string(ch.tokens[t]) + " is outside the vocabulary");
    T += ch.n_tokens;
  }
  if (T > max_batch) return invalid_argument("batch of " + std::to_string(T) + " tokens (1.." + std::to_string(max_batch) + ")");
  if (n_tokens) *n_tokens = T;
  return Status::ok();
}

}  // namespace phaselab
