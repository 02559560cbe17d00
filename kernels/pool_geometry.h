// The geometry of 2-D pooling over NCHW tensors, one definition for cpu/pool_passes.h and
// cuda/pool.cu (host and device): sizes, strides and padding of one call, the input rows and
// columns each window covers (clipped to the input), and the windows each input element falls in.
#pragma once

#include <algorithm>
#include <cstdint>

#include "runtime/host_device.h"
#include "runtime/ops.h"
#include "runtime/shape.h"

namespace encore::kernels {

// `planes` input planes [h, w] pooled to [ho, wo] by windows [kh, kw] at strides (sh, sw) with
// padding (ph, pw). The routine keeps padding <= kernel / 2 and the input non-empty, so no
// clipped window is empty.
struct PoolGeometry {
  int64_t planes = 0, h = 0, w = 0, ho = 0, wo = 0;
  int64_t kh = 0, kw = 0, sh = 0, sw = 0, ph = 0, pw = 0;
  int64_t inner_begin = 0, inner_end = 0;  // output columns whose windows lie inside the input
  bool count_include_pad = true;           // average: padded zeros count in the divisor

  // Input rows [row_begin, row_end) and columns [col_begin, col_end) of window (oh, ow).
  ENCORE_HOST_DEVICE int64_t row_begin(int64_t oh) const {
    return oh * sh - ph > 0 ? oh * sh - ph : 0;
  }
  ENCORE_HOST_DEVICE int64_t row_end(int64_t oh) const {
    return oh * sh - ph + kh < h ? oh * sh - ph + kh : h;
  }
  ENCORE_HOST_DEVICE int64_t col_begin(int64_t ow) const {
    return ow * sw - pw > 0 ? ow * sw - pw : 0;
  }
  ENCORE_HOST_DEVICE int64_t col_end(int64_t ow) const {
    return ow * sw - pw + kw < w ? ow * sw - pw + kw : w;
  }
  // The windows holding input row r: [first, last] (empty when first > last).
  ENCORE_HOST_DEVICE int64_t first_row_window(int64_t r) const {
    return first_window(r, ph, kh, sh);
  }
  ENCORE_HOST_DEVICE int64_t last_row_window(int64_t r) const { return last_window(r, ph, sh, ho); }
  ENCORE_HOST_DEVICE int64_t first_col_window(int64_t c) const {
    return first_window(c, pw, kw, sw);
  }
  ENCORE_HOST_DEVICE int64_t last_col_window(int64_t c) const { return last_window(c, pw, sw, wo); }
  // Window o starts at o s - p: it holds i when o s - p <= i <= o s - p + k - 1.
  ENCORE_HOST_DEVICE static int64_t first_window(int64_t i, int64_t p, int64_t k, int64_t s) {
    const int64_t t = i + p - k + 1;  // need o s >= t
    return t <= 0 ? 0 : (t + s - 1) / s;
  }
  ENCORE_HOST_DEVICE static int64_t last_window(int64_t i, int64_t p, int64_t s, int64_t out) {
    const int64_t o = (i + p) / s;  // i + p >= 0
    return o < out - 1 ? o : out - 1;
  }
  // The divisor of window (oh, ow) for average pooling.
  template <typename T>
  ENCORE_HOST_DEVICE T divisor(int64_t oh, int64_t ow) const {
    return static_cast<T>(count_include_pad
                              ? kh * kw
                              : (row_end(oh) - row_begin(oh)) * (col_end(ow) - col_begin(ow)));
  }
  // 2x2 windows, stride 2, no padding.
  ENCORE_HOST_DEVICE bool tiles_2x2() const {
    return kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0;
  }
  // Windows that tile the input (stride = kernel, no padding): none is clipped or overlaps.
  ENCORE_HOST_DEVICE bool tiles() const { return sh == kh && sw == kw && ph == 0 && pw == 0; }
};

// x [N,C,H,W] pooled to y [N,C,Ho,Wo].
inline PoolGeometry pool_geometry(const Shape& x, const Shape& y, const Pool2dAttrs& a) {
  PoolGeometry g;
  g.planes = x[0] * x[1];
  g.h = x[2];
  g.w = x[3];
  g.ho = y[2];
  g.wo = y[3];
  g.kh = a.kernel[0];
  g.kw = a.kernel[1];
  g.sh = a.stride[0];
  g.sw = a.stride[1];
  g.ph = a.padding[0];
  g.pw = a.padding[1];
  g.count_include_pad = a.count_include_pad;
  // The first window starting at or after column 0, and the past-the-last one ending inside.
  g.inner_begin = std::min(g.wo, (g.pw + g.sw - 1) / g.sw);
  const int64_t last = g.w + g.pw - g.kw;  // start + pw of the last window inside
  g.inner_end = std::max(g.inner_begin, last < 0 ? 0 : std::min(g.wo, last / g.sw + 1));
  return g;
}

}  // namespace encore::kernels
