// Tokenizers read from GGUF vocabularies:
//  - "llama": SentencePiece-style (score-ordered merges of adjacent pieces,
//    byte fallback <0xNN>, U+2581 as the space marker, add_space_prefix).
//  - "gpt2": byte-level BPE (ranked merges over byte-to-unicode mapped text,
//    pre-tokenized by the regexes chosen by tokenizer.ggml.pre).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "phaselab/gguf.h"
#include "phaselab/status.h"

namespace phaselab {

using TokenId = int32_t;

// tokenizer.ggml.token_type values
enum class TokenAttr : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

class Tokenizer {
 public:
  enum class Kind { spm, bpe };

  // Reads tokenizer.ggml.* from a GGUF file. Unsupported models or
  // pre-tokenizers are refused with a message naming them.
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& file);
  virtual ~Tokenizer() = default;

  // add_special: add BOS (and EOS) as the model's metadata asks.
  // parse_special: text of control / user-defined tokens in the input (e.g.
  // "<start_of_turn>") becomes those tokens instead of being split as text.
  virtual std::vector<TokenId> encode(std::string_view text, bool add_special, bool parse_special) const = 0;

  // The bytes a token stands for (SPM: U+2581 -> ' ', <0xNN> -> that byte;
  // BPE: the byte-level mapping undone). Control tokens give "" unless
  // render_special, in which case their text is given.
  virtual std::string token_to_piece(TokenId id, bool render_special = false) const = 0;
  // The pieces concatenated. For a vocabulary that adds a space prefix on
  // encode (SPM with add_space_prefix), the leading space of the first token
  // after any leading BOS is dropped, so decode(encode(text)) == text. Decode
  // a continuation piece by piece (or with IncrementalDetokenizer) instead.
  std::string decode(const std::vector<TokenId>& ids, bool render_special = false) const;

  Kind kind() const { return kind_; }
  const std::string& pre() const { return pre_; }
  int32_t n_vocab() const { return static_cast<int32_t>(texts_.size()); }
  std::string_view token_text(TokenId id) const;  // raw vocabulary string
  TokenAttr token_attr(TokenId id) const;
  // Not text: a control or unknown token, or a user-defined one written as a
  // marker (<start_of_image>, <|im_start|>: angle brackets around a name with
  // '_' or '|'). GGUF keeps only "user-defined" for a model's added tokens,
  // losing which of them Hugging Face marks special: Gemma 3's
  // <start_of_image> is user-defined like its HTML tags (<table>) and its
  // whitespace runs, which are text. A special token renders as "" unless
  // render_special, so one that a model emits never reaches an answer's text
  // (where it would be saved and read back as that token).
  bool is_special(TokenId id) const;
  std::optional<TokenId> find_token(std::string_view text) const;

  TokenId bos() const { return bos_; }   // -1 when none
  TokenId eos() const { return eos_; }
  TokenId eot() const { return eot_; }
  TokenId unk() const { return unk_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  // End of generation: EOS, EOT, or another end-of-turn control token.
  bool is_eog(TokenId id) const;

  // An upper bound on the input-text bytes one token of encode() stands for
  // (the longest text a token can match, times 2: headroom should encode()
  // ever normalize, which can shrink the text it matches), so that a
  // text of B bytes gives at least B / max_token_text_bytes() tokens: a
  // front end refuses a text too long for the context before tokenizing it
  // (a 40 MB prompt took 19.5 s to tokenize). 0 when no bound holds (a
  // vocabulary that drops bytes it cannot represent). Computed at load.
  size_t max_token_text_bytes() const { return max_token_text_bytes_; }

 protected:
  Tokenizer() = default;
  Kind kind_ = Kind::spm;
  std::string pre_;
  std::vector<std::string> texts_;
  std::vector<float> scores_;
  std::vector<TokenAttr> attrs_;
  TokenId bos_ = -1, eos_ = -1, eot_ = -1, unk_ = -1;
  std::vector<TokenId> eog_;
  bool add_bos_ = false, add_eos_ = false;
  bool add_space_prefix_ = false;  // SPM: a leading U+2581 is added on encode
  size_t max_token_text_bytes_ = 0;

  // Built once by load_vocab(): lookups take string_views without copying.
  struct TextHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, TokenId, TextHash, std::equal_to<>> token_to_id_;

  // Reads tokens, scores, token types and the special-token ids/flags that
  // both kinds share (kind_ must be set first).
  Status load_vocab(const GgufFile& file);

  // Input after special-token splitting: text (token < 0) or one token.
  struct Fragment {
    std::string_view text;
    TokenId token = -1;
  };
  // User-defined tokens are always split out (as Hugging Face does for added
  // tokens); control and unknown ones only when parse_special.
  std::vector<Fragment> split_special(std::string_view text, bool parse_special) const;

 private:
  // eot_, eog_, and the tables for split_special.
  void find_special_tokens(const GgufFile& file);
  // A byte trie over the special texts, to find which of them occur in a
  // text without scanning it once per special token.
  std::unordered_map<uint64_t, int32_t> trie_next_;  // (node << 8 | byte) -> node
  std::vector<TokenId> trie_token_;                  // node -> token ending there, or -1
};

// Turns a stream of token ids into text without ever emitting half a UTF-8
// character: bytes of an incomplete sequence are held until it completes.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tok) : tok_(tok) {}
  // Returns the text that became complete with this token (may be empty).
  std::string push(TokenId id);
  // Whatever is still held (invalid or truncated sequences as U+FFFD).
  std::string flush();
  void reset() { pending_.clear(); }

 private:
  const Tokenizer& tok_;
  std::string pending_;
};

// Length of the longest prefix of s made only of complete UTF-8 sequences.
size_t utf8_complete_prefix(std::string_view s);

}  // namespace phaselab
