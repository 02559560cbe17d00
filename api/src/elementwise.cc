// Elementwise routines and their backward definitions.
#include "api/src/routine.h"

namespace encore {
namespace F = functions;
using detail::call1;
using detail::check_floating;

namespace {

Tensor binary(Op op, const char* name, const Tensor& a, const Tensor& b) {
  check_floating(name, "a", a);
  check_floating(name, "b", b);
  detail::check_same_dtype(name, a, b);
  return call1(op, {a, b}, broadcast_shapes(a.shape(), b.shape(), name), a.dtype());
}

Tensor scalar_op(Op op, const char* name, const Tensor& x, double s) {
  check_floating(name, "x", x);
  return call1(op, {x}, x.shape(), x.dtype(), AttrBlob::of(ScalarAttrs{s}));
}

Tensor unary(Op op, const char* name, const Tensor& x) {
  check_floating(name, "x", x);
  return call1(op, {x}, x.shape(), x.dtype());
}

// dy/dx of an op whose backward is a helper op over (saved, gy).
Tensor grad_helper(Op op, const Tensor& saved, const Tensor& gy, const AttrBlob& attrs = {}) {
  return call1(op, {saved, gy}, gy.shape(), gy.dtype(), attrs);
}

Tensor scalar_like(const Tensor& t, double v) {
  return full({}, v, t.dtype(), t.device());
}

// ---- Backward formulas ------------------------------------------------------------------

void add_backward(BackwardContext& c) {
  const Tensor& gy = c.grad_output();
  if (c.needs_input_grad(0)) c.set_input_grad(0, detail::sum_to_or_self(gy, c.input_meta(0).shape));
  if (c.needs_input_grad(1)) c.set_input_grad(1, detail::sum_to_or_self(gy, c.input_meta(1).shape));
}

void sub_backward(BackwardContext& c) {
  const Tensor& gy = c.grad_output();
  if (c.needs_input_grad(0)) c.set_input_grad(0, detail::sum_to_or_self(gy, c.input_meta(0).shape));
  if (c.needs_input_grad(1))
    c.set_input_grad(1, detail::sum_to_or_self(F::neg(gy), c.input_meta(1).shape));
}

void mul_backward(BackwardContext& c) {
  const Tensor& gy = c.grad_output();
  if (c.needs_input_grad(0))
    c.set_input_grad(0, detail::sum_to_or_self(F::mul(gy, c.input(1)), c.input_meta(0).shape));
  if (c.needs_input_grad(1))
    c.set_input_grad(1, detail::sum_to_or_self(F::mul(gy, c.input(0)), c.input_meta(1).shape));
}

void div_backward(BackwardContext& c) {  // saves b and y = a / b
  const Tensor ga = F::div(c.grad_output(), c.input(1));
  if (c.needs_input_grad(0)) c.set_input_grad(0, detail::sum_to_or_self(ga, c.input_meta(0).shape));
  if (c.needs_input_grad(1))
    c.set_input_grad(1,
                     detail::sum_to_or_self(F::neg(F::mul(ga, c.output())), c.input_meta(1).shape));
}

void identity_backward(BackwardContext& c) {
  c.set_input_grad(0, c.grad_output());
}

void neg_backward(BackwardContext& c) {
  c.set_input_grad(0, F::neg(c.grad_output()));
}

void mul_scalar_backward(BackwardContext& c) {
  c.set_input_grad(0, F::mul(c.grad_output(), c.attrs<ScalarAttrs>().value));
}

void div_scalar_backward(BackwardContext& c) {
  c.set_input_grad(0, F::div(c.grad_output(), c.attrs<ScalarAttrs>().value));
}

void rdiv_scalar_backward(BackwardContext& c) {  // y = s / x: dy/dx = -y / x
  c.set_input_grad(0, F::neg(F::div(F::mul(c.grad_output(), c.output()), c.input(0))));
}

void pow_scalar_backward(BackwardContext& c) {  // p x^(p-1)
  const double p = c.attrs<ScalarAttrs>().value;
  if (p == 0) {  // x^0 is constant; 0 * x^-1 would give NaN at x = 0
    c.set_input_grad(0, F::mul(c.grad_output(), 0.0));
    return;
  }
  c.set_input_grad(0, F::mul(c.grad_output(), F::mul(F::pow(c.input(0), p - 1), p)));
}

void exp_backward(BackwardContext& c) {
  c.set_input_grad(0, F::mul(c.grad_output(), c.output()));
}

void log_backward(BackwardContext& c) {
  c.set_input_grad(0, F::div(c.grad_output(), c.input(0)));
}

void sqrt_backward(BackwardContext& c) {  // 1 / (2 sqrt x)
  c.set_input_grad(0, F::mul(F::div(c.grad_output(), c.output()), 0.5));
}

void relu_backward(BackwardContext& c) {
  c.set_input_grad(0, grad_helper(Op::ReluGrad, c.output(), c.grad_output()));
}

void leaky_relu_backward(BackwardContext& c) {
  c.set_input_grad(0, grad_helper(Op::LeakyReluGrad, c.input(0), c.grad_output(),
                                  AttrBlob::of(c.attrs<ScalarAttrs>())));
}

void gelu_backward(BackwardContext& c) {
  c.set_input_grad(0, grad_helper(Op::GeluGrad, c.input(0), c.grad_output(),
                                  AttrBlob::of(c.attrs<ScalarAttrs>())));
}

void sigmoid_backward(BackwardContext& c) {
  c.set_input_grad(0, grad_helper(Op::SigmoidGrad, c.output(), c.grad_output()));
}

void tanh_backward(BackwardContext& c) {
  c.set_input_grad(0, grad_helper(Op::TanhGrad, c.output(), c.grad_output()));
}

void where_backward(BackwardContext& c) {
  const Tensor& cond = c.input(0);
  const Tensor& gy = c.grad_output();
  const Tensor zero = scalar_like(gy, 0.0);
  if (c.needs_input_grad(1))
    c.set_input_grad(1, detail::sum_to_or_self(F::where(cond, gy, zero), c.input_meta(1).shape));
  if (c.needs_input_grad(2))
    c.set_input_grad(2, detail::sum_to_or_self(F::where(cond, zero, gy), c.input_meta(2).shape));
}

const bool kRegistered = [] {
  register_backward(Op::Add, {add_backward});
  register_backward(Op::Sub, {sub_backward});
  register_backward(Op::Mul, {.fn = mul_backward, .save_inputs = 0b11, .save_for_other = 0b11});
  register_backward(Op::Div, {div_backward, 0b10, 0b1});
  register_backward(Op::AddScalar, {identity_backward});
  register_backward(Op::MulScalar, {mul_scalar_backward});
  register_backward(Op::RsubScalar, {neg_backward});
  register_backward(Op::DivScalar, {div_scalar_backward});
  register_backward(Op::RdivScalar, {rdiv_scalar_backward, 0b1, 0b1});
  register_backward(Op::PowScalar, {pow_scalar_backward, 0b1});
  register_backward(Op::Neg, {neg_backward});
  register_backward(Op::Exp, {exp_backward, 0, 0b1});
  register_backward(Op::Log, {log_backward, 0b1});
  register_backward(Op::Sqrt, {sqrt_backward, 0, 0b1});
  register_backward(Op::Relu, {relu_backward, 0, 0b1});
  register_backward(Op::LeakyRelu, {leaky_relu_backward, 0b1});
  register_backward(Op::Sigmoid, {sigmoid_backward, 0, 0b1});
  register_backward(Op::Tanh, {tanh_backward, 0, 0b1});
  register_backward(Op::Gelu, {gelu_backward, 0b1});
  register_backward(Op::Where, {where_backward, 0b1});
  register_backward(Op::Copy, {identity_backward});
  return true;
}();

}  // namespace

namespace functions {

Tensor add(const Tensor& a, const Tensor& b) {
  return binary(Op::Add, "add", a, b);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary(Op::Sub, "sub", a, b);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary(Op::Mul, "mul", a, b);
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary(Op::Div, "div", a, b);
}

Tensor add(const Tensor& x, double s) {
  return scalar_op(Op::AddScalar, "add", x, s);
}
Tensor sub(const Tensor& x, double s) {
  return scalar_op(Op::AddScalar, "sub", x, -s);
}
Tensor sub(double s, const Tensor& x) {
  return scalar_op(Op::RsubScalar, "sub", x, s);
}
Tensor mul(const Tensor& x, double s) {
  return scalar_op(Op::MulScalar, "mul", x, s);
}
Tensor div(const Tensor& x, double s) {
  return scalar_op(Op::DivScalar, "div", x, s);
}
Tensor div(double s, const Tensor& x) {
  return scalar_op(Op::RdivScalar, "div", x, s);
}
Tensor pow(const Tensor& x, double exponent) {
  return scalar_op(Op::PowScalar, "pow", x, exponent);
}

Tensor neg(const Tensor& x) {
  return unary(Op::Neg, "neg", x);
}
Tensor exp(const Tensor& x) {
  return unary(Op::Exp, "exp", x);
}
Tensor log(const Tensor& x) {
  return unary(Op::Log, "log", x);
}
Tensor sqrt(const Tensor& x) {
  return unary(Op::Sqrt, "sqrt", x);
}
Tensor relu(const Tensor& x) {
  return unary(Op::Relu, "relu", x);
}
Tensor leaky_relu(const Tensor& x, double slope) {
  return scalar_op(Op::LeakyRelu, "leaky_relu", x, slope);
}
Tensor sigmoid(const Tensor& x) {
  return unary(Op::Sigmoid, "sigmoid", x);
}
Tensor tanh(const Tensor& x) {
  return unary(Op::Tanh, "tanh", x);
}
Tensor gelu(const Tensor& x, std::string_view approximate) {
  ENCORE_CHECK(approximate == "none" || approximate == "tanh",
               "gelu: argument 'approximate' must be \"none\" or \"tanh\", it is \"", approximate,
               "\"");
  return scalar_op(Op::Gelu, "gelu", x, approximate == "tanh" ? kGeluTanh : 0.0);
}

namespace {
Tensor compare(Op op, const char* name, const Tensor& a, const Tensor& b) {
  detail::check_defined(name, "a", a);
  detail::check_defined(name, "b", b);
  ENCORE_CHECK(a.dtype() != DType::Bool, name, ": bool operands are not supported");
  detail::check_same_dtype(name, a, b);
  return call1(op, {a, b}, broadcast_shapes(a.shape(), b.shape(), name), DType::Bool);
}
}  // namespace

Tensor equal(const Tensor& a, const Tensor& b) {
  return compare(Op::Equal, "equal", a, b);
}
Tensor greater(const Tensor& a, const Tensor& b) {
  return compare(Op::Greater, "greater", a, b);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  detail::check_defined("where", "cond", cond);
  ENCORE_CHECK(cond.dtype() == DType::Bool, "where: cond must be bool, it is ", cond.dtype(), " ",
               cond.shape());
  check_floating("where", "a", a);
  check_floating("where", "b", b);
  detail::check_same_dtype("where", a, b);
  const Shape s = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where", "cond", "a"),
                                   b.shape(), "where", "cond and a broadcast together", "b");
  return call1(Op::Where, {cond, a, b}, s, a.dtype());
}

}  // namespace functions
}  // namespace encore
