#include <encore/pipeline/tensor_arena.h>

#include <encore/q4k.h>

namespace encore::pipeline {

const char* to_string(DType t) {
  switch (t) {
    case DType::kQ4K: return "Q4_K";
    case DType::kBf16: return "bf16";
    case DType::kF32: return "fp32";
    case DType::kI32: return "int32";
    case DType::kU8: return "u8";
  }
  return "?";
}

std::int64_t tensor_bytes(DType t, const std::vector<std::int64_t>& dims) {
  std::int64_t outer = 1;
  for (std::size_t i = 0; i + 1 < dims.size(); ++i) outer *= dims[i];
  const std::int64_t inner = dims.empty() ? 1 : dims.back();
  switch (t) {
    case DType::kQ4K: return outer * q4k::row_bytes(inner);
    case DType::kBf16: return outer * inner * 2;
    case DType::kF32:
    case DType::kI32: return outer * inner * 4;
    case DType::kU8: return outer * inner;
  }
  return 0;
}

Status TensorArena::add(std::string name, DType dtype, std::vector<std::int64_t> dims, bool follows_previous) {
  ENCORE_REQUIRE(!dims.empty(), StatusCode::kInvalidArgument, "arena: ", name, " has no dims");
  for (std::int64_t d : dims)
    ENCORE_REQUIRE(d >= 1, StatusCode::kInvalidArgument, "arena: ", name, " has a dim < 1");
  ENCORE_REQUIRE(dtype != DType::kQ4K || dims.back() % q4k::kBlockValues == 0, StatusCode::kInvalidArgument, "arena: ",
                 name, " is Q4_K with an inner dim of ", dims.back(), " (must be a multiple of 256)");
  ENCORE_REQUIRE(!index_.count(name), StatusCode::kInvalidArgument, "arena: ", name, " added twice");
  const std::int64_t end = tensors_.empty() ? 0 : tensors_.back().offset + tensors_.back().bytes;
  const std::int64_t offset = (end + kAlign - 1) / kAlign * kAlign;
  ENCORE_REQUIRE(!follows_previous || (!tensors_.empty() && offset == end), StatusCode::kInvalidArgument, "arena: ", name,
                 " must follow ", tensors_.empty() ? "nothing" : tensors_.back().name, " directly, but that ends ", end,
                 " bytes in, not on a ", kAlign, "-byte boundary");
  TensorInfo t{std::move(name), dtype, std::move(dims), offset, 0};
  t.bytes = tensor_bytes(t.dtype, t.dims);
  index_.emplace(t.name, tensors_.size());
  total_ = (offset + t.bytes + kAlign - 1) / kAlign * kAlign;
  tensors_.push_back(std::move(t));
  return {};
}

const TensorInfo* TensorArena::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status TensorArena::lookup(std::string_view name, const TensorInfo*& out) const {
  out = find(name);
  ENCORE_REQUIRE(out != nullptr, StatusCode::kInvalidArgument, "arena: no tensor named ", name);
  return {};
}

}  // namespace encore::pipeline
