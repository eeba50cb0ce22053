// The megakernel at two blocks per SM (MegakernelOptions::blocks_per_sm = 2): this unit is
// compiled with at most 128 registers per thread, so that two 256-thread blocks fit an SM's
// register file (kernel.cuh; pipeline/sources.cmake).
#define ENCORE_MEGAKERNEL_BLOCKS_PER_SM 2  // compiled at -maxrregcount=128 (pipeline/sources.cmake)
#include "pipeline/megakernel/kernel.cuh"

namespace encore::pipeline::megakernel {

const void* kernel_two_per_sm(int tokens) { return megakernel_for_tokens<2>(tokens); }

}  // namespace encore::pipeline::megakernel
