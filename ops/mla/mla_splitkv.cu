// Split-KV attention kernel and launcher (one block per tile: ~196 KB of shared memory each).
#include <encore/ops/mla.h>

#include "common/cuda_check.h"
#include "common/launch.cuh"
#include "mla/mla_splitkv_kernel.cuh"

namespace encore::ops {

int mla_splitkv_num_tiles(const MlaAttentionParams& p) { return p.num_parts * mla::head_groups(p.num_heads); }

Status mla_splitkv(const MlaAttentionParams& p, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(mla_validate(p));
  const std::size_t smem = mla::mla_splitkv_smem_bytes();
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  ENCORE_REQUIRE(smem <= std::size_t(detail::max_shared_memory_per_block()), StatusCode::kUnsupported,
                 "mla_splitkv: needs ", smem, " bytes of shared memory per block; the device offers ",
                 detail::max_shared_memory_per_block());
  return detail::launch(mla::mla_splitkv_kernel<>, mla_splitkv_num_tiles(p), smem, stream, true, "mla_splitkv_kernel", p);
}

}  // namespace encore::ops
