// Optimizers: update parameters in place from their .grad, skipping parameters without one.
// Hyper-parameters and defaults follow Chainer and PyTorch.
//
//   optim::Adam opt(model->parameters(), {.lr = 1e-3});
//   loss.backward();
//   opt.step();
//   opt.zero_grad();
//
// Each update is one dispatched in-place op per parameter, so a tracer sees it. State (momentum
// buffers, Adam moments and step counters) lives in tensors for the same reason.
#pragma once

#include <vector>

#include "encore/functions.h"

namespace encore::optim {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params);
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  void zero_grad(bool set_to_none = true);
  const std::vector<Tensor>& params() const { return params_; }
  int64_t steps() const { return steps_; }

 protected:
  std::vector<Tensor> params_;
  int64_t steps_ = 0;
};

struct SGDOptions {
  double lr = 0.01;  // Chainer's default
  double weight_decay = 0;
};

// p -= lr * (g + weight_decay * p)
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options = {});
  void step() override;
  SGDOptions options;
};

struct MomentumSGDOptions {
  double lr = 0.01;
  double momentum = 0.9;
  double weight_decay = 0;
};

// v = momentum * v - lr * (g + wd * p); p += v   (Chainer's MomentumSGD)
class MomentumSGD : public Optimizer {
 public:
  MomentumSGD(std::vector<Tensor> params, MomentumSGDOptions options = {});
  void step() override;
  MomentumSGDOptions options;

 private:
  std::vector<Tensor> velocity_;
};

struct AdamOptions {
  double lr = 1e-3;  // Chainer's alpha
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // L2 added to the gradient (PyTorch Adam) ...
  bool decoupled = false;   // ... or decoupled, p -= lr * wd * p (AdamW)
};

// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr * m_hat / (sqrt(v_hat) + eps)
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  void step() override;
  AdamOptions options;

 private:
  std::vector<Tensor> m_, v_, t_;  // t_: per-parameter step counters (int64 scalars)
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // PyTorch's AdamW default
};

// Adam with decoupled weight decay, as torch.optim.AdamW: p -= lr * wd * p, then Adam's update.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions o = {})
      : Adam(std::move(params), {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, true}) {}
};

}  // namespace encore::optim
