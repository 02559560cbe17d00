// MlpSmall/eager, MlpLarge/eager: one eager Adam training step of the 784-h-h-10 perceptron
// per iteration (forward, softmax cross entropy, zero_grad, backward, update) on inputs fixed
// before the loop. MlpSmall/static, MlpLarge/static: the same step as one static function,
// replayed; MlpSmall/static_lr_schedule with a new learning rate at every step;
// MlpSmall/eager_clip and MlpSmall/static_clip with the gradients' 2-norm clipped to 1 before
// each update (clip_grad_norm_: a handful of small ops per parameter). Compare with
// GemmBound/* (gemm_bound_bench.cc), the time of the same step's sgemm calls alone.
//
// With a GPU (registered at run time, see bench_util.h): the same cases on Device::cuda() with
// the suffix /cuda, static_nograph/cuda (static replay without CUDA graphs),
// MlpSmall/static_batches/cuda (two batches in turn), and KernelSum/MlpSmall/cuda,
// KernelSum/MlpLarge/cuda (the summed device time of the replayed step's kernels).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/mlp_step.h"
#include "encore/encore.h"
#include "encore/static_graph.h"

namespace encore::bench {
namespace {

// Warm-up steps before the measurement: they create the gradients and Adam's state and fill
// the allocator's cache (static: the first traces, the others replay).
constexpr int kWarmupSteps = 3;

void BM_MlpEager(benchmark::State& state, int64_t hidden, int64_t batch, Device device,
                 double clip_norm = 0) {
  MlpStep step(hidden, batch, device, clip_norm);
  measure_steps(state, device, kWarmupSteps, /*kernel_sum=*/false, [&] { step.run(); });
}

// The static step's plan: its arena against the lower bound and the naive plan.
void report_arena(benchmark::State& state, const StaticStats& stats) {
  const EntryReport& entry = stats.cache.at(0);
  state.counters["arena_bytes"] = bytes_counter(entry.arena_bytes);
  state.counters["lower_bound_bytes"] = bytes_counter(entry.lower_bound_bytes);
  state.counters["naive_bytes"] = bytes_counter(entry.naive_bytes);
}

// The static step after its warm-up, measured per step by step_loop() or, with `kernel_sum`,
// by kernel_sum_loop(); the run fails unless every measured call replayed. With `batches` > 1
// the calls take that many copies of the batch in turn, each at addresses of its own (as a
// loader's batches come).
void measure_static_step(benchmark::State& state, int64_t hidden, int64_t batch, Device device,
                         bool kernel_sum, int batches = 1, double clip_norm = 0) {
  MlpStep step(hidden, batch, device, clip_norm);
  std::vector<Tensor> xs{step.x()}, labels{step.labels()};
  for (int k = 1; k < batches; ++k) {
    xs.push_back(clone(step.x()));
    labels.push_back(clone(step.labels()));
  }
  auto static_step = step.make_static();
  size_t calls = 0;
  measure_steps(state, device, kWarmupSteps, kernel_sum, [&] {
    const size_t k = calls++ % xs.size();
    static_step(xs[k], labels[k]);
  });

  const StaticStats stats = static_step.stats();
  label_warnings(state, device, stats);
  if (!check_replayed(state, stats, /*traces=*/1)) return;
  report_arena(state, stats);
}

void BM_MlpStatic(benchmark::State& state, int64_t hidden, int64_t batch, Device device,
                  Replay replay, int batches = 1, double clip_norm = 0) {
  GraphsSetting graphs(state, device, replay);
  if (!graphs.ok()) return;
  measure_static_step(state, hidden, batch, device, /*kernel_sum=*/false, batches, clip_norm);
}

// The clipped steps' limit: the gradients' 2-norm clipped to 1.
constexpr double kClipNorm = 1.0;

// MlpSmall/static_lr_schedule: MlpSmall/static with a new learning rate before every step, as a
// decay schedule sets it. The replays read it at each call (no step traces again): the cost of a
// schedule against MlpSmall/static. On CUDA (MlpSmall/static_lr_schedule/cuda) the graph's
// update kernels read it from the device, where each call writes it before the launch.
void BM_MlpStaticSchedule(benchmark::State& state, int64_t hidden, int64_t batch,
                          Device device = Device::cpu()) {
  GraphsSetting graphs(state, device, Replay::Graphs);
  if (!graphs.ok()) return;
  MlpStep step(hidden, batch, device);
  auto static_step = step.make_static();
  int64_t calls = 0;
  measure_steps(state, device, kWarmupSteps, /*kernel_sum=*/false, [&] {
    step.optimizer().options.lr = 1e-3 / (1.0 + 1e-4 * static_cast<double>(calls++));
    static_step(step.x(), step.labels());
  });
  const StaticStats stats = static_step.stats();
  label_warnings(state, device, stats);
  if (!check_replayed(state, stats, /*traces=*/1)) return;
  report_arena(state, stats);
}

// The *_t2 cases: the same steps at two threads whatever ENCORE_NUM_THREADS says (a static
// replay then runs on two lanes, schedule/lanes.cc; eager splits each large step).
void BM_MlpEagerT2(benchmark::State& state, int64_t hidden, int64_t batch) {
  ThreadsSetting two(2);
  BM_MlpEager(state, hidden, batch, Device::cpu());
}
void BM_MlpStaticT2(benchmark::State& state, int64_t hidden, int64_t batch) {
  ThreadsSetting two(2);
  measure_static_step(state, hidden, batch, Device::cpu(), /*kernel_sum=*/false);
}

BENCHMARK_CAPTURE(BM_MlpEager, small, kMlpSmallHidden, kMlpSmallBatch, Device::cpu())
    ->Name("MlpSmall/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpEagerT2, small, kMlpSmallHidden, kMlpSmallBatch)
    ->Name("MlpSmall/eager_t2")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStaticT2, small, kMlpSmallHidden, kMlpSmallBatch)
    ->Name("MlpSmall/static_t2")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStatic, small, kMlpSmallHidden, kMlpSmallBatch, Device::cpu(),
                  Replay::Graphs)
    ->Name("MlpSmall/static")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStaticSchedule, small, kMlpSmallHidden, kMlpSmallBatch)
    ->Name("MlpSmall/static_lr_schedule")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpEager, small_clip, kMlpSmallHidden, kMlpSmallBatch, Device::cpu(),
                  kClipNorm)
    ->Name("MlpSmall/eager_clip")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStatic, small_clip, kMlpSmallHidden, kMlpSmallBatch, Device::cpu(),
                  Replay::Graphs, /*batches=*/1, kClipNorm)
    ->Name("MlpSmall/static_clip")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpEager, large, kMlpLargeHidden, kMlpLargeBatch, Device::cpu())
    ->Name("MlpLarge/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStatic, large, kMlpLargeHidden, kMlpLargeBatch, Device::cpu(),
                  Replay::Graphs)
    ->Name("MlpLarge/static")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

#ifdef ENCORE_HAS_CUDA
// KernelSum/MlpX/cuda: the MlpX/static/cuda step replayed under the profiler (see
// kernel_sum_loop() for the counters), with the plan's counters.
void BM_MlpKernelSum(benchmark::State& state, int64_t hidden, int64_t batch) {
  measure_static_step(state, hidden, batch, Device::cuda(), /*kernel_sum=*/true);
}

void add_mlp_cuda_cases(int order, const std::string& room, int64_t hidden, int64_t batch) {
  const Device cuda = Device::cuda();
  add_cuda_case(order, room + "/eager/cuda",
                [=](benchmark::State& s) { BM_MlpEager(s, hidden, batch, cuda); });
  add_cuda_case(order, room + "/static/cuda",
                [=](benchmark::State& s) { BM_MlpStatic(s, hidden, batch, cuda, Replay::Graphs); });
  add_cuda_case(order, room + "/static_nograph/cuda", [=](benchmark::State& s) {
    BM_MlpStatic(s, hidden, batch, cuda, Replay::NoGraphs);
  });
  add_cuda_case(kKernelSumOrder, "KernelSum/" + room + "/cuda",
                [=](benchmark::State& s) { BM_MlpKernelSum(s, hidden, batch); });
}

[[maybe_unused]] const bool kCudaCasesAdded = [] {
  add_mlp_cuda_cases(kMlpSmallOrder, "MlpSmall", kMlpSmallHidden, kMlpSmallBatch);
  // MlpSmall/static/cuda alternating between its batch and a copy of it: two sets of argument
  // addresses in turn, each read where it is by a graph of its own (staged with
  // ENCORE_CUDA_GRAPH_DIRECT_ARGS=0: every call's graph copies its arguments from new sources,
  // which the launch sets first).
  add_cuda_case(kMlpSmallOrder, "MlpSmall/static_batches/cuda", [](benchmark::State& s) {
    BM_MlpStatic(s, kMlpSmallHidden, kMlpSmallBatch, Device::cuda(), Replay::Graphs,
                 /*batches=*/2);
  });
  add_cuda_case(kMlpSmallOrder, "MlpSmall/static_lr_schedule/cuda", [](benchmark::State& s) {
    BM_MlpStaticSchedule(s, kMlpSmallHidden, kMlpSmallBatch, Device::cuda());
  });
  add_cuda_case(kMlpSmallOrder, "MlpSmall/eager_clip/cuda", [](benchmark::State& s) {
    BM_MlpEager(s, kMlpSmallHidden, kMlpSmallBatch, Device::cuda(), kClipNorm);
  });
  add_cuda_case(kMlpSmallOrder, "MlpSmall/static_clip/cuda", [](benchmark::State& s) {
    BM_MlpStatic(s, kMlpSmallHidden, kMlpSmallBatch, Device::cuda(), Replay::Graphs,
                 /*batches=*/1, kClipNorm);
  });
  add_mlp_cuda_cases(kMlpLargeOrder, "MlpLarge", kMlpLargeHidden, kMlpLargeBatch);
  return true;
}();
#endif  // ENCORE_HAS_CUDA

}  // namespace
}  // namespace encore::bench
