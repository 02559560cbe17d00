// The cpu cross-entropy gradient kernel (loss.cc), for the planner's LossGradMatmul (matmul.cc),
// which computes a loss's gradient and then the product reading it in one step.
#pragma once

#include "runtime/kernel_abi.h"

namespace encore::kernels::cpu {

void cross_entropy_grad_kernel(const KernelArgs& args);

}  // namespace encore::kernels::cpu
