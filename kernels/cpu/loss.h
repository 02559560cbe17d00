// The cpu cross-entropy gradient (loss.cc), for the planner's LossGradMatmul (matmul.cc), which
// computes a loss's gradient and then the product reading it in one step, and may run ahead of the
// loss: a bad label is then reported as the loss's.
#pragma once

#include "runtime/kernel_abi.h"
#include "runtime/ops.h"

namespace encore::kernels::cpu {

// SoftmaxCrossEntropyGrad's kernel (logits, labels, gy -> gx; CrossEntropyAttrs), a bad label
// `report`'s Error.
void cross_entropy_grad(const KernelArgs& args, Op report);

}  // namespace encore::kernels::cpu
