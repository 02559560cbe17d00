// The shared parts of the 2-D pooling kernels (max_pool.cc, avg_pool.cc) over NCHW tensors.
//
// Every (n, c) plane is independent: the kernels split the N*C planes across threads, so each
// output element is computed by one thread in a fixed order (bit-identical at any thread
// count). Windows are clipped to the input; the routine guarantees padding <= kernel / 2 and a
// non-empty input, so every window holds at least one input element.
//
// Pooling is separable: a horizontal pass reduces each input row over the window columns of
// every output column into scratch rows, and a vertical pass reduces those rows over the window
// rows of every output row. For max, both passes keep the first maximum, so their composition is
// the first maximum in row-major order; sums add a window's columns, then its rows, in
// increasing order. The results do not depend on how the loops are blocked or vectorized.
//
// Rows are short (28 columns in the seed CNN), and loops over them would spend their time in
// scalar remainders, so:
// - the horizontal pass runs one flat loop over the rows of a block of planes when the stride
//   divides the width (w == sw * ws, ws >= wo): window o of row r then starts at element
//   (r * ws + o) * sw - pw, linear in q = r * ws + o. The windows it computes across a row's end
//   are garbage that the clipped windows overwrite, or that is never read. Clipped windows read
//   stand-ins for the columns outside the input that leave the result unchanged (MaxOp::tap);
// - the vertical pass, and the 2x2-stride-2 windows (the common case, with their own one-pass
//   loops), go along a row in chunks of one vector (for_chunks).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/kernel.h"
#include "kernels/pool_geometry.h"
#include "runtime/parallel.h"

namespace encore::kernels::cpu::pool {

template <int64_t N>
using Const = std::integral_constant<int64_t, N>;

// The shared geometry (kernels/pool_geometry.h) and the layout of the horizontal pass's scratch.
struct CpuPoolGeometry : PoolGeometry {
  int64_t ws = 0;     // row pitch of the horizontal pass's scratch
  bool flat = false;  // w == sw * ws: one flat loop over rows (see top)
};

// x [N,C,H,W] and y [N,C,Ho,Wo].
inline CpuPoolGeometry geometry(const Shape& x, const Shape& y, const Pool2dAttrs& a) {
  CpuPoolGeometry g{pool_geometry(x, y, a)};
  g.flat = g.w % g.sw == 0 && g.w / g.sw >= g.wo;
  g.ws = g.flat ? g.w / g.sw : g.wo;
  return g;
}

// Runs body(first_plane, count) over the planes: split across threads when there is enough
// work, and within a thread in blocks of about kBlockElements input elements, so that the flat
// loops are long even for small planes and a block's scratch stays in the L1 cache.
template <typename Body>
void for_blocks(const CpuPoolGeometry& g, Body&& body) {
  constexpr int64_t kWorkPerThread = int64_t{1} << 15;  // window reads
  constexpr int64_t kBlockElements = 4096;
  const int64_t per_plane = std::max<int64_t>(1, g.ho * g.wo * g.kh * g.kw);
  const int64_t block = std::max<int64_t>(1, kBlockElements / (g.h * g.w));
  parallel_for(g.planes, std::max<int64_t>(1, kWorkPerThread / per_plane),
               [&](int64_t begin, int64_t end) {
                 for (int64_t p = begin; p < end; p += block) body(p, std::min(block, end - p));
               });
}

// Per-thread scratch (kernels/cpu/scratch.h): what each slot holds depends on the kernel.
enum Slot { kSlot0, kSlot1, kSlot2, kSlots };

// Calls f(Const<KW>{}, Const<SW>{}) with the window width and the column stride as constants
// when they are common, widths 2 and 3 with strides 1 and 2 (so the loops unroll and vectorize
// well), else 0 (read g.kw, g.sw). kSpecialise false: always 0 (float32 is the type to be fast,
// float64 the one to check gradients with: specialising both would double the code).
template <bool kSpecialise = true, typename F>
void with_window(const CpuPoolGeometry& g, F&& f) {
  if constexpr (kSpecialise) {
    auto by_stride = [&](auto kw) {
      if (g.sw == 1) return f(kw, Const<1>{});
      if (g.sw == 2) return f(kw, Const<2>{});
      f(Const<0>{}, Const<0>{});
    };
    if (g.kw == 2) return by_stride(Const<2>{});
    if (g.kw == 3) return by_stride(Const<3>{});
  }
  f(Const<0>{}, Const<0>{});
}

// Calls f(o) for the output columns whose windows are clipped by the input's edges.
template <typename F>
void for_clipped(const CpuPoolGeometry& g, F&& f) {
  for (int64_t o = 0; o < g.inner_begin; ++o) f(o);
  for (int64_t o = g.inner_end; o < g.wo; ++o) f(o);
}

// Calls chunk(Const<V>{}, o) for o in [0, n) by chunks of V: the loops of a fixed length
// vectorize fully, with no scalar remainder (whose selects would become branches). V is 32 bytes
// of T, or half that, or 1 when n is smaller; the last chunk is moved back to end at n, so some
// elements are done twice (chunk must depend only on its inputs).
template <typename T, typename F>
void for_chunks(int64_t n, F&& chunk) {
  auto by = [&](auto v) {
    int64_t o = 0;
    for (; o + v() <= n; o += v()) chunk(v, o);
    if (o < n) chunk(v, n - v());
  };
  constexpr int64_t kV = 32 / sizeof(T);
  if (n >= kV) return by(Const<kV>{});
  if (n >= kV / 2) return by(Const<kV / 2>{});
  by(Const<1>{});
}

// max(a, b) where a NaN in either gives NaN. Two selects and no branch: comparisons of random
// data would be mispredicted half the time, and loops vectorize.
template <typename T>
T max_nan(T a, T b) {
  const T m = b > a ? b : a;
  return b != b ? b : m;
}

// Whether v is the maximum m of its window (equal, or both NaN).
template <typename T>
bool is_max(T v, T m) {
  return (v == m) | ((v != v) & (m != m));
}

// The reductions, and what a clipped window reads at column c of a row xr of width w: a column
// outside the input gives a value that leaves the reduction of the real columns unchanged, bit
// for bit, so a clipped window is reduced over all its kw columns, as an inner one is.
template <typename T>
struct MaxOp {
  T operator()(T a, T b) const { return max_nan(a, b); }
  // The nearest column's value: max_nan(v, v) is v (a NaN included), and max_nan(m, v) is m
  // again once m = max_nan(., v).
  static T tap(const T* xr, int64_t c, int64_t w) { return xr[std::clamp<int64_t>(c, 0, w - 1)]; }
};
template <typename T>
struct SumOp {
  T operator()(T a, T b) const { return a + b; }
  // -0: -0 + v is v and s + -0 is s for every v and s (+0 and -0 included).
  static T tap(const T* xr, int64_t c, int64_t w) { return c >= 0 && c < w ? xr[c] : T(-0.0); }
};

// ---- Horizontal pass ----------------------------------------------------------------------

// h[q] = op over j < kw, in increasing j, of x[q * sw + j], for q < n. KW and SW are kw and sw
// when known at compile time, else 0.
template <int64_t KW, int64_t SW, typename T, typename Op>
void reduce_windows(const T* __restrict x, T* __restrict h, int64_t n, int64_t kw, int64_t sw,
                    Op op) {
  const int64_t s = SW > 0 ? SW : sw;
  if constexpr (KW > 0) {
    for (int64_t q = 0; q < n; ++q) {
      T m = x[q * s];
      for (int64_t j = 1; j < KW; ++j) m = op(m, x[q * s + j]);
      h[q] = m;
    }
  } else {
    for (int64_t q = 0; q < n; ++q) h[q] = x[q * s];
    for (int64_t j = 1; j < kw; ++j)
      for (int64_t q = 0; q < n; ++q) h[q] = op(h[q], x[q * s + j]);
  }
}

// hs[r * g.ws + o] = op over the window columns of output column o of row r of x, for the
// `rows` rows of x (a block of planes) and o < wo.
template <typename T, typename Op>
void reduce_rows(const T* x, int64_t rows, T* hs, const CpuPoolGeometry& g, Op op) {
  const int64_t lo = g.inner_begin, hi = g.inner_end;
  with_window<std::is_same_v<T, float>>(g, [&](auto kw_c, auto sw_c) {
    constexpr int64_t KW = decltype(kw_c)::value, SW = decltype(sw_c)::value;
    const T* first = x + lo * g.sw - g.pw;  // window lo of row 0
    if (hi <= lo) {
    } else if (g.flat) {
      reduce_windows<KW, SW>(first, hs + lo, (rows - 1) * g.ws + hi - lo, g.kw, g.sw, op);
    } else {
      for (int64_t r = 0; r < rows; ++r)
        reduce_windows<KW, SW>(first + r * g.w, hs + r * g.ws + lo, hi - lo, g.kw, g.sw, op);
    }
    const int64_t kw = KW > 0 ? KW : g.kw, w = g.w, ws = g.ws;
    for_clipped(g, [&](int64_t o) {
      const int64_t c0 = o * g.sw - g.pw;
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * w;
        T m = Op::tap(xr, c0, w);
        for (int64_t j = 1; j < kw; ++j) m = op(m, Op::tap(xr, c0 + j, w));
        hs[r * ws + o] = m;
      }
    });
  });
}

// ---- Vertical pass ------------------------------------------------------------------------
// Loops over the V columns [o, o + V) of an output row (see for_chunks), down `count` scratch
// rows of pitch ws starting at `rows`. (GCC would unroll the loops of V iterations completely,
// then leave them scalar: `unroll 1` keeps them loops, for the vectorizer.)

// y[i] = op over the rows of rows[. + i], in increasing row.
template <int64_t V, typename T, typename Op>
void reduce_down(const T* __restrict rows, int64_t ws, int64_t count, T* __restrict y, int64_t o,
                 Op op) {
  T acc[V];
#pragma GCC unroll 1
  for (int64_t i = 0; i < V; ++i) acc[i] = rows[o + i];
  for (int64_t r = 1; r < count; ++r)
#pragma GCC unroll 1
    for (int64_t i = 0; i < V; ++i) acc[i] = op(acc[i], rows[r * ws + o + i]);
#pragma GCC unroll 1
  for (int64_t i = 0; i < V; ++i) y[o + i] = acc[i];
}

// Runs chunk(Const<V>, a, b, y, o) over the output rows y of 2x2 windows with stride 2, from
// input rows a and b.
template <typename T, typename Chunk>
void pool_2x2(const T* x, T* y, int64_t planes, const CpuPoolGeometry& g, Chunk chunk) {
  const int64_t w = g.w, wo = g.wo;
  for (int64_t p = 0; p < planes; ++p, x += g.h * w)
    for (int64_t oh = 0; oh < g.ho; ++oh, y += wo) {
      const T* a = x + 2 * oh * w;
      for_chunks<T>(wo, [&](auto v, int64_t o) { chunk(v, a, a + w, y, o); });
    }
}

// Runs chunk(Const<V>, gy, ga, gb, o) over the output rows gy of 2x2 windows with stride 2,
// with ga and gb the rows of gx they write; a last odd row or column, in no window, gets zeros.
template <typename T, typename Chunk>
void grad_2x2(const T* gy, T* gx, int64_t planes, const CpuPoolGeometry& g, Chunk chunk) {
  const int64_t h = g.h, w = g.w, wo = g.wo;
  for (int64_t p = 0; p < planes; ++p, gx += h * w) {
    for (int64_t oh = 0; oh < g.ho; ++oh, gy += wo) {
      T* ga = gx + 2 * oh * w;
      for_chunks<T>(wo, [&](auto v, int64_t o) { chunk(v, gy, ga, ga + w, o); });
      if (w > 2 * wo) ga[w - 1] = ga[2 * w - 1] = T(0);
    }
    std::fill(gx + 2 * g.ho * w, gx + h * w, T(0));
  }
}

}  // namespace encore::kernels::cpu::pool
