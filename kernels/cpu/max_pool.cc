// 2-D max pooling over NCHW tensors and its gradient: the first maximum of each window (the
// passes, and why the kernels are shaped as they are: pool_passes.h).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cpu/kernel.h"
#include "kernels/cpu/pool_passes.h"
#include "kernels/cpu/scratch.h"

namespace encore::kernels::cpu::pool {
namespace {

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

// 2x2 windows with stride 2: outputs [o, o + V) of one output row from input rows a and b.
template <int64_t V, typename T>
void max_2x2(const T* __restrict a, const T* __restrict b, T* __restrict y, int64_t o) {
#pragma GCC unroll 1
  for (int64_t i = o; i < o + V; ++i)
    y[i] = max_nan(max_nan(a[2 * i], a[2 * i + 1]), max_nan(b[2 * i], b[2 * i + 1]));
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

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::MaxPool2d, DeviceType::CPU, &max_pool_kernel);
  register_kernel(Op::MaxPool2dGrad, DeviceType::CPU, &max_pool_grad_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu::pool
