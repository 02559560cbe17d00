// The static_graph scenarios of gradient clipping and learning-rate schedulers, run on the cpu
// (clip_grad_test.cc, lr_scheduler_test.cc) and on cuda:0 (cuda/cuda_static_test.cc): a whole
// training step static, its replays equal to eager's steps bit for bit, with one trace.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "encore/encore.h"
#include "tests/static_scenarios.h"

namespace encore::testing {

// Adam with a cosine schedule over 8 epochs stepped before every call after the first (the
// scheduler made at the first): one trace, every step eager's at the same rate.
inline StaticRun check_cosine_schedule_steps(Device d) {
  // Destroyed after the optimizers they refer to (a scheduler's destructor does not touch it).
  std::map<const optim::Optimizer*, std::unique_ptr<optim::LRScheduler>> schedulers;
  return check_scheduled_options(d, MakeAdam{}, [&](optim::Adam& o, size_t call) {
    std::unique_ptr<optim::LRScheduler>& s = schedulers[&o];
    if (s == nullptr)
      s = std::make_unique<optim::CosineAnnealingLR>(o, /*t_max=*/8, /*eta_min=*/1e-4);
    else
      s->step();
    CHECK(s->last_epoch() == static_cast<int64_t>(call));
    CHECK(o.options.lr == s->last_lr());
  });
}

// A training step that clips its gradients between backward() and step(): by their norm (2 or
// INFINITY) or by value. Returns the loss and the total norm (the clip value for by-value).
class ClipStep {
 public:
  ClipStep(std::shared_ptr<nn::Module> model, double norm_type, bool by_value, double limit)
      : model_(std::move(model)),
        opt_(model_->parameters(), {.lr = 0.01}),
        norm_type_(norm_type),
        by_value_(by_value),
        limit_(limit) {}
  std::pair<Tensor, Tensor> operator()(const Tensor& x, const Tensor& t) {
    opt_.zero_grad();
    Tensor loss = F::softmax_cross_entropy((*model_)(x), t);
    loss.backward();
    Tensor norm;
    if (by_value_) {
      nn::clip_grad_value_(model_->parameters(), limit_);
      norm = full({}, limit_, loss.dtype(), loss.device());
    } else {
      norm = nn::clip_grad_norm_(model_->parameters(), limit_, norm_type_);
    }
    opt_.step();
    return {loss, norm};
  }
  auto make_static() {
    return static_graph([this](const Tensor& x, const Tensor& t) { return (*this)(x, t); },
                        {.name = "clipped_step", .arg_names = {"x", "t"}, .modules = {model_}});
  }

 private:
  std::shared_ptr<nn::Module> model_;
  optim::Adam opt_;
  double norm_type_;
  bool by_value_;
  double limit_;
};

// 12 steps of an MLP with clipped gradients, eager and static side by side: the losses, norms,
// parameters and gradients equal bit for bit after every step, one trace, and the clip engaged
// at some replayed step (a total above `limit`, or a gradient element at the limit).
inline StaticRun check_clipped_steps(Device d, double norm_type, bool by_value, double limit) {
  StaticEnabled on;
  const auto mlps = twin_mlps<MlpNet>(d, /*seed=*/5, 20, 16, 12, 8, /*data_seed=*/15);
  ClipStep eager(mlps.eager, norm_type, by_value, limit);
  ClipStep twin(mlps.model, norm_type, by_value, limit);
  auto step = twin.make_static();
  bool clipped = false;
  for (size_t i = 0; i < mlps.batches.size(); ++i) {
    INFO("step " << i);
    const Batch& b = mlps.batches[i];
    const auto [eager_loss, eager_norm] = eager(b.x, b.t);
    const auto [loss, norm] = step(b.x, b.t);
    CHECK(bit_diff(eager_loss, loss) == "");
    CHECK(bit_diff(eager_norm, norm) == "");
    check_same_parameters(*mlps.eager, *mlps.model, cat("step ", i));
    if (by_value) {
      // Every gradient element within the limit (as the gradients' dtype holds it), some at it.
      const double bound = eager_norm.item<double>();
      for (const Tensor& p : mlps.eager->parameters())
        for (const double g : p.grad().to_vector<double>()) {
          CHECK(std::abs(g) <= bound);
          clipped = clipped || (i > 0 && std::abs(g) == bound);
        }
    } else {
      clipped = clipped || (i > 0 && eager_norm.item<double>() > limit);
    }
  }
  CHECK(clipped);
  const StaticStats s = step.stats();
  check_one_trace_then_replays(s, static_cast<int64_t>(mlps.batches.size()));
  return {s, step.schedule_text()};
}

}  // namespace encore::testing
