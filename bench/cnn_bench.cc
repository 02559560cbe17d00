// SeedCnn/eager, SeedCnn/static: one SGD training step (forward, softmax cross entropy,
// zero_grad, backward, update) of Chainer's seed CNN (models::SeedCnn) at batch 32 on a rand
// input fixed before the loop; static: the whole step as one static function, replayed.
//
// VarSize/eager, VarSize/static: training steps of the variable_size sample (models::VggSmall,
// Adam, batch 8) on images whose height and width follow a fixed sequence of 16 sizes drawn
// from [32, 96]; one iteration is one step, cycling through the sequence. The static step has
// the default cache of 8 entries, so the 16 sizes keep evicting each other: the `traces` counter
// (traces per step) shows how often it retraces.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "encore/encore.h"
#include "encore/static_graph.h"

namespace encore::bench {
namespace {

constexpr int kWarmupSteps = 3;

void BM_SeedCnn(benchmark::State& state, bool static_on) {
  manual_seed(0);
  auto model = std::make_shared<models::SeedCnn>();
  TrainStep<models::SeedCnn, optim::SGD> step{model, optim::SGD(model->parameters())};
  const Tensor x = rand({32, 1, 28, 28}), labels = cyclic_labels(32);
  auto static_step = static_graph([&](const Tensor& a, const Tensor& b) { return step(a, b); },
                                  {.name = "seed_cnn_step", .modules = {model}});
  auto run = [&] { return static_on ? static_step(x, labels) : step(x, labels); };
  for (int i = 0; i < kWarmupSteps; ++i) run();

  AllocatorProbe probe;
  for (auto _ : state) run();
  probe.report(state);
  set_blas_threads_counter(state);
  if (static_on) {
    const StaticStats stats = static_step.stats();
    if (!check_replayed(state, stats, /*traces=*/1)) return;
    state.counters["arena_bytes"] =
        benchmark::Counter(static_cast<double>(stats.cache.at(0).arena_bytes),
                           benchmark::Counter::kDefaults, benchmark::Counter::kIs1024);
  }
}

void BM_VarSize(benchmark::State& state, bool static_on) {
  constexpr int64_t kBatch = 8, kSizes = 16;
  std::mt19937_64 rng(0);
  std::uniform_int_distribution<int64_t> d(32, 96);
  std::vector<Tensor> xs;
  manual_seed(0);
  for (int64_t i = 0; i < kSizes; ++i) {
    const int64_t h = d(rng);
    xs.push_back(randn({kBatch, 3, h, d(rng)}));
  }
  auto model = std::make_shared<models::VggSmall>();
  TrainStep<models::VggSmall, optim::Adam> step{model, optim::Adam(model->parameters())};
  const Tensor labels = cyclic_labels(kBatch);
  auto static_step = static_graph([&](const Tensor& a, const Tensor& b) { return step(a, b); },
                                  {.name = "vgg_step", .modules = {model}});
  set_log_sink([](const std::string&) {});  // the storm warnings are the point, not news
  size_t i = 0;
  auto run = [&] {
    const Tensor& x = xs[i++ % xs.size()];
    return static_on ? static_step(x, labels) : step(x, labels);
  };
  for (int k = 0; k < kWarmupSteps; ++k) run();

  const StaticStats before = static_step.stats();
  for (auto _ : state) run();
  set_log_sink(nullptr);
  if (static_on) {
    const StaticStats after = static_step.stats();
    state.counters["traces"] = benchmark::Counter(static_cast<double>(after.traces - before.traces),
                                                  benchmark::Counter::kAvgIterations);
    state.counters["evictions"] = static_cast<double>(after.evictions);
  }
}

BENCHMARK_CAPTURE(BM_SeedCnn, eager, false)
    ->Name("SeedCnn/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SeedCnn, static, true)
    ->Name("SeedCnn/static")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_VarSize, eager, false)
    ->Name("VarSize/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_VarSize, static, true)
    ->Name("VarSize/static")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace encore::bench
