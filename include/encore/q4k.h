// Q4_K: GGML's `block_q4_K`, byte for byte (GGUF tensors load without repacking).
// 256 weights per 144-byte block: fp16 d and dmin, twelve bytes packing eight 6-bit sub-block
// scales and mins, and 128 bytes of 4-bit codes. w_j = (d*sc[s])*q_j - (dmin*m[s]), s = j/32.
// See docs/q4k.md for the bit layout; this header is the normative C++ form of it.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <encore/status.h>

namespace encore::q4k {

inline constexpr int kBlockValues = 256;     // weights per block
inline constexpr int kBlockBytes = 144;      // bytes per block
inline constexpr int kSubBlocks = 8;         // 32-weight sub-blocks per block
inline constexpr int kSubBlockValues = 32;

struct Block {
  std::uint16_t d;            // fp16 bits: scale of the 6-bit sub-block scales
  std::uint16_t dmin;         // fp16 bits: scale of the 6-bit sub-block mins
  std::uint8_t scales[12];    // sc[0..7], m[0..7], 6 bits each (see unpack_scales)
  std::uint8_t qs[128];       // byte 32g+l: value 64g+l (low nibble), 64g+32+l (high nibble)
};
static_assert(sizeof(Block) == 144, "Q4_K block must be 144 bytes");
static_assert(offsetof(Block, d) == 0 && offsetof(Block, dmin) == 2, "d, dmin at bytes 0..3");
static_assert(offsetof(Block, scales) == 4 && offsetof(Block, qs) == 16, "scales at 4..15, qs at 16..143");
static_assert(alignof(Block) == 2, "blocks pack back to back");

// Bytes of one row of K weights (K a multiple of 256).
constexpr std::int64_t row_bytes(std::int64_t k) { return k / kBlockValues * kBlockBytes; }

// Unpacks the eight 6-bit scales and mins of a block.
void unpack_scales(const Block& block, std::uint8_t sc[8], std::uint8_t m[8]);
// Packs eight 6-bit scales and mins (each <= 63) into `block.scales`.
void pack_scales(const std::uint8_t sc[8], const std::uint8_t m[8], Block& block);

// IEEE half <-> float, round to nearest even (what ggml's F16C path does).
float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);

// Host decode of n values; bit-exact with ggml's dequantize_row_q4_K. kInvalidArgument when n is
// not a non-negative multiple of 256, kNullPointer for a null buffer (n > 0); nothing written then.
Status dequantize_row(const Block* in, float* out, std::int64_t n);
// Host encode of n values; byte-exact with ggml's quantize_row_q4_K_ref. Same checks.
Status quantize_row(const float* in, Block* out, std::int64_t n);

// GPU decode of n values (n a multiple of 256) for tests and for users who need dense weights.
// `in` 16-byte aligned; out 16-byte aligned (fp32) or 8-byte aligned (bf16).
Status dequantize(const Block* in, float* out, std::int64_t n, cudaStream_t stream);
Status dequantize(const Block* in, __nv_bfloat16* out, std::int64_t n, cudaStream_t stream);

}  // namespace encore::q4k
