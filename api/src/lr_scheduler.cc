#include "encore/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <utility>

#include "runtime/dispatcher.h"
#include "runtime/error.h"

namespace encore::optim {

namespace {

double rate_of(const Optimizer& optimizer, const std::string& kind) {
  for (const auto& [name, value] : optimizer.hyper_parameters())
    if (name == "lr") return value;
  fail(kind, ": the optimizer",
       optimizer.kind().empty() ? std::string() : " (" + optimizer.kind() + ")",
       " has no hyper-parameter 'lr'");
}

void check_gamma(const char* kind, double gamma) {
  ENCORE_CHECK(std::isfinite(gamma) && gamma > 0, kind, ": gamma must be positive, got ", gamma);
}

}  // namespace

LRScheduler::LRScheduler(Optimizer& optimizer, Rule rule, std::string kind)
    : optimizer_(optimizer), rule_(std::move(rule)), kind_(std::move(kind)) {
  ENCORE_CHECK(rule_ != nullptr, kind_, ": the rule is empty");
  base_lr_ = rate_of(optimizer_, kind_);
  move_to(0);
}

void LRScheduler::step() {
  ENCORE_CHECK(epoch_ < std::numeric_limits<int64_t>::max(), kind_, "::step: the epoch is ", epoch_,
               ", the last there is");
  move_to(epoch_ + 1);
}

void LRScheduler::set_last_epoch(int64_t epoch) {
  ENCORE_CHECK(epoch >= 0, kind_, "::set_last_epoch: the epoch must be non-negative, got ", epoch);
  move_to(epoch);
}

double LRScheduler::lr_at(int64_t epoch) const {
  ENCORE_CHECK(epoch >= 0, kind_, "::lr_at: the epoch must be non-negative, got ", epoch);
  return rule_(epoch, base_lr_);
}

// Host code: inside a traced function it would run at the trace only, and every replay would keep
// that rate, so a trace refuses it. The optimizer checks the rate (and refuses it, changing
// nothing) before the epoch moves.
void LRScheduler::move_to(int64_t epoch) {
  if (Tracer* t = current_tracer())
    t->on_host_value(cat(kind_, "'s epoch (its step() sets the learning rate on the host)"));
  const double lr = lr_at(epoch);
  ENCORE_CHECK(std::isfinite(lr), kind_, ": the rate at epoch ", epoch, " is ", lr);
  try {
    optimizer_.set_hyper_parameters({{"lr", lr}});
  } catch (const Error& e) {
    fail(kind_, ": the optimizer refuses the rate at epoch ", epoch, ": ", e.what());
  }
  last_lr_ = lr;
  epoch_ = epoch;
}

// Each scheduler's rule checks its arguments before the base constructor sets a rate.
namespace {

LRScheduler::Rule step_rule(int64_t step_size, double gamma) {
  ENCORE_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  check_gamma("StepLR", gamma);
  return [step_size, gamma](int64_t epoch, double base) {
    return base * std::pow(gamma, static_cast<double>(epoch / step_size));
  };
}

LRScheduler::Rule multi_step_rule(std::vector<int64_t> milestones, double gamma) {
  for (size_t i = 1; i < milestones.size(); ++i)
    ENCORE_CHECK(milestones[i - 1] < milestones[i],
                 "MultiStepLR: the milestones must increase, got ", milestones[i - 1], " then ",
                 milestones[i]);
  check_gamma("MultiStepLR", gamma);
  return [m = std::move(milestones), gamma](int64_t epoch, double base) {
    const auto passed = std::upper_bound(m.begin(), m.end(), epoch) - m.begin();
    return base * std::pow(gamma, static_cast<double>(passed));
  };
}

LRScheduler::Rule exponential_rule(double gamma) {
  check_gamma("ExponentialLR", gamma);
  return [gamma](int64_t epoch, double base) {
    return base * std::pow(gamma, static_cast<double>(epoch));
  };
}

LRScheduler::Rule cosine_rule(int64_t t_max, double eta_min) {
  ENCORE_CHECK(t_max > 0, "CosineAnnealingLR: t_max must be positive, got ", t_max);
  ENCORE_CHECK(std::isfinite(eta_min) && eta_min >= 0,
               "CosineAnnealingLR: eta_min must be non-negative, got ", eta_min);
  return [t_max, eta_min](int64_t epoch, double base) {
    // At 0, 2 t_max, ... the base rate itself (eta_min + (base - eta_min) may round).
    if (epoch % t_max == 0 && epoch / t_max % 2 == 0) return base;
    const double phase = std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(t_max);
    return eta_min + (base - eta_min) * (1 + std::cos(phase)) / 2;
  };
}

LRScheduler::Rule linear_rule(double start_factor, double end_factor, int64_t total_iters) {
  ENCORE_CHECK(start_factor > 0 && start_factor <= 1,
               "LinearLR: start_factor must be in (0, 1], got ", start_factor);
  ENCORE_CHECK(end_factor >= 0 && end_factor <= 1, "LinearLR: end_factor must be in [0, 1], got ",
               end_factor);
  ENCORE_CHECK(total_iters > 0, "LinearLR: total_iters must be positive, got ", total_iters);
  return [start_factor, end_factor, total_iters](int64_t epoch, double base) {
    const double done =
        static_cast<double>(std::min(epoch, total_iters)) / static_cast<double>(total_iters);
    return base * (start_factor + (end_factor - start_factor) * done);
  };
}

LRScheduler::Rule lambda_rule(std::function<double(int64_t)> factor) {
  ENCORE_CHECK(factor != nullptr, "LambdaLR: the factor function is empty");
  return [f = std::move(factor)](int64_t epoch, double base) { return base * f(epoch); };
}

}  // namespace

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer, step_rule(step_size, gamma), "StepLR") {}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer, multi_step_rule(std::move(milestones), gamma), "MultiStepLR") {}

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma)
    : LRScheduler(optimizer, exponential_rule(gamma), "ExponentialLR") {}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer, cosine_rule(t_max, eta_min), "CosineAnnealingLR") {}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor,
                   int64_t total_iters)
    : LRScheduler(optimizer, linear_rule(start_factor, end_factor, total_iters), "LinearLR") {}

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> factor)
    : LRScheduler(optimizer, lambda_rule(std::move(factor)), "LambdaLR") {}

}  // namespace encore::optim
