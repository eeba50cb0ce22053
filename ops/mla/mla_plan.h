// The split-KV plan (docs/mla.md §7, in a parallel form): host/device helpers shared by the scheduler
// kernel and the CPU reference, so both give bit-identical plans (deterministic integer logic).
//
// The "tape": request b occupies cost_b = C + pages_b consecutive units (C = fixed overhead, then
// one unit per page); start_b is the exclusive prefix sum of the costs, total = start_N. With
// unit U = max(ceil(total / P), M) (M: the fewest units a part takes), part k owns every page
// whose tape position lies in [k U, (k+1) U).
// Every page belongs to exactly one part, each part does at most U units of work (the overhead
// units of a request it starts count against it), and a request has one split per part that owns
// some of its pages (total splits <= N + P - 1: each cut is a distinct multiple of U). Unlike
// FlashMLA's sequential greedy walk, each request's split count and each part's range follow in
// closed form from the prefix sums, so the scheduler is one block-wide scan plus independent
// per-part binary searches. A part whose units are all overhead has no work (begin_req = -1);
// such parts may sit between parts with work. All tape arithmetic is 32-bit (the launcher checks
// batch * (max_pages_per_seq + C) < 2^31): 64-bit division is a slow software routine.
#pragma once

#include <cstdint>

#include <encore/ops/mla.h>

#if defined(__CUDACC__)
#define ENCORE_MLA_HD __host__ __device__
#else
#define ENCORE_MLA_HD
#endif

namespace encore::mla {

using namespace ops;  // the op's public types and constants (encore/ops/mla.h)

// Pages the scheduler charges a request: at least one, so zero-length (pad) requests still get a
// part that writes their zero output. Lengths are clamped to the capacity (bad lengths are
// flagged separately and then nothing downstream runs).
ENCORE_MLA_HD inline int plan_pages(std::int32_t len, int capacity_tokens) {
  const int clamped = len < 0 ? 0 : (len > capacity_tokens ? capacity_tokens : len);
  const int pages = (clamped + kMlaPageTokens - 1) / kMlaPageTokens;
  return pages > 0 ? pages : 1;
}

// Tape units per part: U = ceil(total / P), at least min_units and at least 1.
ENCORE_MLA_HD inline int plan_unit(int total, int num_parts, int min_units = 1) {
  const int u = (total + num_parts - 1) / num_parts, least = min_units > 1 ? min_units : 1;
  return u > least ? u : least;
}

// Splits of a request whose tape segment starts at `start`: parts owning its pages.
ENCORE_MLA_HD inline int plan_request_splits(int start, int pages, int fixed_overhead, int unit) {
  const int first = start + fixed_overhead, last = first + pages - 1;
  return int(last / unit - first / unit) + 1;
}

// Largest b in [0, batch) with start(b) <= pos (start(0) = 0 <= pos).
template <class StartOf>
ENCORE_MLA_HD int plan_find(int pos, int batch, StartOf start) {
  int lo = 0, hi = batch;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (start(mid) <= pos) lo = mid;
    else hi = mid;
  }
  return lo;
}

// The plan of part `part`. start(b) for b in [0, batch] (start(batch) = total).
template <class StartOf>
ENCORE_MLA_HD void plan_part(int part, int batch, int fixed_overhead, int unit, StartOf start, MlaPartPlan& m) {
  const int C = fixed_overhead;
  const int total = start(batch);
  const int a = part * unit;
  const int e = a + unit < total ? a + unit : total;
  m = MlaPartPlan{};
  if (a >= total) return;
  const int b = plan_find(a, batch, start);
  const int first_pos = a > start(b) + C ? a : start(b) + C;  // first page position >= a
  if (first_pos >= e) return;  // only overhead units: no work
  // Request of the last page position < e: e - 1 itself, or the request before its overhead.
  int end_req = plan_find(e - 1, batch, start);
  int end_page = e - start(end_req) - C;
  if (end_page <= 0) {
    --end_req;
    end_page = start(end_req + 1) - start(end_req) - C;
  }
  const int begin_page = int(first_pos - start(b) - C);
  auto splits_of = [&](int r) { return plan_request_splits(start(r), int(start(r + 1) - start(r) - C), C, unit); };
  m.begin_req = b;
  m.end_req = end_req;
  m.begin_page = begin_page;
  m.end_page = int(end_page);
  m.begin_split = begin_page > 0 ? int(part - (start(b) + C) / unit) : 0;
  m.first_is_split = splits_of(b) > 1;
  m.last_is_split = splits_of(end_req) > 1;
}

}  // namespace encore::mla
