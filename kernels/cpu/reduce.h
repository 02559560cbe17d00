// The cpu Sum kernel (reduce.cc), for the planner's WeightBiasGrad (matmul.cc), which sums a
// weight gradient's gy into the bias gradient right after its product, with the Sum's bits.
#pragma once

#include "runtime/kernel_abi.h"

namespace encore::kernels::cpu {

void sum_kernel(const KernelArgs& args);

}  // namespace encore::kernels::cpu
