#include "encore/optim.h"

#include "api/src/routine.h"

namespace encore::optim {

Optimizer::Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    ENCORE_CHECK(p.defined(), "optimizer: parameter ", i, " is undefined");
    ENCORE_CHECK(is_floating(p.dtype()), "optimizer: parameter ", i, " ", p.shape(), " is ",
                 p.dtype(), "; parameters must be floating");
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  detail::zero_grads(params_, set_to_none);
}

namespace {
std::vector<Tensor> zeros_for(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  out.reserve(params.size());
  for (const Tensor& p : params) out.push_back(zeros(p.shape(), p.dtype(), p.device()));
  return out;
}
}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer(std::move(params)), options(options) {}

void SGD::step() {
  NoGradGuard no_grad;
  const AttrBlob attrs = AttrBlob::of(SgdAttrs{options.lr, 0.0, options.weight_decay});
  for (const Tensor& p : params_) {
    const Tensor g = p.grad();
    if (g.defined()) dispatch(Op::SgdUpdate, {p, g}, {}, attrs);
  }
  ++steps_;
}

MomentumSGD::MomentumSGD(std::vector<Tensor> params, MomentumSGDOptions options)
    : Optimizer(std::move(params)), options(options), velocity_(zeros_for(params_)) {}

void MomentumSGD::step() {
  NoGradGuard no_grad;
  const AttrBlob attrs = AttrBlob::of(SgdAttrs{options.lr, options.momentum, options.weight_decay});
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = params_[i].grad();
    if (g.defined()) dispatch(Op::MomentumSgdUpdate, {params_[i], g, velocity_[i]}, {}, attrs);
  }
  ++steps_;
}

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Optimizer(std::move(params)),
      options(options),
      m_(zeros_for(params_)),
      v_(zeros_for(params_)) {
  ENCORE_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
               "Adam: betas must be in [0, 1), got ", options.beta1, ", ", options.beta2);
  ENCORE_CHECK(options.eps >= 0 && options.lr >= 0, "Adam: lr and eps must be non-negative");
  for (const Tensor& p : params_) t_.push_back(zeros({}, DType::Int64, p.device()));
}

void Adam::step() {
  NoGradGuard no_grad;
  const AttrBlob attrs =
      AttrBlob::of(AdamAttrs{options.lr, options.beta1, options.beta2, options.eps,
                             options.weight_decay, options.decoupled});
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = params_[i].grad();
    if (g.defined()) dispatch(Op::AdamUpdate, {params_[i], g, m_[i], v_[i], t_[i]}, {}, attrs);
  }
  ++steps_;
}

}  // namespace encore::optim
