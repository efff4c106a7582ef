#include "tokenizer/unicode.h"

#include <array>

namespace phaselab::unicode {

Utf8Step utf8_step(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {Utf8Step::complete, 1, b0};

  size_t need;
  uint32_t cp;
  // Allowed range of the second byte (the first continuation): this is what
  // rules out overlong forms, surrogates and code points above U+10FFFF.
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2; cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3; cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4; cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Step::invalid, 1, 0};
  }
  for (size_t k = 1; k < need; k++) {
    if (k >= avail) return {Utf8Step::truncated, avail, 0};
    const uint8_t b = p[k];
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {Utf8Step::invalid, k, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Utf8Step::complete, need, cp};
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const Utf8Step st = utf8_step(s, pos);
    if (st.kind == Utf8Step::complete) {
      out.append(s.substr(pos, st.len));
    } else {
      out.append(kReplacement);
    }
    pos += st.len;
  }
  return out;
}

std::string escape_spaces(std::string_view s) {
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  for (char c : s) {
    if (c == ' ') out.append(kSpaceMarker);
    else out.push_back(c);
  }
  return out;
}

void unescape_spaces(std::string& s) {
  size_t pos = s.find(kSpaceMarker);
  if (pos == std::string::npos) return;
  std::string out;
  out.reserve(s.size());
  size_t from = 0;
  while (pos != std::string::npos) {
    out.append(s, from, pos - from);
    out.push_back(' ');
    from = pos + kSpaceMarker.size();
    pos = s.find(kSpaceMarker, from);
  }
  out.append(s, from, std::string::npos);
  s = std::move(out);
}

namespace {

struct Gpt2Tables {
  std::array<uint16_t, 256> byte_to_cp{};
  std::array<std::array<char, 4>, 256> utf8{};  // encoded mapped code point
  std::array<uint8_t, 256> utf8_len{};
  std::array<int16_t, 512> cp_to_byte{};  // mapped code points are all < 0x144

  Gpt2Tables() {
    cp_to_byte.fill(-1);
    // Printable bytes keep their own code point; the remaining 68 are moved
    // to U+0100.. in byte order (the scheme of OpenAI's GPT-2 encoder).
    auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int n = 0;
    for (int b = 0; b < 256; b++) {
      const uint16_t cp = printable(b) ? static_cast<uint16_t>(b) : static_cast<uint16_t>(256 + n++);
      byte_to_cp[b] = cp;
      cp_to_byte[cp] = static_cast<int16_t>(b);
      std::string enc;
      append_utf8(enc, cp);
      utf8_len[b] = static_cast<uint8_t>(enc.size());
      for (size_t k = 0; k < enc.size(); k++) utf8[b][k] = enc[k];
    }
  }
};

const Gpt2Tables& gpt2_tables() {
  static const Gpt2Tables t;
  return t;
}

}  // namespace

std::string_view gpt2_byte_to_utf8(uint8_t byte) {
  const auto& t = gpt2_tables();
  return {t.utf8[byte].data(), t.utf8_len[byte]};
}

int gpt2_cp_to_byte(uint32_t cp) {
  const auto& t = gpt2_tables();
  return cp < t.cp_to_byte.size() ? t.cp_to_byte[cp] : -1;
}

void gpt2_encode(std::string_view s, std::string& out) {
  const auto& t = gpt2_tables();
  for (char c : s) {
    const auto b = static_cast<uint8_t>(c);
    out.append(t.utf8[b].data(), t.utf8_len[b]);
  }
}

void gpt2_decode(std::string_view s, std::string& out) {
  size_t pos = 0;
  while (pos < s.size()) {
    const Utf8Step st = utf8_step(s, pos);
    if (st.kind == Utf8Step::complete) {
      const int b = gpt2_cp_to_byte(st.cp);
      if (b >= 0) out.push_back(static_cast<char>(b));
      else out.append(s.substr(pos, st.len));
    } else {
      out.append(s.substr(pos, st.len));
    }
    pos += st.len;
  }
}

}  // namespace phaselab::unicode
