// GGUF (v2 and v3), the file format llama.cpp writes models in: a header, typed key/value
// metadata, tensor infos, then the aligned tensor data (docs/gguf.md). A File maps the file into
// memory and checks all of it before it answers: every count, length and offset against the
// file's size, the tensors' types, shapes and alignment, and that no two tensors share a byte.
// A bad file is a Status (kInvalidFile) naming the file and the key or tensor, never a crash.
// Tensor data is never copied: TensorInfo::data points into the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <encore/status.h>

namespace encore::gguf {

enum class ValueType : std::uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* to_string(ValueType type);

// ggml's tensor types (the numbers are the file's). Only these are accepted.
enum class TensorType : std::uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kBF16 = 30,
};
const char* to_string(TensorType type);
// Values per block and bytes per block of a type (1 and the element size for plain types);
// false for a number that is not one of the TensorType values.
bool block_shape(std::uint32_t type, std::int64_t* values, std::int64_t* bytes);

// Decodes `values` values of a tensor of `type` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 or
// Q4_K; `values` whole blocks) into fp32, bit-exact with ggml's reference decoders. kUnsupported
// for another type, kInvalidArgument for a count that is not whole blocks.
Status decode(TensorType type, const void* data, std::int64_t values, float* out);

// One metadata value. Scalars are widened into the field of their kind; a string points into the
// mapping; an array keeps its element type and count, and its elements are read through File.
struct Value {
  ValueType type = ValueType::kU8;
  std::uint64_t u = 0;         // kU8, kU16, kU32, kU64, kBool
  std::int64_t i = 0;          // kI8, kI16, kI32, kI64
  double f = 0;                // kF32, kF64
  std::string_view str;        // kString
  ValueType element = ValueType::kU8;  // kArray: the elements' type
  std::uint64_t count = 0;     // kArray: the number of elements
  std::size_t offset = 0;      // kArray: the first element's byte offset in the file
};

struct KeyValue {
  std::string_view key;
  Value value;
};

struct TensorInfo {
  std::string_view name;
  std::vector<std::int64_t> dims;  // ggml order: dims[0] is the row length (contiguous)
  TensorType type = TensorType::kF32;
  std::uint64_t offset = 0;        // from the start of the data section
  std::uint64_t bytes = 0;
  const void* data = nullptr;      // into the mapping
  std::int64_t elements() const;
};

// Builds a GGUF image in memory field by field (little-endian), for writing files (save_gguf) and
// for tests that need exact control of every field.
class Writer {
 public:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void str(std::string_view s) {
    put<std::uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void key(std::string_view k, ValueType t) {
    str(k);
    put<std::uint32_t>(std::uint32_t(t));
  }
  void u32(std::string_view k, std::uint32_t v) { key(k, ValueType::kU32), put(v); }
  void f32(std::string_view k, float v) { key(k, ValueType::kF32), put(v); }
  void text(std::string_view k, std::string_view v) { key(k, ValueType::kString), str(v); }
  void pad_to(std::size_t alignment) { bytes_.resize((bytes_.size() + alignment - 1) / alignment * alignment, 0); }
  std::vector<unsigned char>& bytes() { return bytes_; }

 private:
  std::vector<unsigned char> bytes_;
};

class File {
 public:
  File();
  ~File();
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Maps and checks `path`. On error `out` is left empty.
  static Status open(const std::string& path, File& out);
  // Checks a GGUF image already in memory (kept referenced, not copied: it must outlive `out`).
  // `name` stands for the file in messages.
  static Status parse(const void* data, std::size_t size, const std::string& name, File& out);

  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  std::size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  const std::vector<KeyValue>& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Null when absent.
  const KeyValue* find(std::string_view key) const;
  const TensorInfo* tensor(std::string_view name) const;

  // Typed reads of one key: kInvalidFile naming the key when it is absent or of another type
  // (any unsigned or signed integer type converts when the value fits).
  Status get(std::string_view key, std::uint64_t* out) const;
  Status get(std::string_view key, std::int64_t* out) const;
  Status get(std::string_view key, double* out) const;
  Status get(std::string_view key, std::string* out) const;
  Status get(std::string_view key, bool* out) const;
  // Element `index` of an array value (integers and floats widened as above; strings as views).
  Status array_element(const Value& array, std::uint64_t index, Value* out) const;

 private:
  struct Mapping;
  std::unique_ptr<Mapping> mapping_;
  const unsigned char* base_ = nullptr;
  std::size_t size_ = 0;
  std::string name_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::vector<KeyValue> metadata_;
  std::vector<TensorInfo> tensors_;
};

}  // namespace encore::gguf
