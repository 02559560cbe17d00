// The im2col + GEMM path of the convolution kernels (conv.cc): for strides other than 1, for
// 1x1 unpadded stride-1 convolutions (the input is its own im2col: a plain GEMM) and for weight
// gradients with many taps on small images, or everywhere when ENCORE_CONV_IM2COL=1. Each image
// (forward, input gradient) or each part of the weight gradient's columns is one thread's, so
// the bits do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/conv_geometry.h"
#include "kernels/cpu/kernel.h"
#include "kernels/cpu/scratch.h"
#include "runtime/parallel.h"

namespace encore::kernels::cpu::conv {

inline void check_gemm_sizes(Op op, const Geometry& g) {
  check_blas_sizes(op, {g.pixels(), g.taps(), g.og});
}

// The output columns c with 0 <= c s - p + j d < size: [lo, hi).
inline void valid_columns(int64_t out, int64_t size, int64_t s, int64_t p, int64_t offset,
                          int64_t& lo, int64_t& hi) {
  const int64_t first = p - offset;  // need c s >= first
  lo = first <= 0 ? 0 : std::min(out, (first + s - 1) / s);
  const int64_t last = size - 1 + p - offset;  // need c s <= last
  hi = last < 0 ? 0 : std::min(out, last / s + 1);
  hi = std::max(hi, lo);
}

// Calls row(at, inside, base, lo, hi) for each row of the im2col matrix, in order: at its first
// entry (col[(s kh + i) kw + j][r wo]), whether it reads input row r sh - ph + i dh at all, and if
// so, entry c in [lo, hi) reads x[base + c sw] (the rest is padding).
template <typename Row>
void for_each_col_row(const Geometry& g, Row&& row) {
  const int64_t p = g.pixels();
  for (int64_t s = 0; s < g.cg; ++s)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t tap = ((s * g.kh + i) * g.kw + j) * p;
        int64_t lo, hi;
        valid_columns(g.wo, g.w, g.sw, g.pw, j * g.dw, lo, hi);
        for (int64_t r = 0; r < g.ho; ++r) {
          const int64_t ih = r * g.sh - g.ph + i * g.dh;
          const bool inside = ih >= 0 && ih < g.h;
          row(tap + r * g.wo, inside, (s * g.h + ih) * g.w - g.pw + j * g.dw, lo, hi);
        }
      }
}

// col[(s kh + i) kw + j][r wo + c] = x[s][r sh - ph + i dh][c sw - pw + j dw], 0 outside.
template <typename T>
void im2col(const Geometry& g, const T* x, T* col) {
  for_each_col_row(g, [&](int64_t at, bool inside, int64_t base, int64_t lo, int64_t hi) {
    T* d = col + at;
    if (!inside) {
      std::fill(d, d + g.wo, T(0));
      return;
    }
    std::fill(d, d + lo, T(0));
    for (int64_t c = lo; c < hi; ++c) d[c] = x[base + c * g.sw];
    std::fill(d + hi, d + g.wo, T(0));
  });
}

// x[s][...] += the entries of col that im2col would have read from them.
template <typename T>
void col2im_add(const Geometry& g, const T* col, T* x) {
  for_each_col_row(g, [&](int64_t at, bool inside, int64_t base, int64_t lo, int64_t hi) {
    if (!inside) return;
    const T* sr = col + at;
    for (int64_t c = lo; c < hi; ++c) x[base + c * g.sw] += sr[c];
  });
}

// The im2col path splits images across threads (forward, input gradient: each image is its own
// GEMMs, so the same bits at any thread count) or the weight gradient's columns (each part sums
// every image in order; the split follows the shapes and num_threads(), see blas.h).
template <typename T>
void gemm_forward(const Geometry& g, const T* x, const T* w, const T* bias, const ActAttrs* act,
                  T* y) {
  const int64_t p = g.pixels(), k = g.taps();
  parallel_for(g.n, grain_for(g.o * k * p), [&](int64_t begin, int64_t end) {
    T* col = g.pointwise() ? nullptr : scratch<T>(kWide, k * p);
    for (int64_t n = begin; n < end; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const T* xg = x + (n * g.c + grp * g.cg) * g.h * g.w;
        T* yg = y + (n * g.o + grp * g.og) * p;
        if (bias != nullptr)
          for (int64_t m = 0; m < g.og; ++m)
            std::fill(yg + m * p, yg + (m + 1) * p, bias[grp * g.og + m]);
        if (col != nullptr) im2col(g, xg, col);
        gemm(false, false, g.og, p, k, w + grp * g.og * k, k, col != nullptr ? col : xg, p,
             bias != nullptr ? T(1) : T(0), yg, p);
        if (act != nullptr) apply_activation(*act, yg, g.og * p);
      }
  });
}

template <typename T>
void gemm_grad_input(const Geometry& g, const T* gy, const T* w, T* gx) {
  const int64_t p = g.pixels(), k = g.taps();
  parallel_for(g.n, grain_for(g.o * k * p), [&](int64_t begin, int64_t end) {
    T* col = g.pointwise() ? nullptr : scratch<T>(kWide, k * p);
    for (int64_t n = begin; n < end; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        T* gxg = gx + (n * g.c + grp * g.cg) * g.h * g.w;
        const T* gyg = gy + (n * g.o + grp * g.og) * p;
        const T* wg = w + grp * g.og * k;
        if (col == nullptr) {
          gemm(true, false, k, p, g.og, wg, k, gyg, p, T(0), gxg, p);
          continue;
        }
        gemm(true, false, k, p, g.og, wg, k, gyg, p, T(0), col, p);
        std::fill(gxg, gxg + g.cg * g.h * g.w, T(0));
        col2im_add(g, col, gxg);
      }
  });
}

template <typename T>
void gemm_grad_weight(const Geometry& g, const T* x, const T* gy, T* gw) {
  const int64_t p = g.pixels(), k = g.taps();
  if (g.n == 0) std::fill(gw, gw + g.o * k, T(0));
  // Parts of kCols columns of gw (taps); each builds the im2col rows it needs.
  constexpr int64_t kCols = 16;
  const int64_t blocks = (k + kCols - 1) / kCols;
  parallel_for(blocks, grain_for(g.n * g.o * kCols * p), [&](int64_t b0, int64_t b1) {
    const int64_t lo = b0 * kCols, cols = std::min(k, b1 * kCols) - lo;
    T* col = g.pointwise() ? nullptr : scratch<T>(kWide, k * p);
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const T* xg = x + (n * g.c + grp * g.cg) * g.h * g.w;
        if (col != nullptr) im2col(g, xg, col);
        const T* src = col != nullptr ? col : xg;
        gemm(false, true, g.og, cols, p, gy + (n * g.o + grp * g.og) * p, p, src + lo * p, p,
             n == 0 ? T(0) : T(1), gw + grp * g.og * k + lo, k);
      }
  });
}

}  // namespace encore::kernels::cpu::conv
