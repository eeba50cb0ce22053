// GPU Q4_K decode: one thread per (block, chunk) writes the chunk's 32 values.
#include <encore/q4k.h>

#include "common/cuda_check.h"
#include "q4k/q4k_device.cuh"

namespace encore::q4k {
namespace {

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <class Out>
__global__ void dequantize_kernel(const Block* __restrict__ in, Out* __restrict__ out, std::int64_t chunks) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < chunks; i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t b = i / 8;
    const int c = int(i % 8);
    const char* base = reinterpret_cast<const char*>(in + b);
    const uint4 header = *reinterpret_cast<const uint4*>(base);
    const uint4 codes = *reinterpret_cast<const uint4*>(base + 16 + 16 * c);
    const SubBlockPair sp = decode_pair(header, c / 2);
    Out* lo = out + b * kBlockValues + 64 * (c / 2) + 16 * (c % 2);  // sub-block 2*(c/2)
    Out* hi = lo + 32;                                                // sub-block 2*(c/2)+1
    const std::uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
    for (int w = 0; w < 4; ++w)
#pragma unroll
      for (int byte = 0; byte < 4; ++byte) {
        const std::uint32_t v = words[w] >> (8 * byte);
        store(lo + 4 * w + byte, sp.scale_lo * float(v & 0xF) - sp.min_lo);
        store(hi + 4 * w + byte, sp.scale_hi * float((v >> 4) & 0xF) - sp.min_hi);
      }
  }
}

template <class Out>
Status launch(const Block* in, Out* out, std::int64_t n, cudaStream_t stream, std::size_t out_align) {
  const char* op = "q4k::dequantize";
  ENCORE_REQUIRE(n > 0 && n % kBlockValues == 0, StatusCode::kInvalidArgument,
                 "q4k::dequantize: n must be a positive multiple of 256 (got ", n, ")");
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, in, 16, "in"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, out, out_align, "out"));
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {in, std::size_t(row_bytes(n)), "in"}, {out, std::size_t(n) * sizeof(Out), "out"}));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  const std::int64_t chunks = n / kBlockValues * 8;
  const int threads = 256;
  const int blocks = int(std::min<std::int64_t>((chunks + threads - 1) / threads, std::int64_t(detail::sm_count()) * 16));
  dequantize_kernel<<<blocks, threads, 0, stream>>>(in, out, chunks);
  return detail::check_launch("q4k::dequantize_kernel");
}

}  // namespace

Status dequantize(const Block* in, float* out, std::int64_t n, cudaStream_t stream) {
  return launch(in, out, n, stream, 16);
}
Status dequantize(const Block* in, __nv_bfloat16* out, std::int64_t n, cudaStream_t stream) {
  return launch(in, out, n, stream, 8);
}

}  // namespace encore::q4k
