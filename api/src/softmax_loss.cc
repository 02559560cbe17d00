// Softmax family and losses, with their backward definitions.
#include "api/src/routine.h"

namespace encore {
namespace F = functions;
using detail::call1;
using detail::check_floating;

namespace detail {
Tensor softmax_cross_entropy_grad(const Tensor& logits, const Tensor& labels, const Tensor& gy,
                                  int64_t ignore_label) {
  return call1(Op::SoftmaxCrossEntropyGrad, {logits, labels, gy}, logits.shape(), logits.dtype(),
               AttrBlob::of(CrossEntropyAttrs{ignore_label}));
}
}  // namespace detail

namespace {

void softmax_backward(BackwardContext& c) {
  c.set_input_grad(0, call1(Op::SoftmaxGrad, {c.output(), c.grad_output()}, c.grad_output().shape(),
                            c.grad_output().dtype(), AttrBlob::of(c.attrs<AxisAttrs>())));
}

void log_softmax_backward(BackwardContext& c) {
  c.set_input_grad(0,
                   call1(Op::LogSoftmaxGrad, {c.output(), c.grad_output()}, c.grad_output().shape(),
                         c.grad_output().dtype(), AttrBlob::of(c.attrs<AxisAttrs>())));
}

void softmax_cross_entropy_backward(BackwardContext& c) {
  c.set_input_grad(0,
                   detail::softmax_cross_entropy_grad(c.input(0), c.input(1), c.grad_output(),
                                                      c.attrs<CrossEntropyAttrs>().ignore_label));
}

void mean_squared_error_backward(BackwardContext& c) {
  const Tensor& a = c.input(0);
  const double scale = 2.0 / static_cast<double>(std::max<int64_t>(1, a.numel()));
  const Tensor g = F::mul(F::sub(a, c.input(1)), F::mul(c.grad_output(), scale));
  if (c.needs_input_grad(0)) c.set_input_grad(0, g);
  if (c.needs_input_grad(1)) c.set_input_grad(1, F::neg(g));
}

const bool kRegistered = [] {
  register_backward(Op::Softmax, {softmax_backward, 0, 0b1});
  register_backward(Op::LogSoftmax, {log_softmax_backward, 0, 0b1});
  register_backward(Op::SoftmaxCrossEntropy, {softmax_cross_entropy_backward, 0b11});
  register_backward(Op::MeanSquaredError, {mean_squared_error_backward, 0b11});
  return true;
}();

Tensor softmax_like(Op op, const char* name, const Tensor& x, int axis) {
  check_floating(name, "x", x);
  if (x.rank() == 0) {  // as PyTorch: axis 0 (or -1) of a 0-d tensor is its one value
    ENCORE_CHECK(axis == 0 || axis == -1, name, ": axis ", axis,
                 " is out of range for a 0-d tensor (0 and -1 are its only axes)");
    return F::reshape(softmax_like(op, name, F::reshape(x, {1}), 0), {});
  }
  const int ax = normalize_axis(axis, x.rank(), name);
  return call1(op, {x}, x.shape(), x.dtype(), AttrBlob::of(AxisAttrs{ax}));
}

void check_classification(const char* name, const Tensor& logits, const Tensor& labels) {
  check_floating(name, "logits", logits);
  detail::check_defined(name, "labels", labels);
  ENCORE_CHECK(logits.rank() == 2, name, ": logits must be 2-D [N, C], they are ", logits.shape());
  ENCORE_CHECK(is_integral(labels.dtype()), name, ": labels must be int32 or int64, they are ",
               labels.dtype(), " ", labels.shape());
  ENCORE_CHECK(labels.rank() == 1 && labels.size(0) == logits.size(0), name, ": labels ",
               labels.shape(), " do not match logits ", logits.shape(), " (expected [",
               logits.size(0), "])");
}

}  // namespace

namespace functions {

Tensor softmax(const Tensor& x, int axis) {
  return softmax_like(Op::Softmax, "softmax", x, axis);
}
Tensor log_softmax(const Tensor& x, int axis) {
  return softmax_like(Op::LogSoftmax, "log_softmax", x, axis);
}

Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_label) {
  check_classification("softmax_cross_entropy", logits, labels);
  return call1(Op::SoftmaxCrossEntropy, {logits, labels}, Shape{}, logits.dtype(),
               AttrBlob::of(CrossEntropyAttrs{ignore_label}));
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  constexpr const char* kName = "cross_entropy";
  check_floating(kName, "logits", logits);
  detail::check_defined(kName, "targets", targets);
  ENCORE_CHECK(is_integral(targets.dtype()), kName,
               ": argument 'targets' must be int32 or int64, it is ", targets.dtype(), " ",
               targets.shape());
  ENCORE_CHECK(logits.rank() >= 1, kName, ": logits must be [..., V], they are ", logits.shape());
  Shape expected;
  for (int i = 0; i + 1 < logits.rank(); ++i) expected.push_back(logits.shape()[i]);
  ENCORE_CHECK(targets.shape() == expected, kName, ": targets ", targets.shape(),
               " do not match logits ", logits.shape(), " (expected targets ", expected,
               ", the class axis last)");
  const int64_t n = targets.numel(), classes = logits.size(-1);
  // softmax_cross_entropy's op, with range errors that name this function and 'targets'.
  return call1(Op::SoftmaxCrossEntropy, {reshape(logits, {n, classes}), reshape(targets, {n})},
               Shape{}, logits.dtype(),
               AttrBlob::of(CrossEntropyAttrs{ignore_index, /*from_cross_entropy=*/1}));
}

Tensor mean_squared_error(const Tensor& a, const Tensor& b) {
  check_floating("mean_squared_error", "a", a);
  check_floating("mean_squared_error", "b", b);
  detail::check_same_dtype("mean_squared_error", a, b);
  ENCORE_CHECK(a.shape() == b.shape(), "mean_squared_error: shapes differ: a is ", a.shape(),
               ", b is ", b.shape());
  return call1(Op::MeanSquaredError, {a, b}, Shape{}, a.dtype());
}

Tensor accuracy(const Tensor& logits, const Tensor& labels, int64_t ignore_label) {
  check_classification("accuracy", logits, labels);
  return call1(Op::Accuracy, {logits, labels}, Shape{}, logits.dtype(),
               AttrBlob::of(CrossEntropyAttrs{ignore_label}));
}

}  // namespace functions
}  // namespace encore
