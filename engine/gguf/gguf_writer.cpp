#include <cstdio>
#include <cstring>
#include <memory>

#include "phaselab/gguf.h"
#include "phaselab/quant.h"

namespace phaselab {

namespace {

template <typename T>
uint64_t bits_of(T v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}

GgufWriteValue scalar(GgufValueType t, uint64_t bits) {
  GgufWriteValue v;
  v.type = t;
  v.bits = bits;
  return v;
}

size_t width(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16: case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32: case GgufValueType::INT32: case GgufValueType::FLOAT32: return 4;
    default: return 8;
  }
}

class Bytes {
 public:
  explicit Bytes(std::vector<uint8_t>& out) : out_(out) {}
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  template <typename T>
  void put(T v) { raw(&v, sizeof(T)); }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    raw(s.data(), s.size());
  }
  void pad_to(size_t alignment) {
    while (out_.size() % alignment) out_.push_back(0);
  }
  void value(const GgufWriteValue& v, bool with_type) {
    if (with_type) put<uint32_t>(static_cast<uint32_t>(v.type));
    if (v.type == GgufValueType::STRING) {
      str(v.str);
    } else if (v.type == GgufValueType::ARRAY) {
      put<uint32_t>(static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(v.items.size());
      for (const auto& item : v.items) value(item, false);
    } else {
      raw(&v.bits, width(v.type));
    }
  }

 private:
  std::vector<uint8_t>& out_;
};

}  // namespace

GgufWriteValue GgufWriteValue::u8(uint8_t v) { return scalar(GgufValueType::UINT8, v); }
GgufWriteValue GgufWriteValue::i8(int8_t v) { return scalar(GgufValueType::INT8, bits_of(v)); }
GgufWriteValue GgufWriteValue::u16(uint16_t v) { return scalar(GgufValueType::UINT16, v); }
GgufWriteValue GgufWriteValue::i16(int16_t v) { return scalar(GgufValueType::INT16, bits_of(v)); }
GgufWriteValue GgufWriteValue::u32(uint32_t v) { return scalar(GgufValueType::UINT32, v); }
GgufWriteValue GgufWriteValue::i32(int32_t v) { return scalar(GgufValueType::INT32, bits_of(v)); }
GgufWriteValue GgufWriteValue::u64(uint64_t v) { return scalar(GgufValueType::UINT64, v); }
GgufWriteValue GgufWriteValue::i64(int64_t v) { return scalar(GgufValueType::INT64, bits_of(v)); }
GgufWriteValue GgufWriteValue::f32(float v) { return scalar(GgufValueType::FLOAT32, bits_of(v)); }
GgufWriteValue GgufWriteValue::f64(double v) { return scalar(GgufValueType::FLOAT64, bits_of(v)); }
GgufWriteValue GgufWriteValue::boolean(bool v) { return scalar(GgufValueType::BOOL, v ? 1 : 0); }
GgufWriteValue GgufWriteValue::string(std::string v) {
  GgufWriteValue w;
  w.type = GgufValueType::STRING;
  w.str = std::move(v);
  return w;
}
GgufWriteValue GgufWriteValue::array(GgufValueType elem_type, std::vector<GgufWriteValue> items) {
  GgufWriteValue w;
  w.type = GgufValueType::ARRAY;
  w.elem_type = elem_type;
  w.items = std::move(items);
  return w;
}
GgufWriteValue GgufWriteValue::string_array(const std::vector<std::string>& v) {
  std::vector<GgufWriteValue> items;
  items.reserve(v.size());
  for (const auto& s : v) items.push_back(string(s));
  return array(GgufValueType::STRING, std::move(items));
}
GgufWriteValue GgufWriteValue::f32_array(const std::vector<float>& v) {
  std::vector<GgufWriteValue> items;
  for (float x : v) items.push_back(f32(x));
  return array(GgufValueType::FLOAT32, std::move(items));
}
GgufWriteValue GgufWriteValue::i32_array(const std::vector<int32_t>& v) {
  std::vector<GgufWriteValue> items;
  for (int32_t x : v) items.push_back(i32(x));
  return array(GgufValueType::INT32, std::move(items));
}

namespace {

GgufWriteValue copy_element(const GgufValue& v, GgufValueType t, uint64_t k) {
  switch (t) {
    case GgufValueType::FLOAT32: return GgufWriteValue::f32(static_cast<float>(v.float_at(k)));
    case GgufValueType::FLOAT64: return GgufWriteValue::f64(v.float_at(k));
    case GgufValueType::BOOL: return GgufWriteValue::boolean(v.int_at(k) != 0);
    case GgufValueType::UINT8: return GgufWriteValue::u8(static_cast<uint8_t>(v.int_at(k)));
    case GgufValueType::INT8: return GgufWriteValue::i8(static_cast<int8_t>(v.int_at(k)));
    case GgufValueType::UINT16: return GgufWriteValue::u16(static_cast<uint16_t>(v.int_at(k)));
    case GgufValueType::INT16: return GgufWriteValue::i16(static_cast<int16_t>(v.int_at(k)));
    case GgufValueType::UINT32: return GgufWriteValue::u32(static_cast<uint32_t>(v.int_at(k)));
    case GgufValueType::INT32: return GgufWriteValue::i32(static_cast<int32_t>(v.int_at(k)));
    case GgufValueType::UINT64: return GgufWriteValue::u64(static_cast<uint64_t>(v.int_at(k)));
    default: return GgufWriteValue::i64(v.int_at(k));
  }
}

}  // namespace

GgufWriteValue GgufWriteValue::copy_of(const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::STRING: return string(std::string(v.str));
    case GgufValueType::ARRAY: {
      std::vector<GgufWriteValue> items;
      items.reserve(v.count);
      if (v.elem_type == GgufValueType::STRING)
        for (auto s : v.strings) items.push_back(string(std::string(s)));
      else if (v.elem_type == GgufValueType::ARRAY)
        for (const auto& it : v.items) items.push_back(copy_of(it));
      else
        for (uint64_t k = 0; k < v.count; k++) items.push_back(copy_element(v, v.elem_type, k));
      return array(v.elem_type, std::move(items));
    }
    case GgufValueType::FLOAT32: return f32(static_cast<float>(v.f));
    case GgufValueType::FLOAT64: return f64(v.f);
    case GgufValueType::BOOL: return boolean(v.u != 0);
    case GgufValueType::UINT8: return u8(static_cast<uint8_t>(v.u));
    case GgufValueType::INT8: return i8(static_cast<int8_t>(v.i));
    case GgufValueType::UINT16: return u16(static_cast<uint16_t>(v.u));
    case GgufValueType::INT16: return i16(static_cast<int16_t>(v.i));
    case GgufValueType::UINT32: return u32(static_cast<uint32_t>(v.u));
    case GgufValueType::INT32: return i32(static_cast<int32_t>(v.i));
    case GgufValueType::UINT64: return u64(v.u);
    case GgufValueType::INT64: return i64(v.i);
  }
  return u8(0);
}

GgufWriter::GgufWriter(uint32_t version, uint32_t alignment) : version_(version), alignment_(alignment) {
  if (alignment != 32) set("general.alignment", GgufWriteValue::u32(alignment));
}

void GgufWriter::set(const std::string& key, GgufWriteValue value) {
  for (auto& kv : kv_)
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  kv_.emplace_back(key, std::move(value));
}

Status GgufWriter::add_tensor(const std::string& name, TensorType type, std::vector<int64_t> shape, const void* data,
                              size_t n_bytes) {
  if (shape.empty() || shape.size() > 4) return invalid_argument("tensor '" + name + "': 1 to 4 dimensions");
  int64_t rows = 1;
  for (size_t d = 1; d < shape.size(); d++) rows *= shape[d];
  if (shape[0] % traits_of(type).block_size != 0)
    return invalid_argument("tensor '" + name + "': first dimension not a multiple of the block size");
  const size_t expected = row_size(type, shape[0]) * static_cast<size_t>(rows);
  if (n_bytes != expected)
    return invalid_argument("tensor '" + name + "': " + std::to_string(n_bytes) + " bytes given, " +
                            std::to_string(expected) + " expected");
  Tensor t{name, type, std::move(shape), {}};
  t.data.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + n_bytes);
  tensors_.push_back(std::move(t));
  return Status::ok();
}

Status GgufWriter::add_tensor_f32(const std::string& name, TensorType type, std::vector<int64_t> shape,
                                  const std::vector<float>& values) {
  if (shape.empty()) return invalid_argument("tensor '" + name + "': no shape");
  const int64_t n0 = shape[0];
  const size_t rows = values.size() / static_cast<size_t>(n0);
  std::vector<uint8_t> buf(row_size(type, n0) * rows);
  for (size_t r = 0; r < rows; r++)
    PHASELAB_TRY(quantize_row(type, values.data() + r * n0, buf.data() + r * row_size(type, n0), n0));
  return add_tensor(name, type, std::move(shape), buf.data(), buf.size());
}

std::vector<uint8_t> GgufWriter::serialize() const {
  std::vector<uint8_t> out;
  Bytes b(out);
  b.put<uint32_t>(0x46554747);
  b.put<uint32_t>(version_);
  b.put<uint64_t>(tensors_.size());
  b.put<uint64_t>(kv_.size());
  for (const auto& [key, value] : kv_) {
    b.str(key);
    b.value(value, true);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    b.str(t.name);
    b.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) b.put<uint64_t>(static_cast<uint64_t>(d));
    b.put<uint32_t>(static_cast<uint32_t>(t.type));
    b.put<uint64_t>(offset);
    offset += (t.data.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  b.pad_to(alignment_);
  for (const auto& t : tensors_) {
    b.raw(t.data.data(), t.data.size());
    b.pad_to(alignment_);
  }
  return out;
}

Status GgufWriter::write(const std::string& path) const {
  const std::vector<uint8_t> bytes = serialize();
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return io_error(path + ": cannot create file");
  if (std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size()) return io_error(path + ": write failed (disk full?)");
  return Status::ok();
}

}  // namespace phaselab
