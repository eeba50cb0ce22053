// Host side of the TMA engine's tiled copies: a tensor map describes a global tensor and the box
// one `cp.async.bulk.tensor` copies (common/async_copy.cuh). Encoded through the driver entry
// point the runtime hands out, so the library links no libcuda.
#pragma once

#include <cstdint>

#include <cuda.h>

#include <encore/status.h>

namespace encore::detail {

// A row-major [rows][cols] tensor of 2-byte elements (rows `row_stride_bytes` apart, a multiple
// of 16; base 16-byte aligned), copied in boxes of box_rows x box_cols landing in the 128-byte
// swizzled layout of common/wgmma.cuh (box_cols * 2 == 128).
Status encode_tensor_map_2d_b16(CUtensorMap* map, const void* base, std::uint64_t cols, std::uint64_t rows,
                                std::uint64_t row_stride_bytes, std::uint32_t box_cols, std::uint32_t box_rows,
                                const char* what);

// A row-major [rows][words] tensor of 4-byte words (rows `row_stride_bytes` apart, a multiple of
// 16; base 16-byte aligned), copied in plain boxes of box_rows x box_words (no swizzle: a box
// lands as box_rows rows of box_words * 4 bytes, back to back). Words of a box past a row's end
// land as zeros, so a box may carry padding beyond its row.
Status encode_tensor_map_2d_words(CUtensorMap* map, const void* base, std::uint64_t words, std::uint64_t rows,
                                  std::uint64_t row_stride_bytes, std::uint32_t box_words, std::uint32_t box_rows,
                                  const char* what);

}  // namespace encore::detail
