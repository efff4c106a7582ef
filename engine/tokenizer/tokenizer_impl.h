// What the tokenizer's source files share; internal to the engine (not
// under include/). The files, by concern:
//   tokenizer.cpp      Tokenizer::from_gguf, special-token splitting, decoding,
//                      the incremental detokenizer
//   vocab.cpp          the vocabulary from GGUF metadata (Tokenizer::load_vocab)
//                      and the special tokens recognised by their text
//   pre_tokenizer.cpp  the BPE pre-tokenizers' regexes (PCRE2)
//   spm_tokenizer.cpp  SentencePiece ("llama")
//   bpe_tokenizer.cpp  byte-level BPE ("gpt2")
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "phaselab/tokenizer.h"

namespace phaselab::tok {

inline bool is_special_attr(TokenAttr a) {
  return a == TokenAttr::control || a == TokenAttr::user_defined || a == TokenAttr::unknown;
}

// s in single quotes, for messages.
std::string quoted(std::string_view s);

// The merge loop both tokenizers share: symbols form a linked list (n bytes
// each, prev/next), candidate pairs sit in a heap ordered by cmp. Pop the
// best pair, skip it if stale, merge, and queue the new neighbour pairs.
template <typename Scratch, typename Cmp, typename TryAdd>
void merge_symbols(Scratch& s, Cmp cmp, TryAdd try_add) {
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), cmp);
    const auto bg = s.heap.back();
    s.heap.pop_back();
    auto& l = s.symbols[bg.left];
    auto& r = s.symbols[bg.right];
    // Stale entry: one side was merged since. Sizes only grow, so an
    // unchanged total means both sides are as they were when queued.
    if (l.n == 0 || r.n == 0 || l.n + r.n != bg.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) s.symbols[r.next].prev = bg.left;
    try_add(l.prev, bg.left);
    try_add(bg.left, l.next);
  }
}

// The two kinds, read from a GGUF file (tokenizer.ggml.model "llama" and
// "gpt2"); Tokenizer::from_gguf chooses between them.
Result<std::unique_ptr<Tokenizer>> load_spm_tokenizer(const GgufFile& file);
Result<std::unique_ptr<Tokenizer>> load_bpe_tokenizer(const GgufFile& file);

}  // namespace phaselab::tok
