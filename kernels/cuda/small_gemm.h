// The small GEMMs on encore's own kernels (small_gemm.cuh; runtime/small_gemm.h says which
// products run here): blas.cu sends Linear, LinearAct, Matmul, MatmulActGrad, WeightBiasGrad,
// LossGradMatmul and WeightGradAdam to them.
#pragma once

#include "runtime/cuda.h"
#include "runtime/dtype.h"
#include "runtime/gemm_shape.h"
#include "runtime/ops.h"
#include "runtime/small_gemm.h"

namespace encore::kernels::cuda {

// c = op(a) op(b) (g: a product `kind` runs, kind != kNone), each output v stored as
// act(v + bias[column]) (no bias where bias is null; act: an activation, or Op::Matmul for none),
// or as act(act_in[same place], v) when act is an activation gradient; `scalar` is the activation's
// (ActAttrs::scalar). `sums`, where not null (cuda_small_gemm_sums_columns(g)), gets sum(a, 0) of
// a stored [k, m]. On the current stream; `op` names the call in errors.
void small_gemm(Op op, SmallGemm kind, const GemmShape& g, DType dtype, const void* a,
                const void* b, void* c, const void* bias = nullptr, Op act = Op::Matmul,
                double scalar = 0, const void* act_in = nullptr, void* sums = nullptr);

// Where small_gemm_loss_grad computes the logits too: the linear's x [m, hidden], w [k, hidden]
// and optional bias (cuda_small_gemm_computes_logits), the logits stored at `logits`.
struct LossGradLinear {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;
  void* logits = nullptr;
  int64_t hidden = 0;
};

// c = g b (g: [m, k] not transposed, b stored [k, n]; cuda_small_gemm_computes_loss_grad(g,
// dtype)), g the cross-entropy gradient of `logits` [m, k] over `labels` (of `label_dtype`) with
// the loss's incoming gradient gy (one element) and ignored label `ignore`, computed by the kernel
// and also stored at `grad`; each output finished as small_gemm's (act: Op::Matmul, or an
// activation gradient reading act_in). With `linear.x`, the logits are computed from `linear`
// (logits unused). An out-of-range label is reported as `kind` (runtime/cuda.h). On the current
// stream.
void small_gemm_loss_grad(const GemmShape& g, DType dtype, const void* logits, const void* labels,
                          DType label_dtype, const void* gy, void* grad, int64_t ignore,
                          encore::cuda::DeviceErrorKind kind, const void* b, void* c, Op act,
                          double scalar, const void* act_in, const LossGradLinear& linear = {});

// A parameter a small GEMM updates by Adam from the gradient it computes: the parameter, m, v (of
// the gradient's dtype and layout) and the step count.
struct AdamParameter {
  void* p = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  int64_t* t = nullptr;
};

// c = a^T b (cuda_small_gemm_updates_parameters(g, sums != nullptr)), then `weight` updated by
// Adam (`attrs`, or those at `live` in device memory when the launch reads them: a captured
// graph's, KernelArgs::device_attrs) from c; with `sums`, sum(a, 0) there and `bias` updated from
// it too. On the current stream.
void small_gemm_adam(const GemmShape& g, DType dtype, const void* a, const void* b, void* c,
                     void* sums, const AdamParameter& weight, const AdamParameter& bias,
                     const AdamAttrs& attrs, const AdamAttrs* live);

}  // namespace encore::kernels::cuda
