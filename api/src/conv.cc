// conv2d with its backward definition, and nn::Conv2d.
#include <cmath>

#include "api/src/routine.h"
#include "encore/nn.h"
#include "kernels/cpu/conv.h"

namespace encore {
namespace F = functions;
using detail::call1;
using detail::check_floating;

namespace {

void conv2d_backward(BackwardContext& c) {
  const Conv2dAttrs& at = c.attrs<Conv2dAttrs>();
  const Tensor& x = c.input(0);
  const Tensor& w = c.input(1);
  const Tensor& gy = c.grad_output();
  if (c.needs_input_grad(0))
    c.set_input_grad(0,
                     call1(Op::Conv2dGradInput, {gy, w}, x.shape(), x.dtype(), AttrBlob::of(at)));
  if (c.needs_input_grad(1))
    c.set_input_grad(1,
                     call1(Op::Conv2dGradWeight, {x, gy}, w.shape(), w.dtype(), AttrBlob::of(at)));
  if (c.num_inputs() == 3 && c.needs_input_grad(2)) c.set_input_grad(2, F::sum(gy, {0, 2, 3}));
}

const bool kRegistered = [] {
  register_backward(Op::Conv2d, {conv2d_backward, 0b11});
  return true;
}();

}  // namespace

namespace functions {

bool set_conv_im2col(bool on) {
  return kernels::cpu::set_conv_im2col(on);
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Size2 stride,
              Size2 padding, Size2 dilation, int groups) {
  check_floating("conv2d", "x", x);
  check_floating("conv2d", "weight", weight);
  ENCORE_CHECK(x.dtype() == weight.dtype(), "conv2d: dtypes differ: x is ", x.dtype(), " ",
               x.shape(), ", weight is ", weight.dtype(), " ", weight.shape());
  ENCORE_CHECK(x.rank() == 4, "conv2d: x must be 4-D [N, C, H, W], it is ", x.shape());
  ENCORE_CHECK(weight.rank() == 4, "conv2d: weight must be 4-D [out, in/groups, kh, kw], it is ",
               weight.shape(), " (x is ", x.shape(), ")");
  const auto shapes = [&] { return cat(" (x ", x.shape(), ", weight ", weight.shape(), ")"); };
  ENCORE_CHECK(weight.size(0) > 0 && weight.size(1) > 0 && weight.size(2) > 0 && weight.size(3) > 0,
               "conv2d: weight ", weight.shape(), " has an empty dimension (x is ", x.shape(), ")");
  ENCORE_CHECK(groups > 0, "conv2d: groups must be positive, got ", groups, shapes());
  ENCORE_CHECK(stride.h > 0 && stride.w > 0, "conv2d: stride must be positive, got ", stride.str(),
               shapes());
  ENCORE_CHECK(dilation.h > 0 && dilation.w > 0, "conv2d: dilation must be positive, got ",
               dilation.str(), shapes());
  ENCORE_CHECK(padding.h >= 0 && padding.w >= 0, "conv2d: padding must be non-negative, got ",
               padding.str(), shapes());
  const int64_t out_channels = weight.size(0);
  ENCORE_CHECK(out_channels % groups == 0, "conv2d: weight ", weight.shape(), " has ", out_channels,
               " output channels, not divisible by groups ", groups, " (x is ", x.shape(), ")");
  ENCORE_CHECK(x.size(1) == weight.size(1) * groups, "conv2d: channels differ: x is ", x.shape(),
               " (", x.size(1), " channels), weight is ", weight.shape(), " (expects ",
               weight.size(1), " x groups ", groups, ")");
  const int64_t extent_h = static_cast<int64_t>(dilation.h) * (weight.size(2) - 1) + 1;
  const int64_t extent_w = static_cast<int64_t>(dilation.w) * (weight.size(3) - 1) + 1;
  const int64_t padded_h = x.size(2) + 2 * static_cast<int64_t>(padding.h);
  const int64_t padded_w = x.size(3) + 2 * static_cast<int64_t>(padding.w);
  ENCORE_CHECK(extent_h <= padded_h && extent_w <= padded_w, "conv2d: the kernel ", weight.size(2),
               "x", weight.size(3), " (dilation ", dilation.str(), ": ", extent_h, "x", extent_w,
               ") is larger than the padded input ", padded_h, "x", padded_w, shapes());
  const int64_t out_h = (padded_h - extent_h) / stride.h + 1,
                out_w = (padded_w - extent_w) / stride.w + 1;
  int64_t out_numel = 1;
  bool fits = true;
  for (const int64_t d : {x.size(0), out_channels, out_h, out_w})
    fits =
        fits && !__builtin_mul_overflow(out_numel, d, &out_numel) && out_numel <= Shape::kMaxNumel;
  ENCORE_CHECK(fits, "conv2d: an output of ", out_h, "x", out_w, " (padding ", padding.str(),
               ") has more than 2^59 elements", shapes());
  const Shape out_shape{x.size(0), out_channels, out_h, out_w};
  Conv2dAttrs attrs;
  detail::set_pair(attrs.stride, stride);
  detail::set_pair(attrs.padding, padding);
  detail::set_pair(attrs.dilation, dilation);
  attrs.groups = groups;
  if (!bias.defined())
    return call1(Op::Conv2d, {x, weight}, out_shape, x.dtype(), AttrBlob::of(attrs));
  check_floating("conv2d", "bias", bias);
  ENCORE_CHECK(bias.dtype() == x.dtype(), "conv2d: dtypes differ: x is ", x.dtype(), " ", x.shape(),
               ", bias is ", bias.dtype(), " ", bias.shape());
  ENCORE_CHECK(bias.rank() == 1 && bias.size(0) == out_channels, "conv2d: bias ", bias.shape(),
               " does not match weight ", weight.shape(), " (expected [", out_channels, "])");
  return call1(Op::Conv2d, {x, weight, bias}, out_shape, x.dtype(), AttrBlob::of(attrs));
}

}  // namespace functions

namespace nn {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel, Conv2dOptions options)
    : options_(options) {
  ENCORE_CHECK(in_channels > 0 && out_channels > 0, "Conv2d: channels must be positive, got ",
               in_channels, " -> ", out_channels);
  ENCORE_CHECK(kernel.h > 0 && kernel.w > 0, "Conv2d: kernel must be positive, got ", kernel.str());
  ENCORE_CHECK(options.stride.h > 0 && options.stride.w > 0,
               "Conv2d: stride must be positive, got ", options.stride.str());
  ENCORE_CHECK(options.dilation.h > 0 && options.dilation.w > 0,
               "Conv2d: dilation must be positive, got ", options.dilation.str());
  ENCORE_CHECK(options.padding.h >= 0 && options.padding.w >= 0,
               "Conv2d: padding must be non-negative, got ", options.padding.str());
  ENCORE_CHECK(is_floating(options.dtype), "Conv2d: dtype must be float32 or float64, it is ",
               options.dtype);
  ENCORE_CHECK(
      options.groups > 0 && in_channels % options.groups == 0 && out_channels % options.groups == 0,
      "Conv2d: groups ", options.groups, " must be positive and divide both ", in_channels,
      " input and ", out_channels, " output channels");
  const int64_t per_group = in_channels / options.groups;
  weight =
      Tensor::empty({out_channels, per_group, kernel.h, kernel.w}, options.dtype, options.device);
  const double bound = 1.0 / std::sqrt(static_cast<double>(per_group * kernel.h * kernel.w));
  uniform_(weight, -bound, bound);
  if (options.bias) bias = rand({out_channels}, options.dtype, options.device, -bound, bound);
  register_parameter("weight", &weight);
  if (options.bias) register_parameter("bias", &bias);
}

Tensor Conv2d::forward(const Tensor& x) {
  return F::conv2d(x, weight, bias, options_.stride, options_.padding, options_.dilation,
                   options_.groups);
}

std::string Conv2d::describe() const {
  const Conv2dOptions& o = options_;
  std::string s = cat("Conv2d(", weight.size(1) * o.groups, " -> ", weight.size(0), ", kernel ",
                      weight.size(2), "x", weight.size(3));
  if (o.stride != Size2(1)) s += cat(", stride ", o.stride.str());
  if (o.padding != Size2(0)) s += cat(", padding ", o.padding.str());
  if (o.dilation != Size2(1)) s += cat(", dilation ", o.dilation.str());
  if (o.groups != 1) s += cat(", groups ", o.groups);
  if (!bias.defined()) s += ", no bias";
  return s + ")";
}

}  // namespace nn
}  // namespace encore
