// KDA decode step, Kimi-Linear dims (H = 32, K = V = 128, gate rank 128), graph-replayed with the
// state pools rotated beyond L2 (cold state, as in the real model). Bytes per step (docs/kda.md §7):
// recurrent state read + write, conv state read + write, proj row in, y out; % of the measured
// copy bandwidth (read + write roof).
//   BM_KdaFused          the op (one kernel), no device slot check (caller-validated ids)
//   BM_KdaFusedChecked   the op with error_flag: slot-check kernel + the op
//   BM_KdaUnfused        conv kernel -> gates + recurrence kernel -> gated-norm kernel, same math
//   BM_KdaFusedSettled   the op with state_settled (states loaded before the PDL wait, as in a decode step)
//   BM_KdaProbe*         the op's state traffic without its math (ceilings of the memory pattern):
//                        Registers(3) = the op's tile shape at 2 (3) blocks per SM, Stream = row by row,
//                        Split4 = a quarter head per tile (4x the tiles), Flat = no tiles (grid-stride)
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include <encore/ops/kda.h>

#include "bench_util.h"
#include "common/launch.h"
#include "kda/kda_tile.cuh"

namespace encore::bench {
namespace {

constexpr int kHeads = 32, kHeadDim = 128, kRank = 128;

std::uint16_t bf16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

struct KdaBenchSetup {
  int batch, copies, num_slots;
  std::unique_ptr<DeviceMemory> weights, pools, step;
  ops::KdaParams params;
  int* slot_table;  // [copies][batch]: call i uses row i % copies (disjoint slots per row)
  float *qkv_ws, *o_ws, *gate_ws;  // unfused chain intermediates

  static std::size_t state_bytes_per_seq() {
    return 4 * (ops::kda_recurrent_state_floats_per_slot(kHeads, kHeadDim) +
                ops::kda_conv_state_floats_per_slot(kHeads, kHeadDim));
  }
  double bytes_per_step() const {
    const double P = double(kHeads) * kHeadDim;
    return batch * (2.0 * state_bytes_per_seq() + 4.0 * (ops::kda_proj_width(params) + P));
  }

  explicit KdaBenchSetup(int b) : batch(b) {
    copies = rotation_count(std::size_t(batch) * state_bytes_per_seq());
    num_slots = batch * copies;
    ops::KdaParams& p = params;
    p.batch = batch, p.num_heads = kHeads, p.head_dim = kHeadDim, p.gate_rank = kRank, p.num_slots = num_slots;
    p.proj_stride = (ops::kda_proj_width(p) + 3) / 4 * 4;
    const std::int64_t P = std::int64_t(kHeads) * kHeadDim;

    const std::size_t conv_w = 3 * P * 4, fb = P * kRank;
    weights = std::make_unique<DeviceMemory>(4 * (conv_w + kHeads + P + kHeadDim) + 2 * 2 * fb + 256);
    float* w = weights->as<float>();
    float* conv_weight = w;
    float* A_log = conv_weight + conv_w;
    float* dt_bias = A_log + 64;  // keep 16-byte alignment
    float* o_norm = dt_bias + P;
    auto* f_b = reinterpret_cast<std::uint16_t*>(o_norm + kHeadDim);
    auto* g_b = f_b + fb;
    fill_random_floats(conv_weight, conv_w, 11, -0.5f, 0.5f);
    fill_random_floats(A_log, kHeads, 12, 0.f, 2.77f);     // ln U(1, 16)
    fill_random_floats(dt_bias, P, 13, -6.9f, -2.25f);     // softplus^-1 of dt in [1e-3, 1e-1]
    fill_random_floats(o_norm, kHeadDim, 14, 0.5f, 1.5f);
    std::vector<std::uint16_t> host(2 * fb);
    std::uint64_t lcg = 15;
    for (auto& x : host) {
      lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
      x = bf16_bits((float(lcg >> 40) / float(1 << 24) - 0.5f) * 0.3f);
    }
    BENCH_CUDA(cudaMemcpy(f_b, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    p.conv_weight = conv_weight, p.A_log = A_log, p.dt_bias = dt_bias, p.o_norm_weight = o_norm;
    p.f_b_weight = reinterpret_cast<const __nv_bfloat16*>(f_b);
    p.g_b_weight = reinterpret_cast<const __nv_bfloat16*>(g_b);

    const std::size_t rec = std::size_t(num_slots) * ops::kda_recurrent_state_floats_per_slot(kHeads, kHeadDim);
    const std::size_t conv = std::size_t(num_slots) * ops::kda_conv_state_floats_per_slot(kHeads, kHeadDim);
    pools = std::make_unique<DeviceMemory>(4 * (rec + conv));
    p.recurrent_state = pools->as<float>();
    p.conv_state = p.recurrent_state + rec;
    fill_random_floats(p.recurrent_state, rec, 16, -0.05f, 0.05f);
    fill_random_floats(p.conv_state, conv, 17, -1.f, 1.f);

    const std::size_t proj = std::size_t(batch) * p.proj_stride;
    // proj | y [B][P] | qkv_ws [B][3P] | o_ws [B][P] | gate_ws [B][P] | slot table | error flag
    step = std::make_unique<DeviceMemory>(4 * (proj + 6 * batch * P + num_slots + 4));
    float* s = step->as<float>();
    p.proj = s;
    p.y = s + proj;
    qkv_ws = p.y + batch * P;
    o_ws = qkv_ws + 3 * batch * P;
    gate_ws = o_ws + batch * P;
    slot_table = reinterpret_cast<int*>(gate_ws + batch * P);
    p.error_flag = slot_table + num_slots;
    fill_random_floats(s, proj, 18, -1.f, 1.f);
    std::vector<int> ids(num_slots);
    for (int i = 0; i < num_slots; ++i) ids[i] = i;
    BENCH_CUDA(cudaMemcpy(slot_table, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemset(p.error_flag, 0, 4));
    BENCH_CUDA(cudaDeviceSynchronize());
  }
};

// ---- unfused chain (bench-only comparison) ------------------------------------------------------

// Dot product of one bf16 weight row (global or shared) with a shared fp32 vector, by the 16 lanes
// of a half-warp (each lane takes 8-value chunks lane16, lane16 + 16, ...); every lane of the half
// gets the sum.
__device__ __forceinline__ float half_warp_dot_bf16(const __nv_bfloat16* row, const float* vec, int rank,
                                                    int lane16) {
  float acc = 0.f;
  for (int c = lane16; c < rank / 8; c += 16) {
    const uint4 raw = reinterpret_cast<const uint4*>(row)[c];
    const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    const float* x = vec + 8 * c;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      // bf16 -> fp32 is a 16-bit shift (exact).
      acc = fmaf(__uint_as_float(words[w] << 16), x[2 * w], acc);
      acc = fmaf(__uint_as_float(words[w] & 0xffff0000u), x[2 * w + 1], acc);
    }
  }
#pragma unroll
  for (int m = 8; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  return acc;
}


__global__ void unfused_conv_kernel(ops::KdaParams p, float* qkv_ws) {
  const std::int64_t P = std::int64_t(p.num_heads) * p.head_dim, C = 3 * P;
  device::wait_for_upstream();
  device::allow_downstream();
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < p.batch * C;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const int row = int(i / C);
    const std::int64_t ch = i - row * C;
    const int slot = p.slot_ids[row];
    if (slot < 0) continue;
    float* hist = p.conv_state + std::int64_t(slot) * 3 * C;
    const float h0 = hist[ch], h1 = hist[C + ch], h2 = hist[2 * C + ch], xt = p.proj[row * p.proj_stride + ch];
    const float4 w = reinterpret_cast<const float4*>(p.conv_weight)[ch];
    const float conv = w.x * h0 + w.y * h1 + w.z * h2 + w.w * xt;
    qkv_ws[i] = conv * kda::sigmoid(conv);
    hist[ch] = h1, hist[C + ch] = h2, hist[2 * C + ch] = xt;
  }
}

__global__ void __launch_bounds__(kBlockThreads, 2)
    unfused_recurrence_kernel(ops::KdaParams p, const float* qkv_ws, float* o_ws, float* gate_ws) {
  constexpr int D = kHeadDim, E = 4, R = D / kWarpsPerBlock;
  __shared__ float fa_ga[2 * kRank], alpha[D];
  const int row = blockIdx.x / kHeads, head = blockIdx.x % kHeads, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t P = std::int64_t(kHeads) * D;
  device::wait_for_upstream();
  device::allow_downstream();
  const int slot = p.slot_ids[row];
  if (slot < 0) return;
  float* state = p.recurrent_state + (std::int64_t(slot) * kHeads + head) * D * D;
  kda::LaneVec<E> s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) kda::load_stream(state + (warp * R + r) * D + lane * E, s[r]);
  const float* x = p.proj + row * p.proj_stride;
  for (int t = threadIdx.x; t < 2 * kRank; t += kBlockThreads) fa_ga[t] = x[3 * P + t];
  const float beta = kda::sigmoid(x[3 * P + 2 * kRank + head]);
  const float* qkv = qkv_ws + row * 3 * P;
  kda::LaneVec<E> q, k;
  float qq = 0, kk = 0, kq = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    q.v[e] = qkv[head * D + lane * E + e], k.v[e] = qkv[P + head * D + lane * E + e];
    qq += q.v[e] * q.v[e], kk += k.v[e] * k.v[e], kq += q.v[e] * k.v[e];
  }
  qq = kda::warp_sum(qq), kk = kda::warp_sum(kk), kq = kda::warp_sum(kq);
  const float qf = rsqrtf(float(D)) / sqrtf(qq + 1e-6f), kf = 1.f / sqrtf(kk + 1e-6f);
#pragma unroll
  for (int e = 0; e < E; ++e) q.v[e] *= qf, k.v[e] *= kf;
  kq *= qf * kf;
  __syncthreads();
  const float neg_a = -expf(p.A_log[head]);
  for (int j = 2 * warp + (lane >> 4); j < 2 * D; j += 2 * kWarpsPerBlock) {
    const bool decay = j < D;
    const int jj = decay ? j : j - D;
    const std::int64_t wr = (std::int64_t(head) * D + jj) * kRank;
    const float dot = half_warp_dot_bf16(decay ? p.f_b_weight + wr : p.g_b_weight + wr,
                                                      decay ? fa_ga : fa_ga + kRank, kRank, lane & 15);
    if ((lane & 15) == 0) {
      if (decay)
        alpha[jj] = expf(neg_a * kda::softplus(dot + p.dt_bias[head * D + jj]));
      else
        gate_ws[row * P + head * D + jj] = kda::sigmoid(dot);
    }
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float pv = 0, av = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      s[r].v[e] *= alpha[lane * E + e];
      pv += s[r].v[e] * k.v[e], av += s[r].v[e] * q.v[e];
    }
    pv = kda::warp_sum(pv), av = kda::warp_sum(av);
    const int v = warp * R + r;
    const float u = beta * (qkv[2 * P + head * D + v] - pv);
#pragma unroll
    for (int e = 0; e < E; ++e) s[r].v[e] += k.v[e] * u;
    kda::store_stream(state + v * D + lane * E, s[r]);
    if (lane == 0) o_ws[row * P + head * D + v] = av + kq * u;
  }
}

// Warp per (row, head): y = o * rsqrt(mean(o^2) + eps) * w * gate.
__global__ void unfused_norm_kernel(ops::KdaParams p, const float* o_ws, const float* gate_ws) {
  constexpr int D = kHeadDim;
  const int item = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  device::wait_for_upstream();
  device::allow_downstream();
  if (item >= p.batch * kHeads) return;
  const int row = item / kHeads;
  float* y = p.y + std::int64_t(item) * D;
  if (p.slot_ids[row] < 0) {
    for (int j = lane; j < D; j += 32) y[j] = 0.f;
    return;
  }
  const float4 o = reinterpret_cast<const float4*>(o_ws + std::int64_t(item) * D)[lane];
  const float4 g = reinterpret_cast<const float4*>(gate_ws + std::int64_t(item) * D)[lane];
  const float4 w = reinterpret_cast<const float4*>(p.o_norm_weight)[lane];
  const float inv = 1.f / sqrtf(kda::warp_sum(o.x * o.x + o.y * o.y + o.z * o.z + o.w * o.w) / D + p.norm_eps);
  reinterpret_cast<float4*>(y)[lane] = make_float4(o.x * inv * w.x * g.x, o.y * inv * w.y * g.y,
                                                   o.z * inv * w.z * g.z, o.w * inv * w.w * g.w);
}

// ---- memory-pattern probes (bench-only ceilings) -------------------------------------------------

// The op's memory traffic with no math: per tile, the slot id, the tile's state rows into
// registers (16 rows per warp, as the op), the conv history of its channels, then every value
// written back in place. Split = 1: a tile is a (row, head), at the op's residency (2 blocks per
// SM) or at 3; Split = 4: a quarter of a head's V rows and channels per tile (4 rows per warp, the
// V-split of docs/kda.md §6), 4x the tiles.
template <int MinBlocks, int Split>
__global__ void __launch_bounds__(kBlockThreads, MinBlocks) state_touch_kernel(ops::KdaParams p) {
  constexpr int D = kHeadDim, E = 4, R = D / Split / kWarpsPerBlock, kChannels = 3 * D / Split;
  const int part = blockIdx.x % Split, item = blockIdx.x / Split;
  const int row = item / kHeads, head = item % kHeads, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t P = std::int64_t(kHeads) * D, C = 3 * P;
  const int slot = p.slot_ids[row];
  float* state = p.recurrent_state + (std::int64_t(slot) * kHeads + head) * D * D + part * (D / Split) * D;
  kda::LaneVec<E> s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) kda::load_stream(state + (warp * R + r) * D + lane * E, s[r]);
  float* hist = p.conv_state + std::int64_t(slot) * 3 * C;
  constexpr int kPerThread = (kChannels + kBlockThreads - 1) / kBlockThreads;
  float h[3][kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int c = part * kChannels + threadIdx.x + i * kBlockThreads;
    const std::int64_t ch = (c / D) * P + std::int64_t(head) * D + c % D;
    if (threadIdx.x + i * kBlockThreads < kChannels) h[0][i] = hist[ch], h[1][i] = hist[C + ch], h[2][i] = hist[2 * C + ch];
  }
  device::wait_for_upstream();
  device::allow_downstream();
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int e = 0; e < E; ++e) s[r].v[e] *= 0.999f;
    kda::store_stream(state + (warp * R + r) * D + lane * E, s[r]);
  }
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int c = part * kChannels + threadIdx.x + i * kBlockThreads;
    const std::int64_t ch = (c / D) * P + std::int64_t(head) * D + c % D;
    if (threadIdx.x + i * kBlockThreads < kChannels) hist[ch] = h[1][i], hist[C + ch] = h[2][i], hist[2 * C + ch] = h[0][i];
  }
}

// The same bytes streamed row by row: each warp loads one state row and writes it back before the
// next (a copy-like pattern, many small tiles per SM).
__global__ void __launch_bounds__(kBlockThreads) state_stream_kernel(ops::KdaParams p) {
  constexpr int D = kHeadDim, R = D / kWarpsPerBlock;
  const int row = blockIdx.x / kHeads, head = blockIdx.x % kHeads, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t P = std::int64_t(kHeads) * D, C = 3 * P;
  device::wait_for_upstream();
  device::allow_downstream();
  const int slot = p.slot_ids[row];
  float* state = p.recurrent_state + (std::int64_t(slot) * kHeads + head) * D * D;
#pragma unroll 4
  for (int r = 0; r < R; ++r) {
    kda::LaneVec<4> v;
    kda::load_stream(state + (warp * R + r) * D + lane * 4, v);
#pragma unroll
    for (int e = 0; e < 4; ++e) v.v[e] *= 0.999f;
    kda::store_stream(state + (warp * R + r) * D + lane * 4, v);
  }
  float* hist = p.conv_state + std::int64_t(slot) * 3 * C;
  for (int c = threadIdx.x; c < 3 * D; c += kBlockThreads) {
    const std::int64_t ch = (c / D) * P + std::int64_t(head) * D + c % D;
    const float h0 = hist[ch], h1 = hist[C + ch], h2 = hist[2 * C + ch];
    hist[ch] = h1, hist[C + ch] = h2, hist[2 * C + ch] = h0;
  }
}

// The same bytes with no tile structure: the call's slots are contiguous (slot table rows), so its
// recurrent and conv states are two flat ranges, read and written in place by a grid-stride loop
// with 4 independent float4s in flight per thread (the in-place analogue of the copy roof).
__global__ void __launch_bounds__(kBlockThreads) state_flat_kernel(float4* rec, std::int64_t rec_n, float4* conv,
                                                                     std::int64_t conv_n) {
  device::wait_for_upstream();
  device::allow_downstream();
  const std::int64_t stride = std::int64_t(gridDim.x) * kBlockThreads;
  auto touch = [&](float4* base, std::int64_t n) {
    std::int64_t i = blockIdx.x * std::int64_t(kBlockThreads) + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = __ldcs(base + i + u * stride);
#pragma unroll
      for (int u = 0; u < 4; ++u)
        __stcs(base + i + u * stride, make_float4(v[u].x * 0.999f, v[u].y * 0.999f, v[u].z * 0.999f, v[u].w * 0.999f));
    }
    for (; i < n; i += stride) {
      const float4 v = __ldcs(base + i);
      __stcs(base + i, make_float4(v.x * 0.999f, v.y * 0.999f, v.z * 0.999f, v.w * 0.999f));
    }
  };
  touch(rec, rec_n);
  touch(conv, conv_n);
}

template <class Kernel, class... Args>
void launch_pdl(Kernel kernel, int grid, cudaStream_t stream, Args... args) {
  throw_if_error(detail::launch(kernel, grid, 0, stream, true, "unfused", args...));
}

enum class Variant { kFused, kChecked, kUnfused, kSettled, kProbeRegisters, kProbeRegisters3, kProbeStream, kProbeSplit4, kProbeFlat };

void run(benchmark::State& state, Variant variant) {
  KdaBenchSetup setup(int(state.range(0)));
  const int B = setup.batch;
  const std::int64_t P = std::int64_t(kHeads) * kHeadDim;
  float *o_ws = setup.o_ws, *gate_ws = setup.gate_ws;
  auto enqueue = [&](int i, cudaStream_t stream) {
    ops::KdaParams p = setup.params;
    p.slot_ids = setup.slot_table + (i % setup.copies) * B;
    if (variant != Variant::kChecked) p.error_flag = nullptr;
    // Call i's slots were last written by call i - copies (copies >= 2).
    p.state_settled = variant == Variant::kSettled;
    switch (variant) {
      case Variant::kFused:
      case Variant::kChecked:
      case Variant::kSettled: return throw_if_error(ops::kda(p, stream));
      case Variant::kUnfused: {
        const int conv_blocks = int((B * 3 * P + kBlockThreads - 1) / kBlockThreads);
        launch_pdl(unfused_conv_kernel, conv_blocks, stream, p, setup.qkv_ws);
        launch_pdl(unfused_recurrence_kernel, B * kHeads, stream, p, static_cast<const float*>(setup.qkv_ws), o_ws,
                   gate_ws);
        return launch_pdl(unfused_norm_kernel, (B * kHeads + kWarpsPerBlock - 1) / kWarpsPerBlock, stream, p,
                          static_cast<const float*>(o_ws), static_cast<const float*>(gate_ws));
      }
      // The op's shared memory (66 KiB) is what holds it at 2 blocks per SM; 100 KiB does that here.
      case Variant::kProbeRegisters:
        return throw_if_error(detail::launch(state_touch_kernel<2, 1>, B * kHeads, 100 << 10, stream, true, "probe", p));
      case Variant::kProbeRegisters3: return launch_pdl(state_touch_kernel<3, 1>, B * kHeads, stream, p);
      case Variant::kProbeSplit4: return launch_pdl(state_touch_kernel<3, 4>, 4 * B * kHeads, stream, p);
      case Variant::kProbeStream: return launch_pdl(state_stream_kernel, B * kHeads, stream, p);
      case Variant::kProbeFlat: {
        const std::int64_t rec = ops::kda_recurrent_state_floats_per_slot(kHeads, kHeadDim) / 4;
        const std::int64_t conv = ops::kda_conv_state_floats_per_slot(kHeads, kHeadDim) / 4;
        const std::int64_t slot0 = std::int64_t(i % setup.copies) * B;  // slot table row r holds slots r*B ..
        return launch_pdl(state_flat_kernel, 8 * detail::sm_count(), stream,
                          reinterpret_cast<float4*>(p.recurrent_state) + slot0 * rec, B * rec,
                          reinterpret_cast<float4*>(p.conv_state) + slot0 * conv, B * conv);
      }
    }
  };
  time_graph(state, enqueue, graph_calls(setup.copies), setup.bytes_per_step(), Roof::kCopy);
  state.counters["B"] = B;
}

void BM_KdaFused(benchmark::State& state) { run(state, Variant::kFused); }
void BM_KdaFusedChecked(benchmark::State& state) { run(state, Variant::kChecked); }
void BM_KdaUnfused(benchmark::State& state) { run(state, Variant::kUnfused); }
void BM_KdaFusedSettled(benchmark::State& state) { run(state, Variant::kSettled); }
void BM_KdaProbeRegisters(benchmark::State& state) { run(state, Variant::kProbeRegisters); }
void BM_KdaProbeRegisters3(benchmark::State& state) { run(state, Variant::kProbeRegisters3); }
void BM_KdaProbeStream(benchmark::State& state) { run(state, Variant::kProbeStream); }
void BM_KdaProbeSplit4(benchmark::State& state) { run(state, Variant::kProbeSplit4); }
void BM_KdaProbeFlat(benchmark::State& state) { run(state, Variant::kProbeFlat); }

BENCHMARK(BM_KdaFused)->Arg(1)->Arg(8)->Arg(32)->Arg(64)->Arg(256)->UseManualTime();
BENCHMARK(BM_KdaFusedChecked)->Arg(1)->Arg(64)->UseManualTime();
BENCHMARK(BM_KdaUnfused)->Arg(1)->Arg(64)->UseManualTime();
BENCHMARK(BM_KdaFusedSettled)->Arg(1)->Arg(8)->Arg(32)->Arg(64)->Arg(256)->UseManualTime();
BENCHMARK(BM_KdaProbeRegisters)->Arg(1)->Arg(64)->Arg(256)->UseManualTime();
BENCHMARK(BM_KdaProbeRegisters3)->Arg(1)->Arg(64)->Arg(256)->UseManualTime();
BENCHMARK(BM_KdaProbeStream)->Arg(1)->Arg(64)->Arg(256)->UseManualTime();
BENCHMARK(BM_KdaProbeSplit4)->Arg(1)->Arg(8)->Arg(64)->Arg(256)->UseManualTime();
BENCHMARK(BM_KdaProbeFlat)->Arg(1)->Arg(64)->Arg(256)->UseManualTime();

}  // namespace
}  // namespace encore::bench
