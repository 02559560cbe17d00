// The kernels of 2-D max and average pooling over NCHW tensors on CUDA, and of their gradients
// (pool.cu launches them; the semantics of kernels/cpu/pool.cc, bit for bit).
//
// Windows are clipped to the input (the routine keeps padding <= kernel / 2, so none is empty):
// for max pooling the padding acts as -inf. One thread computes one output element:
//  - max: the window scanned in row-major order with the CPU's max (a NaN wins), so the value is
//    the CPU's; the first maximum (the first element equal to it, or the first NaN) takes the
//    gradient;
//  - average: each window row summed left to right from its first element, the row sums added
//    top to bottom, then divided by kh * kw (count_include_pad) or by the elements the clipped
//    window covers, as the CPU's separable passes do.
// The gradients are gathers, one thread per input element, with no atomics: max sums gy over the
// windows whose first maximum (recomputed per window) is this element, in increasing (row,
// column) order of the windows, into zero; average adds, into zero, the column sums (each over
// increasing window rows, from zero) of gy / divisor, first of the clipped windows by increasing
// column, then of the inner ones by decreasing column: the CPU's order of additions exactly.
//
// The host compiles this file too, against stand-ins for the CUDA built-ins
// (tests/nvrtc/pool_emulated_test.cc runs the kernels on the host against the CPU's bits).
#pragma once

#include <cuda/std/limits>

#include <cstdint>

#include "kernels/pool_geometry.h"

namespace encore::kernels::cuda {

// The CPU's max: b when it is larger or NaN, else a (so a NaN in either gives NaN).
template <typename T>
__host__ __device__ __forceinline__ T max_nan(T a, T b) {
  const T m = b > a ? b : a;
  return b != b ? b : m;
}

// Max of window (oh, ow) of plane xp, scanned in row-major order.
template <typename T>
__host__ __device__ T window_max(const T* xp, const PoolGeometry& g, int64_t oh, int64_t ow) {
  const int64_t r0 = g.row_begin(oh), r1 = g.row_end(oh);
  const int64_t c0 = g.col_begin(ow), c1 = g.col_end(ow);
  if (r0 >= r1 || c0 >= c1) return -::cuda::std::numeric_limits<T>::infinity();
  T m = xp[r0 * g.w + c0];  // max_nan(m, m) is m: the first element may be read again
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) m = max_nan(m, xp[r * g.w + c]);
  return m;
}

// The index in its plane of the first maximum of window (oh, ow): the first element equal to the
// window's max, or the first NaN when there is one (-1 for an empty window).
template <typename T>
__host__ __device__ int64_t window_argmax(const T* xp, const PoolGeometry& g, int64_t oh,
                                          int64_t ow) {
  const int64_t r0 = g.row_begin(oh), r1 = g.row_end(oh);
  const int64_t c0 = g.col_begin(ow), c1 = g.col_end(ow);
  if (r0 >= r1 || c0 >= c1) return -1;
  int64_t at = r0 * g.w + c0;
  T best = xp[at];
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const T v = xp[r * g.w + c];
      // Strictly larger, or the first NaN: earlier equal elements keep it.
      if (v > best || (v != v && best == best)) {
        best = v;
        at = r * g.w + c;
      }
    }
  return at;
}

// Sum of window (oh, ow): each row from its first element left to right, the rows top to bottom.
template <typename T>
__host__ __device__ T window_sum(const T* xp, const PoolGeometry& g, int64_t oh, int64_t ow) {
  const int64_t r0 = g.row_begin(oh), r1 = g.row_end(oh);
  const int64_t c0 = g.col_begin(ow), c1 = g.col_end(ow);
  if (r0 >= r1 || c0 >= c1) return T(0);
  T total = T(0);
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = xp + r * g.w;
    T row = xr[c0];
    for (int64_t c = c0 + 1; c < c1; ++c) row += xr[c];
    total = r == r0 ? row : total + row;
  }
  return total;
}

// ---- One output element (forward) or one input element (gradient) per call ----------------

// Output element i (flat over [planes, ho, wo]) of max pooling.
template <typename T>
__host__ __device__ T max_pool_at(const T* x, const PoolGeometry& g, int64_t i) {
  const int64_t out_plane = g.ho * g.wo;
  const int64_t p = i / out_plane, q = i - p * out_plane;
  const int64_t oh = q / g.wo, ow = q - oh * g.wo;
  return window_max(x + p * g.h * g.w, g, oh, ow);
}

// Output element i of average pooling.
template <typename T>
__host__ __device__ T avg_pool_at(const T* x, const PoolGeometry& g, int64_t i) {
  const int64_t out_plane = g.ho * g.wo;
  const int64_t p = i / out_plane, q = i - p * out_plane;
  const int64_t oh = q / g.wo, ow = q - oh * g.wo;
  return window_sum(x + p * g.h * g.w, g, oh, ow) / g.divisor<T>(oh, ow);
}

// Input element i (flat over [planes, h, w]) of the max-pooling gradient: 0 + the gy of every
// window whose first maximum it is, in increasing (oh, ow).
template <typename T>
__host__ __device__ T max_pool_grad_at(const T* x, const T* gy, const PoolGeometry& g, int64_t i) {
  const int64_t in_plane = g.h * g.w;
  const int64_t p = i / in_plane, e = i - p * in_plane;
  const int64_t r = e / g.w, c = e - r * g.w;
  const T* xp = x + p * in_plane;
  const T* gp = gy + p * g.ho * g.wo;
  const int64_t oh0 = g.first_row_window(r), oh1 = g.last_row_window(r);
  const int64_t ow0 = g.first_col_window(c), ow1 = g.last_col_window(c);
  T acc = T(0);
  for (int64_t oh = oh0; oh <= oh1; ++oh)
    for (int64_t ow = ow0; ow <= ow1; ++ow)
      if (window_argmax(xp, g, oh, ow) == e) acc += gp[oh * g.wo + ow];
  return acc;
}

// The share of an input element in input rows [oh0, oh1]'s windows of output column ow: 0 +
// gy / divisor over those output rows in increasing order.
template <typename T>
__host__ __device__ T column_share(const T* gp, const PoolGeometry& g, int64_t oh0, int64_t oh1,
                                   int64_t ow) {
  T s = T(0);
  for (int64_t oh = oh0; oh <= oh1; ++oh) s += gp[oh * g.wo + ow] / g.divisor<T>(oh, ow);
  return s;
}

// Input element i of the average-pooling gradient.
template <typename T>
__host__ __device__ T avg_pool_grad_at(const T* gy, const PoolGeometry& g, int64_t i) {
  const int64_t in_plane = g.h * g.w;
  const int64_t p = i / in_plane, e = i - p * in_plane;
  const int64_t r = e / g.w, c = e - r * g.w;
  const T* gp = gy + p * g.ho * g.wo;
  const int64_t oh0 = g.first_row_window(r), oh1 = g.last_row_window(r);
  const int64_t ow0 = g.first_col_window(c), ow1 = g.last_col_window(c);
  T acc = T(0);
  if (oh0 > oh1) return acc;
  // The CPU adds the clipped windows' columns first, in increasing column, then the inner
  // windows', a window column at a time: in decreasing output column for one element.
  for (int64_t ow = ow0; ow <= ow1; ++ow)
    if (ow < g.inner_begin || ow >= g.inner_end) acc += column_share(gp, g, oh0, oh1, ow);
  for (int64_t ow = ow1; ow >= ow0; --ow)
    if (ow >= g.inner_begin && ow < g.inner_end) acc += column_share(gp, g, oh0, oh1, ow);
  return acc;
}

// ---- Kernels: grid-stride loops over the elements -------------------------------------------

template <typename T>
__global__ void max_pool_kernel(const T* __restrict__ x, T* __restrict__ y, PoolGeometry g,
                                int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = max_pool_at(x, g, i);
}

template <typename T>
__global__ void avg_pool_kernel(const T* __restrict__ x, T* __restrict__ y, PoolGeometry g,
                                int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = avg_pool_at(x, g, i);
}

template <typename T>
__global__ void max_pool_grad_kernel(const T* __restrict__ x, const T* __restrict__ gy,
                                     T* __restrict__ gx, PoolGeometry g, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    gx[i] = max_pool_grad_at(x, gy, g, i);
}

template <typename T>
__global__ void avg_pool_grad_kernel(const T* __restrict__ gy, T* __restrict__ gx, PoolGeometry g,
                                     int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    gx[i] = avg_pool_grad_at(gy, g, i);
}

}  // namespace encore::kernels::cuda
