// The byte-level BPE tokenizer ("gpt2" vocabularies): the text is cut into
// words by the pre-tokenizer's regexes, each word's bytes are mapped to
// printable code points (GPT-2's byte-to-unicode table), and adjacent pieces
// merge in the order of tokenizer.ggml.merges. Follows llama.cpp's behaviour,
// which the conformance vectors check against the reference.
#include <algorithm>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace phaselab::tok {

namespace {

constexpr std::string_view kKeyPre = "tokenizer.ggml.pre";
constexpr std::string_view kKeyMerges = "tokenizer.ggml.merges";

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
                       " (tokenizer.ggml.pre); supported: default, gpt-2, gpt-4o, llama3/llama-bpe, qwen2, "
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
      return render_special || !is_special(id) ? t : std::string();
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

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_bpe_tokenizer(const GgufFile& file) {
  auto tok = std::make_unique<BpeTokenizer>();
  PHASELAB_TRY(tok->init(file));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace phaselab::tok
