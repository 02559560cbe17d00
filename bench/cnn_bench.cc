// SeedCnn/eager, SeedCnn/static: one SGD training step (forward, softmax cross entropy,
// zero_grad, backward, update) of Chainer's seed CNN (models::SeedCnn) at batch 32 on a rand
// input fixed before the loop; static: the whole step as one static function, replayed.
// With a GPU (registered at run time, see bench_util.h): SeedCnn/eager/cuda, static/cuda,
// static_nograph/cuda and KernelSum/SeedCnn/cuda, the same step on Device::cuda().
//
// VarSize/eager, VarSize/static: training steps of the variable_size sample (models::VggSmall,
// Adam, batch 8) on images whose height and width follow a fixed sequence of 16 sizes drawn
// from [32, 96]; one iteration is one step, cycling through the sequence, after a warm-up that
// calls every size once. The static step's height and width become dynamic at its second size;
// later sizes are planned from the trace (`planned`, `planned_total`) instead of traced (`traces`
// per step, `traces_total` every trace of the run). The static case also times an eager step
// after each of its own (`ratio_to_eager`, see cycle_sizes in bench_util.h).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>
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

// The SeedCnn step: model and data made on the host (seed 0), then moved to `device`.
struct SeedCnnStep {
  using StepFn = std::function<Tensor(const Tensor&, const Tensor&)>;
  explicit SeedCnnStep(Device device)
      : model(seeded_model(device)),
        step{model, optim::SGD(model->parameters())},
        x(rand({32, 1, 28, 28}).to(device)),
        labels(cyclic_labels(32, device)),
        static_step(
            static_graph(StepFn([this](const Tensor& a, const Tensor& b) { return step(a, b); }),
                         {.name = "seed_cnn_step", .modules = {model}})) {}
  SeedCnnStep(const SeedCnnStep&) = delete;
  SeedCnnStep& operator=(const SeedCnnStep&) = delete;

  static std::shared_ptr<models::SeedCnn> seeded_model(Device device) {
    manual_seed(0);
    auto m = std::make_shared<models::SeedCnn>();
    if (device != Device::cpu()) m->to(device);
    return m;
  }
  Tensor replay() { return static_step(x, labels); }

  std::shared_ptr<models::SeedCnn> model;
  TrainStep<models::SeedCnn, optim::SGD> step;
  Tensor x, labels;
  StaticFunction<StepFn> static_step;
};

// The eager or static (`static_on`) step after its warm-up, measured per step by step_loop() or,
// with `kernel_sum`, by kernel_sum_loop(); a static run fails unless every measured call replayed.
void measure_seed_cnn(benchmark::State& state, bool static_on, Device device, bool kernel_sum) {
  SeedCnnStep s(device);
  measure_steps(state, device, kWarmupSteps, kernel_sum,
                [&] { return static_on ? s.replay() : s.step(s.x, s.labels); });
  if (static_on) {
    const StaticStats stats = s.static_step.stats();
    label_warnings(state, device, stats);
    if (!check_replayed(state, stats, /*traces=*/1)) return;
    state.counters["arena_bytes"] = bytes_counter(stats.cache.at(0).arena_bytes);
  }
}

void BM_SeedCnn(benchmark::State& state, bool static_on, Device device = Device::cpu(),
                Replay replay = Replay::Graphs) {
  GraphsSetting graphs(state, device, replay);
  if (!graphs.ok()) return;
  measure_seed_cnn(state, static_on, device, /*kernel_sum=*/false);
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
  set_log_sink([](const std::string&) {});  // warnings of a retrace storm are not news here
  cycle_sizes(state, static_step, static_on, xs.size(), [&](size_t k, bool use_static) {
    return use_static ? static_step(xs[k], labels) : step(xs[k], labels);
  });
  set_log_sink(nullptr);
}

BENCHMARK_CAPTURE(BM_SeedCnn, eager, false)
    ->Name("SeedCnn/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SeedCnn, static, true)
    ->Name("SeedCnn/static")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
// At two threads whatever ENCORE_NUM_THREADS says (see MlpSmall/eager_t2).
void BM_SeedCnnT2(benchmark::State& state, bool static_on) {
  ThreadsSetting two(2);
  measure_seed_cnn(state, static_on, Device::cpu(), /*kernel_sum=*/false);
}
BENCHMARK_CAPTURE(BM_SeedCnnT2, eager, false)
    ->Name("SeedCnn/eager_t2")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SeedCnnT2, static, true)
    ->Name("SeedCnn/static_t2")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_VarSize, eager, false)
    ->Name("VarSize/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_VarSize, static, true)
    ->Name("VarSize/static")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

#ifdef ENCORE_HAS_CUDA
// KernelSum/SeedCnn/cuda: the SeedCnn/static/cuda step replayed under the profiler (see
// kernel_sum_loop() for the counters).
void BM_SeedCnnKernelSum(benchmark::State& state) {
  measure_seed_cnn(state, /*static_on=*/true, Device::cuda(), /*kernel_sum=*/true);
}

[[maybe_unused]] const bool kCudaCasesAdded = [] {
  const Device cuda = Device::cuda();
  add_cuda_case(kSeedCnnOrder, "SeedCnn/eager/cuda",
                [=](benchmark::State& s) { BM_SeedCnn(s, false, cuda); });
  add_cuda_case(kSeedCnnOrder, "SeedCnn/static/cuda",
                [=](benchmark::State& s) { BM_SeedCnn(s, true, cuda, Replay::Graphs); });
  add_cuda_case(kSeedCnnOrder, "SeedCnn/static_nograph/cuda",
                [=](benchmark::State& s) { BM_SeedCnn(s, true, cuda, Replay::NoGraphs); });
  add_cuda_case(kKernelSumOrder, "KernelSum/SeedCnn/cuda", BM_SeedCnnKernelSum);
  return true;
}();
#endif  // ENCORE_HAS_CUDA

}  // namespace
}  // namespace encore::bench
