// Optimizer updates with foreach (one dispatched call per device and dtype) against one call per
// parameter, on any device (optim_foreach_test.cc on the cpu, cuda/cuda_optim_test.cc on cuda:0):
// the same bits in parameters and state, the calls the optimizer dispatched, and a whole training
// step whose static schedule holds one update step per dtype and replays eager's bits.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/dispatcher.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

namespace encore::testing {

// Counts the optimizer updates dispatched in its scope, and the parameters each updated.
class UpdateCounter : public Tracer {
 public:
  UpdateCounter() : scope_(this) {}
  void on_op(Op op, const AttrBlob&, std::span<const Tensor> inputs,
             std::span<const Tensor>) override {
    if (op_optimizer_update(op))
      parameters_per_call.push_back(static_cast<int>(inputs.size()) / op_input_group(op));
  }
  std::vector<int> parameters_per_call;

 private:
  TracerScope scope_;
};

// 150 parameters on `d`, float64 (every third: 50) and float32 (100), so that each dtype's call
// takes two CUDA launches of up to 48; of sizes from 1 to 70,000 elements (several blocks each),
// three with none: the first float32 one, a float64 one, and the last.
inline std::vector<Tensor> foreach_parameters(Device d) {
  manual_seed(5);
  std::vector<Tensor> ps;
  for (int i = 0; i < 150; ++i) {
    const int64_t n = i == 1 || i == 3 || i == 149 ? 0 : i == 7 ? 70000 : 1 + 13 * i;
    Tensor p = randn({n}, i % 3 == 0 ? DType::Float64 : DType::Float32).to(d);
    p.set_requires_grad();
    ps.push_back(p);
  }
  return ps;
}

// Copies of `ps` (same values, new storages) that require grad.
inline std::vector<Tensor> copies(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) {
    Tensor c = clone(p.detach());
    c.set_requires_grad();
    out.push_back(c);
  }
  return out;
}

// Gradients for step `step` (the same for both twins), none for parameter 11.
inline void set_foreach_grads(std::vector<Tensor>& ps, int step) {
  manual_seed(100 + static_cast<uint64_t>(step));
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i == 11) continue;
    ps[i].set_grad(randn(ps[i].shape(), ps[i].dtype()).to(ps[i].device()));
  }
}

// One kind of optimizer over `params`, foreach on or off.
using MakeOptimizer =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>, bool foreach)>;

inline std::vector<std::pair<std::string, MakeOptimizer>> foreach_optimizers() {
  return {
      {"SGD",
       [](std::vector<Tensor> p, bool f) {
         return std::make_unique<optim::SGD>(std::move(p),
                                             optim::SGDOptions{.lr = 0.05, .foreach = f});
       }},
      {"SGD with weight decay",
       [](std::vector<Tensor> p, bool f) {
         return std::make_unique<optim::SGD>(
             std::move(p), optim::SGDOptions{.lr = 0.05, .weight_decay = 1e-2, .foreach = f});
       }},
      {"MomentumSGD",
       [](std::vector<Tensor> p, bool f) {
         return std::make_unique<optim::MomentumSGD>(
             std::move(p),
             optim::MomentumSGDOptions{.lr = 0.05, .weight_decay = 1e-3, .foreach = f});
       }},
      {"Adam",
       [](std::vector<Tensor> p, bool f) {
         return std::make_unique<optim::Adam>(
             std::move(p), optim::AdamOptions{.lr = 1e-2, .weight_decay = 1e-2, .foreach = f});
       }},
      {"AdamW",
       [](std::vector<Tensor> p, bool f) {
         return std::make_unique<optim::AdamW>(std::move(p),
                                               optim::AdamWOptions{.lr = 1e-2, .foreach = f});
       }},
  };
}

// Every optimizer, foreach against one call per parameter: three steps give the same bits in
// every parameter and state tensor. With foreach the optimizer dispatches one call per dtype for
// the 149 parameters with a gradient (float64 first: parameter 0 is float64), else 149 calls.
inline void check_foreach_equals_loop(Device d) {
  const std::vector<Tensor> start = foreach_parameters(d);
  for (const auto& [name, make] : foreach_optimizers()) {
    INFO(name << " on " << cat(d));
    std::vector<Tensor> a = copies(start), b = copies(start);
    const std::unique_ptr<optim::Optimizer> grouped = make(a, true), looped = make(b, false);
    for (int step = 0; step < 3; ++step) {
      set_foreach_grads(a, step);
      set_foreach_grads(b, step);
      {
        UpdateCounter counter;
        grouped->step();
        CHECK(counter.parameters_per_call == std::vector<int>{50, 99});
      }
      {
        UpdateCounter counter;
        looped->step();
        CHECK(counter.parameters_per_call == std::vector<int>(149, 1));
      }
      for (size_t i = 0; i < a.size(); ++i) {
        INFO("step " << step << ", parameter " << i);
        CHECK(bit_diff(a[i], b[i]) == "");
      }
      const std::vector<optim::StateSlot> sa = grouped->state_slots(), sb = looped->state_slots();
      REQUIRE(sa.size() == sb.size());
      for (size_t i = 0; i < sa.size(); ++i) {
        INFO("step " << step << ", state " << sa[i].name);
        CHECK(bit_diff(*sa[i].tensor, *sb[i].tensor) == "");
      }
    }
    // The updates did something: the parameters moved.
    CHECK(bit_diff(a[0], start[0]) != "");
    // Adam's step counts: 3 for every parameter with a gradient, one without elements too; 0 for
    // parameter 11, which has none.
    for (const optim::StateSlot& s : grouped->state_slots()) {
      if (!s.name.ends_with(".t")) continue;
      INFO(s.name);
      CHECK(s.tensor->to(Device::cpu()).data<int64_t>()[0] == (s.name == "11.t" ? 0 : 3));
    }
  }
}

// 30 linear layers of 8 (tanh between them), made from `seed` on `d`: 60 parameters, so a foreach
// Adam call takes 300 inputs and CUDA runs it in two launches (48 parameters each at most).
inline std::shared_ptr<nn::Sequential> deep_mlp(uint64_t seed, Device d) {
  return seeded(seed, d, [] {
    auto m = std::make_shared<nn::Sequential>();
    for (int i = 0; i < 29; ++i) {
      m->add(std::make_shared<nn::Linear>(8, 8));
      m->add(std::make_shared<nn::Tanh>());
    }
    m->add(std::make_shared<nn::Linear>(8, 10));
    return m;
  });
}

// A whole training step of deep_mlp, static, with Adam (foreach on), its replays (verified against
// eager on every `verify_every`-th call) equal to an eager twin's with one call per parameter bit
// for bit. With `fold` off, the schedule holds one adam_update step for the 60 parameters; with it
// on, each linear's weight and bias updates join its gradients' step (30 weight_grad_adam steps,
// schedule/update_folds.cc) and nothing of the update is left. Returns the static function's
// stats.
inline StaticStats check_foreach_whole_step(Device d, int verify_every, bool fold) {
  StaticEnabled on;
  const StaticFoldActivations folds(fold);
  const StaticFoldCpuUpdates cpu_folds(fold);
  const int steps = 6;
  const std::vector<Batch> batches = mlp_batches(steps, 8, 8, /*seed=*/9, d);
  REQUIRE(static_cast<int>(batches.size()) == steps);
  const auto eager = deep_mlp(4, d), model = deep_mlp(4, d);
  auto eager_opt = optim::Adam(eager->parameters(), {.lr = 1e-2, .foreach = false});
  auto model_opt = optim::Adam(model->parameters(), {.lr = 1e-2, .foreach = true});
  auto step = static_graph(
      [&](const Tensor& x, const Tensor& t) { return train_step(*model, model_opt, x, t); },
      {.name = "foreach_step", .verify_every = verify_every, .modules = {model}});
  for (int i = 0; i < steps; ++i) {
    INFO("step " << i);
    const Batch& b = batches[i];
    CHECK(bit_diff(train_step(*eager, eager_opt, b.x, b.t), step(b.x, b.t)) == "");
    check_same_parameters(*eager, *model, cat("step ", i));
  }
  const std::string text = step.schedule_text();
  INFO(text);
  CHECK(count_of(text, R"(\d+  adam_update\s+\[)") == (fold ? 0 : 1));
  CHECK(count_of(text, R"(\d+  weight_grad_adam\s+\[)") == (fold ? 30 : 0));
  // 60 parameters' groups of five inputs, and no more.
  CHECK((text.find("in  299  ") != std::string::npos) == !fold);
  CHECK(text.find("in  300  ") == std::string::npos);
  const StaticStats s = step.stats();
  check_one_trace_then_replays(s, steps);
  return s;
}

}  // namespace encore::testing
