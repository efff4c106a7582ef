// llama-perplexity's --kl-divergence-base files, read into a KlBase (the
// format: perplexity.h). The file is streamed one position at a time: it
// holds every token's log-probability, which for a 262k vocabulary is half
// a megabyte per position.
#include "phaselab/perplexity.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <sys/stat.h>

namespace phaselab {

static_assert(std::endian::native == std::endian::little, "llama-perplexity's files are little-endian");

namespace {

constexpr char kLlamaMagic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};
constexpr int kMaxCtx = 1 << 20;
constexpr int kMaxVocab = 1 << 24;
constexpr int kMaxChunks = 1 << 24;
constexpr double kProbSlack = 1e-2;  // 16-bit log-probs: a sum a little above 1 is rounding

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

}  // namespace

Result<KlBase> KlBase::load_llama(const std::string& path, int top_k) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return io_error("cannot open the KL base " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return invalid_argument("the KL base " + path + " is not a regular file");
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) return io_error("cannot open the KL base " + path + ": " + std::strerror(errno));
  auto bad = [&](const std::string& what) {
    return invalid_file(path + ": not a valid llama-perplexity KL base: " + what +
                        " (write one with llama-perplexity --kl-divergence-base FILE, or phaselab-cli perplexity "
                        "--save-logits)");
  };
  auto read = [&](void* dst, size_t n) { return std::fread(dst, 1, n, f.get()) == n; };

  char magic[8];
  uint32_t n_ctx = 0;
  int32_t n_vocab = 0, n_chunks = 0;
  if (!read(magic, 8) || std::memcmp(magic, kLlamaMagic, 8) != 0) return bad("no _logits_ magic");
  if (!read(&n_ctx, 4) || !read(&n_vocab, 4) || !read(&n_chunks, 4)) return bad("truncated header");
  if (n_ctx < 4 || n_ctx > static_cast<uint32_t>(kMaxCtx))
    return bad("n_ctx " + std::to_string(n_ctx) + " outside 4.." + std::to_string(kMaxCtx));
  if (n_vocab < 1 || n_vocab > kMaxVocab) return bad("n_vocab " + std::to_string(n_vocab));
  if (n_chunks < 1 || n_chunks > kMaxChunks) return bad("n_chunks " + std::to_string(n_chunks));
  KlBase b;
  b.n_ctx = static_cast<int>(n_ctx), b.n_vocab = n_vocab, b.n_chunks = n_chunks;
  b.top_k = std::clamp(top_k, 1, std::min(n_vocab, kMaxTopK));
  b.bos = kBosOfRun;
  b.from_llama = true;
  const size_t slash = path.find_last_of('/');
  b.label = (slash == std::string::npos ? path : path.substr(slash + 1)) + " (llama-perplexity)";

  // The header fixes the size: check it before allocating anything.
  const uint64_t nv = 2 * ((static_cast<uint64_t>(n_vocab) + 1) / 2) + 4;  // u16 per record
  const uint64_t n_tok = static_cast<uint64_t>(n_chunks) * n_ctx;
  const uint64_t np = static_cast<uint64_t>(b.n_positions());
  const uint64_t need = 20 + 4 * n_tok + 2 * nv * np;
  if (need != static_cast<uint64_t>(st.st_size))
    return bad("the header (n_ctx " + std::to_string(n_ctx) + ", n_vocab " + std::to_string(n_vocab) + ", " +
               std::to_string(n_chunks) + " chunks) promises " + std::to_string(need) + " bytes, the file holds " +
               std::to_string(st.st_size));
  b.tokens.resize(n_tok);
  if (!read(b.tokens.data(), 4 * n_tok)) return bad("truncated tokens");
  for (uint64_t i = 0; i < n_tok; i++)
    if (b.tokens[i] < 0 || b.tokens[i] >= n_vocab)
      return bad("token " + std::to_string(b.tokens[i]) + " at index " + std::to_string(i));

  b.target_logp.resize(np);
  b.top_ids.resize(np * b.top_k);
  b.top_logp.resize(np * b.top_k);
  std::vector<uint16_t> rec(nv);           // (nv) one position's record
  std::vector<int32_t> order(n_vocab);     // (n_vocab) token ids, sorted by their q
  const int per_chunk = perplexity_scored_per_chunk(b.n_ctx), first = b.n_ctx / 2;
  // Tokens stored as q = 0 lie 16 or more below the maximum logit: their log
  // p is only bounded. The top-k keeps no such token, so k ends at most the
  // fewest exactly stored tokens of any position (the tail's bin holds the
  // rest, exactly: 1 - the kept probabilities).
  int min_exact = n_vocab;
  for (uint64_t s = 0; s < np; s++) {
    if (!read(rec.data(), 2 * nv)) return bad("truncated record of position " + std::to_string(s));
    float scale = 0, min_lp = 0;
    std::memcpy(&scale, &rec[0], 4);
    std::memcpy(&min_lp, &rec[2], 4);
    const uint16_t* q = &rec[4];
    const std::string where = "position " + std::to_string(s);
    if (!std::isfinite(scale) || scale < 0 || scale > 1 || !std::isfinite(min_lp) || min_lp > kProbSlack)
      return bad(where + ": scale " + std::to_string(scale) + ", minimum log-probability " + std::to_string(min_lp));
    auto logp = [&](int32_t i) { return scale * q[i] + min_lp; };  // as llama-perplexity decodes it
    if (scale > 0) min_exact = std::min<int>(min_exact, static_cast<int>(n_vocab - std::count(q, q + n_vocab, 0)));
    // The top_k by q (the same order as log p): descending, lower id first.
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + b.top_k, order.end(),
                      [&](int32_t x, int32_t y) { return q[x] > q[y] || (q[x] == q[y] && x < y); });
    double psum = 0;
    for (int j = 0; j < b.top_k; j++) {
      const float lp = logp(order[j]);
      if (lp > kProbSlack) return bad(where + ": log-probability " + std::to_string(lp) + " above 0");
      b.top_ids[s * b.top_k + j] = order[j];
      b.top_logp[s * b.top_k + j] = std::min(lp, 0.f);
      psum += std::exp(static_cast<double>(lp));
    }
    if (psum > 1 + kProbSlack) return bad(where + ": probabilities sum to " + std::to_string(psum));
    const uint64_t chunk = s / per_chunk, at = s % per_chunk;
    b.target_logp[s] = std::min(logp(b.tokens[chunk * b.n_ctx + first + at + 1]), 0.f);
  }
  if (std::fgetc(f.get()) != EOF) return bad("bytes after the last record");
  if (min_exact < b.top_k) {  // rows are most likely first: keep each one's head
    const int k = std::max(min_exact, 1);
    for (uint64_t s = 0; s < np; s++) {
      std::copy_n(&b.top_ids[s * b.top_k], k, &b.top_ids[s * k]);
      std::copy_n(&b.top_logp[s * b.top_k], k, &b.top_logp[s * k]);
    }
    b.top_k = k;
    b.top_ids.resize(np * k);
    b.top_logp.resize(np * k);
  }
  return b;
}

}  // namespace phaselab
