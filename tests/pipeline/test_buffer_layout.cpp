// Step buffers and state pools: shapes from the config and the ops' own size queries.
#include <encore/pipeline/buffer_layout.h>

#include <encore/ops/kda.h>
#include <encore/ops/mla.h>
#include <encore/ops/moe.h>

#include "test_util.h"

namespace encore::pipeline {
namespace {

BufferOptions options(int max_batch = 16) {
  BufferOptions o;
  o.max_batch = max_batch, o.max_slots = 24, o.max_pages = 96, o.max_pages_per_seq = 40;
  o.mla_num_parts = 132;  // an H200 at 32 heads (one head group)
  return o;
}

std::int64_t dims_product(const TensorInfo& t) {
  std::int64_t n = 1;
  for (std::int64_t d : t.dims) n *= d;
  return n;
}

TEST(BufferLayout, ProjectionStrides) {
  EXPECT_EQ(kda_proj_stride(ModelConfig::kimi_linear_48b()), 12576);    // docs/model.md §4: 12,576 rows
  EXPECT_EQ(mla_proj_stride(ModelConfig::kimi_linear_48b()), 6720);     // 6,144 + 576
  EXPECT_EQ(kda_proj_stride(ModelConfig::tiny()), 1028);                // 3*256 + 2*128 + 2 = 1026, padded to 4
  EXPECT_EQ(mla_q_columns(ModelConfig::tiny(true)), 256);               // q LoRA: q_a first
  EXPECT_EQ(mla_proj_stride(ModelConfig::tiny(true)), 256 + 576);
}

TEST(BufferLayout, KimiShapesAndWorkspaces) {
  const ModelConfig c = ModelConfig::kimi_linear_48b();
  const BufferOptions o = options();
  TensorArena b;
  ENCORE_OK(build_buffer_layout(c, o, b));
  auto dims = [&](const char* name) {
    const TensorInfo* t = b.find(name);
    EXPECT_NE(t, nullptr) << name;
    return t ? t->dims : std::vector<std::int64_t>{};
  };
  using D = std::vector<std::int64_t>;
  EXPECT_EQ(dims("step.block_table"), (D{16, 40}));
  EXPECT_EQ(dims("x"), (D{16, 2304}));
  EXPECT_EQ(dims("kda.proj"), (D{16, 12576}));
  EXPECT_EQ(dims("kda.y"), (D{16, 4096}));
  EXPECT_EQ(dims("mla.q576"), (D{16, 32, 576}));
  EXPECT_EQ(dims("mla.partial_o"), (D{16 + 132, 32, 512}));
  EXPECT_EQ(dims("mla.partial_lse"), (D{16 + 132, 32}));
  EXPECT_EQ(dims("mla.part_plans"), (D{132, 8}));
  EXPECT_EQ(dims("mla.num_splits"), (D{17}));
  EXPECT_EQ(dims("mla.v_out"), (D{16, 4096}));
  EXPECT_EQ(dims("mlp.mid"), (D{16, 9216}));
  EXPECT_EQ(dims("moe.topk_ids"), (D{16, 8}));
  EXPECT_EQ(dims("logits"), (D{16, 163840}));
  EXPECT_EQ(b.find("mla.q"), nullptr);  // no q LoRA in Kimi
  EXPECT_EQ(b.find("moe.router_ws")->bytes, std::int64_t(ops::moe_router_workspace_bytes(16, 256, 2304)));
  EXPECT_EQ(b.find("moe.experts_ws")->bytes, std::int64_t(ops::moe_experts_workspace_bytes(16, 256, 1, 8, 2304, 1024)));
  std::int64_t end = 0;
  for (const TensorInfo& t : b.tensors()) {
    EXPECT_EQ(t.offset % 256, 0) << t.name;
    EXPECT_GE(t.offset, end) << t.name;
    end = t.offset + t.bytes;
  }
}

TEST(BufferLayout, KimiStatePools) {
  const ModelConfig c = ModelConfig::kimi_linear_48b();
  const BufferOptions o = options();
  TensorArena s;
  ENCORE_OK(build_state_layout(c, o, s));
  ASSERT_EQ(int(s.tensors().size()), 20 * 2 + 7);
  const std::int64_t recurrent = 24LL * 32 * 128 * 128 * 4, conv = 24LL * 3 * 3 * 4096 * 4, cache = 96LL * 64 * 576 * 2;
  EXPECT_EQ(s.find("blk.0.kda_recurrent")->bytes, recurrent);  // 2 MiB per slot (docs/model.md §5)
  EXPECT_EQ(s.find("blk.0.kda_conv")->bytes, conv);
  EXPECT_EQ(s.find("blk.3.mla_cache")->bytes, cache);
  EXPECT_EQ(s.find("blk.3.kda_conv"), nullptr);
  EXPECT_EQ(s.total_bytes(), 20 * (recurrent + conv) + 7 * cache);  // every piece is a multiple of 256
  EXPECT_EQ(dims_product(*s.find("blk.26.mla_cache")) * 2, cache);
  EXPECT_EQ(s.find("blk.0.kda_recurrent")->dims[1], ops::kda_recurrent_state_floats_per_slot(32, 128));
}

TEST(BufferLayout, TinyVariants) {
  for (bool rope : {false, true}) {
    const ModelConfig c = ModelConfig::tiny(rope);
    TensorArena b;
    ENCORE_OK(build_buffer_layout(c, options(3), b));
    EXPECT_EQ(b.find("mla.q") != nullptr, rope);
    EXPECT_EQ(b.find("logits")->dims, (std::vector<std::int64_t>{3, 512}));
    EXPECT_EQ(b.find("moe.experts_ws")->bytes, std::int64_t(ops::moe_experts_workspace_bytes(3, 16, 1, 4, 256, 256)));
  }
}

// Beyond 16 rows the GEMVs run in stages of 32 or 16 rows: their buffers get rows up to the next
// multiple of 16.
TEST(BufferLayout, BatchesBeyondTheGemvsSixteenRows) {
  EXPECT_EQ(gemv_rows(1), 1);
  EXPECT_EQ(gemv_rows(16), 16);
  EXPECT_EQ(gemv_rows(17), 32);
  EXPECT_EQ(gemv_rows(40), 48);
  EXPECT_EQ(gemv_rows(kMaxPipelineBatch), 64);
  const ModelConfig c = ModelConfig::kimi_linear_48b();
  TensorArena b;
  ENCORE_OK(build_buffer_layout(c, options(40), b));
  using D = std::vector<std::int64_t>;
  for (const char* name : {"step.token_ids", "step.slot_ids"}) EXPECT_EQ(b.find(name)->dims, (D{40})) << name;
  EXPECT_EQ(b.find("moe.topk_ids")->dims, (D{40, 8}));
  EXPECT_EQ(b.find("mla.q576")->dims, (D{40, 32, 576}));
  EXPECT_EQ(b.find("x")->dims, (D{48, 2304}));
  EXPECT_EQ(b.find("kda.proj")->dims, (D{48, 12576}));
  EXPECT_EQ(b.find("kda.y")->dims, (D{48, 4096}));
  EXPECT_EQ(b.find("mla.proj")->dims, (D{48, 6720}));
  EXPECT_EQ(b.find("mla.v_out")->dims, (D{48, 4096}));
  EXPECT_EQ(b.find("mlp.mid")->dims, (D{48, 9216}));
  EXPECT_EQ(b.find("logits")->dims, (D{48, 163840}));
  EXPECT_EQ(b.find("moe.experts_ws")->bytes, std::int64_t(ops::moe_experts_workspace_bytes(40, 256, 1, 8, 2304, 1024)));
}

TEST(BufferLayout, OptionsAreChecked) {
  const ModelConfig c = ModelConfig::tiny();
  TensorArena b;
  BufferOptions o = options(kMaxPipelineBatch + 1);  // beyond the MoE op's 64 tokens
  EXPECT_EQ(build_buffer_layout(c, o, b).code(), StatusCode::kOutOfRange);
  o = options(0);
  EXPECT_EQ(build_buffer_layout(c, o, b).code(), StatusCode::kOutOfRange);
  o = options();
  o.mla_num_parts = 0;
  EXPECT_EQ(build_buffer_layout(c, o, b).code(), StatusCode::kInvalidArgument);
  o = options();
  o.mla_min_part_units = 0;
  EXPECT_EQ(build_buffer_layout(c, o, b).code(), StatusCode::kInvalidArgument);
  o = options();
  o.max_slots = 0;
  EXPECT_EQ(build_state_layout(c, o, b).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace encore::pipeline
