// 2-D max and average pooling over NCHW tensors, and their gradients.
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
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cpu/kernel.h"
#include "kernels/cpu/scratch.h"
#include "kernels/pool_geometry.h"
#include "runtime/parallel.h"

namespace encore::kernels::cpu {
namespace {

template <int64_t N>
using Const = std::integral_constant<int64_t, N>;

// The shared geometry (kernels/pool_geometry.h) and the layout of the horizontal pass's scratch.
struct CpuPoolGeometry : PoolGeometry {
  int64_t ws = 0;     // row pitch of the horizontal pass's scratch
  bool flat = false;  // w == sw * ws: one flat loop over rows (see top)
};

// x [N,C,H,W] and y [N,C,Ho,Wo].
CpuPoolGeometry geometry(const Shape& x, const Shape& y, const Pool2dAttrs& a) {
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

// The first maximum of each window: h[q] its value (as reduce_windows finds it) and at[q] its
// index, base + q * sw + its column in the window.
template <int64_t KW, int64_t SW, typename T, typename I>
void argmax_windows(const T* __restrict x, T* __restrict h, I* __restrict at, int64_t n,
                    int64_t base, int64_t kw, int64_t sw) {
  const int64_t s = SW > 0 ? SW : sw;
  if constexpr (KW > 0) {
    for (int64_t q = 0; q < n; ++q) {
      T m = x[q * s];
      for (int64_t j = 1; j < KW; ++j) m = max_nan(m, x[q * s + j]);
      I first = KW - 1;  // backwards with selects: the first column holding m wins
      for (int64_t j = KW - 2; j >= 0; --j) first = is_max(x[q * s + j], m) ? I(j) : first;
      h[q] = m;
      at[q] = static_cast<I>(base + q * s) + first;
    }
  } else {
    reduce_windows<0, SW>(x, h, n, kw, sw, MaxOp<T>{});
    for (int64_t q = 0; q < n; ++q) at[q] = static_cast<I>(base + q * s + kw - 1);
    for (int64_t j = kw - 2; j >= 0; --j)
      for (int64_t q = 0; q < n; ++q)
        at[q] = is_max(x[q * s + j], h[q]) ? static_cast<I>(base + q * s + j) : at[q];
  }
}

// reduce_rows with the maximum, and at[r * g.ws + o] the index in x of the first maximum.
template <typename T, typename I>
void argmax_rows(const T* x, int64_t rows, T* hs, I* at, const CpuPoolGeometry& g) {
  const int64_t lo = g.inner_begin, hi = g.inner_end;
  // Planes too large for 32-bit indices are rare: no specialised loops for them.
  with_window<std::is_same_v<T, float> && std::is_same_v<I, int32_t>>(g, [&](auto kw_c, auto sw_c) {
    constexpr int64_t KW = decltype(kw_c)::value, SW = decltype(sw_c)::value;
    const int64_t first = lo * g.sw - g.pw;  // window lo of row 0
    if (hi <= lo) {
    } else if (g.flat) {
      argmax_windows<KW, SW>(x + first, hs + lo, at + lo, (rows - 1) * g.ws + hi - lo, first, g.kw,
                             g.sw);
    } else {
      for (int64_t r = 0; r < rows; ++r)
        argmax_windows<KW, SW>(x + first + r * g.w, hs + r * g.ws + lo, at + r * g.ws + lo, hi - lo,
                               first + r * g.w, g.kw, g.sw);
    }
    // Clipped windows over their clamped columns (see MaxOp::tap): a repeat of column 0 comes
    // before it, so the first maximum is at column 0 when it is at the repeat.
    const int64_t kw = KW > 0 ? KW : g.kw, w = g.w, ws = g.ws;
    for_clipped(g, [&](int64_t o) {
      const int64_t c0 = o * g.sw - g.pw;
      auto col = [&](int64_t j) { return std::clamp<int64_t>(c0 + j, 0, w - 1); };
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * w;
        T m = xr[col(0)];
        for (int64_t j = 1; j < kw; ++j) m = max_nan(m, xr[col(j)]);
        int64_t j0 = kw - 1;
        for (int64_t j = kw - 2; j >= 0; --j) j0 = is_max(xr[col(j)], m) ? j : j0;
        hs[r * ws + o] = m;
        at[r * ws + o] = static_cast<I>(r * w + col(j0));
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

// x / d, or x * d where d is the reciprocal of a power of two (see row_divisors).
template <bool kReciprocal, typename T>
T divide_by(T x, T d) {
  if constexpr (kReciprocal) return x * d;
  return x / d;
}

// reduce_down with sums, divided by div[i].
template <int64_t V, bool kReciprocal, typename T>
void average_down(const T* __restrict rows, int64_t ws, int64_t count, const T* __restrict div,
                  T* __restrict y, int64_t o) {
  T acc[V];
#pragma GCC unroll 1
  for (int64_t i = 0; i < V; ++i) acc[i] = rows[o + i];
  for (int64_t r = 1; r < count; ++r)
#pragma GCC unroll 1
    for (int64_t i = 0; i < V; ++i) acc[i] += rows[r * ws + o + i];
#pragma GCC unroll 1
  for (int64_t i = 0; i < V; ++i) y[o + i] = divide_by<kReciprocal>(acc[i], div[o + i]);
}

// from[i] = at[. + i] of the first row holding the maximum of rows[. + i].
template <int64_t V, typename T, typename I>
void first_max_down(const T* __restrict rows, const I* __restrict at, int64_t ws, int64_t count,
                    I* __restrict from, int64_t o) {
  T best[V];
#pragma GCC unroll 1
  for (int64_t i = 0; i < V; ++i) best[i] = rows[o + i];
  for (int64_t r = 1; r < count; ++r)
#pragma GCC unroll 1
    for (int64_t i = 0; i < V; ++i) best[i] = max_nan(best[i], rows[r * ws + o + i]);
  I first[V];  // backwards with selects: the first row holding it wins
#pragma GCC unroll 1
  for (int64_t i = 0; i < V; ++i) first[i] = at[(count - 1) * ws + o + i];
  for (int64_t r = count - 2; r >= 0; --r)
#pragma GCC unroll 1
    for (int64_t i = 0; i < V; ++i)
      first[i] = is_max(rows[r * ws + o + i], best[i]) ? at[r * ws + o + i] : first[i];
#pragma GCC unroll 1
  for (int64_t i = 0; i < V; ++i) from[o + i] = first[i];
}

// rows[i] = 0 + share[. + i] + ... down `count` rows of share (pitch ws), in increasing row: a
// sum into zeros (0 + -0 is +0).
template <int64_t V, typename T>
void sum_down(const T* __restrict share, int64_t ws, int64_t count, T* __restrict rows, int64_t o) {
  T acc[V];
#pragma GCC unroll 1
  for (int64_t i = 0; i < V; ++i) acc[i] = T(0);
  for (int64_t r = 0; r < count; ++r)
#pragma GCC unroll 1
    for (int64_t i = 0; i < V; ++i) acc[i] += share[r * ws + o + i];
#pragma GCC unroll 1
  for (int64_t i = 0; i < V; ++i) rows[o + i] = acc[i];
}

// y[i] = x[i] / div[i].
template <int64_t V, bool kReciprocal, typename T>
void divide(const T* __restrict x, const T* __restrict div, T* __restrict y, int64_t o) {
#pragma GCC unroll 1
  for (int64_t i = o; i < o + V; ++i) y[i] = divide_by<kReciprocal>(x[i], div[i]);
}

// ---- Max pooling --------------------------------------------------------------------------

// 2x2 windows with stride 2: outputs [o, o + V) of one output row from input rows a and b.
template <int64_t V, typename T>
void max_2x2(const T* __restrict a, const T* __restrict b, T* __restrict y, int64_t o) {
#pragma GCC unroll 1
  for (int64_t i = o; i < o + V; ++i)
    y[i] = max_nan(max_nan(a[2 * i], a[2 * i + 1]), max_nan(b[2 * i], b[2 * i + 1]));
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

void max_pool_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0];
  const CpuPoolGeometry g = geometry(x.shape, y.shape, args.attr<Pool2dAttrs>());
  switch_floating(x.dtype, Op::MaxPool2d, [&]<typename T>(Type<T>) {
    const T* px = x.as<T>();
    T* py = y.as<T>();
    const int64_t in_plane = g.h * g.w, out_plane = g.ho * g.wo;
    if (g.tiles_2x2()) {
      for_blocks(g, [&](int64_t p, int64_t n) {
        pool_2x2(px + p * in_plane, py + p * out_plane, n, g,
                 [](auto v, const T* a, const T* b, T* y, int64_t o) { max_2x2<v()>(a, b, y, o); });
      });
      return;
    }
    for_blocks(g, [&](int64_t p, int64_t n) {
      T* hs = scratch<T>(kSlot0, n * g.h * g.ws);  // row maxima
      reduce_rows(px + p * in_plane, n * g.h, hs, g, MaxOp<T>{});
      for (int64_t i = 0; i < n; ++i) {
        const T* rows = hs + i * g.h * g.ws;
        T* out = py + (p + i) * out_plane;
        for (int64_t oh = 0; oh < g.ho; ++oh) {
          const int64_t r0 = g.row_begin(oh), r1 = g.row_end(oh);
          for_chunks<T>(g.wo, [&](auto v, int64_t o) {
            reduce_down<v()>(rows + r0 * g.ws, g.ws, r1 - r0, out + oh * g.wo, o, MaxOp<T>{});
          });
        }
      }
    });
  });
}

// 2x2 windows with stride 2: the gradients of windows [o, o + V) of input rows a and b, written
// in one pass: gy (+ 0, as the sum into zeros it is) at the first maximum, zeros elsewhere.
template <int64_t V, typename T>
void max_grad_2x2(const T* __restrict a, const T* __restrict b, const T* __restrict gy,
                  T* __restrict ga, T* __restrict gb, int64_t o) {
#pragma GCC unroll 1
  for (int64_t i = o; i < o + V; ++i) {
    const T a0 = a[2 * i], a1 = a[2 * i + 1], b0 = b[2 * i], b1 = b[2 * i + 1];
    const T m = max_nan(max_nan(a0, a1), max_nan(b0, b1));
    const bool e0 = is_max(a0, m), e1 = is_max(a1, m) & !e0;
    const bool e2 = is_max(b0, m) & !(e0 | e1), e3 = !(e0 | e1 | e2);
    const T v = gy[i] + T(0);
    ga[2 * i] = e0 ? v : T(0);
    ga[2 * i + 1] = e1 ? v : T(0);
    gb[2 * i] = e2 ? v : T(0);
    gb[2 * i + 1] = e3 ? v : T(0);
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

// gx[first maximum of each window] += gy, into zeros, in output order. Indices of type I within
// a block.
template <typename T, typename I>
void max_pool_grad_planes(const T* px, const T* pgy, T* pgx, const CpuPoolGeometry& g) {
  const int64_t in_plane = g.h * g.w, out_plane = g.ho * g.wo;
  for_blocks(g, [&](int64_t p, int64_t n) {
    T* hs = scratch<T>(kSlot0, n * g.h * g.ws);  // row maxima
    I* at = scratch<I>(kSlot1, n * g.h * g.ws);  // their indices in the block
    I* from = scratch<I>(kSlot2, g.wo);          // an output row's
    T* gin = pgx + p * in_plane;
    argmax_rows(px + p * in_plane, n * g.h, hs, at, g);
    std::fill(gin, gin + n * in_plane, T(0));
    for (int64_t i = 0; i < n; ++i) {
      const T* gout = pgy + (p + i) * out_plane;
      for (int64_t oh = 0; oh < g.ho; ++oh, gout += g.wo) {
        const int64_t r0 = i * g.h + g.row_begin(oh), r1 = i * g.h + g.row_end(oh);
        for_chunks<T>(g.wo, [&](auto v, int64_t o) {
          first_max_down<v()>(hs + r0 * g.ws, at + r0 * g.ws, g.ws, r1 - r0, from, o);
        });
        for (int64_t o = 0; o < g.wo; ++o) gin[from[o]] += gout[o];
      }
    }
  });
}

// x and gy in, gx (x's shape) out.
void max_pool_grad_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &gy = args.in[1], &gx = args.out[0];
  const CpuPoolGeometry g = geometry(x.shape, gy.shape, args.attr<Pool2dAttrs>());
  switch_floating(x.dtype, Op::MaxPool2dGrad, [&]<typename T>(Type<T>) {
    const T *px = x.as<T>(), *pgy = gy.as<T>();
    T* pgx = gx.as<T>();
    if (g.tiles_2x2()) {
      const int64_t in_plane = g.h * g.w, out_plane = g.ho * g.wo;
      for_blocks(g, [&](int64_t p, int64_t n) {
        const T* in = px + p * in_plane;  // rows a and b of gx[. + gi] read x[. + gi]
        T* gin = pgx + p * in_plane;
        grad_2x2(pgy + p * out_plane, gin, n, g, [&](auto v, const T* gy, T* ga, T* gb, int64_t o) {
          const T* a = in + (ga - gin);
          max_grad_2x2<v()>(a, a + g.w, gy, ga, gb, o);
        });
      });
    } else if (g.h * g.w <= std::numeric_limits<int32_t>::max()) {  // indices within a block
      max_pool_grad_planes<T, int32_t>(px, pgy, pgx, g);
    } else {
      max_pool_grad_planes<T, int64_t>(px, pgy, pgx, g);
    }
  });
}

// ---- Average pooling ----------------------------------------------------------------------

// The divisors of an output row's windows: the whole kernel when padded zeros count (a window
// never reaches past the padding, as the output size is floored), else the input elements it
// covers.
template <typename T>
void row_divisors(const CpuPoolGeometry& g, bool count_include_pad, int64_t oh, T* div) {
  const int64_t rows = g.row_end(oh) - g.row_begin(oh);
  for (int64_t o = 0; o < g.wo; ++o)
    div[o] =
        static_cast<T>(count_include_pad ? g.kh * g.kw : rows * (g.col_end(o) - g.col_begin(o)));
}

// The divisors of a call when they are all kh * kw (filled into div once), else none (row_divisors
// per output row). They are reciprocals when kh * kw is a power of two: 1 / d is then exact, so
// x * (1 / d) is the same real number as x / d, rounded the same way, and a multiplication is
// much cheaper than a division.
struct SameDivisors {
  bool all = false, reciprocal = false;
};
template <typename T>
SameDivisors same_divisors(const CpuPoolGeometry& g, bool count_include_pad, T* div) {
  SameDivisors d;
  d.all = count_include_pad || (g.ph == 0 && g.pw == 0);
  if (!d.all) return d;
  const int64_t k = g.kh * g.kw;
  d.reciprocal = (k & (k - 1)) == 0;
  std::fill(div, div + g.wo, d.reciprocal ? T(1) / static_cast<T>(k) : static_cast<T>(k));
  return d;
}

// 2x2 windows with stride 2: outputs [o, o + V) of one output row from input rows a and b, the
// row sums added, times the reciprocal 1/4 (exact; see same_divisors).
template <int64_t V, typename T>
void avg_2x2(const T* __restrict a, const T* __restrict b, T* __restrict y, int64_t o) {
#pragma GCC unroll 1
  for (int64_t i = o; i < o + V; ++i)
    y[i] = ((a[2 * i] + a[2 * i + 1]) + (b[2 * i] + b[2 * i + 1])) * T(0.25);
}

void avg_pool_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0];
  const Pool2dAttrs& a = args.attr<Pool2dAttrs>();
  const CpuPoolGeometry g = geometry(x.shape, y.shape, a);
  switch_floating(x.dtype, Op::AvgPool2d, [&]<typename T>(Type<T>) {
    const T* px = x.as<T>();
    T* py = y.as<T>();
    const int64_t in_plane = g.h * g.w, out_plane = g.ho * g.wo;
    if (g.tiles_2x2()) {
      for_blocks(g, [&](int64_t p, int64_t n) {
        pool_2x2(px + p * in_plane, py + p * out_plane, n, g,
                 [](auto v, const T* a, const T* b, T* y, int64_t o) { avg_2x2<v()>(a, b, y, o); });
      });
      return;
    }
    for_blocks(g, [&](int64_t p, int64_t n) {
      T* hs = scratch<T>(kSlot0, n * g.h * g.ws);  // row sums
      T* div = scratch<T>(kSlot1, g.wo);
      const SameDivisors same = same_divisors(g, a.count_include_pad, div);
      reduce_rows(px + p * in_plane, n * g.h, hs, g, SumOp<T>{});
      for (int64_t i = 0; i < n; ++i) {
        const T* rows = hs + i * g.h * g.ws;
        T* out = py + (p + i) * out_plane;
        for (int64_t oh = 0; oh < g.ho; ++oh) {
          const int64_t r0 = g.row_begin(oh), r1 = g.row_end(oh);
          if (!same.all) row_divisors(g, false, oh, div);
          for_chunks<T>(g.wo, [&](auto v, int64_t o) {
            if (same.reciprocal)
              average_down<v(), true>(rows + r0 * g.ws, g.ws, r1 - r0, div, out + oh * g.wo, o);
            else
              average_down<v(), false>(rows + r0 * g.ws, g.ws, r1 - r0, div, out + oh * g.wo, o);
          });
        }
      }
    });
  });
}

// 2x2 windows with stride 2: gy[i] / 4 (+ 0) into the four elements of windows [o, o + V).
template <int64_t V, typename T>
void avg_grad_2x2(const T* __restrict gy, T* __restrict ga, T* __restrict gb, int64_t o) {
#pragma GCC unroll 1
  for (int64_t i = o; i < o + V; ++i) {
    const T v = gy[i] * T(0.25) + T(0);
    ga[2 * i] = ga[2 * i + 1] = gb[2 * i] = gb[2 * i + 1] = v;
  }
}

// Windows that tile the input: every element of window (oh, o) gets gy / (kh kw) (+ 0, as the
// sum into zeros it is), in one pass; the rows and columns in no window get zeros.
template <typename T>
void avg_pool_grad_tiles(const T* gy, T* gx, int64_t planes, const CpuPoolGeometry& g) {
  const int64_t h = g.h, w = g.w, wo = g.wo, kh = g.kh, kw = g.kw;
  T* share = scratch<T>(kSlot0, wo);
  T* div = scratch<T>(kSlot1, wo);
  const SameDivisors same = same_divisors(g, true, div);
  for (int64_t p = 0; p < planes; ++p, gx += h * w) {
    for (int64_t oh = 0; oh < g.ho; ++oh, gy += wo) {
      for_chunks<T>(wo, [&](auto v, int64_t o) {
        if (same.reciprocal)
          divide<v(), true>(gy, div, share, o);
        else
          divide<v(), false>(gy, div, share, o);
      });
      for (int64_t o = 0; o < wo; ++o) share[o] += T(0);
      for (int64_t r = oh * kh; r < (oh + 1) * kh; ++r) {
        T* gr = gx + r * w;
        for (int64_t o = 0; o < wo; ++o)
          for (int64_t j = 0; j < kw; ++j) gr[o * kw + j] = share[o];
        std::fill(gr + wo * kw, gr + w, T(0));
      }
    }
    std::fill(gx + g.ho * kh * w, gx + h * w, T(0));
  }
}

// Each gy spread evenly over its window: first down the window rows into scratch rows (a sum in
// increasing output row), then across the window columns (the clipped windows first, then the
// inner ones a window column at a time), as sums into zeros. gy in, gx (the input's shape) out.
template <typename T>
void avg_pool_grad_planes(const T* pgy, T* pgx, const CpuPoolGeometry& g, bool count_include_pad) {
  const int64_t in_plane = g.h * g.w, out_plane = g.ho * g.wo;
  for_blocks(g, [&](int64_t p, int64_t n) {
    const int64_t wo = g.wo, ws = g.ws, w = g.w, rows = n * g.h;
    T* hs = scratch<T>(kSlot0, rows * ws);
    T* share = scratch<T>(kSlot1, g.ho * wo);  // one plane's gy / divisor
    T* div = scratch<T>(kSlot2, wo);
    const SameDivisors same = same_divisors(g, count_include_pad, div);
    for (int64_t i = 0; i < n; ++i) {
      const T* gout = pgy + (p + i) * out_plane;
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        if (!same.all) row_divisors(g, false, oh, div);
        for_chunks<T>(wo, [&](auto v, int64_t o) {
          if (same.reciprocal)
            divide<v(), true>(gout + oh * wo, div, share + oh * wo, o);
          else
            divide<v(), false>(gout + oh * wo, div, share + oh * wo, o);
        });
      }
      // Input row r is in the windows of output rows [ceil((r + ph - kh + 1) / sh), (r + ph) / sh].
      for (int64_t r = 0; r < g.h; ++r) {
        const int64_t first = std::max<int64_t>(0, (r + g.ph - g.kh + g.sh) / g.sh);
        const int64_t last = std::min(g.ho - 1, (r + g.ph) / g.sh);
        T* hr = hs + (i * g.h + r) * ws;
        for_chunks<T>(wo, [&](auto v, int64_t o) {
          sum_down<v()>(share + first * wo, wo, last - first + 1, hr, o);
        });
      }
    }
    T* gin = pgx + p * in_plane;
    std::fill(gin, gin + n * in_plane, T(0));
    for_clipped(g, [&](int64_t o) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = g.col_begin(o), c1 = g.col_end(o); c < c1; ++c)
          gin[r * w + c] += hs[r * ws + o];
    });
    const int64_t lo = g.inner_begin, hi = g.inner_end;
    if (hi <= lo) return;
    with_window<std::is_same_v<T, float>>(g, [&](auto kw_c, auto sw_c) {
      constexpr int64_t KW = decltype(kw_c)::value, SW = decltype(sw_c)::value;
      const int64_t kw = KW > 0 ? KW : g.kw, sw = SW > 0 ? SW : g.sw;
      T* first = gin + lo * sw - g.pw;  // window lo of row 0
      if (g.flat) {
        // The flat loop also adds the scratch entries of clipped windows and past wo: zero
        // them (a sum into zeros is never -0, so adding +0 changes nothing).
        for (int64_t r = 0; r < rows; ++r) {
          std::fill(hs + r * ws, hs + r * ws + lo, T(0));
          std::fill(hs + r * ws + hi, hs + (r + 1) * ws, T(0));
        }
        const T* src = hs + lo;
        const int64_t count = (rows - 1) * ws + hi - lo;
        for (int64_t j = 0; j < kw; ++j)
          for (int64_t q = 0; q < count; ++q) first[q * sw + j] += src[q];
      } else {
        for (int64_t r = 0; r < rows; ++r) {
          const T* src = hs + r * ws + lo;
          T* dst = first + r * w;
          for (int64_t j = 0; j < kw; ++j)
            for (int64_t q = 0; q < hi - lo; ++q) dst[q * sw + j] += src[q];
        }
      }
    });
  });
}

void avg_pool_grad_kernel(const KernelArgs& args) {
  const BufferView &gy = args.in[0], &gx = args.out[0];
  const Pool2dAttrs& a = args.attr<Pool2dAttrs>();
  const CpuPoolGeometry g = geometry(gx.shape, gy.shape, a);
  switch_floating(gy.dtype, Op::AvgPool2dGrad, [&]<typename T>(Type<T>) {
    const T* pgy = gy.as<T>();
    T* pgx = gx.as<T>();
    const int64_t in_plane = g.h * g.w, out_plane = g.ho * g.wo;
    if (g.tiles_2x2()) {
      for_blocks(g, [&](int64_t p, int64_t n) {
        grad_2x2(
            pgy + p * out_plane, pgx + p * in_plane, n, g,
            [](auto v, const T* gy, T* ga, T* gb, int64_t o) { avg_grad_2x2<v()>(gy, ga, gb, o); });
      });
    } else if (g.tiles()) {
      for_blocks(g, [&](int64_t p, int64_t n) {
        avg_pool_grad_tiles(pgy + p * out_plane, pgx + p * in_plane, n, g);
      });
    } else {
      avg_pool_grad_planes(pgy, pgx, g, a.count_include_pad);
    }
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::MaxPool2d, DeviceType::CPU, &max_pool_kernel);
  register_kernel(Op::MaxPool2dGrad, DeviceType::CPU, &max_pool_grad_kernel);
  register_kernel(Op::AvgPool2d, DeviceType::CPU, &avg_pool_kernel);
  register_kernel(Op::AvgPool2dGrad, DeviceType::CPU, &avg_pool_grad_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
