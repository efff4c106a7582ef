// GGUF v2/v3: a memory-mapped reader that validates everything before it is
// trusted, and a writer (tests build tiny models with it; the quantizer too).
//
// File layout: magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv |
// n_kv x (string key, u32 type, value) | n_tensors x (string name, u32 n_dims,
// n_dims x u64 ne, u32 type, u64 offset) | padding to general.alignment |
// tensor data (each tensor at data_offset + offset, aligned).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "phaselab/status.h"
#include "phaselab/tensor_type.h"

namespace phaselab {

enum class GgufValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};
std::string_view gguf_value_type_name(GgufValueType t);

// A metadata value. Strings view the mapped file; scalar arrays keep a pointer
// to their (possibly unaligned) elements, read through the accessors.
struct GgufValue {
  GgufValueType type = GgufValueType::UINT8;
  uint64_t u = 0;  // unsigned integers and bool
  int64_t i = 0;   // signed integers
  double f = 0;    // floats
  std::string_view str;
  // ARRAY
  GgufValueType elem_type = GgufValueType::UINT8;
  uint64_t count = 0;
  const uint8_t* elems = nullptr;             // scalar arrays: count packed elements
  std::vector<std::string_view> strings;      // arrays of strings
  std::vector<GgufValue> items;               // arrays of arrays

  bool is_integer() const;
  bool is_float() const { return type == GgufValueType::FLOAT32 || type == GgufValueType::FLOAT64; }
  // Element k of a scalar array, converted.
  int64_t int_at(uint64_t k) const;
  double float_at(uint64_t k) const;
  // A short human-readable rendering (arrays abbreviated).
  std::string to_string(size_t max_items = 8) const;
};

struct GgufTensorInfo {
  std::string name;
  TensorType type = TensorType::F32;
  uint32_t n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the fastest (contiguous) dimension
  uint64_t offset = 0;           // relative to the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping
};

class GgufFile {
 public:
  // Maps and validates a file. Every failure names the file, the field and
  // the byte offset, and never allocates more than the file could describe.
  static Result<std::shared_ptr<GgufFile>> open(const std::string& path);
  // The same validation on bytes in memory (kept alive by the object).
  static Result<std::shared_ptr<GgufFile>> from_bytes(std::vector<uint8_t> bytes,
                                                      const std::string& name = "<memory>");
  // The metadata and tensor table alone, from the first bytes of a file of
  // file_size bytes (a range request's answer): tensors are checked against
  // file_size and have no data (data == nullptr). Fails like open() when the
  // header runs past the bytes given (read more and try again).
  static Result<std::shared_ptr<GgufFile>> header_from_bytes(std::vector<uint8_t> header, uint64_t file_size,
                                                             const std::string& name = "<memory>");
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;     // any integer type
  std::optional<double> get_float(std::string_view key) const;    // float or integer
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string_view> get_string(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  Status parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* map_ = nullptr;  // mmap'ed region (munmap on destruction)
  std::vector<uint8_t> owned_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t declared_size_ = 0;  // header_from_bytes: the whole file's size (0: size_)
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// ---- writer -------------------------------------------------------------

// A value to write: scalars, strings, and arrays (possibly nested).
struct GgufWriteValue {
  GgufValueType type = GgufValueType::UINT32;
  uint64_t bits = 0;  // scalar payload, little-endian, width by type
  std::string str;
  GgufValueType elem_type = GgufValueType::UINT32;
  std::vector<GgufWriteValue> items;

  static GgufWriteValue u8(uint8_t v);
  static GgufWriteValue i8(int8_t v);
  static GgufWriteValue u16(uint16_t v);
  static GgufWriteValue i16(int16_t v);
  static GgufWriteValue u32(uint32_t v);
  static GgufWriteValue i32(int32_t v);
  static GgufWriteValue u64(uint64_t v);
  static GgufWriteValue i64(int64_t v);
  static GgufWriteValue f32(float v);
  static GgufWriteValue f64(double v);
  static GgufWriteValue boolean(bool v);
  static GgufWriteValue string(std::string v);
  static GgufWriteValue array(GgufValueType elem_type, std::vector<GgufWriteValue> items);
  static GgufWriteValue string_array(const std::vector<std::string>& v);
  static GgufWriteValue f32_array(const std::vector<float>& v);
  static GgufWriteValue i32_array(const std::vector<int32_t>& v);
  // The same value as one read from a file (to rewrite a file's metadata).
  static GgufWriteValue copy_of(const GgufValue& v);
};

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3, uint32_t alignment = 32);
  void set(const std::string& key, GgufWriteValue value);  // replaces an existing key
  // shape is fastest-dimension first ([n_in, n_out] for a matrix); data holds
  // row_size(type, shape[0]) * (product of the other dims) bytes.
  Status add_tensor(const std::string& name, TensorType type, std::vector<int64_t> shape,
                    const void* data, size_t n_bytes);
  // Convenience: quantizes F32 values to type.
  Status add_tensor_f32(const std::string& name, TensorType type, std::vector<int64_t> shape,
                        const std::vector<float>& values);
  std::vector<uint8_t> serialize() const;
  Status write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    TensorType type;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  uint32_t version_;
  uint32_t alignment_;
  std::vector<std::pair<std::string, GgufWriteValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace phaselab
