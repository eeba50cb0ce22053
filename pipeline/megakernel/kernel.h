// Host view of the megakernel's instantiations (kernel.cuh): one per GEMV token tier, so each runs
// the GEMV bodies specialised for its batch, and per resident blocks per SM (1 or 2).
#pragma once

namespace encore::pipeline::megakernel {

// The kernel for a token tier (1, 2, 4, 8 or 16) at 1 or 2 blocks per SM, taking one KernelArgs
// (program.cuh); null for other values. marks: the bodies record their marks (a traced launch; one
// block per SM only: at two the bodies record none).
const void* kernel_for(int tokens, int blocks_per_sm, bool marks);
// The two-blocks-per-SM instantiations (kernel_two_per_sm.cu, compiled with its register cap).
const void* kernel_two_per_sm(int tokens);
// The one-block-per-SM instantiations whose bodies record their marks (kernel_trace.cu).
const void* kernel_with_marks(int tokens);

}  // namespace encore::pipeline::megakernel
