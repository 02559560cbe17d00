// VarBatch/eager, VarBatch/static: the MlpSmall training step (bench/mlp_step.h: 784-100-100-10,
// Adam) with the batch cycling through 1, 7, 16, 32, 33, 64, 100, 128; one iteration is one
// step. The static step's batch becomes dynamic at its second size; the other sizes are planned
// from the trace (`planned_total`) and replayed after: `traces` counts traces per measured step,
// `traces_total` every trace of the run (warm-up included). The static case also times an eager
// step after each of its own (`ratio_to_eager`, see cycle_sizes in bench_util.h).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "bench/bench_util.h"
#include "bench/mlp_step.h"
#include "encore/encore.h"
#include "encore/static_graph.h"

namespace encore::bench {
namespace {

constexpr int64_t kBatches[] = {1, 7, 16, 32, 33, 64, 100, 128};

void BM_VarBatch(benchmark::State& state, bool static_on) {
  MlpStep step(kMlpSmallHidden, kMlpSmallBatch);
  std::vector<Tensor> xs, labels;
  manual_seed(1);
  for (const int64_t b : kBatches) {
    xs.push_back(rand({b, 784}));
    labels.push_back(cyclic_labels(b));
  }
  auto static_step = step.make_static();
  cycle_sizes(state, static_step, static_on, xs.size(), [&](size_t k, bool use_static) {
    return use_static ? static_step(xs[k], labels[k]) : step(xs[k], labels[k]);
  });
  set_threads_counters(state);
}

BENCHMARK_CAPTURE(BM_VarBatch, eager, false)
    ->Name("VarBatch/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_VarBatch, static, true)
    ->Name("VarBatch/static")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace encore::bench
