// A tokenizer's vocabulary from GGUF metadata (tokenizer.ggml.*): token texts,
// scores and types, the special-token ids and flags, and the special tokens
// that converters leave unnamed and are recognised by their text.
#include <algorithm>
#include <limits>

#include "tokenizer/tokenizer_impl.h"

namespace phaselab {

namespace {

using tok::is_special_attr;

constexpr std::string_view kKeyTokens = "tokenizer.ggml.tokens";
constexpr std::string_view kKeyScores = "tokenizer.ggml.scores";
constexpr std::string_view kKeyTypes = "tokenizer.ggml.token_type";

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
    "<|return|>", "<|call|>",
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

// A special-token id of -1, or 0xFFFFFFFF in an unsigned 32-bit key: "none".
bool special_id_is_none(const GgufValue& v) {
  return v.i == -1 || (v.type == GgufValueType::UINT32 && v.u == 0xFFFFFFFFu);
}

}  // namespace

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
  // The harmony format (gpt-oss) ends a reply with <|return|> or <|call|>;
  // its <|end|> closes the reasoning channel, with the answer still to come.
  if (find_token("<|return|>") && find_token("<|call|>"))
    if (auto end = find_token("<|end|>")) eog_.erase(std::remove(eog_.begin(), eog_.end(), *end), eog_.end());

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


}  // namespace phaselab
