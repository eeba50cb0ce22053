// The stage table on fake arena bases: count and order (docs/model.md §4), GEMV shapes against the
// config, every pointer inside its arena, and the ops' host-side validators on every stage.
#include <encore/pipeline/stage_list.h>

#include <algorithm>
#include <cstring>
#include <map>

#include <encore/pipeline/weight_layout.h>

#include "test_util.h"

namespace encore::pipeline {
namespace {

// Never dereferenced: well apart, 4 KiB aligned.
void* fake(std::uintptr_t tb) { return reinterpret_cast<void*>(tb << 40); }

struct Built {
  ModelConfig config;
  BufferOptions options;
  TensorArena weights, buffers, state;
  ArenaBases bases{fake(1), fake(2), fake(3)};
  std::vector<Stage> stages;

  explicit Built(ModelConfig c, int batch = 0, int max_batch = 16) : config(std::move(c)) {
    options.max_batch = max_batch, options.max_slots = 8, options.max_pages = 32, options.max_pages_per_seq = 16;
    options.mla_num_parts = 132;
    throw_if_error(build_weight_layout(config, weights));
    throw_if_error(build_buffer_layout(config, options, buffers));
    throw_if_error(build_state_layout(config, options, state));
    throw_if_error(build_stage_list(inputs(batch), stages));
  }
  StageListInputs inputs(int batch) const { return {&config, &options, &weights, &buffers, &state, bases, batch}; }
};

using R = StageRole;

std::vector<R> layer_roles(const ModelConfig& c, int l) {
  std::vector<R> roles;
  if (c.attention[l] == Attention::kKda) {
    roles = {R::kKdaInProj, R::kKda, R::kKdaOutProj};
  } else {
    roles = {R::kMlaInProj};
    if (c.mla.q_lora_rank) roles.push_back(R::kMlaQB);
    for (R r : {R::kMlaQAbsorb, R::kMlaKvAppend, R::kMlaSplitKv, R::kMlaCombine, R::kMlaVUp, R::kMlaOutProj}) roles.push_back(r);
  }
  if (c.mlp[l] == Mlp::kDense)
    for (R r : {R::kDenseGateUp, R::kDenseDown}) roles.push_back(r);
  else
    for (R r : {R::kMoeRouter, R::kMoeExperts}) roles.push_back(r);
  return roles;
}

// The expected table: embed, the scheduler (if any MLA layer), layers, LM head.
std::vector<std::pair<R, int>> expected_order(const ModelConfig& c) {
  std::vector<std::pair<R, int>> out = {{R::kEmbed, -1}};
  if (std::count(c.attention.begin(), c.attention.end(), Attention::kMla) > 0) out.push_back({R::kMlaSched, -1});
  for (int l = 0; l < c.layers(); ++l)
    for (R r : layer_roles(c, l)) out.push_back({r, l});
  out.push_back({R::kLmHead, -1});
  return out;
}

TEST(StageList, KimiCountMatchesModelMd) {
  const Built b(ModelConfig::kimi_linear_48b());
  // 1 embed + 20 x 3 KDA + 1 scheduler + 7 x 7 MLA + 2 dense + 26 x 2 MoE (router, experts; the
  // RMSNorm fused into both) + 1 head = 166 launcher calls; the scheduler joins the gather and
  // kv_append joins q_absorb, so 158 dependency levels (docs/model.md §4).
  EXPECT_EQ(b.stages.size(), 166u);
  EXPECT_EQ(dependency_levels(b.stages), 158);
}

TEST(StageList, OrderPerLayer) {
  for (const ModelConfig& c : {ModelConfig::kimi_linear_48b(), ModelConfig::tiny(false), ModelConfig::tiny(true)}) {
    const Built b(c);
    const auto expected = expected_order(c);
    ASSERT_EQ(b.stages.size(), expected.size()) << c.name;
    for (std::size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(b.stages[i].role, expected[i].first) << c.name << " stage " << i;
      EXPECT_EQ(b.stages[i].layer, expected[i].second) << c.name << " stage " << i;
      EXPECT_EQ(b.stages[i].joins_previous, expected[i].first == R::kMlaKvAppend || expected[i].first == R::kMlaSched)
          << c.name << " stage " << i;
    }
  }
}

// (n, k) of every Q4_K GEMV from the config, independent of the builder.
std::pair<std::int64_t, std::int64_t> expected_gemv(const ModelConfig& c, R role) {
  const std::int64_t d = c.hidden, kda_p = std::int64_t(c.kda.heads) * c.kda.head_dim;
  const MlaConfig& m = c.mla;
  const std::int64_t q_width = std::int64_t(m.heads) * (m.nope_dim + m.rope_dim);
  switch (role) {
    case R::kKdaInProj: return {3 * kda_p + 2 * c.kda.gate_rank + c.kda.heads, d};
    case R::kKdaOutProj: return {d, kda_p};
    case R::kMlaInProj: return {(m.q_lora_rank ? m.q_lora_rank : q_width) + m.kv_lora_rank + m.rope_dim, d};
    case R::kMlaQB: return {q_width, m.q_lora_rank};
    case R::kMlaOutProj: return {d, std::int64_t(m.heads) * m.v_dim};
    case R::kDenseGateUp: return {c.dense_width, d};
    case R::kDenseDown: return {d, c.dense_width};
    case R::kLmHead: return {c.vocab, d};
    default: return {0, 0};
  }
}

struct GemvView {
  const q4k::Block* w[2];
  std::int64_t n, k;
  int batch;
};
bool gemv_view(const Stage& s, GemvView& v) {
  const StageParams& p = s.params;
  switch (s.kind) {
    case StageKind::kRmsNormGemv: v = {{p.rms_gemv.weight, nullptr}, p.rms_gemv.n, p.rms_gemv.k, p.rms_gemv.batch}; return true;
    case StageKind::kGemv: v = {{p.gemv.weight, nullptr}, p.gemv.n, p.gemv.k, p.gemv.batch}; return true;
    case StageKind::kGateUpGemv: v = {{p.gate_up.gate, p.gate_up.up}, p.gate_up.n, p.gate_up.k, p.gate_up.batch}; return true;
    default: return false;
  }
}

TEST(StageList, GemvShapesAndWeightsFollowTheConfig) {
  // Kimi in-proj widths quoted by docs/model.md §4.
  EXPECT_EQ(expected_gemv(ModelConfig::kimi_linear_48b(), R::kKdaInProj).first, 12576);
  EXPECT_EQ(expected_gemv(ModelConfig::kimi_linear_48b(), R::kMlaInProj).first, 6720);
  for (const ModelConfig& c : {ModelConfig::kimi_linear_48b(), ModelConfig::tiny(false), ModelConfig::tiny(true)}) {
    const Built b(c);
    const auto w0 = reinterpret_cast<std::uintptr_t>(b.bases.weights);
    int gemvs = 0;
    for (const Stage& s : b.stages) {
      GemvView v{};
      if (!gemv_view(s, v)) continue;
      ++gemvs;
      EXPECT_EQ(std::make_pair(v.n, v.k), expected_gemv(c, s.role)) << c.name << " layer " << s.layer << " role " << int(s.role);
      EXPECT_EQ(v.batch, 16);
      for (const q4k::Block* w : v.w) {
        if (!w) continue;
        // Starts at a named tensor, and its n rows stay inside the weight arena.
        const auto at = std::int64_t(reinterpret_cast<std::uintptr_t>(w) - w0);
        bool named = false;
        for (const TensorInfo& t : b.weights.tensors()) named |= t.offset == at && t.dtype == DType::kQ4K;
        EXPECT_TRUE(named) << c.name << " layer " << s.layer;
        EXPECT_LE(at + v.n * q4k::row_bytes(v.k), b.weights.total_bytes());
      }
    }
    const int mla_gemvs = c.mla.q_lora_rank ? 3 : 2;
    EXPECT_EQ(gemvs, 2 * c.count(Attention::kKda) + mla_gemvs * c.count(Attention::kMla) + 2 * c.count(Mlp::kDense) + 1);
  }
}

// Every device pointer of a stage (null ones skipped by the caller).
std::vector<const void*> pointers(const Stage& s) {
  const StageParams& p = s.params;
  switch (s.kind) {
    case StageKind::kEmbed: return {p.embed.table, p.embed.token_ids, p.embed.x};
    case StageKind::kRmsNormGemv: {
      const auto& g = p.rms_gemv;
      return {g.weight, g.x, g.gamma, g.y, g.residual, g.normalized};
    }
    case StageKind::kGemv: return {p.gemv.weight, p.gemv.x, p.gemv.y, p.gemv.residual};
    case StageKind::kGateUpGemv: return {p.gate_up.gate, p.gate_up.up, p.gate_up.x, p.gate_up.gamma, p.gate_up.h, p.gate_up.up_out};
    case StageKind::kKda: {
      const auto& k = p.kda;
      return {k.proj, k.slot_ids, k.y, k.conv_weight, k.A_log, k.dt_bias, k.f_b_weight, k.g_b_weight, k.o_norm_weight,
              k.conv_state, k.recurrent_state, k.host_slot_ids, k.error_flag};
    }
    case StageKind::kMlaSched: {
      const auto& m = p.mla_sched;
      return {m.seq_lens, m.positions, m.cache.pages, m.cache.block_table, m.part_plans, m.num_splits, m.error_flag};
    }
    case StageKind::kMlaQAbsorb: return {p.mla_q_absorb.q, p.mla_q_absorb.kv_b, p.mla_q_absorb.positions, p.mla_q_absorb.q576};
    case StageKind::kMlaKvAppend: {
      const auto& a = p.mla_kv_append;
      return {a.kv_a, a.norm_weight, a.positions, a.seq_lens, a.cache.pages, a.cache.block_table, a.error_flag};
    }
    case StageKind::kMlaSplitKv:
    case StageKind::kMlaCombine: {
      const auto& t = p.mla_attention;
      return {t.q576, t.cache.pages, t.cache.block_table, t.seq_lens, t.part_plans, t.num_splits, t.error_flag,
              t.o_lat, t.lse, t.partial_o, t.partial_lse};
    }
    case StageKind::kMlaVUp: return {p.mla_v_up.o_lat, p.mla_v_up.kv_b, p.mla_v_up.out};
    case StageKind::kMoeRouter: {
      const auto& r = p.moe_router;
      return {r.weight, r.bias, r.h, r.norm_weight, r.topk_ids, r.topk_weights, r.logits, r.slot_ids, r.workspace};
    }
    case StageKind::kMoeExperts: {
      const auto& e = p.moe_experts;
      return {e.gate, e.up, e.down, e.h, e.norm_weight, e.x, e.topk_ids, e.topk_weights, e.slot_ids, e.workspace, e.error_flag};
    }
  }
  return {};
}

TEST(StageList, EveryPointerInsideItsArena) {
  for (const ModelConfig& c : {ModelConfig::kimi_linear_48b(), ModelConfig::tiny(false), ModelConfig::tiny(true)}) {
    const Built b(c);
    const std::pair<const void*, std::int64_t> arenas[] = {{b.bases.weights, b.weights.total_bytes()},
                                                           {b.bases.buffers, b.buffers.total_bytes()},
                                                           {b.bases.state, b.state.total_bytes()}};
    int checked = 0;
    for (std::size_t i = 0; i < b.stages.size(); ++i)
      for (const void* ptr : pointers(b.stages[i])) {
        if (!ptr) continue;
        const auto a = reinterpret_cast<std::uintptr_t>(ptr);
        bool inside = false;
        for (const auto& [base, bytes] : arenas) {
          const auto lo = reinterpret_cast<std::uintptr_t>(base);
          inside |= a >= lo && a < lo + std::uintptr_t(bytes);
        }
        EXPECT_TRUE(inside) << c.name << " stage " << i << " pointer " << ptr;
        ++checked;
      }
    EXPECT_GT(checked, int(b.stages.size()));
  }
}

// The weight bytes each stage reads, from the op contracts in ops/*.h (not from the layout).
std::vector<std::pair<const void*, std::int64_t>> weight_spans(const Stage& s, const ModelConfig& c) {
  const StageParams& p = s.params;
  const std::int64_t H = c.kda.heads, D = c.kda.head_dim, P = H * D, R = c.kda.gate_rank;
  const std::int64_t kv_b = std::int64_t(c.mla.heads) * ops::kMlaKvbRowsPerHead * ops::kMlaLatentDim * 2;
  switch (s.kind) {
    case StageKind::kEmbed: return {{p.embed.table, std::int64_t(p.embed.vocab) * p.embed.hidden * 2}};
    case StageKind::kRmsNormGemv: {
      const auto& g = p.rms_gemv;
      return {{g.weight, g.n * q4k::row_bytes(g.k)}, {g.gamma, g.k * 4}};
    }
    case StageKind::kGemv: return {{p.gemv.weight, p.gemv.n * q4k::row_bytes(p.gemv.k)}};
    case StageKind::kGateUpGemv: {
      const auto& g = p.gate_up;
      return {{g.gate, g.n * q4k::row_bytes(g.k)}, {g.up, g.n * q4k::row_bytes(g.k)}, {g.gamma, g.k * 4}};
    }
    case StageKind::kKda: {
      const auto& k = p.kda;
      return {{k.conv_weight, 3 * P * ops::kKdaConvTaps * 4}, {k.A_log, H * 4}, {k.dt_bias, P * 4},
              {k.f_b_weight, P * R * 2}, {k.g_b_weight, P * R * 2}, {k.o_norm_weight, D * 4}};
    }
    case StageKind::kMlaQAbsorb: return {{p.mla_q_absorb.kv_b, kv_b}};
    case StageKind::kMlaVUp: return {{p.mla_v_up.kv_b, kv_b}};
    case StageKind::kMlaKvAppend: return {{p.mla_kv_append.norm_weight, ops::kMlaLatentDim * 4}};
    case StageKind::kMoeRouter: {
      const auto& r = p.moe_router;
      return {{r.weight, std::int64_t(r.config.num_experts) * r.hidden * 2}, {r.bias, r.bias ? r.config.num_experts * 4 : 0},
              {r.norm_weight, r.hidden * 4}};
    }
    case StageKind::kMoeExperts: {
      const auto& e = p.moe_experts;
      const std::int64_t stack = std::int64_t(e.num_experts + e.num_shared) * q4k::row_bytes(e.hidden) * e.inter;
      return {{e.gate, stack}, {e.up, stack}, {e.down, stack}, {e.norm_weight, e.hidden * 4}};
    }
    default: return {};
  }
}

// Every weight byte is read by some stage, and every read starts and ends on tensor boundaries:
// no tensor is forgotten, no GEMV runs past its rows.
TEST(StageList, StagesReadEveryWeightTensorOnItsBoundaries) {
  for (const ModelConfig& c : {ModelConfig::kimi_linear_48b(), ModelConfig::tiny(false), ModelConfig::tiny(true)}) {
    const Built b(c);
    const auto w0 = reinterpret_cast<std::uintptr_t>(b.bases.weights);
    std::map<std::int64_t, std::int64_t> starts, ends;  // tensor offset -> end, tensor end -> offset
    for (const TensorInfo& t : b.weights.tensors()) starts[t.offset] = t.offset + t.bytes, ends[t.offset + t.bytes] = t.offset;
    std::map<std::int64_t, int> reads;  // tensor offset -> spans starting there
    for (const Stage& s : b.stages)
      for (const auto& [ptr, bytes] : weight_spans(s, c)) {
        if (!ptr) continue;
        const auto at = std::int64_t(reinterpret_cast<std::uintptr_t>(ptr) - w0);
        EXPECT_TRUE(starts.count(at)) << c.name << " layer " << s.layer << ": a read starts inside a tensor";
        EXPECT_TRUE(ends.count(at + bytes)) << c.name << " layer " << s.layer << ": a read ends inside a tensor";
        for (auto it = starts.find(at); it != starts.end() && it->first < at + bytes; ++it) ++reads[it->first];
      }
    for (const TensorInfo& t : b.weights.tensors()) EXPECT_GT(reads[t.offset], 0) << c.name << " " << t.name << " is never read";
  }
}

TEST(StageList, KimiStagesPassTheOpValidators) {
  const Built b(ModelConfig::kimi_linear_48b());
  for (std::size_t i = 0; i < b.stages.size(); ++i) {
    const Status st = validate_stage(b.stages[i]);
    EXPECT_TRUE(st.ok()) << "stage " << i << " (layer " << b.stages[i].layer << "): " << st.to_string();
  }
}

// The MLA op supports 8..128 heads (mla_validate.cpp), so tiny() uses 8 (docs/model.md §6). With 2 heads the MLA stages fail validation, precisely and only on the head count.
TEST(StageList, TinyMlaHeadsAreWhatTheMlaOpSupports) {
  for (bool rope : {false, true}) {
    const Built ok(ModelConfig::tiny(rope), 3);
    EXPECT_EQ(ModelConfig::tiny(rope).mla.heads, 8);
    for (const Stage& s : ok.stages) EXPECT_TRUE(validate_stage(s).ok()) << validate_stage(s).to_string();

    ModelConfig two_heads = ModelConfig::tiny(rope);
    two_heads.mla.heads = 2;
    const Built two(two_heads, 3);
    std::map<StageKind, int> failures;
    for (const Stage& s : two.stages) {
      const Status st = validate_stage(s);
      if (!st.ok()) {
        ++failures[s.kind];
        EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
      }
    }
    // Per MLA layer: q_absorb, splitkv, combine, v_up check the head count (sched / append do not).
    EXPECT_EQ(failures.size(), 4u);
    for (const auto& [kind, n] : failures) EXPECT_EQ(n, 2) << int(kind);
  }
}

TEST(StageList, SmallerBatchKeepsMaxBatchSizing) {
  const Built b(ModelConfig::kimi_linear_48b(), 3);
  for (const Stage& s : b.stages) {
    if (s.kind == StageKind::kMoeExperts) {
      EXPECT_EQ(s.params.moe_experts.batch, 3);
      EXPECT_EQ(s.params.moe_experts.max_batch, 16);  // the workspace is sized for 16
    }
    if (s.kind == StageKind::kKda) EXPECT_EQ(s.params.kda.batch, 3);
    if (s.kind == StageKind::kMlaSplitKv) EXPECT_EQ(s.params.mla_attention.batch, 3);
  }
}

// A GEMV stage's output rows, their stride, and the residual it adds (null if none).
const float* output(const Stage& t) {
  return t.kind == StageKind::kRmsNormGemv ? t.params.rms_gemv.y : t.kind == StageKind::kGemv ? t.params.gemv.y : t.params.gate_up.h;
}
std::int64_t output_stride(const Stage& t, std::int64_t n) {
  const std::int64_t s = t.kind == StageKind::kRmsNormGemv ? t.params.rms_gemv.y_stride
                         : t.kind == StageKind::kGemv      ? t.params.gemv.y_stride
                                                           : t.params.gate_up.h_stride;
  return s ? s : n;
}
const float* residual(const Stage& t) {
  return t.kind == StageKind::kRmsNormGemv ? t.params.rms_gemv.residual : t.kind == StageKind::kGemv ? t.params.gemv.residual : nullptr;
}

// Beyond 16 rows every Q4_K GEMV becomes stages of gemv_stage_rows rows (32 where the fp16 core's
// wide tier takes its K and matrices, else 16; a last stage of 16 where the padded rows end), the
// later ones joining the first; nothing else changes.
TEST(StageList, BatchesBeyondSixteenRowsRunTheGemvsInStages) {
  const Built one(ModelConfig::kimi_linear_48b());
  for (int batch : {17, 40, 64}) {
    SCOPED_TRACE(batch);
    const Built b(ModelConfig::kimi_linear_48b(), batch, batch);  // max_batch = batch: the padding must cover the last stage
    const int rows = int(gemv_rows(batch));
    std::size_t j = 0;  // the one-stage table's stage this one comes from
    int wide = 0;       // GEMVs in 32-row stages
    for (std::size_t i = 0; i < b.stages.size(); ++i, ++j) {
      const Stage& s = b.stages[i];
      const Status st = validate_stage(s);
      EXPECT_TRUE(st.ok()) << "stage " << i << ": " << st.to_string();
      GemvView v;
      if (!gemv_view(s, v)) {
        EXPECT_EQ(s.role, one.stages[j].role) << i;
        continue;
      }
      const int per = gemv_stage_rows(v.k, v.w[1] ? 2 : 1, ops::GemvCore::kAuto);
      EXPECT_EQ(per, v.k <= 2304 && !v.w[1] ? 32 : 16) << "stage " << i;
      wide += per == 32;
      auto input = [](const Stage& t) {
        return t.kind == StageKind::kRmsNormGemv ? t.params.rms_gemv.x : t.kind == StageKind::kGemv ? t.params.gemv.x : t.params.gate_up.x;
      };
      const int chunks = (rows + per - 1) / per;
      for (int c = 0; c < chunks; ++c) {
        ASSERT_LT(i + c, b.stages.size());
        const Stage& t = b.stages[i + c];
        ASSERT_EQ(t.role, one.stages[j].role) << i + c;
        EXPECT_EQ(t.joins_previous, c > 0);
        GemvView w;
        ASSERT_TRUE(gemv_view(t, w));
        const int first = c * per;
        EXPECT_EQ(w.batch, std::min(per, rows - first));
        EXPECT_EQ(w.batch % 16, 0);
        EXPECT_EQ(w.w[0], v.w[0]);
        const std::int64_t stride = t.kind == StageKind::kRmsNormGemv && t.params.rms_gemv.x_stride ? t.params.rms_gemv.x_stride : w.k;
        EXPECT_EQ(input(t), input(s) + std::int64_t(first) * stride) << "stage " << i + c;
        // Its output rows (and the residual they add, read in place) start `first` rows on, and
        // its rows end inside the step arena (the GEMV buffers have gemv_rows rows).
        const float* y = output(t);
        const std::int64_t y_stride = output_stride(t, w.n);
        EXPECT_EQ(y, output(s) + std::int64_t(first) * y_stride) << "stage " << i + c;
        EXPECT_EQ(residual(t), residual(s) ? residual(s) + std::int64_t(first) * y_stride : nullptr) << "stage " << i + c;
        if (t.kind == StageKind::kGemv && t.params.gemv.residual) EXPECT_EQ(residual(t), y) << "stage " << i + c;
        const auto end = reinterpret_cast<std::uintptr_t>(y + (w.batch - 1) * y_stride + w.n);
        EXPECT_LE(end, reinterpret_cast<std::uintptr_t>(b.bases.buffers) + std::uintptr_t(b.buffers.total_bytes())) << "stage " << i + c;
      }
      i += chunks - 1;
    }
    EXPECT_EQ(j, one.stages.size());
    EXPECT_EQ(dependency_levels(b.stages), 158);
    // Of Kimi's 57 GEMVs a step, the KDA and MLA in-projections (20 + 7) and the head take
    // K = 2304 with one matrix; the out-projections (K = 4096) and the dense MLP do not.
    EXPECT_EQ(wide, 28);
  }
  const Built a(ModelConfig::tiny(true), 40, 40), again(ModelConfig::tiny(true), 40, 40);
  ASSERT_EQ(a.stages.size(), again.stages.size());
  EXPECT_EQ(std::memcmp(a.stages.data(), again.stages.data(), a.stages.size() * sizeof(Stage)), 0);  // bytes, padding included
}

// The table is copied to the device as bytes (graph nodes, megakernel): the same inputs must give
// the same bytes, padding included.
TEST(StageList, TableBytesAreDeterministic) {
  const Built a(ModelConfig::tiny(true));
  const Built b(ModelConfig::tiny(true));
  ASSERT_EQ(a.stages.size(), b.stages.size());
  EXPECT_EQ(std::memcmp(a.stages.data(), b.stages.data(), a.stages.size() * sizeof(Stage)), 0);
  EXPECT_LE(sizeof(Stage), 256u);  // small enough for a per-stage kernel argument / table row
}

// The options' GEMV core reaches every stage, which both paths read it from; a core outside the
// enum is refused with the buffers.
TEST(StageList, GemvCoreReachesEveryStage) {
  Built b(ModelConfig::kimi_linear_48b());
  for (const Stage& s : b.stages) EXPECT_EQ(s.gemv_core, ops::GemvCore::kAuto);
  b.options.gemv_core = ops::GemvCore::kMmaF16;
  throw_if_error(build_stage_list(b.inputs(16), b.stages));
  for (const Stage& s : b.stages) EXPECT_EQ(s.gemv_core, ops::GemvCore::kMmaF16);
  b.options.gemv_core = ops::GemvCore(7);
  EXPECT_EQ(validate(b.options).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(build_stage_list(b.inputs(16), b.stages).code(), StatusCode::kInvalidArgument);
}

// The MLA split plan's parts and fewest units a part come from the options, into the one
// scheduler stage that both paths run (the plan decides the partials' merge order, so the bits).
TEST(StageList, MlaSplitPlanOptionsReachTheScheduler) {
  Built b(ModelConfig::kimi_linear_48b());
  auto scheduler = [&b]() -> ops::MlaSchedParams {
    const auto is_sched = [](const Stage& s) { return s.kind == StageKind::kMlaSched; };
    EXPECT_EQ(std::count_if(b.stages.begin(), b.stages.end(), is_sched), 1);
    const auto it = std::find_if(b.stages.begin(), b.stages.end(), is_sched);
    return it == b.stages.end() ? ops::MlaSchedParams{} : it->params.mla_sched;  // (a failure above)
  };
  EXPECT_EQ(scheduler().num_parts, 132);
  EXPECT_EQ(scheduler().min_part_units, 1);
  b.options.mla_num_parts = 66, b.options.mla_min_part_units = 3;
  throw_if_error(build_stage_list(b.inputs(16), b.stages));
  EXPECT_EQ(scheduler().num_parts, 66);
  EXPECT_EQ(scheduler().min_part_units, 3);
  b.options.mla_min_part_units = 0;
  EXPECT_EQ(build_stage_list(b.inputs(16), b.stages).code(), StatusCode::kInvalidArgument);
}

TEST(StageList, InputsAreChecked) {
  Built b(ModelConfig::tiny());
  std::vector<Stage> stages;
  StageListInputs in = b.inputs(17);
  EXPECT_EQ(build_stage_list(in, stages).code(), StatusCode::kOutOfRange);
  in = b.inputs(0);
  in.bases.state = nullptr;
  EXPECT_EQ(build_stage_list(in, stages).code(), StatusCode::kNullPointer);
  in = b.inputs(0);
  TensorArena empty;
  in.state = &empty;  // a layout from another config: the missing tensor is named (the scheduler's
                      // cache, the first state tensor the table needs)
  const Status st = build_stage_list(in, stages);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("blk.2.mla_cache"), std::string::npos) << st.to_string();
  EXPECT_TRUE(stages.empty());
}

}  // namespace
}  // namespace encore::pipeline
