// SentencePiece-style and byte-level BPE tokenizers over GGUF vocabularies.
//
// Both follow the behaviour of llama.cpp's tokenizers (which the conformance
// vectors in tests/data/tokenizer-vectors check against the reference Hugging
// Face tokenizers), so that a model sees exactly the ids it was trained on.
#include "phaselab/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/unicode.h"

namespace phaselab {

namespace {

constexpr std::string_view kKeyModel = "tokenizer.ggml.model";
constexpr std::string_view kKeyPre = "tokenizer.ggml.pre";
constexpr std::string_view kKeyTokens = "tokenizer.ggml.tokens";
constexpr std::string_view kKeyScores = "tokenizer.ggml.scores";
constexpr std::string_view kKeyTypes = "tokenizer.ggml.token_type";
constexpr std::string_view kKeyMerges = "tokenizer.ggml.merges";

// GGUF converters record few special-token roles, so (like llama.cpp) some
// are recognised by their text. Every token found this way is treated as a
// control token, whatever its declared type, so that it is only parsed from
// input with parse_special and renders as "" by default, as llama.cpp does.
//
// End of turn, in order of preference for eot().
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
};
// Anything that ends generation.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<｜end▁of▁sentence｜>",
};
// Fill-in-the-middle markers by role; the metadata key names the role's id
// when the converter wrote it (then the texts are not consulted). Padding,
// repository and file-separator markers also end generation.
struct FimRole {
  const char* key;
  bool eog;
  std::vector<std::string_view> texts;
};
const FimRole kFimRoles[] = {
    {"tokenizer.ggml.fim_pre_token_id", false,
     {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
      "<|prefix|>"}},
    {"tokenizer.ggml.fim_suf_token_id", false,
     {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>",
      "<|suffix|>"}},
    {"tokenizer.ggml.fim_mid_token_id", false,
     {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
      "<|middle|>"}},
    {"tokenizer.ggml.fim_pad_token_id", true, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}},
    {"tokenizer.ggml.fim_rep_token_id", true, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
    {"tokenizer.ggml.fim_sep_token_id", true, {"<|file_sep|>"}},
};

bool is_special_attr(TokenAttr a) {
  return a == TokenAttr::control || a == TokenAttr::user_defined || a == TokenAttr::unknown;
}

std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

// ---- regex ------------------------------------------------------------------

// A compiled PCRE2 pattern. PCRE2_MATCH_INVALID_UTF lets ill-formed input
// through: invalid bytes never match, so they land in the gaps between
// matches and are still byte-encoded, instead of failing the whole call.
class Regex {
 public:
  Regex() = default;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  Regex(Regex&& o) noexcept : code_(o.code_) { o.code_ = nullptr; }
  ~Regex() {
    if (code_) pcre2_code_free(code_);
  }

  Status compile(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
    if (!code_) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof(buf));
      return internal_error("pre-tokenizer regex " + quoted(pattern) + " does not compile at offset " +
                            std::to_string(err_off) + ": " + reinterpret_cast<const char*>(buf));
    }
    // The interpreter re-validates the UTF-8 of the rest of the subject on
    // every call, which is quadratic over a long chunk; the JIT does not.
    // Without JIT support the interpreter still gives the same results.
    (void)pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
    return Status::ok();
  }
  const pcre2_code* code() const { return code_; }

 private:
  pcre2_code* code_ = nullptr;
};

struct MatchData {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  MatchData() = default;
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  ~MatchData() { pcre2_match_data_free(md); }
};

// A byte range of the text being pre-tokenized.
struct Span {
  uint32_t off, len;
};

// Applies each regex in turn to every chunk the previous ones produced; both
// the matches and the text between them become chunks (Hugging Face's
// "Isolated" split behaviour, as llama.cpp implements it).
void regex_split(std::string_view text, const std::vector<Regex>& regexes, MatchData& m,
                 std::vector<Span>& chunks, std::vector<Span>& tmp) {
  chunks.clear();
  if (text.empty()) return;
  chunks.push_back({0, static_cast<uint32_t>(text.size())});
  for (const Regex& re : regexes) {
    tmp.clear();
    for (const Span c : chunks) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + c.off);
      size_t start = 0, prev = 0;
      while (start < c.len) {
        int rc = pcre2_match(re.code(), subject, c.len, start, 0, m.md, nullptr);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
          // Pathological input for the JIT's small stack: the interpreter
          // keeps its backtracking state on the heap.
          rc = pcre2_match(re.code(), subject, c.len, start, PCRE2_NO_JIT, m.md, nullptr);
        }
        if (rc < 0) break;  // no match (or a resource limit): the rest is one gap
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
        const size_t ms = ov[0], me = ov[1];
        if (me == ms) {
          // Empty match: step one character on (none of our patterns does this).
          start = ms + 1;
          while (start < c.len && (subject[start] & 0xC0) == 0x80) start++;
          continue;
        }
        if (ms > prev) tmp.push_back({static_cast<uint32_t>(c.off + prev), static_cast<uint32_t>(ms - prev)});
        tmp.push_back({static_cast<uint32_t>(c.off + ms), static_cast<uint32_t>(me - ms)});
        prev = start = me;
      }
      if (prev < c.len) tmp.push_back({static_cast<uint32_t>(c.off + prev), static_cast<uint32_t>(c.len - prev)});
    }
    chunks.swap(tmp);
  }
}

// ---- pre-tokenizers -----------------------------------------------------------

struct PreTokenizer {
  std::vector<std::string> regexes;
  bool ignore_merges = false;  // a word that is itself a token is not merged (Llama 3)
  bool add_bos = false;        // default for tokenizer.ggml.add_bos_token
};

// The regexes are those of the models' tokenizer.json, with case-insensitive
// groups spelled out; sequences are applied in order (see regex_split).
const char* const kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::optional<PreTokenizer> pre_tokenizer_for(std::string_view pre) {
  // "default" is what llama.cpp applies to BPE vocabularies that name no
  // pre-tokenizer.
  if (pre.empty() || pre == "default") {
    return PreTokenizer{{R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Regex, R"(\p{N}+)", "[0-9][0-9][0-9]"}};
  }
  if (pre == "gpt-2" || pre == "phi-2" || pre == "mpt" || pre == "olmo") {
    return PreTokenizer{{kGpt2Regex}};
  }
  if (pre == "starcoder" || pre == "refact" || pre == "smollm" || pre == "command-r") {
    return PreTokenizer{{R"(\p{N})", kGpt2Regex}};
  }
  if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3") {
    return PreTokenizer{{kLlama3Regex}, /*ignore_merges=*/true, /*add_bos=*/true};
  }
  if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "stablelm2") {
    return PreTokenizer{{kQwen2Regex}};
  }
  if (pre == "deepseek-coder") {
    // CJK ideographs, U+0800..U+4E00 and Hangul are kept together by the 4th.
    return PreTokenizer{{R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)",
                         R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)", R"(\p{N})"}};
  }
  return std::nullopt;
}

// ---- SentencePiece ------------------------------------------------------------

class SpmTokenizer final : public Tokenizer {
 public:
  Status init(const GgufFile& file);
  std::vector<TokenId> encode(std::string_view text, bool add_special, bool parse_special) const override;
  std::string token_to_piece(TokenId id, bool render_special) const override;

 private:
  struct Symbol {
    int32_t prev, next;
    uint32_t off, n;  // bytes of the escaped text; n == 0 once merged away
  };
  struct Bigram {
    int32_t left, right;
    float score;
    uint32_t size;
  };
  struct Scratch {
    std::string text;
    std::vector<Symbol> symbols;
    std::vector<Bigram> heap;
  };
  void encode_piece(Scratch& s, std::vector<TokenId>& out) const;
  void try_add_bigram(Scratch& s, int32_t left, int32_t right) const;
  void emit_bytes(std::string_view piece, std::vector<TokenId>& out) const;

  std::array<TokenId, 256> byte_token_{};  // <0xNN> tokens, or -1
};

// Heap order: highest score on top; on equal scores the leftmost pair.
bool bigram_less(const auto& l, const auto& r) {
  return l.score < r.score || (l.score == r.score && l.left > r.left);
}

// The merge loop both tokenizers share: symbols form a linked list (n bytes
// each, prev/next), candidate pairs sit in a heap ordered by cmp. Pop the
// best pair, skip it if stale, merge, and queue the new neighbour pairs.
template <typename Scratch, typename Cmp, typename TryAdd>
void merge_symbols(Scratch& s, Cmp cmp, TryAdd try_add) {
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), cmp);
    const auto bg = s.heap.back();
    s.heap.pop_back();
    auto& l = s.symbols[bg.left];
    auto& r = s.symbols[bg.right];
    // Stale entry: one side was merged since. Sizes only grow, so an
    // unchanged total means both sides are as they were when queued.
    if (l.n == 0 || r.n == 0 || l.n + r.n != bg.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) s.symbols[r.next].prev = bg.left;
    try_add(l.prev, bg.left);
    try_add(bg.left, l.next);
  }
}

Status SpmTokenizer::init(const GgufFile& file) {
  kind_ = Kind::spm;
  add_bos_ = true;
  add_space_prefix_ = true;
  PHASELAB_TRY(load_vocab(file));
  for (int b = 0; b < 256; b++) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = token_to_id_.find(std::string_view(name));
    byte_token_[b] = it == token_to_id_.end() ? -1 : it->second;
  }
  // A token matches its own text in the escaped input, where an input space
  // became U+2581 (3 bytes for 1) but a literal U+2581 stayed itself (3 for
  // 3): only the raw length bounds both. Special tokens match raw text too;
  // byte fallback and <unk> stand for 1 byte each.
  const bool drops_bytes =
      unk_ < 0 && std::any_of(byte_token_.begin(), byte_token_.end(), [](TokenId id) { return id < 0; });
  size_t longest = 1;
  for (const std::string& t : texts_) longest = std::max(longest, t.size());
  max_token_text_bytes_ = drops_bytes ? 0 : 2 * longest;
  return Status::ok();
}

void SpmTokenizer::try_add_bigram(Scratch& s, int32_t left, int32_t right) const {
  if (left < 0 || right < 0) return;
  const Symbol& l = s.symbols[left];
  const Symbol& r = s.symbols[right];
  // Symbols in the chain are always adjacent in the text, so the pair is a
  // contiguous substring: look it up without building a string.
  const std::string_view pair(s.text.data() + l.off, l.n + r.n);
  auto it = token_to_id_.find(pair);
  if (it == token_to_id_.end()) return;
  s.heap.push_back({left, right, scores_[it->second], static_cast<uint32_t>(pair.size())});
  std::push_heap(s.heap.begin(), s.heap.end(), [](const Bigram& a, const Bigram& b) { return bigram_less(a, b); });
}

void SpmTokenizer::emit_bytes(std::string_view piece, std::vector<TokenId>& out) const {
  for (char c : piece) {
    const auto b = static_cast<uint8_t>(c);
    TokenId id = byte_token_[b];
    if (id < 0) {
      // Vocabularies without byte tokens may still hold the raw byte.
      auto it = token_to_id_.find(std::string_view(&c, 1));
      id = it != token_to_id_.end() ? it->second : unk_;
    }
    if (id >= 0) out.push_back(id);
  }
}

void SpmTokenizer::encode_piece(Scratch& s, std::vector<TokenId>& out) const {
  const std::string& text = s.text;
  if (text.empty()) return;
  s.symbols.clear();
  s.heap.clear();
  // One symbol per UTF-8 character (lead-byte length, not validated, so
  // malformed input still degrades to byte tokens).
  for (size_t off = 0; off < text.size();) {
    const size_t n = std::min(unicode::lead_length(static_cast<uint8_t>(text[off])), text.size() - off);
    const auto idx = static_cast<int32_t>(s.symbols.size());
    s.symbols.push_back({idx - 1, off + n == text.size() ? -1 : idx + 1, static_cast<uint32_t>(off),
                         static_cast<uint32_t>(n)});
    off += n;
  }
  for (int32_t i = 1; i < static_cast<int32_t>(s.symbols.size()); i++) try_add_bigram(s, i - 1, i);

  const auto cmp = [](const Bigram& a, const Bigram& b) { return bigram_less(a, b); };
  merge_symbols(s, cmp, [&](int32_t left, int32_t right) { try_add_bigram(s, left, right); });

  // Every merged symbol is a vocabulary token by construction; only single
  // characters can be missing, and those fall back to bytes.
  for (int32_t i = 0; i != -1; i = s.symbols[i].next) {
    const Symbol& sym = s.symbols[i];
    const std::string_view piece(text.data() + sym.off, sym.n);
    auto it = token_to_id_.find(piece);
    if (it != token_to_id_.end()) out.push_back(it->second);
    else emit_bytes(piece, out);
  }
}

std::vector<TokenId> SpmTokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && add_bos_) out.push_back(bos_);
  Scratch s;
  // As llama.cpp: the space prefix goes on a text fragment at the start and
  // on one right after a special token.
  bool prev_special = true;
  for (const Fragment& f : split_special(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    s.text.clear();
    if (add_space_prefix_ && prev_special) s.text.append(unicode::kSpaceMarker);
    for (char c : f.text) {
      if (c == ' ') s.text.append(unicode::kSpaceMarker);
      else s.text.push_back(c);
    }
    encode_piece(s, out);
    prev_special = false;
  }
  if (add_special && add_eos_) out.push_back(eos_);
  return out;
}

std::string SpmTokenizer::token_to_piece(TokenId id, bool render_special) const {
  const TokenAttr a = token_attr(id);
  if (id < 0 || id >= n_vocab()) return {};
  const std::string& t = texts_[id];
  switch (a) {
    case TokenAttr::control:
    case TokenAttr::unknown:
      return render_special ? t : std::string();
    case TokenAttr::user_defined:
      return t;
    case TokenAttr::normal: {
      std::string piece = t;
      unicode::unescape_spaces(piece);
      return piece;
    }
    case TokenAttr::byte: {
      unsigned v = 0;
      if (t.size() == 6 && std::sscanf(t.c_str(), "<0x%2X>", &v) == 1) return std::string(1, static_cast<char>(v));
      return t;
    }
    default:  // unused / undefined render as nothing, as in llama.cpp
      return {};
  }
}

// ---- byte-level BPE -----------------------------------------------------------

class BpeTokenizer final : public Tokenizer {
 public:
  Status init(const GgufFile& file);
  std::vector<TokenId> encode(std::string_view text, bool add_special, bool parse_special) const override;
  std::string token_to_piece(TokenId id, bool render_special) const override;

 private:
  struct Symbol {
    int32_t prev, next;
    uint32_t off, n;
  };
  struct Bigram {
    int32_t left, right;
    int32_t rank;
    uint32_t size;
  };
  struct Scratch {
    std::string word;  // byte-level encoded chunk
    std::string key;   // "left right" merge lookup key
    std::vector<Symbol> symbols;
    std::vector<Bigram> heap;
    std::vector<Span> chunks, tmp;
    MatchData match;
  };
  void encode_fragment(std::string_view text, Scratch& s, std::vector<TokenId>& out) const;
  void encode_word(Scratch& s, std::vector<TokenId>& out) const;
  void try_add_bigram(Scratch& s, int32_t left, int32_t right) const;

  std::unordered_map<std::string, int32_t, TextHash, std::equal_to<>> merge_rank_;  // "a b" -> rank
  std::vector<Regex> regexes_;
  bool ignore_merges_ = false;
};

Status BpeTokenizer::init(const GgufFile& file) {
  kind_ = Kind::bpe;
  const auto pre = file.get_string(kKeyPre);
  pre_ = pre ? std::string(*pre) : std::string("default");
  const auto cfg = pre_tokenizer_for(pre_);
  if (!cfg) {
    return unsupported("unsupported pre-tokenizer " + quoted(pre_) +
                       " (tokenizer.ggml.pre); supported: default, gpt-2, llama3/llama-bpe, qwen2, "
                       "deepseek-coder, starcoder and a few aliases");
  }
  ignore_merges_ = cfg->ignore_merges;
  add_bos_ = cfg->add_bos;
  add_space_prefix_ = false;
  for (const std::string& pattern : cfg->regexes) {
    Regex re;
    PHASELAB_TRY(re.compile(pattern));
    regexes_.push_back(std::move(re));
  }
  PHASELAB_TRY(load_vocab(file));

  const GgufValue* merges = file.find(kKeyMerges);
  if (!merges) return invalid_file("tokenizer.ggml.merges is missing (a gpt2 vocabulary needs its BPE merges)");
  if (merges->type != GgufValueType::ARRAY || merges->elem_type != GgufValueType::STRING) {
    return invalid_file("tokenizer.ggml.merges is not an array of strings");
  }
  merge_rank_.reserve(merges->strings.size());
  for (size_t i = 0; i < merges->strings.size(); i++) {
    const std::string_view m = merges->strings[i];
    // "left right"; a space at index 0 would belong to the left part.
    const size_t sp = m.find(' ', 1);
    if (sp == std::string_view::npos) {
      return invalid_file("tokenizer.ggml.merges[" + std::to_string(i) + "] = " + quoted(m) +
                          " is not of the form 'left right'");
    }
    merge_rank_.emplace(std::string(m), static_cast<int32_t>(i));  // first occurrence wins
  }
  // Ordinary tokens match byte-level mapped text, one code point per input
  // byte (gpt2_decode's length); special ones match their raw text. A byte
  // whose mapped code point is no token (nor <unk>) is dropped by
  // encode_word, and then no bound holds.
  bool drops_bytes = false;
  for (int b = 0; b < 256 && unk_ < 0 && !drops_bytes; b++)
    drops_bytes = !token_to_id_.contains(unicode::gpt2_byte_to_utf8(static_cast<uint8_t>(b)));
  size_t longest = 1;
  std::string piece;
  for (TokenId id = 0; id < n_vocab(); id++) {
    const std::string& t = texts_[id];
    if (is_special_attr(attrs_[id])) {
      longest = std::max(longest, t.size());
      continue;
    }
    piece.clear();
    unicode::gpt2_decode(t, piece);
    longest = std::max(longest, piece.size());
  }
  max_token_text_bytes_ = drops_bytes ? 0 : 2 * longest;
  return Status::ok();
}

void BpeTokenizer::try_add_bigram(Scratch& s, int32_t left, int32_t right) const {
  if (left < 0 || right < 0) return;
  const Symbol& l = s.symbols[left];
  const Symbol& r = s.symbols[right];
  s.key.assign(s.word, l.off, l.n);
  s.key.push_back(' ');
  s.key.append(s.word, r.off, r.n);
  auto it = merge_rank_.find(std::string_view(s.key));
  if (it == merge_rank_.end()) return;
  s.heap.push_back({left, right, it->second, l.n + r.n});
  // Lowest rank first; on equal ranks the leftmost pair.
  std::push_heap(s.heap.begin(), s.heap.end(), [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  });
}

void BpeTokenizer::encode_word(Scratch& s, std::vector<TokenId>& out) const {
  const std::string& w = s.word;
  if (w.empty()) return;
  if (ignore_merges_) {
    auto it = token_to_id_.find(std::string_view(w));
    if (it != token_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  s.symbols.clear();
  s.heap.clear();
  for (size_t off = 0; off < w.size();) {
    const size_t n = std::min(unicode::lead_length(static_cast<uint8_t>(w[off])), w.size() - off);
    const auto idx = static_cast<int32_t>(s.symbols.size());
    s.symbols.push_back({idx - 1, off + n == w.size() ? -1 : idx + 1, static_cast<uint32_t>(off),
                         static_cast<uint32_t>(n)});
    off += n;
  }
  for (int32_t i = 1; i < static_cast<int32_t>(s.symbols.size()); i++) try_add_bigram(s, i - 1, i);

  const auto cmp = [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  merge_symbols(s, cmp, [&](int32_t left, int32_t right) { try_add_bigram(s, left, right); });

  for (int32_t i = 0; i != -1; i = s.symbols[i].next) {
    const Symbol& sym = s.symbols[i];
    const std::string_view piece(w.data() + sym.off, sym.n);
    auto it = token_to_id_.find(piece);
    if (it != token_to_id_.end()) {
      out.push_back(it->second);
      continue;
    }
    // A merge whose result is not in the vocabulary (malformed vocab): fall
    // back to one token per mapped byte.
    for (size_t k = 0; k < piece.size();) {
      const size_t n = std::min(unicode::lead_length(static_cast<uint8_t>(piece[k])), piece.size() - k);
      auto ct = token_to_id_.find(piece.substr(k, n));
      if (ct != token_to_id_.end()) out.push_back(ct->second);
      else if (unk_ >= 0) out.push_back(unk_);
      k += n;
    }
  }
}

void BpeTokenizer::encode_fragment(std::string_view text, Scratch& s, std::vector<TokenId>& out) const {
  regex_split(text, regexes_, s.match, s.chunks, s.tmp);
  for (const Span c : s.chunks) {
    s.word.clear();
    unicode::gpt2_encode(text.substr(c.off, c.len), s.word);
    encode_word(s, out);
  }
}

std::vector<TokenId> BpeTokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && add_bos_) out.push_back(bos_);
  Scratch s;
  for (const Fragment& f : split_special(text, parse_special)) {
    if (f.token >= 0) out.push_back(f.token);
    else encode_fragment(f.text, s, out);
  }
  if (add_special && add_eos_) out.push_back(eos_);
  return out;
}

std::string BpeTokenizer::token_to_piece(TokenId id, bool render_special) const {
  const TokenAttr a = token_attr(id);
  if (id < 0 || id >= n_vocab()) return {};
  const std::string& t = texts_[id];
  switch (a) {
    case TokenAttr::control:
    case TokenAttr::unknown:
      return render_special ? t : std::string();
    case TokenAttr::user_defined:
      return t;
    case TokenAttr::normal:
    case TokenAttr::byte: {
      std::string piece;
      piece.reserve(t.size());
      unicode::gpt2_decode(t, piece);
      return piece;
    }
    default:
      return {};
  }
}

// ---- GGUF helpers ---------------------------------------------------------------

// A special-token id of -1, or 0xFFFFFFFF in an unsigned 32-bit key: "none".
bool special_id_is_none(const GgufValue& v) {
  return v.i == -1 || (v.type == GgufValueType::UINT32 && v.u == 0xFFFFFFFFu);
}

}  // namespace

// ---- Tokenizer (shared) ---------------------------------------------------------

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& file) {
  const auto model = file.get_string(kKeyModel);
  if (!model) return invalid_file(std::string(kKeyModel) + " is missing or not a string: the file has no tokenizer");
  if (*model == "llama") {
    auto tok = std::make_unique<SpmTokenizer>();
    if (Status st = tok->init(file); !st) return st.with_context("tokenizer");
    return std::unique_ptr<Tokenizer>(std::move(tok));
  }
  if (*model == "gpt2") {
    auto tok = std::make_unique<BpeTokenizer>();
    if (Status st = tok->init(file); !st) return st.with_context("tokenizer");
    return std::unique_ptr<Tokenizer>(std::move(tok));
  }
  return unsupported("tokenizer: unsupported tokenizer model " + quoted(*model) + " (" + std::string(kKeyModel) +
                     "); PhaseLab reads 'llama' (SentencePiece) and 'gpt2' (byte-level BPE)");
}

Status Tokenizer::load_vocab(const GgufFile& file) {
  const GgufValue* tokens = file.find(kKeyTokens);
  if (!tokens) return invalid_file(std::string(kKeyTokens) + " is missing");
  if (tokens->type != GgufValueType::ARRAY || tokens->elem_type != GgufValueType::STRING) {
    return invalid_file(std::string(kKeyTokens) + " is not an array of strings");
  }
  const size_t n = tokens->strings.size();
  if (n == 0) return invalid_file(std::string(kKeyTokens) + " is empty");
  if (n > static_cast<size_t>(std::numeric_limits<TokenId>::max())) {
    return invalid_file(std::string(kKeyTokens) + " has " + std::to_string(n) + " entries, more than a token id can hold");
  }
  texts_.assign(tokens->strings.begin(), tokens->strings.end());

  // GGUF's tokenizer arrays have fixed element types (scores float32,
  // token_type int32) and one entry per token; anything else is refused
  // rather than converted.
  auto check_array = [&](std::string_view key, const GgufValue* v, GgufValueType elem) -> Status {
    if (v->type != GgufValueType::ARRAY || v->elem_type != elem) {
      const std::string found = v->type == GgufValueType::ARRAY
                                    ? "an array of " + std::string(gguf_value_type_name(v->elem_type))
                                    : "a " + std::string(gguf_value_type_name(v->type));
      return invalid_file(std::string(key) + " must be an array of " + std::string(gguf_value_type_name(elem)) +
                          " (found " + found + ")");
    }
    if (v->count != n) {
      return invalid_file(std::string(key) + " has " + std::to_string(v->count) + " entries but " +
                          std::string(kKeyTokens) + " has " + std::to_string(n));
    }
    return Status::ok();
  };

  scores_.assign(n, 0.0f);
  if (const GgufValue* sc = file.find(kKeyScores)) {
    PHASELAB_TRY(check_array(kKeyScores, sc, GgufValueType::FLOAT32));
    for (size_t i = 0; i < n; i++) scores_[i] = static_cast<float>(sc->float_at(i));
  } else if (kind_ == Kind::spm) {
    return invalid_file(std::string(kKeyScores) + " is missing (a SentencePiece vocabulary merges by score)");
  }

  attrs_.assign(n, TokenAttr::normal);
  if (const GgufValue* ty = file.find(kKeyTypes)) {
    PHASELAB_TRY(check_array(kKeyTypes, ty, GgufValueType::INT32));
    for (size_t i = 0; i < n; i++) {
      const int64_t v = ty->int_at(i);
      attrs_[i] = (v >= 0 && v <= 6) ? static_cast<TokenAttr>(v) : TokenAttr::undefined;
    }
  }

  // Every special-token id the file names (tokenizer.ggml.*_token_id) must
  // be a token of the vocabulary. -1 (also written as the uint32 0xFFFFFFFF)
  // is the converters' "none" and stands for an absent key.
  const auto nt = static_cast<int64_t>(n);
  for (const auto& [key, v] : file.metadata()) {
    const std::string_view k = key;
    if (k.substr(0, 15) != "tokenizer.ggml." || k.size() < 9 || k.substr(k.size() - 9) != "_token_id") continue;
    if (!v.is_integer()) {
      return invalid_file(key + " must be an integer token id (found " + std::string(gguf_value_type_name(v.type)) + ")");
    }
    if (special_id_is_none(v)) continue;
    if (v.i < 0 || v.i >= nt) {
      return invalid_file(key + " = " + v.to_string(0) + " is outside the vocabulary (" + std::to_string(n) +
                          " tokens, ids 0.." + std::to_string(n - 1) + ")");
    }
  }

  token_to_id_.clear();
  token_to_id_.reserve(n);
  for (size_t i = 0; i < n; i++) {
    if (texts_[i].empty()) continue;  // never matchable; would also break special splitting
    token_to_id_.insert_or_assign(texts_[i], static_cast<TokenId>(i));  // last duplicate wins, as llama.cpp
  }

  auto read_id = [&](const char* key, TokenId fallback) -> TokenId {
    // Checked above: present ids are in range or "none".
    if (const GgufValue* v = file.find(key)) return special_id_is_none(*v) ? -1 : static_cast<TokenId>(v->i);
    return fallback >= 0 && fallback < nt ? fallback : -1;
  };
  const bool spm = kind_ == Kind::spm;
  bos_ = read_id("tokenizer.ggml.bos_token_id", spm ? 1 : -1);
  eos_ = read_id("tokenizer.ggml.eos_token_id", spm ? 2 : -1);
  unk_ = read_id("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
  eot_ = read_id("tokenizer.ggml.eot_token_id", -1);

  if (auto v = file.get_bool("tokenizer.ggml.add_bos_token")) add_bos_ = *v;
  if (auto v = file.get_bool("tokenizer.ggml.add_eos_token")) add_eos_ = *v;
  if (spm) {
    if (auto v = file.get_bool("tokenizer.ggml.add_space_prefix")) add_space_prefix_ = *v;
  }
  if (bos_ < 0) add_bos_ = false;
  if (eos_ < 0) add_eos_ = false;

  find_special_tokens(file);
  return Status::ok();
}

void Tokenizer::find_special_tokens(const GgufFile& file) {
  const int64_t n = n_vocab();
  auto meta_id = [&](const char* key) -> TokenId {
    if (auto v = file.get_int(key); v && *v >= 0 && *v < n) return static_cast<TokenId>(*v);
    return -1;
  };
  eog_.clear();
  auto add_eog = [&](TokenId id) {
    if (id >= 0 && std::find(eog_.begin(), eog_.end(), id) == eog_.end()) eog_.push_back(id);
  };
  auto mark_control = [&](TokenId id) { attrs_[id] = TokenAttr::control; };

  if (eot_ < 0) {
    for (std::string_view t : kEotTexts) {
      if (auto id = find_token(t)) {
        eot_ = *id;
        mark_control(eot_);
        break;
      }
    }
  }
  TokenId eom = meta_id("tokenizer.ggml.eom_token_id");
  if (eom < 0) {
    if (auto id = find_token("<|eom_id|>")) mark_control(eom = *id);
  }
  for (const FimRole& role : kFimRoles) {
    TokenId id = meta_id(role.key);
    for (size_t k = 0; id < 0 && k < role.texts.size(); k++) {
      if (auto found = find_token(role.texts[k])) mark_control(id = *found);
    }
    if (role.eog) add_eog(id);
  }
  for (std::string_view t : kEogTexts) {
    if (auto id = find_token(t)) {
      mark_control(*id);
      add_eog(*id);
    }
  }
  add_eog(eos_);
  add_eog(eot_);
  add_eog(eom);

  // Trie over every special text (node 0 is the root).
  trie_next_.clear();
  trie_token_.assign(1, -1);
  for (TokenId id = 0; id < n_vocab(); id++) {
    if (!is_special_attr(attrs_[id]) || texts_[id].empty()) continue;
    int32_t node = 0;
    for (char c : texts_[id]) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
      auto [it, inserted] = trie_next_.try_emplace(key, static_cast<int32_t>(trie_token_.size()));
      if (inserted) trie_token_.push_back(-1);
      node = it->second;
    }
    // Duplicate texts: keep the id token_to_id_ maps to.
    trie_token_[node] = token_to_id_.find(std::string_view(texts_[id]))->second;
  }
}

std::vector<Tokenizer::Fragment> Tokenizer::split_special(std::string_view text, bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({text, -1});
  if (trie_next_.empty()) return frags;

  auto allowed = [&](TokenId id) {
    const TokenAttr a = attrs_[id];
    return a == TokenAttr::user_defined || (parse_special && is_special_attr(a));
  };
  // Which special tokens occur at all.
  std::vector<TokenId> found;
  for (size_t i = 0; i < text.size(); i++) {
    int32_t node = 0;
    for (size_t j = i; j < text.size(); j++) {
      auto it = trie_next_.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[j]));
      if (it == trie_next_.end()) break;
      node = it->second;
      const TokenId id = trie_token_[node];
      if (id >= 0 && allowed(id)) found.push_back(id);
    }
  }
  if (found.empty()) return frags;
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  // Longest first, each splitting every remaining text fragment (llama.cpp's
  // order, which decides overlapping matches).
  std::stable_sort(found.begin(), found.end(),
                   [&](TokenId a, TokenId b) { return texts_[a].size() > texts_[b].size(); });

  std::vector<Fragment> next;
  for (TokenId id : found) {
    const std::string_view tok = texts_[id];
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t from = 0;
      for (size_t m = f.text.find(tok); m != std::string_view::npos; m = f.text.find(tok, from)) {
        if (m > from) next.push_back({f.text.substr(from, m - from), -1});
        next.push_back({{}, id});
        from = m + tok.size();
      }
      if (from < f.text.size()) next.push_back({f.text.substr(from), -1});
    }
    frags.swap(next);
  }
  return frags;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids, bool render_special) const {
  std::string out;
  size_t first = 0;
  while (first < ids.size() && ids[first] == bos_) first++;
  for (size_t i = 0; i < ids.size(); i++) {
    std::string piece = token_to_piece(ids[i], render_special);
    // Undo the space prefix encode() added (only a normal token carries it).
    if (i == first && add_space_prefix_ && token_attr(ids[i]) == TokenAttr::normal && !piece.empty() &&
        piece[0] == ' ') {
      piece.erase(0, 1);
    }
    out += piece;
  }
  return out;
}

std::string_view Tokenizer::token_text(TokenId id) const {
  if (id < 0 || id >= n_vocab()) return {};
  return texts_[id];
}

TokenAttr Tokenizer::token_attr(TokenId id) const {
  if (id < 0 || id >= n_vocab()) return TokenAttr::undefined;
  return attrs_[id];
}

std::optional<TokenId> Tokenizer::find_token(std::string_view text) const {
  auto it = token_to_id_.find(text);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_eog(TokenId id) const {
  return id >= 0 && std::find(eog_.begin(), eog_.end(), id) != eog_.end();
}

// ---- streaming detokenization ------------------------------------------------------

size_t utf8_complete_prefix(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const unicode::Utf8Step st = unicode::utf8_step(s, pos);
    if (st.kind != unicode::Utf8Step::complete) break;
    pos += st.len;
  }
  return pos;
}

std::string IncrementalDetokenizer::push(TokenId id) {
  pending_ += tok_.token_to_piece(id);
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const unicode::Utf8Step st = unicode::utf8_step(pending_, pos);
    if (st.kind == unicode::Utf8Step::truncated) break;  // may still complete: hold it
    if (st.kind == unicode::Utf8Step::complete) out.append(pending_, pos, st.len);
    else out.append(unicode::kReplacement);  // can never become valid
    pos += st.len;
  }
  pending_.erase(0, pos);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = unicode::sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace phaselab
