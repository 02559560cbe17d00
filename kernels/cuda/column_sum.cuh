// The order in which CUDA sums a column (reduce.cu's reduce_columns, an output whose reduced
// elements lie `stride` apart): column_split(n) thread rows each fold every split-th element from
// their own on, starting at +0, then a tree joins the rows' parts (split / 2 apart, then split /
// 4, ...). column_sum_in_order repeats that order in one thread, so that another kernel can
// compute a sum with the reduction's bits: the small GEMM kernel's bias gradient
// (small_gemm.cuh). Host-compilable (element_ops.cuh only), as small_gemm.cuh.
#pragma once

#include <cstdint>

#include "kernels/cuda/element_ops.cuh"

namespace encore::kernels::cuda {

// Thread rows per column: about 16 elements each, a power of two up to kMaxColumnSplit.
inline constexpr int kMaxColumnSplit = 32;
__host__ __device__ constexpr int column_split(int64_t n) {
  int split = 1;
  while (split < kMaxColumnSplit && split * 2 * 16 <= n) split *= 2;
  return split;
}

// p[0] + p[stride] + ... + p[(n - 1) stride] as reduce_columns adds them.
template <typename T>
__device__ T column_sum_in_order(const T* p, int64_t stride, int64_t n) {
  const int split = column_split(n);
  T part[kMaxColumnSplit];
  for (int t = 0; t < split; ++t) {
    T acc = SumOp::identity<T>();
    for (int64_t r = t; r < n; r += split) acc = SumOp::combine(acc, p[r * stride]);
    part[t] = acc;
  }
  for (int s = split / 2; s > 0; s /= 2)
    for (int t = 0; t < s; ++t) part[t] = SumOp::combine(part[t], part[t + s]);
  return part[0];
}

}  // namespace encore::kernels::cuda
