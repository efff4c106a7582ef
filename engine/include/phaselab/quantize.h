// Model quantization: rewrites a GGUF model in one of llama.cpp's file types
// (Q4_K_M, Q8_0, ...), with llama.cpp's per-tensor type mix, so that the
// files are interchangeable: the same types for the same tensors, the same
// general.file_type and general.quantization_version.
//
// quantize_model() is what the CLI, the comparison tool and the GUI call;
// type_for_tensor() is the mix rule alone (a pure function, for tests and
// for showing a plan before anything is written).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "phaselab/gguf.h"
#include "phaselab/status.h"
#include "phaselab/tensor_type.h"

namespace phaselab {

// llama.cpp's llama_ftype values (what general.file_type holds). Only the
// types whose tensor types PhaseLab can quantize are listed.
enum class FileType : uint32_t {
  F32 = 0,  // LLAMA_FTYPE_ALL_F32
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q8_0 = 7,
  Q5_0 = 8,
  Q5_1 = 9,
  Q4_K_S = 14,
  Q4_K_M = 15,
  Q5_K_S = 16,
  Q5_K_M = 17,
  Q6_K = 18,
  BF16 = 32,
  MXFP4_MOE = 38,  // experts (3-D tensors) MXFP4, the rest Q8_0 (gpt-oss's own mix)
};

// GGML_QNT_VERSION, written to general.quantization_version.
constexpr uint32_t kQuantizationVersion = 2;

// The file types quantize_model() can write, smallest bits first (for menus).
const std::vector<FileType>& supported_file_types();
// "Q4_K_M" (case-insensitive); "Q4_K" and "Q5_K" mean Q4_K_M and Q5_K_M as in
// llama-quantize. nullopt for anything else.
std::optional<FileType> parse_file_type(std::string_view name);
std::string_view file_type_name(FileType t);
// The name of a general.file_type value read from a file ("Q4_K_M", or
// "type 23" for one PhaseLab cannot write).
std::string file_type_name_of(uint32_t value);
// The tensor type most matrices get (Q4_K for Q4_K_M).
TensorType file_type_base_type(FileType t);

// What the mix rule needs to know about the model.
struct MixModelInfo {
  std::string arch;            // general.architecture
  int n_layer = 0;             // <arch>.block_count
  int n_head = 0;              // <arch>.attention.head_count
  int n_head_kv = 0;           // <arch>.attention.head_count_kv
  int n_attn_v = 0;            // attn_v (or fused attn_qkv) tensors in the file; normally n_layer
  bool tied_embeddings = true;  // no output.weight: token_embd is the output matrix too

  // From a file's metadata and tensor names.
  static MixModelInfo from_gguf(const GgufFile& f);
};

// A tensor as the mix rule sees it.
struct TensorDesc {
  std::string_view name;  // "blk.3.attn_v.weight"
  TensorType type = TensorType::F32;  // its type in the input
  int n_dims = 1;         // as llama.cpp counts them: trailing dimensions of 1 do not count
  int64_t ne0 = 0;        // row length (the fastest dimension)
};

// Whether llama.cpp quantizes this tensor at all (2-D or more, a "*weight",
// not a norm, not a positional/type embedding...). Others keep their type.
bool tensor_is_quantizable(const TensorDesc& t);

// The type the tensor gets in a file of type ft: llama.cpp's
// llama_tensor_get_type (see quantize_model.cpp for the rules). fell_back is
// set when the row length forced a fallback type (e.g. Q4_K -> Q5_0 for
// Gemma 3's 640-wide rows).
TensorType type_for_tensor(FileType ft, const TensorDesc& t, const MixModelInfo& m, bool* fell_back = nullptr);

struct QuantizeOptions {
  int n_threads = 0;        // 0: one per hardware thread
  bool overwrite = false;   // replace an existing OUT (never the input itself)
  bool verify = true;       // reopen the written file and check every tensor before renaming it into place
};

// One tensor of the plan (and of the report).
struct TensorPlan {
  std::string name;
  TensorType from = TensorType::F32;
  TensorType to = TensorType::F32;
  uint64_t bytes_in = 0, bytes_out = 0;
  bool fell_back = false;
  bool converted() const { return from != to; }
};

struct TypeCount {
  TensorType type;
  int tensors = 0;
  uint64_t bytes = 0;
};

struct QuantizeReport {
  FileType file_type = FileType::F16;
  std::string in_file_type;     // the input's general.file_type by name ("Q4_K_M"), or "" if absent
  std::vector<TensorPlan> tensors;
  std::vector<TypeCount> type_mix;  // of the output, by tensor type
  int n_converted = 0;          // tensors rewritten (the others were copied byte for byte)
  int n_fallback = 0;           // tensors whose row length forced a fallback type
  int n_requantized = 0;        // converted tensors that were quantized already (dequantized first)
  uint64_t in_file_bytes = 0, out_file_bytes = 0;
  double seconds = 0;           // wall time of the whole call
  int n_threads = 1;
};

// The types every tensor of f would get, without writing anything.
Result<std::vector<TensorPlan>> plan_quantization(const GgufFile& f, FileType ft);
// The output's type mix of a plan.
std::vector<TypeCount> type_mix_of(const std::vector<TensorPlan>& plan);

// progress(i, n, bytes_done, bytes_total): tensor i of n is finished;
// bytes count input tensor data. Called on the calling thread.
using QuantizeProgress = std::function<void(size_t i, size_t n, uint64_t bytes_done, uint64_t bytes_total)>;

// Rewrites in as out in file type ft. Tensors already in their target type
// are copied; the others are dequantized to F32 (when quantized) and
// quantized again, rows split over n_threads. OUT is written beside itself
// (OUT.partial-XXXXXX), reopened and checked, then renamed into place; on
// failure or cancellation nothing is left behind. Refuses to write over the
// input (also through a link), and over an existing file unless overwrite.
Result<QuantizeReport> quantize_model(const std::string& in, const std::string& out, FileType ft,
                                      const QuantizeOptions& opts = {}, const QuantizeProgress& progress = {},
                                      const std::atomic<bool>* cancel = nullptr);

}  // namespace phaselab
