// Perplexity and KL divergence (conventions and file format: perplexity.h).
#include "phaselab/perplexity.h"
#include "phaselab/memory.h"
#include "phaselab/stats.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sys/stat.h>

#include "backend/cpu/cpu_kernels.h"

namespace phaselab {

static_assert(std::endian::native == std::endian::little, "the KL base file is read and written little-endian");

namespace {

// Rows per pass when the caller names none: the backend's max_batch(); on
// the CPU at most the rows whose logits fit in 64 MiB (64 at least). Every
// row's logits are held (row, n_vocab), and with a 262144-entry vocabulary
// the CPU's 512-token passes would hold 512 MiB of them, and be slower
// (Gemma 3 270M, -c 512 --chunks 4, alternating: 760-781 tok/s and 405 MB
// peak RSS in passes of 64, 569-576 tok/s and 864 MB in passes of 512).
int default_ppl_batch(const Backend& backend, int n_vocab) {
  constexpr int64_t kCpuLogitsBytes = 64ll << 20;
  if (backend.name().rfind("cpu", 0) != 0) return backend.max_batch();
  const int64_t row_bytes = static_cast<int64_t>(std::max(n_vocab, 1)) * static_cast<int64_t>(sizeof(float));
  const int64_t rows = kCpuLogitsBytes / row_bytes;
  return static_cast<int>(std::min<int64_t>(backend.max_batch(), std::max<int64_t>(64, rows)));
}

using Clock = std::chrono::steady_clock;

constexpr char kMagic[8] = {'P', 'L', 'K', 'L', 'B', 'A', 'S', 'E'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxLabel = 4096;
constexpr int kMaxCtx = 1 << 20;
constexpr int kMaxVocab = 1 << 24;
constexpr int kMaxChunks = 1 << 24;
constexpr uint64_t kMaxFileBytes = 2ull << 30;
// Log-probs a little above 0 or probabilities summing a little above 1 come
// from float rounding; more than this is a corrupt file.
constexpr double kProbSlack = 1e-3;

// One row of logits: its argmax (the first maximum) and log-sum-exp.
struct RowStats {
  int argmax = 0;
  double lse = 0;
};

// scratch: [n_vocab]. The exponentials go through the CPU kernels' vectorized
// exp (as the softmax in attention does) in slices whose float sums are added
// in double, so that the sum over a 262k vocabulary loses nothing to rounding.
RowStats row_stats(const float* z, int n_vocab, float* scratch, const cpu::Kernels& k) {
  RowStats r;
  float mx = z[0];
  for (int i = 1; i < n_vocab; i++)
    if (z[i] > mx) mx = z[i], r.argmax = i;
  std::memcpy(scratch, z, sizeof(float) * n_vocab);
  constexpr int kSlice = 4096;
  double sum = 0;
  for (int i = 0; i < n_vocab; i += kSlice) sum += k.exp_sum(scratch + i, std::min(kSlice, n_vocab - i), mx);
  r.lse = mx + std::log(sum);
  return r;
}

// log p of token i, rounded to float as the base file stores it, so that a
// run compared against its own base gives exactly 0.
inline double logp_f32(const float* z, int i, double lse) { return static_cast<float>(static_cast<double>(z[i]) - lse); }

// The top_k largest logits' ids, most likely first (ties: lower id first).
void top_k_ids(const float* z, int n_vocab, int top_k, std::vector<std::pair<float, int32_t>>& heap, int32_t* out) {
  // A min-heap of the best so far: its top is the one to evict next.
  auto worse = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  heap.clear();
  for (int i = 0; i < n_vocab; i++) {
    if (static_cast<int>(heap.size()) < top_k) {
      heap.emplace_back(z[i], i);
      std::push_heap(heap.begin(), heap.end(), worse);
    } else if (z[i] > heap.front().first) {
      std::pop_heap(heap.begin(), heap.end(), worse);
      heap.back() = {z[i], i};
      std::push_heap(heap.begin(), heap.end(), worse);
    }
  }
  std::sort(heap.begin(), heap.end(), worse);
  for (int j = 0; j < top_k; j++) out[j] = heap[j].second;
}

std::string fmt_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Bounds-checked reads of the base file.
class Cursor {
 public:
  explicit Cursor(std::string_view b) : b_(b) {}
  size_t left() const { return b_.size() - pos_; }
  size_t pos() const { return pos_; }
  bool read(void* dst, size_t n) {
    if (n > left()) return false;
    std::memcpy(dst, b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  const char* take(size_t n) {
    if (n > left()) return nullptr;
    const char* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

template <typename T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

std::vector<int32_t> perplexity_tokenize(const Tokenizer& tok, std::string_view text) {
  std::vector<int32_t> t = tok.encode(text, /*add_special=*/false, /*parse_special=*/false);
  if (tok.add_bos() && tok.bos() >= 0) t.insert(t.begin(), tok.bos());
  return t;
}

Status KlBase::save(const std::string& path) const {
  const int64_t np = n_positions();
  if (n_ctx < 4 || top_k < 1 || n_chunks < 1 || tokens.size() != static_cast<size_t>(n_chunks) * n_ctx ||
      target_logp.size() != static_cast<size_t>(np) || top_ids.size() != static_cast<size_t>(np) * top_k ||
      top_logp.size() != top_ids.size())
    return internal_error("KL base for " + path + ": inconsistent sizes");
  std::string out;
  out.reserve(64 + label.size() + tokens.size() * 4 + static_cast<size_t>(np) * (4 + 8 * static_cast<size_t>(top_k)));
  out.append(kMagic, 8);
  put(out, kVersion);
  for (int v : {n_ctx, n_vocab, top_k, n_chunks}) put(out, static_cast<uint32_t>(v));
  put(out, bos);
  const std::string lab = label.substr(0, kMaxLabel);
  put(out, static_cast<uint32_t>(lab.size()));
  out += lab;
  out.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(int32_t));
  for (int64_t s = 0; s < np; s++) {
    put(out, target_logp[s]);
    out.append(reinterpret_cast<const char*>(&top_ids[s * top_k]), sizeof(int32_t) * top_k);
    out.append(reinterpret_cast<const char*>(&top_logp[s * top_k]), sizeof(float) * top_k);
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return io_error("cannot write the KL base " + path + ": " + std::strerror(errno));
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) return io_error("writing the KL base " + path + " failed (disk full?)");
  return Status::ok();
}

Result<KlBase> KlBase::parse(std::string_view bytes) {
  Cursor c(bytes);
  auto bad = [&](const std::string& what) {
    return invalid_file("not a valid KL base file: " + what + " (at byte " + std::to_string(c.pos()) +
                        "; write one with phaselab-cli perplexity --save-logits)");
  };
  char magic[8];
  if (!c.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return bad("no PLKLBASE magic");
  uint32_t version = 0, h[4];
  if (!c.read(&version, 4)) return bad("truncated header");
  if (version != kVersion) return bad("version " + std::to_string(version) + " (this build reads version 1)");
  if (!c.read(h, sizeof h)) return bad("truncated header");
  KlBase b;
  if (h[0] < 4 || h[0] > kMaxCtx) return bad("n_ctx " + std::to_string(h[0]) + " outside 4.." + std::to_string(kMaxCtx));
  if (h[1] < 1 || h[1] > kMaxVocab) return bad("n_vocab " + std::to_string(h[1]));
  if (h[2] < 1 || h[2] > static_cast<uint32_t>(kMaxTopK) || h[2] > h[1]) return bad("top_k " + std::to_string(h[2]));
  if (h[3] < 1 || h[3] > kMaxChunks) return bad("n_chunks " + std::to_string(h[3]));
  b.n_ctx = static_cast<int>(h[0]), b.n_vocab = static_cast<int>(h[1]);
  b.top_k = static_cast<int>(h[2]), b.n_chunks = static_cast<int>(h[3]);
  if (!c.read(&b.bos, 4)) return bad("truncated header");
  if (b.bos < -1 || b.bos >= b.n_vocab) return bad("BOS id " + std::to_string(b.bos));
  uint32_t label_len = 0;
  if (!c.read(&label_len, 4)) return bad("truncated header");
  if (label_len > kMaxLabel) return bad("label of " + std::to_string(label_len) + " bytes");
  const char* lab = c.take(label_len);
  if (!lab) return bad("truncated label");
  b.label.assign(lab, label_len);

  // Everything that follows is fixed by the header: check it against the
  // bytes present before allocating anything (no overflow: n_chunks * n_ctx
  // < 2^44 and a record is at most 4 + 8 * 1024 bytes).
  const uint64_t n_tok = static_cast<uint64_t>(b.n_chunks) * b.n_ctx;
  const uint64_t np = static_cast<uint64_t>(b.n_positions());
  const uint64_t rec = 4 + 8ull * b.top_k;
  const uint64_t need = n_tok * 4 + np * rec;
  if (need != c.left())
    return bad("the header promises " + std::to_string(need) + " bytes of tokens and records, the file holds " +
               std::to_string(c.left()));
  b.tokens.resize(n_tok);
  c.read(b.tokens.data(), n_tok * 4);
  for (uint64_t i = 0; i < n_tok; i++)
    if (b.tokens[i] < 0 || b.tokens[i] >= b.n_vocab) return bad("token " + std::to_string(b.tokens[i]) + " at index " + std::to_string(i));

  b.target_logp.resize(np);
  b.top_ids.resize(np * b.top_k);
  b.top_logp.resize(np * b.top_k);
  std::vector<int32_t> ids_sorted(b.top_k);
  for (uint64_t s = 0; s < np; s++) {
    float* lp = &b.top_logp[s * b.top_k];
    int32_t* ids = &b.top_ids[s * b.top_k];
    c.read(&b.target_logp[s], 4);
    c.read(ids, 4ull * b.top_k);
    c.read(lp, 4ull * b.top_k);
    const std::string where = "position " + std::to_string(s);
    if (!std::isfinite(b.target_logp[s]) || b.target_logp[s] > kProbSlack) return bad(where + ": log-probability of the next token");
    double psum = 0;
    for (int j = 0; j < b.top_k; j++) {
      if (ids[j] < 0 || ids[j] >= b.n_vocab) return bad(where + ": token id " + std::to_string(ids[j]));
      if (!std::isfinite(lp[j]) || lp[j] > kProbSlack || (j > 0 && lp[j] > lp[j - 1]))
        return bad(where + ": log-probabilities not finite, not <= 0 or not in descending order");
      psum += std::exp(static_cast<double>(lp[j]));
    }
    if (psum > 1 + kProbSlack) return bad(where + ": probabilities sum to " + fmt_double(psum));
    std::copy(ids, ids + b.top_k, ids_sorted.begin());
    std::sort(ids_sorted.begin(), ids_sorted.end());
    if (std::adjacent_find(ids_sorted.begin(), ids_sorted.end()) != ids_sorted.end()) return bad(where + ": a token id repeats");
  }
  return b;
}

Result<KlBase> KlBase::load(const std::string& path, int llama_top_k) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return io_error("cannot open the KL base " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return invalid_argument("the KL base " + path + " is not a regular file");
  {  // llama-perplexity's format, told by its magic
    char magic[8] = {};
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return io_error("cannot open the KL base " + path + ": " + std::strerror(errno));
    const bool got = std::fread(magic, 1, 8, f) == 8;
    std::fclose(f);
    if (got && std::memcmp(magic, "_logits_", 8) == 0) return load_llama(path, llama_top_k);
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxFileBytes)
    return invalid_file("the KL base " + path + " is larger than any base file PhaseLab writes (" +
                        std::to_string(st.st_size) + " bytes)");
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return io_error("cannot open the KL base " + path + ": " + std::strerror(errno));
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  const size_t got = std::fread(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  if (got != bytes.size()) return io_error("reading the KL base " + path + " failed");
  auto b = parse(bytes);
  if (!b) return b.status().with_context(path);
  return b;
}

namespace {

// A run's shape, once its inputs are checked.
struct PplPlan {
  int n_ctx = 0, n_vocab = 0, n_chunks = 0;
  int32_t bos = -1;      // put at each chunk's start (-1: the tokenizer adds none)
  int64_t n_text = 0;    // tokens of the text
  int first = 0;         // the first scored position of a chunk (its second half)
  int n_per_chunk = 0;   // positions scored per chunk
};

// The KL base must come from the same tokens, context, vocabulary and BOS;
// with opt.n_chunks < 0 the run takes at most the base's chunks.
Status check_kl_base(const KlBase& base, const std::vector<int32_t>& tokens, const PerplexityOptions& opt,
                     PplPlan* plan) {
  const std::string from = base.label.empty() ? std::string("the KL base") : "the KL base (" + base.label + ")";
  if (base.n_ctx != plan->n_ctx)
    return invalid_argument(from + " was computed with a context of " + std::to_string(base.n_ctx) + ", this run uses " +
                            std::to_string(plan->n_ctx) + " (pass -c " + std::to_string(base.n_ctx) + ")");
  if (base.n_vocab != plan->n_vocab)
    return invalid_argument(from + " has a vocabulary of " + std::to_string(base.n_vocab) + " tokens, this model " +
                            std::to_string(plan->n_vocab) + ": KL divergence needs models with the same vocabulary");
  if (base.bos != KlBase::kBosOfRun && base.bos != plan->bos)
    return invalid_argument(from + " was made with another BOS token: not the same tokenizer");
  if (opt.n_chunks < 0) plan->n_chunks = std::min(plan->n_chunks, base.n_chunks);
  if (plan->n_chunks > base.n_chunks)
    return invalid_argument(from + " holds " + std::to_string(base.n_chunks) + " chunks, this run asks for " +
                            std::to_string(plan->n_chunks));
  const size_t n_cmp = static_cast<size_t>(plan->n_chunks) * plan->n_ctx;
  const auto diff = std::mismatch(tokens.begin(), tokens.begin() + n_cmp, base.tokens.begin());
  if (diff.first != tokens.begin() + n_cmp)
    return invalid_argument(from + " was computed on other tokens (they differ from token " +
                            std::to_string(diff.first - tokens.begin()) +
                            " on): use the same text and a model with the same tokenizer");
  return Status::ok();
}

Result<PplPlan> plan_perplexity(Session& session, const std::vector<int32_t>& tokens, const PerplexityOptions& opt) {
  PplPlan plan;
  const Tokenizer& tok = session.model().tokenizer();
  plan.n_vocab = session.model().config().n_vocab;
  plan.n_ctx = opt.n_ctx;
  const int n_ctx = plan.n_ctx, n_vocab = plan.n_vocab;
  if (n_ctx < 4) return invalid_argument("perplexity context of " + std::to_string(n_ctx) + " tokens (at least 4)");
  if (n_ctx > session.n_ctx())
    return invalid_argument("perplexity context of " + std::to_string(n_ctx) + " tokens, but the session holds " +
                            std::to_string(session.n_ctx()) + ": create it with a context of at least that");
  plan.n_text = static_cast<int64_t>(tokens.size());
  if (plan.n_text < 2ll * n_ctx)
    return invalid_argument("the text has " + std::to_string(plan.n_text) + " tokens; a context of " +
                            std::to_string(n_ctx) + " needs at least " + std::to_string(2 * n_ctx) +
                            " (use a longer text or a smaller context)");
  for (int32_t t : tokens)
    if (t < 0 || t >= n_vocab) return invalid_argument("token id " + std::to_string(t) + " outside the model's vocabulary");
  if (opt.save_base && (opt.save_top_k < 1 || opt.save_top_k > std::min(KlBase::kMaxTopK, n_vocab)))
    return invalid_argument("top-k of the KL base must be 1.." + std::to_string(std::min(KlBase::kMaxTopK, n_vocab)));
  plan.bos = tok.add_bos() ? tok.bos() : -1;
  const int n_chunk_max = static_cast<int>(plan.n_text / n_ctx);
  plan.n_chunks = opt.n_chunks < 0 ? n_chunk_max : std::min(opt.n_chunks, n_chunk_max);
  if (opt.n_chunks == 0) return invalid_argument("at least one chunk is needed");
  if (opt.kl_base) PHASELAB_TRY(check_kl_base(*opt.kl_base, tokens, opt, &plan));
  plan.first = n_ctx / 2;
  plan.n_per_chunk = perplexity_scored_per_chunk(n_ctx);
  return plan;
}

// What the scored positions add up to: the negative log-likelihood and,
// against a KL base, the divergence, top-1 agreement and the change of the
// target's probability.
struct PplSums {
  double nll = 0, nll2 = 0, base_nll = 0;
  double kld = 0, kld2 = 0, dp = 0, dp2 = 0;
  double overlap = 0, overlap_hi = 0;  // sum of min(p, q) over the top-k of P (and with the rest's bin)
  double max_dlogp = 0;                // of |log q - log p| over P's top-k with log p > -15
  int64_t same_top = 0, count = 0;
  std::vector<float> kld_values;  // (scored positions) per position, when comparing

  // Position s (its index among all scored ones) against the base's top-k.
  void compare(const KlBase& base, const float* z, const RowStats& rs, int32_t target, int64_t s) {
    const int32_t* bid = &base.top_ids[s * base.top_k];
    const float* blp = &base.top_logp[s * base.top_k];
    double kl = 0, p_top = 0, q_top = 0, ov = 0;
    for (int j = 0; j < base.top_k; j++) {
      const double lp = blp[j], lq = logp_f32(z, bid[j], rs.lse);
      const double pj = std::exp(lp), qj = std::exp(lq);
      kl += pj * (lp - lq);
      if (lp > -15) max_dlogp = std::max(max_dlogp, std::fabs(lq - lp));
      p_top += pj, q_top += qj;
      ov += std::min(pj, qj);
    }
    overlap += ov;
    overlap_hi += ov + std::clamp(std::min(1 - p_top, 1 - q_top), 0.0, 1.0);
    // The rest of the vocabulary as one outcome (see perplexity.h).
    const double p_rest = 1 - p_top, q_rest = std::max(1 - q_top, 1e-12);
    if (p_rest > 0) kl += p_rest * (std::log(p_rest) - std::log(q_rest));
    kld += kl, kld2 += kl * kl;
    kld_values.push_back(static_cast<float>(kl));
    same_top += rs.argmax == bid[0];
    const double lp_base = base.target_logp[s];
    const double d = std::exp(logp_f32(z, target, rs.lse)) - std::exp(lp_base);
    dp += d, dp2 += d * d;
    base_nll -= lp_base;
  }
};

// The base's record of position s: the target's log-probability and the top-k.
void save_position(KlBase& sb, const float* z, int n_vocab, const RowStats& rs, int32_t target, int64_t s,
                   std::vector<std::pair<float, int32_t>>& heap) {
  int32_t* out_ids = &sb.top_ids[s * sb.top_k];
  top_k_ids(z, n_vocab, sb.top_k, heap, out_ids);
  for (int j = 0; j < sb.top_k; j++) sb.top_logp[s * sb.top_k + j] = static_cast<float>(logp_f32(z, out_ids[j], rs.lse));
  sb.target_logp[s] = static_cast<float>(logp_f32(z, target, rs.lse));
}

void start_base(KlBase& sb, const PplPlan& plan, int top_k, const std::vector<int32_t>& tokens) {
  const int64_t n_scored_total = static_cast<int64_t>(plan.n_chunks) * plan.n_per_chunk;
  sb = KlBase{};
  sb.n_ctx = plan.n_ctx, sb.n_vocab = plan.n_vocab, sb.top_k = top_k, sb.n_chunks = plan.n_chunks, sb.bos = plan.bos;
  sb.tokens.assign(tokens.begin(), tokens.begin() + static_cast<size_t>(plan.n_chunks) * plan.n_ctx);
  sb.target_logp.resize(n_scored_total);
  sb.top_ids.resize(n_scored_total * sb.top_k);
  sb.top_logp.resize(n_scored_total * sb.top_k);
}

PerplexityResult summarize(const PplPlan& plan, PplSums& sums, const KlBase* base, double seconds) {
  const int64_t count = sums.count;
  PerplexityResult r;
  r.n_ctx = plan.n_ctx;
  r.n_chunks = plan.n_chunks;
  r.n_scored = count;
  r.n_tokens_text = plan.n_text;
  r.n_evaluated = static_cast<int64_t>(plan.n_chunks) * plan.n_ctx;
  r.seconds = seconds;
  r.tokens_per_s = r.seconds > 0 ? r.n_evaluated / r.seconds : 0;
  r.nll_mean = sums.nll / count;
  r.ppl = std::exp(r.nll_mean);
  const double var = sums.nll2 / count - r.nll_mean * r.nll_mean;
  r.ppl_err = var > 0 && count > 1 ? r.ppl * std::sqrt(var / (count - 1)) : 0;
  if (base) {
    KlStats k;
    k.kld = sums.kld / count;
    const double kvar = sums.kld2 / count - k.kld * k.kld;
    k.kld_err = kvar > 0 && count > 1 ? std::sqrt(kvar / (count - 1)) : 0;
    std::sort(sums.kld_values.begin(), sums.kld_values.end());
    k.kld_median = percentile(sums.kld_values, 0.5);
    k.kld_p99 = percentile(sums.kld_values, 0.99);
    k.kld_max = sums.kld_values.back();
    k.top1_agree = static_cast<double>(sums.same_top) / count;
    k.accept_sampled = sums.overlap / count;
    k.accept_sampled_hi = sums.overlap_hi / count;
    k.dp_mean = 100 * sums.dp / count;
    k.rms_dp = 100 * std::sqrt(sums.dp2 / count);
    k.ppl_base = std::exp(sums.base_nll / count);
    k.max_dlogp = sums.max_dlogp;
    k.top_k = base->top_k;
    k.base_label = base->label;
    r.kl = k;
  }
  return r;
}

}  // namespace

Result<PerplexityResult> run_perplexity(Session& session, const std::vector<int32_t>& tokens,
                                        const PerplexityOptions& opt, const PerplexityProgressFn& progress,
                                        const std::atomic<bool>* cancel) {
  auto planned = plan_perplexity(session, tokens, opt);
  if (!planned) return planned.status();
  const PplPlan& plan = *planned;
  const int n_ctx = plan.n_ctx, n_vocab = plan.n_vocab, n_chunks = plan.n_chunks;
  const KlBase* base = opt.kl_base;
  Backend& backend = session.backend();
  KvCache& kv = session.kv();
  const int nb = opt.n_batch > 0 ? std::min(opt.n_batch, backend.max_batch()) : default_ppl_batch(backend, n_vocab);
  const cpu::Kernels& kern = cpu::best_kernels();

  // Every row's logits are held: refused with the numbers where they do not fit.
  MemoryNeed logits_need;
  logits_need.work = static_cast<uint64_t>(nb) * static_cast<uint64_t>(n_vocab) * sizeof(float);
  PHASELAB_TRY(check_memory(logits_need, available_memory_bytes(), "lower -b")
                   .with_context("perplexity's logits of " + std::to_string(nb) + "-token passes"));
  std::vector<float> logits(static_cast<size_t>(nb) * n_vocab);  // (nb, n_vocab)
  std::vector<float> scratch(n_vocab);                            // (n_vocab)
  std::vector<int32_t> chunk(n_ctx);                              // (n_ctx)
  std::vector<std::pair<float, int32_t>> heap;
  if (opt.save_base) start_base(*opt.save_base, plan, opt.save_top_k, tokens);
  PplSums sums;
  if (base) sums.kld_values.reserve(static_cast<size_t>(n_chunks) * plan.n_per_chunk);

  // The KV cache is the session's: no prefix reuse for the run (every chunk
  // starts empty by definition), its setting restored afterwards.
  const bool prefix_cache = kv.prefix_cache();
  kv.set_prefix_cache(false);
  struct Restore {
    KvCache& kv;
    bool on;
    ~Restore() {
      kv.clear();
      kv.set_prefix_cache(on);
    }
  } restore{kv, prefix_cache};

  const auto t0 = Clock::now();
  PerplexityProgress pr;
  pr.n_chunks = n_chunks;
  pr.tokens_total = static_cast<int64_t>(n_chunks) * n_ctx;

  for (int ci = 0; ci < n_chunks; ci++) {
    kv.clear();
    std::copy(tokens.begin() + static_cast<size_t>(ci) * n_ctx, tokens.begin() + static_cast<size_t>(ci + 1) * n_ctx,
              chunk.begin());
    if (plan.bos >= 0) chunk[0] = plan.bos;
    for (int p = 0; p < n_ctx; p += nb) {
      if (cancel && cancel->load(std::memory_order_relaxed)) return cancelled("perplexity cancelled");
      const int n = std::min(nb, n_ctx - p);
      // Scored logits of this batch: positions [lo, hi].
      const int lo = std::max(p, plan.first), hi = std::min(p + n - 1, n_ctx - 2);
      const LogitsMode mode = lo <= hi ? LogitsMode::all : LogitsMode::none;
      if (Status st = backend.forward(chunk.data() + p, n, kv, logits.data(), mode); !st)
        return st.with_context("perplexity chunk " + std::to_string(ci + 1));
      for (int pos = lo; pos <= hi; pos++) {
        const float* z = logits.data() + static_cast<size_t>(pos - p) * n_vocab;
        const int32_t target = chunk[pos + 1];
        const RowStats rs = row_stats(z, n_vocab, scratch.data(), kern);
        const double v = rs.lse - z[target];
        sums.nll += v, sums.nll2 += v * v;
        const int64_t s = static_cast<int64_t>(ci) * plan.n_per_chunk + (pos - plan.first);
        if (opt.save_base) save_position(*opt.save_base, z, n_vocab, rs, target, s, heap);
        if (base) sums.compare(*base, z, rs, target, s);
        sums.count++;
      }
      pr.tokens_done += n;
      pr.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();
      pr.tokens_per_s = pr.elapsed_s > 0 ? pr.tokens_done / pr.elapsed_s : 0;
      if (p + n >= n_ctx) pr.chunk = ci + 1, pr.ppl = std::exp(sums.nll / sums.count);
      if (progress) progress(pr);
    }
  }
  return summarize(plan, sums, base, std::chrono::duration<double>(Clock::now() - t0).count());
}

}  // namespace phaselab
