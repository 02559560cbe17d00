// 2-D average pooling over NCHW tensors and its gradient (the passes, and why the kernels are
// shaped as they are: pool_passes.h).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/kernel.h"
#include "kernels/cpu/pool_passes.h"
#include "kernels/cpu/scratch.h"

namespace encore::kernels::cpu::pool {
namespace {

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
  register_kernel(Op::AvgPool2d, DeviceType::CPU, &avg_pool_kernel);
  register_kernel(Op::AvgPool2dGrad, DeviceType::CPU, &avg_pool_grad_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu::pool
