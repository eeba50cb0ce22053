// Shared-memory bank conflicts of the fp16 core's hot loads, computed on the CPU from the layout
// the kernel uses (GemvSmem, f16_value_offset, slot_pitch): a 16-byte load is served in 4 phases
// of 8 lanes, and a phase is conflict-free when its lanes' 16-byte units are distinct modulo 128
// bytes. A layout change that makes these loads conflict fails here, without a GPU.
#include <gtest/gtest.h>

#include <set>

#include "gemv/gemv_params.cuh"

namespace encore::gemv {
namespace {

// Distinct 16-byte bank units per 8-lane phase of a warp's 16-byte loads at `offset(lane)`.
template <class F>
void expect_conflict_free(F&& offset, const char* what) {
  for (int phase = 0; phase < 4; ++phase) {
    std::set<std::int64_t> units;
    for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane) units.insert((offset(lane) % 128) / 16);
    EXPECT_EQ(units.size(), 8u) << what << ", phase " << phase;
  }
}

TEST(Q4kF16Banks, ActivationAndWeightLoadsAreConflictFree) {
  for (int ntok : {8, 16})
    for (int k_blocks : {1, 2, 9, 16}) {
      SCOPED_TRACE(std::to_string(ntok) + " tokens, " + std::to_string(k_blocks) + " K blocks");
      GemvTileParams p{};
      p.mma = p.mma_f16 = true;
      p.k_blocks = p.chunk_blocks = k_blocks;
      p.rows_per_warp = kMmaTileRows, p.slot_blocks = 2, p.slots = 2;
      char* const base = reinterpret_cast<char*>(std::uintptr_t(1) << 20);  // aligned like the kernel's
      const GemvSmem s(base, p, ntok, 1);
      for (int kb = 0; kb < k_blocks; ++kb)
        for (int u = 0; u < 8; ++u)
          for (int nt = 0; nt < ntok / 8; ++nt)  // B: token nt * 8 + g, lane t's 16 bytes of step u
            expect_conflict_free(
                [&](int lane) {
                  return s.f16_values(nt * 8 + lane / 4, kb) + q4k::f16_value_offset(u, lane % 4, 0) - base;
                },
                "activations");
    }
  for (int slot_blocks : {1, 2}) {  // A: rows g and g + 8, bytes 16 + 32t + 16 half of a block
    const int pitch = q4k::slot_pitch(slot_blocks);
    for (int r = 0; r < 2; ++r)
      for (int half = 0; half < 2; ++half)
        for (int jb = 0; jb < slot_blocks; ++jb)
          expect_conflict_free(
              [&](int lane) { return (lane / 4 + 8 * r) * pitch + jb * q4k::kBlockBytes + 16 + 32 * (lane % 4) + 16 * half; },
              "weight words");
  }
}

}  // namespace
}  // namespace encore::gemv
