// ggml's block formats decoded to fp32 (docs/gguf.md §1): scales are fp16, codes are unsigned with
// an offset (Q4_0: 8, Q5_0: 16) or an fp16 minimum (Q4_1, Q5_1), and Q5's fifth bits sit in one
// 32-bit word per block (bit j for value j).
#include <encore/gguf.h>

#include <cstring>

#include <encore/q4k.h>

namespace encore::gguf {

namespace {

float half(const unsigned char* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return q4k::half_to_float(h);
}

// A 32-value block with 4-bit codes in 16 bytes (low nibbles: values 0..15, high: 16..31) and,
// for Q5, a fifth bit per value. ggml's expressions: (q - offset) * d, or q * d + m with a minimum.
template <bool kFifthBit>
void decode_nibbles(const unsigned char* qs, std::uint32_t qh, float* out, auto value) {
  for (int j = 0; j < 16; ++j) {
    int lo = qs[j] & 0x0F, hi = qs[j] >> 4;
    if constexpr (kFifthBit) lo |= int((qh >> j) & 1u) << 4, hi |= int((qh >> (j + 16)) & 1u) << 4;
    out[j] = value(lo);
    out[j + 16] = value(hi);
  }
}

}  // namespace

Status decode(TensorType type, const void* data, std::int64_t values, float* out) {
  std::int64_t block_values = 0, block_bytes = 0;
  ENCORE_REQUIRE(block_shape(std::uint32_t(type), &block_values, &block_bytes), StatusCode::kUnsupported, "gguf::decode: type ",
                 std::uint32_t(type));
  ENCORE_REQUIRE(values >= 0 && values % block_values == 0, StatusCode::kInvalidArgument, "gguf::decode: ", values, " values are not whole ",
                 to_string(type), " blocks");
  ENCORE_REQUIRE(values == 0 || (data && out), StatusCode::kNullPointer, "gguf::decode: null data or out");
  const auto* p = static_cast<const unsigned char*>(data);
  const std::int64_t blocks = values / block_values;
  switch (type) {
    case TensorType::kF32: std::memcpy(out, data, std::size_t(values) * 4); return {};
    case TensorType::kF16:
      for (std::int64_t i = 0; i < values; ++i) out[i] = half(p + 2 * i);
      return {};
    case TensorType::kBF16:
      for (std::int64_t i = 0; i < values; ++i) {
        std::uint32_t bits = std::uint32_t(p[2 * i]) << 16 | std::uint32_t(p[2 * i + 1]) << 24;
        std::memcpy(out + i, &bits, 4);
      }
      return {};
    case TensorType::kQ8_0:
      for (std::int64_t b = 0; b < blocks; ++b, p += 34) {
        const float d = half(p);
        for (int j = 0; j < 32; ++j) out[b * 32 + j] = float(static_cast<std::int8_t>(p[2 + j])) * d;
      }
      return {};
    case TensorType::kQ4_0:
      for (std::int64_t b = 0; b < blocks; ++b, p += 18) {
        const float d = half(p);
        decode_nibbles<false>(p + 2, 0, out + b * 32, [d](int q) { return float(q - 8) * d; });
      }
      return {};
    case TensorType::kQ4_1:
      for (std::int64_t b = 0; b < blocks; ++b, p += 20) {
        const float d = half(p), m = half(p + 2);
        decode_nibbles<false>(p + 4, 0, out + b * 32, [d, m](int q) { return float(q) * d + m; });
      }
      return {};
    case TensorType::kQ5_0:
      for (std::int64_t b = 0; b < blocks; ++b, p += 22) {
        const float d = half(p);
        std::uint32_t qh;
        std::memcpy(&qh, p + 2, 4);
        decode_nibbles<true>(p + 6, qh, out + b * 32, [d](int q) { return float(q - 16) * d; });
      }
      return {};
    case TensorType::kQ5_1:
      for (std::int64_t b = 0; b < blocks; ++b, p += 24) {
        std::uint32_t qh;
        std::memcpy(&qh, p + 4, 4);
        const float d = half(p), m = half(p + 2);
        decode_nibbles<true>(p + 8, qh, out + b * 32, [d, m](int q) { return float(q) * d + m; });
      }
      return {};
    case TensorType::kQ4_K: return q4k::dequantize_row(static_cast<const q4k::Block*>(data), out, values);
    default: break;
  }
  return Status(StatusCode::kUnsupported, std::string("gguf::decode: ") + to_string(type) + " is not decoded");
}

}  // namespace encore::gguf
