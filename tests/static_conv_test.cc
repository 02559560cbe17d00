// static_graph over convolutional models: the seed CNN trains bit for bit like eager, batch-norm
// running statistics update on every replay exactly as eagerly, dropout draws fresh masks on
// every replay (equal to eager from the same generator state), and train/eval are separate cache
// entries.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/static_models.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

// The CPU generator's position, saved before one run and restored before the other.
struct GeneratorState {
  Generator::Stream s;
  static GeneratorState now() { return {default_generator(Device::cpu()).state()}; }
  void restore() const { default_generator(Device::cpu()).set_state(s); }
  bool operator==(const GeneratorState&) const = default;
};

Tensor labels_of(int64_t n) {
  Tensor t = Tensor::empty({n}, DType::Int32);
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(i % 3);
  return t;
}

void check_same_running_stats(const BnNet& a, const BnNet& b, const std::string& when) {
  INFO(when);
  CHECK(bit_diff(a.bn->running_mean, b.bn->running_mean) == "");
  CHECK(bit_diff(a.bn->running_var, b.bn->running_var) == "");
}

}  // namespace

TEST_CASE("seed CNN with a static forward trains bit for bit like eager", "[static_conv]") {
  StaticEnabled on;
  manual_seed(3);
  auto eager = std::make_shared<models::SeedCnn>();
  manual_seed(3);
  auto stat = std::make_shared<StaticSeedCnn>();
  optim::SGD opt_e(eager->parameters()), opt_s(stat->parameters());
  const Tensor labels = Tensor::empty({4}, DType::Int32);
  for (int i = 0; i < 4; ++i) labels.data<int32_t>()[i] = (i * 3) % 10;
  for (int step = 0; step < 5; ++step) {
    const Tensor x = rand({4, 784});
    Tensor le = F::softmax_cross_entropy((*eager)(x), labels);
    eager->zero_grad();
    le.backward();
    opt_e.step();
    Tensor ls = F::softmax_cross_entropy((*stat)(x), labels);
    stat->zero_grad();
    ls.backward();
    opt_s.step();
    const std::string when = cat("step ", step);
    INFO(when);
    CHECK(bit_diff(le, ls) == "");
    check_same_parameters(*eager, *stat, when);
  }
  const StaticStats st = static_stats(*stat);
  CHECK(st.traces == 1);
  CHECK(st.hits == 4);
}

TEST_CASE("batch norm statistics and dropout masks under a static training step equal eager",
          "[static_conv]") {
  StaticEnabled on;
  manual_seed(5);
  auto eager = std::make_shared<BnNet>();
  manual_seed(5);
  auto stat = std::make_shared<BnNet>();
  optim::Adam opt_e(eager->parameters()), opt_s(stat->parameters());
  auto make_step = [](BnNet& m, optim::Adam& opt) {
    return [&m, &opt](const Tensor& x, const Tensor& t) {
      Tensor loss = F::softmax_cross_entropy(m(x), t);
      m.zero_grad();
      loss.backward();
      opt.step();
      return loss;
    };
  };
  auto eager_step = make_step(*eager, opt_e);
  auto static_step = static_graph(make_step(*stat, opt_s), {.name = "bn_step", .modules = {stat}});
  const Tensor labels = labels_of(6);
  Tensor x;
  for (int step = 0; step < 6; ++step) {
    // Steps 4 and 5 reuse the input of step 3: only fresh dropout masks (and the updated
    // parameters) make their losses differ.
    if (step <= 3) x = randn({6, 2, 5, 5});
    const GeneratorState before = GeneratorState::now();
    Tensor le = eager_step(x, labels);
    const GeneratorState after_eager = GeneratorState::now();
    before.restore();
    Tensor ls = static_step(x, labels);
    const std::string when = cat("step ", step);
    INFO(when);
    CHECK(GeneratorState::now() == after_eager);  // the replay drew exactly as many numbers
    CHECK(bit_diff(le, ls) == "");
    check_same_parameters(*eager, *stat, when);
    check_same_running_stats(*eager, *stat, when);
  }
  const StaticStats st = static_step.stats();
  CHECK(st.traces == 1);
  CHECK(st.hits == 5);
  // The running statistics moved away from their initial zeros and ones.
  CHECK(bit_diff(stat->bn->running_mean, zeros({4})) != "");
  CHECK(bit_diff(stat->bn->running_var, ones({4})) != "");
}

TEST_CASE("a replayed dropout draws a fresh mask on every call", "[static_conv]") {
  StaticEnabled on;
  auto drop = std::make_shared<nn::Dropout>(0.5);
  auto f = static_graph([&](const Tensor& x) { return (*drop)(x); },
                        {.name = "drop", .modules = {drop}});
  const Tensor x = ones({256});
  manual_seed(11);
  const Tensor a = f(x);  // trace
  const Tensor b = f(x);  // replay
  const Tensor c = f(x);  // replay
  CHECK(f.stats().hits == 2);
  CHECK(bit_diff(a, b) != "");
  CHECK(bit_diff(b, c) != "");
  // From the same generator state, eager draws the same masks.
  manual_seed(11);
  const Tensor ea = (*drop)(x);
  const Tensor eb = (*drop)(x);
  const Tensor ec = (*drop)(x);
  CHECK(bit_diff(a, ea) == "");
  CHECK(bit_diff(b, eb) == "");
  CHECK(bit_diff(c, ec) == "");
}

TEST_CASE("train and eval are separate cache entries of a static forward", "[static_conv]") {
  StaticEnabled on;
  manual_seed(7);
  auto eager = std::make_shared<BnNet>();
  manual_seed(7);
  auto stat = std::make_shared<StaticBnNet>();
  const Tensor x = randn({4, 2, 5, 5});

  NoGradGuard no_grad;
  const GeneratorState g0 = GeneratorState::now();
  const Tensor train_e = (*eager)(x);
  g0.restore();
  const Tensor train_s = (*stat)(x);  // trace 1: train
  CHECK(bit_diff(train_e, train_s) == "");
  check_same_running_stats(*eager, *stat, "after the train call");

  eager->eval();
  stat->eval();
  const Tensor mean_before = clone(stat->bn->running_mean);
  const Tensor eval_e = (*eager)(x);
  const Tensor eval_s1 = (*stat)(x);  // trace 2: eval
  const Tensor eval_s2 = (*stat)(x);  // replay
  CHECK(bit_diff(eval_e, eval_s1) == "");
  CHECK(bit_diff(eval_s1, eval_s2) == "");  // no dropout, fixed statistics
  CHECK(bit_diff(stat->bn->running_mean, mean_before) == "");

  stat->train();
  eager->train();
  const GeneratorState g1 = GeneratorState::now();
  const Tensor train_e2 = (*eager)(x);
  g1.restore();
  const Tensor train_s2 = (*stat)(x);  // replay of the train entry
  CHECK(bit_diff(train_e2, train_s2) == "");
  check_same_running_stats(*eager, *stat, "after the second train call");
  CHECK(bit_diff(stat->bn->running_mean, mean_before) != "");

  const StaticStats st = static_stats(*stat);
  CHECK(st.traces == 2);
  CHECK(st.hits == 2);
  CHECK(st.entries == 2);
  REQUIRE(st.traces_history.size() == 2);
  CHECK_THAT(st.traces_history[1].reason, Contains("eval"));
}
