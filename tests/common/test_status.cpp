#include <encore/status.h>

#include "common/cuda_check.h"
#include "common/tensor_map.h"
#include "test_util.h"

namespace encore {
namespace {

TEST(Status, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.to_string(), "ok");
}

TEST(Status, CarriesCodeAndMessage) {
  Status s(StatusCode::kMisaligned, "x must be 16-byte aligned");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kMisaligned);
  EXPECT_NE(s.to_string().find("16-byte"), std::string::npos);
  EXPECT_THROW(throw_if_error(s), Error);
}

TEST(Checks, PointerNullAndAlignment) {
  alignas(16) static char buf[64];
  EXPECT_EQ(detail::check_pointer("op", nullptr, 16, "p").code(), StatusCode::kNullPointer);
  EXPECT_EQ(detail::check_pointer("op", buf + 4, 16, "p").code(), StatusCode::kMisaligned);
  EXPECT_TRUE(detail::check_pointer("op", buf + 16, 16, "p").ok());
}

TEST(Checks, Overlap) {
  static char buf[64];
  EXPECT_EQ(detail::check_disjoint("op", {buf, 32, "a"}, {buf + 16, 32, "b"}).code(), StatusCode::kOverlap);
  EXPECT_TRUE(detail::check_disjoint("op", {buf, 32, "a"}, {buf + 32, 32, "b"}).ok());
}

// The tensor-map helper checks the layout itself before it asks the driver (CPU: no driver call).
TEST(Checks, TensorMapRejectsBadLayouts) {
  alignas(16) static char buf[4096];
  CUtensorMap map;
  EXPECT_EQ(detail::encode_tensor_map_2d_b16(&map, nullptr, 576, 64, 1152, 64, 64, "t").code(), StatusCode::kNullPointer);
  EXPECT_EQ(detail::encode_tensor_map_2d_b16(&map, buf + 8, 576, 64, 1152, 64, 64, "t").code(), StatusCode::kMisaligned);
  EXPECT_EQ(detail::encode_tensor_map_2d_b16(&map, buf, 576, 64, 1160, 64, 64, "t").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(detail::encode_tensor_map_2d_b16(&map, buf, 576, 0, 1152, 64, 64, "t").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(detail::encode_tensor_map_2d_b16(&map, buf, 576, 64, 1152, 32, 64, "t").code(), StatusCode::kInvalidArgument);
  // Plain boxes of 4-byte words (the MoE expert streams): 4..256 words, a multiple of 4, 1..256 rows.
  EXPECT_EQ(detail::encode_tensor_map_2d_words(&map, nullptr, 324, 64, 1296, 108, 4, "t").code(), StatusCode::kNullPointer);
  EXPECT_EQ(detail::encode_tensor_map_2d_words(&map, buf + 4, 324, 64, 1296, 108, 4, "t").code(), StatusCode::kMisaligned);
  EXPECT_EQ(detail::encode_tensor_map_2d_words(&map, buf, 324, 64, 1300, 108, 4, "t").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(detail::encode_tensor_map_2d_words(&map, buf, 324, 64, 1296, 260, 4, "t").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(detail::encode_tensor_map_2d_words(&map, buf, 324, 64, 1296, 106, 4, "t").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(detail::encode_tensor_map_2d_words(&map, buf, 324, 64, 1296, 108, 0, "t").code(), StatusCode::kInvalidArgument);
}

TEST(Checks, InvalidatedCaptureIsAFailedStream) {
  ENCORE_REQUIRE_GPU();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  EXPECT_TRUE(detail::check_stream(stream).ok());
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  // A synchronous query is illegal during capture: it invalidates the capture.
  EXPECT_NE(cudaSuccess, cudaStreamQuery(stream));
  cudaGetLastError();
  EXPECT_EQ(detail::check_stream(stream).code(), StatusCode::kCudaError);
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
  cudaStreamDestroy(stream);
}


// Without a GPU (CI), a launcher's stream check reports kNoDevice rather than a raw CUDA error.
TEST(Checks, NoDeviceIsItsOwnCode) {
  if (test::sm_count() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_EQ(detail::check_stream(nullptr).code(), StatusCode::kNoDevice);
  EXPECT_EQ(detail::cuda_status(cudaErrorInsufficientDriver, "x").code(), StatusCode::kNoDevice);
  EXPECT_EQ(detail::cuda_status(cudaErrorNoDevice, "x").code(), StatusCode::kNoDevice);
  EXPECT_EQ(detail::cuda_status(cudaErrorInvalidValue, "x").code(), StatusCode::kCudaError);
}

TEST(Checks, DisjointSetsNameTheOpAndBothBuffers) {
  static char buf[256];
  const Status s = detail::check_disjoint("some_op", {{buf, 64, "in0"}, {nullptr, 64, "absent"}}, {{buf + 128, 64, "out0"}, {buf + 160, 8, "out1"}});
  EXPECT_EQ(s.code(), StatusCode::kOverlap);
  EXPECT_NE(s.message().find("some_op: out0 and out1 overlap"), std::string::npos) << s.message();
  EXPECT_TRUE(detail::check_disjoint("some_op", {{buf, 64, "in0"}}, {{buf + 64, 64, "out0"}, {nullptr, 64, "absent"}}).ok());
}

}  // namespace
}  // namespace encore
