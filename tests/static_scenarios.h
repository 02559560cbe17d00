// The static_graph scenarios that run on the cpu (static_graph_test.cc, static_conv_test.cc) and
// on cuda:0 (cuda/cuda_static_test.cc, with CUDA graphs on and off). Each takes the device, makes
// its models and inputs there and checks that static replay equals eager bit for bit on that
// device (bit_diff and check_same_parameters compare tensors on a device through host copies).
// The MLP scenarios return their static function's final stats for the device-specific checks
// of the caller (how the replays used CUDA graphs).
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/static_models.h"
#include "tests/test_util.h"

namespace encore::testing {

// ---- Helpers -------------------------------------------------------------------------------

// make() right after manual_seed(seed), moved to `device`: two models made from one seed start
// equal.
template <typename Make>
auto seeded(uint64_t seed, Device device, Make make) {
  manual_seed(seed);
  auto m = make();
  m->to(device);
  return m;
}

// The position of a device's default generator, saved before one run and restored before the
// other.
struct GeneratorState {
  Device device;
  Generator::Stream s;
  static GeneratorState now(Device d) { return {d, default_generator(d).state()}; }
  void restore() const { default_generator(device).set_state(s); }
  bool operator==(const GeneratorState&) const = default;
};

// Int32 labels i * step % classes for i < n, on `device`.
inline Tensor cyclic_labels(int64_t n, int64_t step, int64_t classes, Device device) {
  Tensor t = Tensor::empty({n}, DType::Int32);
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(i * step % classes);
  return t.to(device);
}

// One training step of a classifier: forward, softmax cross-entropy, zero_grad, backward, update.
template <typename Optimizer>
Tensor train_step(nn::Module& m, Optimizer& opt, const Tensor& x, const Tensor& t) {
  Tensor loss = F::softmax_cross_entropy(m(x), t);
  m.zero_grad();
  loss.backward();
  opt.step();
  return loss;
}

inline void check_same_running_stats(const BnNet& a, const BnNet& b, const std::string& when) {
  INFO(when);
  CHECK(bit_diff(a.bn->running_mean, b.bn->running_mean) == "");
  CHECK(bit_diff(a.bn->running_var, b.bn->running_var) == "");
}

// An eager MLP (nn::mlp) and a `Model` of the same sizes made from the same seed, both on `d`,
// and `count` batches of `batch` rows (synthetic data from `data_seed`) to train them on.
template <typename Model>
struct TwinMlps {
  std::vector<Batch> batches;
  std::shared_ptr<nn::Sequential> eager;
  std::shared_ptr<Model> model;
};
template <typename Model>
TwinMlps<Model> twin_mlps(Device d, uint64_t seed, int64_t in, int64_t hidden, int64_t count,
                          int64_t batch, uint64_t data_seed) {
  std::vector<Batch> batches = mlp_batches(count, batch, in, data_seed, d);
  REQUIRE(static_cast<int64_t>(batches.size()) == count);
  auto eager = seeded(seed, d, [&] { return nn::mlp(in, hidden, 10); });
  auto model = seeded(seed, d, [&] { return std::make_shared<Model>(in, hidden, 10); });
  return {std::move(batches), std::move(eager), std::move(model)};
}

// Trains two models side by side on `batches`: eager_step(b) against static_step(b). Every loss
// (on `device`) and every parameter and gradient of `model` equal `eager`'s bit for bit.
template <typename StaticStep>
void check_adam_steps(const std::vector<Batch>& batches, Device device, AdamStep& eager_step,
                      StaticStep&& static_step, const nn::Module& eager, const nn::Module& model) {
  for (size_t i = 0; i < batches.size(); ++i) {
    Tensor eager_loss = eager_step(batches[i]);
    Tensor static_loss = static_step(batches[i]);
    INFO("step " << i);
    CHECK(static_loss.device() == device);
    CHECK(bit_diff(eager_loss, static_loss) == "");
    check_same_parameters(eager, model, cat("step ", i));
  }
}

// `calls` calls of a static function: one trace, then replays only, in one cache entry.
inline void check_one_trace_then_replays(const StaticStats& s, int64_t calls) {
  CHECK(s.calls == calls);
  CHECK(s.traces == 1);
  CHECK(s.hits == calls - 1);
  CHECK(s.eager_calls == 0);
  REQUIRE(s.cache.size() == 1);
}

// The stats of a static function and its schedule dump.
struct StaticRun {
  StaticStats stats;
  std::string schedule;
};

// `count` batches of `batch` rows of `features` normal values (from `seed`) and labels
// (i * (1 + batch index)) % 10, on `device`.
inline std::vector<Batch> feature_batches(int count, int64_t batch, int64_t features, DType dtype,
                                          uint64_t seed, Device device = Device::cpu()) {
  manual_seed(seed);
  std::vector<Batch> out;
  for (int i = 0; i < count; ++i)
    out.push_back(
        {randn({batch, features}, dtype).to(device), cyclic_labels(batch, 1 + i, 10, device)});
  return out;
}

// Trains `eager_model` eagerly and `model` with its whole step static on `batches`, the
// optimizer from `make_opt`: losses, parameters and gradients equal bit for bit after every step,
// one trace, and with verify mode, every replay (or some) verified. Returns the static function's
// stats and schedule dump.
template <typename MakeOpt>
StaticRun check_whole_steps(std::shared_ptr<nn::Module> eager_model,
                            std::shared_ptr<nn::Module> model, const std::vector<Batch>& batches,
                            MakeOpt make_opt, StaticOptions options = {.name = "whole_step"}) {
  TrainStep eager(eager_model, make_opt);
  TrainStep twin(model, make_opt);
  const int verify_every = options.verify_every;
  auto step = twin.make_static(std::move(options));
  for (size_t i = 0; i < batches.size(); ++i) {
    INFO("step " << i);
    CHECK(bit_diff(eager(batches[i]), step(batches[i].x, batches[i].t)) == "");
    check_same_parameters(*eager_model, *model, cat("step ", i));
  }
  const StaticStats s = step.stats();
  check_one_trace_then_replays(s, static_cast<int64_t>(batches.size()));
  if (verify_every == 1) CHECK(s.verifications == static_cast<int64_t>(batches.size()) - 1);
  if (verify_every > 1) CHECK(s.verifications > 0);
  return {s, step.schedule_text()};
}

// ---- Replay equals eager -------------------------------------------------------------------

// MLP training with Adam, the model's forward static (the module form): 20 steps.
inline StaticStats check_mlp_module_form(Device d) {
  StaticEnabled on;
  const auto mlps = twin_mlps<StaticMlp>(d, /*seed=*/0, 784, 100, 20, 32, /*data_seed=*/11);
  check_same_parameters(*mlps.eager, *mlps.model, "after construction");
  AdamStep eager_step(mlps.eager), static_step(mlps.model);  // the latter's forward is static
  check_adam_steps(mlps.batches, d, eager_step, static_step, *mlps.eager, *mlps.model);
  const StaticStats s = static_stats(*mlps.model);
  check_one_trace_then_replays(s, 20);
  CHECK(s.entries == 1);
  CHECK(s.cache[0].complete);
  CHECK(s.cache[0].forward_steps > 0);
  CHECK(s.cache[0].backward_steps > 0);
  return s;
}

// MLP training with Adam, the whole step static (the function form): 20 steps.
inline StaticRun check_mlp_function_form(Device d) {
  StaticEnabled on;
  const auto mlps = twin_mlps<MlpNet>(d, /*seed=*/0, 784, 100, 20, 32, /*data_seed=*/12);
  AdamStep eager_step(mlps.eager), model_step(mlps.model);
  auto step = model_step.make_static({.name = "mlp_step", .arg_names = {"x", "t"}});
  const auto static_step = [&](const Batch& b) { return step(b.x, b.t); };
  check_adam_steps(mlps.batches, d, eager_step, static_step, *mlps.eager, *mlps.model);
  const StaticStats s = step.stats();
  CHECK(s.name == "mlp_step");
  check_one_trace_then_replays(s, 20);
  return {s, step.schedule_text()};
}

// MLP training, the whole step static, on 12 batches, the optimizer's options set before each
// call by schedule(optimizer, call): one trace, and every step equals eager's with the same values.
template <typename MakeOpt, typename Schedule>
StaticRun check_scheduled_options(Device d, MakeOpt make_opt, Schedule schedule) {
  StaticEnabled on;
  const auto mlps = twin_mlps<MlpNet>(d, /*seed=*/4, 20, 16, 12, 8, /*data_seed=*/14);
  TrainStep<MakeOpt> eager_step(mlps.eager, make_opt), model_step(mlps.model, make_opt);
  auto step = model_step.make_static({.name = "scheduled_step", .arg_names = {"x", "t"}});
  for (size_t i = 0; i < mlps.batches.size(); ++i) {
    const Batch& b = mlps.batches[i];
    schedule(eager_step.optimizer(), i);
    schedule(model_step.optimizer(), i);
    Tensor eager_loss = eager_step(b);
    Tensor static_loss = step(b.x, b.t);
    INFO("step " << i);
    CHECK(bit_diff(eager_loss, static_loss) == "");
    check_same_parameters(*mlps.eager, *mlps.model, cat("step ", i));
  }
  const StaticStats s = step.stats();
  check_one_trace_then_replays(s, static_cast<int64_t>(mlps.batches.size()));
  return {s, step.schedule_text()};
}

// Every option of Adam's update on a schedule: three sets of values in turn, each for two calls,
// twice round.
inline StaticRun check_scheduled_hyper_parameters(Device d) {
  return check_scheduled_options(d, MakeAdam{}, [](optim::Adam& o, size_t call) {
    const size_t set = call / 2 % 3;
    const double k = static_cast<double>(set);
    o.options.lr = 1e-3 * (1 + k);
    o.options.beta1 = 0.9 - 0.05 * k;
    o.options.beta2 = 0.999 - 0.01 * k;
    o.options.eps = 1e-8 * (1 + k);
    o.options.weight_decay = 0.01 * k;
    o.options.decoupled = set == 1;
  });
}

// SGD, or momentum SGD, with a rate decayed at every call, and weight decay (and momentum) that
// change every third call.
inline StaticRun check_scheduled_sgd(Device d, bool momentum) {
  const auto rates = [](auto& o, size_t call) {
    o.options.lr = 0.05 / (1 + 0.1 * static_cast<double>(call));
    o.options.weight_decay = call / 3 % 2 == 0 ? 0.0 : 1e-3;
  };
  if (momentum) {
    const auto make = [](nn::Module& m) { return optim::MomentumSGD(m.parameters()); };
    return check_scheduled_options(d, make, [&](optim::MomentumSGD& o, size_t call) {
      rates(o, call);
      o.options.momentum = call / 3 % 2 == 0 ? 0.9 : 0.8;
    });
  }
  const auto make = [](nn::Module& m) { return optim::SGD(m.parameters()); };
  return check_scheduled_options(d, make, rates);
}

// Two replayed forwards of a static MLP before one backward through both, then a third whose
// backward accumulates into the existing gradients: all as eager.
inline void check_two_forwards_one_backward(Device d) {
  StaticEnabled on;
  const auto mlps = twin_mlps<StaticMlp>(d, /*seed=*/1, 20, 32, 4, 16, /*data_seed=*/13);
  const auto loss = [&mlps](nn::Module& m, int i) {
    return F::softmax_cross_entropy(m(mlps.batches[i].x), mlps.batches[i].t);
  };
  nn::Module& eager = *mlps.eager;
  nn::Module& model = *mlps.model;

  // Complete the entry: one traced call and its backward.
  loss(eager, 0).backward();
  loss(model, 0).backward();
  check_same_parameters(eager, model, "after the traced call");
  eager.zero_grad();
  model.zero_grad();

  // Two replayed calls, one backward through both.
  Tensor e1 = loss(eager, 1);
  Tensor e2 = loss(eager, 2);
  Tensor s1 = loss(model, 1);
  Tensor s2 = loss(model, 2);
  CHECK(bit_diff(e1, s1) == "");
  CHECK(bit_diff(e2, s2) == "");
  (e1 + e2).backward();
  (s1 + s2).backward();
  check_same_parameters(eager, model, "after two forwards and one backward");

  // A third replayed call whose backward accumulates into the existing .grad.
  loss(eager, 3).backward();
  loss(model, 3).backward();
  check_same_parameters(eager, model, "after accumulating into existing gradients");

  const StaticStats s = static_stats(model);
  CHECK(s.traces == 1);
  CHECK(s.hits == 3);
  REQUIRE(s.cache.size() == 1);
  CHECK(s.cache[0].arenas >= 2);  // the second call could not reuse the first one's arena
}

// The seed CNN with its forward static trains with SGD for 8 steps as eager does.
inline void check_seed_cnn_training(Device d) {
  StaticEnabled on;
  auto eager = seeded(3, d, [] { return std::make_shared<models::SeedCnn>(); });
  auto stat = seeded(3, d, [] { return std::make_shared<StaticSeedCnn>(); });
  optim::SGD opt_e(eager->parameters()), opt_s(stat->parameters());
  const Tensor labels = cyclic_labels(4, 3, 10, d);
  for (int step = 0; step < 8; ++step) {
    const Tensor x = rand({4, 784}).to(d);
    Tensor le = train_step(*eager, opt_e, x, labels);
    Tensor ls = train_step(*stat, opt_s, x, labels);
    const std::string when = cat("step ", step);
    INFO(when);
    CHECK(bit_diff(le, ls) == "");
    check_same_parameters(*eager, *stat, when);
  }
  const StaticStats st = static_stats(*stat);
  CHECK(st.traces == 1);
  CHECK(st.hits == 7);
}

// A whole Adam step of a model with batch norm and dropout made static: 8 steps, each drawing
// from the device's generator exactly as eager does from the same state, with eager's losses,
// parameters and running statistics.
inline void check_batch_norm_and_dropout_step(Device d) {
  StaticEnabled on;
  auto eager = seeded(5, d, [] { return std::make_shared<BnNet>(); });
  auto stat = seeded(5, d, [] { return std::make_shared<BnNet>(); });
  optim::Adam opt_e(eager->parameters()), opt_s(stat->parameters());
  auto static_step =
      static_graph([&](const Tensor& x, const Tensor& t) { return train_step(*stat, opt_s, x, t); },
                   {.name = "bn_step", .modules = {stat}});
  const Tensor labels = cyclic_labels(6, 1, 3, d);
  Tensor x;
  std::vector<Tensor> losses;
  for (int step = 0; step < 8; ++step) {
    // Steps 4 to 7 reuse the input of step 3: only fresh dropout masks (and the updated
    // parameters) make their losses differ.
    if (step <= 3) x = randn({6, 2, 5, 5}).to(d);
    const GeneratorState before = GeneratorState::now(d);
    Tensor le = train_step(*eager, opt_e, x, labels);
    const GeneratorState after_eager = GeneratorState::now(d);
    before.restore();
    Tensor ls = static_step(x, labels);
    const std::string when = cat("step ", step);
    INFO(when);
    CHECK(GeneratorState::now(d) == after_eager);  // the replay drew exactly as many numbers
    CHECK_FALSE(after_eager == before);            // and the dropout drew some
    CHECK(bit_diff(le, ls) == "");
    check_same_parameters(*eager, *stat, when);
    check_same_running_stats(*eager, *stat, when);
    losses.push_back(on_host(ls));
  }
  const StaticStats st = static_step.stats();
  CHECK(st.traces == 1);
  CHECK(st.hits == 7);
  CHECK(bit_diff(losses[5], losses[6]) != "");  // fresh masks (and new parameters)
  // The running statistics moved away from their initial zeros and ones.
  CHECK(bit_diff(stat->bn->running_mean, zeros({4}, DType::Float32, d)) != "");
  CHECK(bit_diff(stat->bn->running_var, ones({4}, DType::Float32, d)) != "");
}

// A static dropout draws a fresh mask on every call (a trace, then replays), the masks eager
// draws from the same generator state.
inline void check_fresh_dropout_masks(Device d) {
  StaticEnabled on;
  auto drop = std::make_shared<nn::Dropout>(0.5);
  auto f = static_graph([&](const Tensor& x) { return (*drop)(x); },
                        {.name = "drop", .modules = {drop}});
  const Tensor x = ones({4096}, DType::Float32, d);
  manual_seed(11);
  std::vector<Tensor> replayed;
  for (int i = 0; i < 5; ++i) replayed.push_back(f(x));
  CHECK(f.stats().hits == 4);
  manual_seed(11);
  for (int i = 0; i < 5; ++i) {
    INFO("call " << i);
    CHECK(bit_diff(replayed[i], (*drop)(x)) == "");
    if (i > 0) CHECK(bit_diff(replayed[i], replayed[i - 1]) != "");
  }
}

// ---- Bindings, in-place updates and outputs ------------------------------------------------

// A parameter replaced by one of the same shape is rebound (the replay reads and writes the new
// tensor); one of another shape retraces, saying why.
inline void check_replaced_parameter(Device d) {
  StaticEnabled on;
  manual_seed(2);
  auto lin = std::make_shared<nn::Linear>(4, 3, nn::LinearOptions{.bias = false, .device = d});
  auto f = static_graph([&](const Tensor& x) { return (*lin)(x); },
                        {.name = "replaced", .modules = {lin}});
  const Tensor x = rand({2, 4}, DType::Float32, d, -1, 1);

  F::sum(f(x)).backward();  // trace, completed by its backward
  F::sum(f(x)).backward();  // replay
  REQUIRE(f.stats().hits == 1);
  const Tensor old_w = lin->weight;
  const Tensor old_grad = on_host(old_w.grad());

  Tensor new_w = rand({3, 4}, DType::Float32, d, -1, 1);
  new_w.set_requires_grad();
  lin->weight = new_w;
  Tensor out = f(x);
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().hits == 2);
  CHECK(bit_diff(out, (*lin)(x)) == "");
  F::sum(out).backward();
  REQUIRE(new_w.grad().defined());
  const Tensor static_grad = on_host(new_w.grad());
  CHECK(bit_diff(on_host(old_w.grad()), old_grad) == "");  // the old weight is no longer written
  new_w.set_grad(Tensor());
  F::sum((*lin)(x)).backward();
  CHECK(bit_diff(static_grad, on_host(new_w.grad())) == "");

  Tensor wide = rand({5, 4}, DType::Float32, d, -1, 1);
  wide.set_requires_grad();
  lin->weight = wide;
  Tensor out5 = f(x);
  const StaticStats s = f.stats();
  CHECK(s.traces == 2);
  REQUIRE(s.traces_history.size() == 2);
  using Catch::Matchers::Contains;
  CHECK_THAT(s.traces_history[1].reason,
             Contains("parameter '") && Contains("weight") && Contains("shape changed"));
  CHECK(out5.shape() == Shape{2, 5});
  CHECK(bit_diff(out5, (*lin)(x)) == "");
}

// A static function that updates its argument in place: the replay's output, the update of the
// caller's tensor and the gradient are eager's.
inline void check_in_place_argument_update(Device d) {
  StaticEnabled on;
  Tensor w = rand({3, 2}).to(d).set_requires_grad();
  auto body = [&](const Tensor& x) {
    add_(x, full_like(x, 1.0));
    return F::sum(F::matmul(x, w));
  };
  auto f = static_graph(body, {.name = "in_place_arg"});
  for (int i = 0; i < 4; ++i) {
    INFO("call " << i);
    Tensor xs = rand({4, 3}).to(d);
    Tensor xe = clone(xs);
    w.set_grad(Tensor());
    const Tensor ys = f(xs);
    ys.backward();
    const Tensor static_grad = on_host(w.grad());
    w.set_grad(Tensor());
    const Tensor ye = body(xe);
    ye.backward();
    CHECK(bit_diff(ys, ye) == "");
    CHECK(bit_diff(static_grad, on_host(w.grad())) == "");
    CHECK(bit_diff(xs, xe) == "");  // the caller's tensor holds the update
  }
  CHECK(f.stats().hits == 3);
}

// The output of a static model forward, and the activations its backward needs, outlive four
// later calls: unchanged, with eager's value and gradients.
inline void check_kept_output_and_activations(Device d) {
  StaticEnabled on;
  auto model = seeded(4, d, [] { return nn::mlp(6, 8, 3); });
  auto f = static_graph([&](const Tensor& x) { return (*model)(x); },
                        {.name = "kept_forward", .modules = {model}});
  F::sum(f(rand({4, 6}).to(d))).backward();  // trace and complete
  model->zero_grad();
  const Tensor x1 = rand({4, 6}, DType::Float32, Device::cpu(), -1, 1).to(d);
  const Tensor kept = f(x1);
  const Tensor kept_then = on_host(kept);
  for (int i = 2; i <= 5; ++i) f(rand({4, 6}, DType::Float32, Device::cpu(), -1, 1).to(d));
  CHECK(f.stats().hits == 5);
  CHECK(bit_diff(on_host(kept), kept_then) == "");
  F::sum(kept).backward();  // the saved activations of call 1 are intact
  std::vector<Tensor> static_grads;
  for (const Tensor& p : model->parameters()) static_grads.push_back(on_host(p.grad()));
  model->zero_grad();
  const Tensor expected = (*model)(x1);
  CHECK(bit_diff(kept, expected) == "");
  F::sum(expected).backward();
  const auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(bit_diff(static_grads[i], on_host(params[i].grad())) == "");
  }
}

}  // namespace encore::testing
