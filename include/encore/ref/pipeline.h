// fp64 reference of one decode step of a whole model (docs/model.md §3): the ops' own
// references chained in the pipeline's stage order, reading the weights by name from a host copy
// of the weight arena. Values the device stores at op boundaries are rounded as it stores them:
// fp32 activations and residual stream, bf16 q576 and latent cache rows. With int8_activations
// the Q4_K GEMVs and the experts use the kernels' int8 activation arithmetic (ref::q4k_gemv_int8),
// so a comparison with the device is not blurred by the quantisation error of K = 256 rows.
#pragma once

#include <functional>
#include <vector>

#include <encore/pipeline/buffer_layout.h>
#include <encore/pipeline/model_config.h>
#include <encore/pipeline/pipeline.h>
#include <encore/pipeline/tensor_arena.h>

namespace encore::ref {

// The state pools in the reference's precision: per layer, KDA conv [slots][3][3HK] and recurrent
// [slots][H][V][K] states in double (empty for MLA layers), MLA cache pages [pages][64][576] as the
// bf16 values widened to float (empty for KDA layers). Zero-initialised like Pipeline::reset_state.
struct DecodeRefState {
  std::vector<std::vector<double>> kda_conv, kda_recurrent;
  std::vector<std::vector<float>> mla_cache;
};
DecodeRefState decode_ref_state(const pipeline::ModelConfig& c, const pipeline::BufferOptions& o);

// Called per MoE layer with the reference's routing of the step (ids and weights [batch][k]); it
// may replace them (e.g. with the device's, so that a near-tie decided the other way by fp32
// does not make the rest of the step diverge).
using RoutingHook = std::function<void(int layer, std::vector<int>& ids, std::vector<float>& weights)>;
// Called with the residual stream x [batch][hidden] after each layer's attention (mlp = false) and
// MLP (mlp = true) residual adds. It may compare x with a device run and replace it with the
// device's x ("teacher forcing"): each layer is then checked on the device's own inputs, so
// int8 rounding flips that an fp32 / fp64 difference set off upstream do not pile up downstream.
using ResidualHook = std::function<void(int layer, bool mlp, std::vector<float>& x)>;

// One step for `batch` rows (rows past in's are pad rows, as in Pipeline::set_step). Updates
// `state` and returns the logits [batch][vocab].
std::vector<double> decode_step(const pipeline::ModelConfig& c, const pipeline::BufferOptions& o,
                                const pipeline::TensorArena& layout, const void* weights, const pipeline::StepInputs& in,
                                int batch, bool int8_activations, DecodeRefState& state, const RoutingHook& routing = {},
                                const ResidualHook& residual = {});

}  // namespace encore::ref
