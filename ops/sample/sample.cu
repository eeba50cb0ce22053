// Standalone kernels, validator and launcher of greedy decoding (include/encore/ops/sample.h).
#include <cstdint>

#include <encore/ops/sample.h>

#include "common/body.cuh"
#include "common/cuda_check.h"
#include "common/launch.h"
#include "sample/greedy_tile.cuh"

namespace encore::ops {
namespace {

// The logits come from the step's last kernel: wait for it, then let the advance kernel launch.
__global__ void __launch_bounds__(kBlockThreads) argmax_chunk_kernel(const __grid_constant__ GreedyParams p) {
  extern __shared__ __align__(1024) char smem[];
  encore::device::PdlWait wait;
  sample::argmax_chunk_body(p, encore::device::GridRange{}, wait, smem);
}

__global__ void __launch_bounds__(kBlockThreads) advance_kernel(const __grid_constant__ GreedyParams p) {
  extern __shared__ __align__(1024) char smem[];
  encore::device::PdlWait wait;
  sample::advance_body(p, encore::device::GridRange{}, wait, smem);
}

}  // namespace

std::size_t greedy_workspace_bytes(int batch, int vocab) {
  if (batch < 1 || vocab < 1) return 0;
  const std::size_t n = std::size_t(batch) * std::size_t(greedy_chunks(vocab));
  return ((n + 3) / 4 * 4) * sizeof(float) + n * sizeof(std::int32_t);
}

Status validate(const GreedyParams& p) {
  constexpr const char* op = "greedy_next";
  ENCORE_REQUIRE(p.batch >= 1 && p.batch <= kSampleMaxBatch, StatusCode::kOutOfRange, op, ": batch must be in 1..",
                 kSampleMaxBatch, " (got ", p.batch, ")");
  ENCORE_REQUIRE(p.vocab >= 1 && p.logits_stride >= p.vocab, StatusCode::kInvalidArgument, op,
                 ": vocab must be >= 1 and logits_stride >= vocab (got ", p.vocab, ", ", p.logits_stride, ")");
  ENCORE_REQUIRE(p.page_size >= 1 && p.max_pages_per_seq >= 1 && p.max_pages >= 1, StatusCode::kInvalidArgument, op,
                 ": page_size, max_pages_per_seq and max_pages must be >= 1 (got ", p.page_size, ", ", p.max_pages_per_seq,
                 ", ", p.max_pages, ")");
  ENCORE_REQUIRE(p.capacity >= 1 && std::int64_t(p.capacity) <= std::int64_t(p.max_pages_per_seq) * p.page_size,
                 StatusCode::kOutOfRange, op, ": capacity must be in 1..max_pages_per_seq * page_size = ",
                 std::int64_t(p.max_pages_per_seq) * p.page_size, " (got ", p.capacity, ")");
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, p.logits, 4, "logits"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, p.token_ids, 4, "token_ids"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, p.positions, 4, "positions"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, p.seq_lens, 4, "seq_lens"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, p.slot_ids, 4, "slot_ids"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, p.block_table, 4, "block_table"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, p.tokens, 4, "tokens"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, p.prompt_lens, 4, "prompt_lens"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, p.workspace, 16, "workspace"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, p.flags, 4, "flags"));
  const std::size_t rows = std::size_t(p.batch) * 4;
  const std::size_t logits_bytes = (std::size_t(p.batch - 1) * std::size_t(p.logits_stride) + std::size_t(p.vocab)) * 4;
  return detail::check_disjoint(
      op,
      {{p.logits, logits_bytes, "logits"},
       {p.block_table, rows * std::size_t(p.max_pages_per_seq), "block_table"},
       {p.prompt_lens, rows, "prompt_lens"}},
      {{p.token_ids, rows, "token_ids"},
       {p.positions, rows, "positions"},
       {p.seq_lens, rows, "seq_lens"},
       {p.slot_ids, rows, "slot_ids"},
       {p.tokens, rows * std::size_t(p.capacity), "tokens"},
       {p.workspace, greedy_workspace_bytes(p.batch, p.vocab), "workspace"},
       {p.flags, 4, "flags"}});
}

Status greedy_next(const GreedyParams& p, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(validate(p));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  const std::size_t smem = sample::GreedySmem(nullptr).bytes;
  ENCORE_RETURN_IF_ERROR(detail::launch(argmax_chunk_kernel, p.batch * greedy_chunks(p.vocab), smem, stream, true,
                                        "argmax_chunk_kernel", p));
  return detail::launch(advance_kernel, p.batch, smem, stream, true, "advance_kernel", p);
}

}  // namespace encore::ops
