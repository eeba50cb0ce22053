// Argument validation of the Q4_K GEMV launchers: runs on any machine (checks precede CUDA calls).
#include <encore/ops/q4k_gemv.h>

#include "test_util.h"

namespace encore {
namespace {

alignas(16) q4k::Block g_weights[64];
alignas(16) q4k::Block g_weights2[64];
alignas(16) float g_x[4 * 1024];
alignas(16) float g_y[4 * 1024];
alignas(16) float g_gamma[1024];

ops::Q4kGemvParams valid_plain() {
  ops::Q4kGemvParams a;
  a.weight = g_weights;
  a.x = g_x;
  a.y = g_y;
  a.n = 16;
  a.k = 1024;
  a.batch = 2;
  return a;
}

ops::RmsNormQ4kGemvParams valid_rmsnorm() {
  ops::RmsNormQ4kGemvParams r;
  r.weight = g_weights;
  r.x = g_x;
  r.gamma = g_gamma;
  r.y = g_y;
  r.n = 16;
  r.k = 1024;
  return r;
}

ops::GateUpQ4kGemvParams valid_gate_up() {
  ops::GateUpQ4kGemvParams g;
  g.gate = g_weights;
  g.up = g_weights2;
  g.x = g_x;
  g.h = g_y;
  g.n = 16;
  g.k = 1024;
  return g;
}

StatusCode plain(const ops::Q4kGemvParams& a) { return ops::q4k_gemv(a, nullptr).code(); }

TEST(Q4kGemvValidation, Dimensions) {
  auto a = valid_plain();
  a.k = 1000;
  EXPECT_EQ(plain(a), StatusCode::kInvalidArgument);
  a.k = 0;
  EXPECT_EQ(plain(a), StatusCode::kInvalidArgument);
  a = valid_plain();
  a.n = 0;
  EXPECT_EQ(plain(a), StatusCode::kInvalidArgument);
  a.n = std::int64_t(1) << 31;
  EXPECT_EQ(plain(a), StatusCode::kInvalidArgument);
  a = valid_plain();
  a.batch = 0;
  EXPECT_EQ(plain(a), StatusCode::kOutOfRange);
  a.batch = ops::kMaxGemvBatch + 1;
  EXPECT_EQ(plain(a), StatusCode::kOutOfRange);
  a = valid_plain();
  a.x_stride = 1022;  // < k
  EXPECT_EQ(plain(a), StatusCode::kInvalidArgument);
  a.x_stride = 1026;  // not a multiple of 4
  EXPECT_EQ(plain(a), StatusCode::kInvalidArgument);
  a = valid_plain();
  a.y_stride = 8;  // < n
  EXPECT_EQ(plain(a), StatusCode::kInvalidArgument);
}

TEST(Q4kGemvValidation, PointersAndAlignment) {
  auto a = valid_plain();
  a.weight = nullptr;
  EXPECT_EQ(plain(a), StatusCode::kNullPointer);
  a = valid_plain();
  a.x = nullptr;
  EXPECT_EQ(plain(a), StatusCode::kNullPointer);
  a = valid_plain();
  a.y = nullptr;
  EXPECT_EQ(plain(a), StatusCode::kNullPointer);
  a = valid_plain();
  a.x = g_x + 1;
  EXPECT_EQ(plain(a), StatusCode::kMisaligned);
  a = valid_plain();
  a.weight = reinterpret_cast<const q4k::Block*>(reinterpret_cast<const char*>(g_weights) + 2);
  EXPECT_EQ(plain(a), StatusCode::kMisaligned);
}

TEST(Q4kGemvValidation, Overlaps) {
  auto a = valid_plain();
  a.y = g_x + 8;  // output inside the activations
  EXPECT_EQ(plain(a), StatusCode::kOverlap);
  a = valid_plain();
  a.y = reinterpret_cast<float*>(g_weights);
  EXPECT_EQ(plain(a), StatusCode::kOverlap);
  a = valid_plain();
  a.residual = g_y + 4;  // partially overlapping the output
  EXPECT_EQ(plain(a), StatusCode::kOverlap);

  auto r = valid_rmsnorm();
  r.normalized = g_x + 1024;  // inside x (batch 1 reads x[0..1023] only, but x rows are k apart)
  r.batch = 2;
  EXPECT_EQ(ops::rmsnorm_q4k_gemv(r, nullptr).code(), StatusCode::kOverlap);
  r.normalized = nullptr;
  r.gamma = nullptr;
  EXPECT_EQ(ops::rmsnorm_q4k_gemv(r, nullptr).code(), StatusCode::kNullPointer);
  r.gamma = g_gamma;
  r.eps = 0.f;
  EXPECT_EQ(ops::rmsnorm_q4k_gemv(r, nullptr).code(), StatusCode::kInvalidArgument);

  auto g = valid_gate_up();
  g.up_out = g_y + 8;  // raw outputs overlap each other
  g.output = ops::GateUpOutput::kRaw;
  EXPECT_EQ(ops::gate_up_q4k_gemv(g, nullptr).code(), StatusCode::kOverlap);
  g.up_out = nullptr;
  EXPECT_EQ(ops::gate_up_q4k_gemv(g, nullptr).code(), StatusCode::kNullPointer);
  g.output = ops::GateUpOutput::kSiluMul;
  g.up = nullptr;
  EXPECT_EQ(ops::gate_up_q4k_gemv(g, nullptr).code(), StatusCode::kNullPointer);
}

// The *_validate functions are the launchers' checks alone: they accept valid arguments without a
// device and reject bad ones with the launcher's code.
TEST(Q4kGemvValidation, ValidatorsWithoutLaunching) {
  auto a = valid_plain();
  EXPECT_TRUE(ops::q4k_gemv_validate(a).ok());
  a.k = 1000;
  EXPECT_EQ(ops::q4k_gemv_validate(a).code(), plain(a));
  EXPECT_EQ(ops::q4k_gemv_validate(a).code(), StatusCode::kInvalidArgument);

  auto r = valid_rmsnorm();
  EXPECT_TRUE(ops::rmsnorm_q4k_gemv_validate(r).ok());
  r.gamma = nullptr;
  EXPECT_EQ(ops::rmsnorm_q4k_gemv_validate(r).code(), StatusCode::kNullPointer);
  EXPECT_EQ(ops::rmsnorm_q4k_gemv(r, nullptr).code(), StatusCode::kNullPointer);

  auto g = valid_gate_up();
  EXPECT_TRUE(ops::gate_up_q4k_gemv_validate(g).ok());
  g.up_out = g_y + 2048;  // only written in kRaw mode
  EXPECT_EQ(ops::gate_up_q4k_gemv_validate(g).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::gate_up_q4k_gemv(g, nullptr).code(), StatusCode::kInvalidArgument);
}

// Launch options outside their ranges fail before anything runs (any machine).
TEST(Q4kGemvValidation, LaunchOptions) {
  const auto a = valid_plain();
  ops::GemvLaunch bad_core;
  bad_core.core = static_cast<ops::GemvCore>(7);
  EXPECT_EQ(ops::q4k_gemv(a, nullptr, bad_core).code(), StatusCode::kInvalidArgument);
  for (int parts : {-1, 3, 16}) {
    ops::GemvLaunch bad_parts;
    bad_parts.mma_k_parts = parts;
    EXPECT_EQ(ops::q4k_gemv(a, nullptr, bad_parts).code(), StatusCode::kInvalidArgument) << parts;
    EXPECT_EQ(ops::gate_up_q4k_gemv(valid_gate_up(), nullptr, bad_parts).code(), StatusCode::kInvalidArgument) << parts;
  }
}

// Which core the launcher runs: the GPU suites' batch 5 and 16 cases are the fp16 mma core's
// except where its activations do not fit one shared-memory chunk (gate/up at K = 4096 and 16
// tokens, K = 14336); the int8 core takes the shapes where only its plan fits. Their Dp4a and Int8
// suites force the other cores.
TEST(Q4kGemvCore, ChoiceByBatchAndK) {
  using ops::GemvCore;
  EXPECT_EQ(ops::q4k_gemv_core(2304, 1, 1), GemvCore::kDp4a);
  EXPECT_EQ(ops::q4k_gemv_core(2304, 4, 2), GemvCore::kDp4a);
  for (std::int64_t k : {256, 2304, 4096})
    for (int batch : {5, 16})
      for (int nmat : {1, 2}) {
        const bool fits = !(k == 4096 && batch == 16 && nmat == 2);
        EXPECT_EQ(ops::q4k_gemv_core(k, batch, nmat), fits ? GemvCore::kMmaF16 : GemvCore::kDp4a) << k << " " << batch << " " << nmat;
      }
  EXPECT_EQ(ops::q4k_gemv_core(14336, 5, 1), GemvCore::kDp4a);
  // Where only one tensor-core plan fits, the default takes it: int8 (1.5 bytes a value) at
  // K = 5632 and 16 tokens; fp16 (one-block ring slots) for gate/up at K = 3072 and 16 tokens.
  EXPECT_EQ(ops::q4k_gemv_core(5632, 16, 1, GemvCore::kMmaF16), GemvCore::kDp4a);
  EXPECT_EQ(ops::q4k_gemv_core(5632, 16, 1), GemvCore::kMma);
  EXPECT_EQ(ops::q4k_gemv_core(3072, 16, 2, GemvCore::kMma), GemvCore::kDp4a);
  EXPECT_EQ(ops::q4k_gemv_core(3072, 16, 2), GemvCore::kMmaF16);
  EXPECT_EQ(ops::q4k_gemv_core(2304, 16, 1, GemvCore::kDp4a), GemvCore::kDp4a);
  EXPECT_EQ(ops::q4k_gemv_core(2304, 3, 1, GemvCore::kMma), GemvCore::kDp4a);  // below its 8-token tier
  EXPECT_EQ(ops::q4k_gemv_core(2304, 5, 2, GemvCore::kMma), GemvCore::kMma);
  EXPECT_EQ(ops::q4k_gemv_core(1000, 16, 1), GemvCore::kDp4a);  // invalid dims: nothing runs
}

// The fp16 core, asked for or by default, from its 8-token tier, where its activations (2 bytes a
// value, more than int8's 1.5) fit one chunk beside the ring (of one-block slots if need be).
TEST(Q4kGemvCore, Fp16CoreWhereItFits) {
  using ops::GemvCore;
  for (std::int64_t k : {256, 2304, 4096, 14336})
    for (int batch : {1, 3, 5, 8, 16})
      for (int nmat : {1, 2}) {
        const GemvCore got = ops::q4k_gemv_core(k, batch, nmat, GemvCore::kMmaF16);
        const bool fits = batch >= 5 && (k <= 2304 || (k == 4096 && (batch <= 8 || nmat == 1)));
        EXPECT_EQ(got, fits ? GemvCore::kMmaF16 : GemvCore::kDp4a) << k << " " << batch << " " << nmat;
        if (fits) EXPECT_EQ(ops::q4k_gemv_core(k, batch, nmat), GemvCore::kMmaF16) << k << " " << batch << " " << nmat;
      }
}


// Above 16 rows only the fp16 core runs, with one matrix, where all of K's activations fit a block
// (K <= 2304 at 32 rows): q4k_gemv_max_batch says so, and every other launch is refused before
// anything runs (any machine).
TEST(Q4kGemvCore, WideTierOnTheFp16CoreWithOneMatrix) {
  using ops::GemvCore;
  for (std::int64_t k : {256, 2304, 4096, 14336})
    for (int nmat : {1, 2}) {
      const bool wide = nmat == 1 && k <= 2304;
      EXPECT_EQ(ops::q4k_gemv_max_batch(k, nmat), wide ? 32 : 16) << k << " " << nmat;
      for (int batch : {17, 32}) {
        EXPECT_EQ(ops::q4k_gemv_core(k, batch, nmat), wide ? GemvCore::kMmaF16 : GemvCore::kDp4a) << k << " " << batch;
        EXPECT_EQ(ops::q4k_gemv_core(k, batch, nmat, GemvCore::kMma), GemvCore::kDp4a) << k << " " << batch;
      }
    }
  alignas(16) static float x[32 * 4096], y[32 * 4096];
  ops::Q4kGemvParams a = valid_plain();
  a.x = x, a.y = y, a.batch = 32, a.k = 1024;
  EXPECT_TRUE(ops::q4k_gemv_validate(a).ok());
  a.batch = 33;
  EXPECT_EQ(ops::q4k_gemv_validate(a).code(), StatusCode::kOutOfRange);
  a.batch = 17, a.k = 4096, a.n = 1;  // (K too long for 32 rows of fp16 activations)
  EXPECT_EQ(ops::q4k_gemv_validate(a).code(), StatusCode::kUnsupported);
  EXPECT_EQ(ops::q4k_gemv(a, nullptr).code(), StatusCode::kUnsupported);
  a = valid_plain();
  a.x = x, a.y = y, a.batch = 20;
  for (GemvCore core : {GemvCore::kDp4a, GemvCore::kMma}) {
    ops::GemvLaunch launch;
    launch.core = core;
    EXPECT_EQ(ops::q4k_gemv(a, nullptr, launch).code(), StatusCode::kUnsupported) << int(core);
  }
  ops::RmsNormQ4kGemvParams r = valid_rmsnorm();
  r.x = x, r.y = y, r.batch = 32;
  EXPECT_TRUE(ops::rmsnorm_q4k_gemv_validate(r).ok());
  ops::GateUpQ4kGemvParams g = valid_gate_up();
  g.x = x, g.h = y, g.batch = 17;
  EXPECT_EQ(ops::gate_up_q4k_gemv_validate(g).code(), StatusCode::kUnsupported);
  EXPECT_EQ(ops::gate_up_q4k_gemv(g, nullptr).code(), StatusCode::kUnsupported);
}

// Values outside the documented domain: an infinite eps, an output mode that is not in the enum.
TEST(Q4kGemvValidation, EpsAndOutputModeDomains) {
  auto r = valid_rmsnorm();
  r.eps = std::numeric_limits<float>::infinity();
  EXPECT_EQ(ops::rmsnorm_q4k_gemv_validate(r).code(), StatusCode::kInvalidArgument);
  r.eps = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(ops::rmsnorm_q4k_gemv_validate(r).code(), StatusCode::kInvalidArgument);
  auto g = valid_gate_up();
  g.output = ops::GateUpOutput(5);
  const Status s = ops::gate_up_q4k_gemv_validate(g);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("gate_up_q4k_gemv: output"), std::string::npos) << s.message();
  g = valid_gate_up();
  g.gamma = g_y;  // any aligned pointer: the eps check comes first
  g.eps = std::numeric_limits<float>::infinity();
  EXPECT_EQ(ops::gate_up_q4k_gemv_validate(g).code(), StatusCode::kInvalidArgument);
}

// Messages name the op and the argument.
TEST(Q4kGemvValidation, MessagesNameOpAndArgument) {
  auto g = valid_gate_up();
  g.up = nullptr;
  const Status s = ops::gate_up_q4k_gemv_validate(g);
  EXPECT_EQ(s.code(), StatusCode::kNullPointer);
  EXPECT_NE(s.message().find("gate_up_q4k_gemv"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("up"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace encore
