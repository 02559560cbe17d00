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
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

// The scenarios shared with the CUDA tests are in static_scenarios.h.

TEST_CASE("seed CNN with a static forward trains bit for bit like eager", "[static_conv]") {
  check_seed_cnn_training(Device::cpu());
}

TEST_CASE("batch norm statistics and dropout masks under a static training step equal eager",
          "[static_conv]") {
  check_batch_norm_and_dropout_step(Device::cpu());
}

TEST_CASE("a replayed dropout draws a fresh mask on every call", "[static_conv]") {
  check_fresh_dropout_masks(Device::cpu());
}

TEST_CASE("train and eval are separate cache entries of a static forward", "[static_conv]") {
  StaticEnabled on;
  manual_seed(7);
  auto eager = std::make_shared<BnNet>();
  manual_seed(7);
  auto stat = std::make_shared<StaticBnNet>();
  const Tensor x = randn({4, 2, 5, 5});

  NoGradGuard no_grad;
  const GeneratorState g0 = GeneratorState::now(Device::cpu());
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
  const GeneratorState g1 = GeneratorState::now(Device::cpu());
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
