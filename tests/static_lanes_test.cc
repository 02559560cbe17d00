// Two-lane replay: at two threads a cpu schedule runs independent steps side by side and large
// steps on both threads, and still gives eager's bits at two threads: whole training steps
// (Adam on an MLP whose products are split, SGD on the seed CNN), a forward with batch norm and
// dropout (random steps keep their order), random programs; a kernel that throws on either lane
// reaches the caller and the next call replays; the switch off and one thread replay in order.
// Built into the ThreadSanitizer binary too (scripts/test.sh).
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "random_program_check.h"
#include "tests/static_models.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

using StaticLanes = SwitchScope<set_static_lanes_enabled>;

// For a test's scope: static graphs on, lanes on or off, red zones off, `threads` threads.
struct LaneSettings {
  LaneSettings(bool lanes_on, int threads) : lanes(lanes_on), threads_scope(threads) {}
  StaticEnabled on;
  StaticLanes lanes;
  StaticRedzones no_redzones{false};
  ThreadCount threads_scope;
};

auto adam = [](nn::Module& m) { return optim::Adam(m.parameters(), {.lr = 1e-3}); };
auto sgd = [](nn::Module& m) { return optim::SGD(m.parameters(), {.lr = 0.05}); };

// An MLP big enough that its first product is split across both lanes.
StaticRun check_mlp_adam(int steps) {
  const auto mlps = twin_mlps<MlpNet>(Device::cpu(), /*seed=*/5, 784, 128, steps, 64,
                                      /*data_seed=*/2);
  return check_whole_steps(mlps.eager, mlps.model, mlps.batches, adam, {.name = "lanes_step"});
}

std::vector<Batch> image_batches(int count, int64_t batch, uint64_t seed) {
  manual_seed(seed);
  std::vector<Batch> out;
  for (int i = 0; i < count; ++i)
    out.push_back({rand({batch, 1, 28, 28}), cyclic_labels(batch, 3 + i, 10, Device::cpu())});
  return out;
}

}  // namespace

TEST_CASE("two lanes replay a whole Adam step of an MLP with eager's bits at two threads",
          "[static][lanes]") {
  const LaneSettings lanes(true, 2);
  const auto [stats, text] = check_mlp_adam(6);
  INFO(text);
  CHECK_THAT(text, Contains("two lanes (replayed so at two threads)"));
  CHECK_THAT(text, Contains("[lane 1]"));
  CHECK_THAT(text, Contains("both lanes"));    // the first product
  CHECK(stats.cache.at(0).lane_replays == 5);  // every replay (one phase: the whole step)
}

TEST_CASE("two lanes replay a whole SGD step of the seed CNN with eager's bits",
          "[static][lanes]") {
  const LaneSettings lanes(true, 2);
  auto eager = seeded(3, Device::cpu(), [] { return std::make_shared<models::SeedCnn>(); });
  auto model = seeded(3, Device::cpu(), [] { return std::make_shared<models::SeedCnn>(); });
  const auto [stats, text] =
      check_whole_steps(eager, model, image_batches(4, 16, 8), sgd, {.name = "lanes_step"});
  INFO(text);
  CHECK_THAT(text, Contains("both lanes"));  // the convolutions
  CHECK(stats.cache.at(0).lane_replays == 3);
}

TEST_CASE("two lanes keep batch norm statistics and dropout masks as eager", "[static][lanes]") {
  const LaneSettings lanes(true, 2);
  auto eager = seeded(4, Device::cpu(), [] { return std::make_shared<BnNet>(); });
  auto model = seeded(4, Device::cpu(), [] { return std::make_shared<BnNet>(); });
  std::vector<Batch> batches;
  manual_seed(12);
  for (int i = 0; i < 4; ++i)
    batches.push_back({randn({6, 2, 5, 5}), cyclic_labels(6, 1 + i, 3, Device::cpu())});
  // Both sides draw their dropout masks from the default generator: each step starts from the
  // same state on both.
  TrainStep eager_step(eager, adam);
  TrainStep twin(model, adam);
  auto step = twin.make_static({.name = "bn_lanes"});
  for (size_t i = 0; i < batches.size(); ++i) {
    INFO("step " << i);
    const GeneratorState g = GeneratorState::now(Device::cpu());
    const Tensor expected = eager_step(batches[i]);
    const GeneratorState after_eager = GeneratorState::now(Device::cpu());
    g.restore();
    CHECK(bit_diff(expected, step(batches[i].x, batches[i].t)) == "");
    CHECK(GeneratorState::now(Device::cpu()) == after_eager);
    check_same_parameters(*eager, *model, cat("step ", i));
    check_same_running_stats(*eager, *model, cat("step ", i));
  }
  CHECK(step.stats().cache.at(0).lane_replays == 3);
}

TEST_CASE("two lanes replay random programs bit for bit as eager runs them at two threads",
          "[static][random][lanes]") {
  const LaneSettings lanes(true, 2);
  random_program::run_random_programs(Device::cpu(), /*default_programs=*/600);
}

TEST_CASE("a bad label fails a two-lane replay before it starts, and the next call replays",
          "[static][lanes]") {
  const LaneSettings lanes(true, 2);
  const auto mlps = twin_mlps<MlpNet>(Device::cpu(), /*seed=*/5, 784, 128, 3, 64, /*data_seed=*/2);
  TrainStep twin(mlps.model, adam);
  auto step = twin.make_static({.name = "throwing_step"});
  step(mlps.batches[0].x, mlps.batches[0].t);
  // Labels out of range: the labels the call is handed are checked before the replay starts,
  // with the forward loss's error (eager's). (Labels the call computes are checked by the loss
  // kernels on the lanes: static_failed_call_test.cc.)
  Tensor bad = clone(mlps.batches[1].t);
  bad.data<int32_t>()[3] = 10;
  for (int i = 0; i < 5; ++i)
    CHECK_THROWS_WITH(step(mlps.batches[1].x, bad),
                      StartsWith("softmax_cross_entropy: label 10 of sample 3 is out of range"));
  // The next call replays on both lanes as usual.
  CHECK(std::isfinite(step(mlps.batches[2].x, mlps.batches[2].t).item<float>()));
  const StaticStats s = step.stats();
  CHECK(s.traces == 1);
  CHECK(s.cache.at(0).lane_replays == 1);
}

TEST_CASE("with the switch off, or at one thread, a replay runs its steps in order",
          "[static][lanes]") {
  {
    const LaneSettings off(false, 2);
    const auto [stats, text] = check_mlp_adam(3);
    CHECK(stats.cache.at(0).lane_replays == 0);
    CHECK(text.find("two lanes") == std::string::npos);
  }
  {
    const LaneSettings one_thread(true, 1);
    const auto [stats, text] = check_mlp_adam(3);
    CHECK(stats.cache.at(0).lane_replays == 0);
    CHECK_THAT(text, Contains("two lanes"));  // planned, replayed so only at two threads
  }
}
