// UTF-8 helpers and the GPT-2 byte <-> unicode mapping used by the tokenizers.
// Internal to the engine (not under include/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace phaselab::unicode {

// U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's visible space marker.
inline constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";
// U+FFFD REPLACEMENT CHARACTER.
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Length of the sequence a lead byte announces, without validating anything
// (continuation bytes count as 1). SentencePiece-style splitting uses exactly
// this so that malformed input still yields one symbol per "character" and
// ends up as byte-fallback tokens instead of being rejected.
inline size_t lead_length(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// One step of strict UTF-8 decoding at s[pos].
struct Utf8Step {
  enum Kind { complete, truncated, invalid } kind;
  // complete: the sequence length; truncated: bytes up to the end of s (all
  // a valid prefix of some sequence); invalid: the length of the maximal
  // ill-formed subpart (>= 1), which is what one U+FFFD replaces.
  size_t len;
  uint32_t cp;  // complete only
};
Utf8Step utf8_step(std::string_view s, size_t pos);

void append_utf8(std::string& out, uint32_t cp);

// Replaces every ill-formed or truncated sequence with U+FFFD.
std::string sanitize_utf8(std::string_view s);

// ' ' -> U+2581 (encode side of SentencePiece).
std::string escape_spaces(std::string_view s);
// U+2581 -> ' ' (decode side), in place.
void unescape_spaces(std::string& s);

// GPT-2 byte-level mapping: every byte is shown as a printable code point
// (printable Latin-1 bytes map to themselves, the rest to U+0100 + n) so a
// BPE vocabulary never contains raw control bytes or spaces.
std::string_view gpt2_byte_to_utf8(uint8_t byte);  // the mapped code point as UTF-8
int gpt2_cp_to_byte(uint32_t cp);                   // -1 when cp is not a mapped byte
// Appends the byte-level encoding of s to out.
void gpt2_encode(std::string_view s, std::string& out);
// Undoes the mapping; code points outside it are copied through unchanged.
void gpt2_decode(std::string_view s, std::string& out);

}  // namespace phaselab::unicode
