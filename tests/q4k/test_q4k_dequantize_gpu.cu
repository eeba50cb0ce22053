// GPU decode must match the host decoder bit for bit (fp32) and by rounding (bf16).
#include <encore/q4k.h>

#include <cuda_bf16.h>

#include "test_util.h"

namespace encore::q4k {
namespace {

std::vector<Block> random_blocks(std::size_t count, std::mt19937_64& rng) {
  std::vector<Block> q(count);
  auto* bytes = reinterpret_cast<std::uint8_t*>(q.data());
  for (std::size_t i = 0; i < count * sizeof(Block); ++i) bytes[i] = std::uint8_t(rng());
  std::normal_distribution<float> scale(0.f, 0.05f);
  for (auto& b : q) {
    b.d = float_to_half(scale(rng));
    b.dmin = float_to_half(scale(rng));
  }
  return q;
}

TEST(Q4kDequantizeGpu, MatchesHostBitForBit) {
  ENCORE_REQUIRE_GPU();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const std::int64_t n = 256 * 1000;
  auto q = random_blocks(n / 256, rng);
  std::vector<float> host(n);
  ASSERT_TRUE(dequantize_row(q.data(), host.data(), n).ok());

  test::DeviceBuffer<Block> dq(q);
  test::DeviceBuffer<float> out(n);
  test::DeviceBuffer<__nv_bfloat16> out_bf16(n);
  ENCORE_OK(dequantize(dq.get(), out.get(), n, nullptr));
  ENCORE_OK(dequantize(dq.get(), out_bf16.get(), n, nullptr));
  auto gpu = out.download();
  auto gpu_bf16 = out_bf16.download();
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::memcmp(&gpu[i], &host[i], 4), 0) << "i=" << i << " gpu " << gpu[i] << " host " << host[i];
    ASSERT_EQ(__bfloat162float(gpu_bf16[i]), __bfloat162float(__float2bfloat16_rn(host[i]))) << "i=" << i;
  }
}

TEST(Q4kDequantizeGpu, RejectsBadArguments) {
  // Validation runs before any CUDA call, so this holds with or without a device.
  alignas(16) static Block blocks[2];
  alignas(16) static float out[512];
  EXPECT_EQ(dequantize(blocks, out, 300, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dequantize(blocks, out, 0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dequantize(nullptr, out, 256, nullptr).code(), StatusCode::kNullPointer);
  EXPECT_EQ(dequantize(blocks, out + 1, 256, nullptr).code(), StatusCode::kMisaligned);
  EXPECT_EQ(dequantize(reinterpret_cast<const Block*>(reinterpret_cast<const char*>(blocks) + 8), out, 256, nullptr).code(),
            StatusCode::kMisaligned);
  EXPECT_EQ(dequantize(blocks, reinterpret_cast<float*>(blocks), 256, nullptr).code(), StatusCode::kOverlap);
}

}  // namespace
}  // namespace encore::q4k
