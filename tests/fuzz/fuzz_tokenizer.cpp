// Fuzz target: the tokenizers on untrusted text and untrusted token ids.
// Vocabularies: the conformance GGUFs in tests/data/tokenizer-vectors
// (SentencePiece "llama-spm", byte-level BPE "gpt-2" and "deepseek-coder")
// and a tiny SentencePiece vocabulary without byte tokens, built here.
//
// Input: byte 0 picks the vocabulary (low 2 bits) and the mode (bits 2..4);
// the rest is text or token ids.
//   encode: every id in the vocabulary; ids stream through the incremental
//           detokenizer as valid UTF-8; for valid UTF-8 without special
//           parsing, decode(encode(text)) == text.
//   ids:    little-endian 16- or 24-bit ids (some outside the vocabulary)
//           through IncrementalDetokenizer and decode.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "phaselab/gguf.h"
#include "phaselab/tokenizer.h"
#include "tokenizer/unicode.h"

using namespace phaselab;

namespace {

struct Vocab {
  std::shared_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
  bool lossless = true;  // every byte sequence has tokens (byte tokens / byte-level BPE)
};
std::vector<Vocab>* g_vocabs = nullptr;

void add_vocab(std::shared_ptr<GgufFile> file, bool lossless) {
  auto tok = Tokenizer::from_gguf(*file);
  if (!tok) {
    std::fprintf(stderr, "fuzz_tokenizer: %s: %s\n", file->path().c_str(), tok.status().message().c_str());
    std::abort();
  }
  g_vocabs->push_back({std::move(file), std::move(*tok), lossless});
}

std::shared_ptr<GgufFile> tiny_spm() {
  GgufWriter w;
  const std::vector<std::string> toks = {"<unk>", "<s>", "</s>", "<|user|>", "\xE2\x96\x81", "\xE2\x96\x81" "a",
                                         "a", "b", "ab", "\xE2\x96\x81" "ab", "c", "<ctrl>"};
  std::vector<float> scores;
  for (size_t i = 0; i < toks.size(); i++) scores.push_back(-static_cast<float>(i));
  w.set("tokenizer.ggml.model", GgufWriteValue::string("llama"));
  w.set("tokenizer.ggml.tokens", GgufWriteValue::string_array(toks));
  w.set("tokenizer.ggml.scores", GgufWriteValue::f32_array(scores));
  w.set("tokenizer.ggml.token_type", GgufWriteValue::i32_array({2, 3, 3, 4, 1, 1, 1, 1, 1, 1, 1, 3}));
  auto f = GgufFile::from_bytes(w.serialize(), "tiny-spm");
  if (!f) std::abort();
  return *f;
}

std::string concat_pieces(const Tokenizer& t, const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) s += t.token_to_piece(id);
  return s;
}

// Streams ids through the incremental detokenizer: every chunk is valid
// UTF-8, and the whole is the pieces' bytes with each invalid sequence
// replaced (what sanitize_utf8 gives).
void check_stream(const Tokenizer& t, const std::vector<TokenId>& ids) {
  IncrementalDetokenizer d(t);
  std::string streamed;
  for (TokenId id : ids) {
    const std::string out = d.push(id);
    FUZZ_CHECK(fuzz::valid_utf8(out));
    streamed += out;
  }
  const std::string tail = d.flush();
  FUZZ_CHECK(fuzz::valid_utf8(tail));
  streamed += tail;
  FUZZ_CHECK(streamed == unicode::sanitize_utf8(concat_pieces(t, ids)));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_vocabs = new std::vector<Vocab>();
  std::string dir = std::string(PHASELAB_SOURCE_DIR) + "/tests/data/tokenizer-vectors";
  if (const char* d = std::getenv("PHASELAB_FUZZ_VOCAB_DIR"); d && *d) dir = d;
  for (const char* name : {"llama-spm", "gpt-2", "deepseek-coder"}) {
    const std::string path = dir + "/ggml-vocab-" + name + ".gguf";
    auto f = GgufFile::open(path);
    if (!f) {
      std::fprintf(stderr, "fuzz_tokenizer: %s\n", f.status().message().c_str());
      std::abort();
    }
    add_vocab(std::move(*f), true);
  }
  add_vocab(tiny_spm(), false);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t sel = data[0];
  const Vocab& v = (*g_vocabs)[sel & 3];
  const Tokenizer& t = *v.tok;
  const int mode = (sel >> 2) & 7;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);

  if (mode < 4) {
    const bool add_special = mode & 1, parse_special = mode & 2;
    const std::vector<TokenId> ids = t.encode(rest, add_special, parse_special);
    for (TokenId id : ids) FUZZ_CHECK(id >= 0 && id < t.n_vocab());
    check_stream(t, ids);
    const std::string back = t.decode(ids);
    if (v.lossless && !parse_special && fuzz::valid_utf8(rest)) {
      // SentencePiece writes spaces as U+2581, so one in the input comes
      // back as a space (as in SentencePiece itself and llama.cpp).
      std::string expected(rest);
      if (t.kind() == Tokenizer::Kind::spm) unicode::unescape_spaces(expected);
      if (back != expected) {
        std::fprintf(stderr, "round trip: '%s' -> '%s'\n", expected.c_str(), back.c_str());
      }
      FUZZ_CHECK(back == expected);
    }
    return 0;
  }
  // Token ids: 16-bit for modes 4-5, 24-bit for 6-7 (reaches past every
  // vocabulary here, and negative after the sign flip of mode 5/7).
  const size_t width = mode < 6 ? 2 : 3;
  std::vector<TokenId> ids;
  for (size_t k = 0; k + width <= rest.size(); k += width) {
    uint32_t x = 0;
    std::memcpy(&x, rest.data() + k, width);
    TokenId id = static_cast<TokenId>(x % static_cast<uint32_t>(t.n_vocab() + 8));
    if ((mode & 1) && (x >> 23) & 1) id = -id - 1;
    ids.push_back(id);
  }
  check_stream(t, ids);
  FUZZ_CHECK(fuzz::valid_utf8(unicode::sanitize_utf8(t.decode(ids, true))));
  for (TokenId id : ids) (void)t.token_to_piece(id, true);
  return 0;
}
