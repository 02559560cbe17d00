// The forward of layer normalisation over contiguous rows, shared by the layer_norm kernel
// (layer_norm.cc), which runs layer_norm_rows on each thread's rows, and the fused kernel
// (fused_rows.h), which runs it on the rows of a block: one function, so a fused step gives the
// kernel's bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/sum_lanes.h"

namespace encore::kernels::cpu {

// y = (x - mean) rstd gamma + beta over n elements, rstd = 1/sqrt(biased var + eps); gamma null
// reads 1 and beta null reads 0 (added all the same: -0 + 0 is +0, as eagerly). Mean and variance
// are sums in double (sum_lanes); writes the row's mean and rstd as T.
template <typename T>
void layer_norm_row(const T* x, const T* gamma, const T* beta, T* y, T& mean_out, T& rstd_out,
                    int64_t n, double eps) {
  const double count = static_cast<double>(std::max<int64_t>(n, 1));
  const double mean = sum_lanes(n, [x](int64_t i) { return static_cast<double>(x[i]); }) / count;
  const double var = sum_lanes(n,
                               [x, mean](int64_t i) {
                                 const double d = static_cast<double>(x[i]) - mean;
                                 return d * d;
                               }) /
                     count;
  const T m = static_cast<T>(mean);
  const T rs = static_cast<T>(1.0 / std::sqrt(var + eps));
  mean_out = m;
  rstd_out = rs;
  for (int64_t i = 0; i < n; ++i) {
    const T h = (x[i] - m) * rs;
    y[i] = (gamma != nullptr ? h * gamma[i] : h) + (beta != nullptr ? beta[i] : T(0));
  }
}

// layer_norm_row over `rows` consecutive rows of n elements of x and y, with their means and
// rstds: the loop both callers run (the kernel over its chunk of rows, the fused kernel over a
// block's), so each gets the row function inlined into the same loop.
template <typename T>
void layer_norm_rows(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd,
                     int64_t rows, int64_t n, double eps) {
  for (int64_t r = 0; r < rows; ++r)
    layer_norm_row(x + r * n, gamma, beta, y + r * n, mean[r], rstd[r], n, eps);
}

}  // namespace encore::kernels::cpu
