// Builds tiny random models of each supported architecture with the
// project's own GGUF writer, for exact-invariant tests.
#pragma once

#include <QDir>
#include <QString>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "phaselab/gguf.h"
#include "phaselab/model_config.h"
#include "phaselab/session.h"

namespace phaselab::testing {

struct TinySpec {
  std::string arch = "llama";
  int n_embd = 64, n_head = 4, n_head_kv = 2, head_dim = 16, n_ff = 128, n_layer = 3;
  int sliding_window = 0;        // gemma2, gemma3: tokens
  int swa_period = 2;            // gemma2, gemma3: layer il is global when il % period == period - 1
  float attn_softcap = 0;        // gemma2: attn_logit_softcapping (0: the key is not written)
  float final_softcap = 0;       // gemma2: final_logit_softcapping (0: the key is not written)
  int n_rot = 0;                 // rope.dimension_count; 0: the key is not written (all of head_dim)
  bool fused_qkv = true;         // phi3: one attn_qkv matrix, else attn_q/k/v
  int n_ctx_orig = 0;            // phi3: original_context_length and both RoPE factor sets; 0: none
  float rope_attn_factor = 0;    // phi3: rope.scaling.attn_factor; 0: the key is not written
  int n_expert = 0;              // qwen3moe, llama (Mixtral): experts per MoE layer; 0: dense
  int n_expert_used = 0;         // experts per token
  int n_ff_exp = 0;              // qwen3moe, gpt-oss: expert_feed_forward_length (llama: n_ff)
  float yarn_factor = 0;         // rope.scaling.factor, of rope_scaling (and n_ctx_orig); 0: no scaling
  std::string rope_scaling = "yarn";  // rope.scaling.type when yarn_factor > 0 ("linear": Gemma 3 4B+)
  float rope_base = 10000.f;
  TensorType matrix_type = TensorType::F32;
  std::optional<TensorType> expert_type;  // the experts' type; none: matrix_type
  TensorType embd_type = TensorType::F32;
  bool tied = false;
  uint32_t seed = 1;
  uint32_t n_ctx_train = 256;
  std::string chat_template;     // tokenizer.chat_template; empty: none
};

// A SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, a few
// words, then the given control tokens (a family's special tokens).
inline void add_tiny_vocab(GgufWriter& w, int* n_vocab, const std::vector<std::string>& controls = {}) {
  std::vector<std::string> toks = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  char buf[8];
  for (int b = 0; b < 256; b++) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    toks.push_back(buf);
    scores.push_back(0);
    types.push_back(6);
  }
  const char* words[] = {"\xE2\x96\x81the", "\xE2\x96\x81" "a", "\xE2\x96\x81" "cat", "\xE2\x96\x81sat", "\xE2\x96\x81on",
                         "\xE2\x96\x81mat", "\xE2\x96\x81", "e", "t", "a", "o", "n", "s", "h", "r", "d", "l", "c", "m", "."};
  float score = -1;
  for (const char* wd : words) {
    toks.push_back(wd);
    scores.push_back(score);
    score -= 1;
    types.push_back(1);
  }
  for (const std::string& c : controls) {
    toks.push_back(c);
    scores.push_back(0);
    types.push_back(3);
  }
  w.set("tokenizer.ggml.model", GgufWriteValue::string("llama"));
  w.set("tokenizer.ggml.tokens", GgufWriteValue::string_array(toks));
  w.set("tokenizer.ggml.scores", GgufWriteValue::f32_array(scores));
  w.set("tokenizer.ggml.token_type", GgufWriteValue::i32_array(types));
  w.set("tokenizer.ggml.bos_token_id", GgufWriteValue::u32(1));
  w.set("tokenizer.ggml.eos_token_id", GgufWriteValue::u32(2));
  w.set("tokenizer.ggml.unknown_token_id", GgufWriteValue::u32(0));
  *n_vocab = static_cast<int>(toks.size());
}

inline std::vector<float> random_vector(std::mt19937& rng, size_t n, float scale, float offset = 0.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = offset + d(rng);
  return v;
}

// Writes the model to a temporary file and returns its path.
inline std::string write_tiny_model(const TinySpec& s, const std::string& file_name) {
  GgufWriter w;
  int n_vocab = 0;
  // llama.cpp looks up Phi-3's <|endoftext|> by name.
  add_tiny_vocab(w, &n_vocab, s.arch == "phi3" ? std::vector<std::string>{"<|endoftext|>"} : std::vector<std::string>{});
  const std::string a = s.arch + ".";
  w.set("general.architecture", GgufWriteValue::string(s.arch));
  w.set("general.name", GgufWriteValue::string("tiny-" + s.arch));
  if (!s.chat_template.empty()) w.set("tokenizer.chat_template", GgufWriteValue::string(s.chat_template));
  w.set(a + "context_length", GgufWriteValue::u32(s.n_ctx_train));
  w.set(a + "embedding_length", GgufWriteValue::u32(s.n_embd));
  w.set(a + "block_count", GgufWriteValue::u32(s.n_layer));
  w.set(a + "feed_forward_length", GgufWriteValue::u32(s.n_ff));
  w.set(a + "attention.head_count", GgufWriteValue::u32(s.n_head));
  w.set(a + "attention.head_count_kv", GgufWriteValue::u32(s.n_head_kv));
  w.set(a + "attention.key_length", GgufWriteValue::u32(s.head_dim));
  w.set(a + "attention.value_length", GgufWriteValue::u32(s.head_dim));
  w.set(a + "attention.layer_norm_rms_epsilon", GgufWriteValue::f32(1e-6f));
  w.set(a + "rope.freq_base", GgufWriteValue::f32(s.rope_base));
  if (s.yarn_factor > 0) {
    w.set(a + "rope.scaling.type", GgufWriteValue::string(s.rope_scaling));
    w.set(a + "rope.scaling.factor", GgufWriteValue::f32(s.yarn_factor));
  }
  if (s.arch == "gpt-oss") w.set(a + "attention.sliding_window", GgufWriteValue::u32(s.sliding_window));
  if (s.arch == "gemma2") {
    w.set(a + "rope.freq_base", GgufWriteValue::f32(10000.f));
    w.set(a + "attention.sliding_window", GgufWriteValue::u32(s.sliding_window));
    w.set(a + "attention.sliding_window_pattern", GgufWriteValue::u32(s.swa_period));
  }
  if (s.attn_softcap > 0) w.set(a + "attn_logit_softcapping", GgufWriteValue::f32(s.attn_softcap));
  if (s.final_softcap > 0) w.set(a + "final_logit_softcapping", GgufWriteValue::f32(s.final_softcap));
  if (s.n_rot > 0) w.set(a + "rope.dimension_count", GgufWriteValue::u32(s.n_rot));
  if (s.n_ctx_orig > 0) w.set(a + "rope.scaling.original_context_length", GgufWriteValue::u32(s.n_ctx_orig));
  if (s.rope_attn_factor > 0) w.set(a + "rope.scaling.attn_factor", GgufWriteValue::f32(s.rope_attn_factor));
  const int n_ff_exp = s.arch == "llama" ? s.n_ff : s.n_ff_exp;
  if (s.n_expert > 0) {
    w.set(a + "expert_count", GgufWriteValue::u32(s.n_expert));
    w.set(a + "expert_used_count", GgufWriteValue::u32(s.n_expert_used));
    if (s.arch != "llama") w.set(a + "expert_feed_forward_length", GgufWriteValue::u32(n_ff_exp));
  }
  if (s.arch == "gemma3") {
    w.set(a + "rope.freq_base", GgufWriteValue::f32(1e6f));
    w.set(a + "rope.freq_base_swa", GgufWriteValue::f32(10000.f));
    w.set(a + "attention.sliding_window", GgufWriteValue::u32(s.sliding_window));
    w.set(a + "attention.sliding_window_pattern", GgufWriteValue::u32(s.swa_period));
  }
  std::mt19937 rng(s.seed);
  const int nq = s.n_head * s.head_dim, nkv = s.n_head_kv * s.head_dim;
  auto mat = [&](const std::string& name, int n_in, int n_out, TensorType t) {
    const auto v = random_vector(rng, static_cast<size_t>(n_in) * n_out, 1.f / std::sqrt(static_cast<float>(n_in)));
    if (!w.add_tensor_f32(name, t, {n_in, n_out}, v)) qFatal("tiny model: %s", name.c_str());
  };
  auto vec = [&](const std::string& name, int n, float offset) {
    if (!w.add_tensor_f32(name, TensorType::F32, {n}, random_vector(rng, n, 0.1f, offset))) qFatal("tiny model: %s", name.c_str());
  };
  const bool gemma = s.arch == "gemma2" || s.arch == "gemma3";
  {
    const auto e = random_vector(rng, static_cast<size_t>(s.n_embd) * n_vocab, gemma ? 0.05f : 1.f);
    if (!w.add_tensor_f32("token_embd.weight", s.embd_type, {s.n_embd, n_vocab}, e)) qFatal("tiny model: embd");
  }
  vec("output_norm.weight", s.n_embd, 1.f);
  if (!s.tied) mat("output.weight", s.n_embd, n_vocab, s.matrix_type);
  const bool phi3 = s.arch == "phi3";
  if (phi3 && s.n_ctx_orig > 0) {  // frequency divisors: long ones 1..8, short ones near 1
    const int half = (s.n_rot > 0 ? s.n_rot : s.head_dim) / 2;
    std::vector<float> longf(half), shortf(half);
    for (int i = 0; i < half; i++) longf[i] = 1.f + 7.f * i / half, shortf[i] = 1.f + 0.1f * i / half;
    if (!w.add_tensor_f32("rope_factors_long.weight", TensorType::F32, {half}, longf) ||
        !w.add_tensor_f32("rope_factors_short.weight", TensorType::F32, {half}, shortf))
      qFatal("tiny model: rope factors");
  }
  for (int il = 0; il < s.n_layer; il++) {
    const std::string p = "blk." + std::to_string(il) + ".";
    vec(p + "attn_norm.weight", s.n_embd, 1.f);
    if (phi3 && s.fused_qkv) {
      mat(p + "attn_qkv.weight", s.n_embd, nq + 2 * nkv, s.matrix_type);
    } else {
      mat(p + "attn_q.weight", s.n_embd, nq, s.matrix_type);
      mat(p + "attn_k.weight", s.n_embd, nkv, s.matrix_type);
      mat(p + "attn_v.weight", s.n_embd, nkv, s.matrix_type);
    }
    mat(p + "attn_output.weight", nq, s.n_embd, s.matrix_type);
    const bool oss = s.arch == "gpt-oss";
    if (s.arch == "qwen2" || oss) {
      vec(p + "attn_q.bias", nq, 0.f);
      vec(p + "attn_k.bias", nkv, 0.f);
      vec(p + "attn_v.bias", nkv, 0.f);
    }
    if (oss) {  // the output's bias; sink logits of the order of the scores
      vec(p + "attn_output.bias", s.n_embd, 0.f);
      if (!w.add_tensor_f32(p + "attn_sinks.weight", TensorType::F32, {s.n_head}, random_vector(rng, s.n_head, 1.f)))
        qFatal("tiny model: sinks");
    }
    if (s.arch == "qwen3" || s.arch == "qwen3moe" || s.arch == "gemma3") {
      vec(p + "attn_q_norm.weight", s.head_dim, 1.f);
      vec(p + "attn_k_norm.weight", s.head_dim, 1.f);
    }
    if (gemma) {
      vec(p + "post_attention_norm.weight", s.n_embd, 1.f);
      vec(p + "post_ffw_norm.weight", s.n_embd, 1.f);
    }
    vec(p + (oss ? "post_attention_norm.weight" : "ffn_norm.weight"), s.n_embd, 1.f);
    if (s.n_expert > 0) {  // the router, then each expert's matrices as slices of one 3-D tensor
      mat(p + "ffn_gate_inp.weight", s.n_embd, s.n_expert, TensorType::F32);
      auto exps = [&](const std::string& name, int n_in, int n_out) {
        const auto v = random_vector(rng, static_cast<size_t>(n_in) * n_out * s.n_expert, 1.f / std::sqrt(static_cast<float>(n_in)));
        if (!w.add_tensor_f32(name, s.expert_type.value_or(s.matrix_type), {n_in, n_out, s.n_expert}, v))
          qFatal("tiny model: %s", name.c_str());
      };
      exps(p + "ffn_gate_exps.weight", s.n_embd, n_ff_exp);
      exps(p + "ffn_up_exps.weight", s.n_embd, n_ff_exp);
      exps(p + "ffn_down_exps.weight", n_ff_exp, s.n_embd);
      if (oss) {  // the router's and each expert's biases ([width, n_expert])
        vec(p + "ffn_gate_inp.bias", s.n_expert, 0.f);
        auto bias = [&](const std::string& name, int n) {
          if (!w.add_tensor_f32(name, TensorType::F32, {n, s.n_expert}, random_vector(rng, static_cast<size_t>(n) * s.n_expert, 0.1f)))
            qFatal("tiny model: %s", name.c_str());
        };
        bias(p + "ffn_gate_exps.bias", n_ff_exp);
        bias(p + "ffn_up_exps.bias", n_ff_exp);
        bias(p + "ffn_down_exps.bias", s.n_embd);
      }
    } else if (phi3) {  // gate and up in one matrix, the gate's rows first
      mat(p + "ffn_up.weight", s.n_embd, 2 * s.n_ff, s.matrix_type);
    } else {
      mat(p + "ffn_gate.weight", s.n_embd, s.n_ff, s.matrix_type);
      mat(p + "ffn_up.weight", s.n_embd, s.n_ff, s.matrix_type);
    }
    if (s.n_expert == 0) mat(p + "ffn_down.weight", s.n_ff, s.n_embd, s.matrix_type);
  }
  const std::string path = QDir::temp().filePath(QString::fromStdString(file_name)).toStdString();
  if (!w.write(path)) qFatal("tiny model: cannot write %s", path.c_str());
  return path;
}

// The tiny model of each architecture the tests use: every family switch
// exercised (gemma3: a short sliding window that prompts cross, head_dim !=
// n_embd / n_head, tied output; qwen2: biases, K-quant matrices; qwen3:
// QK-norm, Q8_0 matrices).
inline TinySpec tiny_spec(const std::string& arch) {
  TinySpec s;
  s.arch = arch;
  if (arch == "qwen3moe") {  // 8 experts of 32, 2 per token
    s.n_expert = 8;
    s.n_expert_used = 2;
    s.n_ff_exp = 32;
  }
  if (arch == "qwen3moe-q4_k") {  // the repacked Q4_K kernels on experts (256-wide rows)
    s.arch = "qwen3moe";
    s.n_expert = 8;
    s.n_expert_used = 3;
    s.n_embd = 256;
    s.n_ff_exp = 256;
    s.head_dim = 64;
    s.matrix_type = TensorType::Q4_K;
  }
  if (arch == "gpt-oss" || arch == "gpt-oss-mxfp4") {
    // 8 experts of 32, 3 per token, MXFP4 experts in the second; a window
    // of 4 on even layers; YaRN as the real one (factor 32 over 4096, base
    // 150000): its ramp spans rotation pairs 2 to 5 of head_dim 16's 8.
    s.arch = "gpt-oss";
    s.n_expert = 8;
    s.n_expert_used = 3;
    s.n_ff_exp = 32;
    s.sliding_window = 4;
    s.yarn_factor = 32.f;
    s.n_ctx_orig = 4096;
    s.rope_base = 150000.f;
    if (arch == "gpt-oss-mxfp4") s.expert_type = TensorType::MXFP4;
  }
  if (arch == "gpt-oss-mxfp4-wide") {  // the grouped MXFP4 kernels (rows of 256: whole groups), Q8_0 attention
    s = tiny_spec("gpt-oss-mxfp4");
    s.n_embd = 256;
    s.n_ff_exp = 288;  // 9 blocks: a group and a plain block
    s.head_dim = 64;
    s.matrix_type = TensorType::Q8_0;
  }
  if (arch == "mixtral") {  // llama with 4 experts of n_ff, 2 per token
    s.arch = "llama";
    s.n_expert = 4;
    s.n_expert_used = 2;
  }
  if (arch == "gemma3") {
    s.sliding_window = 4;
    s.swa_period = 2;
    s.tied = true;
    s.head_dim = 32;
    s.n_head_kv = 1;
  }
  if (arch == "gemma2") {  // caps low enough to bite on random weights
    s.sliding_window = 4;
    s.swa_period = 2;
    s.tied = true;
    s.attn_softcap = 2.f;
    s.final_softcap = 3.f;
  }
  if (arch == "phi3") {  // a partial rotation, the long factors (trained past 16) and their attention factor
    s.n_rot = 12;
    s.n_ctx_orig = 16;
    s.rope_attn_factor = 1.19f;
  }
  if (arch == "qwen3") s.matrix_type = TensorType::Q8_0;
  if (arch == "qwen3-wide") {  // prefill's Q8_0 row tiles (256- and 512-wide rows), K and V of 40 rows (not whole tiles)
    s.arch = "qwen3";
    s.n_embd = 256;
    s.n_ff = 512;
    s.n_head_kv = 1;
    s.head_dim = 40;
    s.matrix_type = TensorType::Q8_0;
  }
  if (arch == "qwen2") {
    s.n_embd = 256;
    s.n_ff = 512;
    s.head_dim = 64;
    s.matrix_type = TensorType::Q4_K;
    s.embd_type = TensorType::Q6_K;
  }
  return s;
}

// Greedy decoding of exactly n tokens (end-of-generation ignored).
inline GenerateOptions greedy(int n) {
  GenerateOptions o;
  o.n_predict = n;
  o.sampling.temperature = 0;
  o.ignore_eos = true;
  return o;
}

inline std::string test_data(const std::string& rel) { return std::string(PHASELAB_TEST_DATA) + "/" + rel; }

// tests/data/stories260K.gguf, loaded once per test program and shared.
inline std::shared_ptr<const Model> shared_stories() {
  static std::shared_ptr<const Model> m = [] {
    auto r = Model::load(test_data("stories260K.gguf"));
    if (!r) qFatal("%s", r.status().message().c_str());
    return std::shared_ptr<const Model>(*r);
  }();
  return m;
}

// The default model (Gemma 3 270M Q4_K_M): PHASELAB_DEFAULT_MODEL (set by
// scripts/test.sh) or the user's model folder; empty if absent.
inline std::string default_model_path() {
  if (const char* p = std::getenv("PHASELAB_DEFAULT_MODEL"); p && *p) return p;
  const char* home = std::getenv("HOME");
  const char* xdg = std::getenv("XDG_DATA_HOME");
  const std::string base = xdg && *xdg ? std::string(xdg) : std::string(home ? home : ".") + "/.local/share";
  const std::string p = base + "/PhaseLab/models/gemma-3-270m-q4_k_m.gguf";
  return QFile::exists(QString::fromStdString(p)) ? p : std::string();
}

}  // namespace phaselab::testing
