// The training step timed by MlpSmall/*, MlpLarge/* and Retrace/*: the 784-h-h-10
// perceptron, Adam with its defaults, a rand input and int32 labels fixed at construction. On a
// CUDA device (the /cuda cases) the model and data are made on the host as for the CPU, then
// moved, so both devices train the same weights on the same data.
#pragma once

#include <cstdint>
#include <memory>

#include "bench/bench_util.h"
#include "encore/encore.h"
#include "encore/static_graph.h"

namespace encore::bench {

inline constexpr int64_t kMlpSmallHidden = 100, kMlpSmallBatch = 32;
inline constexpr int64_t kMlpLargeHidden = 1000, kMlpLargeBatch = 100;

// Holds the model and optimizer (neither copyable nor movable: the step and any static
// function over it refer to them).
class MlpStep {
 public:
  // clip_norm > 0: each step clips the gradients' 2-norm to it before the update.
  MlpStep(int64_t hidden, int64_t batch, Device device = Device::cpu(), double clip_norm = 0)
      : model_(seeded_mlp(hidden, device)),
        step_{model_, optim::Adam(model_->parameters()), clip_norm},
        x_(rand({batch, 784}).to(device)),
        labels_(cyclic_labels(batch, device)) {}
  MlpStep(const MlpStep&) = delete;
  MlpStep& operator=(const MlpStep&) = delete;

  // One eager step: forward, softmax cross entropy, zero_grad, backward, Adam update.
  Tensor operator()(const Tensor& x, const Tensor& labels) { return step_(x, labels); }
  // The same step on the fixed input and labels.
  Tensor run() { return (*this)(x_, labels_); }

  // The whole step as a static function of (x, labels); each call of make_static() starts
  // with an empty cache, so its first call traces.
  auto make_static() {
    return static_graph(
        [this](const Tensor& x, const Tensor& labels) { return (*this)(x, labels); },
        {.name = "mlp_step", .arg_names = {"x", "labels"}, .modules = {model_}});
  }
  optim::Adam& optimizer() { return step_.opt; }
  const Tensor& x() const { return x_; }
  const Tensor& labels() const { return labels_; }

 private:
  // Made on the host, then moved (before the optimizer takes the parameters).
  static std::shared_ptr<nn::Sequential> seeded_mlp(int64_t hidden, Device device) {
    manual_seed(0);
    auto model = nn::mlp(784, hidden, 10);
    if (device != Device::cpu()) model->to(device);
    return model;
  }

  std::shared_ptr<nn::Sequential> model_;
  TrainStep<nn::Sequential, optim::Adam> step_;
  Tensor x_, labels_;
};

}  // namespace encore::bench
