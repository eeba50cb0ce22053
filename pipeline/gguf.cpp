#include <encore/gguf.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>
#include <unordered_set>

namespace encore::gguf {

namespace {

constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF", little-endian
constexpr int kMaxDims = 4;                   // ggml's GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 4;             // arrays of arrays nest at most this deep
constexpr std::uint64_t kMaxKeyBytes = 65535;
constexpr std::uint64_t kMaxNameBytes = 1024;

struct TypeShape {
  TensorType type;
  const char* name;
  std::int64_t values, bytes;
};
constexpr TypeShape kTypes[] = {
    {TensorType::kF32, "F32", 1, 4},        {TensorType::kF16, "F16", 1, 2},        {TensorType::kQ4_0, "Q4_0", 32, 18},
    {TensorType::kQ4_1, "Q4_1", 32, 20},    {TensorType::kQ5_0, "Q5_0", 32, 22},    {TensorType::kQ5_1, "Q5_1", 32, 24},
    {TensorType::kQ8_0, "Q8_0", 32, 34},    {TensorType::kQ8_1, "Q8_1", 32, 36},    {TensorType::kQ2_K, "Q2_K", 256, 84},
    {TensorType::kQ3_K, "Q3_K", 256, 110},  {TensorType::kQ4_K, "Q4_K", 256, 144},  {TensorType::kQ5_K, "Q5_K", 256, 176},
    {TensorType::kQ6_K, "Q6_K", 256, 210},  {TensorType::kQ8_K, "Q8_K", 256, 292},  {TensorType::kI8, "I8", 1, 1},
    {TensorType::kI16, "I16", 1, 2},        {TensorType::kI32, "I32", 1, 4},        {TensorType::kI64, "I64", 1, 8},
    {TensorType::kF64, "F64", 1, 8},        {TensorType::kBF16, "BF16", 1, 2},
};

// Bytes of a scalar value type; 0 for strings and arrays (variable), -1 for an unknown type.
int scalar_bytes(std::uint32_t type) {
  switch (ValueType(type)) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kBool: return 1;
    case ValueType::kU16: case ValueType::kI16: return 2;
    case ValueType::kU32: case ValueType::kI32: case ValueType::kF32: return 4;
    case ValueType::kU64: case ValueType::kI64: case ValueType::kF64: return 8;
    case ValueType::kString: case ValueType::kArray: return 0;
  }
  return -1;
}

// Bounds-checked little-endian reads over the image; every error names the file and `what`.
class Reader {
 public:
  Reader(const unsigned char* base, std::size_t size, const std::string& file) : base_(base), size_(size), file_(file) {}
  std::size_t pos() const { return pos_; }
  std::size_t left() const { return size_ - pos_; }
  void seek(std::size_t pos) { pos_ = pos; }

  Status need(std::uint64_t bytes, const std::string& what) const {
    ENCORE_REQUIRE(bytes <= left(), StatusCode::kInvalidFile, file_, ": truncated: ", what, " needs ", bytes,
                   " bytes at offset ", pos_, ", ", left(), " left");
    return {};
  }
  template <class T>
  Status read(T* out, const std::string& what) {
    ENCORE_RETURN_IF_ERROR(need(sizeof(T), what));
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return {};
  }
  Status read_string(std::string_view* out, std::uint64_t max_bytes, const std::string& what) {
    std::uint64_t len = 0;
    ENCORE_RETURN_IF_ERROR(read(&len, what + " (length)"));
    ENCORE_REQUIRE(len <= max_bytes, StatusCode::kInvalidFile, file_, ": ", what, " is ", len, " bytes long (at most ", max_bytes,
                   ")");
    ENCORE_RETURN_IF_ERROR(need(len, what));
    *out = std::string_view(reinterpret_cast<const char*>(base_ + pos_), std::size_t(len));
    pos_ += std::size_t(len);
    return {};
  }
  // One value of `type` (its type word already read); arrays are checked and skipped, their
  // elements left in place.
  Status read_value(std::uint32_t type, Value* v, const std::string& what, int depth = 0) {
    const int bytes = scalar_bytes(type);
    ENCORE_REQUIRE(bytes >= 0, StatusCode::kInvalidFile, file_, ": ", what, " has unknown value type ", type);
    v->type = ValueType(type);
    if (bytes > 0) {
      ENCORE_RETURN_IF_ERROR(need(std::uint64_t(bytes), what));
      const unsigned char* at = base_ + pos_;
      pos_ += std::size_t(bytes);
      switch (v->type) {
        case ValueType::kU8: v->u = at[0]; break;
        case ValueType::kBool:
          ENCORE_REQUIRE(at[0] <= 1, StatusCode::kInvalidFile, file_, ": ", what, " is a bool of value ", int(at[0]));
          v->u = at[0];
          break;
        case ValueType::kI8: v->i = std::int8_t(at[0]); break;
        case ValueType::kU16: v->u = load<std::uint16_t>(at); break;
        case ValueType::kI16: v->i = load<std::int16_t>(at); break;
        case ValueType::kU32: v->u = load<std::uint32_t>(at); break;
        case ValueType::kI32: v->i = load<std::int32_t>(at); break;
        case ValueType::kU64: v->u = load<std::uint64_t>(at); break;
        case ValueType::kI64: v->i = load<std::int64_t>(at); break;
        case ValueType::kF32: v->f = load<float>(at); break;
        case ValueType::kF64: v->f = load<double>(at); break;
        default: break;
      }
      return {};
    }
    if (v->type == ValueType::kString) return read_string(&v->str, std::numeric_limits<std::uint64_t>::max(), what);
    ENCORE_REQUIRE(depth < kMaxArrayDepth, StatusCode::kInvalidFile, file_, ": ", what, ": arrays nested deeper than ",
                   kMaxArrayDepth);
    std::uint32_t element = 0;
    ENCORE_RETURN_IF_ERROR(read(&element, what + " (element type)"));
    const int element_bytes = scalar_bytes(element);
    ENCORE_REQUIRE(element_bytes >= 0, StatusCode::kInvalidFile, file_, ": ", what, " has unknown element type ", element);
    ENCORE_RETURN_IF_ERROR(read(&v->count, what + " (count)"));
    v->element = ValueType(element);
    v->offset = pos_;
    // Every element takes at least one byte (a string or array at least eight): an absurd count
    // is refused before anything loops over it.
    const std::uint64_t min_bytes = element_bytes > 0 ? std::uint64_t(element_bytes) : 8;
    ENCORE_REQUIRE(v->count <= left() / min_bytes, StatusCode::kInvalidFile, file_, ": ", what, " claims ", v->count,
                   " elements; ", left(), " bytes left");
    if (element_bytes > 0) {
      pos_ += std::size_t(v->count * std::uint64_t(element_bytes));
      return {};
    }
    for (std::uint64_t k = 0; k < v->count; ++k) {
      Value skipped;
      ENCORE_RETURN_IF_ERROR(read_value(element, &skipped, what + "[" + std::to_string(k) + "]", depth + 1));
    }
    return {};
  }

 private:
  template <class T>
  static T load(const unsigned char* at) {
    T v;
    std::memcpy(&v, at, sizeof(T));
    return v;
  }
  const unsigned char* base_;
  std::size_t size_;
  std::size_t pos_ = 0;
  const std::string& file_;
};

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

const char* to_string(ValueType type) {
  static const char* const names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = std::uint32_t(type);
  return i < std::size(names) ? names[i] : "unknown";
}

const char* to_string(TensorType type) {
  for (const TypeShape& t : kTypes)
    if (t.type == type) return t.name;
  return "unknown";
}

bool block_shape(std::uint32_t type, std::int64_t* values, std::int64_t* bytes) {
  for (const TypeShape& t : kTypes)
    if (std::uint32_t(t.type) == type) {
      *values = t.values, *bytes = t.bytes;
      return true;
    }
  return false;
}

std::int64_t TensorInfo::elements() const {
  return std::accumulate(dims.begin(), dims.end(), std::int64_t(1), std::multiplies<>());
}

// The POSIX mapping of an opened file.
struct File::Mapping {
  void* address = nullptr;
  std::size_t bytes = 0;
  ~Mapping() {
    if (address) munmap(address, bytes);
  }
};

File::File() = default;
File::~File() = default;
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;

Status File::open(const std::string& path, File& out) {
  out = File();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ENCORE_REQUIRE(fd >= 0, StatusCode::kInvalidFile, path, ": cannot open (", std::strerror(errno), ")");
  struct stat st {};
  const bool sized = fstat(fd, &st) == 0;
  const int stat_errno = errno;
  auto mapping = std::make_unique<Mapping>();
  if (sized && st.st_size > 0) {
    mapping->bytes = std::size_t(st.st_size);
    void* address = mmap(nullptr, mapping->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    mapping->address = address == MAP_FAILED ? nullptr : address;
  }
  const int map_errno = errno;
  close(fd);
  ENCORE_REQUIRE(sized, StatusCode::kInvalidFile, path, ": cannot stat (", std::strerror(stat_errno), ")");
  ENCORE_REQUIRE(st.st_size > 0, StatusCode::kInvalidFile, path, ": empty file");
  ENCORE_REQUIRE(mapping->address, StatusCode::kInvalidFile, path, ": cannot map (", std::strerror(map_errno), ")");
  File parsed;
  ENCORE_RETURN_IF_ERROR(parse(mapping->address, mapping->bytes, path, parsed));
  parsed.mapping_ = std::move(mapping);
  out = std::move(parsed);
  return {};
}

Status File::parse(const void* data, std::size_t size, const std::string& name, File& out) {
  out = File();
  File f;
  f.base_ = static_cast<const unsigned char*>(data);
  f.size_ = size;
  f.name_ = name;
  ENCORE_REQUIRE(data != nullptr || size == 0, StatusCode::kNullPointer, name, ": null image");
  Reader r(f.base_, size, f.name_);

  std::uint32_t magic = 0;
  ENCORE_RETURN_IF_ERROR(r.read(&magic, "the magic"));
  ENCORE_REQUIRE(magic == kMagic, StatusCode::kInvalidFile, name, ": not a GGUF file (magic 0x", std::hex, magic, ")");
  ENCORE_RETURN_IF_ERROR(r.read(&f.version_, "the version"));
  ENCORE_REQUIRE(f.version_ == 2 || f.version_ == 3, StatusCode::kInvalidFile, name, ": GGUF version ", f.version_,
                 " (2 and 3 are read)");
  std::uint64_t tensor_count = 0, kv_count = 0;
  ENCORE_RETURN_IF_ERROR(r.read(&tensor_count, "the tensor count"));
  ENCORE_RETURN_IF_ERROR(r.read(&kv_count, "the metadata count"));
  // A key/value takes at least 8 + 1 + 4 + 1 bytes, a tensor info at least 8 + 1 + 4 + 8 + 4 + 8.
  ENCORE_REQUIRE(kv_count <= r.left() / 14, StatusCode::kInvalidFile, name, ": claims ", kv_count, " metadata entries in ",
                 r.left(), " bytes");
  ENCORE_REQUIRE(tensor_count <= r.left() / 33, StatusCode::kInvalidFile, name, ": claims ", tensor_count, " tensors in ",
                 r.left(), " bytes");

  f.metadata_.reserve(std::size_t(kv_count));
  std::unordered_set<std::string_view> keys;
  for (std::uint64_t k = 0; k < kv_count; ++k) {
    KeyValue kv;
    const std::string what = "metadata entry " + std::to_string(k);
    ENCORE_RETURN_IF_ERROR(r.read_string(&kv.key, kMaxKeyBytes, what + " key"));
    ENCORE_REQUIRE(!kv.key.empty(), StatusCode::kInvalidFile, name, ": ", what, " has an empty key");
    ENCORE_REQUIRE(keys.insert(kv.key).second, StatusCode::kInvalidFile, name, ": key ", kv.key, " appears twice");
    std::uint32_t type = 0;
    ENCORE_RETURN_IF_ERROR(r.read(&type, "the type of key " + std::string(kv.key)));
    ENCORE_RETURN_IF_ERROR(r.read_value(type, &kv.value, "key " + std::string(kv.key)));
    f.metadata_.push_back(kv);
  }
  if (const KeyValue* a = f.find("general.alignment")) {
    ENCORE_REQUIRE(a->value.type == ValueType::kU32, StatusCode::kInvalidFile, name, ": general.alignment is a ",
                   to_string(a->value.type), " (u32 expected)");
    const std::uint64_t align = a->value.u;
    ENCORE_REQUIRE(align >= 1 && align <= (1u << 20) && (align & (align - 1)) == 0, StatusCode::kInvalidFile, name,
                   ": general.alignment = ", align, " (a power of two up to 2^20)");
    f.alignment_ = align;
  }

  f.tensors_.reserve(std::size_t(tensor_count));
  std::unordered_set<std::string_view> names;
  for (std::uint64_t t = 0; t < tensor_count; ++t) {
    TensorInfo info;
    ENCORE_RETURN_IF_ERROR(r.read_string(&info.name, kMaxNameBytes, "the name of tensor " + std::to_string(t)));
    ENCORE_REQUIRE(!info.name.empty(), StatusCode::kInvalidFile, name, ": tensor ", t, " has an empty name");
    const std::string what = "tensor " + std::string(info.name);
    ENCORE_REQUIRE(names.insert(info.name).second, StatusCode::kInvalidFile, name, ": ", what, " appears twice");
    std::uint32_t n_dims = 0;
    ENCORE_RETURN_IF_ERROR(r.read(&n_dims, what + " (dimension count)"));
    ENCORE_REQUIRE(n_dims >= 1 && n_dims <= std::uint32_t(kMaxDims), StatusCode::kInvalidFile, name, ": ", what, " has ", n_dims,
                   " dimensions (1 to ", kMaxDims, ")");
    std::int64_t elements = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      std::uint64_t dim = 0;
      ENCORE_RETURN_IF_ERROR(r.read(&dim, what + " (dimension " + std::to_string(d) + ")"));
      ENCORE_REQUIRE(dim >= 1 && dim <= (std::uint64_t(1) << 40) && std::uint64_t(elements) <= (std::uint64_t(1) << 50) / dim,
                     StatusCode::kInvalidFile, name, ": ", what, " dimension ", d, " = ", dim, " (the tensor must hold 1 to 2^50 values)");
      elements *= std::int64_t(dim);
      info.dims.push_back(std::int64_t(dim));
    }
    std::uint32_t type = 0;
    ENCORE_RETURN_IF_ERROR(r.read(&type, what + " (type)"));
    std::int64_t block_values = 0, block_bytes = 0;
    ENCORE_REQUIRE(block_shape(type, &block_values, &block_bytes), StatusCode::kInvalidFile, name, ": ", what,
                   " has unknown type ", type);
    info.type = TensorType(type);
    ENCORE_REQUIRE(info.dims[0] % block_values == 0, StatusCode::kInvalidFile, name, ": ", what, " rows of ", info.dims[0],
                   " values are not whole ", to_string(info.type), " blocks of ", block_values);
    info.bytes = std::uint64_t(elements / block_values) * std::uint64_t(block_bytes);
    ENCORE_RETURN_IF_ERROR(r.read(&info.offset, what + " (offset)"));
    ENCORE_REQUIRE(info.offset % f.alignment_ == 0, StatusCode::kInvalidFile, name, ": ", what, " at data offset ", info.offset,
                   " is not aligned to ", f.alignment_);
    f.tensors_.push_back(std::move(info));
  }

  const std::uint64_t data_start = align_up(r.pos(), f.alignment_);
  std::vector<std::size_t> order(f.tensors_.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return f.tensors_[a].offset < f.tensors_[b].offset; });
  for (std::size_t k = 0; k < order.size(); ++k) {
    TensorInfo& t = f.tensors_[order[k]];
    const std::uint64_t room = size > data_start ? size - data_start : 0;
    ENCORE_REQUIRE(t.offset <= room && t.bytes <= room - t.offset, StatusCode::kInvalidFile, name, ": tensor ", t.name,
                   " (", t.bytes, " bytes at data offset ", t.offset, ") runs past the end of the file (", room,
                   " bytes of data)");
    if (k > 0) {
      const TensorInfo& prev = f.tensors_[order[k - 1]];
      ENCORE_REQUIRE(prev.offset + prev.bytes <= t.offset, StatusCode::kInvalidFile, name, ": tensors ", prev.name, " and ",
                     t.name, " overlap");
    }
    t.data = f.base_ + data_start + t.offset;
  }
  out = std::move(f);
  return {};
}

const KeyValue* File::find(std::string_view key) const {
  for (const KeyValue& kv : metadata_)
    if (kv.key == key) return &kv;
  return nullptr;
}

const TensorInfo* File::tensor(std::string_view tensor_name) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == tensor_name) return &t;
  return nullptr;
}

namespace {
bool is_unsigned(ValueType t) {
  return t == ValueType::kU8 || t == ValueType::kU16 || t == ValueType::kU32 || t == ValueType::kU64;
}
bool is_signed(ValueType t) { return t == ValueType::kI8 || t == ValueType::kI16 || t == ValueType::kI32 || t == ValueType::kI64; }
}  // namespace

Status File::get(std::string_view key, std::uint64_t* out) const {
  const KeyValue* kv = find(key);
  ENCORE_REQUIRE(kv, StatusCode::kInvalidFile, name_, ": key ", key, " is missing");
  const Value& v = kv->value;
  ENCORE_REQUIRE(is_unsigned(v.type) || (is_signed(v.type) && v.i >= 0), StatusCode::kInvalidFile, name_, ": key ", key,
                 " is a ", to_string(v.type), ", not a non-negative integer");
  *out = is_unsigned(v.type) ? v.u : std::uint64_t(v.i);
  return {};
}

Status File::get(std::string_view key, std::int64_t* out) const {
  const KeyValue* kv = find(key);
  ENCORE_REQUIRE(kv, StatusCode::kInvalidFile, name_, ": key ", key, " is missing");
  const Value& v = kv->value;
  ENCORE_REQUIRE(is_signed(v.type) || (is_unsigned(v.type) && v.u <= std::uint64_t(std::numeric_limits<std::int64_t>::max())),
                 StatusCode::kInvalidFile, name_, ": key ", key, " is a ", to_string(v.type), ", not an integer");
  *out = is_signed(v.type) ? v.i : std::int64_t(v.u);
  return {};
}

Status File::get(std::string_view key, double* out) const {
  const KeyValue* kv = find(key);
  ENCORE_REQUIRE(kv, StatusCode::kInvalidFile, name_, ": key ", key, " is missing");
  const Value& v = kv->value;
  ENCORE_REQUIRE(v.type == ValueType::kF32 || v.type == ValueType::kF64, StatusCode::kInvalidFile, name_, ": key ", key, " is a ",
                 to_string(v.type), ", not a float");
  *out = v.f;
  return {};
}

Status File::get(std::string_view key, std::string* out) const {
  const KeyValue* kv = find(key);
  ENCORE_REQUIRE(kv, StatusCode::kInvalidFile, name_, ": key ", key, " is missing");
  ENCORE_REQUIRE(kv->value.type == ValueType::kString, StatusCode::kInvalidFile, name_, ": key ", key, " is a ",
                 to_string(kv->value.type), ", not a string");
  *out = std::string(kv->value.str);
  return {};
}

Status File::get(std::string_view key, bool* out) const {
  const KeyValue* kv = find(key);
  ENCORE_REQUIRE(kv, StatusCode::kInvalidFile, name_, ": key ", key, " is missing");
  ENCORE_REQUIRE(kv->value.type == ValueType::kBool, StatusCode::kInvalidFile, name_, ": key ", key, " is a ",
                 to_string(kv->value.type), ", not a bool");
  *out = kv->value.u != 0;
  return {};
}

Status File::array_element(const Value& array, std::uint64_t index, Value* out) const {
  ENCORE_REQUIRE(array.type == ValueType::kArray, StatusCode::kInvalidArgument, name_, ": array_element of a ",
                 to_string(array.type));
  ENCORE_REQUIRE(index < array.count, StatusCode::kOutOfRange, name_, ": array element ", index, " of ", array.count);
  ENCORE_REQUIRE(array.element != ValueType::kArray, StatusCode::kUnsupported, name_, ": elements of nested arrays are not read");
  // The array was checked whole when the file was parsed: these reads stay inside it.
  Reader r(base_, size_, name_);
  const int bytes = scalar_bytes(std::uint32_t(array.element));
  if (bytes > 0) {
    r.seek(array.offset + std::size_t(index) * std::size_t(bytes));
  } else {
    r.seek(array.offset);
    for (std::uint64_t k = 0; k < index; ++k) {
      Value skipped;
      ENCORE_RETURN_IF_ERROR(r.read_value(std::uint32_t(array.element), &skipped, "array element"));
    }
  }
  return r.read_value(std::uint32_t(array.element), out, "array element " + std::to_string(index));
}

}  // namespace encore::gguf
