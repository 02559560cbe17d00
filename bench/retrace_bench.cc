// Retrace/first_call: the cost of a first call (trace and plan) of the MlpSmall training step as
// a static function, against an eager call of the same step. Each iteration makes a fresh
// static function (untimed), times its first call, and times one eager step; the time column
// is the first call, the ratio counter median(first call) / median(eager step).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench/bench_util.h"
#include "bench/mlp_step.h"
#include "encore/encore.h"
#include "encore/static_graph.h"

namespace encore::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  if (v.size() % 2 == 1) return *mid;
  return (*mid + *std::max_element(v.begin(), mid)) / 2;
}

void BM_RetraceFirstCall(benchmark::State& state) {
  MlpStep step(kMlpSmallHidden, kMlpSmallBatch);
  for (int i = 0; i < 3; ++i) step.run();  // gradients, Adam state, allocator cache

  std::vector<double> first_call_s, eager_s;
  for (auto _ : state) {
    auto static_step = step.make_static();  // empty cache: the call below traces
    Clock::time_point start = Clock::now();
    static_step(step.x(), step.labels());
    const double first = seconds_since(start);
    if (!check_replayed(state, static_step.stats(), /*traces=*/1)) break;

    start = Clock::now();
    step.run();
    eager_s.push_back(seconds_since(start));
    first_call_s.push_back(first);
    state.SetIterationTime(first);
  }
  if (state.error_occurred()) return;

  const double eager = median(eager_s);
  state.counters["ratio"] = eager > 0 ? median(first_call_s) / eager : 0;
  state.counters["eager_ms"] = eager * 1e3;
  set_threads_counters(state);
}
BENCHMARK(BM_RetraceFirstCall)
    ->Name("Retrace/first_call")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace encore::bench
