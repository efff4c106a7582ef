// Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/:
// tiny models of each architecture through the project's GGUF writer (each
// checked to load), and a few texts and conversations. Run it when the
// seeds should change (README.md); the fuzz runs only read them.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "phaselab/gguf.h"
#include "phaselab/model.h"

using namespace phaselab;
namespace fs = std::filesystem;

namespace {

struct Spec {
  std::string name, arch, tok = "llama";
  int n_embd = 8, n_head = 2, n_head_kv = 1, head_dim = 4, n_ff = 8, n_layer = 1;
  TensorType mat = TensorType::F32;
  bool tied = false;
};

uint32_t g_state = 1;
float next_value() {
  g_state = g_state * 1664525u + 1013904223u;
  return static_cast<float>(static_cast<int>(g_state >> 24) - 128) / 256.f;
}
std::vector<float> values(size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = next_value();
  return v;
}

int vocab(GgufWriter& w, const std::string& kind) {
  if (kind == "gpt2") {
    const std::vector<std::string> toks = {"a", "b", "ab", "\xC4\xA0", "\xC4\xA0" "a", "<|endoftext|>", "c", "!"};
    w.set("tokenizer.ggml.model", GgufWriteValue::string("gpt2"));
    w.set("tokenizer.ggml.pre", GgufWriteValue::string("gpt-2"));
    w.set("tokenizer.ggml.tokens", GgufWriteValue::string_array(toks));
    w.set("tokenizer.ggml.token_type", GgufWriteValue::i32_array({1, 1, 1, 1, 1, 3, 1, 1}));
    w.set("tokenizer.ggml.merges", GgufWriteValue::string_array({"a b", "\xC4\xA0 a"}));
    w.set("tokenizer.ggml.bos_token_id", GgufWriteValue::u32(5));
    w.set("tokenizer.ggml.eos_token_id", GgufWriteValue::u32(5));
    return static_cast<int>(toks.size());
  }
  const std::vector<std::string> toks = {"<unk>", "<s>", "</s>", "<0x41>", "\xE2\x96\x81", "\xE2\x96\x81" "a", "a", "b",
                                         "<start_of_turn>", "<end_of_turn>"};
  std::vector<float> scores;
  for (size_t i = 0; i < toks.size(); i++) scores.push_back(-static_cast<float>(i));
  w.set("tokenizer.ggml.model", GgufWriteValue::string("llama"));
  w.set("tokenizer.ggml.tokens", GgufWriteValue::string_array(toks));
  w.set("tokenizer.ggml.scores", GgufWriteValue::f32_array(scores));
  w.set("tokenizer.ggml.token_type", GgufWriteValue::i32_array({2, 3, 3, 6, 1, 1, 1, 1, 3, 3}));
  w.set("tokenizer.ggml.bos_token_id", GgufWriteValue::u32(1));
  w.set("tokenizer.ggml.eos_token_id", GgufWriteValue::u32(2));
  w.set("tokenizer.ggml.padding_token_id", GgufWriteValue::u32(0xFFFFFFFFu));
  return static_cast<int>(toks.size());
}

std::vector<uint8_t> tiny_model(const Spec& s) {
  GgufWriter w;
  const int n_vocab = vocab(w, s.tok);
  const std::string a = s.arch + ".";
  w.set("general.architecture", GgufWriteValue::string(s.arch));
  w.set("general.name", GgufWriteValue::string(s.name));
  w.set(a + "context_length", GgufWriteValue::u32(64));
  w.set(a + "embedding_length", GgufWriteValue::u32(s.n_embd));
  w.set(a + "block_count", GgufWriteValue::u32(s.n_layer));
  w.set(a + "feed_forward_length", GgufWriteValue::u32(s.n_ff));
  w.set(a + "attention.head_count", GgufWriteValue::u32(s.n_head));
  w.set(a + "attention.head_count_kv", GgufWriteValue::u32(s.n_head_kv));
  w.set(a + "attention.key_length", GgufWriteValue::u32(s.head_dim));
  w.set(a + "attention.value_length", GgufWriteValue::u32(s.head_dim));
  w.set(a + "attention.layer_norm_rms_epsilon", GgufWriteValue::f32(1e-6f));
  w.set(a + "rope.freq_base", GgufWriteValue::f32(10000.f));
  if (s.arch == "gemma3") {
    w.set(a + "attention.sliding_window", GgufWriteValue::u32(4));
    w.set(a + "attention.sliding_window_pattern", GgufWriteValue::u32(2));
    w.set(a + "final_logit_softcapping", GgufWriteValue::f32(30.f));
    w.set("tokenizer.chat_template", GgufWriteValue::string("{{ '<start_of_turn>' + role }}"));
  }
  const int nq = s.n_head * s.head_dim, nkv = s.n_head_kv * s.head_dim;
  auto mat = [&](const std::string& name, int n_in, int n_out, TensorType t) {
    if (!w.add_tensor_f32(name, t, {n_in, n_out}, values(static_cast<size_t>(n_in) * n_out))) std::abort();
  };
  auto vec = [&](const std::string& name, int n) {
    if (!w.add_tensor_f32(name, TensorType::F32, {n}, values(n))) std::abort();
  };
  mat("token_embd.weight", s.n_embd, n_vocab, s.mat);
  vec("output_norm.weight", s.n_embd);
  if (!s.tied) mat("output.weight", s.n_embd, n_vocab, s.mat);
  for (int il = 0; il < s.n_layer; il++) {
    const std::string p = "blk." + std::to_string(il) + ".";
    vec(p + "attn_norm.weight", s.n_embd);
    mat(p + "attn_q.weight", s.n_embd, nq, s.mat);
    mat(p + "attn_k.weight", s.n_embd, nkv, s.mat);
    mat(p + "attn_v.weight", s.n_embd, nkv, s.mat);
    mat(p + "attn_output.weight", nq, s.n_embd, s.mat);
    if (s.arch == "qwen2") {
      vec(p + "attn_q.bias", nq);
      vec(p + "attn_k.bias", nkv);
      vec(p + "attn_v.bias", nkv);
    }
    if (s.arch == "qwen3" || s.arch == "gemma3") {
      vec(p + "attn_q_norm.weight", s.head_dim);
      vec(p + "attn_k_norm.weight", s.head_dim);
    }
    if (s.arch == "gemma3") {
      vec(p + "post_attention_norm.weight", s.n_embd);
      vec(p + "post_ffw_norm.weight", s.n_embd);
    }
    vec(p + "ffn_norm.weight", s.n_embd);
    mat(p + "ffn_gate.weight", s.n_embd, s.n_ff, s.mat);
    mat(p + "ffn_up.weight", s.n_embd, s.n_ff, s.mat);
    mat(p + "ffn_down.weight", s.n_ff, s.n_embd, s.mat);
  }
  return w.serialize();
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Inputs that crashed the loader before it was hardened (each a tiny model
// with one hyperparameter changed), for tests/fuzz/regressions/fuzz_gguf.
int write_regressions(const fs::path& dir) {
  fs::create_directories(dir);
  struct Case {
    const char* name;
    void (*edit)(GgufWriter&);
  };
  const Case cases[] = {
      // 2^30 layers: ModelConfig sized a 1 GiB per-layer table and Model
      // asked for 2^30 LayerWeights (ASan: allocation-size-too-big).
      {"block-count-2p30", [](GgufWriter& w) { w.set("llama.block_count", GgufWriteValue::u32(1u << 30)); }},
      // head_count x key_length = 2^40: int overflow in n_embd_q() (UBSan).
      {"head-width-overflow",
       [](GgufWriter& w) {
         w.set("llama.attention.head_count", GgufWriteValue::u32(1u << 20));
         w.set("llama.attention.head_count_kv", GgufWriteValue::u32(1u << 20));
         w.set("llama.attention.key_length", GgufWriteValue::u32(1u << 20));
         w.set("llama.attention.value_length", GgufWriteValue::u32(1u << 20));
         w.set("llama.rope.dimension_count", GgufWriteValue::u32(2));
       }},
      // A per-layer array of floats out of int64's range: float-to-int cast
      // overflow in GgufValue::int_at (UBSan).
      {"float-array-head-count",
       [](GgufWriter& w) { w.set("llama.attention.head_count", GgufWriteValue::f32_array({1e30f})); }},
  };
  for (const Case& c : cases) {
    GgufWriter w;
    Spec s{"regression", "llama"};
    const std::vector<uint8_t> good = tiny_model(s);
    auto f = GgufFile::from_bytes(good, "seed");
    if (!f) return 1;
    for (const auto& [key, v] : (*f)->metadata()) w.set(key, GgufWriteValue::copy_of(v));
    c.edit(w);
    for (const GgufTensorInfo& t : (*f)->tensors())
      if (!w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.n_bytes)) return 1;
    const std::vector<uint8_t> bytes = w.serialize();
    write(dir / c.name, std::string(bytes.begin(), bytes.end()));
    std::printf("%s: %zu bytes\n", (dir / c.name).c_str(), bytes.size());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--regressions") return write_regressions(argv[2]);
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR (tests/fuzz/corpus) | make_seeds --regressions DIR\n");
    return 2;
  }
  const fs::path root = argv[1];
  for (const char* t : {"fuzz_gguf", "fuzz_tokenizer", "fuzz_chat_template"}) fs::create_directories(root / t);

  std::vector<Spec> specs = {
      {"llama-f32", "llama"},
      {"llama-gpt2-vocab", "llama", "gpt2"},
      {"gemma3-f16-tied", "gemma3", "llama", 8, 2, 1, 4, 8, 2, TensorType::F16, true},
      {"qwen2-bias", "qwen2"},
      {"qwen3-bf16", "qwen3", "llama", 8, 2, 2, 4, 8, 1, TensorType::BF16},
      {"llama-q8_0", "llama", "llama", 32, 2, 1, 16, 32, 1, TensorType::Q8_0},
  };
  for (const Spec& s : specs) {
    const std::vector<uint8_t> bytes = tiny_model(s);
    auto f = GgufFile::from_bytes(bytes, s.name);
    if (!f) return std::fprintf(stderr, "%s\n", f.status().message().c_str()), 1;
    auto m = Model::from_file(*f);
    if (!m) return std::fprintf(stderr, "%s: does not load: %s\n", s.name.c_str(), m.status().message().c_str()), 1;
    write(root / "fuzz_gguf" / (s.name + ".gguf"), std::string(bytes.begin(), bytes.end()));
    std::printf("fuzz_gguf/%s.gguf: %zu bytes\n", s.name.c_str(), bytes.size());
  }

  // Tokenizer: byte 0 = vocabulary (0 llama-spm, 1 gpt-2, 2 deepseek-coder,
  // 3 tiny) | mode << 2 (0-3 encode with add_special/parse_special, 4-7 ids).
  const std::vector<std::string> texts = {
      "Hello world! How are you?", "  leading spaces\tand\ttabs\n\nnew lines  ",
      "caf\xC3\xA9 na\xC3\xAFve \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x99\x82 \xE2\x96\x81",
      "<s>[INST] <<SYS>> <|endoftext|> <start_of_turn>user</s>", "123456789 3.14159 1,000,000",
      "def f(x):\n    return x**2  # code", "\xFF\xFE broken \xC3 utf-8 \xE2\x82", "'s 't 're 've 'm 'll 'd ' S'T"};
  int k = 0;
  for (int vocab_sel = 0; vocab_sel < 4; vocab_sel++) {
    for (size_t i = 0; i < texts.size(); i++) {
      const int mode = static_cast<int>(i % 4);
      write(root / "fuzz_tokenizer" / ("text-" + std::to_string(k++)), std::string(1, static_cast<char>(vocab_sel | mode << 2)) + texts[i]);
    }
    std::string ids(1, static_cast<char>(vocab_sel | 4 << 2));
    for (int id : {1, 2, 3, 300, 1000, 29871, 50256, 32013, 0xE2, 0x96}) ids.append(reinterpret_cast<const char*>(&id), 2);
    write(root / "fuzz_tokenizer" / ("ids-" + std::to_string(vocab_sel)), ids);
  }

  // Chat: byte 0 = family (0 plain, 1 gemma, 2 chatml, 3 llama3, 4 llama2) |
  // 8 for add_generation_prompt; messages "role byte + content" split by NUL.
  const std::string conv = std::string("\0You are terse.\0", 16) + std::string("\1Hi there\0", 10) +
                           std::string("\2Hello! <end_of_turn>\0", 22) + std::string("\1What is 2+2?", 13);
  for (int fam = 0; fam < 5; fam++)
    write(root / "fuzz_chat_template" / ("conv-" + std::to_string(fam)), std::string(1, static_cast<char>(fam | 8)) + conv);
  write(root / "fuzz_chat_template" / "template-gemma", "{% for m in messages %}<start_of_turn>{{ m.role }}{% endfor %}");
  write(root / "fuzz_chat_template" / "template-chatml", "{{ '<|im_start|>' + message['role'] }}");
  return 0;
}
