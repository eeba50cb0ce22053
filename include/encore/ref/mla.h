// Double-precision CPU references for the absorbed MLA decode ops (docs/mla.md), plus the
// CPU copy of the split-KV scheduler (integer logic, bit-identical to the device's).
#pragma once

#include <cstdint>
#include <vector>

#include <encore/ops/mla.h>

namespace encore::ref {

// Split-KV plan (docs/mla.md §7, tape form of mla_plan.h) for the given lengths: parts [num_parts],
// num_splits [N + 1]. Computed page by page, independently of the kernel's closed form.
struct MlaSchedule {
  std::vector<ops::MlaPartPlan> parts;
  std::vector<std::int32_t> num_splits;
};
MlaSchedule mla_sched(const std::vector<std::int32_t>& seq_lens, int num_parts,
                      int fixed_overhead = ops::kMlaDefaultFixedOverhead, int min_part_units = 1);

// theta'_i of pair i (0..31): YaRN-scaled for kDeepSeekYarn; 0 for kNone.
double mla_rope_theta(const ops::MlaRope& rope, int pair);
// Rotates 64 values (adjacent pairs) at `pos`; a copy for kNone.
void mla_rope_apply(const ops::MlaRope& rope, int pos, const double* in, double* out);

// One cache row before bf16 rounding: [RMSNorm(kv_a[0:512]) * w | rope(kv_a[512:576], pos)].
std::vector<double> mla_kv_row(const float* kv_a, const float* norm_weight, double eps, int pos,
                               const ops::MlaRope& rope);

// q576 of one token before bf16 rounding: q [H][192], kv_b [H][256][512] -> [H][576].
std::vector<double> mla_q_absorb(const float* q, const float* kv_b, int num_heads, int pos,
                                 const ops::MlaRope& rope);

// Kernel level (absorbed MQA): rows [len][576] gathered from the pages; q576 [H][576].
// o_lat [H][512] = softmax(scale q576 K^T) V with V = K[:, :512]; lse [H] natural log (+inf if len 0).
void mla_attention_absorbed(const float* q576, const float* rows, int len, int num_heads, double scale,
                            double* o_lat, double* lse);

// Model level, as trained (no absorption): expands every cached c_t into per-head
// k_nope = W_UK c_t and v = W_UV c_t, rotates q_pe at `pos`, runs standard attention.
// q [H][192] fp32, rows [len][576] (c | k_pe as cached), kv_b [H][256][512]; o [H][128].
// Heads are spread over `threads` host threads.
void mla_attention_model(const float* q, int pos, const float* rows, int len, const float* kv_b, int num_heads,
                         double scale, const ops::MlaRope& rope, double* o, int threads = 0);

// o [H][128] = W_UV[h] o_lat[h] for one token.
void mla_v_up(const double* o_lat, const float* kv_b, int num_heads, double* o);

}  // namespace encore::ref
