// Strict GGUF reader. Nothing read from the file is trusted until checked:
// every count is bounded by the bytes that remain, so a hostile header can
// never make us allocate more than the file itself could describe.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "phaselab/gguf.h"

namespace phaselab {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 8;
constexpr uint64_t kMaxStringLength = 1ull << 30;  // no key or token is 1 GiB

size_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16:
    case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::FLOAT32: return 4;
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
    case GgufValueType::FLOAT64: return 8;
    default: return 0;
  }
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::FLOAT64); }

class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& file) : base_(base), size_(size), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  Status error(const std::string& field, const std::string& what, uint64_t at) const {
    std::ostringstream os;
    os << file_ << ": " << field << " at offset " << at << ": " << what;
    return invalid_file(os.str());
  }

  template <typename T>
  Status read(T* out, const std::string& field) {
    if (remaining() < sizeof(T))
      return error(field, "file ends after " + std::to_string(size_) + " bytes (truncated?)", pos_);
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::ok();
  }

  Status read_string(std::string_view* out, const std::string& field) {
    const uint64_t at = pos_;
    uint64_t len = 0;
    PHASELAB_TRY(read(&len, field + " length"));
    if (len > remaining() || len > kMaxStringLength)
      return error(field, "string length " + std::to_string(len) + " exceeds the " +
                              std::to_string(remaining()) + " bytes left in the file",
                   at);
    *out = std::string_view(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return Status::ok();
  }

  const uint8_t* here() const { return base_ + pos_; }
  void skip(uint64_t n) { pos_ += n; }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

Status read_value(Cursor& c, GgufValueType type, GgufValue* v, const std::string& field, int depth) {
  v->type = type;
  const uint64_t at = c.pos();
  switch (type) {
    case GgufValueType::UINT8: { uint8_t x; PHASELAB_TRY(c.read(&x, field)); v->u = x; v->i = x; return Status::ok(); }
    case GgufValueType::INT8: { int8_t x; PHASELAB_TRY(c.read(&x, field)); v->i = x; v->u = static_cast<uint64_t>(x); return Status::ok(); }
    case GgufValueType::UINT16: { uint16_t x; PHASELAB_TRY(c.read(&x, field)); v->u = x; v->i = x; return Status::ok(); }
    case GgufValueType::INT16: { int16_t x; PHASELAB_TRY(c.read(&x, field)); v->i = x; v->u = static_cast<uint64_t>(x); return Status::ok(); }
    case GgufValueType::UINT32: { uint32_t x; PHASELAB_TRY(c.read(&x, field)); v->u = x; v->i = x; return Status::ok(); }
    case GgufValueType::INT32: { int32_t x; PHASELAB_TRY(c.read(&x, field)); v->i = x; v->u = static_cast<uint64_t>(x); return Status::ok(); }
    case GgufValueType::UINT64: { uint64_t x; PHASELAB_TRY(c.read(&x, field)); v->u = x; v->i = static_cast<int64_t>(x); return Status::ok(); }
    case GgufValueType::INT64: { int64_t x; PHASELAB_TRY(c.read(&x, field)); v->i = x; v->u = static_cast<uint64_t>(x); return Status::ok(); }
    case GgufValueType::FLOAT32: { float x; PHASELAB_TRY(c.read(&x, field)); v->f = x; return Status::ok(); }
    case GgufValueType::FLOAT64: { double x; PHASELAB_TRY(c.read(&x, field)); v->f = x; return Status::ok(); }
    case GgufValueType::BOOL: {
      uint8_t x;
      PHASELAB_TRY(c.read(&x, field));
      if (x > 1) return c.error(field, "bool value " + std::to_string(x) + " is neither 0 nor 1", at);
      v->u = x;
      return Status::ok();
    }
    case GgufValueType::STRING: return c.read_string(&v->str, field);
    case GgufValueType::ARRAY: {
      if (depth >= kMaxArrayDepth)
        return c.error(field, "arrays nested deeper than " + std::to_string(kMaxArrayDepth), at);
      uint32_t et = 0;
      PHASELAB_TRY(c.read(&et, field + " element type"));
      if (!known_value_type(et))
        return c.error(field, "unknown array element type " + std::to_string(et), at);
      uint64_t n = 0;
      PHASELAB_TRY(c.read(&n, field + " element count"));
      v->elem_type = static_cast<GgufValueType>(et);
      v->count = n;
      if (const size_t es = scalar_size(v->elem_type); es > 0) {
        if (n > c.remaining() / es)
          return c.error(field, "array of " + std::to_string(n) + " elements does not fit in the " +
                                    std::to_string(c.remaining()) + " bytes left",
                         at);
        v->elems = c.here();
        c.skip(n * es);
        return Status::ok();
      }
      // Strings take at least 8 bytes each, arrays at least 12: bound n first.
      const uint64_t min_elem = v->elem_type == GgufValueType::STRING ? 8 : 12;
      if (n > c.remaining() / min_elem)
        return c.error(field, "array of " + std::to_string(n) + " elements does not fit in the " +
                                  std::to_string(c.remaining()) + " bytes left",
                       at);
      if (v->elem_type == GgufValueType::STRING) {
        v->strings.resize(n);
        for (uint64_t k = 0; k < n; k++) PHASELAB_TRY(c.read_string(&v->strings[k], field + "[" + std::to_string(k) + "]"));
      } else {
        v->items.resize(n);
        for (uint64_t k = 0; k < n; k++)
          PHASELAB_TRY(read_value(c, GgufValueType::ARRAY, &v->items[k], field + "[" + std::to_string(k) + "]", depth + 1));
      }
      return Status::ok();
    }
  }
  return c.error(field, "unknown value type " + std::to_string(static_cast<uint32_t>(type)), at);
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

// A float element read as an integer: NaN is 0 and values beyond int64 are
// clamped (a plain cast of those would be undefined behaviour).
int64_t float_to_int(double x) {
  if (!(x == x)) return 0;
  if (x >= 9.2233720368547758e18) return INT64_MAX;
  if (x <= -9.2233720368547758e18) return INT64_MIN;
  return static_cast<int64_t>(x);
}

}  // namespace

std::string_view gguf_value_type_name(GgufValueType t) {
  static constexpr std::string_view names[] = {"uint8", "int8",  "uint16", "int16", "uint32", "int32",  "float32",
                                               "bool",  "string", "array", "uint64", "int64", "float64"};
  const auto k = static_cast<uint32_t>(t);
  return k < std::size(names) ? names[k] : "unknown";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::UINT16: case GgufValueType::INT16:
    case GgufValueType::UINT32: case GgufValueType::INT32: case GgufValueType::UINT64: case GgufValueType::INT64:
      return true;
    default: return false;
  }
}

int64_t GgufValue::int_at(uint64_t k) const {
  if (!elems || k >= count) return 0;
  const uint8_t* p = elems + k * scalar_size(elem_type);
  switch (elem_type) {
    case GgufValueType::UINT8: case GgufValueType::BOOL: return *p;
    case GgufValueType::INT8: return static_cast<int8_t>(*p);
    case GgufValueType::UINT16: { uint16_t x; std::memcpy(&x, p, 2); return x; }
    case GgufValueType::INT16: { int16_t x; std::memcpy(&x, p, 2); return x; }
    case GgufValueType::UINT32: { uint32_t x; std::memcpy(&x, p, 4); return x; }
    case GgufValueType::INT32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case GgufValueType::UINT64: { uint64_t x; std::memcpy(&x, p, 8); return static_cast<int64_t>(x); }
    case GgufValueType::INT64: { int64_t x; std::memcpy(&x, p, 8); return x; }
    case GgufValueType::FLOAT32: { float x; std::memcpy(&x, p, 4); return float_to_int(x); }
    case GgufValueType::FLOAT64: { double x; std::memcpy(&x, p, 8); return float_to_int(x); }
    default: return 0;
  }
}

double GgufValue::float_at(uint64_t k) const {
  if (!elems || k >= count) return 0;
  const uint8_t* p = elems + k * scalar_size(elem_type);
  if (elem_type == GgufValueType::FLOAT32) { float x; std::memcpy(&x, p, 4); return x; }
  if (elem_type == GgufValueType::FLOAT64) { double x; std::memcpy(&x, p, 8); return x; }
  return static_cast<double>(int_at(k));
}

std::string GgufValue::to_string(size_t max_items) const {
  std::ostringstream os;
  switch (type) {
    case GgufValueType::STRING: {
      std::string s(str.substr(0, 120));
      for (auto& ch : s) if (ch == '\n') ch = ' ';
      os << '"' << s << (str.size() > 120 ? "...\"" : "\"");
      break;
    }
    case GgufValueType::BOOL: os << (u ? "true" : "false"); break;
    case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: os << f; break;
    case GgufValueType::UINT8: case GgufValueType::UINT16: case GgufValueType::UINT32: case GgufValueType::UINT64: os << u; break;
    case GgufValueType::ARRAY: {
      os << "[" << gguf_value_type_name(elem_type) << " x " << count << "]";
      if (count && max_items) {
        os << " {";
        const uint64_t n = std::min<uint64_t>(count, max_items);
        for (uint64_t k = 0; k < n; k++) {
          if (k) os << ", ";
          if (elem_type == GgufValueType::STRING) os << '"' << strings[k] << '"';
          else if (elem_type == GgufValueType::ARRAY) os << items[k].to_string(2);
          else if (elem_type == GgufValueType::FLOAT32 || elem_type == GgufValueType::FLOAT64) os << float_at(k);
          else os << int_at(k);
        }
        os << (count > n ? ", ...}" : "}");
      }
      break;
    }
    default: os << i; break;
  }
  return os.str();
}

namespace {

// What a path that is not a regular file is, for the message.
const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

Status not_regular(const std::string& path, mode_t m) {
  return io_error(path + ": is " + std::string(file_kind(m)) + ", not a regular file (give the path of a .gguf model file)");
}

}  // namespace

Result<std::shared_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  // A model must be a regular file. Opening a FIFO for reading blocks until
  // a writer appears, and reading a device may never end: look first, then
  // open without blocking and look again at what was opened (the path may
  // have been replaced in between).
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return io_error(path + ": cannot open: " + std::strerror(errno) + " (check the path and its permissions)");
  if (!S_ISREG(st.st_mode)) return not_regular(path, st.st_mode);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    return io_error(path + ": cannot open: " + std::strerror(errno) + " (check the path and its permissions)");
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return io_error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return not_regular(path, st.st_mode);
  }
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* m = mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      return io_error(path + ": cannot memory-map " + std::to_string(f->size_) + " bytes: " + std::strerror(errno));
    }
    f->map_ = m;
    f->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  PHASELAB_TRY(f->parse());
  return f;
}

Result<std::shared_ptr<GgufFile>> GgufFile::from_bytes(std::vector<uint8_t> bytes, const std::string& name) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  f->owned_ = std::move(bytes);
  f->base_ = f->owned_.data();
  f->size_ = f->owned_.size();
  PHASELAB_TRY(f->parse());
  return f;
}

Result<std::shared_ptr<GgufFile>> GgufFile::header_from_bytes(std::vector<uint8_t> header, uint64_t file_size,
                                                              const std::string& name) {
  if (file_size < header.size()) return invalid_argument(name + ": the header is larger than the file");
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  f->owned_ = std::move(header);
  f->base_ = f->owned_.data();
  f->size_ = f->owned_.size();
  f->declared_size_ = file_size;
  PHASELAB_TRY(f->parse());
  for (auto& t : f->tensors_) t.data = nullptr;
  f->size_ = file_size;
  return f;
}

GgufFile::~GgufFile() {
  if (map_) munmap(map_, size_);
}

namespace {

// A tensor info's fields after its name: shape, type (with the sizes it
// implies) and data offset, each checked as it is read.
Status read_tensor_layout(Cursor& c, const std::string& field, uint64_t alignment, GgufTensorInfo& t) {
  PHASELAB_TRY(c.read(&t.n_dims, field + " n_dims"));
  if (t.n_dims < 1 || t.n_dims > 4)
    return c.error(field, "n_dims " + std::to_string(t.n_dims) + " is outside 1..4", c.pos() - 4);
  uint64_t n_el = 1;
  for (uint32_t d = 0; d < t.n_dims; d++) {
    const uint64_t dim_at = c.pos();
    uint64_t ne = 0;
    PHASELAB_TRY(c.read(&ne, field + " ne[" + std::to_string(d) + "]"));
    if (ne == 0 || ne > (1ull << 62))
      return c.error(field, "dimension " + std::to_string(d) + " is " + std::to_string(ne) + " (must be positive)", dim_at);
    if (mul_overflows(n_el, ne, &n_el) || n_el > (1ull << 62))
      return c.error(field, "element count overflows", dim_at);
    t.ne[d] = static_cast<int64_t>(ne);
  }
  t.n_elements = n_el;
  uint32_t type_id = 0;
  const uint64_t type_at = c.pos();
  PHASELAB_TRY(c.read(&type_id, field + " type"));
  const auto traits = tensor_type_traits(type_id);
  if (!traits)
    return c.error(field, "unknown tensor type id " + std::to_string(type_id) +
                              " (PhaseLab does not know this quantization; re-quantize the model to a supported type)",
                   type_at);
  t.type = traits->type;
  if (t.ne[0] % traits->block_size != 0)
    return c.error(field, "first dimension " + std::to_string(t.ne[0]) + " is not a multiple of the " +
                              std::string(traits->name) + " block size " + std::to_string(traits->block_size),
                   type_at);
  uint64_t bytes = 0;
  if (mul_overflows(n_el / traits->block_size, traits->type_size, &bytes))
    return c.error(field, "byte size overflows", type_at);
  t.n_bytes = bytes;
  const uint64_t off_at = c.pos();
  PHASELAB_TRY(c.read(&t.offset, field + " offset"));
  if (t.offset % alignment != 0)
    return c.error(field, "data offset " + std::to_string(t.offset) + " is not aligned to " + std::to_string(alignment), off_at);
  return Status::ok();
}

// Every tensor inside the data section (from data_offset to the end of the
// file_size bytes at base), and no two overlapping; each gets its pointer.
Status place_tensors(std::vector<GgufTensorInfo>& tensors, const uint8_t* base, uint64_t data_offset, uint64_t file_size,
                     const std::string& path) {
  const uint64_t data_size = file_size >= data_offset ? file_size - data_offset : 0;
  std::vector<size_t> order(tensors.size());
  for (size_t k = 0; k < order.size(); k++) order[k] = k;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  uint64_t prev_end = 0;
  const GgufTensorInfo* prev = nullptr;
  for (size_t k : order) {
    GgufTensorInfo& t = tensors[k];
    if (t.offset > data_size || t.n_bytes > data_size - t.offset)
      return invalid_file(path + ": tensor '" + t.name + "' at data offset " + std::to_string(t.offset) + " with " +
                          std::to_string(t.n_bytes) + " bytes runs past the end of the file (" + std::to_string(file_size) +
                          " bytes; truncated download?)");
    if (prev && t.offset < prev_end)
      return invalid_file(path + ": tensor '" + t.name + "' at data offset " + std::to_string(t.offset) +
                          " overlaps tensor '" + prev->name + "' which ends at " + std::to_string(prev_end));
    prev_end = t.offset + t.n_bytes;
    prev = &t;
    t.data = base + data_offset + t.offset;
  }
  return Status::ok();
}

}  // namespace

Status GgufFile::parse() {
  Cursor c(base_, size_, path_);
  uint32_t magic = 0;
  PHASELAB_TRY(c.read(&magic, "magic"));
  if (magic != kMagic) return c.error("magic", "not a GGUF file (the first four bytes are not \"GGUF\")", 0);
  PHASELAB_TRY(c.read(&version_, "version"));
  if (version_ == 1)
    return unsupported(path_ + ": GGUF version 1 is obsolete; convert the model again with a current converter");
  if (version_ != 2 && version_ != 3)
    return c.error("version", "unsupported GGUF version " + std::to_string(version_) + " (PhaseLab reads 2 and 3)", 4);
  uint64_t n_tensors = 0, n_kv = 0;
  PHASELAB_TRY(c.read(&n_tensors, "tensor count"));
  PHASELAB_TRY(c.read(&n_kv, "metadata count"));
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a
  // tensor info at least 8 + 4 + 8 + 4 + 8.
  if (n_kv > c.remaining() / 13)
    return c.error("metadata count", std::to_string(n_kv) + " key-value pairs cannot fit in a file of " +
                                         std::to_string(size_) + " bytes",
                   16);
  if (n_tensors > c.remaining() / 32)
    return c.error("tensor count", std::to_string(n_tensors) + " tensors cannot fit in a file of " +
                                       std::to_string(size_) + " bytes",
                   8);

  kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; k++) {
    const uint64_t at = c.pos();
    std::string_view key;
    PHASELAB_TRY(c.read_string(&key, "metadata key #" + std::to_string(k)));
    std::string skey(key);
    if (skey.empty()) return c.error("metadata key #" + std::to_string(k), "the key is empty", at);
    if (kv_index_.count(skey)) return c.error("metadata key '" + skey + "'", "duplicate key", at);
    uint32_t type = 0;
    const uint64_t type_at = c.pos();
    PHASELAB_TRY(c.read(&type, "type of '" + skey + "'"));
    if (!known_value_type(type))
      return c.error("metadata '" + skey + "'", "unknown value type " + std::to_string(type), type_at);
    GgufValue v;
    PHASELAB_TRY(read_value(c, static_cast<GgufValueType>(type), &v, "metadata '" + skey + "'", 0));
    kv_index_[skey] = kv_.size();
    kv_.emplace_back(std::move(skey), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (a->type != GgufValueType::UINT32 && a->type != GgufValueType::UINT64 && a->type != GgufValueType::INT32)
      return invalid_file(path_ + ": general.alignment must be an integer");
    const uint64_t al = a->u;
    if (al == 0 || (al & (al - 1)) != 0 || al > (1u << 16))
      return invalid_file(path_ + ": general.alignment " + std::to_string(al) + " is not a power of two up to 65536");
    alignment_ = al;
  }

  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; k++) {
    const uint64_t at = c.pos();
    std::string_view name;
    PHASELAB_TRY(c.read_string(&name, "tensor name #" + std::to_string(k)));
    GgufTensorInfo t;
    t.name = std::string(name);
    const std::string field = "tensor '" + t.name + "'";
    if (tensor_index_.count(t.name)) return c.error(field, "duplicate tensor name", at);
    PHASELAB_TRY(read_tensor_layout(c, field, alignment_, t));
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  const uint64_t file_size = declared_size_ ? declared_size_ : size_;
  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (data_offset_ > file_size && !tensors_.empty())
    return c.error("data section", "starts past the end of the file (truncated?)", c.pos());

  // Every tensor inside the file, and no two overlapping.
  return place_tensors(tensors_, base_, data_offset_, file_size, path_);
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || !v->is_integer()) return std::nullopt;
  return v->i;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(v->i);
  return std::nullopt;
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || v->type != GgufValueType::BOOL) return std::nullopt;
  return v->u != 0;
}

std::optional<std::string_view> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || v->type != GgufValueType::STRING) return std::nullopt;
  return v->str;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace phaselab
