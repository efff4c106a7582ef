// Perplexity and KL divergence of a model on a text, with llama-perplexity's
// conventions so that the two tools give the same number for the same model
// and text:
//
//  - the whole text is tokenized once (BOS first when the model adds one);
//  - the tokens are cut into n_chunks chunks of n_ctx tokens (the remainder
//    is dropped; at least 2 * n_ctx tokens are needed); each chunk runs from
//    an empty KV cache, its first token replaced by BOS when the model adds
//    BOS;
//  - only the second half of each chunk is scored, so that every scored
//    token has at least n_ctx/2 tokens of context: the logits at positions
//    first = n_ctx/2 .. n_ctx - 2 predict the tokens at first + 1 .. n_ctx - 1
//    (n_ctx - 1 - n_ctx/2 tokens per chunk: 255 for n_ctx = 512);
//  - PPL = exp(mean NLL), and its error exp(mean) * sd(NLL) / sqrt(n - 1).
//
// KL divergence against a reference ("base") run of the same tokens: the
// reference run keeps, for every scored position, the log-probability of the
// actual next token and the top_k most likely tokens with their
// log-probabilities (KlBase). A later run of another model, quantization or
// backend compares its own distribution Q with the reference's P there:
//
//  - kld: the mean over positions of KL(P || Q) computed on the top_k tokens
//    of P plus one "other" bin holding the rest of the vocabulary:
//        sum_k p_k (log p_k - log q_k) + p_rest (log p_rest - log q_rest),
//    p_rest = 1 - sum_k p_k, q_rest = 1 - sum_k q_k (the same k tokens). This
//    is the exact KL of the two distributions coarsened to k + 1 outcomes;
//    merging outcomes never increases a KL divergence (log-sum inequality),
//    so it is a lower bound of the full KL, short of it by p_rest times the
//    KL of the two distributions' shapes within the tail. With k = 32 the
//    tail holds a few percent of P at most positions, so the bound is close;
//    llama-perplexity keeps all n_vocab log-probs (16 bits each, tens of MB per
//    chunk for a 262k vocabulary) and sums over tokens with log p > -16;
//  - kld_p99 (99th percentile of the per-position values, interpolated as
//    llama-perplexity does), kld_median, kld_max;
//  - top1_agree: the fraction of positions whose argmax equals the
//    reference's (llama's "Same top p");
//  - rms_dp: the root mean square of p(correct token) - p_base(correct
//    token), in percent (llama's "RMS Δp"); dp_mean likewise;
//  - the acceptance rates the compared model would have as a speculative
//    draft of the reference, teacher-forced on the text: greedy decoding
//    keeps a drafted token when the two argmaxes agree (top1_agree);
//    sampling (Leviathan et al.'s rejection scheme, same temperature 1)
//    keeps a token drawn from Q with probability sum_x min(p(x), q(x))
//    = 1 - TV(P, Q). accept_sampled sums min(p, q) over P's top_k tokens
//    only: a lower bound; accept_sampled_hi adds min(p_rest, q_rest), an
//    upper bound (merging outcomes never lowers that sum). The true value
//    lies between them, at most P's tail mass apart.
//
// The KL base file (KlBase::save / load), little-endian:
//   char[8]  "PLKLBASE"
//   u32      version (1)
//   u32      n_ctx, n_vocab, top_k, n_chunks
//   i32      bos (the token that replaced each chunk's first one; -1: none)
//   u32      label length L (<= 4096), then L bytes (model file name and
//            backend of the reference, for messages)
//   i32      tokens[n_chunks * n_ctx]  as tokenized (before the BOS swap)
//   then for each chunk, each scored position (n_ctx - 1 - n_ctx/2 of them):
//     f32    log p of the actual next token
//     i32    ids[top_k]     by descending probability
//     f32    logp[top_k]
// The reader checks every field against the file's size before allocating,
// ids and tokens against n_vocab, log-probs for finiteness, order and a total
// probability of at most 1, and that nothing follows the last record.
//
// llama-perplexity's --kl-divergence-base files are read too (KlBase::load
// tells them by their magic), so that PhaseLab's output can be measured
// against llama.cpp's and a quantization made by either against a base made
// by the other. That format, little-endian:
//   char[8]  "_logits_"
//   u32      n_ctx;  i32 n_vocab;  i32 n_chunks
//   i32      tokens[n_chunks * n_ctx]  as tokenized (BOS first where added)
//   then for each chunk, each scored position (the same ones as here):
//     f32 scale, f32 min_log_prob, then u16 q[n_vocab] padded to an even
//     count: log p_i = min_log_prob + scale * q_i. Logits more than 16
//     below the maximum are stored as q = 0 (their log p is not kept).
// It keeps every token; the reader keeps the top_k most likely (ties: the
// lower id first, as llama's argmax) and the target's, so the KL divergence
// is computed as for PhaseLab's own bases. top_k is cut to the fewest
// tokens any position stores exactly (q > 0), so no clamped value enters. It does not record the BOS token:
// the run's (the model's) is taken.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "phaselab/session.h"
#include "phaselab/status.h"
#include "phaselab/tokenizer.h"

namespace phaselab {

// Scored positions per chunk of n_ctx tokens: n_ctx - 1 - n_ctx / 2.
inline int perplexity_scored_per_chunk(int n_ctx) { return n_ctx - 1 - n_ctx / 2; }

// The reference run's distributions at the scored positions (see above).
struct KlBase {
  static constexpr int kMaxTopK = 1024;
  static constexpr int kLlamaTopK = 64;      // tokens kept of a llama-perplexity file by default
  static constexpr int32_t kBosOfRun = -2;   // bos: not recorded (llama's files): the run's
  int n_ctx = 0, n_vocab = 0, top_k = 0, n_chunks = 0;
  int32_t bos = -1;
  bool from_llama = false;          // read from a llama-perplexity file
  std::string label;                // "gemma-3-270m-q4_k_m.gguf (cpu-reference)"
  std::vector<int32_t> tokens;      // (n_chunks * n_ctx) as tokenized
  std::vector<float> target_logp;   // (n_positions): log p of the actual next token
  std::vector<int32_t> top_ids;     // (n_positions, top_k), most likely first
  std::vector<float> top_logp;      // (n_positions, top_k)

  int64_t n_positions() const { return static_cast<int64_t>(n_chunks) * perplexity_scored_per_chunk(n_ctx); }
  // Writes the file (replacing it); errors name the path.
  Status save(const std::string& path) const;
  // Reads and validates a file, PhaseLab's or llama-perplexity's (of which
  // llama_top_k tokens per position are kept, at most n_vocab and kMaxTopK);
  // errors name the path and what is wrong.
  static Result<KlBase> load(const std::string& path, int llama_top_k = kLlamaTopK);
  // A llama-perplexity --kl-divergence-base file, read as it streams (such
  // files hold n_vocab values per position: gigabytes for a big vocabulary).
  static Result<KlBase> load_llama(const std::string& path, int top_k = kLlamaTopK);
  // The same validation on bytes in memory (tests, fuzzing).
  static Result<KlBase> parse(std::string_view bytes);
};

struct KlStats {
  double kld = 0, kld_err = 0;        // mean KL(P_base || Q) per position (nats), its standard error
  double kld_median = 0, kld_p99 = 0, kld_max = 0;
  double top1_agree = 0;              // fraction of positions with the same argmax (greedy draft acceptance)
  double accept_sampled = 0, accept_sampled_hi = 0;  // mean sum of min(p, q): bounds of sampled draft acceptance
  double rms_dp = 0, dp_mean = 0;     // of p - p_base for the correct token, percent
  double ppl_base = 0;                // the reference's perplexity (from its saved log-probs)
  // The largest |log q - log p| over the base's top-k tokens with log p > -15
  // (llama's files keep no more below -16): how far apart the two
  // distributions are token by token, for an exactness check (equal models
  // and weights: the rounding of the file, ~1e-4 for llama's).
  double max_dlogp = 0;
  int top_k = 0;                      // of the base
  std::string base_label;
};

struct PerplexityOptions {
  int n_ctx = 512;     // tokens per chunk (the session's context must hold them)
  int n_batch = 0;     // tokens per forward pass; 0: the backend's max_batch()
                       // (on the CPU: at most the rows whose logits fit in 64 MiB, 64 at least)
  int n_chunks = -1;   // chunks to run; -1: all the text holds (with kl_base: all the base holds)
  // Reference run: fill *save_base (top_k tokens per position).
  KlBase* save_base = nullptr;
  int save_top_k = 32;
  // Comparison: measure KL divergence against this base. Its n_ctx, vocabulary
  // and tokens must match this run's (else invalid_argument, saying which).
  const KlBase* kl_base = nullptr;
};

struct PerplexityProgress {
  int chunk = 0, n_chunks = 0;        // chunks finished, of
  int64_t tokens_done = 0, tokens_total = 0;  // positions run through the model
  double elapsed_s = 0;
  double tokens_per_s = 0;
  double ppl = 0;                     // so far (0 before the first chunk ends)
};
using PerplexityProgressFn = std::function<void(const PerplexityProgress&)>;

struct PerplexityResult {
  double ppl = 0, ppl_err = 0;
  double nll_mean = 0;                // mean negative log-likelihood (nats)
  int n_ctx = 0, n_chunks = 0;
  int64_t n_scored = 0;               // tokens scored
  int64_t n_tokens_text = 0;          // tokens in the whole text
  int64_t n_evaluated = 0;            // positions run (n_chunks * n_ctx)
  double seconds = 0, tokens_per_s = 0;  // n_evaluated / seconds (forward passes and scoring)
  std::optional<KlStats> kl;          // when a base was given
};

// The text's tokens as llama-perplexity takes them: BOS first when the
// model adds one, no EOS, special-token text left as text.
std::vector<int32_t> perplexity_tokenize(const Tokenizer& tok, std::string_view text);

// Runs the chunks through the session's backend, each from an empty KV cache
// (the session's cache is cleared; the prefix cache is bypassed for the run).
// progress is called after every forward pass; cancel is read between them.
Result<PerplexityResult> run_perplexity(Session& session, const std::vector<int32_t>& tokens,
                                        const PerplexityOptions& opt, const PerplexityProgressFn& progress = {},
                                        const std::atomic<bool>* cancel = nullptr);

}  // namespace phaselab
