// KDA decode step: standalone kernels, validating launchers, slot check and state helpers.
#include <encore/ops/kda.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cuda_check.h"
#include "common/block.h"
#include "common/pdl.cuh"
#include "common/launch.h"
#include "kda/kda_tile.cuh"

namespace encore::ops {
namespace {

// One block per (sequence, head) tile (grid = tiles). Before the wait: only what does not depend
// on the previous kernel (weights, settled states, or L2 hints for them; adding the hints to the
// settled path cost 2-3% at B = 8-32).
template <int HeadDim>
__global__ void __launch_bounds__(kBlockThreads, 2) kda_kernel(const __grid_constant__ KdaParams p) {
  extern __shared__ __align__(16) char smem[];
  device::PdlWait wait;  // dependents still wait for our completion before reading
  kda::kda_body<HeadDim>(p, device::BlockTile{}, smem, wait);
}

// ORs KdaError bits for the batch's slot ids into *flag (sticky). One block; O(batch^2 / 256).
__global__ void kda_check_slots_kernel(const int* __restrict__ slot_ids, int batch, int num_slots, int* flag) {
  device::wait_for_upstream();
  device::allow_downstream();
  int bits = 0;
  for (int i = threadIdx.x; i < batch; i += blockDim.x) {
    const int s = slot_ids[i];
    if (s >= num_slots) bits |= kKdaSlotOutOfRange;
    if (s >= 0)
      for (int j = i + 1; j < batch; ++j)
        if (slot_ids[j] == s) bits |= kKdaSlotDuplicate;
  }
  const int out_of_range = __syncthreads_or(bits & kKdaSlotOutOfRange);
  const int duplicate = __syncthreads_or(bits & kKdaSlotDuplicate);
  if (threadIdx.x == 0 && (out_of_range | duplicate))
    atomicOr(flag, (out_of_range ? int(kKdaSlotOutOfRange) : 0) | (duplicate ? int(kKdaSlotDuplicate) : 0));
}

// Zeroes both states of each listed slot: blockIdx.y = list entry, grid-stride over float4s.
__global__ void kda_reset_slots_kernel(float4* recurrent, std::int64_t recurrent_vec_per_slot, float4* conv,
                                       std::int64_t conv_vec_per_slot, int num_slots, const int* slot_ids) {
  device::wait_for_upstream();
  const int slot = slot_ids[blockIdx.y];
  if (slot < 0 || slot >= num_slots) return;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < recurrent_vec_per_slot; i += stride)
    recurrent[slot * recurrent_vec_per_slot + i] = zero;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < conv_vec_per_slot; i += stride)
    conv[slot * conv_vec_per_slot + i] = zero;
}

// out[h][c][r] = in[h][r][c] for D x D matrices; block (32 x 8 threads) per 32 x 32 tile.
__global__ void kda_transpose_heads_kernel(const float* __restrict__ in, float* __restrict__ out, int D) {
  __shared__ float tile[32][33];
  const std::int64_t base = std::int64_t(blockIdx.z) * D * D;
  const int r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  for (int r = ty; r < 32; r += 8) tile[r][tx] = in[base + std::int64_t(r0 + r) * D + c0 + tx];
  __syncthreads();
  for (int c = ty; c < 32; c += 8) out[base + std::int64_t(c0 + c) * D + r0 + tx] = tile[tx][c];
}

// One slot's conv history between tap-major [3][C] (ours) and channel-major [C][3]:
// to_tap_major: out[t][c] = in[c][t], else out[c][t] = in[t][c]. Grid-stride over the 3C values.
__global__ void kda_conv_layout_kernel(const float* __restrict__ in, float* __restrict__ out, std::int64_t C,
                                       bool to_tap_major) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < 3 * C;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / C, c = i - t * C;  // i indexes the tap-major side
    if (to_tap_major)
      out[i] = in[c * 3 + t];
    else
      out[c * 3 + t] = in[i];
  }
}

std::int64_t proj_bytes(const KdaParams& p) {
  return ((std::int64_t(p.batch) - 1) * p.proj_stride + kda_proj_width(p)) * std::int64_t(sizeof(float));
}

Status check_pool_dims(int num_slots, int num_heads, int head_dim, const char* who) {
  ENCORE_REQUIRE(head_dim == 64 || head_dim == 128, StatusCode::kInvalidArgument, who,
                 ": head_dim must be 64 or 128 (got ", head_dim, ")");
  ENCORE_REQUIRE(num_heads >= 1, StatusCode::kInvalidArgument, who, ": num_heads must be >= 1 (got ", num_heads, ")");
  ENCORE_REQUIRE(num_slots >= 1, StatusCode::kInvalidArgument, who, ": num_slots must be >= 1 (got ", num_slots, ")");
  return {};
}

Status transpose_slot(const float* in, float* out, int num_heads, int head_dim, cudaStream_t stream, const char* who) {
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(who, {in, std::size_t(num_heads) * head_dim * head_dim * 4, "source"}, {out, std::size_t(num_heads) * head_dim * head_dim * 4, "destination"}));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  const dim3 grid(head_dim / 32, head_dim / 32, num_heads);
  kda_transpose_heads_kernel<<<grid, kBlockThreads, 0, stream>>>(in, out, head_dim);
  return detail::check_launch(who);
}

}  // namespace

std::int64_t kda_proj_width(const KdaParams& p) {
  return 3LL * p.num_heads * p.head_dim + 2LL * p.gate_rank + p.num_heads;
}

int kda_num_tiles(const KdaParams& p) { return p.batch * p.num_heads; }

std::size_t kda_smem_bytes(const KdaParams& p) {
  std::size_t bytes = 0;
  kda::Smem::carve(nullptr, p.head_dim, p.gate_rank, &bytes);
  return bytes;
}

Status kda_validate(const KdaParams& p) {
  ENCORE_RETURN_IF_ERROR(check_pool_dims(p.num_slots, p.num_heads, p.head_dim, "kda"));
  ENCORE_REQUIRE(p.batch >= 1, StatusCode::kOutOfRange, "kda: batch must be >= 1 (got ", p.batch, ")");
  ENCORE_REQUIRE(std::int64_t(p.batch) * p.num_heads < (1LL << 31), StatusCode::kInvalidArgument,
                 "kda: batch * num_heads exceeds the tile index range");
  ENCORE_REQUIRE(p.gate_rank >= 64 && p.gate_rank <= 256 && p.gate_rank % 64 == 0, StatusCode::kInvalidArgument,
                 "kda: gate_rank must be 64, 128, 192 or 256 (got ", p.gate_rank, ")");
  ENCORE_REQUIRE(p.proj_stride >= kda_proj_width(p) && p.proj_stride % 4 == 0, StatusCode::kInvalidArgument,
                 "kda: proj_stride must be a multiple of 4 and >= ", kda_proj_width(p), " (got ", p.proj_stride, ")");
  ENCORE_REQUIRE(std::isfinite(p.norm_eps) && p.norm_eps > 0.f, StatusCode::kInvalidArgument,
                 "kda: norm_eps must be positive (got ", p.norm_eps, ")");

  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda", p.proj, 16, "proj"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda", p.slot_ids, 4, "slot_ids"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda", p.y, 16, "y"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda", p.conv_weight, 16, "conv_weight"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda", p.A_log, 4, "A_log"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda", p.dt_bias, 16, "dt_bias"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda", p.f_b_weight, 16, "f_b_weight"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda", p.g_b_weight, 16, "g_b_weight"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda", p.o_norm_weight, 16, "o_norm_weight"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda", p.conv_state, 16, "conv_state"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda", p.recurrent_state, 16, "recurrent_state"));
  if (p.error_flag) ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda", p.error_flag, 4, "error_flag"));

  // Every written buffer must be disjoint from every other buffer.
  const std::int64_t H = p.num_heads, D = p.head_dim, P = H * D;
  const auto bytes = [](std::int64_t n) { return std::size_t(n); };
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(
      "kda",
      {{p.proj, bytes(proj_bytes(p)), "proj"},
       {p.slot_ids, bytes(std::int64_t(p.batch) * 4), "slot_ids"},
       {p.conv_weight, bytes(3 * P * kKdaConvTaps * 4), "conv_weight"},
       {p.A_log, bytes(H * 4), "A_log"},
       {p.dt_bias, bytes(P * 4), "dt_bias"},
       {p.f_b_weight, bytes(P * p.gate_rank * 2), "f_b_weight"},
       {p.g_b_weight, bytes(P * p.gate_rank * 2), "g_b_weight"},
       {p.o_norm_weight, bytes(D * 4), "o_norm_weight"}},
      {{p.y, bytes(std::int64_t(p.batch) * P * 4), "y"},
       {p.conv_state, bytes(p.num_slots * kda_conv_state_floats_per_slot(p.num_heads, p.head_dim) * 4), "conv_state"},
       {p.recurrent_state, bytes(p.num_slots * kda_recurrent_state_floats_per_slot(p.num_heads, p.head_dim) * 4),
        "recurrent_state"},
       {p.error_flag, 4, "error_flag"}}));

  if (p.host_slot_ids) {
    std::vector<int> seen_in_row(p.num_slots, -1);
    for (int i = 0; i < p.batch; ++i) {
      const int s = p.host_slot_ids[i];
      ENCORE_REQUIRE(s < p.num_slots, StatusCode::kOutOfRange, "kda: slot_ids[", i, "] = ", s,
                     " is out of range (num_slots = ", p.num_slots, ")");
      if (s < 0) continue;
      ENCORE_REQUIRE(seen_in_row[s] < 0, StatusCode::kInvalidArgument, "kda: slot ", s, " appears twice (rows ",
                     seen_in_row[s], " and ", i, ")");
      seen_in_row[s] = i;
    }
  }
  return {};
}

Status kda(const KdaParams& p, cudaStream_t stream, bool pdl) {
  ENCORE_RETURN_IF_ERROR(kda_validate(p));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  if (p.error_flag)
    ENCORE_RETURN_IF_ERROR(detail::launch(kda_check_slots_kernel, 1, 0, stream, pdl, "kda_check_slots_kernel",
                                          p.slot_ids, p.batch, p.num_slots, p.error_flag));
  const int tiles = kda_num_tiles(p);
  const std::size_t smem = kda_smem_bytes(p);
  if (p.head_dim == 128) return detail::launch(kda_kernel<128>, tiles, smem, stream, pdl, "kda_kernel<128>", p);
  return detail::launch(kda_kernel<64>, tiles, smem, stream, pdl, "kda_kernel<64>", p);
}

Status kda_check_slots(const int* slot_ids, int batch, int num_slots, int* error_flag, cudaStream_t stream) {
  ENCORE_REQUIRE(batch >= 1 && num_slots >= 1, StatusCode::kInvalidArgument,
                 "kda_check_slots: batch and num_slots must be >= 1");
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda_check_slots", slot_ids, 4, "slot_ids"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda_check_slots", error_flag, 4, "error_flag"));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  return detail::launch(kda_check_slots_kernel, 1, 0, stream, false, "kda_check_slots_kernel", slot_ids, batch,
                        num_slots, error_flag);
}

Status kda_read_error(int* error_flag, cudaStream_t stream, bool clear) {
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda_read_error", error_flag, 4, "error_flag"));
  int bits = 0;
  ENCORE_CUDA_TRY(cudaMemcpyAsync(&bits, error_flag, sizeof(int), cudaMemcpyDeviceToHost, stream));
  ENCORE_CUDA_TRY(cudaStreamSynchronize(stream));
  if (clear && bits) {
    ENCORE_CUDA_TRY(cudaMemsetAsync(error_flag, 0, sizeof(int), stream));
    ENCORE_CUDA_TRY(cudaStreamSynchronize(stream));
  }
  ENCORE_REQUIRE(!(bits & kKdaSlotOutOfRange), StatusCode::kOutOfRange,
                 "kda: a slot id was out of range; the step wrote no state");
  ENCORE_REQUIRE(!(bits & kKdaSlotDuplicate), StatusCode::kInvalidArgument,
                 "kda: a slot id appeared twice in one batch; the step wrote no state");
  return {};
}

Status kda_reset_slots(float* recurrent_state, float* conv_state, int num_slots, int num_heads, int head_dim,
                       const int* slot_ids, int count, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(check_pool_dims(num_slots, num_heads, head_dim, "kda_reset_slots"));
  ENCORE_REQUIRE(count >= 1 && count <= 65535, StatusCode::kInvalidArgument,
                 "kda_reset_slots: count must be in [1, 65535] (got ", count, ")");
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda_reset_slots", recurrent_state, 16, "recurrent_state"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda_reset_slots", conv_state, 16, "conv_state"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda_reset_slots", slot_ids, 4, "slot_ids"));
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(
      "kda_reset_slots",
      {recurrent_state, std::size_t(num_slots * kda_recurrent_state_floats_per_slot(num_heads, head_dim) * 4), "recurrent_state"},
      {conv_state, std::size_t(num_slots * kda_conv_state_floats_per_slot(num_heads, head_dim) * 4), "conv_state"}));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  const std::int64_t rec_vec = kda_recurrent_state_floats_per_slot(num_heads, head_dim) / 4;
  const std::int64_t conv_vec = kda_conv_state_floats_per_slot(num_heads, head_dim) / 4;
  const dim3 grid(unsigned(std::min<std::int64_t>((rec_vec + kBlockThreads - 1) / kBlockThreads, 64)), unsigned(count));
  kda_reset_slots_kernel<<<grid, kBlockThreads, 0, stream>>>(reinterpret_cast<float4*>(recurrent_state), rec_vec,
                                                               reinterpret_cast<float4*>(conv_state), conv_vec,
                                                               num_slots, slot_ids);
  return detail::check_launch("kda_reset_slots_kernel");
}

Status kda_import_state_kv(float* recurrent_state, int num_slots, int num_heads, int head_dim, int slot,
                           const float* state_kv, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(check_pool_dims(num_slots, num_heads, head_dim, "kda_import_state_kv"));
  ENCORE_REQUIRE(slot >= 0 && slot < num_slots, StatusCode::kOutOfRange, "kda_import_state_kv: slot ", slot,
                 " out of range (num_slots = ", num_slots, ")");
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda_import_state_kv", recurrent_state, 16, "recurrent_state"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda_import_state_kv", state_kv, 4, "state_kv"));
  float* dst = recurrent_state + slot * kda_recurrent_state_floats_per_slot(num_heads, head_dim);
  return transpose_slot(state_kv, dst, num_heads, head_dim, stream, "kda_import_state_kv");
}

Status kda_export_state_kv(const float* recurrent_state, int num_slots, int num_heads, int head_dim, int slot,
                           float* state_kv, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(check_pool_dims(num_slots, num_heads, head_dim, "kda_export_state_kv"));
  ENCORE_REQUIRE(slot >= 0 && slot < num_slots, StatusCode::kOutOfRange, "kda_export_state_kv: slot ", slot,
                 " out of range (num_slots = ", num_slots, ")");
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda_export_state_kv", recurrent_state, 16, "recurrent_state"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("kda_export_state_kv", state_kv, 4, "state_kv"));
  const float* src = recurrent_state + slot * kda_recurrent_state_floats_per_slot(num_heads, head_dim);
  return transpose_slot(src, state_kv, num_heads, head_dim, stream, "kda_export_state_kv");
}

namespace {

// Shared checks of the one-slot helpers: dims, slot range, pointers, no overlap with the slot.
Status check_slot_copy(const void* pool, std::int64_t floats_per_slot, int num_slots, int num_heads, int head_dim,
                       int slot, const void* buffer, const char* who) {
  ENCORE_RETURN_IF_ERROR(check_pool_dims(num_slots, num_heads, head_dim, who));
  ENCORE_REQUIRE(slot >= 0 && slot < num_slots, StatusCode::kOutOfRange, who, ": slot ", slot,
                 " out of range (num_slots = ", num_slots, ")");
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(who, pool, 16, "pool"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(who, buffer, 4, "buffer"));
  const std::size_t bytes = std::size_t(floats_per_slot) * 4;
  return detail::check_disjoint(who, {static_cast<const char*>(pool) + slot * bytes, bytes, "slot"}, {buffer, bytes, "buffer"});
}

Status copy_slot(void* dst, const void* src, std::int64_t floats, cudaStream_t stream, const char* who) {
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  ENCORE_CUDA_TRY(cudaMemcpyAsync(dst, src, std::size_t(floats) * 4, cudaMemcpyDeviceToDevice, stream));
  return detail::check_launch(who);
}

Status convert_conv(const float* in, float* out, std::int64_t channels, bool to_tap_major, cudaStream_t stream,
                    const char* who) {
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  const int blocks = int(std::min<std::int64_t>((3 * channels + kBlockThreads - 1) / kBlockThreads, 1024));
  kda_conv_layout_kernel<<<blocks, kBlockThreads, 0, stream>>>(in, out, channels, to_tap_major);
  return detail::check_launch(who);
}

}  // namespace

Status kda_import_state_vk(float* recurrent_state, int num_slots, int num_heads, int head_dim, int slot,
                           const float* state_vk, cudaStream_t stream) {
  const std::int64_t n = kda_recurrent_state_floats_per_slot(num_heads, head_dim);
  ENCORE_RETURN_IF_ERROR(check_slot_copy(recurrent_state, n, num_slots, num_heads, head_dim, slot, state_vk,
                                         "kda_import_state_vk"));
  return copy_slot(recurrent_state + slot * n, state_vk, n, stream, "kda_import_state_vk");
}

Status kda_export_state_vk(const float* recurrent_state, int num_slots, int num_heads, int head_dim, int slot,
                           float* state_vk, cudaStream_t stream) {
  const std::int64_t n = kda_recurrent_state_floats_per_slot(num_heads, head_dim);
  ENCORE_RETURN_IF_ERROR(check_slot_copy(recurrent_state, n, num_slots, num_heads, head_dim, slot, state_vk,
                                         "kda_export_state_vk"));
  return copy_slot(state_vk, recurrent_state + slot * n, n, stream, "kda_export_state_vk");
}

Status kda_import_conv_state(float* conv_state, int num_slots, int num_heads, int head_dim, int slot, const float* src,
                             KdaConvLayout layout, cudaStream_t stream) {
  const std::int64_t n = kda_conv_state_floats_per_slot(num_heads, head_dim);
  ENCORE_RETURN_IF_ERROR(
      check_slot_copy(conv_state, n, num_slots, num_heads, head_dim, slot, src, "kda_import_conv_state"));
  ENCORE_REQUIRE(layout == KdaConvLayout::kTapMajor || layout == KdaConvLayout::kChannelMajor, StatusCode::kInvalidArgument,
                 "kda_import_conv_state: layout must be kTapMajor or kChannelMajor (got ", int(layout), ")");
  float* dst = conv_state + slot * n;
  if (layout == KdaConvLayout::kTapMajor) return copy_slot(dst, src, n, stream, "kda_import_conv_state");
  return convert_conv(src, dst, n / 3, true, stream, "kda_import_conv_state");
}

Status kda_export_conv_state(const float* conv_state, int num_slots, int num_heads, int head_dim, int slot, float* dst,
                             KdaConvLayout layout, cudaStream_t stream) {
  const std::int64_t n = kda_conv_state_floats_per_slot(num_heads, head_dim);
  ENCORE_RETURN_IF_ERROR(
      check_slot_copy(conv_state, n, num_slots, num_heads, head_dim, slot, dst, "kda_export_conv_state"));
  ENCORE_REQUIRE(layout == KdaConvLayout::kTapMajor || layout == KdaConvLayout::kChannelMajor, StatusCode::kInvalidArgument,
                 "kda_export_conv_state: layout must be kTapMajor or kChannelMajor (got ", int(layout), ")");
  const float* src = conv_state + slot * n;
  if (layout == KdaConvLayout::kTapMajor) return copy_slot(dst, src, n, stream, "kda_export_conv_state");
  return convert_conv(src, dst, n / 3, false, stream, "kda_export_conv_state");
}

}  // namespace encore::ops
