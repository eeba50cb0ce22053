// The megakernel at one block per SM: every body may use the whole register file (kernel.cuh).
#include "pipeline/megakernel/kernel.cuh"

namespace encore::pipeline::megakernel {

const void* kernel_for(int tokens, int blocks_per_sm) {
  if (blocks_per_sm == 2) return kernel_two_per_sm(tokens);
  return blocks_per_sm == 1 ? megakernel_for_tokens<1>(tokens) : nullptr;
}

}  // namespace encore::pipeline::megakernel
