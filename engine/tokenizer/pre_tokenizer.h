// The pre-tokenizers of byte-level BPE vocabularies: the regexes that cut a
// text into words before any merge (chosen by tokenizer.ggml.pre), compiled
// with PCRE2. Internal to the engine (not under include/).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "phaselab/status.h"

namespace phaselab::tok {

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

  Status compile(const std::string& pattern);
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
                 std::vector<Span>& chunks, std::vector<Span>& tmp);

struct PreTokenizer {
  std::vector<std::string> regexes;
  bool ignore_merges = false;  // a word that is itself a token is not merged (Llama 3)
  bool add_bos = false;        // default for tokenizer.ggml.add_bos_token
};

// The pre-tokenizer a tokenizer.ggml.pre value names ("" and "default": the
// one llama.cpp applies when none is named); nullopt when unsupported.
std::optional<PreTokenizer> pre_tokenizer_for(std::string_view pre);

}  // namespace phaselab::tok
