// Lane helpers shared by the softmax kernels (softmax.cc), the softmax cross-entropy loss
// (loss.cc) and the fused kernel (fused_rows.h), which runs softmax rows with these functions.
// A lane is n elements of x at stride s; pass kUnitStride for contiguous rows so the loops are
// compiled with a unit stride.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace encore::kernels::cpu {

using UnitStride = std::integral_constant<int64_t, 1>;
inline constexpr UnitStride kUnitStride{};

// The largest element of a lane, NaN when the lane holds one (PyTorch's max: a row with a NaN
// is NaN throughout); 0 for an empty lane.
template <typename T, typename S>
T lane_max(const T* x, int64_t n, S s) {
  T m = n > 0 ? x[0] : T(0);
  for (int64_t i = 1; i < n; ++i) m = x[i * s] > m || x[i * s] != x[i * s] ? x[i * s] : m;
  return m;
}

// The sum of term(i) over [0, n): in order within blocks of kSumBlock terms, then the blocks'
// sums in order. A lane of up to kSumBlock elements sums exactly as one loop would; a longer one
// keeps its rounding error near (kSumBlock + n / kSumBlock) ulps instead of n (a row of 2^25
// equal logits: 1 instead of 2, one running float sum having stopped growing at 2^24 terms).
inline constexpr int64_t kSumBlock = 1024;
template <typename T, typename Term>
T blocked_sum(int64_t n, Term term) {
  T total = 0;
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t end = b + kSumBlock < n ? b + kSumBlock : n;
    T part = 0;
    for (int64_t i = b; i < end; ++i) part += term(i);
    total += part;
  }
  return total;
}

// sum(exp(x - m)) over a lane; with kStore, also writes exp(x - m) to y.
template <bool kStore, typename T, typename S>
T sum_exp(const T* x, T* y, int64_t n, S s, T m) {
  return blocked_sum<T>(n, [&](int64_t i) {
    const T e = std::exp(x[i * s] - m);
    if constexpr (kStore) y[i * s] = e;
    return e;
  });
}

// log(sum(exp(x))) over a lane, computed after subtracting its maximum so exp cannot overflow.
template <typename T, typename S>
T log_sum_exp(const T* x, int64_t n, S s) {
  const T m = lane_max(x, n, s);
  return m + std::log(sum_exp<false>(x, static_cast<T*>(nullptr), n, s, m));
}

// y = softmax(x) or log_softmax(x) along one lane.
template <bool kLog, typename T, typename S>
void softmax_lane(const T* x, T* y, int64_t n, S s) {
  const T m = lane_max(x, n, s);
  const T sum = sum_exp<!kLog>(x, y, n, s, m);
  if constexpr (kLog) {
    const T log_sum = std::log(sum);
    for (int64_t i = 0; i < n; ++i) y[i * s] = x[i * s] - m - log_sum;
  } else {
    const T inv = T(1) / sum;
    for (int64_t i = 0; i < n; ++i) y[i * s] *= inv;
  }
}

// softmax: gx = y * (gy - sum(gy * y)); log_softmax: gx = gy - exp(y) * sum(gy).
template <bool kLog, typename T, typename S>
void softmax_grad_lane(const T* y, const T* gy, T* gx, int64_t n, S s) {
  const T dot =
      blocked_sum<T>(n, [&](int64_t i) { return kLog ? gy[i * s] : gy[i * s] * y[i * s]; });
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (kLog) {
      gx[i * s] = gy[i * s] - std::exp(y[i * s]) * dot;
    } else {
      gx[i * s] = y[i * s] * (gy[i * s] - dot);
    }
  }
}

}  // namespace encore::kernels::cpu
