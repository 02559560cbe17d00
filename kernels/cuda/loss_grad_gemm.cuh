// A loss's gradient and the product that reads it, in one kernel: c = g b, g [m, k] the
// cross-entropy gradient of logits [m, k] (a classifier's last linear: its input gradient g W),
// finished as the small GEMMs finish their outputs (an activation gradient after it), and g
// itself stored beside c. Optionally the logits too, x w^T + bias of that last linear. The planner
// folds a SoftmaxCrossEntropyGrad and the Matmul (or MatmulActGrad) reading its output into one
// LossGradMatmul step where this kernel runs the product, and the Linear computing the logits into
// it where the kernel holds that product too (runtime/small_gemm.h:
// cuda_small_gemm_computes_loss_grad, cuda_small_gemm_computes_logits): one kernel for two or
// three on a training step's critical path.
//
// It is small_gemm.cuh's kSerialK kernel with all of k in one chunk, whose block, rather than
// copying its kRows rows of a into shared memory, computes them there: warp w row r0 + w, by
// cross_entropy_grad_row (softmax_loss.cuh), the gradient kernel's own code, after counting the
// non-ignored labels over all m rows as each of that kernel's blocks does. Its row of logits is
// read where the loss's gradient read it, or (kLinear) computed by the same warp from the block's
// rows of x and all of w, staged beside b's rows: lane l multiplies and adds hidden = l, l + 32,
// ... in order, then the lanes' sums meet in the butterfly (xor 16, 8, 4, 2, 1), then the bias:
// the dot kernel's order (each sum of its halving butterfly is one of these, small_gemm.cuh), so
// the logits have the linear's bits. b's rows are copied meanwhile (asynchronous copies). Then
// the multiply-adds and stores are kSerialK's (serial_products, serial_store). So the logits, g
// and c have the bits of the linear's, the gradient's and the product's kernels. The blocks of the
// first column block store the logits and g's rows and report an out-of-range label (NaN rows, as
// the gradient kernel's; as the loss's where they compute the logits, since the plan then runs the
// loss after them, which eagerly fails first), the others only use them.
//
// The host compiles this file too (tests/nvrtc/loss_grad_gemm_emulated_test.cc runs it on the
// host against the kernels it replaces).
#pragma once

#include <cstdint>

#include "kernels/cuda/small_gemm.cuh"
#include "kernels/cuda/softmax_loss.cuh"
#include "runtime/small_gemm.h"

namespace encore::kernels::cuda {

// runtime/small_gemm.h sizes what a block stages (and checks the class limits) with these.
static_assert(kLossGradRows == kSerialRows && kSmallGemmBlock == kSmallGemmThreads &&
              kSmallGemmSharedBytes == kMaxDynamicSharedBytes);
// A block computes up to kSerialRows rows of g, a warp each.
static_assert(kSerialRows <= kSmallGemmThreads / 32);

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

// The logits of g's rows where the kernel computes them (kLinear): x [m, hidden] times
// w [k, hidden]^T plus bias (null: none), stored at `logits` by the first column of blocks.
// vectors_x, vectors_w: stages_vectors(x, hidden), stages_vectors(w, hidden).
template <typename T>
struct LogitsRows {
  const T* x = nullptr;
  const T* w = nullptr;
  const T* bias = nullptr;
  T* logits = nullptr;
  int64_t hidden = 0;
  bool vectors_x = false, vectors_w = false;
};

// The dynamic shared memory of a launch, its only shared memory (loss_grad_shared_elements'
// layout, in this order: the label counts' scratch; b's k rows of kSmallGemmThreads; where kLinear
// w's k rows and the block's kRows rows of x, each `hidden` rounded up to a 16-byte vector; kRows
// rows of g; where kLinear kRows rows of logits and the bias).
template <typename T, int kRows, bool kLinear>
size_t loss_grad_shared_bytes(int64_t k, int64_t hidden) {
  return static_cast<size_t>(loss_grad_shared_elements(k, kRows, kLinear ? hidden : 0, kVec16<T>)) *
         sizeof(T);
}

// Launched as small_gemm_launch(false, m, n) says, kRows its rows, with
// loss_grad_shared_bytes<T, kRows, kLinear>(k, lin.hidden) of dynamic shared memory
// (cuda_small_gemm_computes_loss_grad, or _logits where kLinear, holds): block b computes rows
// b / col_blocks * kRows on, the kSmallGemmThreads columns from b % col_blocks * kSmallGemmThreads
// on. b is stored [k, n]; vectors_b: stages_vectors(b, ldb). Where kLinear, the logits come from
// `lin` (loss.logits is not read), else from loss.logits.
template <typename T, typename L, int kRows, bool kLinear>
__global__ void __launch_bounds__(kSmallGemmThreads)
    gemm_loss_grad_kernel(int64_t m, int64_t n, int64_t k, LossGradRows<T, L> loss,
                          LogitsRows<T> lin, const T* __restrict__ b, int64_t ldb, bool vectors_b,
                          T* __restrict__ c, int64_t ldc, GemmFinish<T> f) {
  dependent_launch_start();
  constexpr int kWidth = kSmallGemmThreads;
  const int chunk = static_cast<int>(k);
  const int hidden = kLinear ? static_cast<int>(lin.hidden) : 0;
  const int width = (hidden + kVec16<T> - 1) / kVec16<T> * kVec16<T>;
  // The label counts' scratch (4 int64 of two 16-byte vectors), then the staged rows.
  int64_t* sh = reinterpret_cast<int64_t*>(dynamic_shared());
  T* bs = reinterpret_cast<T*>(dynamic_shared() + 2 * 16);
  T* ws = bs + chunk * kWidth;
  T* xs = ws + (kLinear ? chunk * width : 0);
  T* as = xs + (kLinear ? kRows * width : 0);
  T* ls = as + kRows * chunk;
  T* biases = ls + kRows * chunk;
  const int t = static_cast<int>(threadIdx.x), lane = t % 32, warp = t / 32;
  const int64_t col_blocks = (n + kWidth - 1) / kWidth;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / col_blocks * kRows;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) % col_blocks * kWidth;
  const int64_t j = j0 + t;
  const bool first = j0 == 0;  // the blocks that store the logits and g and report a label
  FinishInputs<T> in[kRows];
  serial_finish_inputs<T, kRows>(m, n, r0, j, ldc, f, in);
  stage(bs, b + j0, ldb, chunk, kWidth, kWidth, chunk, smaller(kWidth, n - j0), vectors_b);
  if constexpr (kLinear) {
    stage(ws, lin.w, hidden, chunk, width, width, chunk, hidden, lin.vectors_w);
    stage(xs, lin.x + r0 * hidden, hidden, kRows, width, width, smaller(kRows, m - r0), hidden,
          lin.vectors_x);
    if (lin.bias != nullptr && t < chunk) copy_async<sizeof(T)>(&biases[t], lin.bias + t);
  }
  // The gradient kernel's first loads (gy, the warp's label) with the labels counted.
  const int64_t i = r0 + warp;  // the row of g warp `warp` computes, where warp < kRows
  const bool computes = warp < kRows && i < m;
  const T gy = *loss.gy;
  const int64_t label = computes ? static_cast<int64_t>(loss.labels[i]) : 0;
  int64_t count = 0;
  for (int64_t r = t; r < m; r += kWidth)
    count += static_cast<int64_t>(loss.labels[r]) != loss.ignore ? 1 : 0;
  count = group_reduce<SumOp, kWidth>(count, sh);
  const T scale = cross_entropy_grad_scale(gy, count);
  const T* logits = loss.logits + i * k;  // the warp's row of logits
  if constexpr (kLinear) {
    wait_async_copies();
    __syncthreads();
    if (computes) {
      T* lrow = ls + warp * chunk;
      const T* xrow = xs + warp * width;
      for (int q = 0; q < chunk; ++q) {  // logit q: the dot kernel's order, then the bias
        const T* wrow = ws + q * width;
        T v = T(0);
        for (int p = lane; p < hidden; p += 32) v = fma_of(xrow[p], wrow[p], v);
#pragma unroll
        for (int o = 16; o > 0; o /= 2) v = el::add(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lin.bias != nullptr) v = el::add(v, biases[q]);
        if (lane == 0) {
          lrow[q] = v;
          if (first) lin.logits[i * k + q] = v;
        }
      }
      __syncwarp();
      logits = lrow;
    }
  }
  if (warp < kRows) {
    T* arow = as + warp * chunk;
    if (computes) {
      T* grow = loss.g + i * k;
      // A bad label is reported as the loss's where the logits are computed here: the loss, which
      // the step runs before here eagerly, fails on it first (schedule/loss_folds.cc).
      const Op op = kLinear ? Op::SoftmaxCrossEntropy : Op::SoftmaxCrossEntropyGrad;
      cross_entropy_grad_row(logits, label, i, k, loss.ignore, scale, lane, first, op, loss.errors,
                             loss.kind, [&](int64_t p, T v) {
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
