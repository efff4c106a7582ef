// The random-weight models whose logits are checked against llama.cpp's
// (tests/data/reference-models): one per supported family, with the tensor
// names, shapes, types and metadata keys of the real ones, each exercising
// its family's switches. make_reference_models writes them; the .kld files
// beside them are llama-perplexity's output for them (README there).
#pragma once

#include <string>
#include <vector>

#include "tiny_model.h"

namespace phaselab::testing {

struct ReferenceModel {
  std::string name;  // file stem: <name>.gguf, <name>.kld
  TinySpec spec;
  const char* checks;  // what it exercises, for the README and test names
};

inline std::vector<ReferenceModel> reference_models() {
  std::vector<ReferenceModel> r;
  // Two layers each (a local and a global one where the family has both):
  // small files, every code path.
  auto two = [](TinySpec s) {
    s.n_layer = 2;
    return s;
  };
  r.push_back({"llama-f32", two(tiny_spec("llama")), "adjacent-pair RoPE, GQA, untied output"});
  r.push_back({"qwen2-q4_k", two(tiny_spec("qwen2")), "Q/K/V biases, Q4_K matrices, Q6_K embedding"});
  r.push_back({"qwen3-q8_0", two(tiny_spec("qwen3")), "QK-norm, NeoX RoPE, Q8_0 matrices"});
  r.push_back({"qwen3moe-f32", two(tiny_spec("qwen3moe")),
               "mixture of experts: softmax router over 8, top-2 renormalised, experts of 32, QK-norm"});
  {
    TinySpec s = two(tiny_spec("mixtral"));
    s.matrix_type = TensorType::Q8_0;
    s.seed = 4;
    r.push_back({"mixtral-q8_0", s, "llama with 4 experts of n_ff, top-2, Q8_0 experts"});
  }
  r.push_back({"gpt-oss-f32", two(tiny_spec("gpt-oss")),
               "attention sinks, Q/K/V/output biases, YaRN (factor 32 over 4096), window 4 on even layers, 8 experts "
               "with biases, top-3 logits then softmax, clamped SwiGLU"});
  r.push_back({"gpt-oss-mxfp4", two(tiny_spec("gpt-oss-mxfp4")), "as gpt-oss-f32 with MXFP4 experts"});
  r.push_back({"gemma2-f32", two(tiny_spec("gemma2")),
               "attention and final logit soft-capping, sliding window 4 on even layers, post-norms, GELU, tied"});
  {
    TinySpec s = two(tiny_spec("gemma2"));
    s.matrix_type = TensorType::Q8_0;
    s.seed = 2;
    r.push_back({"gemma2-q8_0", s, "as gemma2-f32 with Q8_0 matrices"});
  }
  r.push_back({"gemma3-f32", two(tiny_spec("gemma3")), "QK-norm, sliding window 4, two RoPE bases, head_dim 32 != n_embd/n_head"});
  {
    TinySpec s = two(tiny_spec("gemma3"));
    s.yarn_factor = 8;  // as Gemma 3 4B-27B: linear scaling of the global layers only
    s.rope_scaling = "linear";
    s.seed = 5;
    r.push_back({"gemma3-linear-f32", s, "linear RoPE scaling 8 on the global layers (the local ones unscaled)"});
  }
  r.push_back({"phi3-f32", two(tiny_spec("phi3")),
               "fused QKV and gate-up, partial rotation (12 of 16), long RoPE factors, attn_factor 1.19"});
  {
    TinySpec s = two(tiny_spec("phi3"));
    s.fused_qkv = false;
    s.n_rot = 0;
    s.n_ctx_orig = 256;  // = n_ctx_train: the short factors
    s.rope_attn_factor = 0;
    s.matrix_type = TensorType::Q8_0;
    s.seed = 3;
    r.push_back({"phi3-split-q8_0", s, "separate Q/K/V, short RoPE factors, Q8_0 matrices"});
  }
  return r;
}

// A shape twin of Qwen3-30B-A3B's layers (n_embd 2048, 32 query and 4 KV
// heads of 128, 128 experts of 768, 8 per token; Hugging Face's config), all
// matrices Q4_K, for measuring MoE decode speed: n_layer of its 48 layers
// and the tiny vocabulary, so that a file of a few GB holds it. Its output
// is noise; per layer it does exactly the real model's work.
inline TinySpec qwen3moe_30b_a3b_twin(int n_layer) {
  TinySpec s;
  s.arch = "qwen3moe";
  s.n_embd = 2048;
  s.n_head = 32;
  s.n_head_kv = 4;
  s.head_dim = 128;
  s.n_ff = 6144;
  s.n_layer = n_layer;
  s.n_expert = 128;
  s.n_expert_used = 8;
  s.n_ff_exp = 768;
  s.matrix_type = TensorType::Q4_K;
  s.embd_type = TensorType::Q4_K;
  s.n_ctx_train = 4096;
  return s;
}

// A shape twin of gpt-oss-20b's layers (n_embd 2880, 64 query and 8 KV
// heads of 64, 32 experts of 2880, 4 per token, window 128 on even layers,
// YaRN 32 over 4096; Hugging Face's config), experts MXFP4 and the rest Q8_0
// (the MXFP4_MOE mix), n_layer of its 24 layers and the tiny vocabulary.
inline TinySpec gpt_oss_20b_twin(int n_layer) {
  TinySpec s = tiny_spec("gpt-oss-mxfp4");
  s.n_embd = 2880;
  s.n_head = 64;
  s.n_head_kv = 8;
  s.head_dim = 64;
  s.n_ff = 2880;
  s.n_layer = n_layer;
  s.n_expert = 32;
  s.n_expert_used = 4;
  s.n_ff_exp = 2880;
  s.sliding_window = 128;
  s.matrix_type = TensorType::Q8_0;
  s.embd_type = TensorType::Q8_0;
  s.n_ctx_train = 4096;
  return s;
}

}  // namespace phaselab::testing
