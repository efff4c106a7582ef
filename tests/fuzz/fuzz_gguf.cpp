// Fuzz target: a GGUF file from untrusted bytes, then everything loading a
// model does with it (ModelConfig, the tokenizer, the tensor checks of
// Model::from_file). Any outcome but a crash, a sanitizer report or an
// error without a message is fine.
#include <cstdint>
#include <vector>

#include "fuzz_common.h"
#include "phaselab/gguf.h"
#include "phaselab/model.h"
#include "phaselab/model_config.h"
#include "phaselab/tokenizer.h"

using namespace phaselab;

namespace {

// Reads the first and last byte of a span the reader vouched for, so that
// ASan sees any span that leaves the buffer.
uint8_t touch(const uint8_t* p, uint64_t n) {
  if (n == 0) return 0;
  const volatile uint8_t* v = p;
  return static_cast<uint8_t>(v[0] ^ v[n - 1]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = GgufFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.gguf");
  if (!file) {
    FUZZ_CHECK(!file.status().message().empty());
    return 0;
  }
  const GgufFile& f = **file;
  uint8_t sink = 0;
  for (const auto& [key, v] : f.metadata()) {
    FUZZ_CHECK(!key.empty());
    FUZZ_CHECK(f.find(key) == &v);
    sink ^= static_cast<uint8_t>(v.to_string().size());
    if (v.type == GgufValueType::ARRAY && v.elems) {
      sink ^= static_cast<uint8_t>(v.int_at(0) ^ v.int_at(v.count - 1));
      sink ^= static_cast<uint8_t>(v.float_at(v.count - 1) != 0);
    }
  }
  for (const GgufTensorInfo& t : f.tensors()) {
    FUZZ_CHECK(f.find_tensor(t.name) == &t);
    sink ^= touch(t.data, t.n_bytes);
  }

  auto cfg = ModelConfig::from_gguf(f);
  if (!cfg) FUZZ_CHECK(!cfg.status().message().empty());
  auto tok = Tokenizer::from_gguf(f);
  if (!tok) {
    FUZZ_CHECK(!tok.status().message().empty());
  } else {
    const Tokenizer& t = **tok;
    for (TokenId id : {t.bos(), t.eos(), t.eot(), t.unk()}) FUZZ_CHECK(id >= -1 && id < t.n_vocab());
    const auto ids = t.encode("Hello world, <s> </s> <|endoftext|> \xE2\x96\x81 caf\xC3\xA9 \xF0\x9F\x99\x82", true, true);
    for (TokenId id : ids) FUZZ_CHECK(id >= 0 && id < t.n_vocab());
    IncrementalDetokenizer detok(t);
    for (TokenId id : ids) FUZZ_CHECK(fuzz::valid_utf8(detok.push(id)));
    FUZZ_CHECK(fuzz::valid_utf8(detok.flush()));
    sink ^= static_cast<uint8_t>(t.decode(ids, true).size());
  }

  auto model = Model::from_file(*file);
  if (!model) {
    FUZZ_CHECK(!model.status().message().empty());
  } else {
    const Model& m = **model;
    FUZZ_CHECK(cfg.is_ok() && tok.is_ok());
    const ModelWeights& w = m.weights();
    FUZZ_CHECK(static_cast<int>(w.layers.size()) == m.config().n_layer);
    // The last row of each matrix lies inside the data (ASan checks).
    auto last_row = [&](const WeightView& v) {
      FUZZ_CHECK(v.present());
      sink ^= touch(v.row(v.n_out - 1), v.row_bytes);
    };
    last_row(w.tok_embd);
    last_row(w.output);
    for (const LayerWeights& l : w.layers) {
      for (const WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) last_row(*v);
    }
    sink ^= static_cast<uint8_t>(m.type_mix().size());
    (void)m.chat_template();
  }
  (void)sink;
  return 0;
}
