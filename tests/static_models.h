// Models and training steps shared by the static_graph tests on the cpu (static_graph_test.cc,
// static_conv_test.cc) and on cuda:0 (cuda/cuda_static_test.cc), whose common scenarios are in
// static_scenarios.h.
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"

namespace encore::testing {

// The MLP of the examples (nn::mlp) as a module of its own, for subclasses to mark static.
class MlpNet : public nn::Module {
 public:
  MlpNet(int64_t in, int64_t hidden, int64_t out)
      : net(register_module("net", nn::mlp(in, hidden, out))) {}
  Tensor forward(const Tensor& x) override { return (*net)(x); }

  std::shared_ptr<nn::Sequential> net;
};

// The MLP with its forward marked static (the module form).
struct StaticMlp : MlpNet {
  using MlpNet::MlpNet;
  ENCORE_STATIC_GRAPH({.name = "static_mlp", .arg_names = {"x"}});
};

struct Batch {
  Tensor x, t;
};

// `count` batches of a synthetic 10-class problem, moved to `device`.
inline std::vector<Batch> mlp_batches(int64_t count, int64_t batch, int64_t features, uint64_t seed,
                                      Device device = Device::cpu()) {
  const auto ds = data::synthetic_classification(count * batch, features, 10, seed);
  data::BatchIterator it(ds, batch, /*shuffle=*/false);
  std::vector<Batch> out;
  Batch b;
  while (it.next(b.x, b.t)) out.push_back({b.x.to(device), b.t.to(device)});
  return out;
}

// One training step of a model on a batch: zero_grad, forward, softmax cross-entropy, backward,
// update, with the optimizer `make_opt` makes for the model. Called directly it is the eager
// reference; make_static() wraps it whole.
template <typename MakeOpt>
class TrainStep {
 public:
  TrainStep(std::shared_ptr<nn::Module> model, MakeOpt make_opt)
      : model_(std::move(model)), opt_(make_opt(*model_)) {}
  Tensor operator()(const Tensor& x, const Tensor& t) {
    opt_.zero_grad();
    Tensor loss = F::softmax_cross_entropy((*model_)(x), t);
    loss.backward();
    opt_.step();
    return loss;
  }
  Tensor operator()(const Batch& b) { return (*this)(b.x, b.t); }
  std::invoke_result_t<MakeOpt, nn::Module&>& optimizer() { return opt_; }
  auto make_static(StaticOptions options) {
    options.modules = {model_};
    return static_graph([this](const Tensor& x, const Tensor& t) { return (*this)(x, t); },
                        std::move(options));
  }

 private:
  std::shared_ptr<nn::Module> model_;
  std::invoke_result_t<MakeOpt, nn::Module&> opt_;
};

struct MakeAdam {
  optim::Adam operator()(nn::Module& m) const { return optim::Adam(m.parameters(), {.lr = 1e-3}); }
};

// The Adam step (lr 1e-3) most static tests train with.
class AdamStep : public TrainStep<MakeAdam> {
 public:
  explicit AdamStep(std::shared_ptr<nn::Module> model)
      : TrainStep<MakeAdam>(std::move(model), MakeAdam{}) {}
};

struct StaticSeedCnn : models::SeedCnn {
  ENCORE_STATIC_GRAPH({.name = "seed_cnn", .arg_names = {"x"}});
};

// conv -> batch norm -> relu -> dropout -> linear, small enough for a test.
class BnNet : public nn::Module {
 public:
  BnNet()
      : conv(register_module(
            "conv", std::make_shared<nn::Conv2d>(2, 4, 3, nn::Conv2dOptions{.padding = 1}))),
        bn(register_module("bn", std::make_shared<nn::BatchNorm2d>(4))),
        drop(register_module("drop", std::make_shared<nn::Dropout>(0.3))),
        fc(register_module("fc", std::make_shared<nn::Linear>(4 * 5 * 5, 3))) {}
  Tensor forward(const Tensor& x) override {
    Tensor h = (*drop)(F::relu((*bn)((*conv)(x))));
    return (*fc)(F::flatten(h, 1));
  }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::Linear> fc;
};

struct StaticBnNet : BnNet {
  ENCORE_STATIC_GRAPH({.name = "bn_net", .arg_names = {"x"}});
};

// Linear layers with gelu between them, both forms: in a training step the products of the
// backward apply gelu_grad (gelu's gradient reads its input, so the forward pairs stay apart).
class GeluMlp : public nn::Module {
 public:
  explicit GeluMlp(DType dtype) {
    const nn::LinearOptions o{.dtype = dtype};
    l1 = register_module("l1", std::make_shared<nn::Linear>(24, 16, o));
    l2 = register_module("l2", std::make_shared<nn::Linear>(16, 16, o));
    l3 = register_module("l3", std::make_shared<nn::Linear>(16, 10, o));
  }
  Tensor forward(const Tensor& x) override {
    return (*l3)(F::gelu((*l2)(F::gelu((*l1)(x))), "tanh"));
  }
  std::shared_ptr<nn::Linear> l1, l2, l3;
};

}  // namespace encore::testing
