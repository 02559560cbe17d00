// 2-D convolution over NCHW (cross-correlation, as PyTorch's conv2d) and its two gradients.
//
// Two algorithms:
// - Shifted GEMM, for stride 1: an image is copied with its zero padding into planes of width
//   Wp, so output pixel (r, c) is the flat position q = r Wp + c and tap k = (s, i, j) of the
//   kernel reads the padded input at q + off[k], off[k] = s plane + i dh Wp + j dw. Then
//   out[m][q] = sum_k A[m][k] in[off[k] + q] is a GEMM whose B rows are shifted views of one
//   buffer, computed by register tiles with no im2col; columns c >= Wo of this "wide" result are
//   dropped. The input gradient of a stride-1 convolution is the same computation on gy padded
//   by (k-1) d - p, with the kernel flipped and transposed; the weight gradient is the
//   transposed product sum_q gy[m][q] in[off[k] + q]. For the small channel counts of small
//   CNNs this is 1.5-2x faster than im2col + OpenBLAS (Zen 4, one thread).
// - im2col + OpenBLAS GEMM for other strides, for 1x1 unpadded stride-1 convolutions (the input
//   is its own im2col: a plain GEMM, faster than the shifted tiles), and for weight gradients
//   with many taps on small images (see use_shifted_grad_weight).
// ENCORE_CONV_IM2COL=1 (or set_conv_im2col(true), kernels/cpu/conv.h) forces the second
// algorithm.
//
// The shifted path splits images across threads (forward, input gradient) or the weight
// gradient's tiles (each tile sums fixed chunks of images in order): each output element is
// computed by one thread in a fixed order, so results are the same at any thread count.
//
// Padded layouts (runtime/padded_layout.h): a static plan may hand the shifted forward and weight
// gradient an input x that already lies padded (kConvPaddedInput: read in place, no copy) and
// have the shifted forward write y padded for the convolutions that read it (kConvPaddedOutput:
// rows into the interior, zeros around them). Every product reads the same values at the same
// relative places as from the copy, in the same order and the same thread split, so the bits are
// eager's. A step so marked takes the shifted path even if im2col was forced after its plan.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/conv_geometry.h"
#include "kernels/cpu/im2col_gemm.h"
#include "kernels/cpu/kernel.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/shifted_gemm.h"
#include "runtime/env.h"
#include "runtime/padded_layout.h"
#include "runtime/parallel.h"

namespace encore::kernels::cpu {
namespace {

using namespace conv;
using namespace shifted;

// kernels/cpu/conv.h: read once from the environment, then set by set_conv_im2col().
std::atomic<bool> g_force_im2col{env::flag("ENCORE_CONV_IM2COL", false)};

bool force_im2col() {
  return g_force_im2col.load(std::memory_order_relaxed);
}

// Where a convolution's result images go: `image` elements apart, each [rows, cols] plane inside
// pad_h zero rows and pad_w zero columns (planes `plane` elements apart, rows `wp` apart), then
// zeros up to the next image. Dense: no border, nothing between images.
struct ImageLayout {
  int64_t image, pad_h, pad_w, wp, plane;
  bool padded;

  static ImageLayout dense(int64_t planes, int64_t rows, int64_t cols) {
    return {planes * rows * cols, 0, 0, cols, rows * cols, false};
  }
  static ImageLayout planned(const Conv2dAttrs& a, int64_t planes, int64_t rows, int64_t cols) {
    const int64_t ph = a.out_padding[0], pw = a.out_padding[1];
    return {padded_image_elements(planes, rows, cols, ph, pw),
            ph,
            pw,
            cols + 2 * pw,
            (rows + 2 * ph) * (cols + 2 * pw),
            true};
  }
};

// Zeros everywhere in a padded result image but its planes' interiors: above a plane's first row
// and left of it, from each row's end to the next row's start, after the last row, and after the
// last plane. The arena block is other buffers' memory between uses, so this is every run's work.
template <typename T>
void zero_border(T* image, int64_t planes, int64_t rows, int64_t cols, const ImageLayout& o) {
  for (int64_t s = 0; s < planes; ++s) {
    T* p = image + s * o.plane;
    std::fill(p, p + o.pad_h * o.wp + o.pad_w, T(0));
    for (int64_t r = 0; r + 1 < rows; ++r)
      std::fill(p + (o.pad_h + r) * o.wp + o.pad_w + cols, p + (o.pad_h + r + 1) * o.wp + o.pad_w,
                T(0));
    std::fill(p + (o.pad_h + rows - 1) * o.wp + o.pad_w + cols, p + o.plane, T(0));
  }
  std::fill(image + planes * o.plane, image + o.image, T(0));
}

// dst image [groups * rows_per_group, l.rows, l.cols] (laid out as `out` says) = the stride-1
// correlation of the padded src image [groups * sources, ...] with a (per group
// [rows_per_group, sources kh kw]), plus bias (may be null), then the activation `act` (may be
// null: none) over each row as it is written, for images [begin, end). With `src_padded`, src
// images already lie as l pads them, src_image apart: read in place.
template <typename T>
void shifted_conv_images(const T* src, int64_t src_image, bool src_padded, const T* a,
                         const T* bias, const ActAttrs* act, T* dst, const ImageLayout& out,
                         int64_t hs, int64_t ws, int64_t groups, int64_t sources,
                         int64_t rows_per_group, int64_t kh, int64_t kw, const ShiftedLayout& l,
                         const int64_t* off, int64_t begin, int64_t end) {
  const int64_t taps = sources * kh * kw;
  T* padded = nullptr;
  if (!src_padded) {
    padded = scratch<T>(kPadded, l.padded_size());
    std::fill(padded, padded + l.padded_size(), T(0));
  }
  T* wide = scratch<T>(kWide, rows_per_group * l.width);
  for (int64_t n = begin; n < end; ++n) {
    const T* in = padded;
    if (src_padded)
      in = src + n * src_image;
    else
      copy_padded(src + n * src_image, l.planes, hs, ws, l.pad_h, l.pad_w, padded, l.hp, l.wp,
                  l.plane());
    T* image = dst + n * out.image;
    for (int64_t grp = 0; grp < groups; ++grp) {
      shifted_gemm(a + grp * rows_per_group * taps, taps, rows_per_group,
                   in + grp * sources * l.plane(), off, taps, wide, l.width, l.width);
      for (int64_t m = 0; m < rows_per_group; ++m) {
        const int64_t channel = grp * rows_per_group + m;
        T* d = image + channel * out.plane + out.pad_h * out.wp + out.pad_w;
        const T* wm = wide + m * l.width;
        const T b = bias != nullptr ? bias[channel] : T(0);
        for (int64_t r = 0; r < l.rows; ++r) {
          add_row(d + r * out.wp, wm + r * l.wp, l.cols, b);
          if (act != nullptr) apply_activation(*act, d + r * out.wp, l.cols);
        }
      }
    }
    if (out.padded) zero_border(image, groups * rows_per_group, l.rows, l.cols, out);
  }
}

template <typename T>
void shifted_forward(const Geometry& g, const Conv2dAttrs& a, const T* x, const T* w, const T* bias,
                     const ActAttrs* act, T* y) {
  static_assert(kTile<T> <= kPaddedSlack && kLanes<T> <= kPaddedSlack);
  const ShiftedLayout l(g.c, g.h, g.w, g.ph, g.pw, g.kh, g.kw, g.dh, g.dw, kTile<T>);
  int64_t* off = scratch<int64_t>(kOffsets, g.taps());
  tap_offsets(g.cg, g.kh, g.kw, g.dh, g.dw, l, off);
  const int64_t work = g.o * g.taps() * l.width;
  const bool x_padded = (a.layout & kConvPaddedInput) != 0;
  const int64_t x_image =
      x_padded ? padded_image_elements(g.c, g.h, g.w, g.ph, g.pw) : g.c * g.h * g.w;
  const ImageLayout out = (a.layout & kConvPaddedOutput) != 0
                              ? ImageLayout::planned(a, g.o, g.ho, g.wo)
                              : ImageLayout::dense(g.o, g.ho, g.wo);
  parallel_for(g.n, grain_for(work), [&](int64_t begin, int64_t end) {
    shifted_conv_images(x, x_image, x_padded, w, bias, act, y, out, g.h, g.w, g.groups, g.cg, g.og,
                        g.kh, g.kw, l, off, begin, end);
  });
}

// gx = the correlation of gy, padded by (k-1) d - p, with the kernel flipped and transposed.
template <typename T>
void shifted_grad_input(const Geometry& g, const T* gy, const T* w, T* gx) {
  const ShiftedLayout l(g.o, g.ho, g.wo, (g.kh - 1) * g.dh - g.ph, (g.kw - 1) * g.dw - g.pw, g.kh,
                        g.kw, g.dh, g.dw, kTile<T>);
  const int64_t taps = g.og * g.kh * g.kw;
  // flipped[grp][c][(o kh + i) kw + j] = w[grp og + o][c][kh-1-i][kw-1-j]
  T* flipped = scratch<T>(kFlipped, g.groups * g.cg * taps);
  for (int64_t grp = 0; grp < g.groups; ++grp)
    for (int64_t c = 0; c < g.cg; ++c)
      for (int64_t o = 0; o < g.og; ++o)
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j)
            flipped[(grp * g.cg + c) * taps + (o * g.kh + i) * g.kw + j] =
                w[(((grp * g.og + o) * g.cg + c) * g.kh + (g.kh - 1 - i)) * g.kw + (g.kw - 1 - j)];
  int64_t* off = scratch<int64_t>(kOffsets, taps);
  tap_offsets(g.og, g.kh, g.kw, g.dh, g.dw, l, off);
  const int64_t work = g.c * taps * l.width;
  parallel_for(g.n, grain_for(work), [&](int64_t begin, int64_t end) {
    shifted_conv_images(gy, g.o * g.ho * g.wo, false, flipped, static_cast<const T*>(nullptr),
                        nullptr, gx, ImageLayout::dense(g.c, g.h, g.w), g.ho, g.wo, g.groups, g.og,
                        g.cg, g.kh, g.kw, l, off, begin, end);
  });
}

// Images whose padded copies a weight-gradient pass holds at once (a function of the geometry
// only, so the sums are the same at any thread count).
int64_t images_per_chunk(int64_t image_bytes) {
  constexpr int64_t kChunkBytes = 1 << 20;  // about an L2 cache
  return std::clamp<int64_t>(kChunkBytes / std::max<int64_t>(1, image_bytes), 1, 8);
}

// gw[o][k] = sum over images of sum_q gy_wide[o][q] x_padded[off[k] + q]. Work is split by
// tiles of (group, kDotRows output channels, kDotTaps taps); each tile adds fixed chunks of
// images in order. With kConvPaddedInput x is read in place, padded_image_elements apart; the
// chunks stay those of the copy (they fix the order of the sums).
template <typename T>
void shifted_grad_weight(const Geometry& g, const Conv2dAttrs& a, const T* x, const T* gy, T* gw) {
  // Row sums of width kLanes suffice here; the layout's tail covers them.
  const ShiftedLayout l(g.c, g.h, g.w, g.ph, g.pw, g.kh, g.kw, g.dh, g.dw, kLanes<T>);
  const int64_t taps = g.taps();
  int64_t* off = scratch<int64_t>(kOffsets, taps);
  tap_offsets(g.cg, g.kh, g.kw, g.dh, g.dw, l, off);
  std::fill(gw, gw + g.o * taps, T(0));
  const int64_t row_blocks = (g.og + kDotRows - 1) / kDotRows;
  const int64_t tap_blocks = (taps + kDotTaps - 1) / kDotTaps;
  const int64_t tiles = g.groups * row_blocks * tap_blocks;
  const int64_t work = g.n * kDotRows * kDotTaps * l.width;
  const int64_t x_image = l.padded_size(), gy_image = g.o * l.width;
  const int64_t chunk = images_per_chunk((x_image + gy_image) * int64_t{sizeof(T)});
  const bool x_padded = (a.layout & kConvPaddedInput) != 0;
  const int64_t b_image = x_padded ? padded_image_elements(g.c, g.h, g.w, g.ph, g.pw)
                                   : x_image;  // between the images the tiles read
  parallel_for(tiles, grain_for(work), [&](int64_t begin, int64_t end) {
    T* padded = nullptr;
    if (!x_padded) {
      padded = scratch<T>(kPadded, chunk * x_image);
      std::fill(padded, padded + chunk * x_image, T(0));
    }
    T* wide = scratch<T>(kWide, chunk * gy_image);  // gy with rows of width wp
    std::fill(wide, wide + chunk * gy_image, T(0));
    for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
      const int64_t count = std::min(chunk, g.n - n0);
      const T* b = x_padded ? x + n0 * b_image : padded;
      for (int64_t i = 0; i < count; ++i) {
        if (!x_padded)
          copy_padded(x + (n0 + i) * g.c * g.h * g.w, g.c, g.h, g.w, g.ph, g.pw,
                      padded + i * x_image, l.hp, l.wp, l.plane());
        copy_padded(gy + (n0 + i) * g.o * g.ho * g.wo, g.o, g.ho, g.wo, int64_t{0}, int64_t{0},
                    wide + i * gy_image, g.ho, l.wp, l.width);
      }
      for (int64_t t = begin; t < end; ++t) {
        const int64_t grp = t / (row_blocks * tap_blocks);
        const int64_t m = (t / tap_blocks) % row_blocks * kDotRows;
        const int64_t k = t % tap_blocks * kDotTaps;
        const int64_t row = grp * g.og + m;
        shifted_dot<T, kDotRows, kDotTaps>(
            wide + row * l.width, l.width, gy_image, std::min<int64_t>(kDotRows, g.og - m),
            b + grp * g.cg * l.plane(), b_image, count, off + k,
            std::min<int64_t>(kDotTaps, taps - k), l.width, gw + row * taps + k, taps);
      }
    }
  });
}

// ---- Choice and kernels ---------------------------------------------------------------------

// The shifted path for stride 1 (a 1x1 unpadded convolution is a plain GEMM). Its weight
// gradient streams kDotRows + kDotTaps rows per tile from the L2 cache: with many taps and small
// images, OpenBLAS does better (measured on Zen 4, single thread).
bool use_shifted(const Geometry& g) {
  return !force_im2col() && g.sh == 1 && g.sw == 1 && !g.pointwise();
}
bool use_shifted_grad_weight(const Geometry& g) {
  return use_shifted(g) && (g.taps() <= 288 || g.pixels() >= 196);
}

// x [N,C,H,W], w [O,C/g,kh,kw], optional bias [O] -> y [N,O,Ho,Wo], then `act` (null: none)
// over each part of y as it is written.
void conv2d_forward(const KernelArgs& args, Op op, const Conv2dAttrs& attrs, const ActAttrs* act) {
  const BufferView &x = args.in[0], &w = args.in[1], &y = args.out[0];
  const BufferView* bias = args.in.size() == 3 ? &args.in[2] : nullptr;
  const Geometry g = geometry(x.shape, w.shape, y.shape, attrs);
  switch_floating(y.dtype, op, [&]<typename T>(Type<T>) {
    if (y.numel() == 0) return;
    const T* pb = bias != nullptr ? bias->as<T>() : nullptr;
    if (use_shifted(g) || attrs.layout != 0)
      return shifted_forward(g, attrs, x.as<T>(), w.as<T>(), pb, act, y.as<T>());
    check_gemm_sizes(op, g);
    gemm_forward(g, x.as<T>(), w.as<T>(), pb, act, y.as<T>());
  });
}

void conv2d_kernel(const KernelArgs& args) {
  conv2d_forward(args, Op::Conv2d, args.attr<Conv2dAttrs>(), nullptr);
}

// Conv2dAct (planned): the convolution with its activation applied as each row is written.
void conv2d_act_kernel(const KernelArgs& args) {
  const Conv2dActAttrs& a = args.attr<Conv2dActAttrs>();
  conv2d_forward(args, Op::Conv2dAct, a.conv, &a.act);
}

// gy [N,O,Ho,Wo], w -> gx [N,C,H,W].
void conv2d_grad_input_kernel(const KernelArgs& args) {
  const BufferView &gy = args.in[0], &w = args.in[1], &gx = args.out[0];
  const Geometry g = geometry(gx.shape, w.shape, gy.shape, args.attr<Conv2dAttrs>());
  switch_floating(gx.dtype, Op::Conv2dGradInput, [&]<typename T>(Type<T>) {
    if (gx.numel() == 0) return;
    if (use_shifted(g)) return shifted_grad_input(g, gy.as<T>(), w.as<T>(), gx.as<T>());
    check_gemm_sizes(Op::Conv2dGradInput, g);
    gemm_grad_input(g, gy.as<T>(), w.as<T>(), gx.as<T>());
  });
}

// x, gy -> gw [O,C/g,kh,kw].
void conv2d_grad_weight_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &gy = args.in[1], &gw = args.out[0];
  const Conv2dAttrs& a = args.attr<Conv2dAttrs>();
  const Geometry g = geometry(x.shape, gw.shape, gy.shape, a);
  switch_floating(gw.dtype, Op::Conv2dGradWeight, [&]<typename T>(Type<T>) {
    if (gw.numel() == 0) return;
    if (use_shifted_grad_weight(g) || a.layout != 0)
      return shifted_grad_weight(g, a, x.as<T>(), gy.as<T>(), gw.as<T>());
    check_gemm_sizes(Op::Conv2dGradWeight, g);
    gemm_grad_weight(g, x.as<T>(), gy.as<T>(), gw.as<T>());
  });
}

// ---- Padded layouts (runtime/padded_layout.h) -------------------------------------------------

// Conv2d and Conv2dGradWeight read x padded on their shifted paths: the forward's products run
// over rows rounded to kTile, the weight gradient's to kLanes, each needing its own tail.
bool reads_padded(Op op, std::span<const Shape> in, std::span<const Shape> out,
                  const AttrBlob& attrs, DType dtype, PaddedInput* p) {
  const bool forward = op == Op::Conv2d || op == Op::Conv2dAct;
  const Conv2dAttrs* a = conv_attrs(attrs);
  if ((!forward && op != Op::Conv2dGradWeight) || a == nullptr || in.size() < 2 ||
      out.size() != 1 || (dtype != DType::Float32 && dtype != DType::Float64))
    return false;
  const Shape &x = in[0], &w = forward ? in[1] : out[0], &y = forward ? out[0] : in[1];
  if (x.rank() != 4 || w.rank() != 4 || y.rank() != 4 || x.numel() == 0 || y.numel() == 0)
    return false;
  const Geometry g = geometry(x, w, y, *a);
  if (!(forward ? use_shifted(g) : use_shifted_grad_weight(g))) return false;
  *p = {g.ph, g.pw, padded_image_elements(g.c, g.h, g.w, g.ph, g.pw)};
  return true;
}

// The shifted forward writes y padded (kConvPaddedOutput).
bool writes_padded(Op op, std::span<const Shape> in, std::span<const Shape> out,
                   const AttrBlob& attrs, DType dtype) {
  PaddedInput layout;
  return (op == Op::Conv2d || op == Op::Conv2dAct) &&
         reads_padded(op, in, out, attrs, dtype, &layout);
}

[[maybe_unused]] const bool kRegistered = [] {
  ensure_single_threaded_blas();
  register_cpu_padded_layouts({&reads_padded, &writes_padded});
  register_kernel(Op::Conv2d, DeviceType::CPU, &conv2d_kernel);
  register_kernel(Op::Conv2dAct, DeviceType::CPU, &conv2d_act_kernel);
  register_kernel(Op::Conv2dGradInput, DeviceType::CPU, &conv2d_grad_input_kernel);
  register_kernel(Op::Conv2dGradWeight, DeviceType::CPU, &conv2d_grad_weight_kernel);
  return true;
}();

}  // namespace

bool set_conv_im2col(bool on) {
  return g_force_im2col.exchange(on);
}

}  // namespace encore::kernels::cpu
