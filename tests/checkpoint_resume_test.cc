// Resuming from a checkpoint is exact: N steps, save, load into a fresh model, optimizer and
// generator state, M more steps give the bits of N + M steps without a break, eagerly and with
// the training step as a static function.
#include <catch2/catch.hpp>
#include <functional>

#include "checkpoint_util.h"

using namespace encore;
using namespace encore::testing;

namespace {

using MakeModel = std::function<std::shared_ptr<nn::Module>()>;
using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(nn::Module&)>;

struct Batches {
  std::vector<Tensor> x, t;
};

Batches batches(int64_t n, int64_t batch, int64_t features) {
  const auto ds = data::synthetic_classification(n * batch, features, 10, /*seed=*/7);
  data::BatchIterator it(ds, batch, /*shuffle=*/true, /*seed=*/3);
  Batches b;
  Tensor x, t;
  while (it.next(x, t)) {
    b.x.push_back(x);
    b.t.push_back(t);
  }
  return b;
}

// Trains steps [from, to) of `data`, eagerly or with the step as one static function.
void train(nn::Module& model, optim::Optimizer& opt, const Batches& data, size_t from, size_t to,
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

void check_resume(const MakeModel& make_model, const MakeOptimizer& make_opt, int64_t features,
                  bool as_static) {
  StaticEnabled static_on;
  const size_t n = 4, m = 3;
  const Batches data = batches(n + m, 8, features);
  Generator& gen = default_generator(Device::cpu());

  manual_seed(11);
  auto straight = make_model();
  auto straight_opt = make_opt(*straight);
  train(*straight, *straight_opt, data, 0, n + m, as_static);
  const Snapshot expected(*straight, straight_opt.get(), &gen);

  TempPath dir("resume");
  const std::string path = dir.file("run.safetensors");
  {
    manual_seed(11);
    auto first = make_model();
    auto first_opt = make_opt(*first);
    train(*first, *first_opt, data, 0, n, as_static);
    save(path, *first, first_opt.get(), &gen);
  }
  manual_seed(12345);  // another initialisation and generator state, all overwritten by load
  auto resumed = make_model();
  auto resumed_opt = make_opt(*resumed);
  const LoadResult r = load(path, *resumed, resumed_opt.get(), &gen);
  CHECK(r.missing.empty());
  CHECK(r.unexpected.empty());
  train(*resumed, *resumed_opt, data, n, n + m, as_static);
  Snapshot got(*resumed, resumed_opt.get(), &gen);
  // Optimizer::steps() counts the step() calls that ran eagerly; a replay does not run it (the
  // per-parameter counters, such as Adam's t, are tensors and do advance).
  if (as_static) got.steps = expected.steps;
  CHECK(got.diff(expected) == "");
}

std::shared_ptr<nn::Module> mlp_with_dropout() {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(16, 12), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Dropout>(0.25), std::make_shared<nn::Linear>(12, 10)});
}

std::unique_ptr<optim::Optimizer> adam(nn::Module& m) {
  return std::make_unique<optim::Adam>(m.parameters(), optim::AdamOptions{.lr = 1e-2});
}

std::unique_ptr<optim::Optimizer> momentum(nn::Module& m) {
  return std::make_unique<optim::MomentumSGD>(m.parameters(),
                                              optim::MomentumSGDOptions{.lr = 0.05});
}

}  // namespace

TEST_CASE("checkpoint: an MLP with dropout and Adam resumes bit for bit", "[checkpoint]") {
  const bool as_static = GENERATE(false, true);
  INFO((as_static ? "static step" : "eager step"));
  check_resume(mlp_with_dropout, adam, 16, as_static);
}

TEST_CASE("checkpoint: nn::mlp with MomentumSGD resumes bit for bit", "[checkpoint]") {
  const bool as_static = GENERATE(false, true);
  INFO((as_static ? "static step" : "eager step"));
  check_resume([] { return nn::mlp(16, 12, 10); }, momentum, 16, as_static);
}

TEST_CASE("checkpoint: SeedCnn with Adam resumes bit for bit", "[checkpoint]") {
  const bool as_static = GENERATE(false, true);
  INFO((as_static ? "static step" : "eager step"));
  check_resume([] { return std::make_shared<models::SeedCnn>(2); }, adam, 784, as_static);
}

TEST_CASE("checkpoint: without the generator state, dropout draws other masks", "[checkpoint]") {
  // The control of the dropout test above: the generator's state is what makes it exact.
  const Batches data = batches(2, 8, 16);
  TempPath dir("nogen");
  const std::string path = dir.file("run.safetensors");
  manual_seed(11);
  auto a = mlp_with_dropout();
  auto a_opt = adam(*a);
  train(*a, *a_opt, data, 0, 1, false);
  save(path, *a, a_opt.get());
  train(*a, *a_opt, data, 1, 2, false);
  manual_seed(99);
  auto b = mlp_with_dropout();
  auto b_opt = adam(*b);
  load(path, *b, b_opt.get());
  train(*b, *b_opt, data, 1, 2, false);
  CHECK(Snapshot(*b, nullptr, nullptr).diff(Snapshot(*a, nullptr, nullptr)) != "");
}
