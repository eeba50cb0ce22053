// Streaming bodies of the expert GEMVs (docs/moe.md §5-§6). Persistent blocks (kStreamBlocksPerSm
// per SM, or the megakernel's) walk their items first, first + stride, ... (common/body.cuh):
//   gate/up item = (pass, 32 rows): the 32 gate and 32 up rows of the pass's expert for its
//                  entries; silu(g)*u is quantised into the int8 format (one 32-value sub-block
//                  per entry) for the down projection.
//   down item    = (pass, 64 output rows): y[entry][row] = W_down[row] . mid[entry]; the last
//                  item of a row chunk to finish (an integer counter, counted when the block's
//                  items are done) runs the ordered combine.
//   one token's down (row sets, the down kernel's): first each shared expert's 64-row chunks,
//                  whose y rows are counted per chunk; then items of 8 rows of every routed
//                  entry (warp w the entries w, w + 8, ...), which sum their own rows with the
//                  shared experts' in list order into x: no y and no combine for the routed entries.
// Work list: the prepare kernel's, in the workspace (general plan), or, for small batches, one
// that every stream block builds in its own shared memory from the routing (no prepare kernel in
// the chain; the gate/up blocks then quantise the batch's activations themselves, once, into a
// resident buffer, while their first weights are in flight).
// An item is 64 (matrix, row) units: one per 4-lane group of the 8 warps; a warp's units are
// consecutive rows (down) or the same consecutive rows of gate and of up. Its weights arrive in
// K pieces through a ring of shared-memory buffers per warp: one TMA box per matrix and slot
// (the warp's rows x the slot's K blocks, through a tensor map of all experts' rows), completion
// on one mbarrier per buffer; a warp refills a buffer as soon as it is done with it. (One bulk
// copy per row, issued lane by lane, took a quarter of the kernels' instructions at B = 32.) The
// entries' activations arrive through kActBuffers block-wide buffers, one bulk copy per entry;
// warp 0 refills one after the block barrier that ends its item. Bytes in flight cost no
// registers, so one block keeps several slots of the next items in flight.
// The math is the GEMV's quad core (q4k/q4k_stream.cuh): lane p of a group decodes 64 weights of
// a block once and dots them with each entry's int8 activations, in K order; a group's four
// lanes are summed by a fixed butterfly. A token's result never depends on the other tokens.
#pragma once

#include <cstdint>

#include "common/body.cuh"
#include "common/counters.cuh"
#include "common/smem_allocator.cuh"
#include "q4k/q4k_stream.cuh"
#include "moe/moe_epilogues.cuh"
#include "moe/moe_work_list.cuh"

namespace encore::moe {

inline constexpr int kStreamUnits = 64;       // (matrix, row) units per item: 8 warps x 8 groups
inline constexpr int kUnitsPerWarp = kStreamUnits / kWarpsPerBlock;
inline constexpr int kMaxRingSlots = 8;
#ifndef ENCORE_MOE_ACT_BUFFERS
#define ENCORE_MOE_ACT_BUFFERS 2
#endif
// Activation buffers per block: items whose activations are in flight (more of them shrink the
// weight rings; bench/notes/ has the trade).
inline constexpr int kActBuffers = ENCORE_MOE_ACT_BUFFERS;
static_assert(kWarpsPerBlock * 8 == kStreamUnits && kTokensPerPass <= kWarpsPerBlock);
static_assert(kStreamUnits == 2 * kGateUpRows && kStreamUnits == kDownRows);

// Compile-time tuning: stream blocks per SM, and the most K blocks per slot (a TMA box's width:
// at most 7, the box's 256-word limit). Two blocks per SM, because a block's items run their
// epilogues and activation waits in series and a second block fills those gaps; slots of 4 blocks
// leave room for both (the A/Bs: bench/notes/). Batches of at most kTokensPerPass tokens may run
// both kernels at 3 blocks per SM instead (the launcher's small-batch plan, ops/moe/moe.cu).
#ifndef ENCORE_MOE_STREAM_BLOCKS_PER_SM
#define ENCORE_MOE_STREAM_BLOCKS_PER_SM 2
#endif
#ifndef ENCORE_MOE_MAX_SLOT_BLOCKS
#define ENCORE_MOE_MAX_SLOT_BLOCKS 4
#endif
inline constexpr int kStreamBlocksPerSm = ENCORE_MOE_STREAM_BLOCKS_PER_SM;
inline constexpr int kMaxSlotBlocks = ENCORE_MOE_MAX_SLOT_BLOCKS;
static_assert(q4k::slot_pitch(kMaxSlotBlocks) / 4 <= 256, "a slot is one TMA box row: at most 256 words");

// K blocks per slot: the fewest slots of at most kMaxSlotBlocks blocks, split evenly (9 -> 3 + 3 + 3).
__host__ __device__ constexpr int stream_slot_blocks(int k_blocks) {
  const int slots = (k_blocks + kMaxSlotBlocks - 1) / kMaxSlotBlocks;
  return (k_blocks + slots - 1) / slots;
}

// Which passes of the work list a gate/up stream runs. At one token the megakernel splits gate/up
// in two: the shared experts need no routing, so their stream starts while the routing is
// computed, and the routed stream then has fewer items.
// kFromShape (a template argument only): the set is StreamShape::set, read at run time, so the
// megakernel runs every set with one body (a body per set made its code larger and slower).
enum class ExpertSet : int { kAll, kRouted, kShared, kFromShape };
template <ExpertSet kSet>
__host__ __device__ constexpr bool stream_runs(ExpertSet shape_set, ExpertSet set) {
  return kSet == ExpertSet::kFromShape ? shape_set == set : kSet == set;
}

// The shape of one kernel's stream, chosen by the host.
struct StreamShape {
  int k_blocks;       // K / 256 of the matrices
  int slot_blocks;   // stream_slot_blocks(k_blocks)
  int slots;         // ring buffers per warp, 2..kMaxRingSlots
  int tokens;         // entries per pass (activation buffer capacity)
  int max_items;      // items one block can get (size of its item table)
  bool gather;        // gate/up: activations per token (gathered); down: per entry (contiguous)
  int list_passes = 0;   // capacity of a work list built in shared memory (0: the prepare kernel's list)
  int list_entries = 0;
  ExpertSet set = ExpertSet::kAll;  // kRouted, kShared: the megakernel's split gate/up (in-block lists)
  int first_fills = 0;  // pieces issued before the first item (0: all `slots`); the ring deepens to
                        // `slots` as items compute (issuing stalls once the copy engine is saturated)
  bool row_sets = false;  // down at one token (in-block list): shared chunks, then row sets; every
                          // entry's activations resident (list_entries of them)

  __host__ __device__ bool in_block() const { return list_passes > 0; }
  // Gate/up with its own list: the batch's activations quantised once into one resident buffer.
  __host__ __device__ bool resident_act() const { return gather && in_block(); }

  __host__ __device__ int pitch() const { return q4k::slot_pitch(slot_blocks); }
  __host__ __device__ int matrices() const { return gather ? 2 : 1; }  // gate and up, or down
  __host__ __device__ int box_rows() const { return kUnitsPerWarp / matrices(); }
  // A box's rows lie pitch() apart (a padded pitch carries words past the slot, zeros past the
  // row); each box starts 128-byte aligned, as the TMA engine requires.
  __host__ __device__ int box_stride() const { return (box_rows() * pitch() + 127) / 128 * 128; }
  __host__ __device__ int slot_bytes() const { return matrices() * box_stride(); }  // one warp's buffer
  __host__ __device__ int act_token_bytes() const { return k_blocks * q4k::kActBlockBytes; }
  __host__ __device__ int pieces_per_item() const { return (k_blocks + slot_blocks - 1) / slot_blocks; }
  template <class Wait>  // (a ring that starts below its depth deepens only where the policy allows)
  __host__ __device__ int first_pieces() const {
    return Wait::kPrologueExposed && first_fills > 0 && first_fills < slots ? first_fills : slots;
  }
};

// Tensor maps of a stream's matrices (gate and up, or down), each over all experts' rows as
// 4-byte words, with boxes of StreamShape::box_rows() rows x pitch() bytes. A kernel parameter.
struct StreamMaps {
  CUtensorMap mat[2];
};

// Shared memory of a stream block: barriers | (small batches) the block's work list | item table |
// ring | activations | (gate/up) silu(g)*u of two items and one quantiser block per warp | (down)
// combine flags. The list's build scratch (PlanSmem) borrows the ring before the first weights are
// issued. The list sits at the same offset in both streams (the plans give them the same list
// capacity), so a block's down stream takes the list its gate/up stream just built (handoff).
struct StreamSmem {
  std::uint64_t* full;        // [warps][kMaxRingSlots] one phase per fill of a ring buffer
  std::uint64_t* act_full;    // [kActBuffers]
  int4* items;                // [max_items] {expert, first entry, entries, row group}
  int* tokens;                // [max_items][tokens] (gather only) the entries' tokens
  char* ring;                 // [warps][slots][slot_bytes]
  char* act;                  // [kActBuffers][tokens][act_token_bytes]
  float* mid;                 // [2][tokens][kGateUpRows]
  char* scratch;              // [warps][384]
  int* last;                  // [max_items] (down) this block combines the item's row chunk
  WorkList list;              // (in_block) num_passes [1], passes, entry_token, entry_weight, token_entries
  float* row_partial;         // [tokens][k_blocks] (resident activations) sums of squares of h
  char* row_set_act;          // [list_entries][act_token_bytes] (row sets) every entry's activations, by entry
  float* row_set_part;        // [2][list_entries][kRowSetRows] (row sets) two items' routed rows
  std::size_t bytes;

  __host__ __device__ StreamSmem(char* base, const StreamShape& s) {
    device::SmemAllocator a(base);
    full = a.take<std::uint64_t>(kWarpsPerBlock * kMaxRingSlots, 8);
    act_full = a.take<std::uint64_t>(kActBuffers, 8);
    list.num_passes = a.take<int>(s.in_block() ? 1 : 0);
    list.passes = a.take<int4>(s.list_passes);
    list.entry_token = a.take<int>(s.list_entries);
    list.entry_weight = a.take<float>(s.list_entries);
    list.token_entries = a.take<int>(s.list_entries);
    items = a.take<int4>(s.max_items);
    tokens = a.take<int>(s.gather ? std::size_t(s.max_items) * s.tokens : 0);
    ring = a.take<char>(std::size_t(kWarpsPerBlock) * s.slots * s.slot_bytes(), 128);
    act = a.take<char>(std::size_t(s.resident_act() ? 1 : kActBuffers) * s.tokens * s.act_token_bytes(), 128);
    mid = a.take<float>(s.gather ? 2 * std::size_t(s.tokens) * kGateUpRows : 0);
    scratch = a.take<char>(s.gather ? std::size_t(kWarpsPerBlock) * q4k::kActBlockBytes : 0);
    last = a.take<int>(s.gather ? 0 : s.max_items);
    row_partial = a.take<float>(s.resident_act() ? s.tokens * s.k_blocks : 0);
    row_set_act = a.take<char>(s.row_sets ? std::size_t(s.list_entries) * s.act_token_bytes() : 0, 128);
    row_set_part = a.take<float>(s.row_sets ? 2 * std::size_t(s.list_entries) * kRowSetRows : 0);
    bytes = a.used();
  }
};

// How a stream's set-up meets the caller's wait for what its list needs (the routing, or the
// prepare kernel's list): kListNow, no wait needed (the list is settled); kWaitForList, the
// barriers first (they need nothing upstream), then wait(), then the list and the ring; kRingLater,
// the list now and the ring at start_ring() (the shared experts' stream, whose list needs only the
// slot ids and whose ring waits for its input).
enum class StreamStart { kListNow, kWaitForList, kRingLater };

// The block's view of its stream: shape, matrices and the item count (block-uniform). kInBlock:
// the block builds its work list (shape.in_block()); kSet: which passes it runs (gate/up only);
// kRowSets: one token's down (shape.row_sets), where an item is either a shared expert's row chunk
// {expert, entry, 1, chunk} or a row set {-1, 0, routed entries, set}, and a warp's boxes in a row
// set are its routed entries' (tasks).
template <int NMAT, bool kInBlock, ExpertSet kSet = ExpertSet::kAll, bool kRowSets = false>
struct ExpertStream {
  static_assert(kSet == ExpertSet::kAll || (kInBlock && NMAT == 2), "a split stream is a gate/up stream with its own list");
  static_assert(!kRowSets || (kInBlock && NMAT == 1), "row sets are one token's down, with the block's own list");
  static constexpr bool kResidentAct = kInBlock && NMAT == 2;
  static constexpr int kRingBarriers = kWarpsPerBlock * kMaxRingSlots, kBarriers = kRingBarriers + kActBuffers;
  static_assert(kBarriers <= kBlockThreads);
  StreamShape shape;
  StreamSmem s;
  WorkList list;
  const CUtensorMap* map[NMAT];
  int expert_rows;  // rows of one expert's matrix
  const char* act_src;
  std::uint64_t policy;  // evict-first: weights are read once per step
  int num_passes;  // this step's passes (read once, with the item table)
  int routed_passes = 0;  // (row sets) the first passes, the routed entries: one per pass at one token
  int items;
  // Per warp (warp-uniform): the next K piece to fill (item, task of the warp in it, piece of the
  // task's box) and its buffer, the pieces filled and not yet computed, and the buffer the warp
  // computes on next with its phase parity.
  int fill_item = 0, fill_task = 0, fill_piece = 0, fill_slot = 0, in_flight = 0;
  int slot = 0;
  std::uint32_t phase = 0;
  std::uint32_t waited_ns = 0;  // (trace mode, thread 0) warp 0's wait for the last item's weights

  // Fills the item table from the work list and starts the weight ring: weights depend only on
  // the items. The work list comes from the prepare kernel, or is built here from the routing;
  // either finished before the gate/up kernel passed its PDL wait and let the down kernel start,
  // so the down kernel runs this before its own wait (global data read through L2, ld.cg).
  // start_activations() follows the wait. `wait` gives the marks (trace mode) and, in the
  // megakernel, the list a block's gate/up hands to its down stream (device::leave_handoff).
  // `start`: where the caller's wait falls (StreamStart).
  template <class Wait>
  __device__ ExpertStream(const ExpertsTileParams& p, const StreamShape& sh, const StreamMaps& maps, char* smem, int row_groups,
                          int first, int stride, Wait& wait, StreamStart start = StreamStart::kListNow)
      : shape(sh), s(smem, sh), list(kInBlock ? s.list : global_work_list(p)) {
#pragma unroll
    for (int m = 0; m < NMAT; ++m) map[m] = &maps.mat[m];
    expert_rows = NMAT == 2 ? p.inter : p.hidden;
    act_src = NMAT == 2 ? p.act_in : p.act_mid;
    policy = q4k::evict_first_policy();
    if (threadIdx.x == 0) {
#pragma unroll
      for (int m = 0; m < NMAT; ++m) device::prefetch_tensor_map(map[m]);
      for (int i = 0; i < kRingBarriers; ++i) device::barrier_init(&s.full[i], 1);
      for (int i = 0; i < kActBuffers; ++i) device::barrier_init(&s.act_full[i], 1);
      device::fence_barrier_init();
    }
    if (start == StreamStart::kWaitForList) wait();
    if constexpr (kInBlock) {
      if (stream_runs<kSet>(sh.set, ExpertSet::kShared)) {
        build_shared_list(p, list);
      } else if (NMAT == 2 || !device::handoff_from_previous(wait)) {
        // (only the gate/up kernel's first block reports bad ids: one writer of the flag)
        build_work_list(p, list, *reinterpret_cast<PlanSmem*>(s.ring), NMAT == 2 && first == 0);
        device::fence_proxy_async();  // the ring's generic writes come before its bulk copies
        // The whole list (the shared experts' passes too): this block's down stream, next, keeps it.
        if (NMAT == 2) device::leave_handoff(wait);
      }
    }
    // The pass count and the passes this block may get load together (one round trip); entries
    // past the count are stale and dropped.
    num_passes = load_list(list.num_passes);
    if (kInBlock && stream_runs<kSet>(sh.set, ExpertSet::kRouted))  // the shared experts' passes are the last ones
      while (num_passes > 0 && list.passes[num_passes - 1].x >= p.num_experts) --num_passes;
    int total = num_passes * row_groups;
    if constexpr (kRowSets) {  // (the block's own list: shared memory)
      while (routed_passes < num_passes && list.passes[routed_passes].x < p.num_experts) ++routed_passes;
      const int chunk_items = (num_passes - routed_passes) * row_groups;
      total = num_passes > 0 ? down_items(0, num_passes - routed_passes, p.hidden, true) : 0;
      for (int k = threadIdx.x; k < shape.max_items; k += kBlockThreads) {
        const int item = first + k * stride;
        if (item >= chunk_items) {
          if (item < total) s.items[k] = make_int4(-1, 0, routed_passes, item - chunk_items);
        } else {
          const int4 pass = list.passes[routed_passes + item / row_groups];
          s.items[k] = make_int4(pass.x, pass.y, pass.z, item % row_groups);
        }
      }
    } else {
      const int capacity = kInBlock ? shape.list_passes : p.pass_capacity;
      for (int k = threadIdx.x; k < shape.max_items; k += kBlockThreads) {
        const int item = first + k * stride;
        const int4 pass = item / row_groups < capacity ? load_list(list.passes + item / row_groups) : int4{};
        if (item < total) s.items[k] = make_int4(pass.x, pass.y, pass.z, item % row_groups);
      }
    }
    items = total > first ? (total - first + stride - 1) / stride : 0;
    __syncthreads();
    device::mark(wait, device::Mark::kListBuilt, -1);
    if (start != StreamStart::kRingLater) start_ring(wait);
  }

  // The ring's first pieces (the items' weights depend on nothing of the step).
  template <class Wait>
  __device__ void start_ring(Wait& wait) {
    for (int j = 0; j < shape.template first_pieces<Wait>(); ++j) fill_next();
    device::mark(wait, device::Mark::kRingStarted, -1);
  }

  // The entries' tokens (gate/up: all items' in one parallel round trip) and the first items'
  // activations, or (resident) all of the batch's, quantised here. Reads what the previous
  // kernel wrote: after the PDL wait.
  __device__ void start_activations(const ExpertsTileParams& p) const {
    if (shape.gather) {
      for (int i = threadIdx.x; i < items * shape.tokens; i += kBlockThreads) {
        const int4 item = s.items[i / shape.tokens];
        const int t = i % shape.tokens;
        if (t < item.z) s.tokens[i] = load_list(list.entry_token + item.y + t);
      }
      if (kResidentAct && !p.h_settled) quantize_rows(p, 0, p.batch, s.act, s.row_partial);
      __syncthreads();
    }
    if constexpr (kRowSets) {  // every entry's, once, by entry (a block with no item issues none)
      if (threadIdx.x / 32 == 0 && items > 0) {
        const int lane = threadIdx.x % 32, bytes = shape.act_token_bytes();
        if (lane == 0) device::barrier_arrive_expect(&s.act_full[0], std::uint32_t(num_passes * bytes));
        __syncwarp();
        if (lane < num_passes) {
          const int entry = list.passes[lane].y;
          device::bulk_copy_to_shared(s.row_set_act + entry * bytes, act_src + std::int64_t(entry) * bytes, bytes, &s.act_full[0],
                                      evict_last_policy());
        }
      }
    } else if (!kResidentAct && threadIdx.x / 32 == 0) {
      for (int k = 0; k < kActBuffers; ++k) issue_activations(k);
    }
  }

  // Warp-wide: the calling warp's next K piece (fill_item, fill_piece) into its buffer fill_slot.
  // Lane 0 issues one box per matrix: the warp's box_rows() rows of the item's row group, the
  // slot's K blocks.
  __device__ void fill_next() {
    if constexpr (kRowSets)  // (at an item's start) past the row sets that hold no entry of this warp
      while (fill_item < items && warp_tasks(s.items[fill_item]) == 0) ++fill_item;
    if (fill_item >= items) return;
    const int to = fill_slot;
    if (++fill_slot == shape.slots) fill_slot = 0;
    ++in_flight;
    const int4 item = s.items[fill_item];
    const int kb0 = fill_piece * shape.slot_blocks, task = fill_task;
    if (++fill_piece == shape.pieces_per_item()) {
      fill_piece = 0;
      if constexpr (kRowSets) {
        if (++fill_task == warp_tasks(item)) fill_task = 0, ++fill_item;
      } else {
        ++fill_item;
      }
    }
    if (threadIdx.x % 32 != 0) return;
    const int warp = threadIdx.x / 32;
    std::uint64_t* bar = &s.full[warp * kMaxRingSlots + to];
    device::barrier_arrive_expect(bar, std::uint32_t(kUnitsPerWarp * shape.pitch()));
    const int row = box_row(item, task);
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
      device::tma_load_2d(buffer(to) + m * shape.box_stride(), map[m], kb0 * (q4k::kBlockBytes / 4), row, bar, policy);
  }

  // The calling warp's boxes in `item`: one, or in a row set one per routed entry w, w + 8, ...
  __device__ int warp_tasks(const int4& item) const {
    const int warp = threadIdx.x / 32;
    if (!kRowSets || item.x >= 0) return 1;
    return item.z > warp ? (item.z - warp + kWarpsPerBlock - 1) / kWarpsPerBlock : 0;
  }
  // The routed pass (= entry, at one token) of the calling warp's task in a row set.
  __device__ int task_pass(int task) const { return threadIdx.x / 32 + task * kWarpsPerBlock; }
  // The first matrix row of the calling warp's box for its task in `item`.
  __device__ int box_row(const int4& item, int task) const {
    if (kRowSets && item.x < 0) return list.passes[task_pass(task)].x * expert_rows + item.w * kRowSetRows;
    return item.x * expert_rows + item.w * (kStreamUnits / NMAT) + threadIdx.x / 32 * shape.box_rows();
  }

  // The calling warp's ring buffer `b`.
  __device__ char* buffer(int b) const {
    return s.ring + (std::size_t(threadIdx.x / 32) * shape.slots + b) * shape.slot_bytes();
  }

  // Warp-wide: bulk copies of item k's entries' activations into buffer k % kActBuffers.
  __device__ void issue_activations(int k) const {
    if (k >= items) return;
    const int lane = threadIdx.x % 32, b = k % kActBuffers;
    const int4 item = s.items[k];
    const int bytes = shape.act_token_bytes();
    if (lane == 0) device::barrier_arrive_expect(&s.act_full[b], std::uint32_t(item.z * bytes));
    __syncwarp();
    if (lane < item.z) {
      const int row = shape.gather ? s.tokens[k * shape.tokens + lane] : item.y + lane;
      device::bulk_copy_to_shared(act_buffer(b) + lane * bytes, act_src + std::int64_t(row) * bytes, bytes,
                                        &s.act_full[b], evict_last_policy());
    }
  }

  __device__ char* act_buffer(int b) const { return s.act + std::size_t(b) * shape.tokens * shape.act_token_bytes(); }

  static __device__ std::uint64_t evict_last_policy() {
    std::uint64_t policy;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    return policy;
  }

  // Item k: acc[t] = this group's row . entry t's activations (t < entries), summed over the
  // group. Refills each buffer it frees. A wait policy with marks (device::Marks, the megakernel's):
  // in trace mode, marks when warp 0 has the item's first weights and keeps in `waited_ns` how long
  // warp 0 waited for them (standalone kernels compile none of it).
  // kPass: the most entries a pass holds here (kTokensPerPass, or fewer where the caller knows it).
  template <int kPass, class Wait>
  __device__ int4 compute_item(int k, float (&acc)[kPass], Wait& wait) {
    const int b = k % kActBuffers;
    if constexpr (kRowSets) device::barrier_wait(&s.act_full[0], 0u);
    else if constexpr (!kResidentAct) device::barrier_wait(&s.act_full[b], (k / kActBuffers) & 1u);
    const int4 item = s.items[k];
    // Entry t's activations: the item's t-th, or (resident) its token's row; the row and the
    // stride read per use: no registers.
    const char* act = kRowSets ? s.row_set_act + item.y * shape.act_token_bytes() : kResidentAct ? s.act : act_buffer(b);
    const int* act_row = s.tokens + k * shape.tokens;
    if constexpr (device::Marks<Wait>) waited_ns = 0;
    dot_box(acc, item.z, act, act_row, k, item.x, true, wait);
    return item;
  }

  // Row set k (row sets): each of the warp's tasks, its routed entry's kRowSetRows rows, into
  // part[pass][row] (the block barrier that follows hands them to the summing threads).
  template <class Wait>
  __device__ void compute_row_set(int k, float* part, Wait& wait) {
    device::barrier_wait(&s.act_full[0], 0u);  // (every warp: no copy outlives the body)
    const int4 item = s.items[k];
    const int tasks = warp_tasks(item), bytes = shape.act_token_bytes();
    if constexpr (device::Marks<Wait>) waited_ns = 0;
    for (int task = 0; task < tasks; ++task) {
      const int pass = task_pass(task);
      const char* act = s.row_set_act + list.passes[pass].y * bytes;
      float acc[1];
      dot_box(acc, 1, act, nullptr, k, list.passes[pass].x, task == 0, wait);
      if (threadIdx.x % 4 == 0) part[pass * kRowSetRows + threadIdx.x % 32 / 4] = acc[0];
    }
  }

  // The calling warp's next box, one ring piece after another: acc[t] = its group's row . entry t's
  // activations (at act + t strides, or resident: at act + act_row[t] strides) for t < count (the
  // group's four lanes summed by a fixed butterfly), in K order. Refills each buffer it frees.
  // `marked`: trace the box's first weights as item k's.
  template <int kPass, class Wait>
  __device__ __forceinline__ void dot_box(float (&acc)[kPass], int count, const char* act, const int* act_row, int k, int expert,
                                          bool marked, Wait& wait) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane % 4, group = lane / 4;
    // Group g holds unit (matrix g % NMAT, row g / NMAT of the warp's box).
    const int row_offset = (group % NMAT) * shape.box_stride() + (group / NMAT) * shape.pitch();
    const int spi = shape.pieces_per_item();
    const q4k::PairUnpack unpack = q4k::pair_unpack(quad);
#pragma unroll
    for (int t = 0; t < kPass; ++t) acc[t] = 0.f;
    for (int st = 0; st < spi; ++st) {
      if constexpr (device::Marks<Wait>) {
        const bool timed = device::marking(wait);
        const std::uint64_t before = timed ? device::global_ns() : 0;
        device::barrier_wait(&s.full[warp * kMaxRingSlots + slot], phase);
        if (timed) {
          waited_ns += std::uint32_t(device::global_ns() - before);
          if (st == 0 && marked) device::mark(wait, device::Mark::kItemWeights, k, std::uint32_t(expert));
        }
      } else {
        device::barrier_wait(&s.full[warp * kMaxRingSlots + slot], phase);
      }
      const char* row = buffer(slot) + row_offset;
      const int kb0 = st * shape.slot_blocks, nb = min(shape.slot_blocks, shape.k_blocks - kb0);
      for (int jl = 0; jl < nb; ++jl) {
        const q4k::QuadWeights w = q4k::decode_quad(row + jl * q4k::kBlockBytes, quad, unpack);
#pragma unroll
        for (int t = 0; t < kPass; ++t) {
          if (t >= count) break;
          const char* a = act + (kResidentAct ? act_row[t] : t) * shape.act_token_bytes() + (kb0 + jl) * q4k::kActBlockBytes;
          acc[t] += q4k::quad_dot(w, q4k::load_quad_activations(a, quad));
        }
      }
      __syncwarp();  // every lane is done with the buffer before it is refilled
      --in_flight;
      fill_next();
      if constexpr (Wait::kPrologueExposed)  // a ring started below its depth (first_fills) deepens
        if (in_flight < shape.slots) fill_next();
      if (++slot == shape.slots) slot = 0, phase ^= 1u;
    }
#pragma unroll
    for (int t = 0; t < kPass; ++t) {
      if (t >= count) break;  // (warp-uniform)
      acc[t] += __shfl_xor_sync(0xFFFFFFFFu, acc[t], 1);
      acc[t] += __shfl_xor_sync(0xFFFFFFFFu, acc[t], 2);
    }
  }

  // After the block barrier that ends item k: warp 0 refills its activation buffer with item
  // k + kActBuffers's.
  __device__ void refill_activations(int k) const {
    if (!kResidentAct && threadIdx.x / 32 == 0) issue_activations(k + kActBuffers);
  }

  // Every copy has landed and been read (the caller passed a block barrier): the barriers go, a
  // thread each (one thread in series sat on the critical path of every stream's tail).
  __device__ void invalidate_barriers() const {
    if (threadIdx.x < kBarriers)
      device::barrier_inval(threadIdx.x < kRingBarriers ? &s.full[threadIdx.x] : &s.act_full[threadIdx.x - kRingBarriers], 1);
  }
};

// ---- gate/up ------------------------------------------------------------------------------------

// Unit u = (matrix u % 2, row u / 2): a warp's groups 2i and 2i+1 hold the gate and up rows of
// one row, so silu(g)*u is one shuffle away. The caller has not waited for the routing: a settled
// h is quantised first (resident activations).
// kPass: as compute_item's (the megakernel's one-token tier passes 1: no code for absent entries).
template <bool kInBlock, ExpertSet kSet = ExpertSet::kAll, int kPass = kTokensPerPass, class Range, class Wait>
__device__ inline void gate_up_body(const ExpertsTileParams& p, const StreamShape& shape, const StreamMaps& maps, const Range& r,
                                    char* smem, Wait& wait) {
  // The routed stream of a block whose previous instruction was the layer's shared stream (the
  // megakernel's split gate/up: the same shape, so the same resident buffer) finds the input
  // already quantised there; the shared stream says so through the handoff.
  const bool shared_set = kInBlock && stream_runs<kSet>(shape.set, ExpertSet::kShared);
  const bool act_handed = kInBlock && stream_runs<kSet>(shape.set, ExpertSet::kRouted) && device::handoff_from_previous(wait);
  if (kInBlock && p.h_settled && !act_handed && !shared_set) {
    const StreamSmem s(smem, shape);
    quantize_rows(p, 0, p.batch, s.act, s.row_partial);
  }
  // The routing (and the work list or h) come from upstream: the stream waits for them after
  // setting up its barriers. The shared experts' stream needs none of it: its list (from the slot
  // ids alone) comes first, then its wait for the input, which it quantises before its ring starts
  // (copies issued first would meet the quantisation's loads).
  ExpertStream<2, kInBlock, kSet> stream(p, shape, maps, smem, gate_up_row_groups(p.inter), r.first(), r.stride(), wait,
                                         shared_set ? StreamStart::kRingLater : StreamStart::kWaitForList);
  if (shared_set) {
    wait();
    quantize_rows(p, 0, p.batch, stream.s.act, stream.s.row_partial);
    device::leave_handoff(wait);
    stream.start_ring(wait);
  }
  wait();
  // (the prepare kernel's job otherwise; the routed stream's when gate/up is split)
  if (kInBlock && !stream_runs<kSet>(shape.set, ExpertSet::kShared) && r.first() == 0) reset_chunk_counters(p);
  stream.start_activations(p);
  device::mark(wait, device::Mark::kStreamReady, -1);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, unit = warp * 8 + lane / 4;
  for (int k = 0; k < stream.items; ++k) {
    float acc[kPass];
    device::mark(wait, device::Mark::kItemBegin, k);
    const int4 item = stream.compute_item(k, acc, wait);
    device::mark(wait, device::Mark::kItemComputed, k);
    const int count = item.z, row_group = item.w;
    float* mid = stream.s.mid + (k % 2) * shape.tokens * kGateUpRows;  // two items' worth: one barrier per item
#pragma unroll
    for (int t = 0; t < kPass; ++t) {
      if (t >= count) break;
      const float u = __shfl_xor_sync(0xFFFFFFFFu, acc[t], 4);
      const float g = acc[t];
      if (unit % 2 == 0 && lane % 4 == t % 4) mid[t * kGateUpRows + unit / 2] = g / (1.f + expf(-g)) * u;
    }
    __syncthreads();
    device::mark(wait, device::Mark::kItemEnd, k, stream.waited_ns);
    stream.refill_activations(k);
    // Warp t quantises entry t's 32 values: rows 32*row_group.. are sub-block row_group % 8 of
    // 256-value block row_group / 8 of the entry's activations.
    if (warp < count)
      quantize_sub_block(mid + warp * kGateUpRows, row_group % 8, stream.s.scratch + warp * q4k::kActBlockBytes,
                         p.act_mid + (std::int64_t(item.y + warp) * p.inter_blocks + row_group / 8) * q4k::kActBlockBytes);
  }
  if constexpr (Wait::kSharedMemoryReused) {
    __syncthreads();
    stream.invalidate_barriers();
  }
}

// ---- down + combine -----------------------------------------------------------------------------

// One token's down (row sets, docs/moe.md §6). A shared expert's chunk item stores its y rows and
// counts the chunk (release); a row set sums, in each of its rows, the routed entries' terms from
// its own warps and then the shared experts' y (after the chunk's count, acquire) in the token's
// list order, and adds the sum to x: the combine's arithmetic, so the same bits as the general
// form. Chunk items are the lowest items, a block's first: a row set waits only for items that
// wait for nothing of this body, all resident (the kernel's blocks after its PDL wait; the
// megakernel's, which could run it but keeps whole chunks: moe_plan.h).
template <class Range, class Wait>
__device__ inline void down_row_sets_body(const ExpertsTileParams& p, const StreamShape& shape, const StreamMaps& maps,
                                          const Range& r, char* smem, Wait& wait) {
  ExpertStream<1, true, ExpertSet::kAll, true> stream(p, shape, maps, smem, down_row_chunks(p.hidden), r.first(), r.stride(), wait);
  wait();  // act_mid comes from gate/up
  stream.start_activations(p);
  device::mark(wait, device::Mark::kStreamReady, -1);
  const int shared_passes = stream.num_passes - stream.routed_passes;
  for (int k = 0; k < stream.items; ++k) {
    device::mark(wait, device::Mark::kItemBegin, k);
    const int4 item = stream.s.items[k];
    if (item.x >= 0) {  // (block-uniform) a shared expert's chunk
      float acc[1];
      stream.compute_item(k, acc, wait);
      device::mark(wait, device::Mark::kItemComputed, k);
      if (threadIdx.x % 4 == 0) p.y[item.y * std::int64_t(p.hidden) + item.w * kDownRows + threadIdx.x / 4] = acc[0];
      __syncthreads();
      if (threadIdx.x == 0) device::add_release_gpu(p.chunk_done + item.w, 1);
    } else {
      float* part = stream.s.row_set_part + (k % 2) * shape.list_entries * kRowSetRows;  // two items': one barrier per item
      stream.compute_row_set(k, part, wait);
      device::mark(wait, device::Mark::kItemComputed, k);
      __syncthreads();
      if (threadIdx.x < kRowSetRows) {
        const int row = item.w * kRowSetRows + threadIdx.x;
        float out = p.x[row];
        if (shared_passes > 0) device::wait_count_acquire(p.chunk_done + row / kDownRows, shared_passes);
        float sum = 0.f;
        for (int j = 0; j < stream.num_passes; ++j) {  // the token's list order: ascending expert, shared last
          const int entry = stream.list.passes[j].y;
          const float y = j < item.z ? part[j * kRowSetRows + threadIdx.x] : __ldcg(p.y + entry * std::int64_t(p.hidden) + row);
          sum += stream.list.entry_weight[entry] * y;
        }
        out += sum;
        p.x[row] = out;
      }
    }
    device::mark(wait, device::Mark::kItemEnd, k, stream.waited_ns);
  }
  if constexpr (Wait::kSharedMemoryReused) {
    __syncthreads();
    stream.invalidate_barriers();
  }
}

// Down items of whole row chunks per pass, and the combine (any batch). The work list is settled
// on entry (the gate/up kernel's own wait covered its writer), so the weights start streaming
// before the wait for act_mid.
template <bool kInBlock, int kPass, class Range, class Wait>
__device__ inline void down_chunks_body(const ExpertsTileParams& p, const StreamShape& shape, const StreamMaps& maps, const Range& r,
                                        char* smem, Wait& wait) {
  ExpertStream<1, kInBlock> stream(p, shape, maps, smem, down_row_chunks(p.hidden), r.first(), r.stride(), wait);
  wait();  // act_mid comes from the gate/up kernel
  stream.start_activations(p);
  device::mark(wait, device::Mark::kStreamReady, -1);
  const int lane = threadIdx.x % 32, unit = threadIdx.x / 4;
  for (int k = 0; k < stream.items; ++k) {
    float acc[kPass];
    device::mark(wait, device::Mark::kItemBegin, k);
    const int4 item = stream.compute_item(k, acc, wait);
    device::mark(wait, device::Mark::kItemComputed, k);
    const std::int64_t row = std::int64_t(item.w) * kDownRows + unit;
#pragma unroll
    for (int t = 0; t < kPass; ++t) {
      if (t >= item.z) break;
      if (lane % 4 == t % 4) p.y[(item.y + t) * std::int64_t(p.hidden) + row] = acc[t];
    }
    __syncthreads();
    device::mark(wait, device::Mark::kItemEnd, k, stream.waited_ns);
    stream.refill_activations(k);
  }

  // Each row chunk is combined by the last of its num_passes items to finish (integer counters,
  // counted with acquire and release semantics). The block counts all its items at once, so their
  // round trips overlap, and combines all its chunks in one pass. The ring is idle now: it holds
  // the chunk list and the staged entry lists.
  __syncthreads();
  for (int k = threadIdx.x; k < stream.items; k += kBlockThreads)
    stream.s.last[k] = device::add_acq_rel_gpu(p.chunk_done + stream.s.items[k].w, 1) == stream.num_passes - 1;
  __syncthreads();
  int* chunks = reinterpret_cast<int*>(stream.s.ring);  // [0]: count, then the chunks
  if (threadIdx.x == 0) {
    int count = 0;
    for (int k = 0; k < stream.items; ++k)
      if (stream.s.last[k]) chunks[1 + count++] = stream.s.items[k].w;
    chunks[0] = count;
  }
  __syncthreads();
  const int count = chunks[0];
  device::mark(wait, device::Mark::kCombine, -1, std::uint32_t(count));
  if (count > 0) {
    const CombineLists lists =
        stage_combine_lists(p, stream.list, stream.s.ring + combine_chunk_list_bytes(shape.max_items));
    __syncthreads();
    combine_chunks(p, lists, chunks + 1, count);
    for (int c = threadIdx.x; c < count; c += kBlockThreads) p.chunk_done[chunks[1 + c]] = 0;  // ready for the next step
  }
  if constexpr (Wait::kSharedMemoryReused) stream.invalidate_barriers();  // (all waits ended before the barrier above)
}

// The standalone down kernel's body: one token with the block's own list (kPass 1) runs row sets
// (shape.row_sets, planned so); any other batch whole chunks and the combine. (The megakernel runs
// whole chunks at every batch: moe_plan.h.)
template <bool kInBlock, int kPass = kTokensPerPass, class Range, class Wait>
__device__ inline void down_body(const ExpertsTileParams& p, const StreamShape& shape, const StreamMaps& maps, const Range& r,
                                 char* smem, Wait& wait) {
  if constexpr (kInBlock && kPass == 1)
    down_row_sets_body(p, shape, maps, r, smem, wait);
  else
    down_chunks_body<kInBlock, kPass>(p, shape, maps, r, smem, wait);
}

}  // namespace encore::moe
