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

// Elements column_sum_in_order loads at a time: a multiple of every split.
inline constexpr int kSumBatch = 32;

// The tree's levels from kHalf down: part[t] joins part[t + kHalf] for t < kHalf, then kHalf / 2.
template <int kHalf, typename T, int kSplit>
__device__ __forceinline__ void join_parts(T (&part)[kSplit]) {
  if constexpr (kHalf > 0) {
#pragma unroll
    for (int t = 0; t < kHalf; ++t) part[t] = SumOp::combine(part[t], part[t + kHalf]);
    join_parts<kHalf / 2>(part);
  }
}
// p[0] + p[stride] + ... + p[(n - 1) stride] as reduce_columns adds them, kSplit =
// column_split(n): part t folds elements t, t + kSplit, ... from +0, then the tree joins part t
// with part t + s for s = kSplit / 2, kSplit / 4, ..., 1. The elements are loaded kSumBatch at a
// time, all in flight, before they are folded (one round trip to memory per batch, not one per
// element): the folds keep their order, so the bits are those of the plain loop.
template <int kSplit, typename T>
__device__ __forceinline__ T column_sum_split(const T* p, int64_t stride, int64_t n) {
  static_assert(kSumBatch % kSplit == 0);
  T part[kSplit];
#pragma unroll
  for (int t = 0; t < kSplit; ++t) part[t] = SumOp::identity<T>();
  for (int64_t base = 0; base < n; base += kSumBatch) {
    T v[kSumBatch];
#pragma unroll
    for (int q = 0; q < kSumBatch; ++q)
      v[q] = base + q < n ? p[(base + q) * stride] : SumOp::identity<T>();
#pragma unroll
    for (int q = 0; q < kSumBatch; ++q)
      if (base + q < n) part[q % kSplit] = SumOp::combine(part[q % kSplit], v[q]);
  }
  join_parts<kSplit / 2>(part);
  return part[0];
}

// p[0] + p[stride] + ... + p[(n - 1) stride] as reduce_columns adds them.
template <typename T>
__device__ T column_sum_in_order(const T* p, int64_t stride, int64_t n) {
  static_assert(kMaxColumnSplit == 32);
  switch (column_split(n)) {
    case 1:
      return column_sum_split<1>(p, stride, n);
    case 2:
      return column_sum_split<2>(p, stride, n);
    case 4:
      return column_sum_split<4>(p, stride, n);
    case 8:
      return column_sum_split<8>(p, stride, n);
    case 16:
      return column_sum_split<16>(p, stride, n);
    default:
      return column_sum_split<32>(p, stride, n);
  }
}

}  // namespace encore::kernels::cuda
