// The combining rules of the sum, mean and max kernels (reduce.cc) and their reduction of one
// contiguous row, shared with the fused kernel (fused_rows.h), which reduces rows of a block with
// these very functions so that a fused step gives the reduction kernel's bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace encore::kernels::cpu {

struct SumOp {
  template <typename T>
  static constexpr T init() {
    return T(0);
  }
  template <typename T>
  static T combine(T a, T b) {
    return a + b;
  }
};

struct MaxOp {
  template <typename T>
  static constexpr T init() {
    if constexpr (std::numeric_limits<T>::has_infinity) return -std::numeric_limits<T>::infinity();
    return std::numeric_limits<T>::lowest();
  }
  // A NaN in either argument gives NaN, as in NumPy and PyTorch: once the accumulator holds a
  // NaN, b > a is false and it stays. A select, so the lane loops still vectorize.
  template <typename T>
  static T combine(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return b > a || std::isnan(b) ? b : a;
    } else {
      return b > a ? b : a;
    }
  }
};

// Reduction of x[0], x[1], ..., x[n-1] in independent lanes (vectorizable, and more accurate
// for float sums than one running total).
template <typename R, typename T>
T reduce_lanes(const T* x, int64_t n) {
  constexpr int kLanes = 128 / sizeof(T);
  if (n < kLanes) {  // the lanes would all fold to init: the same bits without them
    T r = R::template init<T>();
    for (int64_t i = 0; i < n; ++i) r = R::combine(r, x[i]);
    return r;
  }
  T acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = R::template init<T>();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = R::combine(acc[j], x[i + j]);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] = R::combine(acc[j], acc[j + w]);
  T r = acc[0];
  for (; i < n; ++i) r = R::combine(r, x[i]);
  return r;
}

// Reduction of x[0], ..., x[n-1] as a cascade: blocks of 128 elements per lane reduced by
// reduce_lanes, then halves of the blocks combined pairwise. Each lane adds at most 128 terms,
// so a float32 sum of millions of elements keeps its accuracy (one lane adding n / 32 terms
// does not); the order depends on n alone.
template <typename R, typename T>
T reduce_contiguous(const T* x, int64_t n) {
  constexpr int64_t kBlock = 128 / sizeof(T) * 128;
  if (n <= kBlock) return reduce_lanes<R>(x, n);
  const int64_t left = (n + kBlock - 1) / kBlock / 2 * kBlock;  // half the blocks, at least one
  return R::combine(reduce_contiguous<R>(x, left), reduce_contiguous<R>(x + left, n - left));
}

// What the reduction kernel writes for one row of n > 1 contiguous elements reduced over the
// last axis: the row's lanes combined into the output's initial value, or, when the row is the
// whole input (`whole`, every axis reduced), the lanes alone.
template <typename R, typename T>
T reduce_last_axis_row(const T* x, int64_t n, bool whole) {
  const T r = reduce_contiguous<R>(x, n);
  return whole ? r : R::combine(R::template init<T>(), r);
}

}  // namespace encore::kernels::cpu
