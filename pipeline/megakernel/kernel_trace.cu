// The megakernel at one block per SM with the bodies' marks, for traced launches
// (MegakernelOptions::trace): a unit of its own, so that the bodies of a normal launch carry none of
// the marks' code or registers (kernel.cuh).
#define ENCORE_MEGAKERNEL_MARKS 1
#include "pipeline/megakernel/kernel.cuh"

namespace encore::pipeline::megakernel {

const void* kernel_with_marks(int tokens) { return megakernel_for_tokens<1>(tokens); }

}  // namespace encore::pipeline::megakernel
