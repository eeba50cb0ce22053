// Split-KV attention kernel and launchers (one block per tile: ~207 KB of shared memory each):
// mla_splitkv alone, mla_attention, which fuses the combine when it can, and the half-SM tile
// shape's launcher (its tests and benchmark).
#include <encore/ops/mla.h>

#include "common/cuda_check.h"
#include "common/launch.h"
#include "common/tensor_map.h"
#include "mla/mla_splitkv_kernel.cuh"

namespace encore::mla {

Status encode_pages_map(const MlaPagedCache& cache, CUtensorMap* map) {
  return detail::encode_tensor_map_2d_b16(map, cache.pages, kMlaRowDim, std::uint64_t(cache.num_pages) * kMlaPageTokens,
                                          kMlaRowDim * 2, SplitKvConfig::kBlockCols, kMlaPageTokens, "mla cache.pages");
}

Status splitkv_args(const MlaAttentionParams& p, SplitKvArgs* args) {
  args->p = p;
  return encode_pages_map(p.cache, &args->pages);
}

}  // namespace encore::mla

namespace encore::ops {

int mla_splitkv_num_tiles(const MlaAttentionParams& p) { return p.num_parts * mla::head_groups<>(p.num_heads); }

namespace {

template <class Cfg = mla::SplitKvConfig>
Status check_splitkv_smem() {
  const std::size_t smem = mla::mla_splitkv_smem_bytes<Cfg>();
  ENCORE_REQUIRE(smem <= std::size_t(detail::max_shared_memory_per_block()), StatusCode::kUnsupported,
                 "mla_splitkv: needs ", smem, " bytes of shared memory per block; the device offers ",
                 detail::max_shared_memory_per_block());
  return {};
}

}  // namespace

Status mla_splitkv(const MlaAttentionParams& p, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(mla_validate(p));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  ENCORE_RETURN_IF_ERROR(check_splitkv_smem());
  mla::SplitKvArgs args;
  ENCORE_RETURN_IF_ERROR(mla::splitkv_args(p, &args));
  return detail::launch(mla::mla_splitkv_kernel<>, mla_splitkv_num_tiles(p), mla::mla_splitkv_smem_bytes(), stream, true,
                        "mla_splitkv_kernel", args);
}

// Fused only while every tile has its own SM: a tile waits for the other parts of its requests,
// which therefore must all be resident (more than half of an SM's shared memory per block means
// one block per SM), and a request's slice of partials (splits <= parts) fits the free slots.
bool mla_attention_fused(const MlaAttentionParams& p) {
  return p.counters != nullptr && mla_splitkv_num_tiles(p) <= detail::sm_count() &&
         mla::fused_combine_fits(p.num_parts);
}

Status mla_attention(const MlaAttentionParams& p, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(mla_validate(p));
  if (!mla_attention_fused(p)) {
    ENCORE_RETURN_IF_ERROR(mla_splitkv(p, stream));
    return mla_combine(p, stream);
  }
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  ENCORE_RETURN_IF_ERROR(check_splitkv_smem());
  mla::SplitKvArgs args;
  ENCORE_RETURN_IF_ERROR(mla::splitkv_args(p, &args));
  return detail::launch(mla::mla_splitkv_kernel<mla::SplitKvVariant::kOp, true>,
                        mla_splitkv_num_tiles(p), mla::mla_splitkv_smem_bytes(), stream, true, "mla_attention_fused_kernel", args);
}

}  // namespace encore::ops

namespace encore::mla {

Status mla_splitkv_half_sm(const MlaAttentionParams& p, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(ops::mla_validate(p));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  ENCORE_RETURN_IF_ERROR(ops::check_splitkv_smem<SplitKvHalfSm>());
  SplitKvArgs args;
  ENCORE_RETURN_IF_ERROR(splitkv_args(p, &args));
  return detail::launch(mla_splitkv_kernel<SplitKvVariant::kOp, false, SplitKvHalfSm>, p.num_parts * head_groups<SplitKvHalfSm>(p.num_heads),
                        mla_splitkv_smem_bytes<SplitKvHalfSm>(), stream, true, "mla_splitkv_half_sm_kernel", args);
}

}  // namespace encore::mla
