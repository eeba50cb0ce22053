// Host view of the megakernel's instantiations (kernel.cu): one per GEMV token tier, so each runs
// the GEMV bodies specialised for its batch.
#pragma once

namespace encore::pipeline::megakernel {

// The kernel for a token tier (1, 2, 4, 8 or 16), taking one KernelArgs (program.cuh); null for
// another value.
const void* kernel_for_tokens(int tokens);

}  // namespace encore::pipeline::megakernel
