// The GEMV ops' device-ready plans, for callers that run the body themselves (the megakernel):
// the launchers' own validation, device params and plan (row split, core, ring depth, chunks),
// for a device of `sms` SMs. The plan fixes the order of every sum, so a caller that runs the
// body on the plan the launcher would make gets the launcher's bits.
#pragma once

#include <cstddef>

#include <encore/ops/q4k_gemv.h>
#include <encore/status.h>

#include "gemv/gemv_params.cuh"

namespace encore::gemv {

struct GemvPlan {
  GemvTileParams params;
  int matrices = 1;     // 1, or 2 for gate/up
  int tokens = 1;       // the body's token tier (NTOK): 1, 2, 4, 8 or 16
  std::size_t smem = 0;  // dynamic shared memory of a block
};

Status plan_op(const ops::Q4kGemvParams& p, int sms, GemvPlan* out, ops::GemvLaunch options = {});
Status plan_op(const ops::RmsNormQ4kGemvParams& p, int sms, GemvPlan* out, ops::GemvLaunch options = {});
Status plan_op(const ops::GateUpQ4kGemvParams& p, int sms, GemvPlan* out, ops::GemvLaunch options = {});

}  // namespace encore::gemv
