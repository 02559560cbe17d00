// What the convolution kernels' two paths share (conv.cc, im2col_gemm.h): the geometry of one
// convolution, the slots of their per-thread scratch, and how many images a thread takes.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/kernel.h"

namespace encore::kernels::cpu::conv {

// ---- Geometry -----------------------------------------------------------------------------

struct Geometry {
  int64_t n, c, h, w;      // input [n, c, h, w]
  int64_t o, kh, kw;       // weight [o, c / groups, kh, kw]
  int64_t ho, wo;          // output [n, o, ho, wo]
  int64_t groups, cg, og;  // channels per group: input, output
  int64_t sh, sw, ph, pw, dh, dw;

  int64_t taps() const { return cg * kh * kw; }
  int64_t pixels() const { return ho * wo; }
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

// From the shapes of x, the weight and y (whichever op: every one of them knows all three).
inline Geometry geometry(const Shape& x, const Shape& w, const Shape& y, const Conv2dAttrs& a) {
  Geometry g{};
  g.n = x[0];
  g.c = x[1];
  g.h = x[2];
  g.w = x[3];
  g.o = w[0];
  g.kh = w[2];
  g.kw = w[3];
  g.ho = y[2];
  g.wo = y[3];
  g.groups = a.groups;
  g.cg = w[1];
  g.og = g.o / a.groups;
  g.sh = a.stride[0];
  g.sw = a.stride[1];
  g.ph = a.padding[0];
  g.pw = a.padding[1];
  g.dh = a.dilation[0];
  g.dw = a.dilation[1];
  return g;
}

// ---- Scratch memory (kernels/cpu/scratch.h) ------------------------------------------------

// Slots: 0 the padded input, 1 the wide output or gradient, 2 the tap offsets, 3 the flipped
// kernel. Worker threads use only 0 and 1; 2 and 3 are filled by the calling thread and shared.
enum Slot { kPadded, kWide, kOffsets, kFlipped, kSlots };

// Rough multiply-adds below which a thread is not worth waking.
constexpr int64_t kMinWorkPerThread = 1 << 17;

inline int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, kMinWorkPerThread / std::max<int64_t>(1, work_per_item));
}

}  // namespace encore::kernels::cpu::conv
