// Model = Config (hyperparameters) + Weights (views into the memory-mapped
// GGUF, still quantized) + the tokenizer. Loading validates that every tensor
// the architecture needs is present with the shape the config implies.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "phaselab/chat_template.h"
#include "phaselab/gguf.h"
#include "phaselab/model_config.h"
#include "phaselab/status.h"
#include "phaselab/tensor_type.h"
#include "phaselab/tokenizer.h"

namespace phaselab {

// A 2-D (or 1-D) weight in the file's layout: n_out rows of n_in values,
// each row row_bytes long. data points into the mapping.
struct WeightView {
  const uint8_t* data = nullptr;
  TensorType type = TensorType::F32;
  int64_t n_in = 0;   // ne[0]: values per row
  int64_t n_out = 0;  // ne[1]: rows
  size_t row_bytes = 0;
  bool present() const { return data != nullptr; }
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

struct LayerWeights {
  std::vector<float> attn_norm;       // [n_embd]
  WeightView wq, wk, wv, wo;          // [n_embd -> n_head*head_dim], ..., [n_head*head_dim -> n_embd]
  std::vector<float> bq, bk, bv;      // qwen2 (and gpt-oss) biases, else empty
  std::vector<float> bo;              // [n_embd] gpt-oss: the attention output's bias, else empty
  std::vector<float> attn_sinks;      // [n_head] gpt-oss: each query head's sink logit, else empty
  std::vector<float> q_norm, k_norm;  // [head_dim] (qk_norm)
  std::vector<float> post_attn_norm;  // [n_embd] (gemma3)
  std::vector<float> ffn_norm;        // [n_embd]
  WeightView w_gate, w_up, w_down;    // [n_embd -> n_ff], [n_embd -> n_ff], [n_ff -> n_embd]; absent in MoE layers
  std::vector<float> post_ffw_norm;   // [n_embd] (gemma3)
  // A mixture-of-experts layer (ModelConfig::is_moe): the router and each
  // expert's matrices, views of the 3-D tensors' slices (expert e is the e-th
  // slice along the slowest dimension, laid out as a 2-D weight).
  WeightView router;                  // ffn_gate_inp [n_embd -> n_expert]
  std::vector<WeightView> gate_exps, up_exps;  // (n_expert) [n_embd -> n_ff_exp]
  std::vector<WeightView> down_exps;           // (n_expert) [n_ff_exp -> n_embd]
  // gpt-oss (ModelConfig::expert_bias): the router's bias and each expert's
  // three biases, expert e's at e * width; else empty.
  std::vector<float> router_b;                 // [n_expert]
  std::vector<float> gate_exps_b, up_exps_b;   // [n_expert * n_ff_exp]
  std::vector<float> down_exps_b;              // [n_expert * n_embd]
  bool moe() const { return router.present(); }
};

struct ModelWeights {
  WeightView tok_embd;            // [n_embd, n_vocab]
  std::vector<float> output_norm; // [n_embd]
  WeightView output;              // [n_embd, n_vocab]; tok_embd when tied
  bool tied_output = false;
  std::vector<float> rope_freq_factors;  // [n_rot/2] or empty
  std::vector<LayerWeights> layers;
};

class Model {
 public:
  // Opens, validates and maps a model. Unsupported architectures or tensor
  // types are refused with a message naming them.
  static Result<std::shared_ptr<Model>> load(const std::string& path);
  // The same checks on a file already opened (GgufFile::open or from_bytes):
  // config, tokenizer, every tensor's presence, shape and type. Nothing is
  // computed; this is what `phaselab-cli info` uses to say whether a file
  // would load.
  static Result<std::shared_ptr<Model>> from_file(std::shared_ptr<GgufFile> file);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const GgufFile& file() const { return *file_; }
  const std::string& path() const { return path_; }
  // Bytes of all the weights a pass may read (every matrix once, every
  // expert): what must fit in memory.
  uint64_t weight_bytes() const { return weight_bytes_; }
  // Bytes of weights read per decoded token: every matrix once, of a MoE
  // layer only the n_expert_used experts a token is routed to (the router
  // and the rest in full), the embedding one row. The numerator of the
  // achieved-bandwidth figure; weight_bytes() for a dense model.
  uint64_t active_weight_bytes() const { return active_weight_bytes_; }
  // The chat format: the family of tokenizer.chat_template; for models
  // without one (base models) the few-shot transcript.
  ChatTemplateFamily chat_template() const;
  // False for a base (pre-trained) model: the file has no chat template.
  bool has_chat_template() const;
  // How chats are rendered: the file's own template, parsed once by the Jinja
  // interpreter, with chat_template() as its family; without a template (or
  // one that does not parse: chat_template_error()) the family alone.
  ChatFormat chat_format() const;
  // Why the file's template is not used, and what renders instead ("" when
  // it is used, or when there is none).
  const std::string& chat_template_error() const { return chat_template_error_; }
  // A short description of the type mix, e.g. "Q4_K 61%, Q6_K 30%, F32 9%".
  std::string type_mix() const;

 private:
  std::string path_;
  std::shared_ptr<GgufFile> file_;
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  uint64_t weight_bytes_ = 0;
  uint64_t active_weight_bytes_ = 0;
  std::shared_ptr<const jinja::Template> chat_jinja_;
  ToolCallSyntax chat_tool_calls_ = ToolCallSyntax::none;  // detect_tool_call_syntax of chat_jinja_, once
  std::string chat_template_error_;
};

}  // namespace phaselab
