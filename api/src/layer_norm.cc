// Layer normalisation and its backward definition.
#include "api/src/routine.h"

namespace encore {
namespace {

constexpr const char* kName = "layer_norm";

// x, gamma?, beta? (input 1 saved: gamma when there is one) -> y, mean, rstd (saved).
void layer_norm_backward(BackwardContext& c) {
  const LayerNormAttrs& a = c.attrs<LayerNormAttrs>();
  const Tensor& x = c.input(0);
  const bool has_gamma = (a.affine & kLayerNormGamma) != 0;
  const Shape params = c.input_meta(has_gamma || (a.affine & kLayerNormBeta) ? 1 : 0).shape;
  Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor ggamma = Tensor::empty(Shape{a.cols}, x.dtype(), x.device());
  Tensor gbeta = Tensor::empty(Shape{a.cols}, x.dtype(), x.device());
  const AttrBlob attrs = AttrBlob::of(a);
  if (has_gamma) {
    dispatch(Op::LayerNormGrad, {x, c.output(1), c.output(2), c.grad_output(0), c.input(1)},
             {gx, ggamma, gbeta}, attrs);
  } else {
    dispatch(Op::LayerNormGrad, {x, c.output(1), c.output(2), c.grad_output(0)},
             {gx, ggamma, gbeta}, attrs);
  }
  if (c.needs_input_grad(0)) c.set_input_grad(0, gx);
  int next = 1;
  if (has_gamma) {
    if (c.needs_input_grad(next)) c.set_input_grad(next, F::reshape(ggamma, params.dims()));
    ++next;
  }
  if ((a.affine & kLayerNormBeta) && c.needs_input_grad(next))
    c.set_input_grad(next, F::reshape(gbeta, params.dims()));
}

const bool kRegistered = [] {
  register_backward(Op::LayerNorm, {layer_norm_backward, 0b011, 0b110, 0b110});
  return true;
}();

// gamma or beta: x's dtype and exactly normalized_shape.
void check_param(const char* arg, const Tensor& p, const Tensor& x, const Shape& normalized) {
  detail::check_floating(kName, arg, p);
  ENCORE_CHECK(p.dtype() == x.dtype(), kName, ": argument '", arg, "' is ", p.dtype(), " ",
               p.shape(), ", x is ", x.dtype(), " ", x.shape(), " (dtypes must match)");
  ENCORE_CHECK(p.shape() == normalized, kName, ": argument '", arg, "' is ", p.shape(),
               ", expected normalized_shape ", normalized, " (x is ", x.shape(), ")");
}

}  // namespace

namespace functions {

Tensor layer_norm(const Tensor& x, std::span<const int64_t> normalized_shape, const Tensor& gamma,
                  const Tensor& beta, double eps) {
  detail::check_floating(kName, "x", x);
  const Shape normalized{normalized_shape};
  const int k = normalized.rank();
  bool matches = k >= 1 && k <= x.rank();
  for (int i = 0; matches && i < k; ++i) matches = x.shape()[x.rank() - k + i] == normalized[i];
  ENCORE_CHECK(matches, kName, ": normalized_shape ", normalized,
               " is not the trailing dimensions of x ", x.shape());
  ENCORE_CHECK(eps >= 0, kName, ": eps must be non-negative, it is ", eps);
  LayerNormAttrs a;
  a.eps = eps;
  a.cols = normalized.numel();
  if (gamma.defined()) {
    check_param("gamma", gamma, x, normalized);
    a.affine |= kLayerNormGamma;
  }
  if (beta.defined()) {
    check_param("beta", beta, x, normalized);
    a.affine |= kLayerNormBeta;
  }
  Shape rows;
  for (int i = 0; i < x.rank() - k; ++i) rows.push_back(x.shape()[i]);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty(rows, x.dtype(), x.device());
  Tensor rstd = Tensor::empty(rows, x.dtype(), x.device());
  const AttrBlob attrs = AttrBlob::of(a);
  if (gamma.defined() && beta.defined())
    dispatch(Op::LayerNorm, {x, gamma, beta}, {y, mean, rstd}, attrs);
  else if (gamma.defined())
    dispatch(Op::LayerNorm, {x, gamma}, {y, mean, rstd}, attrs);
  else if (beta.defined())
    dispatch(Op::LayerNorm, {x, beta}, {y, mean, rstd}, attrs);
  else
    dispatch(Op::LayerNorm, {x}, {y, mean, rstd}, attrs);
  return y;
}

Tensor layer_norm(const Tensor& x, std::initializer_list<int64_t> normalized_shape,
                  const Tensor& gamma, const Tensor& beta, double eps) {
  return layer_norm(x, std::span<const int64_t>(normalized_shape.begin(), normalized_shape.size()),
                    gamma, beta, eps);
}

}  // namespace functions
}  // namespace encore
