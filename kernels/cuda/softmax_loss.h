// The cross-entropy gradient's launch (softmax_loss.cu), for the planner's LossGradMatmul
// (blas.cu), which runs it ahead of the loss and so reports a bad label as the loss's.
#pragma once

#include "runtime/kernel_abi.h"
#include "runtime/ops.h"

namespace encore::kernels::cuda {

// SoftmaxCrossEntropyGrad's kernel (logits, labels, gy -> gx; CrossEntropyAttrs), a bad label
// reported as `report`'s.
void cross_entropy_grad(const KernelArgs& args, Op report);

}  // namespace encore::kernels::cuda
