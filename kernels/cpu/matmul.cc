// Matmul and linear through cblas (OpenBLAS), row-major (shapes: runtime/gemm_shape.h), and the
// planner's LinearAct and MatmulActGrad: the same products, with an activation (or an activation
// gradient) applied to each part of the output right after the part is computed; its
// MatmulAccumulate: an outer product added into a gradient; its WeightBiasGrad: a weight
// gradient's product, then its bias gradient's Sum; its LossGradMatmul: a loss's gradient, then
// the product reading it; and its WeightGradAdam: a weight (and bias) gradient, then the Adam
// updates reading them.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/kernel.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/optim.h"
#include "kernels/cpu/reduce.h"
#include "runtime/gemm_shape.h"
#include "runtime/parallel.h"

namespace encore::kernels::cpu {
namespace {

// The GEMM of `g` on one batch's matrices; after_part as for parallel_gemm.
template <typename T, typename AfterPart = NoAfterPart>
void run(const GemmShape& g, const T* a, const T* b, T* c, T beta, AfterPart after_part = {}) {
  parallel_gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, a, g.lda, b, g.ldb, beta, c, g.ldc,
                after_part);
}
void check(Op op, const GemmShape& g) {
  check_blas_sizes(op, {g.m, g.n, g.k, g.lda, g.ldb, g.ldc});
}

// Calls f(offset, count) over the rows [r0, r1) and columns [c0, c1) of a matrix with rows ldc
// apart: one range when the part is whole rows.
template <typename F>
void for_part(int64_t ldc, int64_t r0, int64_t r1, int64_t c0, int64_t c1, F&& f) {
  if (c0 == 0 && c1 == ldc) return f(r0 * ldc, (r1 - r0) * ldc);
  for (int64_t r = r0; r < r1; ++r) f(r * ldc + c0, c1 - c0);
}

// c = op(a) op(b) per batch; after(c_batch, r0, r1, c0, c1) for each part written.
template <typename T, typename After>
void matmul(const KernelArgs& args, Op op, After after) {
  const BufferView &a = args.in[0], &b = args.in[1], &c = args.out[0];
  const GemmShape g = matmul_shape(args);
  const T* pa = a.as<T>();
  const T* pb = b.as<T>();
  T* pc = c.as<T>();
  if (c.numel() == 0) return;
  if (g.k == 0) {
    std::fill(pc, pc + c.numel(), T(0));
    for (int64_t i = 0; i < g.batches; ++i) after(i * g.stride_c, int64_t{0}, g.m, int64_t{0}, g.n);
    return;
  }
  check(op, g);
  // Many small products (attention's heads): whole products split across threads, each one
  // gemm on one thread, as parallel_gemm would run it unsplit. Which way is a function of the
  // shapes alone.
  const double flops =
      2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  if (g.batches > 1 && flops < kGemmPartFlops) {
    const auto grain = std::max<int64_t>(1, static_cast<int64_t>(kGemmPartFlops / flops));
    parallel_for(g.batches, grain, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i) {
        gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, pa + i * g.stride_a, g.lda, pb + i * g.stride_b,
             g.ldb, T(0), pc + i * g.stride_c, g.ldc);
        after(i * g.stride_c, int64_t{0}, g.m, int64_t{0}, g.n);
      }
    });
    return;
  }
  for (int64_t i = 0; i < g.batches; ++i)
    run(g, pa + i * g.stride_a, pb + i * g.stride_b, pc + i * g.stride_c, T(0),
        [&, i](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
          after(i * g.stride_c, r0, r1, c0, c1);
        });
}

// y = x w^T (+ bias: broadcast into y, then a GEMM with beta 1); after(r0, r1, c0, c1) for each
// part of y written.
template <typename T, typename After>
void linear(const KernelArgs& args, Op op, After after) {
  const BufferView &x = args.in[0], &w = args.in[1], &y = args.out[0];
  const BufferView* bias = args.in.size() == 3 ? &args.in[2] : nullptr;
  const GemmShape g = linear_shape(args);
  T* py = y.as<T>();
  if (y.numel() == 0) return;
  if (bias != nullptr) {
    const T* pb = bias->as<T>();
    for (int64_t r = 0; r < g.m; ++r) std::memcpy(py + r * g.n, pb, g.n * sizeof(T));
  } else if (g.k == 0) {
    std::fill(py, py + y.numel(), T(0));
  }
  if (g.k == 0) return after(int64_t{0}, g.m, int64_t{0}, g.n);
  check(op, g);
  run(g, x.as<T>(), w.as<T>(), py, bias != nullptr ? T(1) : T(0), after);
}

void matmul_kernel(const KernelArgs& args) {
  switch_floating(args.out[0].dtype, Op::Matmul, [&]<typename T>(Type<T>) {
    matmul<T>(args, Op::Matmul, [](int64_t, int64_t, int64_t, int64_t, int64_t) {});
  });
}

void linear_kernel(const KernelArgs& args) {
  switch_floating(args.out[0].dtype, Op::Linear,
                  [&]<typename T>(Type<T>) { linear<T>(args, Op::Linear, NoAfterPart{}); });
}

// LinearAct: linear, then the activation over each part of y.
void linear_act_kernel(const KernelArgs& args) {
  const ActAttrs& act = args.attr<ActAttrs>();
  switch_floating(args.out[0].dtype, Op::LinearAct, [&]<typename T>(Type<T>) {
    T* py = args.out[0].as<T>();
    const int64_t ldc = std::max<int64_t>(args.in[1].shape[0], 1);
    linear<T>(args, Op::LinearAct, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
      for_part(ldc, r0, r1, c0, c1,
               [&](int64_t at, int64_t n) { apply_activation(act, py + at, n); });
    });
  });
}

// MatmulActGrad: a, b, y -> the gradient op of ActAttrs applied to (y, matmul(a, b)), per part.
void matmul_act_grad_kernel(const KernelArgs& args) {
  const MatmulActAttrs& attrs = args.attr<MatmulActAttrs>();
  const AttrBlob product = AttrBlob::of(attrs.matmul);
  const KernelArgs product_args{args.in.first(2), args.out, product};
  switch_floating(args.out[0].dtype, Op::MatmulActGrad, [&]<typename T>(Type<T>) {
    const T* py = args.in[2].as<T>();
    T* pg = args.out[0].as<T>();
    const int64_t ldc = std::max<int64_t>(args.out[0].shape.at(-1), 1);
    matmul<T>(product_args, Op::MatmulActGrad,
              [&](int64_t base, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
                for_part(ldc, r0, r1, c0, c1, [&](int64_t at, int64_t n) {
                  apply_activation_grad(attrs.act, py + base + at, pg + base + at, n);
                });
              });
  });
}

// MatmulAccumulate: c += op(a) op(b) for an outer product (k = 1), each element c + p with p the
// value the Matmul kernel gives (small_gemm runs every k = 1 product): a_i b_j rounded when b is
// read as is, that plus +0 (its dot product's running sum starts at +0) when b is transposed. No
// fused multiply-add: the product is rounded before the sum, as a Matmul then an add_ round it.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
template <typename T>
void add_outer_product(const GemmShape& g, const T* a, const T* __restrict b, T* c) {
  for (int64_t i = 0; i < g.m; ++i) {
    const T s = g.trans_a ? a[i] : a[i * g.lda];
    T* __restrict ci = c + i * g.ldc;
    if (g.trans_b) {
      for (int64_t j = 0; j < g.n; ++j) ci[j] = ci[j] + (s * b[j * g.ldb] + T(0));
    } else {
      for (int64_t j = 0; j < g.n; ++j) ci[j] = ci[j] + s * b[j];
    }
  }
}
#pragma GCC pop_options

void matmul_accumulate_kernel(const KernelArgs& args) {
  const KernelArgs product_args{args.in.first(2), args.in.subspan(2, 1), args.attrs};
  const GemmShape g = matmul_shape(product_args);
  ENCORE_CHECK(g.k == 1 && g.batches == 1, "matmul_accumulate: an outer product of two matrices ",
               "(k = 1) is planned, not ", args.in[0].shape, " x ", args.in[1].shape);
  switch_floating(args.in[2].dtype, Op::MatmulAccumulate, [&]<typename T>(Type<T>) {
    add_outer_product(g, args.in[0].as<T>(), args.in[1].as<T>(), args.in[2].as<T>());
  });
}

// WeightBiasGrad: a [k, m], b [k, n] -> a^T b and sum(a, 0), by the Matmul's and the Sum's
// kernels in turn (the fold saves CUDA a kernel; here it is one step of the same work).
void weight_bias_grad_kernel(const KernelArgs& args) {
  const AttrBlob product = AttrBlob::of(MatmulAttrs{.trans_a = true});
  const AttrBlob columns = AttrBlob::of(ReduceAttrs{.axes_mask = 1});
  matmul_kernel(KernelArgs{args.in, args.out.first(1), product});
  sum_kernel(KernelArgs{args.in.first(1), args.out.subspan(1, 1), columns});
}

// LossGradMatmul: logits, labels, gy, b[, y] -> the product of the cross-entropy gradient g and b
// (then the activation gradient reading y), and g; with `linear`, the logits from x, w[, bias]
// first, a third output. The linear's kernel, the gradient's, then the product's (the fold saves
// CUDA kernels; here it is one step of the same work).
void loss_grad_matmul_kernel(const KernelArgs& args) {
  const LossGradMatmulAttrs& attrs = args.attr<LossGradMatmulAttrs>();
  const LossGradMatmulInputs at = loss_grad_matmul_inputs(attrs);
  const bool linear = attrs.linear != 0;
  BufferView logits = linear ? args.out[2] : args.in[at.logits];
  if (linear) {
    linear_kernel(KernelArgs{args.in.first(at.labels), args.out.subspan(2, 1), AttrBlob{}});
    logits.shape = args.out[1].shape;  // the loss's [m, k] view of the linear's output
  }
  // With the logits, the step runs before the loss, which eagerly fails first on a bad label: the
  // gradient reports it as the loss's (attrs.loss is then the loss's), before writing g.
  const BufferView loss_in[3] = {logits, args.in[at.labels], args.in[at.gy]};
  cross_entropy_grad(KernelArgs{std::span<const BufferView>(loss_in, 3), args.out.subspan(1, 1),
                                AttrBlob::of(attrs.loss)},
                     linear ? Op::SoftmaxCrossEntropy : Op::SoftmaxCrossEntropyGrad);
  const bool act = at.y >= 0;
  const BufferView in[3] = {args.out[1], args.in[at.b], args.in[act ? at.y : at.b]};
  const std::span<const BufferView> operands(in, act ? 3 : 2);
  if (act) {
    matmul_act_grad_kernel(KernelArgs{operands, args.out.first(1), AttrBlob::of(attrs.product)});
  } else {
    matmul_kernel(KernelArgs{operands, args.out.first(1), AttrBlob::of(attrs.product.matmul)});
  }
}

// WeightGradAdam: a [k, m], b [k, n], then the weight's AdamUpdate group (and the bias's) -> a^T b
// into the weight's gradient (and sum(a, 0) into the bias's), then each parameter's update, by
// the Matmul's (or WeightBiasGrad's) kernel and the AdamUpdate's in turn (the fold saves CUDA a
// kernel; here it is one step of the same work).
void weight_grad_adam_kernel(const KernelArgs& args) {
  const AdamAttrs adam = adam_attrs(args.attr<WeightGradAdamAttrs>());
  const bool bias = args.in.size() == kWeightGradAdamBiasInputs;
  const std::span<const BufferView> weight = args.in.subspan(2, kWeightGradAdamGroup);
  const BufferView grads[2] = {weight[1], bias ? args.in[kWeightGradAdamInputs + 1] : weight[1]};
  const std::span<const BufferView> out(grads, bias ? 2 : 1);
  if (bias) {
    weight_bias_grad_kernel(KernelArgs{args.in.first(2), out, AttrBlob{}});
  } else {
    matmul_kernel(KernelArgs{args.in.first(2), out, AttrBlob::of(MatmulAttrs{.trans_a = true})});
  }
  adam_update(weight, adam);
  if (bias) adam_update(args.in.subspan(kWeightGradAdamInputs, kWeightGradAdamGroup), adam);
}

[[maybe_unused]] const bool kRegistered = [] {
  ensure_single_threaded_blas();
  register_kernel(Op::Matmul, DeviceType::CPU, &matmul_kernel);
  register_kernel(Op::Linear, DeviceType::CPU, &linear_kernel);
  register_kernel(Op::LinearAct, DeviceType::CPU, &linear_act_kernel);
  register_kernel(Op::MatmulActGrad, DeviceType::CPU, &matmul_act_grad_kernel);
  register_kernel(Op::MatmulAccumulate, DeviceType::CPU, &matmul_accumulate_kernel);
  register_kernel(Op::WeightBiasGrad, DeviceType::CPU, &weight_bias_grad_kernel);
  register_kernel(Op::LossGradMatmul, DeviceType::CPU, &loss_grad_matmul_kernel);
  register_kernel(Op::WeightGradAdam, DeviceType::CPU, &weight_grad_adam_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
