// The megakernel at one block per SM: every body may use the whole register file (kernel.cuh).
#include "pipeline/megakernel/kernel.cuh"

namespace encore::pipeline::megakernel {

const void* kernel_for(int tokens, int blocks_per_sm, bool marks) {
  if (blocks_per_sm == 2) return kernel_two_per_sm(tokens);
  if (blocks_per_sm != 1) return nullptr;
  return marks ? kernel_with_marks(tokens) : megakernel_for_tokens<1>(tokens);
}

}  // namespace encore::pipeline::megakernel
