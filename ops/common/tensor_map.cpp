#include "common/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "common/cuda_check.h"

namespace encore::detail {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* sym = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &sym, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      sym = nullptr;
      (void)cudaGetLastError();  // reported through the Status; leave no error for the next launch check
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(sym);
  }();
  return fn;
}

// Shared checks of a 2-D map's geometry.
Status check_map_geometry(const void* base, std::uint64_t rows, std::uint64_t row_stride_bytes, const char* what) {
  ENCORE_RETURN_IF_ERROR(check_pointer(what, base, 16, "base"));
  ENCORE_REQUIRE(row_stride_bytes % 16 == 0 && rows >= 1 && rows < (std::uint64_t(1) << 32), StatusCode::kInvalidArgument,
                 what, ": the row count must be in [1, 2^32) and the row stride a multiple of 16 bytes (got ", rows, " rows, stride ",
                 row_stride_bytes, ")");
  return {};
}

Status encode_2d(CUtensorMap* map, CUtensorMapDataType type, const void* base, std::uint64_t cols, std::uint64_t rows,
                 std::uint64_t row_stride_bytes, std::uint32_t box_cols, std::uint32_t box_rows, CUtensorMapSwizzle swizzle,
                 const char* what) {
  const PFN_cuTensorMapEncodeTiled_v12000 fn = encode_tiled();
  ENCORE_REQUIRE(fn != nullptr, StatusCode::kUnsupported, what, ": the driver offers no cuTensorMapEncodeTiled");
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = fn(map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        swizzle, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  ENCORE_REQUIRE(r == CUDA_SUCCESS, StatusCode::kInvalidArgument, what, ": cuTensorMapEncodeTiled failed (CUresult ", int(r), ")");
  return {};
}

}  // namespace

Status encode_tensor_map_2d_b16(CUtensorMap* map, const void* base, std::uint64_t cols, std::uint64_t rows,
                                std::uint64_t row_stride_bytes, std::uint32_t box_cols, std::uint32_t box_rows,
                                const char* what) {
  ENCORE_REQUIRE(box_cols * 2 == 128, StatusCode::kInvalidArgument, what, ": a 128-byte swizzled box is 64 values wide");
  ENCORE_RETURN_IF_ERROR(check_map_geometry(base, rows, row_stride_bytes, what));
  return encode_2d(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, cols, rows, row_stride_bytes, box_cols, box_rows,
                   CU_TENSOR_MAP_SWIZZLE_128B, what);
}

Status encode_tensor_map_2d_words(CUtensorMap* map, const void* base, std::uint64_t words, std::uint64_t rows,
                                  std::uint64_t row_stride_bytes, std::uint32_t box_words, std::uint32_t box_rows,
                                  const char* what) {
  ENCORE_REQUIRE(box_words >= 4 && box_words <= 256 && box_words % 4 == 0 && box_rows >= 1 && box_rows <= 256,
                 StatusCode::kInvalidArgument, what, ": a box is 4..256 words (a multiple of 4) by 1..256 rows (got ", box_words,
                 " x ", box_rows, ")");
  ENCORE_RETURN_IF_ERROR(check_map_geometry(base, rows, row_stride_bytes, what));
  return encode_2d(map, CU_TENSOR_MAP_DATA_TYPE_UINT32, base, words, rows, row_stride_bytes, box_words, box_rows,
                   CU_TENSOR_MAP_SWIZZLE_NONE, what);
}

}  // namespace encore::detail
