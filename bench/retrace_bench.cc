// Retrace/first_call: the cost of a first call (trace and plan) of the MlpSmall training step as
// a static function, against an eager call of the same step. Each iteration makes a fresh
// static function (untimed), times its first call, and times one eager step; the time column
// is the first call, the ratio counter median(first call) / median(eager step).
// Retrace/new_size: the first call of the same static function at a batch size it has not seen,
// once the batch is dynamic (called at 32 and 17 first): planned from the recording, no trace.
// Each iteration times that call and one eager step at the same size; every kNewSizes
// iterations a fresh static function (untimed, its two warm-up calls included) starts over, so
// no size repeats within one function. The ratio counter: median(first call) / median(eager).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/mlp_step.h"
#include "encore/encore.h"
#include "encore/static_graph.h"

namespace encore::bench {
namespace {

void BM_RetraceFirstCall(benchmark::State& state) {
  MlpStep step(kMlpSmallHidden, kMlpSmallBatch);
  for (int i = 0; i < 3; ++i) step.run();  // gradients, Adam state, allocator cache

  PairedTimes times;
  for (auto _ : state) {
    auto static_step = step.make_static();  // empty cache: the call below traces
    Clock::time_point start = Clock::now();
    static_step(step.x(), step.labels());
    const double first = seconds_since(start);
    if (!check_replayed(state, static_step.stats(), /*traces=*/1)) break;

    start = Clock::now();
    step.run();
    times.eager.push_back(seconds_since(start));
    times.mine.push_back(first);
    state.SetIterationTime(first);
  }
  if (state.error_occurred()) return;

  times.report(state, "ratio");
  set_threads_counters(state);
}
BENCHMARK(BM_RetraceFirstCall)
    ->Name("Retrace/first_call")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The batch sizes each fresh static function of Retrace/new_size meets after its warm-up at 32
// and 17: 23, 25, ..., 41 (distinct, neither warm-up size, their median 32).
constexpr int64_t kNewSizes = 10;
int64_t new_size(int64_t k) {
  return 23 + 2 * k;
}

// Marks the run as failed unless the warm-up calls (at 32, then 17) made the batch dynamic:
// two traces, one dynamic event.
bool check_dynamic(benchmark::State& state, const StaticStats& s) {
  if (s.traces == 2 && s.dynamic_events == 1 && s.sizes_planned == 0) return true;
  const std::string msg =
      s.name + ": expected the batch dynamic after calls at 32 and 17 (2 " +
      "traces, 1 dynamic event); got traces " + std::to_string(s.traces) + ", dynamic events " +
      std::to_string(s.dynamic_events) + ", sizes planned " + std::to_string(s.sizes_planned) +
      (static_dynamic_enabled() ? "" : " (dynamic off: ENCORE_STATIC_DYNAMIC=0?)");
  state.SkipWithError(msg.c_str());
  return false;
}

void BM_RetraceNewSize(benchmark::State& state) {
  MlpStep step(kMlpSmallHidden, kMlpSmallBatch);
  for (int i = 0; i < 3; ++i) step.run();  // gradients, Adam state, allocator cache

  // The inputs, made before the loop: batch 17 for the second warm-up call, then one per size.
  const Tensor x17 = rand({17, 784}), labels17 = cyclic_labels(17);
  std::vector<Tensor> xs, labels;
  for (int64_t k = 0; k < kNewSizes; ++k) {
    xs.push_back(rand({new_size(k), 784}));
    labels.push_back(cyclic_labels(new_size(k)));
  }

  using Static = decltype(step.make_static());
  std::unique_ptr<Static> static_step;
  int64_t k = kNewSizes, planned = 0;
  PairedTimes times;
  for (auto _ : state) {
    if (k == kNewSizes) {  // a fresh function, its batch made dynamic (untimed)
      static_step.reset();
      static_step = std::make_unique<Static>(step.make_static());
      (*static_step)(step.x(), step.labels());
      (*static_step)(x17, labels17);
      if (!check_dynamic(state, static_step->stats())) break;
      k = 0;
      planned = 0;
    }
    Clock::time_point start = Clock::now();
    (*static_step)(xs[k], labels[k]);
    const double first = seconds_since(start);
    const StaticStats s = static_step->stats();
    if (!check_replayed(state, s, /*traces=*/2)) break;
    if (s.sizes_planned != ++planned) {
      const std::string msg = "mlp_step: batch " + std::to_string(new_size(k)) +
                              " was not planned from the family (sizes planned " +
                              std::to_string(s.sizes_planned) + ", expected " +
                              std::to_string(planned) + ")";
      state.SkipWithError(msg.c_str());
      break;
    }

    start = Clock::now();
    step(xs[k], labels[k]);
    times.eager.push_back(seconds_since(start));
    times.mine.push_back(first);
    state.SetIterationTime(first);
    ++k;
  }
  if (state.error_occurred()) return;

  times.report(state, "ratio_to_eager");
  set_threads_counters(state);
}
BENCHMARK(BM_RetraceNewSize)
    ->Name("Retrace/new_size")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace encore::bench
