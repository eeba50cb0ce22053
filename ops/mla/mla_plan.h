// The split-KV plan of spec §7 as one host/device function, so the scheduler kernel and the CPU
// copy in encore::ref run the same walk (deterministic integer logic, bit-identical results).
#pragma once

#include <cstdint>

#include <encore/ops/mla.h>

#if defined(__CUDACC__)
#define ENCORE_MLA_HD __host__ __device__
#else
#define ENCORE_MLA_HD
#endif

namespace encore::ops::mla {

// Fields of one part's 8 int32 (spec §7).
enum MetaField : int {
  kMetaBeginReq = 0,      // -1: the part has no work
  kMetaEndReq = 1,        // inclusive
  kMetaBeginPage = 2,     // first page of begin_req (inclusive)
  kMetaEndPage = 3,       // end page of end_req (exclusive)
  kMetaBeginSplit = 4,    // split index of begin_req that this part computes
  kMetaFirstIsSplit = 5,
  kMetaLastIsSplit = 6,
};

// Pages the scheduler charges a request: at least one, so zero-length (pad) requests still get a
// block that writes their zero output. Lengths are clamped to the capacity (bad lengths are
// flagged separately and then nothing downstream runs).
ENCORE_MLA_HD inline int plan_pages(std::int32_t len, int capacity_tokens) {
  const int clamped = len < 0 ? 0 : (len > capacity_tokens ? capacity_tokens : len);
  const int pages = (clamped + kMlaPageTokens - 1) / kMlaPageTokens;
  return pages > 0 ? pages : 1;
}

// Walks the requests in order and fills meta [num_parts][8] and num_splits [num_seqs + 1].
// `pages(b)` gives plan_pages of request b; total_cost = sum_b (pages(b) + C).
template <class PagesOf>
ENCORE_MLA_HD void plan_walk(int num_seqs, int num_parts, int fixed_overhead, long long total_cost,
                             PagesOf pages, std::int32_t* meta, std::int32_t* num_splits) {
  const int budget = int((total_cost + num_parts - 1) / num_parts) + fixed_overhead;
  int req = 0, page = 0, split_in_req = 0, cumulative = 0;
  num_splits[0] = 0;
  for (int part = 0; part < num_parts; ++part) {
    std::int32_t* m = meta + part * kMlaMetaInts;
    if (req >= num_seqs) {
      m[kMetaBeginReq] = -1;
      for (int f = 1; f < kMlaMetaInts; ++f) m[f] = 0;
      continue;
    }
    m[kMetaBeginReq] = req;
    m[kMetaBeginPage] = page;
    m[kMetaBeginSplit] = split_in_req;
    int remain = budget;
    bool cut = false;
    while (req < num_seqs) {
      const int left = pages(req) - page;
      if (remain >= left + fixed_overhead) {  // the rest of the request fits: take it whole
        remain -= left + fixed_overhead;
        cumulative += split_in_req + 1;
        num_splits[req + 1] = cumulative;
        ++req;
        page = 0;
        split_in_req = 0;
      } else {  // take what the budget allows (one more split) and close the part
        if (remain - fixed_overhead > 0) {
          page += remain - fixed_overhead;
          ++split_in_req;
          cut = true;
        }
        break;
      }
    }
    m[kMetaEndReq] = cut ? req : req - 1;
    m[kMetaEndPage] = cut ? page : pages(req - 1);
    const bool single = m[kMetaEndReq] == m[kMetaBeginReq];
    m[kMetaFirstIsSplit] = m[kMetaBeginPage] > 0 || (single && cut);
    m[kMetaLastIsSplit] = cut || (single && m[kMetaBeginPage] > 0);
    m[7] = 0;
  }
  // Unreachable when every part keeps its budget (each covers >= ceil(total/P)); kept so the
  // prefix sums are always defined.
  for (int r = req; r < num_seqs; ++r) num_splits[r + 1] = cumulative;
}


ENCORE_MLA_HD inline void plan_write_part(std::int32_t* meta, int part, int begin_req, int begin_page, int begin_split,
                                          int end_req, int end_page, bool cut) {
  std::int32_t* m = meta + part * kMlaMetaInts;
  const bool single = end_req == begin_req;
  m[kMetaBeginReq] = begin_req;
  m[kMetaEndReq] = end_req;
  m[kMetaBeginPage] = begin_page;
  m[kMetaEndPage] = end_page;
  m[kMetaBeginSplit] = begin_split;
  m[kMetaFirstIsSplit] = begin_page > 0 || (single && cut);
  m[kMetaLastIsSplit] = cut || (single && begin_page > 0);
  m[7] = 0;
}

// The same plan as plan_walk, in O(num_seqs) steps: the run of parts that each take a full
// (budget - C) pages of one long request is computed in closed form, and its meta entries (like
// the trailing empty parts) are written by `lanes` cooperating threads (lane = 0..lanes-1; every
// lane runs the same control flow). Used by the scheduler kernel with one warp; the CPU tests
// check it against plan_walk, and the GPU tests check the kernel against plan_walk.
template <class PagesOf>
ENCORE_MLA_HD void plan_walk_fast(int num_seqs, int num_parts, int fixed_overhead, long long total_cost, PagesOf pages,
                                  std::int32_t* meta, std::int32_t* num_splits, int lane, int lanes) {
  const int C = fixed_overhead;
  const int budget = int((total_cost + num_parts - 1) / num_parts) + C;
  const int full = budget - C;  // pages a fresh part takes from a request it cannot finish (>= 1)
  int part = 0, remain = budget, cumulative = 0;
  int begin_req = 0, begin_page = 0, begin_split = 0;  // of the open part
  int completed = 0;
  if (lane == 0) num_splits[0] = 0;
  for (int req = 0; req < num_seqs && part < num_parts; ++req) {
    const int n = pages(req);
    int page = 0, split = 0;
    while (true) {
      if (remain >= n - page + C) {  // the rest fits the open part
        remain -= n - page + C;
        cumulative += split + 1;
        if (lane == 0) num_splits[req + 1] = cumulative;
        ++completed;
        break;
      }
      // Close the open part: with a cut of this request, or (no room left) after the previous one.
      const bool cut = remain - C > 0;
      if (lane == 0) {
        if (cut) plan_write_part(meta, part, begin_req, begin_page, begin_split, req, page + remain - C, true);
        else plan_write_part(meta, part, begin_req, begin_page, begin_split, req - 1, pages(req - 1), false);
      }
      if (cut) {
        page += remain - C;
        ++split;
      }
      ++part;
      remain = budget;
      // Fresh parts that cannot finish the request: m of them take `full` pages each.
      const int left = n - page;
      const int m = left + C > budget ? (left + C - budget + full - 1) / full : 0;
      for (int j = lane; j < m && part + j < num_parts; j += lanes)
        plan_write_part(meta, part + j, req, page + j * full, split + j, req, page + (j + 1) * full, true);
      page += m * full;
      split += m;
      part += m;
      begin_req = req;
      begin_page = page;
      begin_split = split;
      if (part >= num_parts) break;
    }
  }
  if (part < num_parts) {  // close the last open part; the rest have no work
    if (lane == 0) plan_write_part(meta, part, begin_req, begin_page, begin_split, num_seqs - 1, pages(num_seqs - 1), false);
    for (int k = part + 1 + lane; k < num_parts; k += lanes) {
      meta[k * kMlaMetaInts + kMetaBeginReq] = -1;
      for (int f = 1; f < kMlaMetaInts; ++f) meta[k * kMlaMetaInts + f] = 0;
    }
  }
  for (int r = completed + lane; r < num_seqs; r += lanes) num_splits[r + 1] = cumulative;  // unreachable, as in plan_walk
}

}  // namespace encore::ops::mla
