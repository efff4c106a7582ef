// ModelConfig: the hyperparameters and switches of the one parameterized
// decoder-only transformer, read from GGUF metadata (never from constants).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "phaselab/gguf.h"
#include "phaselab/status.h"

namespace phaselab {

enum class Arch { llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, gpt_oss };
// Of the gate in a gated FFN: silu(g) * u, gelu(g) * u, or gpt-oss's clamped
// form: g' = min(g, 7), u' = clamp(u, -7, 7), g' * sigmoid(1.702 g') * (u' + 1).
enum class Activation { silu, gelu_tanh, swiglu_oai };
// How a MoE router's logits become the chosen experts' weights:
//  softmax:        softmax over all experts, the top k (renormalised to sum 1
//                  when ModelConfig::expert_weights_norm);
//  softmax_top_k:  the top k logits, then a softmax over those k (gpt-oss).
enum class ExpertGating { softmax, softmax_top_k };

const char* arch_name(Arch a);

struct ModelConfig {
  Arch arch = Arch::llama;
  std::string arch_str;   // general.architecture as written
  std::string name;       // general.name, may be empty

  int n_vocab = 0;
  int n_ctx_train = 0;    // the context the model was trained for
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;       // of Q and K (key_length)
  int head_dim_v = 0;     // of V (value_length)
  int n_ff = 0;
  int n_rot = 0;          // rotated dims per head
  float rms_eps = 1e-5f;

  float rope_base = 10000.f;      // global layers
  float rope_base_swa = 10000.f;  // sliding-window layers
  bool rope_neox = false;         // rotate (x[i], x[i + n_rot/2]) instead of adjacent pairs
  // phi3: cos and sin are both multiplied by this (rope.scaling.attn_factor),
  // so the rotated dims of Q and K each scale by it.
  float rope_attn_factor = 1.f;
  // phi3: the context the short RoPE factors are for (rope.scaling.
  // original_context_length); the long ones apply past it (see Model).
  int n_ctx_orig = 0;
  // RoPE scaling (rope.scaling.type): linear multiplies every angle by
  // rope_freq_scale = 1 / factor; YaRN (gpt-oss) only the low frequencies:
  // the rotation pairs that turn fewer than yarn_beta_slow times over
  // n_ctx_orig positions are scaled, those that turn more than
  // yarn_beta_fast times keep their angle, a linear ramp between; cos and
  // sin then scale by 1 + 0.1 ln(factor) (ref::rope_angles). yarn_ext_factor
  // 0: no YaRN. llama.cpp's defaults for the betas (it reads no key).
  // The sliding-window layers' scale: the same for Gemma 2 and gpt-oss, 1
  // (unscaled) for Gemma 3, whose 4B-27B files scale only the global layers
  // (as llama.cpp applies it).
  float rope_freq_scale = 1.f;
  float rope_freq_scale_swa = 1.f;
  float yarn_ext_factor = 0.f;
  float yarn_beta_fast = 32.f, yarn_beta_slow = 1.f;
  bool rope_scaled() const { return rope_freq_scale != 1.f || rope_freq_scale_swa != 1.f || yarn_ext_factor != 0.f; }
  float rope_freq_scale_of(int il) const { return is_swa(il) ? rope_freq_scale_swa : rope_freq_scale; }

  bool attn_bias = false;         // qwen2: biases on Q, K, V (gpt-oss: where the file has them)
  bool attn_out_bias = false;     // gpt-oss: a bias on the attention output
  bool attn_sinks = false;        // gpt-oss: per query head a learned logit in every softmax's denominator
  bool qk_norm = false;           // qwen3, gemma3: RMSNorm per head of Q and K
  bool post_norms = false;        // gemma2, gemma3: norms after attention and FFN
  bool fused_qkv = false;         // phi3: one attn_qkv matrix (Q rows, then K, then V); else attn_q/k/v
  bool fused_gate_up = false;     // phi3: ffn_up holds 2*n_ff rows, the gate's first; no ffn_gate
  bool output_is_embd = false;    // gemma2: the logits always come from token_embd (an output.weight is ignored)
  Activation act = Activation::silu;
  float embd_scale = 1.f;         // gemma: sqrt(n_embd)
  float attn_scale = 0.f;         // multiplier on Q·K
  float final_logit_softcap = 0;  // 0: none
  float attn_logit_softcap = 0;   // 0: none

  // Mixture of experts (qwen3moe; llama with experts: Mixtral). A layer is
  // MoE when it has a router (ffn_gate_inp): per token the router's softmax
  // over n_expert picks the n_expert_used most likely, their weights
  // renormalised to sum 1, and the token's FFN output is the weighted sum of
  // those experts' SiLU-gated FFNs of width n_ff_exp. 0: a dense model.
  // gpt-oss differs: ExpertGating::softmax_top_k, biases on the router and
  // on every expert's three products, and the swiglu_oai activation.
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;
  ExpertGating expert_gating = ExpertGating::softmax;
  bool expert_weights_norm = true;
  bool expert_bias = false;              // gpt-oss: biases on the router and the experts
  Activation expert_act = Activation::silu;
  bool is_moe() const { return n_expert > 0; }

  int sliding_window = 0;            // 0: no sliding-window layers
  std::vector<uint8_t> layer_is_swa;  // per layer: 1 = local (sliding window)

  int n_embd_kv() const { return n_head_kv * head_dim; }
  int n_embd_q() const { return n_head * head_dim; }
  bool is_swa(int il) const { return il < static_cast<int>(layer_is_swa.size()) && layer_is_swa[il]; }
  // Per-layer facts every forward pass reads from here: the RoPE base and
  // how many keys back a query sees (0: all of them).
  float rope_base_of(int il) const { return is_swa(il) ? rope_base_swa : rope_base; }
  int window_of(int il) const { return is_swa(il) ? sliding_window : 0; }

  static Result<ModelConfig> from_gguf(const GgufFile& file);
};

}  // namespace phaselab
