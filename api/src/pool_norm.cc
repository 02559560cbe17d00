// Pooling, batch normalisation and dropout: routines, backward definitions and modules.
#include <cmath>

#include "api/src/routine.h"
#include "encore/nn.h"

namespace encore {
namespace F = functions;
using detail::call1;
using detail::check_floating;

namespace {

// ---- Pooling ------------------------------------------------------------------------------

void max_pool2d_backward(BackwardContext& c) {
  const Tensor& x = c.input(0);
  c.set_input_grad(0, call1(Op::MaxPool2dGrad, {x, c.grad_output()}, x.shape(), x.dtype(),
                            AttrBlob::of(c.attrs<Pool2dAttrs>())));
}

void avg_pool2d_backward(BackwardContext& c) {
  const TensorMeta& in = c.input_meta(0);
  c.set_input_grad(0, call1(Op::AvgPool2dGrad, {c.grad_output()}, in.shape, in.dtype,
                            AttrBlob::of(c.attrs<Pool2dAttrs>())));
}

// Whether padding is between 0 and half the kernel, in int64_t (twice an int may overflow).
bool padding_within_half_kernel(Size2 padding, Size2 kernel) {
  return padding.h >= 0 && padding.w >= 0 && 2 * int64_t{padding.h} <= kernel.h &&
         2 * int64_t{padding.w} <= kernel.w;
}

// Checks a pooling call and gives its attributes and output shape [N, C, Ho, Wo].
Pool2dAttrs pool_attrs(const char* op, const Tensor& x, Size2 kernel, std::optional<Size2> stride,
                       Size2 padding, bool count_include_pad, Shape& out) {
  check_floating(op, "x", x);
  ENCORE_CHECK(x.rank() == 4, op, ": x must be 4-D [N,C,H,W], it is ", x.shape());
  const Size2 st = stride.value_or(kernel);
  ENCORE_CHECK(kernel.h > 0 && kernel.w > 0, op, ": kernel must be positive, it is ", kernel.str(),
               " (x is ", x.shape(), ")");
  ENCORE_CHECK(st.h > 0 && st.w > 0, op, ": stride must be positive, it is ", st.str(), " (x is ",
               x.shape(), ")");
  ENCORE_CHECK(padding_within_half_kernel(padding, kernel), op, ": padding ", padding.str(),
               " must be between 0 and half the kernel ", kernel.str(), " (x is ", x.shape(), ")");
  // The padded sizes in int64_t: x's sizes plus twice an int.
  const int64_t padded_h = x.size(2) + 2 * int64_t{padding.h};
  const int64_t padded_w = x.size(3) + 2 * int64_t{padding.w};
  ENCORE_CHECK(x.size(2) > 0 && x.size(3) > 0, op, ": x ", x.shape(),
               " has no elements in height or width");
  ENCORE_CHECK(padded_h >= kernel.h && padded_w >= kernel.w, op, ": kernel ", kernel.str(),
               " is larger than the padded input: x is ", x.shape(), ", padding ", padding.str());
  out = Shape{x.size(0), x.size(1), (padded_h - kernel.h) / st.h + 1,
              (padded_w - kernel.w) / st.w + 1};
  Pool2dAttrs a;
  detail::set_pair(a.kernel, kernel);
  detail::set_pair(a.stride, st);
  detail::set_pair(a.padding, padding);
  a.count_include_pad = count_include_pad;
  return a;
}

// ---- Batch normalisation ------------------------------------------------------------------

// x, gamma (bit 1 saved; only when affine) -> y, mean, var (saved).
void batch_norm_backward(BackwardContext& c) {
  const Tensor& x = c.input(0);
  const bool affine = c.num_inputs() == 3;
  const Shape channels{x.size(1)};
  Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor ggamma = Tensor::empty(channels, x.dtype(), x.device());
  Tensor gbeta = Tensor::empty(channels, x.dtype(), x.device());
  const AttrBlob attrs = AttrBlob::of(c.attrs<BatchNormAttrs>());
  if (affine) {
    dispatch(Op::BatchNormGrad, {x, c.output(1), c.output(2), c.grad_output(0), c.input(1)},
             {gx, ggamma, gbeta}, attrs);
  } else {
    dispatch(Op::BatchNormGrad, {x, c.output(1), c.output(2), c.grad_output(0)},
             {gx, ggamma, gbeta}, attrs);
  }
  if (c.needs_input_grad(0)) c.set_input_grad(0, gx);
  if (affine && c.needs_input_grad(1)) c.set_input_grad(1, ggamma);
  if (affine && c.needs_input_grad(2)) c.set_input_grad(2, gbeta);
}

// A [C] tensor viewed as [1, C, 1, ...] to broadcast against x of rank `rank`.
Tensor per_channel(const Tensor& v, int rank) {
  std::vector<int64_t> dims(rank, 1);
  dims[1] = v.size(0);
  return F::reshape(v, dims);
}

// x, running mean, running var, gamma, beta (saved but beta) -> y = (x - mean) invstd gamma + beta.
void batch_norm_inference_backward(BackwardContext& c) {
  const Tensor& x = c.input(0);
  const Tensor& gy = c.grad_output();
  const int rank = x.rank();
  const bool affine = c.num_inputs() == 5;
  const Tensor invstd = F::div(1.0, F::sqrt(F::add(c.input(2), c.attrs<BatchNormAttrs>().eps)));
  if (c.needs_input_grad(0)) {
    const Tensor scale = affine ? F::mul(c.input(3), invstd) : invstd;
    c.set_input_grad(0, F::mul(gy, per_channel(scale, rank)));
  }
  if (!affine) return;
  std::vector<int> axes{0};
  for (int i = 2; i < rank; ++i) axes.push_back(i);
  if (c.needs_input_grad(3)) {
    const Tensor xhat = F::mul(F::sub(x, per_channel(c.input(1), rank)), per_channel(invstd, rank));
    c.set_input_grad(3, F::sum(F::mul(gy, xhat), axes));
  }
  if (c.needs_input_grad(4)) c.set_input_grad(4, F::sum(gy, axes));
}

// A [C] argument of batch_norm: floating, x's dtype, one value per channel.
void check_channel_vector(const char* arg, const Tensor& v, const Tensor& x) {
  check_floating("batch_norm", arg, v);
  ENCORE_CHECK(v.dtype() == x.dtype(), "batch_norm: ", arg, " is ", v.dtype(), " ", v.shape(),
               " but x is ", x.dtype(), " ", x.shape());
  ENCORE_CHECK(v.rank() == 1 && v.size(0) == x.size(1), "batch_norm: ", arg, " is ", v.shape(),
               " but x ", x.shape(), " has ", x.size(1), " channels (expected [", x.size(1), "])");
}

// ---- Dropout ------------------------------------------------------------------------------

void dropout_backward(BackwardContext& c) {
  c.set_input_grad(0, F::mul(c.grad_output(0), c.output(1)));
}

const bool kRegistered = [] {
  register_backward(Op::MaxPool2d, {max_pool2d_backward, 0b1});
  register_backward(Op::AvgPool2d, {avg_pool2d_backward});
  // The batch mean and variance are statistics, not differentiable outputs.
  register_backward(Op::BatchNorm, {batch_norm_backward, 0b011, 0b110, 0b110});
  register_backward(Op::BatchNormInference, {batch_norm_inference_backward, 0b1111});
  register_backward(Op::Dropout, {dropout_backward, 0, 0b10, 0b10});
  return true;
}();

}  // namespace

namespace functions {

Tensor max_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride, Size2 padding) {
  Shape out;
  const Pool2dAttrs a = pool_attrs("max_pool2d", x, kernel, stride, padding, true, out);
  return call1(Op::MaxPool2d, {x}, out, x.dtype(), AttrBlob::of(a));
}

Tensor avg_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride, Size2 padding,
                  bool count_include_pad) {
  Shape out;
  const Pool2dAttrs a =
      pool_attrs("avg_pool2d", x, kernel, stride, padding, count_include_pad, out);
  return call1(Op::AvgPool2d, {x}, out, x.dtype(), AttrBlob::of(a));
}

Tensor global_avg_pool2d(const Tensor& x) {
  check_floating("global_avg_pool2d", "x", x);
  ENCORE_CHECK(x.rank() == 4, "global_avg_pool2d: x must be 4-D [N,C,H,W], it is ", x.shape());
  ENCORE_CHECK(x.size(2) > 0 && x.size(3) > 0, "global_avg_pool2d: x ", x.shape(),
               " has no elements in height or width");
  return mean(x, {2, 3});
}

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& gamma, const Tensor& beta, bool training, double momentum,
                  double eps) {
  check_floating("batch_norm", "x", x);
  ENCORE_CHECK(x.rank() == 2 || x.rank() == 4, "batch_norm: x must be [N,C] or [N,C,H,W], it is ",
               x.shape());
  ENCORE_CHECK(gamma.defined() == beta.defined(),
               "batch_norm: gamma and beta must be given together (gamma is ",
               gamma.defined() ? gamma.shape().str() : "undefined", ", beta is ",
               beta.defined() ? beta.shape().str() : "undefined", ")");
  ENCORE_CHECK(running_mean.defined() == running_var.defined(),
               "batch_norm: running_mean and running_var must be given together (running_mean is ",
               running_mean.defined() ? running_mean.shape().str() : "undefined",
               ", running_var is ", running_var.defined() ? running_var.shape().str() : "undefined",
               ")");
  if (gamma.defined()) {
    check_channel_vector("gamma", gamma, x);
    check_channel_vector("beta", beta, x);
  }
  if (running_mean.defined()) {
    check_channel_vector("running_mean", running_mean, x);
    check_channel_vector("running_var", running_var, x);
  }
  ENCORE_CHECK(eps >= 0, "batch_norm: eps must be non-negative, it is ", eps);
  ENCORE_CHECK(momentum >= 0 && momentum <= 1, "batch_norm: momentum must be in [0, 1], it is ",
               momentum);
  const int64_t count = x.numel() / std::max<int64_t>(1, x.size(1));
  const AttrBlob attrs = AttrBlob::of(BatchNormAttrs{eps, momentum, count});

  if (!training) {
    ENCORE_CHECK(running_mean.defined(),
                 "batch_norm: eval mode (training false) needs running_mean and running_var; x is ",
                 x.shape());
    if (gamma.defined())
      return call1(Op::BatchNormInference, {x, running_mean, running_var, gamma, beta}, x.shape(),
                   x.dtype(), attrs);
    return call1(Op::BatchNormInference, {x, running_mean, running_var}, x.shape(), x.dtype(),
                 attrs);
  }

  ENCORE_CHECK(x.size(1) > 0, "batch_norm: x ", x.shape(), " has no channels (dimension 1 is 0)");
  ENCORE_CHECK(count > 1, "batch_norm: training needs more than one value per channel; x is ",
               x.shape());
  const Shape channels{x.size(1)};
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor batch_mean = Tensor::empty(channels, x.dtype(), x.device());
  Tensor batch_var = Tensor::empty(channels, x.dtype(), x.device());
  if (gamma.defined()) {
    dispatch(Op::BatchNorm, {x, gamma, beta}, {y, batch_mean, batch_var}, attrs);
  } else {
    dispatch(Op::BatchNorm, {x}, {y, batch_mean, batch_var}, attrs);
  }
  if (running_mean.defined())
    dispatch(Op::BatchNormStatsUpdate, {running_mean, running_var, batch_mean, batch_var}, {},
             attrs);
  return y;
}

Tensor dropout(const Tensor& x, double ratio, bool training) {
  check_floating("dropout", "x", x);
  ENCORE_CHECK(ratio >= 0 && ratio <= 1, "dropout: ratio must be in [0, 1], it is ", ratio,
               " (x is ", x.shape(), ")");
  if (!training || ratio == 0) return x;
  // Every element dropped: x * 0 as PyTorch, so a NaN stays NaN and nothing is drawn.
  if (ratio == 1) return F::mul(x, 0.0);
  const Generator::Stream s = default_generator(x.device()).reserve(random_count(x.numel()));
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mask = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch(Op::Dropout, {x}, {y, mask}, AttrBlob::of(RandomAttrs{ratio, 0, s.seed, s.offset}));
  return y;
}

}  // namespace functions

namespace nn {

BatchNorm2d::BatchNorm2d(int64_t channels, BatchNormOptions options) : options_(options) {
  ENCORE_CHECK(channels > 0, "BatchNorm2d: channels must be positive, it is ", channels);
  ENCORE_CHECK(options.eps >= 0 && std::isfinite(options.eps),
               "BatchNorm2d: eps must be finite and non-negative, it is ", options.eps);
  ENCORE_CHECK(options.momentum >= 0 && options.momentum <= 1,
               "BatchNorm2d: momentum must be in [0, 1], it is ", options.momentum);
  ENCORE_CHECK(is_floating(options.dtype), "BatchNorm2d: dtype must be float32 or float64, it is ",
               options.dtype);
  running_mean = zeros({channels}, options.dtype, options.device);
  running_var = ones({channels}, options.dtype, options.device);
  register_buffer("running_mean", &running_mean);
  register_buffer("running_var", &running_var);
  if (options.affine) {
    gamma = ones({channels}, options.dtype, options.device);
    beta = zeros({channels}, options.dtype, options.device);
    register_parameter("gamma", &gamma);
    register_parameter("beta", &beta);
  }
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  return F::batch_norm(x, running_mean, running_var, gamma, beta, training_in_forward(),
                       options_.momentum, options_.eps);
}

std::string BatchNorm2d::describe() const {
  return cat("BatchNorm2d(", running_mean.defined() ? running_mean.size(0) : 0, ", eps ",
             options_.eps, ", momentum ", options_.momentum, options_.affine ? "" : ", no affine",
             ")");
}

Dropout::Dropout(double ratio) : ratio_(ratio) {
  ENCORE_CHECK(ratio >= 0 && ratio <= 1, "Dropout: ratio must be in [0, 1], it is ", ratio);
}

std::string Dropout::describe() const {
  return cat("Dropout(", ratio_, ")");
}

Pool2d::Pool2d(const char* name, Size2 kernel, std::optional<Size2> stride, Size2 padding)
    : kernel_(kernel), stride_(stride), padding_(padding) {
  ENCORE_CHECK(kernel.h > 0 && kernel.w > 0, name, ": kernel must be positive, it is ",
               kernel.str());
  ENCORE_CHECK(!stride || (stride->h > 0 && stride->w > 0), name,
               ": stride must be positive, it is ", stride.value_or(kernel).str());
  ENCORE_CHECK(padding_within_half_kernel(padding, kernel), name, ": padding ", padding.str(),
               " must be between 0 and half the kernel ", kernel.str());
}

std::string Pool2d::describe_as(const char* name) const {
  return cat(name, "(kernel ", kernel_.str(), ", stride ", stride_.value_or(kernel_).str(),
             ", padding ", padding_.str(), ")");
}

}  // namespace nn
}  // namespace encore
