// The cpu Adam update of one parameter (optim.cc), for the planner's WeightGradAdam (matmul.cc),
// which computes a linear's weight and bias gradients and then updates the two parameters from
// them in one step.
#pragma once

#include <span>

#include "runtime/kernel_abi.h"
#include "runtime/ops.h"

namespace encore::kernels::cpu {

// One AdamUpdate group: p, g, m, v, t (the int64 step count, incremented first).
void adam_update(std::span<const BufferView> in, const AdamAttrs& a);

}  // namespace encore::kernels::cpu
