// A loss's gradient and the product that reads it, in one kernel: c = g b, g [m, k] the
// cross-entropy gradient of logits [m, k] (a classifier's last linear: its input gradient g W),
// finished as the small GEMMs finish their outputs (an activation gradient after it), and g
// itself stored beside c. The planner folds a SoftmaxCrossEntropyGrad and the Matmul (or
// MatmulActGrad) reading its output into one LossGradMatmul step where this kernel runs the product
// (runtime/small_gemm.h: cuda_small_gemm_computes_loss_grad): one kernel, one round trip to memory
// fewer, on a training step's critical path.
//
// It is small_gemm.cuh's kSerialK kernel with all of k in one chunk, whose block, rather than
// copying its kRows rows of a into shared memory, computes them there: warp w row r0 + w, by
// cross_entropy_grad_row (softmax_loss.cuh), the gradient kernel's own code, after counting the
// non-ignored labels over all m rows as each of that kernel's blocks does. b's rows are copied
// meanwhile (asynchronous copies). Then the multiply-adds and stores are kSerialK's
// (serial_products, serial_store). So g and c have the bits of the gradient kernel followed by the
// product's kernel. The blocks of the first column block store g's rows and report an
// out-of-range label (NaN rows, as the gradient kernel's), the others only use them.
//
// The host compiles this file too (tests/nvrtc/loss_grad_gemm_emulated_test.cc runs it on the
// host against the two kernels it replaces).
#pragma once

#include <cstdint>

#include "kernels/cuda/small_gemm.cuh"
#include "kernels/cuda/softmax_loss.cuh"
#include "runtime/small_gemm.h"

namespace encore::kernels::cuda {

// A block computes up to kSerialRows rows of g, a warp each, and stages all k of them.
static_assert(kSerialRows <= kSmallGemmThreads / 32);
static_assert(kSerialMaxChunk<float, kSerialRows> >= kMaxLossGradClasses32 &&
              kSerialMaxChunk<double, kSerialRows> >= kMaxLossGradClasses64);

// g's rows as the gradient kernel computes them: of logits [m, k] and labels [m], gy the loss's
// incoming gradient (one element), g where they are stored.
template <typename T, typename L>
struct LossGradRows {
  const T* logits;
  const L* labels;
  const T* gy;
  T* g;
  int64_t ignore;
  encore::cuda::DeviceErrorSlot errors;
  encore::cuda::DeviceErrorKind kind;
};

// Launched as small_gemm_launch(false, m, n) says, kRows its rows, with
// serial_shared_bytes<T, kRows>(k) of dynamic shared memory (k <= kSerialMaxChunk<T, kRows>):
// block b computes rows b / col_blocks * kRows on, the kSmallGemmThreads columns from
// b % col_blocks * kSmallGemmThreads on. b is stored [k, n]; vectors_b: stages_vectors(b, ldb).
template <typename T, typename L, int kRows>
__global__ void __launch_bounds__(kSmallGemmThreads)
    gemm_loss_grad_kernel(int64_t m, int64_t n, int64_t k, LossGradRows<T, L> loss,
                          const T* __restrict__ b, int64_t ldb, bool vectors_b, T* __restrict__ c,
                          int64_t ldc, GemmFinish<T> f) {
  dependent_launch_start();
  constexpr int kWidth = kSmallGemmThreads;
  const int chunk = static_cast<int>(k);
  // k rows of kWidth (b's, 16-byte aligned), then kRows rows of k (g's).
  T* bs = reinterpret_cast<T*>(dynamic_shared());
  T* as = bs + chunk * kWidth;
  const int t = static_cast<int>(threadIdx.x), lane = t % 32, warp = t / 32;
  const int64_t col_blocks = (n + kWidth - 1) / kWidth;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / col_blocks * kRows;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) % col_blocks * kWidth;
  const int64_t j = j0 + t;
  FinishInputs<T> in[kRows];
  serial_finish_inputs<T, kRows>(m, n, r0, j, ldc, f, in);
  stage(bs, b + j0, ldb, chunk, kWidth, kWidth, chunk, smaller(kWidth, n - j0), vectors_b);
  // The gradient kernel's first loads (gy, the warp's label) with the labels counted.
  const int64_t i = r0 + warp;  // the row of g warp `warp` computes, where warp < kRows
  const bool computes = warp < kRows && i < m;
  const T gy = *loss.gy;
  const int64_t label = computes ? static_cast<int64_t>(loss.labels[i]) : 0;
  __shared__ int64_t sh[32];
  int64_t count = 0;
  for (int64_t r = t; r < m; r += kWidth)
    count += static_cast<int64_t>(loss.labels[r]) != loss.ignore ? 1 : 0;
  count = group_reduce<SumOp, kWidth>(count, sh);
  const T scale = cross_entropy_grad_scale(gy, count);
  if (warp < kRows) {
    T* arow = as + warp * chunk;
    if (computes) {
      const bool first = j0 == 0;  // stores the row and reports its label
      T* grow = loss.g + i * k;
      cross_entropy_grad_row(loss.logits + i * k, label, i, k, loss.ignore, scale, lane, first,
                             loss.errors, loss.kind, [&](int64_t p, T v) {
                               arow[p] = v;
                               if (first) grow[p] = v;
                             });
    } else {
      for (int p = lane; p < chunk; p += 32) arow[p] = T(0);
    }
  }
  wait_async_copies();
  __syncthreads();
  T acc[kRows] = {};
  serial_products<T, kRows>(as, bs, chunk, chunk, t, acc);
  serial_store<T, kRows>(m, n, r0, j, c, ldc, f, in, acc);
}

}  // namespace encore::kernels::cuda
