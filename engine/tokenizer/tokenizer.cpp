// SentencePiece-style and byte-level BPE tokenizers over GGUF vocabularies:
// the choice between them, what both share on encode (special-token
// splitting) and decode, and streaming detokenization. The kinds themselves
// are spm_tokenizer.cpp and bpe_tokenizer.cpp, the vocabulary vocab.cpp.
//
// Both follow the behaviour of llama.cpp's tokenizers (which the conformance
// vectors in tests/data/tokenizer-vectors check against the reference Hugging
// Face tokenizers), so that a model sees exactly the ids it was trained on.
#include "phaselab/tokenizer.h"

#include <algorithm>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace phaselab {

namespace {

using tok::is_special_attr;

constexpr std::string_view kKeyModel = "tokenizer.ggml.model";

}  // namespace

std::string tok::quoted(std::string_view s) {
  // (Built by appending: "'" + std::string(s) draws a false -Wrestrict from GCC 12.)
  std::string q;
  q.reserve(s.size() + 2);
  q.append(1, '\'').append(s).append(1, '\'');
  return q;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& file) {
  const auto model = file.get_string(kKeyModel);
  if (!model) return invalid_file(std::string(kKeyModel) + " is missing or not a string: the file has no tokenizer");
  if (*model == "llama" || *model == "gpt2") {
    auto tok = *model == "llama" ? tok::load_spm_tokenizer(file) : tok::load_bpe_tokenizer(file);
    if (!tok) return tok.status().with_context("tokenizer");
    return tok;
  }
  return unsupported("tokenizer: unsupported tokenizer model " + tok::quoted(*model) + " (" + std::string(kKeyModel) +
                     "); PhaseLab reads 'llama' (SentencePiece) and 'gpt2' (byte-level BPE)");
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

namespace {
// <name> where name is letters, digits, '_' and '|' and holds a '_' or a
// '|': the way models write their markers, and never an HTML tag.
bool looks_like_marker(std::string_view t) {
  if (t.size() < 3 || t.front() != '<' || t.back() != '>') return false;
  bool separator = false;
  for (char c : t.substr(1, t.size() - 2)) {
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (c == '_' || c == '|')
      separator = true;
    else if (!word)
      return false;
  }
  return separator;
}
}  // namespace

bool Tokenizer::is_special(TokenId id) const {
  switch (token_attr(id)) {
    case TokenAttr::control:
    case TokenAttr::unknown:
      return true;
    case TokenAttr::user_defined:
      return looks_like_marker(texts_[id]);
    default:
      return false;
  }
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
