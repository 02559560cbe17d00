// MlpSmall/eager, MlpLarge/eager: one eager Adam training step of the 784-h-h-10 perceptron
// per iteration (forward, softmax cross entropy, zero_grad, backward, update) on inputs fixed
// before the loop. MlpSmall/static, MlpLarge/static: the same step as one static function,
// replayed. Compare with GemmBound/* (gemm_bound_bench.cc), the time of the same step's sgemm
// calls alone.
#include <benchmark/benchmark.h>

#include <cstdint>

#include "bench/bench_util.h"
#include "bench/mlp_step.h"
#include "encore/encore.h"
#include "encore/static_graph.h"

namespace encore::bench {
namespace {

// Warm-up steps before the measurement: they create the gradients and Adam's state and fill
// the allocator's cache (static: the first traces, the others replay).
constexpr int kWarmupSteps = 3;

void BM_MlpEager(benchmark::State& state, int64_t hidden, int64_t batch) {
  MlpStep step(hidden, batch);
  for (int i = 0; i < kWarmupSteps; ++i) step.run();

  AllocatorProbe probe;
  for (auto _ : state) step.run();
  probe.report(state);
  set_blas_threads_counter(state);
}

void BM_MlpStatic(benchmark::State& state, int64_t hidden, int64_t batch) {
  MlpStep step(hidden, batch);
  auto static_step = step.make_static();
  for (int i = 0; i < kWarmupSteps; ++i) static_step(step.x(), step.labels());

  AllocatorProbe probe;
  for (auto _ : state) static_step(step.x(), step.labels());
  probe.report(state);
  set_blas_threads_counter(state);

  const StaticStats stats = static_step.stats();
  if (!check_replayed(state, stats, /*traces=*/1)) return;
  const EntryReport& entry = stats.cache.at(0);
  auto bytes = [](int64_t b) {
    return benchmark::Counter(static_cast<double>(b), benchmark::Counter::kDefaults,
                              benchmark::Counter::kIs1024);
  };
  state.counters["arena_bytes"] = bytes(entry.arena_bytes);
  state.counters["lower_bound_bytes"] = bytes(entry.lower_bound_bytes);
  state.counters["naive_bytes"] = bytes(entry.naive_bytes);
}

BENCHMARK_CAPTURE(BM_MlpEager, small, kMlpSmallHidden, kMlpSmallBatch)
    ->Name("MlpSmall/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStatic, small, kMlpSmallHidden, kMlpSmallBatch)
    ->Name("MlpSmall/static")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpEager, large, kMlpLargeHidden, kMlpLargeBatch)
    ->Name("MlpLarge/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStatic, large, kMlpLargeHidden, kMlpLargeBatch)
    ->Name("MlpLarge/static")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace encore::bench
