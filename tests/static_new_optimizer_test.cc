// An optimizer made after a static training step was traced: one holding parameters the traced
// step read but did not update (a parameter group added as a new optimizer, run by a loop over
// the optimizers) traces again, so that its step() joins the schedule; a copy of an optimizer the
// step ran, or one made after a forward-only function's trace, does not. Each beside an eager twin
// of the same program, bit for bit.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

using Optimizers = std::vector<std::unique_ptr<optim::Optimizer>>;

// A linear trunk and head; the first optimizer trains the trunk alone.
struct Twin {
  std::shared_ptr<nn::Sequential> model = seeded(3, Device::cpu(), [] {
    auto m = std::make_shared<nn::Sequential>();
    m->add(std::make_shared<nn::Linear>(5, 6));
    m->add(std::make_shared<nn::Tanh>());
    m->add(std::make_shared<nn::Linear>(6, 3));
    return m;
  });
  Optimizers opts;
  Twin() {
    opts.push_back(std::make_unique<optim::Adam>(params_of(0), optim::AdamOptions{.lr = 0.05}));
  }
  std::vector<Tensor> params_of(int layer) const {
    std::vector<Tensor> out;
    for (const auto& [name, p] : model->named_parameters())
      if (name.starts_with(std::to_string(layer) + ".")) out.push_back(p);
    return out;
  }
  Tensor step(const Tensor& x, const Tensor& t) {
    model->zero_grad();
    Tensor loss = F::softmax_cross_entropy(model->forward(x), t);
    loss.backward();
    for (const auto& o : opts) o->step();
    return loss;
  }
};

const Tensor kX = [] {
  manual_seed(5);
  return randn({4, 5});
}();
const Tensor kT = tensor({0, 1, 2, 1}, {4}, DType::Int32);

std::string last_reason(const StaticStats& s) {
  return s.traces_history.empty() ? std::string() : s.traces_history.back().reason;
}

}  // namespace

TEST_CASE("an optimizer added to a static step's loop after its trace is run by its replays",
          "[static][optim]") {
  StaticEnabled on;
  Twin eager, twin;
  auto step = static_graph([&](const Tensor& x, const Tensor& t) { return twin.step(x, t); },
                           {.name = "grouped", .modules = {twin.model}});
  for (int i = 0; i < 6; ++i) {
    INFO("step " << i);
    if (i == 3)  // the head's group, as PyTorch's add_param_group
      for (Twin* w : {&eager, &twin})
        w->opts.push_back(
            std::make_unique<optim::Adam>(w->params_of(2), optim::AdamOptions{.lr = 0.05}));
    CHECK(bit_diff(step(kX, kT), eager.step(kX, kT)) == "");
    check_same_parameters(*eager.model, *twin.model, cat("step ", i));
  }
  CHECK(twin.opts[1]->steps() == 3);
  const StaticStats s = step.stats();
  CHECK(s.traces == 2);
  CHECK_THAT(last_reason(s), Contains("Adam made after the trace holds parameter '2.weight'") &&
                                 Contains("read but did not update"));
}

TEST_CASE(
    "an optimizer made after a trace over what the step updates, or after a forward's, "
    "traces nothing",
    "[static][optim]") {
  StaticEnabled on;
  Twin twin;
  auto step = static_graph([&](const Tensor& x, const Tensor& t) { return twin.step(x, t); },
                           {.name = "backed_up", .modules = {twin.model}});
  step(kX, kT);
  // A copy of the step's optimizer (a backup), and another over the trunk it updates.
  const optim::Adam backup(static_cast<const optim::Adam&>(*twin.opts[0]));
  const optim::SGD trunk(twin.params_of(0));
  step(kX, kT);
  CHECK(step.stats().traces == 1);
  CHECK(backup.steps() == 1);
  // A forward runs no optimizer: one made after its trace, over the whole model, changes nothing.
  NoGradGuard no_grad;
  auto forward = static_graph([&](const Tensor& x) { return twin.model->forward(x); },
                              {.name = "forward", .modules = {twin.model}});
  forward(kX);
  const optim::SGD whole(twin.model->parameters());
  forward(kX);
  CHECK(forward.stats().traces == 1);
}
