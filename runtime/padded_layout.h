// Padded layouts: a static cpu plan may lay a [N, C, H, W] temporary out the way the stride-1
// convolution kernels pad their input (each H x W plane inside a border of zero rows and columns,
// images a fixed number of elements apart with zeros after the planes), so the convolutions that
// read it skip their padded copy, and the convolution that writes it writes its rows into the
// interior and zeros around them (Conv2dAttrs::layout, runtime/ops.h). The kernels own the
// layout, and which path a convolution takes; they answer the planner's questions through the
// functions they register here (schedule/ may not include kernels/).
//
//   PaddedInput p;
//   if (cpu_padded_layouts().reads_padded(op, in, out, attrs, dtype, &p)) ...
#pragma once

#include <cstdint>
#include <span>

#include "runtime/kernel_abi.h"
#include "runtime/ops.h"

namespace encore {

// How a kernel reads input 0 padded: its border, and the elements per image
// (padded_image_elements).
struct PaddedInput {
  int64_t pad_h = 0, pad_w = 0;
  int64_t image = 0;
};

// Elements a padded image takes: its planes of (h + 2 pad_h) x (w + 2 pad_w), then one more row and
// kPaddedSlack elements of zeros. A stride-1 convolution's products over a padded plane read at
// most a row minus one past its planes (the kernel's width is at most a row) plus less than one
// register tile (at most kPaddedSlack elements, which conv.cc asserts), so every reader of a
// planned layout fits in it whatever its kernel size, and its writer knows the size from its own
// output.
constexpr int64_t kPaddedSlack = 64;
inline int64_t padded_image_elements(int64_t planes, int64_t h, int64_t w, int64_t pad_h,
                                     int64_t pad_w) {
  const int64_t wp = w + 2 * pad_w;
  return planes * (h + 2 * pad_h) * wp + wp + kPaddedSlack;
}

// The convolution attributes of a Conv2d, Conv2dAct or convolution-gradient step, or null.
inline const Conv2dAttrs* conv_attrs(const AttrBlob& a) {
  if (a.holds<Conv2dAttrs>()) return &a.as<Conv2dAttrs>();
  if (a.holds<Conv2dActAttrs>()) return &a.as<Conv2dActAttrs>().conv;
  return nullptr;
}

struct PaddedLayoutQueries {
  // Whether a step of `op` over operands of these shapes reads input 0 padded on the path its
  // kernel takes now (as eager would), and how. False for ops that never do.
  bool (*reads_padded)(Op op, std::span<const Shape> in, std::span<const Shape> out,
                       const AttrBlob& attrs, DType dtype, PaddedInput* layout) = nullptr;
  // Whether a step of `op` can write output 0 padded (kConvPaddedOutput).
  bool (*writes_padded)(Op op, std::span<const Shape> in, std::span<const Shape> out,
                        const AttrBlob& attrs, DType dtype) = nullptr;
};

// Registered by the cpu kernels (kernels/cpu/conv.cc) when the library loads; until then, and
// for a field left null, nothing is padded.
void register_cpu_padded_layouts(PaddedLayoutQueries queries);
const PaddedLayoutQueries& cpu_padded_layouts();

}  // namespace encore
