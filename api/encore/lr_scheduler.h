// Learning-rate schedules, as torch.optim.lr_scheduler: a scheduler sets its optimizer's "lr"
// hyper-parameter from the rate the optimizer had when the scheduler was made (the base rate) and
// the count of its step() calls (the epoch, 0 at construction).
//
//   optim::Adam opt(model->parameters(), {.lr = 1e-3});
//   optim::CosineAnnealingLR sched(opt, /*t_max=*/100);
//   for (int epoch = 0; epoch < 100; ++epoch) {
//     for (const Batch& b : loader) step(b.x, b.t);  // a static step: no trace per rate
//     sched.step();
//   }
//
// Each rate is the closed form of the epoch (PyTorch's schedulers compute most of theirs from the
// previous rate, so theirs can differ from these in the last bits). Made, stepped or moved to an
// epoch, a scheduler writes the rate through the optimizer's set_hyper_parameters: a rate the
// optimizer refuses (a negative one from a LambdaLR) is an Error naming the scheduler and the
// epoch, and leaves the rate and the scheduler's epoch as they were.
//
// - Static steps: encore's optimizers have a static training step read their rate at every call,
//   so a schedule stepped between calls costs no trace (on CUDA, the graphs read it from device
//   memory; encore/static_graph.h). An optimizer defined outside encore traces again at each
//   change unless it says its replays read its hyper-parameters. A scheduler is host code: step
//   it outside the static function (inside, a trace refuses it, as any host value: the replays
//   would keep the trace's rate).
// - One scheduler per optimizer: each sets the rate from its own rule and the base rate, so a
//   second one on the same optimizer overrides the first (PyTorch chains them). Compose
//   schedules in one LambdaLR (a warm-up, then a decay).
// - A scheduler refers to its optimizer, which must outlive it. To resume from a checkpoint
//   (which restores the optimizer's rate), make the optimizer and the scheduler as at the start,
//   load, and move the scheduler to the epoch the run had reached (set_last_epoch).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "encore/optim.h"

namespace encore::optim {

class LRScheduler {
 public:
  // The rate at an epoch, from the base rate.
  using Rule = std::function<double(int64_t epoch, double base_lr)>;

  // Sets the optimizer's rate to rule(0, base rate). `kind` names the scheduler in errors. An
  // optimizer without an "lr" hyper-parameter is an Error.
  LRScheduler(Optimizer& optimizer, Rule rule, std::string kind);
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // The next epoch: sets the optimizer's rate to the rule's at last_epoch() + 1.
  void step();
  // Moves to `epoch` (>= 0) and sets the rate of that epoch.
  void set_last_epoch(int64_t epoch);
  int64_t last_epoch() const { return epoch_; }
  // The rate this scheduler last set (PyTorch's get_last_lr()).
  double last_lr() const { return last_lr_; }
  double base_lr() const { return base_lr_; }
  // The rate at `epoch` (>= 0), without setting it.
  double lr_at(int64_t epoch) const;
  const std::string& kind() const { return kind_; }

 private:
  void move_to(int64_t epoch);

  Optimizer& optimizer_;
  Rule rule_;
  std::string kind_;
  double base_lr_ = 0;
  double last_lr_ = 0;
  int64_t epoch_ = 0;
};

// base * gamma^(epoch / step_size), the division rounding down (gamma > 0 here and below).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
};

// base * gamma^(how many milestones are <= epoch); the milestones increase strictly.
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
};

// base * gamma^epoch.
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);
};

// eta_min + (base - eta_min) * (1 + cos(pi * epoch / t_max)) / 2: from the base rate at epoch 0
// down to eta_min at t_max (and up again after, as PyTorch's).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0);
};

// base * (start_factor + (end_factor - start_factor) * min(epoch, total_iters) / total_iters): a
// linear warm-up (or decay) over total_iters epochs, then end_factor * base.
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
           int64_t total_iters = 5);
};

// base * factor(epoch): any schedule, e.g. a warm-up then a cosine decay.
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t epoch)> factor);
};

}  // namespace encore::optim
