#include "phaselab/model_config.h"

#include <cmath>
#include <cstdint>

namespace phaselab {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::llama: return "llama";
    case Arch::qwen2: return "qwen2";
    case Arch::qwen3: return "qwen3";
    case Arch::qwen3moe: return "qwen3moe";
    case Arch::gemma2: return "gemma2";
    case Arch::gemma3: return "gemma3";
    case Arch::phi3: return "phi3";
    case Arch::gpt_oss: return "gpt-oss";
  }
  return "?";
}

namespace {

// An integer hyperparameter that may be a scalar or a per-layer array; PhaseLab
// supports only uniform values.
Status read_uniform_int(const GgufFile& f, const std::string& key, int* out, bool required) {
  const GgufValue* v = f.find(key);
  if (!v) {
    if (required) return invalid_file(f.path() + ": missing metadata '" + key + "' (is this a complete model file?)");
    return Status::ok();
  }
  if (v->is_integer()) {
    if (v->i <= 0 || v->i > (1 << 30)) return invalid_file(f.path() + ": '" + key + "' = " + std::to_string(v->i) + " is out of range");
    *out = static_cast<int>(v->i);
    return Status::ok();
  }
  if (v->type == GgufValueType::ARRAY && v->elems && v->count > 0) {
    const int64_t first = v->int_at(0);
    for (uint64_t k = 1; k < v->count; k++)
      if (v->int_at(k) != first)
        return unsupported(f.path() + ": '" + key + "' varies per layer; PhaseLab supports uniform layers only");
    if (first <= 0 || first > (1 << 30)) return invalid_file(f.path() + ": '" + key + "' is out of range");
    *out = static_cast<int>(first);
    return Status::ok();
  }
  return invalid_file(f.path() + ": '" + key + "' is not an integer");
}

// A float hyperparameter (float or integer in the file): finite, within
// [lo, hi] (above lo when positive is set).
Status read_float(const GgufFile& f, const std::string& key, double def, double lo, double hi, bool positive, float* out) {
  double x = def;
  if (const GgufValue* v = f.find(key)) {
    if (v->is_float()) x = v->f;
    else if (v->is_integer()) x = static_cast<double>(v->i);
    else return invalid_file(f.path() + ": '" + key + "' is not a number");
    if (!std::isfinite(x) || x < lo || x > hi || (positive && x <= lo))
      return invalid_file(f.path() + ": '" + key + "' = " + v->to_string(0) + " is out of range");
  }
  *out = static_cast<float>(x);
  return Status::ok();
}

constexpr int kMaxLayers = 1 << 16;
constexpr int64_t kMaxWidth = 1 << 30;

}  // namespace

Result<ModelConfig> ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  const auto arch = f.get_string("general.architecture");
  if (!arch) return invalid_file(f.path() + ": missing general.architecture (not a model file?)");
  c.arch_str = std::string(*arch);
  if (c.arch_str == "llama") c.arch = Arch::llama;
  else if (c.arch_str == "qwen2") c.arch = Arch::qwen2;
  else if (c.arch_str == "qwen3") c.arch = Arch::qwen3;
  else if (c.arch_str == "qwen3moe") c.arch = Arch::qwen3moe;
  else if (c.arch_str == "gemma2") c.arch = Arch::gemma2;
  else if (c.arch_str == "gemma3") c.arch = Arch::gemma3;
  else if (c.arch_str == "phi3") c.arch = Arch::phi3;
  else if (c.arch_str == "gpt-oss") c.arch = Arch::gpt_oss;
  else
    return unsupported(f.path() + ": architecture '" + c.arch_str +
                       "' is not supported (PhaseLab runs llama (and Mixtral), qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3 and "
                       "gpt-oss models)");
  if (auto n = f.get_string("general.name")) c.name = std::string(*n);

  const std::string a = c.arch_str + ".";
  PHASELAB_TRY(read_uniform_int(f, a + "embedding_length", &c.n_embd, true));
  PHASELAB_TRY(read_uniform_int(f, a + "block_count", &c.n_layer, true));
  PHASELAB_TRY(read_uniform_int(f, a + "attention.head_count", &c.n_head, true));
  c.n_head_kv = c.n_head;
  PHASELAB_TRY(read_uniform_int(f, a + "attention.head_count_kv", &c.n_head_kv, false));
  PHASELAB_TRY(read_uniform_int(f, a + "feed_forward_length", &c.n_ff, c.arch != Arch::qwen3moe && c.arch != Arch::gpt_oss));
  c.n_ctx_train = 2048;
  PHASELAB_TRY(read_uniform_int(f, a + "context_length", &c.n_ctx_train, false));
  if (c.n_embd % c.n_head != 0 && !f.find(a + "attention.key_length"))
    return invalid_file(f.path() + ": embedding_length is not a multiple of head_count");
  c.head_dim = c.n_embd / c.n_head;
  PHASELAB_TRY(read_uniform_int(f, a + "attention.key_length", &c.head_dim, false));
  c.head_dim_v = c.head_dim;
  PHASELAB_TRY(read_uniform_int(f, a + "attention.value_length", &c.head_dim_v, false));
  if (c.head_dim_v != c.head_dim)
    return unsupported(f.path() + ": key_length != value_length is not supported");
  c.n_rot = c.head_dim;
  PHASELAB_TRY(read_uniform_int(f, a + "rope.dimension_count", &c.n_rot, false));
  if (c.n_rot > c.head_dim || c.n_rot % 2) return invalid_file(f.path() + ": rope.dimension_count is invalid");
  if (c.n_head % c.n_head_kv != 0)
    return invalid_file(f.path() + ": head_count " + std::to_string(c.n_head) + " is not a multiple of head_count_kv " +
                        std::to_string(c.n_head_kv));

  if (c.n_layer > kMaxLayers)
    return invalid_file(f.path() + ": '" + a + "block_count' = " + std::to_string(c.n_layer) + " is out of range (at most " +
                        std::to_string(kMaxLayers) + ")");
  // Widths the engine computes in int: their products must fit too.
  if (static_cast<int64_t>(c.n_head) * c.head_dim > kMaxWidth)
    return invalid_file(f.path() + ": '" + a + "attention.head_count' x key_length = " +
                        std::to_string(static_cast<int64_t>(c.n_head) * c.head_dim) + " is out of range");

  PHASELAB_TRY(read_float(f, a + "attention.layer_norm_rms_epsilon", 1e-5, 0.0, 1.0, false, &c.rms_eps));
  PHASELAB_TRY(read_float(f, a + "rope.freq_base", 10000.0, 0.0, 1e30, true, &c.rope_base));
  // Gemma 2's and gpt-oss's local layers default to the global base; Gemma 3's to 10000.
  PHASELAB_TRY(read_float(f, a + "rope.freq_base_swa",
                          c.arch == Arch::gemma2 || c.arch == Arch::gpt_oss ? c.rope_base : 10000.0, 0.0, 1e30, true,
                          &c.rope_base_swa));
  // RoPE scaling, as llama.cpp applies it at its default settings.
  PHASELAB_TRY(read_float(f, a + "rope.scaling.attn_factor", 1.0, 0.0, 1e3, true, &c.rope_attn_factor));
  c.n_ctx_orig = c.n_ctx_train;
  PHASELAB_TRY(read_uniform_int(f, a + "rope.scaling.original_context_length", &c.n_ctx_orig, false));
  const auto sc = f.get_string(a + "rope.scaling.type");
  float factor = 1.f;
  if (sc && *sc != "none" && !sc->empty())
    PHASELAB_TRY(read_float(f, a + "rope.scaling.factor", 1.0, 1e-3, 1e6, true, &factor));
  // A factor of 1 (or none) scales nothing, whatever the type says.
  if (sc && *sc != "none" && !sc->empty() && factor != 1.f) {
    if (*sc == "yarn" && factor < 1.f)
      return invalid_file(f.path() + ": YaRN 'rope.scaling.factor' = " + std::to_string(factor) +
                          " is below 1 (YaRN extends a context)");
    if (*sc != "linear" && *sc != "yarn")
      return unsupported(f.path() + ": RoPE scaling '" + std::string(*sc) +
                         "' is not supported (PhaseLab applies linear and YaRN scaling)");
    c.rope_freq_scale = 1.f / factor;
    if (c.arch == Arch::gemma2 || c.arch == Arch::gpt_oss) c.rope_freq_scale_swa = c.rope_freq_scale;
    if (*sc == "yarn") {
      c.yarn_ext_factor = 1.f;
      // llama.cpp's attention factor: its YaRN magnitude for the factor,
      // cancelled by the one rope applies again (so 1 up to rounding), times
      // the file's attn_factor.
      const float mscale = factor <= 1.f ? 1.f : 0.1f * std::log(factor) + 1.f;
      c.rope_attn_factor *= mscale * (1.f / (1.f + 0.1f * std::log(factor)));
    }
  }

  // Vocabulary size: from the token list (the metadata key is often absent).
  if (const GgufValue* toks = f.find("tokenizer.ggml.tokens"); toks && toks->type == GgufValueType::ARRAY)
    c.n_vocab = static_cast<int>(toks->count);
  if (const GgufValue* nv = f.find(a + "vocab_size")) {
    if (!nv->is_integer() || nv->i <= 0 || nv->i > INT32_MAX)
      return invalid_file(f.path() + ": '" + a + "vocab_size' = " + nv->to_string(0) + " is not a positive 32-bit integer");
    c.n_vocab = static_cast<int>(nv->i);
  }
  if (c.n_vocab <= 0) return invalid_file(f.path() + ": no vocabulary (tokenizer.ggml.tokens missing)");

  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  c.layer_is_swa.assign(c.n_layer, 0);
  switch (c.arch) {
    case Arch::llama: break;
    case Arch::qwen2: c.rope_neox = true; c.attn_bias = true; break;
    case Arch::qwen3:
    case Arch::qwen3moe: c.rope_neox = true; c.qk_norm = true; break;
    case Arch::gpt_oss: {
      c.rope_neox = true;
      c.attn_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
      c.attn_out_bias = true;
      c.attn_sinks = true;
      c.expert_gating = ExpertGating::softmax_top_k;
      c.expert_weights_norm = false;
      c.expert_bias = true;
      c.expert_act = Activation::swiglu_oai;
      // Every other layer from layer 0 is local (the period may be given).
      PHASELAB_TRY(read_uniform_int(f, a + "attention.sliding_window", &c.sliding_window, true));
      int period = 2;
      if (const GgufValue* pat = f.find(a + "attention.sliding_window_pattern"); pat && pat->is_integer() && pat->i > 0)
        period = static_cast<int>(std::min<int64_t>(pat->i, 1 << 20));
      for (int il = 0; il < c.n_layer; il++) c.layer_is_swa[il] = (il % period) != (period - 1);
      break;
    }
    case Arch::gemma2:
    case Arch::gemma3: {
      const bool g2 = c.arch == Arch::gemma2;
      c.rope_neox = true;
      c.qk_norm = !g2;
      c.post_norms = true;
      c.output_is_embd = g2;
      c.act = Activation::gelu_tanh;
      c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
      // Gemma 2 27B (46 layers) and Gemma 3 27B (62) scale queries by
      // 1/sqrt(n_embd / n_head); the others by 1/sqrt(head_dim). The file
      // does not say which: the layer count picks the 27B.
      if (c.n_layer == (g2 ? 46 : 62)) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head));
      c.sliding_window = g2 ? 4096 : 512;
      if (const GgufValue* sw = f.find(a + "attention.sliding_window")) {
        if (!sw->is_integer() || sw->i < 0 || sw->i > (1 << 30))
          return invalid_file(f.path() + ": '" + a + "attention.sliding_window' = " + sw->to_string(0) + " is out of range");
        c.sliding_window = static_cast<int>(sw->i);
      }
      // Layer il is local unless il % period == period - 1 (Gemma 2: every
      // other layer from layer 0; Gemma 3: five local, one global). Gemma 3
      // files may list the layers instead; Gemma 2's period is a scalar.
      const GgufValue* pat = f.find(a + "attention.sliding_window_pattern");
      if (!g2 && pat && pat->type == GgufValueType::ARRAY && pat->elems) {
        for (int il = 0; il < c.n_layer && il < static_cast<int>(pat->count); il++) c.layer_is_swa[il] = pat->int_at(il) != 0;
      } else {
        int period = g2 ? 2 : 6;
        if (pat && pat->is_integer() && pat->i > 0) period = static_cast<int>(pat->i);
        for (int il = 0; il < c.n_layer; il++) c.layer_is_swa[il] = (il % period) != (period - 1);
      }
      if (c.sliding_window == 0) c.layer_is_swa.assign(c.n_layer, 0);
      break;
    }
    case Arch::phi3: {
      c.rope_neox = true;
      // Both layouts occur: fused (the converter's) or split Q/K/V.
      c.fused_qkv = f.find_tensor("blk.0.attn_qkv.weight") != nullptr;
      c.fused_gate_up = true;
      // attention.sliding_window is not applied: llama.cpp turns it off for
      // phi3 as well, and PhaseLab's logits are checked against its.
      break;
    }
  }
  // Experts: qwen3moe always; llama (Mixtral) when expert_count says so.
  const GgufValue* n_exp = f.find(a + "expert_count");
  const bool zero_experts = n_exp && n_exp->is_integer() && n_exp->i == 0;  // some llama files say 0
  const bool always_moe = c.arch == Arch::qwen3moe || c.arch == Arch::gpt_oss;
  if ((always_moe || c.arch == Arch::llama) && !zero_experts) {
    PHASELAB_TRY(read_uniform_int(f, a + "expert_count", &c.n_expert, always_moe));
    if (c.n_expert > 0) {
      PHASELAB_TRY(read_uniform_int(f, a + "expert_used_count", &c.n_expert_used, true));
      if (c.n_expert > 4096 || c.n_expert_used > c.n_expert)
        return invalid_file(f.path() + ": " + std::to_string(c.n_expert_used) + " of " + std::to_string(c.n_expert) +
                            " experts per token is out of range");
      // Mixtral's experts are feed_forward_length wide; Qwen3-MoE's say so
      // (else the dense width shared among the k used).
      c.n_ff_exp = c.arch == Arch::llama ? c.n_ff : (c.n_ff > 0 ? c.n_ff / c.n_expert_used : 0);
      PHASELAB_TRY(read_uniform_int(f, a + "expert_feed_forward_length", &c.n_ff_exp,
                                    c.n_ff_exp == 0 || c.arch == Arch::gpt_oss));
    }
  }
  if (c.n_ff == 0) c.n_ff = c.n_ff_exp;  // (the buffers of the dense path are never used then)

  // Gemma 2 caps attention logits at 50 and the final ones at 30 unless the
  // file says otherwise; other families cap only where the file says so.
  const bool g2 = c.arch == Arch::gemma2;
  PHASELAB_TRY(read_float(f, a + "final_logit_softcapping", g2 ? 30.0 : 0.0, 0.0, 1e30, false, &c.final_logit_softcap));
  PHASELAB_TRY(read_float(f, a + "attn_logit_softcapping", g2 ? 50.0 : 0.0, 0.0, 1e30, false, &c.attn_logit_softcap));
  return c;
}

}  // namespace phaselab
