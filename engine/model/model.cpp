#include "phaselab/model.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "phaselab/jinja.h"
#include "phaselab/quant.h"

namespace phaselab {

namespace {

class Loader {
 public:
  Loader(const GgufFile& f, const ModelConfig& c) : f_(f), c_(c) {}

  // A matrix [n_in, n_out] that the kernels can compute with.
  Status matrix(const std::string& name, int64_t n_in, int64_t n_out, WeightView* out, bool required = true) {
    const GgufTensorInfo* t = f_.find_tensor(name);
    if (!t) {
      if (!required) return Status::ok();
      return invalid_file(f_.path() + ": tensor '" + name + "' is missing (is the file complete and really a " +
                          c_.arch_str + " model?)");
    }
    if (t->n_dims > 2 || t->ne[0] != n_in || t->ne[1] != n_out)
      return invalid_file(f_.path() + ": tensor '" + name + "' has shape [" + std::to_string(t->ne[0]) + ", " +
                          std::to_string(t->ne[1]) + "], expected [" + std::to_string(n_in) + ", " +
                          std::to_string(n_out) + "]");
    PHASELAB_TRY(computable(name, *t));
    out->data = t->data;
    out->type = t->type;
    out->n_in = n_in;
    out->n_out = n_out;
    out->row_bytes = row_size(t->type, n_in);
    bytes_ += t->n_bytes;
    return Status::ok();
  }

  // Rows [row0, row0 + n_out) of a fused matrix [n_in, n_total] (phi3's
  // attn_qkv and gate-up ffn_up): a view of those rows, nothing copied. The
  // tensor's bytes are counted once, with its first part (row0 == 0).
  Status matrix_part(const std::string& name, int64_t n_in, int64_t n_total, int64_t row0, int64_t n_out,
                     WeightView* out) {
    WeightView whole;
    const uint64_t before = bytes_;
    PHASELAB_TRY(matrix(name, n_in, n_total, &whole));
    if (row0 != 0) bytes_ = before;
    *out = whole;
    out->data = whole.row(row0);
    out->n_out = n_out;
    return Status::ok();
  }

  // A 3-D expert tensor [n_in, n_out, n_expert]: one view per expert.
  // Its bytes count in full and, for the active figure, n_used experts'.
  Status experts(const std::string& name, int64_t n_in, int64_t n_out, int n_expert, int n_used,
                 std::vector<WeightView>* out) {
    const GgufTensorInfo* t = f_.find_tensor(name);
    if (!t)
      return invalid_file(f_.path() + ": tensor '" + name + "' is missing (is the file complete and really a " +
                          c_.arch_str + " mixture-of-experts model?)");
    if (t->n_dims != 3 || t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n_expert)
      return invalid_file(f_.path() + ": tensor '" + name + "' has shape [" + std::to_string(t->ne[0]) + ", " +
                          std::to_string(t->ne[1]) + ", " + std::to_string(t->ne[2]) + "], expected [" +
                          std::to_string(n_in) + ", " + std::to_string(n_out) + ", " + std::to_string(n_expert) + "]");
    PHASELAB_TRY(computable(name, *t));
    const size_t rb = row_size(t->type, n_in);
    out->resize(n_expert);
    for (int e = 0; e < n_expert; e++) {
      WeightView& v = (*out)[e];
      v.data = t->data + static_cast<size_t>(e) * n_out * rb;
      v.type = t->type;
      v.n_in = n_in;
      v.n_out = n_out;
      v.row_bytes = rb;
    }
    bytes_ += t->n_bytes;
    inactive_ += static_cast<uint64_t>(n_expert - n_used) * n_out * rb;
    return Status::ok();
  }

  // A small vector (norm weights, biases), converted to F32 once.
  Status vec(const std::string& name, int64_t n, std::vector<float>* out, bool required = true) {
    const GgufTensorInfo* t = f_.find_tensor(name);
    if (!t) {
      if (!required) return Status::ok();
      return invalid_file(f_.path() + ": tensor '" + name + "' is missing");
    }
    if (static_cast<int64_t>(t->n_elements) != n)
      return invalid_file(f_.path() + ": tensor '" + name + "' has " + std::to_string(t->n_elements) +
                          " values, expected " + std::to_string(n));
    out->resize(n);
    PHASELAB_TRY(dequantize_row(t->type, t->data, out->data(), n).with_context(f_.path() + ": tensor '" + name + "'"));
    bytes_ += t->n_bytes;
    return Status::ok();
  }

  uint64_t bytes() const { return bytes_; }
  uint64_t inactive_bytes() const { return inactive_; }  // experts a decoded token does not read

 private:
  // The kernels compute with the tensor's type.
  Status computable(const std::string& name, const GgufTensorInfo& t) const {
    if (traits_of(t.type).can_dequantize) return Status::ok();
    return unsupported(f_.path() + ": tensor '" + name + "' has type " + std::string(tensor_type_name(t.type)) +
                       ", which PhaseLab cannot compute with yet (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                       "Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4); re-quantize the model");
  }

  const GgufFile& f_;
  const ModelConfig& c_;
  uint64_t bytes_ = 0;
  uint64_t inactive_ = 0;
};

}  // namespace

Result<std::shared_ptr<Model>> Model::load(const std::string& path) {
  auto file = GgufFile::open(path);
  if (!file) return file.status();
  return from_file(std::move(*file));
}

Result<std::shared_ptr<Model>> Model::from_file(std::shared_ptr<GgufFile> file) {
  if (!file) return invalid_argument("no file");
  const std::string path = file->path();
  auto cfg = ModelConfig::from_gguf(*file);
  if (!cfg) return cfg.status();
  auto tok = Tokenizer::from_gguf(*file);
  if (!tok) return tok.status().with_context(path + ": loading the vocabulary");
  auto m = std::make_shared<Model>();
  m->path_ = path;
  m->file_ = std::move(file);
  m->config_ = std::move(*cfg);
  m->tokenizer_ = std::move(*tok);
  const ModelConfig& c = m->config_;
  ModelWeights& w = m->weights_;
  if (m->tokenizer_->n_vocab() != c.n_vocab)
    return invalid_file(path + ": the vocabulary has " + std::to_string(m->tokenizer_->n_vocab()) +
                        " tokens but the model says " + std::to_string(c.n_vocab));

  Loader L(*m->file_, c);
  PHASELAB_TRY(L.matrix("token_embd.weight", c.n_embd, c.n_vocab, &w.tok_embd));
  PHASELAB_TRY(L.vec("output_norm.weight", c.n_embd, &w.output_norm));
  // Gemma 2 always computes the logits with the embedding matrix.
  if (!c.output_is_embd) PHASELAB_TRY(L.matrix("output.weight", c.n_embd, c.n_vocab, &w.output, false));
  if (!w.output.present()) {
    w.output = w.tok_embd;
    w.tied_output = true;
  }
  PHASELAB_TRY(L.vec("rope_freqs.weight", c.n_rot / 2, &w.rope_freq_factors, false));
  if (c.arch == Arch::phi3) {
    // Phi-3's two sets of RoPE frequency divisors: the short ones for the
    // original context, the long ones past it. One set is chosen per model,
    // as llama.cpp chooses at its default context (the trained one): long
    // when the model was trained past its original context (the 128k
    // releases), else short. Hugging Face switches on the current sequence
    // length instead (short below the original context).
    std::vector<float> longf, shortf;
    PHASELAB_TRY(L.vec("rope_factors_long.weight", c.n_rot / 2, &longf, false));
    PHASELAB_TRY(L.vec("rope_factors_short.weight", c.n_rot / 2, &shortf, false));
    const bool use_long = c.n_ctx_train > c.n_ctx_orig && !longf.empty();
    if (use_long) w.rope_freq_factors = std::move(longf);
    else if (!shortf.empty()) w.rope_freq_factors = std::move(shortf);
  }

  // Every layer has at least 9 tensors (2 norms, Q, K, V, output, gate, up,
  // down; 6 where Q/K/V and gate/up are fused): refuse a block count the
  // file cannot hold before sizing for it.
  const uint64_t per_layer = 9 - (c.fused_qkv ? 2 : 0) - (c.fused_gate_up ? 1 : 0);
  if (static_cast<uint64_t>(c.n_layer) * per_layer > m->file_->tensors().size())
    return invalid_file(path + ": '" + c.arch_str + ".block_count' = " + std::to_string(c.n_layer) +
                        " layers, but the file holds only " + std::to_string(m->file_->tensors().size()) +
                        " tensors (tensor 'blk." + std::to_string(c.n_layer - 1) + ".attn_norm.weight' is missing?)");

  const int64_t nq = c.n_embd_q(), nkv = c.n_embd_kv();
  w.layers.resize(c.n_layer);
  for (int il = 0; il < c.n_layer; il++) {
    LayerWeights& l = w.layers[il];
    const std::string p = "blk." + std::to_string(il) + ".";
    PHASELAB_TRY(L.vec(p + "attn_norm.weight", c.n_embd, &l.attn_norm));
    if (c.fused_qkv) {  // rows: Q (nq), K (nkv), V (nkv)
      const std::string qkv = p + "attn_qkv.weight";
      PHASELAB_TRY(L.matrix_part(qkv, c.n_embd, nq + 2 * nkv, 0, nq, &l.wq));
      PHASELAB_TRY(L.matrix_part(qkv, c.n_embd, nq + 2 * nkv, nq, nkv, &l.wk));
      PHASELAB_TRY(L.matrix_part(qkv, c.n_embd, nq + 2 * nkv, nq + nkv, nkv, &l.wv));
    } else {
      PHASELAB_TRY(L.matrix(p + "attn_q.weight", c.n_embd, nq, &l.wq));
      PHASELAB_TRY(L.matrix(p + "attn_k.weight", c.n_embd, nkv, &l.wk));
      PHASELAB_TRY(L.matrix(p + "attn_v.weight", c.n_embd, nkv, &l.wv));
    }
    PHASELAB_TRY(L.matrix(p + "attn_output.weight", nq, c.n_embd, &l.wo));
    if (c.attn_bias) {
      PHASELAB_TRY(L.vec(p + "attn_q.bias", nq, &l.bq));
      PHASELAB_TRY(L.vec(p + "attn_k.bias", nkv, &l.bk));
      PHASELAB_TRY(L.vec(p + "attn_v.bias", nkv, &l.bv));
    }
    if (c.attn_out_bias) PHASELAB_TRY(L.vec(p + "attn_output.bias", c.n_embd, &l.bo));
    if (c.attn_sinks) PHASELAB_TRY(L.vec(p + "attn_sinks.weight", c.n_head, &l.attn_sinks));
    if (c.qk_norm) {
      PHASELAB_TRY(L.vec(p + "attn_q_norm.weight", c.head_dim, &l.q_norm));
      PHASELAB_TRY(L.vec(p + "attn_k_norm.weight", c.head_dim, &l.k_norm));
    }
    if (c.post_norms) {
      PHASELAB_TRY(L.vec(p + "post_attention_norm.weight", c.n_embd, &l.post_attn_norm));
      PHASELAB_TRY(L.vec(p + "post_ffw_norm.weight", c.n_embd, &l.post_ffw_norm));
    }
    // gpt-oss names the FFN's input norm post_attention_norm.
    PHASELAB_TRY(L.vec(p + (c.arch == Arch::gpt_oss ? "post_attention_norm.weight" : "ffn_norm.weight"), c.n_embd, &l.ffn_norm));
    // A MoE model's layer is MoE exactly when it has a router (Mixtral's
    // are all; the loader does not assume it).
    if (c.is_moe() && m->file_->find_tensor(p + "ffn_gate_inp.weight")) {
      PHASELAB_TRY(L.matrix(p + "ffn_gate_inp.weight", c.n_embd, c.n_expert, &l.router));
      PHASELAB_TRY(L.experts(p + "ffn_gate_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert, c.n_expert_used, &l.gate_exps));
      PHASELAB_TRY(L.experts(p + "ffn_up_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert, c.n_expert_used, &l.up_exps));
      PHASELAB_TRY(L.experts(p + "ffn_down_exps.weight", c.n_ff_exp, c.n_embd, c.n_expert, c.n_expert_used, &l.down_exps));
      if (c.expert_bias) {
        const int64_t E = c.n_expert;
        PHASELAB_TRY(L.vec(p + "ffn_gate_inp.bias", E, &l.router_b));
        PHASELAB_TRY(L.vec(p + "ffn_gate_exps.bias", E * c.n_ff_exp, &l.gate_exps_b));
        PHASELAB_TRY(L.vec(p + "ffn_up_exps.bias", E * c.n_ff_exp, &l.up_exps_b));
        PHASELAB_TRY(L.vec(p + "ffn_down_exps.bias", E * c.n_embd, &l.down_exps_b));
      }
      continue;
    }
    if (c.arch == Arch::qwen3moe || c.arch == Arch::gpt_oss)
      return invalid_file(path + ": layer " + std::to_string(il) + " has no router (blk." + std::to_string(il) +
                          ".ffn_gate_inp.weight): every " + c.arch_str + " layer is a mixture of experts");
    if (c.fused_gate_up) {  // rows: gate (n_ff), up (n_ff)
      const std::string up = p + "ffn_up.weight";
      PHASELAB_TRY(L.matrix_part(up, c.n_embd, 2 * static_cast<int64_t>(c.n_ff), 0, c.n_ff, &l.w_gate));
      PHASELAB_TRY(L.matrix_part(up, c.n_embd, 2 * static_cast<int64_t>(c.n_ff), c.n_ff, c.n_ff, &l.w_up));
    } else {
      PHASELAB_TRY(L.matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff, &l.w_gate));
      PHASELAB_TRY(L.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff, &l.w_up));
    }
    PHASELAB_TRY(L.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd, &l.w_down));
  }
  // Per decoded token every matrix is read once, the embedding only one row.
  m->weight_bytes_ = L.bytes() - (w.tied_output ? 0 : w.tok_embd.row_bytes * (c.n_vocab - 1));
  m->active_weight_bytes_ = m->weight_bytes_ - L.inactive_bytes();
  // The model's own chat template, parsed once. One that does not parse
  // leaves the recognised family to render (chat_template_error says why;
  // the front ends show it), never a refusal to load.
  if (auto t = m->file_->get_string("tokenizer.chat_template")) {
    try {
      m->chat_jinja_ = std::make_shared<const jinja::Template>(*t);
      m->chat_tool_calls_ = detect_tool_call_syntax(*m->chat_jinja_);
    } catch (const jinja::Error& e) {
      m->chat_template_error_ = std::string(e.what()) + "; the built-in '" +
                                chat_template_family_name(m->chat_template()) + "' format renders chats instead";
    }
  }
  return m;
}

ChatTemplateFamily Model::chat_template() const {
  if (auto t = file_->get_string("tokenizer.chat_template")) return detect_chat_template(*t);
  // No template: a base (pre-trained) model. Such models answer a plain
  // "User: / Assistant:" transcript far better than the turn markers of
  // their instruction-tuned siblings (the default Gemma 3 270M is one), and
  // better still after a few example exchanges.
  return ChatTemplateFamily::plain_fewshot;
}

bool Model::has_chat_template() const { return file_->get_string("tokenizer.chat_template").has_value(); }

ChatFormat Model::chat_format() const {
  ChatFormat f(chat_template());
  f.jinja = chat_jinja_;
  f.tool_calls = chat_tool_calls_;
  const Tokenizer& tok = *tokenizer_;
  if (tok.bos() >= 0) f.bos_token = std::string(tok.token_text(tok.bos()));
  if (tok.eos() >= 0) f.eos_token = std::string(tok.token_text(tok.eos()));
  return f;
}

std::string Model::type_mix() const {
  std::map<std::string, uint64_t> bytes;
  uint64_t total = 0;
  for (const auto& t : file_->tensors()) {
    bytes[std::string(tensor_type_name(t.type))] += t.n_bytes;
    total += t.n_bytes;
  }
  std::vector<std::pair<uint64_t, std::string>> order;
  for (auto& [k, v] : bytes) order.emplace_back(v, k);
  std::sort(order.rbegin(), order.rend());
  std::string out;
  for (auto& [v, k] : order) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.0f%%", out.empty() ? "" : ", ", k.c_str(), 100.0 * v / std::max<uint64_t>(total, 1));
    out += buf;
  }
  return out;
}

}  // namespace phaselab
