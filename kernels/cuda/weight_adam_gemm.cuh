// A linear's weight and bias gradients and the Adam updates of the two parameters, in one kernel:
// c = a^T b (a [k, m] the output gradient gy, b [k, n] the input x) and a's column sums (the bias
// gradient sum(gy, 0)), each element stored, then the parameter element it is the gradient of
// updated by Adam from it. The planner folds a WeightBiasGrad (or a weight gradient's Matmul) and
// the AdamUpdate groups reading its outputs into one WeightGradAdam step where this kernel runs
// the product (schedule/update_folds.cc): the optimizer's kernel, a training step's last, leaves
// its critical path.
//
// It is small_gemm.cuh's kSerialK kernel (serial_product, its column sums after the product's
// blocks), each output finished by adam_element (adam_element.cuh, the update kernel's own code)
// after its store. Each warp counts its parameter's step (count_step, over the warps of all the
// blocks updating the parameter: the product's for the weight, the column sums' for the bias) and
// computes the bias corrections from it, as each block of the update kernel does; the thread's
// parameter, m and v are loaded before the product. So the gradients and the updated parameter
// and state have the bits of the product's and the update's kernels.
//
// The host compiles this file too (tests/nvrtc/weight_adam_gemm_emulated_test.cc runs it on the
// host against the kernels it replaces).
#pragma once

#include <cstdint>

#include "kernels/cuda/adam_element.cuh"
#include "kernels/cuda/small_gemm.cuh"
#include "runtime/small_gemm.h"

namespace encore::kernels::cuda {

// runtime/small_gemm.h bounds the warps that count a step (cuda_small_gemm_updates_parameters).
static_assert(kMaxStepArrivals == int64_t{1} << (64 - kArrivalShift) &&
              kSmallGemmBlock == kSmallGemmThreads);

// One parameter's arrays and step counter (laid out as its gradient: the weight as c, the bias as
// the column sums).
template <typename T>
struct AdamArrays {
  T* p = nullptr;
  T* m = nullptr;
  T* v = nullptr;
  int64_t* t = nullptr;
};

// Launched as small_gemm_launch(false, m, n, sums != nullptr) says, with
// serial_shared_bytes<T, kRows>(chunk) of dynamic shared memory, chunk = serial_chunk<T, kRows>(k):
// c [m, n] (row-major, n apart, as the weight) = a^T b (a stored [k, m], lda apart; b [k, n], ldb
// apart; vectors_b: stages_vectors(b, ldb)) and the weight's update; with `sums`, the blocks
// after the product's store a's column sums there and update the bias. Adam's attributes are
// `attrs`, or where `live` points (as adam_kernel's, optim.cuh). Reports a step count the
// counters cannot keep as `op`'s, the weight parameter 0 and the bias 1.
template <typename T, int kRows>
__global__ void __launch_bounds__(kSmallGemmThreads)
    gemm_weight_adam_kernel(int64_t m, int64_t n, int64_t k, int chunk, const T* __restrict__ a,
                            int64_t lda, const T* __restrict__ b, int64_t ldb, bool vectors_b,
                            T* __restrict__ c, T* __restrict__ sums, AdamArrays<T> weight,
                            AdamArrays<T> bias, AdamAttrs attrs, const AdamAttrs* live, Op op,
                            encore::cuda::DeviceErrorSlot errors) {
  dependent_launch_start();
  const AdamAttrs live_or_own = live != nullptr ? *live : attrs;
  const AdamStep<T> s = adam_step<T>(live_or_own);
  constexpr int kWidth = kSmallGemmThreads, kWarps = kSmallGemmThreads / 32;
  const int64_t col_blocks = (n + kWidth - 1) / kWidth;
  const int64_t product_blocks = (m + kRows - 1) / kRows * col_blocks;
  if (static_cast<int64_t>(blockIdx.x) >= product_blocks) {  // the bias (sums set)
    const unsigned sum_blocks = gridDim.x - static_cast<unsigned>(product_blocks);
    const int64_t r = (blockIdx.x - product_blocks) * kWidth + threadIdx.x;
    T p0{}, m0{}, v0{};
    if (r < m) {
      p0 = bias.p[r];
      m0 = bias.m[r];
      v0 = bias.v[r];
    }
    const AdamCorrections<T> cor = count_adam_step(s, bias.t, sum_blocks * kWarps, errors, op, 1);
    if (r < m) {
      const T g = column_sum_in_order(a + r, lda, k);
      sums[r] = g;
      adam_element(s, cor, bias.p, bias.m, bias.v, r, p0, g, m0, v0);
    }
    return;
  }
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / col_blocks * kRows;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) % col_blocks * kWidth;
  const int64_t j = j0 + threadIdx.x;
  T p0[kRows] = {}, m0[kRows] = {}, v0[kRows] = {};
#pragma unroll
  for (int i = 0; i < kRows; ++i)
    if (j < n && r0 + i < m) {
      const int64_t at = (r0 + i) * n + j;
      p0[i] = weight.p[at];
      m0[i] = weight.m[at];
      v0[i] = weight.v[at];
    }
  const AdamCorrections<T> cor =
      count_adam_step(s, weight.t, static_cast<unsigned>(product_blocks) * kWarps, errors, op, 0);
  T acc[kRows] = {};
  serial_product<T, kRows>(m, k, chunk, /*trans_a=*/true, a, lda, b, ldb, vectors_b, r0, j0,
                           smaller(kWidth, n - j0), acc);
  if (j >= n) return;
#pragma unroll
  for (int i = 0; i < kRows; ++i)
    if (r0 + i < m) {
      const int64_t at = (r0 + i) * n + j;
      c[at] = acc[i];
      adam_element(s, cor, weight.p, weight.m, weight.v, at, p0[i], acc[i], m0[i], v0[i]);
    }
}

}  // namespace encore::kernels::cuda
