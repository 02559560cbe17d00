// The resume check shared by the cpu and cuda checkpoint tests: N steps, save, load into a
// fresh process's objects, M more steps equal N + M steps without a break, bit for bit.
#pragma once

#include <functional>
#include <memory>

#include "checkpoint_util.h"

namespace encore::testing {

using MakeModel = std::function<std::shared_ptr<nn::Module>()>;
using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(nn::Module&)>;

struct Batches {
  std::vector<Tensor> x, t;
};

// n batches of `batch` samples with `features` features and 10 classes, on `device`.
inline Batches batches(int64_t n, int64_t batch, int64_t features,
                       Device device = Device::cpu()) {
  const auto ds = data::synthetic_classification(n * batch, features, 10, /*seed=*/7);
  data::BatchIterator it(ds, batch, /*shuffle=*/true, /*seed=*/3);
  it.set_device(device);
  Batches b;
  Tensor x, t;
  while (it.next(x, t)) {
    b.x.push_back(x);
    b.t.push_back(t);
  }
  return b;
}

// Trains steps [from, to) of `data`, eagerly or with the step as one static function.
inline void train(nn::Module& model, optim::Optimizer& opt, const Batches& data, size_t from, size_t to,
           bool as_static) {
  auto body = [&](const Tensor& x, const Tensor& t) {
    Tensor loss = F::softmax_cross_entropy(model(x), t);
    opt.zero_grad();
    loss.backward();
    opt.step();
    return loss;
  };
  if (!as_static) {
    for (size_t i = from; i < to; ++i) body(data.x[i], data.t[i]);
    return;
  }
  // The module is watched but not owned by the options; a no-op deleter borrows it.
  std::shared_ptr<nn::Module> watched(&model, [](nn::Module*) {});
  auto step =
      static_graph(body, {.name = "ckpt_step", .arg_names = {"x", "t"}, .modules = {watched}});
  for (size_t i = from; i < to; ++i) step(data.x[i], data.t[i]);
}

// N steps, save, load into a fresh model (made by make_model, moved to `device`) and optimizer,
// M more steps: the model, the optimizer and the device's generator equal N + M steps straight.
inline void check_resume(const MakeModel& make_model, const MakeOptimizer& make_opt,
                         int64_t features, bool as_static, Device device = Device::cpu()) {
  StaticEnabled static_on;
  const size_t n = 4, m = 3;
  const Batches data = batches(n + m, 8, features, device);
  Generator& gen = default_generator(device);
  auto on_device = [&] {
    std::shared_ptr<nn::Module> model = make_model();
    model->to(device);  // before the optimizer takes the parameters
    return model;
  };

  manual_seed(11);
  auto straight = on_device();
  auto straight_opt = make_opt(*straight);
  train(*straight, *straight_opt, data, 0, n + m, as_static);
  const Snapshot expected(*straight, straight_opt.get(), &gen);

  TempPath dir("resume");
  const std::string path = dir.file("run.safetensors");
  {
    manual_seed(11);
    auto first = on_device();
    auto first_opt = make_opt(*first);
    train(*first, *first_opt, data, 0, n, as_static);
    save(path, *first, first_opt.get(), &gen);
  }
  manual_seed(12345);  // another initialisation and generator state, all overwritten by load
  auto resumed = on_device();
  auto resumed_opt = make_opt(*resumed);
  const LoadResult r = load(path, *resumed, resumed_opt.get(), &gen);
  CHECK(r.missing.empty());
  CHECK(r.unexpected.empty());
  train(*resumed, *resumed_opt, data, n, n + m, as_static);
  const Snapshot got(*resumed, resumed_opt.get(), &gen);
  CHECK(got.steps == static_cast<int64_t>(n + m));
  CHECK(got.diff(expected) == "");
}


inline std::shared_ptr<nn::Module> mlp_with_dropout() {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(16, 12), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Dropout>(0.25), std::make_shared<nn::Linear>(12, 10)});
}

inline std::unique_ptr<optim::Optimizer> adam(nn::Module& m) {
  return std::make_unique<optim::Adam>(m.parameters(), optim::AdamOptions{.lr = 1e-2});
}

}  // namespace encore::testing
