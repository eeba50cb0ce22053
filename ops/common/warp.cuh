// Warp-wide reductions and the loads of step inputs that several bodies share.
#pragma once

#include <cuda_runtime.h>

namespace encore::device {

// Butterfly over the lanes' xor partners Width/2, ..., 1: every lane of each aligned group of
// Width lanes gets the group's result, in the same order on every lane (cub::WarpReduce leaves
// the result in lane 0 only).
template <int Width = 32>
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = Width / 2; m > 0; m >>= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, m);
  return x;
}
// warp_sum of N values at once, each butterfly step for all of them before the next (their
// shuffle chains overlap); each value's order is warp_sum's.
template <int N, int Width = 32>
__device__ __forceinline__ void warp_sums(float (&x)[N]) {
#pragma unroll
  for (int m = Width / 2; m > 0; m >>= 1)
#pragma unroll
    for (int u = 0; u < N; ++u) x[u] += __shfl_xor_sync(0xFFFFFFFFu, x[u], m);
}
template <int Width = 32>
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int m = Width / 2; m > 0; m >>= 1) x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, m));
  return x;
}
// warp_max of N values at once, each butterfly step for all of them before the next.
template <int N, int Width = 32>
__device__ __forceinline__ void warp_maxes(float (&x)[N]) {
#pragma unroll
  for (int m = Width / 2; m > 0; m >>= 1)
#pragma unroll
    for (int u = 0; u < N; ++u) x[u] = fmaxf(x[u], __shfl_xor_sync(0xFFFFFFFFu, x[u], m));
}

// A pad row (slot id < 0) is a batch row with no sequence behind it. Read through L2 (ld.cg):
// coherent wherever the body runs.
__device__ __forceinline__ bool is_pad_row(const int* slot_ids, int token) {
  return slot_ids != nullptr && __ldcg(slot_ids + token) < 0;
}

// v[0..7] = p[0..7] through the read-only path (p 16-byte aligned, not written in this launch).
__device__ __forceinline__ void ldg_float8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// The same through ordinary (coherent) loads, for data written earlier in the same launch.
__device__ __forceinline__ void load_float8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

}  // namespace encore::device
