// Row-major GEMM on cuBLAS (blas.h), and Matmul, Linear and the planner's LinearAct,
// MatmulActGrad, WeightBiasGrad, LossGradMatmul and WeightGradAdam on them (as
// kernels/cpu/matmul.cc). A small product runs on encore's own kernel (small_gemm.h), which also
// adds the bias and applies the activation or its gradient, sums a weight gradient's gy into the
// bias gradient, or computes its a as a loss's gradient. Otherwise a linear with a bias is one
// cuBLASLt call where cuBLASLt has an algorithm for it (blas_lt.cc), else y is filled with the bias
// and a GEMM adds to it; an activation (gradient) then runs as its elementwise kernel.
//
// cuBLAS is column-major. A row-major [r, c] matrix with row length ld is, read column-major, its
// transpose [c, r] with leading dimension ld, so row-major C = op(A) op(B) is column-major
// C^T = op(B)^T op(A)^T: one cuBLAS call with the operands swapped, n and m swapped, and each
// operand keeping its own transpose flag and row length.
#include <algorithm>
#include <climits>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/small_gemm.h"
#include "kernels/cuda/softmax_loss.h"
#include "kernels/update_groups.h"

namespace encore::kernels::cuda {

void fail_cublas(Op op, const char* call, cublasStatus_t status) {
  fail(op_name(op), ": cuBLAS error in ", call, ": ", cublasGetStatusName(status), " (",
       cublasGetStatusString(status), ")");
}

namespace {

// A GEMM call's failure names the product as the op saw it (row-major) and the call cuBLAS got.
[[noreturn]] void fail_gemm(Op op, const char* call, cublasStatus_t status, const GemmShape& g) {
  fail(op_name(op), ": cuBLAS error in ", call, " for a product of [", g.m, ", ", g.k, "]",
       g.trans_a ? " (stored transposed)" : "", " by [", g.k, ", ", g.n, "]",
       g.trans_b ? " (stored transposed)" : "", ", ", g.batches, " batch(es), row strides ", g.lda,
       ", ", g.ldb, " and ", g.ldc, ": ", cublasGetStatusName(status), " (",
       cublasGetStatusString(status), ")");
}

cublasOperation_t trans(bool t) {
  return t ? CUBLAS_OP_T : CUBLAS_OP_N;
}

// Whether every size of g fits an int: then the 32-bit entry points run it, else their 64-bit
// forms (cuBLAS 12's `_64`), so that a product with more than 2^31 rows, columns or inner
// elements runs as PyTorch's does, while every other product keeps the kernels it always had.
bool fits_int(const GemmShape& g) {
  return std::max({g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batches}) <= INT_MAX;
}

// The column-major call for row-major g: (B, A) in that order, sizes (n, m, k), each an Index.
template <typename Index, typename T, typename One, typename Batched>
void gemm_call(Op op, cublasHandle_t h, const GemmShape& g, const T* a, const T* b, T beta, T* c,
               One one, const char* one_name, Batched batched, const char* batched_name) {
  const T alpha = 1;
  const auto m = static_cast<Index>(g.m), n = static_cast<Index>(g.n), k = static_cast<Index>(g.k);
  const auto lda = static_cast<Index>(g.lda), ldb = static_cast<Index>(g.ldb),
             ldc = static_cast<Index>(g.ldc);
  const cublasOperation_t op_b = trans(g.trans_b), op_a = trans(g.trans_a);
  if (g.batches == 1) {
    const cublasStatus_t s = one(h, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) fail_gemm(op, one_name, s, g);
  } else {
    const cublasStatus_t s =
        batched(h, op_b, op_a, n, m, k, &alpha, b, ldb, static_cast<long long>(g.stride_b), a, lda,
                static_cast<long long>(g.stride_a), &beta, c, ldc,
                static_cast<long long>(g.stride_c), static_cast<Index>(g.batches));
    if (s != CUBLAS_STATUS_SUCCESS) fail_gemm(op, batched_name, s, g);
  }
}

}  // namespace

void gemm(Op op, cublasHandle_t h, const GemmShape& g, const float* a, const float* b, float beta,
          float* c) {
  if (fits_int(g))
    gemm_call<int>(op, h, g, a, b, beta, c, cublasSgemm, "cublasSgemm", cublasSgemmStridedBatched,
                   "cublasSgemmStridedBatched");
  else
    gemm_call<int64_t>(op, h, g, a, b, beta, c, cublasSgemm_64, "cublasSgemm_64",
                       cublasSgemmStridedBatched_64, "cublasSgemmStridedBatched_64");
}

void gemm(Op op, cublasHandle_t h, const GemmShape& g, const double* a, const double* b,
          double beta, double* c) {
  if (fits_int(g))
    gemm_call<int>(op, h, g, a, b, beta, c, cublasDgemm, "cublasDgemm", cublasDgemmStridedBatched,
                   "cublasDgemmStridedBatched");
  else
    gemm_call<int64_t>(op, h, g, a, b, beta, c, cublasDgemm_64, "cublasDgemm_64",
                       cublasDgemmStridedBatched_64, "cublasDgemmStridedBatched_64");
}

namespace {

// y [rows, n] = bias [n] in every row.
template <typename T>
__global__ void fill_rows_kernel(const T* __restrict__ bias, T* __restrict__ y, int64_t n,
                                 int64_t total) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step)
    y[i] = bias[i % n];
}

// `out` = act(out) in place (act an activation, Op::Matmul for none), or act(act_in, out) for an
// activation gradient: the elementwise kernel of the op, as an eager call runs it after the
// product.
void finish_apart(Op act, double scalar, const BufferView& out, const BufferView* act_in) {
  if (act == Op::Matmul) return;
  const AttrBlob attrs = AttrBlob::of(ScalarAttrs{scalar});
  const BufferView in[2] = {act_in != nullptr ? *act_in : out, out};
  const KernelArgs args{std::span<const BufferView>(in, act_in != nullptr ? 2 : 1),
                        std::span<const BufferView>(&out, 1), attrs};
  lookup_kernel(act, DeviceType::CUDA)(args);
}

// Matmul (act Op::Matmul) or MatmulActGrad: out = op(a) op(b), or act(in 2, op(a) op(b)).
void matmul_into(const KernelArgs& args, Op op, Op act, double scalar, const GemmShape& g) {
  const BufferView &a = args.in[0], &b = args.in[1], &c = args.out[0];
  const BufferView* act_in = act != Op::Matmul ? &args.in[2] : nullptr;
  switch_floating(c.dtype, op, [&]<typename T>(Type<T>) {
    if (c.numel() == 0) return;
    if (g.k == 0) {
      ENCORE_CUDA_OK(
          op, cudaMemsetAsync(c.data, 0, static_cast<size_t>(c.numel()) * sizeof(T), stream()));
    } else if (const SmallGemm kind = cuda_small_gemm(g); kind != SmallGemm::kNone) {
      return small_gemm(op, kind, g, c.dtype, a.data, b.data, c.data, nullptr, act, scalar,
                        act_in != nullptr ? act_in->data : nullptr);
    } else {
      gemm(op, cublas_handle(op), g, a.as<T>(), b.as<T>(), T(0), c.as<T>());
    }
    finish_apart(act, scalar, c, act_in);
  });
}

// Linear (act Op::Matmul) or LinearAct: y = act(x w^T + bias).
void linear_into(const KernelArgs& args, Op op, Op act, double scalar) {
  const BufferView &x = args.in[0], &w = args.in[1], &y = args.out[0];
  const BufferView* bias = args.in.size() == 3 ? &args.in[2] : nullptr;
  const GemmShape g = linear_shape(args);
  switch_floating(y.dtype, op, [&]<typename T>(Type<T>) {
    T* py = y.as<T>();
    const int64_t total = y.numel();
    if (total == 0) return;
    if (g.k > 0) {
      if (const SmallGemm kind = cuda_small_gemm(g); kind != SmallGemm::kNone)
        return small_gemm(op, kind, g, y.dtype, x.data, w.data, py,
                          bias != nullptr ? bias->data : nullptr, act, scalar);
      // Past int, the fill and the 64-bit GEMM below (cuBLASLt's sizes there are untried).
      if (bias != nullptr && fits_int(g) &&
          linear_bias_lt(op, g, y.dtype, x.data, w.data, bias->data, py, args.state))
        return finish_apart(act, scalar, y, nullptr);
    }
    if (bias != nullptr) {
      fill_rows_kernel<T>
          <<<blocks_for(total), kThreads, 0, stream()>>>(bias->as<T>(), py, g.n, total);
      ENCORE_CUDA_LAUNCHED(op);
    } else if (g.k == 0) {
      ENCORE_CUDA_OK(op, cudaMemsetAsync(py, 0, static_cast<size_t>(total) * sizeof(T), stream()));
    }
    if (g.k > 0)
      gemm(op, cublas_handle(op), g, x.as<T>(), w.as<T>(), bias != nullptr ? T(1) : T(0), py);
    finish_apart(act, scalar, y, nullptr);
  });
}

void matmul_kernel(const KernelArgs& args) {
  matmul_into(args, Op::Matmul, Op::Matmul, 0, matmul_shape(args));
}

void linear_kernel(const KernelArgs& args) {
  linear_into(args, Op::Linear, Op::Matmul, 0);
}

// LinearAct (the planner's, runtime/small_gemm.h): one kernel for a small product, else the
// linear's kernels and then the activation's.
void linear_act_kernel(const KernelArgs& args) {
  const ActAttrs& act = args.attr<ActAttrs>();
  linear_into(args, Op::LinearAct, act.op, act.scalar);
}

// MatmulActGrad (the planner's): a, b, y -> act_grad(y, matmul(a, b)).
void matmul_act_grad_kernel(const KernelArgs& args) {
  const MatmulActAttrs& attrs = args.attr<MatmulActAttrs>();
  matmul_into(args, Op::MatmulActGrad, attrs.act.op, attrs.act.scalar,
              matmul_shape(args.in[0].shape, args.in[1].shape, args.out[0].shape, attrs.matmul));
}

// WeightBiasGrad (the planner's): a [k, m], b [k, n] -> a^T b and sum(a, 0). One small GEMM
// kernel where it sums the columns too (runtime/small_gemm.h: the only pairs CUDA plans fold),
// else the Matmul's kernel, then the Sum's.
void weight_bias_grad_kernel(const KernelArgs& args) {
  const BufferView &a = args.in[0], &b = args.in[1], &c = args.out[0], &sums = args.out[1];
  const AttrBlob product = AttrBlob::of(MatmulAttrs{.trans_a = true});
  const GemmShape g = matmul_shape(a.shape, b.shape, c.shape, product.as<MatmulAttrs>());
  if (cuda_small_gemm_sums_columns(g))
    return small_gemm(Op::WeightBiasGrad, SmallGemm::kSerialK, g, c.dtype, a.data, b.data, c.data,
                      nullptr, Op::Matmul, 0, nullptr, sums.data);
  matmul_into(KernelArgs{args.in, args.out.first(1), product}, Op::WeightBiasGrad, Op::Matmul, 0,
              g);
  lookup_kernel(Op::Sum, DeviceType::CUDA)(KernelArgs{args.in.first(1), args.out.subspan(1, 1),
                                                      AttrBlob::of(ReduceAttrs{.axes_mask = 1})});
}

// LossGradMatmul (the planner's): logits, labels, gy, b[, y] -> the product of the cross-entropy
// gradient g and b (then the activation gradient reading y), and g; with `linear`, the logits
// from x, w[, bias] too. One small GEMM kernel that computes g's rows (and the logits) itself
// where it runs the product (runtime/small_gemm.h: the only steps CUDA plans fold), else the
// linear's kernels, the gradient's, then the product's.
void loss_grad_matmul_kernel(const KernelArgs& args) {
  const LossGradMatmulAttrs& attrs = args.attr<LossGradMatmulAttrs>();
  const LossGradMatmulInputs at = loss_grad_matmul_inputs(attrs);
  const BufferView &labels = args.in[at.labels], &gy = args.in[at.gy], &b = args.in[at.b];
  const BufferView &c = args.out[0], &grad = args.out[1];
  const bool linear = attrs.linear != 0;
  BufferView logits = linear ? args.out[2] : args.in[at.logits];
  logits.shape = grad.shape;  // the loss's [m, k]
  const Op act = attrs.product.act.op;
  const BufferView* act_in = at.y >= 0 ? &args.in[at.y] : nullptr;
  const GemmShape g = matmul_shape(grad.shape, b.shape, c.shape, attrs.product.matmul);
  const GemmShape lg =
      linear ? linear_shape(args.in[at.x].shape, args.in[at.w].shape, args.out[2].shape)
             : GemmShape{};
  if (c.numel() > 0 && (linear ? cuda_small_gemm_computes_logits(g, lg, c.dtype)
                               : cuda_small_gemm_computes_loss_grad(g, c.dtype))) {
    const auto kind = attrs.loss.from_cross_entropy != 0 ? encore::cuda::DeviceErrorKind::Target
                                                         : encore::cuda::DeviceErrorKind::Label;
    const LossGradLinear from =
        linear ? LossGradLinear{args.in[at.x].data, args.in[at.w].data,
                                at.bias >= 0 ? args.in[at.bias].data : nullptr, logits.data, lg.k}
               : LossGradLinear{};
    return small_gemm_loss_grad(g, c.dtype, logits.data, labels.data, labels.dtype, gy.data,
                                grad.data, attrs.loss.ignore_label, kind, b.data, c.data, act,
                                attrs.product.act.scalar,
                                act_in != nullptr ? act_in->data : nullptr, from);
  }
  if (linear)
    linear_into(
        KernelArgs{args.in.first(at.labels), args.out.subspan(2, 1), args.attrs, args.state},
        Op::LossGradMatmul, Op::Matmul, 0);
  // With the logits, this step runs before the loss, which eagerly fails first on a bad label.
  const AttrBlob loss = AttrBlob::of(attrs.loss);
  const BufferView loss_in[3] = {logits, labels, gy};
  cross_entropy_grad(
      KernelArgs{std::span<const BufferView>(loss_in, 3), args.out.subspan(1, 1), loss},
      linear ? Op::SoftmaxCrossEntropy : Op::SoftmaxCrossEntropyGrad);
  const BufferView in[3] = {grad, b, act_in != nullptr ? *act_in : b};
  const AttrBlob product = AttrBlob::of(attrs.product.matmul);
  matmul_into(KernelArgs{std::span<const BufferView>(in, act_in != nullptr ? 3 : 2),
                         args.out.first(1), product},
              Op::LossGradMatmul, act, attrs.product.act.scalar, g);
}

// WeightGradAdam (the planner's): a [k, m], b [k, n], then the weight's AdamUpdate group (and the
// bias's) -> a^T b into the weight's gradient (and sum(a, 0) into the bias's), then each
// parameter's Adam update. One small GEMM kernel where it runs the product (the only steps CUDA
// plans fold: schedule/update_folds.cc), else the product's kernel, then the update's.
void weight_grad_adam_kernel(const KernelArgs& args) {
  const AdamAttrs adam = adam_attrs(args.attr<WeightGradAdamAttrs>());
  const auto* live = static_cast<const AdamAttrs*>(args.device_attrs);
  const bool bias = args.in.size() == kWeightGradAdamBiasInputs;
  const std::span<const BufferView> weight = args.in.subspan(2, kWeightGradAdamGroup);
  const std::span<const BufferView> updates = args.in.subspan(2);
  const BufferView &a = args.in[0], &b = args.in[1], &c = weight[1];
  const BufferView* sums = bias ? &args.in[kWeightGradAdamInputs + 1] : nullptr;
  const GemmShape g = matmul_shape(a.shape, b.shape, c.shape, MatmulAttrs{.trans_a = true});
  check_update_groups(updates, Op::AdamUpdate);
  if (cuda_small_gemm_updates_parameters(g, bias)) {
    const auto parameter = [](std::span<const BufferView> q) {
      return AdamParameter{q[0].data, q[2].data, q[3].data, q[4].as<int64_t>()};
    };
    return small_gemm_adam(
        g, c.dtype, a.data, b.data, c.data, bias ? sums->data : nullptr, parameter(weight),
        bias ? parameter(args.in.subspan(kWeightGradAdamInputs, kWeightGradAdamGroup))
             : AdamParameter{},
        adam, live);
  }
  const BufferView grads[2] = {c, bias ? *sums : c};
  const KernelArgs product{args.in.first(2), std::span<const BufferView>(grads, bias ? 2 : 1),
                           AttrBlob::of(MatmulAttrs{.trans_a = true})};
  if (bias) {
    weight_bias_grad_kernel(KernelArgs{product.in, product.out, AttrBlob{}});
  } else {
    matmul_into(product, Op::WeightGradAdam, Op::Matmul, 0, g);
  }
  lookup_kernel(Op::AdamUpdate,
                DeviceType::CUDA)(KernelArgs{updates, {}, AttrBlob::of(adam), nullptr, live});
}

ENCORE_REGISTER_CUDA(Op::Matmul, &matmul_kernel);
ENCORE_REGISTER_CUDA(Op::Linear, &linear_kernel);
ENCORE_REGISTER_CUDA(Op::LinearAct, &linear_act_kernel);
ENCORE_REGISTER_CUDA(Op::MatmulActGrad, &matmul_act_grad_kernel);
ENCORE_REGISTER_CUDA(Op::WeightBiasGrad, &weight_bias_grad_kernel);
ENCORE_REGISTER_CUDA(Op::LossGradMatmul, &loss_grad_matmul_kernel);
ENCORE_REGISTER_CUDA(Op::WeightGradAdam, &weight_grad_adam_kernel);

}  // namespace
}  // namespace encore::kernels::cuda
