// A loss's gradient and the product reading it as one LossGradMatmul step on the cpu
// (schedule/loss_folds.cc; the scenarios: loss_fold_cases.h), at one and two threads; and where the
// head's linear must stay apart from it: a step between them that checks labels first (an
// accuracy before the loss), labels or the loss's incoming gradient written between them, a write
// to state outside the call between them. Each such step still replays eager's bits.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "tests/loss_fold_cases.h"

using namespace encore;
using namespace encore::testing;

namespace {

// Three Adam steps of the HeadNet (tanh) whose loss `loss_of(model, x, t)` computes, static
// against eager, bit for bit; the static function's schedule dump.
template <typename LossOf>
std::string head_steps(LossOf loss_of) {
  StaticEnabled on;
  auto make = [] { return std::make_shared<HeadNet>(24, 16, 10, true, DType::Float32); };
  auto eager_model = seeded(12, Device::cpu(), make), model = seeded(12, Device::cpu(), make);
  optim::Adam eager_opt(eager_model->parameters(), {.lr = 1e-2}),
      opt(model->parameters(), {.lr = 1e-2});
  auto train = [&](nn::Module& m, optim::Adam& o, const Tensor& x, const Tensor& t) {
    return adam_step(m, o, x, t, loss_of);
  };
  auto step =
      static_graph([&](const Tensor& x, const Tensor& t) { return train(*model, opt, x, t); },
                   {.name = "head_step", .modules = {model}});
  manual_seed(13);
  for (int b = 0; b < 3; ++b) {
    INFO("step " << b);
    const Tensor x = randn({12, 24});
    const Tensor t = fold_labels(12, 10, b, -1, DType::Int64, false, Device::cpu());
    CHECK(bit_diff(step(x, t), train(*eager_model, eager_opt, x, t)) == "");
    check_same_parameters(*eager_model, *model, cat("step ", b));
  }
  CHECK(step.stats().traces == 1);
  return step.schedule_text();
}

constexpr const char* kLossFold = "softmax_cross_entropy_grad and matmul_act_grad in one";
constexpr const char* kLogitsFold = "linear and softmax_cross_entropy_grad in one";

}  // namespace

TEST_CASE("a loss's gradient and the product reading it run as one step with eager's bits",
          "[static][fold]") {
  for (const int threads : {1, 2}) {
    INFO(threads << " threads");
    const ThreadCount t(threads);
    check_loss_grad_folds(Device::cpu());
  }
}

TEST_CASE("a bad label in a replayed loss gradient fold is the cpu's Error, and replays go on",
          "[static][fold]") {
  check_loss_grad_fold_bad_label(Device::cpu());
}

TEST_CASE(
    "the head's linear stays apart from its loss gradient where running it early would "
    "change what a step sees or raises",
    "[static][fold]") {
  const StaticFoldActivations fold(true);
  // Nothing between them: both folds.
  const std::string plain = head_steps([](nn::Module& m, const Tensor& x, const Tensor& t) {
    return F::softmax_cross_entropy(m.forward(x), t);
  });
  CHECK(count_of(plain, kLossFold) == 1);
  CHECK(count_of(plain, kLogitsFold) == 1);
  // An accuracy before the loss checks the labels first, eagerly: its Error, not the loss's.
  const std::string accuracy = head_steps([](nn::Module& m, const Tensor& x, const Tensor& t) {
    const Tensor logits = m.forward(x);
    const Tensor acc = F::accuracy(logits, t);
    return F::add(F::softmax_cross_entropy(logits, t), F::mul(acc, 0.0));
  });
  INFO(accuracy);
  CHECK(count_of(accuracy, kLossFold) == 1);
  CHECK(count_of(accuracy, kLogitsFold) == 0);
  // The labels the loss reads written after the linear.
  const std::string labels = head_steps([](nn::Module& m, const Tensor& x, const Tensor& t) {
    const Tensor logits = m.forward(x);
    return F::softmax_cross_entropy(logits, clone(t));
  });
  INFO(labels);
  CHECK(count_of(labels, kLossFold) == 1);
  CHECK(count_of(labels, kLogitsFold) == 0);
  // The loss's incoming gradient computed in the backward (a weight the call is handed).
  const Tensor weight = full({}, 0.5);
  const std::string scaled = head_steps([&](nn::Module& m, const Tensor& x, const Tensor& t) {
    return F::mul(F::softmax_cross_entropy(m.forward(x), t), weight);
  });
  INFO(scaled);
  CHECK(count_of(scaled, kLossFold) == 1);
  CHECK(count_of(scaled, kLogitsFold) == 0);
  // State outside the call written between them (a counter the call is handed).
  Tensor calls = zeros({});
  const std::string counted = head_steps([&](nn::Module& m, const Tensor& x, const Tensor& t) {
    const Tensor logits = m.forward(x);
    add_(calls, full({}, 1));
    return F::softmax_cross_entropy(logits, t);
  });
  INFO(counted);
  CHECK(count_of(counted, kLossFold) == 1);
  CHECK(count_of(counted, kLogitsFold) == 0);
}
