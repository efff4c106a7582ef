// The BPE pre-tokenizers: which regexes each tokenizer.ggml.pre applies, and
// the split they drive.
#include "tokenizer/pre_tokenizer.h"

#include "tokenizer/tokenizer_impl.h"

namespace phaselab::tok {

Status Regex::compile(const std::string& pattern) {
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

// The regexes are those of the models' tokenizer.json, with case-insensitive
// groups spelled out; sequences are applied in order (see regex_split).
const char* const kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// o200k (gpt-4o, gpt-oss, Llama 4): words split at case changes, with their
// contractions; numbers in threes.
const char* const kGpt4oRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
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
  if (pre == "gpt-4o" || pre == "llama4") {
    return PreTokenizer{{kGpt4oRegex}};
  }
  if (pre == "deepseek-coder") {
    // CJK ideographs, U+0800..U+4E00 and Hangul are kept together by the 4th.
    return PreTokenizer{{R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)",
                         R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)", R"(\p{N})"}};
  }
  return std::nullopt;
}

}  // namespace phaselab::tok
