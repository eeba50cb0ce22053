// The fp16 core's activation layout (activation_f16.cuh), as plain constexpr functions: the
// device writer and reader, the host reference and the CPU tests use the same definitions.
#pragma once

namespace encore::q4k {

inline constexpr int kF16ValueBlockBytes = 512;  // 256 fp16 values
inline constexpr int kF16SumsBytes = 32;         // 4 lanes x {hi pair, lo pair}
// Bytes between two tokens' value rows past their blocks: a token row is then 64 bytes off a
// multiple of 128, so the two tokens of a quarter warp's 16-byte loads hit different banks.
inline constexpr int kF16TokenPad = 64;
// Exponent bounds of the block scale 2^s: amax * 2^s lands in [2^kF16TargetExp, 2^(kF16TargetExp + 1)).
inline constexpr int kF16TargetExp = 14;
inline constexpr int kF16MaxScaleExp = 100;  // |s| clamp: tiny or zero blocks stay finite

// Position (0..255) in its block of the value that byte i (0..3) of word u (0..7) of lane t's
// 32-byte qs chunk holds in nibble h (0 low, 1 high): Q4_K's chunk t covers sub-blocks 2t (low
// nibbles) and 2t + 1 (high), byte l of the chunk being position l of each (docs/q4k.md §3).
constexpr int f16_position(int t, int u, int h, int i) { return 64 * t + 32 * h + 4 * u + i; }

// Byte offset, inside a token's 512-byte block, of the 8 bytes lane t reads for k step (u, h):
// [u][t][h], so the 4 lanes of a group read 64 contiguous bytes per u.
constexpr int f16_value_offset(int u, int t, int h) { return ((u * 4 + t) * 2 + h) * 8; }

// Which fp16 of those 8 bytes (0..3) holds byte i's value: register i & 1 ({p0, p2} then
// {p1, p3}), half i >> 1. The mma's B operand is b0b1 = register 0, b2b3 = register 1.
constexpr int f16_value_slot(int i) { return 2 * (i & 1) + (i >> 1); }

// Byte offset in a token's block of the value at position p (0..255): the inverse of
// f16_position through f16_value_offset and f16_value_slot. The writer's lane holds positions
// 8 lane .. 8 lane + 7: two groups of 4 (i = 0..3) at f16_value_byte_offset(8 lane + 4 w).
constexpr int f16_value_byte_offset(int p) {
  return f16_value_offset((p % 32) / 4, p / 64, (p / 32) % 2) + 2 * f16_value_slot(p % 4);
}

// Byte offset in a (token, block)'s 32-byte sums entry of sub-block j's hi (lo = 1: lo) part:
// lane t reads 8 bytes at 8t, {hi_2t, hi_2t+1} then {lo_2t, lo_2t+1} (the m16n8k8 B operand:
// k slots 2t, 2t + 1).
constexpr int f16_sum_offset(int j, int lo) { return 8 * (j / 2) + 2 * (2 * lo + j % 2); }

// The block scale's exponent s for a block whose largest magnitude has biased fp32 exponent
// `biased` (0 for zero): amax * 2^s in [2^14, 2^15).
constexpr int f16_scale_exponent(int biased) {
  const int s = kF16TargetExp + 127 - biased;
  return s > kF16MaxScaleExp ? kF16MaxScaleExp : s < -kF16MaxScaleExp ? -kF16MaxScaleExp : s;
}

}  // namespace encore::q4k
