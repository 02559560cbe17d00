// The launches of the small GEMMs' kernels (small_gemm.cuh, loss_grad_gemm.cuh,
// weight_adam_gemm.cuh), compiled with -fmad=false (as softmax_loss.cu, whose gradient rows the
// loss's kernel computes too).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/loss_grad_gemm.cuh"
#include "kernels/cuda/small_gemm.cuh"
#include "kernels/cuda/small_gemm.h"
#include "kernels/cuda/weight_adam_gemm.cuh"

namespace encore::kernels::cuda {
namespace {

// Whether finish() (small_gemm.cuh) applies `act`: Op::Matmul (nothing), or an activation or
// activation gradient it has a case for.
bool finishes(Op act) {
  return act == Op::Matmul || act == Op::Relu || act == Op::LeakyRelu || act == Op::Sigmoid ||
         act == Op::Tanh || act == Op::Gelu || reads_act_in(act);
}

}  // namespace

void small_gemm(Op op, SmallGemm kind, const GemmShape& g, DType dtype, const void* a,
                const void* b, void* c, const void* bias, Op act, double scalar, const void* act_in,
                void* sums) {
  switch_floating(dtype, op, [&]<typename T>(Type<T>) {
    const GemmFinish<T> f{static_cast<const T*>(bias), static_cast<const T*>(act_in), act,
                          static_cast<T>(scalar), static_cast<T*>(sums)};
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* pc = static_cast<T*>(c);
    ENCORE_CHECK(kind != SmallGemm::kNone, op_name(op), ": no small GEMM kernel for [", g.m, ",",
                 g.k, "] x [", g.k, ",", g.n, "]");
    ENCORE_CHECK(finishes(act), op_name(op), ": a small GEMM cannot apply ", op_name(act),
                 " to its outputs");
    ENCORE_CHECK(sums == nullptr || cuda_small_gemm_sums_columns(g), op_name(op),
                 ": a small GEMM cannot sum the columns of a [", g.trans_a ? g.k : g.m, ",",
                 g.trans_a ? g.m : g.k, "]", g.trans_a ? "" : " (not transposed)");
    const bool dot = kind == SmallGemm::kDot;
    const GemmLaunch l = small_gemm_launch(dot, g.m, g.n, sums != nullptr);
    const bool vectors_b = stages_vectors(pb, g.ldb);
    if (dot) {
      const int chunk = dot_chunk<T>(g.k);
      launch_dependent_shared<gemm_dot_kernel<T>>(
          op, l.blocks, kSmallGemmThreads, dot_shared_bytes<T>(chunk), g.m, g.n, g.k, chunk, pa,
          g.lda, stages_vectors(pa, g.lda), pb, g.ldb, vectors_b, pc, g.ldc, f);
    } else if (l.rows == 1) {
      const int chunk = serial_chunk<T, 1>(g.k);
      launch_dependent_shared<gemm_serial_k_kernel<T, 1>>(
          op, l.blocks, kSmallGemmThreads, serial_shared_bytes<T, 1>(chunk), g.m, g.n, g.k, chunk,
          g.trans_a, pa, g.lda, pb, g.ldb, vectors_b, pc, g.ldc, f);
    } else {
      const int chunk = serial_chunk<T, kSerialRows>(g.k);
      launch_dependent_shared<gemm_serial_k_kernel<T, kSerialRows>>(
          op, l.blocks, kSmallGemmThreads, serial_shared_bytes<T, kSerialRows>(chunk), g.m, g.n,
          g.k, chunk, g.trans_a, pa, g.lda, pb, g.ldb, vectors_b, pc, g.ldc, f);
    }
  });
}

void small_gemm_loss_grad(const GemmShape& g, DType dtype, const void* logits, const void* labels,
                          DType label_dtype, const void* gy, void* grad, int64_t ignore,
                          encore::cuda::DeviceErrorKind kind, const void* b, void* c, Op act,
                          double scalar, const void* act_in, const LossGradLinear& linear) {
  constexpr Op kOp = Op::LossGradMatmul;
  ENCORE_CHECK(cuda_small_gemm_computes_loss_grad(g, dtype), op_name(kOp),
               ": no small GEMM kernel computes the loss gradient of [", g.m, ",", g.k, "] for [",
               g.k, ",", g.n, "]", g.trans_a ? " (transposed)" : "");
  const bool with_linear = linear.x != nullptr;
  const GemmShape lg = loss_logits_linear(g, linear.hidden);
  ENCORE_CHECK(!with_linear || cuda_small_gemm_computes_logits(g, lg, dtype), op_name(kOp),
               ": no small GEMM kernel computes the logits of [", g.m, ",", linear.hidden, "] x [",
               linear.hidden, ",", g.k, "] beside the loss gradient");
  ENCORE_CHECK(act == Op::Matmul || reads_act_in(act), op_name(kOp), ": a small GEMM cannot apply ",
               op_name(act), " to the product of a loss gradient");
  switch_floating(dtype, kOp, [&]<typename T>(Type<T>) {
    switch_integral(label_dtype, kOp, [&]<typename L>(Type<L>) {
      const GemmFinish<T> f{nullptr, static_cast<const T*>(act_in), act, static_cast<T>(scalar)};
      const LossGradRows<T, L> loss{static_cast<const T*>(logits),
                                    static_cast<const L*>(labels),
                                    static_cast<const T*>(gy),
                                    static_cast<T*>(grad),
                                    ignore,
                                    error_slot(),
                                    kind};
      const T* x = static_cast<const T*>(linear.x);
      const T* w = static_cast<const T*>(linear.w);
      const LogitsRows<T> lin{x,
                              w,
                              static_cast<const T*>(linear.bias),
                              static_cast<T*>(linear.logits),
                              linear.hidden,
                              with_linear && stages_vectors(x, linear.hidden),
                              with_linear && stages_vectors(w, linear.hidden)};
      const T* pb = static_cast<const T*>(b);
      T* pc = static_cast<T*>(c);
      const GemmLaunch l = small_gemm_launch(false, g.m, g.n);
      const bool vectors_b = stages_vectors(pb, g.ldb);
      auto launch = [&]<int kRows, bool kLinear>() {
        launch_dependent_shared<gemm_loss_grad_kernel<T, L, kRows, kLinear>>(
            kOp, l.blocks, kSmallGemmThreads,
            loss_grad_shared_bytes<T, kRows, kLinear>(g.k, linear.hidden), g.m, g.n, g.k, loss, lin,
            pb, g.ldb, vectors_b, pc, g.ldc, f);
      };
      if (l.rows == 1) {
        with_linear ? launch.template operator()<1, true>()
                    : launch.template operator()<1, false>();
      } else {
        with_linear ? launch.template operator()<kSerialRows, true>()
                    : launch.template operator()<kSerialRows, false>();
      }
    });
  });
}

void small_gemm_adam(const GemmShape& g, DType dtype, const void* a, const void* b, void* c,
                     void* sums, const AdamParameter& weight, const AdamParameter& bias,
                     const AdamAttrs& attrs, const AdamAttrs* live) {
  constexpr Op kOp = Op::WeightGradAdam;
  ENCORE_CHECK(cuda_small_gemm_updates_parameters(g, sums != nullptr), op_name(kOp),
               ": no small GEMM kernel updates parameters from [", g.k, ",", g.m, "]^T x [", g.k,
               ",", g.n, "]", sums != nullptr ? " and its column sums" : "");
  switch_floating(dtype, kOp, [&]<typename T>(Type<T>) {
    const auto arrays = [](const AdamParameter& q) {
      return AdamArrays<T>{static_cast<T*>(q.p), static_cast<T*>(q.m), static_cast<T*>(q.v), q.t};
    };
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    const GemmLaunch l = small_gemm_launch(false, g.m, g.n, sums != nullptr);
    const bool vectors_b = stages_vectors(pb, g.ldb);
    auto launch = [&]<int kRows>() {
      const int chunk = serial_chunk<T, kRows>(g.k);
      launch_dependent_shared<gemm_weight_adam_kernel<T, kRows>>(
          kOp, l.blocks, kSmallGemmThreads, serial_shared_bytes<T, kRows>(chunk), g.m, g.n, g.k,
          chunk, pa, g.lda, pb, g.ldb, vectors_b, static_cast<T*>(c), static_cast<T*>(sums),
          arrays(weight), arrays(bias), attrs, live, kOp, error_slot());
    };
    if (l.rows == 1) {
      launch.template operator()<1>();
    } else {
      launch.template operator()<kSerialRows>();
    }
  });
}

}  // namespace encore::kernels::cuda
