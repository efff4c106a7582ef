// The SentencePiece-style tokenizer ("llama" vocabularies): score-ordered
// merges of adjacent pieces over text whose spaces became U+2581, with byte
// fallback (<0xNN>) for characters the vocabulary lacks. Follows llama.cpp's
// behaviour, which the conformance vectors check against the reference.
#include <algorithm>
#include <array>
#include <cstdio>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace phaselab::tok {

namespace {

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
      return render_special || !is_special(id) ? t : std::string();
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

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_spm_tokenizer(const GgufFile& file) {
  auto tok = std::make_unique<SpmTokenizer>();
  PHASELAB_TRY(tok->init(file));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace phaselab::tok
