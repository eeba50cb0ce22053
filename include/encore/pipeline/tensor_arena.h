// A named table of tensors packed into one allocation: each tensor starts on a 256-byte boundary,
// except that a tensor may be required to follow its predecessor directly (rows of a fused GEMV,
// expert stacks), which the builder checks instead of padding. Used for the weights, the step
// buffers and the state pools alike; the pipeline allocates each arena once.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <encore/status.h>

namespace encore::pipeline {

enum class DType { kQ4K, kBf16, kF32, kI32, kU8 };

const char* to_string(DType t);
// Bytes of a row-major tensor; Q4_K needs the innermost dim to be a multiple of 256.
std::int64_t tensor_bytes(DType t, const std::vector<std::int64_t>& dims);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> dims;  // row-major, outermost first (GGUF's ne order reversed)
  std::int64_t offset = 0;         // bytes from the arena base
  std::int64_t bytes = 0;
};

class TensorArena {
 public:
  static constexpr std::int64_t kAlign = 256;

  // Appends a tensor at the next 256-byte boundary. With `follows_previous`, it must start exactly
  // where the previous tensor ends (kInvalidArgument otherwise) so that one pointer covers both.
  Status add(std::string name, DType dtype, std::vector<std::int64_t> dims, bool follows_previous = false);

  const TensorInfo* find(std::string_view name) const;
  // The tensor `name` or an error naming it.
  Status lookup(std::string_view name, const TensorInfo*& out) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Bytes to allocate: the end of the last tensor rounded up to kAlign.
  std::int64_t total_bytes() const { return total_; }

 private:
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, std::size_t> index_;
  std::int64_t total_ = 0;
};

}  // namespace encore::pipeline
