// The order in which CUDA sums a column (reduce.cuh's reduce_columns, an output whose reduced
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

// The fold of column elements t, t + kSplit, ... (a thread row's part) when kStride == kSplit;
// else the tree's join of the parts t and t + kStride below it. column_tree<kSplit, 1>(.., 0) is
// reduce_columns' tree (rows split / 2 apart joined first, so part 0's partner is part split / 2,
// ...), each node computed from its children alone: no array of parts, nothing in local memory.
template <int kSplit, int kStride, typename T>
__device__ __forceinline__ T column_tree(const T* p, int64_t stride, int64_t n, int t) {
  if constexpr (kStride == kSplit) {
    T acc = SumOp::identity<T>();
    for (int64_t r = t; r < n; r += kSplit) acc = SumOp::combine(acc, p[r * stride]);
    return acc;
  } else {
    const T left = column_tree<kSplit, kStride * 2>(p, stride, n, t);
    return SumOp::combine(left, column_tree<kSplit, kStride * 2>(p, stride, n, t + kStride));
  }
}

// p[0] + p[stride] + ... + p[(n - 1) stride] as reduce_columns adds them.
template <typename T>
__device__ T column_sum_in_order(const T* p, int64_t stride, int64_t n) {
  static_assert(kMaxColumnSplit == 32);
  switch (column_split(n)) {
    case 1:
      return column_tree<1, 1>(p, stride, n, 0);
    case 2:
      return column_tree<2, 1>(p, stride, n, 0);
    case 4:
      return column_tree<4, 1>(p, stride, n, 0);
    case 8:
      return column_tree<8, 1>(p, stride, n, 0);
    case 16:
      return column_tree<16, 1>(p, stride, n, 0);
    default:
      return column_tree<32, 1>(p, stride, n, 0);
  }
}

}  // namespace encore::kernels::cuda
