// File types and the per-tensor type mix of llama.cpp's quantizer, so that a
// file PhaseLab writes has, tensor for tensor, the types llama-quantize
// would give it (read from llama.cpp's src/llama-quant.cpp,
// llama_tensor_get_type and helpers, at upstream commit 84f7129; no imatrix,
// no overrides). The rules, for the file types PhaseLab writes:
//
// 1. Only "weights" are quantized: tensors of 2 or more dimensions (trailing
//    dimensions of 1 do not count) whose name ends in "weight", except norms
//    ("_norm.weight"), MoE routers and a list of small special tensors
//    (positional / token-type embeddings, conv1d, RWKV, vision, audio).
//    Everything else keeps its type.
// 2. F32, F16, BF16: every quantizable tensor gets that type; no mix.
// 3. Otherwise a tensor starts with the file type's base type (Q4_K for
//    Q4_K_M/S, Q5_K for Q5_K_M/S, Q6_K, Q8_0, Q4_0, ...), then:
//    - output.weight, and token_embd.weight when the model has no
//      output.weight (tied embeddings): Q8_0 if its row length is not a
//      multiple of the base type's block (Gemma 3's 640), else Q6_K unless
//      the base type is Q8_0. An untied token_embd keeps the base type.
//    - attn_v (and fused attn_qkv / attn_kv_b), i-th of n: Q4_K_M and
//      Q5_K_M give Q6_K where use_more_bits(i, n); Q4_K_S gives Q5_K to the
//      first 4. A 70B model (llama with 80 layers and GQA, qwen2 with 80)
//      then lifts Q4_K (and Q3_K) to Q5_K.
//    - ffn_down of layer i of n_layer: Q4_K_M and Q5_K_M give Q6_K where
//      use_more_bits(i, n_layer); Q4_K_S gives Q5_K where i < n_layer/8.
//    - use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2:
//      the first and last eighth of the layers and every third in between.
//    - attn_q, attn_k, attn_output, ffn_gate, ffn_up: the base type (the
//      other branches of llama.cpp are for Q2_K/Q3_K/IQ types and MoE).
// 4. Fallback when the row length is not a multiple of the chosen type's
//    block: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and F16 when even that
//    does not divide it. (llama.cpp refuses a 32-block type that does not
//    divide; PhaseLab writes F16 there.)
// 5. MXFP4_MOE (gpt-oss's release mix): 3-D tensors (the experts) MXFP4,
//    every other quantizable tensor, output included, Q8_0.
//
// llama.cpp counts attn_v tensors in its tensor order (by layer number, then
// name); with one attn_v per layer the count is the layer number, which is
// what is used here, so the rule stays a pure function of one tensor.
#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>

#include "phaselab/quantize.h"

namespace phaselab {

namespace {

struct FileTypeInfo {
  FileType type;
  std::string_view name;
  TensorType base;
};

// Smallest first.
constexpr std::array<FileTypeInfo, 14> kFileTypes = {{
    {FileType::Q4_0, "Q4_0", TensorType::Q4_0},
    {FileType::Q4_K_S, "Q4_K_S", TensorType::Q4_K},
    {FileType::Q4_K_M, "Q4_K_M", TensorType::Q4_K},
    {FileType::MXFP4_MOE, "MXFP4_MOE", TensorType::Q8_0},
    {FileType::Q4_1, "Q4_1", TensorType::Q4_1},
    {FileType::Q5_0, "Q5_0", TensorType::Q5_0},
    {FileType::Q5_K_S, "Q5_K_S", TensorType::Q5_K},
    {FileType::Q5_K_M, "Q5_K_M", TensorType::Q5_K},
    {FileType::Q5_1, "Q5_1", TensorType::Q5_1},
    {FileType::Q6_K, "Q6_K", TensorType::Q6_K},
    {FileType::Q8_0, "Q8_0", TensorType::Q8_0},
    {FileType::F16, "F16", TensorType::F16},
    {FileType::BF16, "BF16", TensorType::BF16},
    {FileType::F32, "F32", TensorType::F32},
}};

const FileTypeInfo& info_of(FileType t) {
  for (const auto& i : kFileTypes)
    if (i.type == t) return i;
  return kFileTypes[0];  // unreachable for values of the enum
}

enum class Category { token_embd, output, attn_v, attn_k, attn_q, attn_output, ffn_up, ffn_gate, ffn_down, other };

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// llama.cpp's tensor categories: exact names for the embeddings and output,
// substrings for the rest, tested in this order.
Category category_of(std::string_view name) {
  if (name == "output.weight") return Category::output;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Category::token_embd;
  if (contains(name, "attn_qkv.weight") || contains(name, "attn_kv_b.weight") || contains(name, "attn_v.weight"))
    return Category::attn_v;
  if (contains(name, "attn_k.weight")) return Category::attn_k;
  if (contains(name, "attn_q.weight")) return Category::attn_q;
  if (contains(name, "attn_output.weight")) return Category::attn_output;
  if (contains(name, "ffn_up")) return Category::ffn_up;
  if (contains(name, "ffn_gate")) return Category::ffn_gate;
  if (contains(name, "ffn_down")) return Category::ffn_down;
  return Category::other;
}

// "blk.12.ffn_down.weight" -> 12; -1 without a layer.
int layer_of(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  int v = 0;
  size_t i = 4;
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); i++) v = v * 10 + (name[i] - '0');
  return v;
}

bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

bool is_block_quantized(TensorType t) { return traits_of(t).block_size > 1; }

// llama.cpp's model type "70B", the only size its mix looks at.
bool is_70b(const MixModelInfo& m) {
  return (m.arch == "llama" && m.n_layer == 80 && m.n_head != m.n_head_kv) || (m.arch == "qwen2" && m.n_layer == 80);
}

}  // namespace

const std::vector<FileType>& supported_file_types() {
  static const std::vector<FileType> v = [] {
    std::vector<FileType> out;
    for (const auto& i : kFileTypes) out.push_back(i.type);
    return out;
  }();
  return v;
}

std::optional<FileType> parse_file_type(std::string_view name) {
  std::string up(name);
  for (auto& c : up) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (up == "Q4_K") return FileType::Q4_K_M;
  if (up == "Q5_K") return FileType::Q5_K_M;
  for (const auto& i : kFileTypes)
    if (i.name == up) return i.type;
  return std::nullopt;
}

std::string_view file_type_name(FileType t) { return info_of(t).name; }

std::string file_type_name_of(uint32_t value) {
  for (const auto& i : kFileTypes)
    if (static_cast<uint32_t>(i.type) == value) return std::string(i.name);
  // Those llama.cpp writes that PhaseLab does not.
  switch (value) {
    case 10: return "Q2_K";
    case 11: return "Q3_K_S";
    case 12: return "Q3_K_M";
    case 13: return "Q3_K_L";
    case 21: return "Q2_K_S";
    default: return "type " + std::to_string(value);
  }
}

TensorType file_type_base_type(FileType t) { return info_of(t).base; }

MixModelInfo MixModelInfo::from_gguf(const GgufFile& f) {
  MixModelInfo m;
  if (auto a = f.get_string("general.architecture")) m.arch = std::string(*a);
  const std::string p = m.arch + ".";
  m.n_layer = static_cast<int>(f.get_int(p + "block_count").value_or(0));
  m.n_head = static_cast<int>(f.get_int(p + "attention.head_count").value_or(0));
  m.n_head_kv = static_cast<int>(f.get_int(p + "attention.head_count_kv").value_or(m.n_head));
  m.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  for (const auto& t : f.tensors())
    if (category_of(t.name) == Category::attn_v) m.n_attn_v++;
  return m;
}

bool tensor_is_quantizable(const TensorDesc& t) {
  const std::string_view n = t.name;
  if (t.n_dims < 2) return false;
  if (n.size() < 6 || n.substr(n.size() - 6) != "weight") return false;
  static constexpr std::string_view kKeep[] = {
      "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
      "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight", "time_mix_first.weight",
      "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
      "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
      "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
      "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
      ".patch_merger", "a.rvq.codebook", "mm.a.code_embd"};
  for (auto k : kKeep)
    if (contains(n, k)) return false;
  return n != "position_embd.weight" && n != "token_types.weight";
}

TensorType type_for_tensor(FileType ft, const TensorDesc& t, const MixModelInfo& m, bool* fell_back) {
  if (fell_back) *fell_back = false;
  if (!tensor_is_quantizable(t)) return t.type;
  const TensorType base = file_type_base_type(ft);
  if (!is_block_quantized(base)) return base;

  TensorType ty = base;
  const Category cat = category_of(t.name);
  if (ft == FileType::MXFP4_MOE) {
    // The output (and a tied embedding) Q8_0; every 3-D tensor (the
    // experts) MXFP4; the rest Q8_0.
    const bool head = cat == Category::output || (m.tied_embeddings && cat == Category::token_embd);
    ty = !head && t.n_dims >= 3 ? TensorType::MXFP4 : TensorType::Q8_0;
  } else if (cat == Category::output || (m.tied_embeddings && cat == Category::token_embd)) {
    if (t.ne0 % traits_of(base).block_size != 0) ty = TensorType::Q8_0;
    else if (base != TensorType::Q8_0) ty = TensorType::Q6_K;
  } else if (cat == Category::attn_v) {
    const int i = std::max(0, layer_of(t.name));
    if ((ft == FileType::Q4_K_M || ft == FileType::Q5_K_M) && use_more_bits(i, m.n_attn_v)) ty = TensorType::Q6_K;
    else if (ft == FileType::Q4_K_S && i < 4) ty = TensorType::Q5_K;
    if (is_70b(m) && (ty == TensorType::Q3_K || ty == TensorType::Q4_K)) ty = TensorType::Q5_K;
  } else if (cat == Category::ffn_down) {
    const int i = std::max(0, layer_of(t.name)), n = m.n_layer;
    if ((ft == FileType::Q4_K_M || ft == FileType::Q5_K_M) && use_more_bits(i, n)) ty = TensorType::Q6_K;
    else if (ft == FileType::Q4_K_S && i < n / 8) ty = TensorType::Q5_K;
  }

  if (t.ne0 % traits_of(ty).block_size != 0) {
    if (fell_back) *fell_back = true;
    switch (ty) {
      case TensorType::Q4_K: ty = TensorType::Q5_0; break;
      case TensorType::Q5_K: ty = TensorType::Q5_1; break;
      case TensorType::Q6_K: ty = TensorType::Q8_0; break;
      default: ty = TensorType::F16; break;
    }
    if (t.ne0 % traits_of(ty).block_size != 0) ty = TensorType::F16;
  }
  return ty;
}

}  // namespace phaselab
