// Absorbed MLA decode (docs/mla.md): paged bf16 latent cache, q absorption, cache append,
// device-side split-KV scheduling, tensor-core split-KV attention, LSE combine, V up-projection.
//
// One decode step of one MLA layer, in stream order:
//   mla_sched        once per step (shared by every MLA layer): validates the device-resident
//                    lengths / positions / page ids, writes the split plan and the error flag.
//   mla_kv_append    RMSNorm + RoPE-or-copy of the new token's kv_a row into its cache row.
//   mla_q_absorb     q576 = [W_UK[h]^T q_nope[h] ; rope(q_pe[h])] in bf16.
//   (mla_q_absorb_and_append: the two above in one launch, the same outputs bit for bit.)
//   mla_splitkv      attention over the cache, one tile per (scheduler part, 32-head group).
//   mla_combine      LSE-weighted merge of the splits (requests with one split are skipped).
//   mla_v_up         o[h] = W_UV[h] o_lat[h], ready for o_proj.
// Everything that changes per token (lengths, positions, block table) is read from device memory,
// so one captured graph serves any lengths. Bad device-side input is flagged in *error_flag
// (MlaError bits) and never corrupts or overreads memory: the scheduler checks every length, position
// and the page each append will write, and then append writes nothing to the cache and attention /
// combine write nothing at all; split-KV checks each page id it reads, replaces a bad page by zeros
// and sets kMlaErrorPageId (that step's attention outputs are then meaningless; the cache is never
// written by attention). The host reads the flag after the step.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <encore/status.h>

namespace encore::ops {

inline constexpr int kMlaLatentDim = 512;   // d_c: latent (= V) width
inline constexpr int kMlaRopeDim = 64;      // d_R: rope part of the cache row / query
inline constexpr int kMlaRowDim = 576;      // cache row and absorbed query width
inline constexpr int kMlaPageTokens = 64;   // tokens per cache page
inline constexpr int kMlaNopeDim = 128;     // d_n: q_nope per head
inline constexpr int kMlaQHeadDim = 192;    // q per head = [q_nope 128 | q_pe 64]
inline constexpr int kMlaVHeadDim = 128;    // d_v per head
inline constexpr int kMlaKvbRowsPerHead = 256;  // kv_b_proj rows per head: W_UK (128) then W_UV (128)
inline constexpr int kMlaDefaultFixedOverhead = 5;  // C of docs/mla.md §7, in pages
inline constexpr int kMlaMaxBatch = 8192;    // scheduler keeps per-request pages in shared memory

// Bits of *error_flag (0 = step is clean).
enum MlaError : std::int32_t {
  kMlaErrorLength = 1,    // a seq_len < 0 or beyond the block table's capacity
  kMlaErrorPageId = 2,    // a page id in use outside [0, num_pages)
  kMlaErrorPosition = 4,  // positions[b] != seq_lens[b] - 1 for a non-pad request
};

enum class MlaRopeMode : std::int32_t {
  kNone = 0,          // NoPE (Kimi-Linear): the 64 rope values are copied unchanged
  kDeepSeekYarn = 1,  // adjacent pairs (2i, 2i+1) rotated by pos * theta'_i, YaRN-scaled theta
};

struct MlaRope {
  MlaRopeMode mode = MlaRopeMode::kNone;
  float theta = 10000.f;       // rope base
  float yarn_factor = 40.f;    // YaRN scaling factor
  int yarn_original_max_pos = 4096;
  float beta_fast = 32.f;
  float beta_slow = 1.f;
};
inline MlaRope mla_rope_none() { return {}; }
inline MlaRope mla_rope_deepseek_v3() { MlaRope r; r.mode = MlaRopeMode::kDeepSeekYarn; return r; }

// Softmax scales of docs/mla.md §1 (FlashMLA's default 1/sqrt(576) is wrong for both).
inline constexpr float kMlaScaleKimi = 0.07216878364870322f;      // 192^-0.5
inline constexpr float kMlaScaleDeepSeekV3 = 0.13523377f;         // 192^-0.5 * (0.1 ln 40 + 1)^2

// Paged latent cache of one MLA layer plus the block table that maps (request, page) to pages.
struct MlaPagedCache {
  __nv_bfloat16* pages = nullptr;        // [num_pages][64][576]
  int num_pages = 0;
  const std::int32_t* block_table = nullptr;  // [batch][block_table_stride]
  int block_table_stride = 0;            // int32 per table row
  int max_pages_per_seq = 0;             // usable entries per row (<= stride): capacity = 64 * this
};

// ---- scheduler -------------------------------------------------------------------------------
// One scheduler part's share of a step (docs/mla.md §7): pages [begin_page, ...) of request
// begin_req through pages [..., end_page) of request end_req.
struct MlaPartPlan {
  std::int32_t begin_req = -1;     // -1: the part has no work
  std::int32_t end_req = 0;        // inclusive
  std::int32_t begin_page = 0;     // first page of begin_req (inclusive)
  std::int32_t end_page = 0;       // end page of end_req (exclusive)
  std::int32_t begin_split = 0;    // the split of begin_req this part computes
  std::int32_t first_is_split = 0; // begin_req has more than one split
  std::int32_t last_is_split = 0;  // end_req has more than one split
  std::int32_t unused = 0;         // pads the record to 32 bytes
};
static_assert(sizeof(MlaPartPlan) == 32, "a part plan is 8 int32");
inline constexpr int kMlaPartPlanInts = int(sizeof(MlaPartPlan) / sizeof(std::int32_t));
inline bool operator==(const MlaPartPlan& a, const MlaPartPlan& b) {
  return a.begin_req == b.begin_req && a.end_req == b.end_req && a.begin_page == b.begin_page && a.end_page == b.end_page &&
         a.begin_split == b.begin_split && a.first_is_split == b.first_is_split && a.last_is_split == b.last_is_split &&
         a.unused == b.unused;
}

struct MlaSchedParams {
  const std::int32_t* seq_lens = nullptr;   // [batch], 0 = pad row
  const std::int32_t* positions = nullptr;  // [batch] or null: then not checked
  MlaPagedCache cache;                      // block table and capacities (pages not touched)
  int batch = 0;
  int num_parts = 0;                        // P: mla_num_parts(num_heads), or 1 to force one split
  int fixed_overhead = kMlaDefaultFixedOverhead;
  // Tape units a part takes at least (docs/mla.md §7): 1 spreads a step over all P parts; more give
  // a step with few pages fewer, longer splits (fewer partials to store and merge). Steps with
  // more than P * min_part_units units plan as with 1.
  int min_part_units = 1;
  MlaPartPlan* part_plans = nullptr;        // [num_parts] out
  std::int32_t* num_splits = nullptr;       // [batch + 1] out: prefix sums of splits
  std::int32_t* error_flag = nullptr;       // [1] out: MlaError bits
};
// P = max(SMs / head groups, 1); head groups of 32 query rows each.
int mla_num_parts(int num_heads);
Status mla_sched(const MlaSchedParams& p, cudaStream_t stream);

// ---- cache append ----------------------------------------------------------------------------
struct MlaKvAppendParams {
  const float* kv_a = nullptr;              // [batch][kv_a_stride]: c (512) then k_pe (64)
  std::int64_t kv_a_stride = kMlaRowDim;
  const float* norm_weight = nullptr;       // [512] kv_a_layernorm
  float eps = 1e-5f;
  const std::int32_t* positions = nullptr;  // [batch]
  const std::int32_t* seq_lens = nullptr;   // [batch]: 0 = pad row, nothing appended
  MlaPagedCache cache;
  int batch = 0;
  MlaRope rope;
  const std::int32_t* error_flag = nullptr;  // [1] from mla_sched: nonzero -> nothing written
};
Status mla_kv_append(const MlaKvAppendParams& p, cudaStream_t stream);

// ---- q absorption ----------------------------------------------------------------------------
struct MlaQAbsorbParams {
  const float* q = nullptr;                 // [batch][q_stride]: per head [q_nope 128 | q_pe 64]
  std::int64_t q_stride = 0;                // >= num_heads * 192
  const __nv_bfloat16* kv_b = nullptr;      // [num_heads][256][512]: W_UK rows 0..127, W_UV 128..255
  const std::int32_t* positions = nullptr;  // [batch]
  int batch = 0;
  int num_heads = 0;
  MlaRope rope;
  __nv_bfloat16* q576 = nullptr;            // [batch][num_heads][576] out
};
int mla_q_absorb_num_tiles(const MlaQAbsorbParams& p);
Status mla_q_absorb(const MlaQAbsorbParams& p, cudaStream_t stream);
// q absorption and the cache append in one launch: both read the in-projection and write disjoint
// buffers, so neither waits for the other (as two launches in one stream, the append waits for the
// absorption). The same outputs, bit for bit, as mla_q_absorb then mla_kv_append.
Status mla_q_absorb_and_append(const MlaQAbsorbParams& q, const MlaKvAppendParams& a, cudaStream_t stream);

// ---- attention (split-KV + combine) -------------------------------------------------------------
struct MlaAttentionParams {
  const __nv_bfloat16* q576 = nullptr;      // [batch][num_heads][576]
  MlaPagedCache cache;                      // read only
  const std::int32_t* seq_lens = nullptr;   // [batch]
  const MlaPartPlan* part_plans = nullptr;  // [num_parts] from mla_sched
  const std::int32_t* num_splits = nullptr; // [batch + 1] from mla_sched
  std::int32_t* error_flag = nullptr;       // [1] from mla_sched; split-KV ORs in kMlaErrorPageId
  int batch = 0;
  int num_heads = 0;
  int num_parts = 0;                        // the value given to mla_sched
  float softmax_scale = kMlaScaleKimi;
  float* o_lat = nullptr;                   // [batch][num_heads][512] out
  float* lse = nullptr;                     // [batch][num_heads] out, natural log; +inf: no keys
  float* partial_o = nullptr;               // [batch + num_parts][num_heads][512] workspace
  float* partial_lse = nullptr;             // [batch + num_parts][num_heads] workspace
  // Optional [batch][ceil(num_heads / 32)] int32, zero-filled once by the caller; every call
  // leaves them zero again. Given to mla_attention, it runs one kernel: the split-KV tiles of a
  // split request meet on its counter and merge the partials themselves (see mla_attention).
  std::int32_t* counters = nullptr;
  // The plan (part_plans, num_splits, error_flag), seq_lens, the block table and every cache row
  // but each request's newest were complete by the time an earlier kernel in the stream had all of
  // its blocks past their programmatic wait (a decode step: mla_sched and the step's inputs come
  // first, every kernel between waits on its predecessor, and the newest row is the one
  // mla_kv_append writes). Each split-KV tile then reads its plan and starts copying its first
  // pages, but the newest, before it waits for the previous kernel (PDL); q576 and the newest page
  // follow.
  bool plan_settled = false;
};
int mla_splitkv_num_tiles(const MlaAttentionParams& p);
int mla_combine_num_tiles(const MlaAttentionParams& p);
Status mla_splitkv(const MlaAttentionParams& p, cudaStream_t stream);
Status mla_combine(const MlaAttentionParams& p, cudaStream_t stream);
// Split-KV attention plus the combine. With p.counters set and at most one tile per SM
// (num_parts * ceil(num_heads / 32) <= SMs, true for num_parts = mla_num_parts(num_heads)), one
// kernel: each part of a split request writes its partial, increments the request's counter
// (integer atomics), waits until all its parts have arrived (the tiles are co-resident: one block
// per SM), then merges a disjoint slice of the request's output in the same fixed order as
// mla_combine (bit-identical results), and the last part to leave resets the counter. A request
// split in exactly two is merged whole by the part holding its first split, in that split's
// epilogue, from its own output still in shared memory (the other part only arrives). Otherwise
// mla_splitkv then mla_combine.
Status mla_attention(const MlaAttentionParams& p, cudaStream_t stream);
// Whether mla_attention runs the fused kernel for these parameters.
bool mla_attention_fused(const MlaAttentionParams& p);

// ---- V up-projection -------------------------------------------------------------------------
struct MlaVUpParams {
  const float* o_lat = nullptr;             // [batch][num_heads][512]
  const __nv_bfloat16* kv_b = nullptr;      // [num_heads][256][512]: W_UV = rows 128..255
  int batch = 0;
  int num_heads = 0;
  float* out = nullptr;                     // [batch][num_heads * 128] out
};
int mla_v_up_num_tiles(const MlaVUpParams& p);
Status mla_v_up(const MlaVUpParams& p, cudaStream_t stream);

// Host-side validators used by the launchers (exposed for tests and engines).
Status mla_validate(const MlaSchedParams& p);
Status mla_validate(const MlaKvAppendParams& p);
Status mla_validate(const MlaQAbsorbParams& p);
Status mla_validate(const MlaQAbsorbParams& q, const MlaKvAppendParams& a);  // each, and no write of one overlaps the other
Status mla_validate(const MlaAttentionParams& p);
Status mla_validate(const MlaVUpParams& p);

}  // namespace encore::ops
