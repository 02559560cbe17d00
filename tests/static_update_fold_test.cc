// A linear's weight and bias gradients and their Adam updates as one WeightGradAdam step on the
// cpu where set_static_fold_cpu_updates_enabled asks for it (schedule/update_folds.cc; the
// scenarios: update_fold_cases.h), at one and two threads, and not by default; and
// where an update must stay apart from its gradient's step: the parameter read between them, the
// gradient written between them, a step between them that checks labels the call computed. Each
// such step still replays eager's bits.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "tests/update_fold_cases.h"

using namespace encore;
using namespace encore::testing;

namespace {

// Three Adam steps of the NormNet, static against eager bit for bit, with `after(model, logits,
// labels)` run between the backward and the optimizer's step (its result returned beside the
// loss), the cpu's update folds on or off; the static function's schedule dump.
template <typename After>
std::string steps_with(After after, bool cpu_updates = true) {
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  const StaticFoldCpuUpdates cpu(cpu_updates);
  auto make = [] { return std::make_shared<NormNet>(24, DType::Float32, Device::cpu()); };
  auto eager_model = seeded(12, Device::cpu(), make), model = seeded(12, Device::cpu(), make);
  optim::Adam eager_opt(eager_model->parameters(), {.lr = 1e-2}),
      opt(model->parameters(), {.lr = 1e-2});
  auto train = [&](NormNet& m, optim::Adam& o, const Tensor& x, const Tensor& t) {
    o.zero_grad();
    const Tensor logits = m.forward(x);
    Tensor loss = F::softmax_cross_entropy(logits, t);
    loss.backward();
    const Tensor seen = after(m, logits, t);
    o.step();
    return std::vector<Tensor>{loss, seen};
  };
  auto step =
      static_graph([&](const Tensor& x,
                       const Tensor& t) { return train(static_cast<NormNet&>(*model), opt, x, t); },
                   {.name = "apart_step", .modules = {model}});
  const std::vector<Batch> batches = feature_batches(3, 12, 24, DType::Float32, 5);
  for (size_t b = 0; b < batches.size(); ++b) {
    INFO("step " << b);
    const std::vector<Tensor> got = step(batches[b].x, batches[b].t);
    const std::vector<Tensor> want =
        train(static_cast<NormNet&>(*eager_model), eager_opt, batches[b].x, batches[b].t);
    for (size_t i = 0; i < want.size(); ++i) CHECK(bit_diff(got[i], want[i]) == "");
    check_same_parameters(*eager_model, *model, cat("step ", b));
  }
  CHECK(step.stats().traces == 1);
  return step.schedule_text();
}

constexpr const char* kFold = R"(weight_grad_adam\s+\[[^\]]*weight_bias_grad and adam_update in)";

}  // namespace

TEST_CASE("a linear's gradients and their Adam updates run as one step with eager's bits",
          "[static][fold]") {
  for (const int threads : {1, 2}) {
    INFO(threads << " threads");
    const ThreadCount t(threads);
    check_update_folds(Device::cpu());
  }
}

TEST_CASE("a cpu plan keeps its updates apart by default", "[static][fold]") {
  const std::string text =
      steps_with([](NormNet&, const Tensor& logits, const Tensor&) { return logits; }, false);
  INFO(text);
  CHECK(count_of(text, kFold) == 0);
  CHECK(count_of(text, R"(\d+  adam_update\b)") == 6);
}

TEST_CASE(
    "an update stays apart from its gradient's step where running it early would change what "
    "a step sees or raises",
    "[static][fold]") {
  // Nothing between them: both linears fold.
  const std::string plain =
      steps_with([](NormNet&, const Tensor& logits, const Tensor&) { return logits; });
  INFO(plain);
  CHECK(count_of(plain, kFold) == 2);
  // The first linear's weight read after the backward: its update stays after that read (the
  // second linear's folds).
  const std::string read = steps_with(
      [](NormNet& m, const Tensor&, const Tensor&) { return F::sum(m.l1->weight.detach()); });
  INFO(read);
  CHECK(count_of(read, kFold) == 1);
  // The second linear's bias gradient scaled in place: its update reads the new values, so
  // neither of that linear's updates moves (the first linear's folds).
  const std::string scaled = steps_with([](NormNet& m, const Tensor& logits, const Tensor&) {
    const Tensor g = m.l2->bias.grad();
    add_(g, g);
    return logits;
  });
  INFO(scaled);
  CHECK(count_of(scaled, kFold) == 1);
  // An accuracy over labels the call computed (a copy): it may fail, with every parameter as it
  // was, so no update may run before it.
  const std::string checked = steps_with([](NormNet&, const Tensor& logits, const Tensor& t) {
    return F::accuracy(logits.detach(), clone(t));
  });
  INFO(checked);
  CHECK(count_of(checked, kFold) == 0);
}
