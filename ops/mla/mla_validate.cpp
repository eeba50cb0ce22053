// Host-side validation of every MLA launcher's params: nothing is launched unless these pass.
#include <cmath>

#include <encore/ops/mla.h>

#include "common/cuda_check.h"

namespace encore::ops {
namespace {

bool heads_supported(int h) { return h == 8 || h == 16 || h == 32 || h == 64 || h == 128; }

Status check_heads(int num_heads, const char* op) {
  ENCORE_REQUIRE(heads_supported(num_heads), StatusCode::kUnsupported, op, ": num_heads must be 8, 16, 32, 64 or 128 (got ",
                 num_heads, ")");
  return {};
}

Status check_seqs(int batch, const char* op) {
  ENCORE_REQUIRE(batch >= 1 && batch <= kMlaMaxBatch, StatusCode::kOutOfRange, op, ": batch must be in [1, ",
                 kMlaMaxBatch, "] (got ", batch, ")");
  return {};
}

// Host-visible capacities of the paged cache and its block table.
Status check_cache(const MlaPagedCache& c, bool need_pages, const char* op) {
  if (need_pages) ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, c.pages, 16, "cache.pages"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, c.block_table, 4, "cache.block_table"));
  ENCORE_REQUIRE(c.num_pages >= 1, StatusCode::kInvalidArgument, op, ": cache.num_pages must be >= 1 (got ", c.num_pages, ")");
  ENCORE_REQUIRE(c.max_pages_per_seq >= 1 && c.max_pages_per_seq <= (1 << 24), StatusCode::kInvalidArgument, op,
                 ": cache.max_pages_per_seq must be in [1, 2^24] (got ", c.max_pages_per_seq, ")");
  ENCORE_REQUIRE(c.block_table_stride >= c.max_pages_per_seq, StatusCode::kOutOfRange, op,
                 ": cache.max_pages_per_seq (", c.max_pages_per_seq, ") exceeds the block table's row (",
                 c.block_table_stride, " entries)");
  return {};
}

Status check_rope(const MlaRope& r, const char* op) {
  ENCORE_REQUIRE(r.mode == MlaRopeMode::kNone || r.mode == MlaRopeMode::kDeepSeekYarn, StatusCode::kInvalidArgument, op,
                 ": unknown rope mode ", int(r.mode));
  if (r.mode == MlaRopeMode::kDeepSeekYarn)
    ENCORE_REQUIRE(r.theta > 1.f && r.yarn_factor >= 1.f && r.yarn_original_max_pos > 0 && r.beta_fast > r.beta_slow &&
                       r.beta_slow > 0.f,
                   StatusCode::kInvalidArgument, op, ": rope parameters out of range");
  return {};
}

int mla_head_groups(int num_heads) { return (num_heads + 31) / 32; }  // split-KV tiles per part

std::size_t pool_bytes(const MlaPagedCache& c) { return std::size_t(c.num_pages) * kMlaPageTokens * kMlaRowDim * 2; }
// Bytes from the first row's start to the last row's end: rows of `width` floats `stride` apart
// (a row may start inside a wider buffer, so batch * stride would run past its end).
std::size_t float_rows_bytes(int rows, std::int64_t stride, std::int64_t width) {
  return rows > 0 ? std::size_t((std::int64_t(rows) - 1) * stride + width) * 4 : 0;
}

}  // namespace

Status mla_validate(const MlaSchedParams& p) {
  constexpr const char* op = "mla_sched";
  ENCORE_RETURN_IF_ERROR(check_seqs(p.batch, op));
  ENCORE_RETURN_IF_ERROR(check_cache(p.cache, false, op));
  ENCORE_REQUIRE(p.num_parts >= 1 && p.num_parts <= 4096, StatusCode::kInvalidArgument, op,
                 ": num_parts must be in [1, 4096] (got ", p.num_parts, ")");
  ENCORE_REQUIRE(p.fixed_overhead >= 0 && p.fixed_overhead <= 4096, StatusCode::kInvalidArgument, op,
                 ": fixed_overhead must be in [0, 4096] (got ", p.fixed_overhead, ")");
  ENCORE_REQUIRE(p.min_part_units >= 1 && p.min_part_units <= (1 << 16), StatusCode::kInvalidArgument, op,
                 ": min_part_units must be in [1, 2^16] (got ", p.min_part_units, ")");
  // The plan's tape arithmetic is 32-bit (mla_plan.h).
  ENCORE_REQUIRE(std::int64_t(p.batch) * (std::int64_t(p.cache.max_pages_per_seq) + p.fixed_overhead) < (std::int64_t(1) << 31),
                 StatusCode::kOutOfRange, op, ": batch * (max_pages_per_seq + fixed_overhead) must stay below 2^31");
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_sched", p.seq_lens, 4, "seq_lens"));
  if (p.positions) ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_sched", p.positions, 4, "positions"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_sched", p.part_plans, 16, "part_plans"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_sched", p.num_splits, 4, "num_splits"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_sched", p.error_flag, 4, "error_flag"));
  const std::size_t meta_bytes = std::size_t(p.num_parts) * kMlaPartPlanInts * 4, splits_bytes = (std::size_t(p.batch) + 1) * 4;
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {p.part_plans, meta_bytes, "part_plans"}, {p.num_splits, splits_bytes, "num_splits"}));
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {p.part_plans, meta_bytes, "part_plans"}, {p.error_flag, 4, "error_flag"}));
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {p.num_splits, splits_bytes, "num_splits"}, {p.error_flag, 4, "error_flag"}));
  return {};
}

Status mla_validate(const MlaKvAppendParams& p) {
  constexpr const char* op = "mla_kv_append";
  ENCORE_RETURN_IF_ERROR(check_seqs(p.batch, op));
  ENCORE_RETURN_IF_ERROR(check_cache(p.cache, true, op));
  ENCORE_RETURN_IF_ERROR(check_rope(p.rope, op));
  ENCORE_REQUIRE(p.kv_a_stride >= kMlaRowDim && p.kv_a_stride % 4 == 0, StatusCode::kInvalidArgument, op,
                 ": kv_a_stride must be >= 576 and a multiple of 4 (got ", p.kv_a_stride, ")");
  ENCORE_REQUIRE(std::isfinite(p.eps) && p.eps > 0.f, StatusCode::kInvalidArgument, op, ": eps must be > 0");
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_kv_append", p.kv_a, 16, "kv_a"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_kv_append", p.norm_weight, 16, "norm_weight"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_kv_append", p.positions, 4, "positions"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_kv_append", p.seq_lens, 4, "seq_lens"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_kv_append", p.error_flag, 4, "error_flag"));
  const std::size_t kv_bytes = float_rows_bytes(p.batch, p.kv_a_stride, kMlaRowDim);
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {p.cache.pages, pool_bytes(p.cache), "cache.pages"}, {p.kv_a, kv_bytes, "kv_a"}));
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {p.cache.pages, pool_bytes(p.cache), "cache.pages"}, {p.norm_weight, kMlaLatentDim * 4, "norm_weight"}));
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {p.cache.pages, pool_bytes(p.cache), "cache.pages"}, {p.cache.block_table, std::size_t(p.batch) * p.cache.block_table_stride * 4, "block_table"}));
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {p.cache.pages, pool_bytes(p.cache), "cache.pages"}, {p.positions, std::size_t(p.batch) * 4, "positions"}));
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {p.cache.pages, pool_bytes(p.cache), "cache.pages"}, {p.seq_lens, std::size_t(p.batch) * 4, "seq_lens"}));
  return {};
}

Status mla_validate(const MlaQAbsorbParams& p) {
  constexpr const char* op = "mla_q_absorb";
  ENCORE_RETURN_IF_ERROR(check_seqs(p.batch, op));
  ENCORE_RETURN_IF_ERROR(check_heads(p.num_heads, op));
  ENCORE_RETURN_IF_ERROR(check_rope(p.rope, op));
  ENCORE_REQUIRE(p.q_stride >= std::int64_t(p.num_heads) * kMlaQHeadDim && p.q_stride % 4 == 0, StatusCode::kInvalidArgument,
                 op, ": q_stride must be >= num_heads * 192 and a multiple of 4 (got ", p.q_stride, ")");
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_q_absorb", p.q, 16, "q"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_q_absorb", p.kv_b, 16, "kv_b"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_q_absorb", p.positions, 4, "positions"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_q_absorb", p.q576, 16, "q576"));
  const std::size_t out_bytes = std::size_t(p.batch) * p.num_heads * kMlaRowDim * 2;
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {p.q576, out_bytes, "q576"}, {p.q, float_rows_bytes(p.batch, p.q_stride, std::int64_t(p.num_heads) * kMlaQHeadDim), "q"}));
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {p.q576, out_bytes, "q576"}, {p.kv_b, std::size_t(p.num_heads) * kMlaKvbRowsPerHead * kMlaLatentDim * 2, "kv_b"}));
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {p.q576, out_bytes, "q576"}, {p.positions, std::size_t(p.batch) * 4, "positions"}));
  return {};
}

Status mla_validate(const MlaQAbsorbParams& q, const MlaKvAppendParams& a) {
  constexpr const char* op = "mla_q_absorb_and_append";
  ENCORE_RETURN_IF_ERROR(mla_validate(q));
  ENCORE_RETURN_IF_ERROR(mla_validate(a));
  // One launch: neither's outputs may touch what the other reads or writes.
  return detail::check_disjoint(
      op,
      {{q.q, float_rows_bytes(q.batch, q.q_stride, std::int64_t(q.num_heads) * kMlaQHeadDim), "q"},
       {q.kv_b, std::size_t(q.num_heads) * kMlaKvbRowsPerHead * kMlaLatentDim * 2, "kv_b"},
       {q.positions, std::size_t(q.batch) * 4, "positions"},
       {a.kv_a, float_rows_bytes(a.batch, a.kv_a_stride, kMlaRowDim), "kv_a"},
       {a.norm_weight, kMlaLatentDim * 4, "norm_weight"},
       {a.cache.block_table, std::size_t(a.batch) * a.cache.block_table_stride * 4, "block_table"},
       {a.positions, std::size_t(a.batch) * 4, "positions"},
       {a.seq_lens, std::size_t(a.batch) * 4, "seq_lens"},
       {a.error_flag, 4, "error_flag"}},
      {{q.q576, std::size_t(q.batch) * q.num_heads * kMlaRowDim * 2, "q576"}, {a.cache.pages, pool_bytes(a.cache), "cache.pages"}});
}

Status mla_validate(const MlaAttentionParams& p) {
  constexpr const char* op = "mla_attention";
  ENCORE_RETURN_IF_ERROR(check_seqs(p.batch, op));
  ENCORE_RETURN_IF_ERROR(check_heads(p.num_heads, op));
  ENCORE_RETURN_IF_ERROR(check_cache(p.cache, true, op));
  ENCORE_REQUIRE(p.num_parts >= 1 && p.num_parts <= 4096, StatusCode::kInvalidArgument, op,
                 ": num_parts must be in [1, 4096] (got ", p.num_parts, ")");
  ENCORE_REQUIRE(std::isfinite(p.softmax_scale) && p.softmax_scale > 0.f, StatusCode::kInvalidArgument, op,
                 ": softmax_scale must be finite and > 0");
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_attention", p.q576, 16, "q576"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_attention", p.seq_lens, 4, "seq_lens"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_attention", p.part_plans, 16, "part_plans"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_attention", p.num_splits, 4, "num_splits"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_attention", p.error_flag, 4, "error_flag"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_attention", p.o_lat, 16, "o_lat"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_attention", p.lse, 4, "lse"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_attention", p.partial_o, 16, "partial_o"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_attention", p.partial_lse, 4, "partial_lse"));
  const std::size_t rows = std::size_t(p.batch) * p.num_heads, slots = std::size_t(p.batch + p.num_parts) * p.num_heads;
  if (p.counters != nullptr) ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, p.counters, 4, "counters"));
  const std::size_t counter_bytes = std::size_t(p.batch) * mla_head_groups(p.num_heads) * 4;
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(
      op,
      {{p.q576, rows * kMlaRowDim * 2, "q576"},
       {p.cache.pages, pool_bytes(p.cache), "cache.pages"},
       {p.seq_lens, std::size_t(p.batch) * 4, "seq_lens"},
       {p.part_plans, std::size_t(p.num_parts) * sizeof(MlaPartPlan), "part_plans"},
       {p.num_splits, std::size_t(p.batch + 1) * 4, "num_splits"}},
      {{p.o_lat, rows * kMlaLatentDim * 4, "o_lat"},
       {p.lse, rows * 4, "lse"},
       {p.partial_o, slots * kMlaLatentDim * 4, "partial_o"},
       {p.partial_lse, slots * 4, "partial_lse"},
       {p.counters, counter_bytes, "counters"}}));
  return {};
}

Status mla_validate(const MlaVUpParams& p) {
  constexpr const char* op = "mla_v_up";
  ENCORE_RETURN_IF_ERROR(check_seqs(p.batch, op));
  ENCORE_RETURN_IF_ERROR(check_heads(p.num_heads, op));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_v_up", p.o_lat, 16, "o_lat"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_v_up", p.kv_b, 16, "kv_b"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("mla_v_up", p.out, 16, "out"));
  const std::size_t out_bytes = std::size_t(p.batch) * p.num_heads * kMlaVHeadDim * 4;
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {p.out, out_bytes, "out"}, {p.o_lat, std::size_t(p.batch) * p.num_heads * kMlaLatentDim * 4, "o_lat"}));
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {p.out, out_bytes, "out"}, {p.kv_b, std::size_t(p.num_heads) * kMlaKvbRowsPerHead * kMlaLatentDim * 2, "kv_b"}));
  return {};
}

}  // namespace encore::ops
