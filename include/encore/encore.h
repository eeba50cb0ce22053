// Umbrella header: the whole public API of encore.
#pragma once

#include <encore/device.h>
#include <encore/gguf.h>
#include <encore/graphs/decode_graph.h>
#include <encore/ops/kda.h>
#include <encore/ops/mla.h>
#include <encore/ops/moe.h>
#include <encore/ops/q4k_gemv.h>
#include <encore/pipeline/buffer_layout.h>
#include <encore/pipeline/decode_step.h>
#include <encore/pipeline/gguf_model.h>
#include <encore/pipeline/megakernel.h>
#include <encore/pipeline/model_config.h>
#include <encore/pipeline/pipeline.h>
#include <encore/pipeline/random_weights.h>
#include <encore/pipeline/stage_list.h>
#include <encore/pipeline/stage_params.h>
#include <encore/pipeline/tensor_arena.h>
#include <encore/pipeline/weight_layout.h>
#include <encore/q4k.h>
#include <encore/ref/kda.h>
#include <encore/ref/mla.h>
#include <encore/ref/moe.h>
#include <encore/ref/pipeline.h>
#include <encore/ref/q4k_gemv.h>
#include <encore/status.h>
