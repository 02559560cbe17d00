// encore_dist_bench: data-parallel training throughput, one thread per rank.
//
//   build/bench/encore_dist_bench                  # DataParallel/MlpLarge/ranks1
//   mpirun -np 2 build/bench/encore_dist_bench     # DataParallel/MlpLarge/ranks2
//
// The case is MlpLarge's whole Adam step (784-1000-1000-10, batch 100 per rank, bench/
// mlp_step.h) as a static function, each rank under dist::DataParallel with 2 MiB buckets (the
// default 25 MiB would make this model's 7 MB of gradients one bucket, started when backward has
// nothing left to overlap it with); its name carries the world size it ran in.
// items_per_second counts the samples of every rank. Every rank runs the same fixed number of
// iterations (the collectives must match up); rank 0 reports.
//
// Counters beside the throughput (ranks2), from a profiled pass after the measured loop:
// allreduce_ms, one blocking all-reduce of all the gradients (ranks aligned by a barrier);
// exposed_ms, the time a step spends in its all_reduce_start and all_reduce_wait steps (the
// progress given between kernels is counted with the kernels: it is the same core's time), on
// the rank that spends least there: the slowest, which the others wait for (their longer waits,
// exposed_max_ms, are its lag, not communication); hidden, 1 - exposed_ms / allreduce_ms.
// ENCORE_DIST_BENCH_TRACE=path writes each rank's Chrome trace of that pass to path.rank<r>.json
// (the all-reduces on the communication lane).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "encore/dist.h"
#include "encore/encore.h"
#include "encore/profiler.h"
#include "encore/static_graph.h"

namespace encore::bench {
namespace {

constexpr int64_t kHidden = 1000, kBatch = 100;
constexpr int kWarmupSteps = 3, kIterations = 40, kProfiledSteps = 10;
constexpr size_t kBucketBytes = size_t{2} << 20;

// Milliseconds of one blocking all-reduce of `numel` floats (the mean of a few, ranks aligned
// by a barrier before each).
double blocking_all_reduce_ms(int64_t numel) {
  Tensor buffer = full({numel}, 1.0);
  constexpr int kRepeats = 5;
  double total = 0;
  for (int i = 0; i < kRepeats; ++i) {
    dist::barrier();
    const auto begin = std::chrono::steady_clock::now();
    dist::all_reduce(buffer);
    total +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  }
  return total / kRepeats;
}

void BM_DataParallelMlpLarge(benchmark::State& state) {
  manual_seed(0);
  auto model = nn::mlp(784, kHidden, 10);
  dist::DataParallel ddp(*model, {.bucket_bytes = kBucketBytes});
  TrainStep<nn::Sequential, optim::Adam> train{model, optim::Adam(model->parameters())};
  manual_seed(1 + static_cast<uint64_t>(dist::rank()));  // each rank its own batch
  const Tensor x = rand({kBatch, 784}), labels = cyclic_labels(kBatch);
  auto step =
      static_graph([&](const Tensor& in, const Tensor& t) { return train(in, t); },
                   {.name = "dp_mlp_step", .arg_names = {"x", "labels"}, .modules = {model}});
  for (int i = 0; i < kWarmupSteps; ++i) step(x, labels);
  dist::barrier();
  for (auto _ : state) step(x, labels);
  dist::barrier();
  state.SetItemsProcessed(state.iterations() * kBatch * dist::world_size());
  state.counters["ranks"] = dist::world_size();
  set_threads_counters(state);
  // With two ranks the first call is DataParallel's first backward, whose trace is dropped.
  if (!check_replayed(state, step.stats(), /*traces=*/dist::world_size() > 1 ? 2 : 1)) return;
  if (dist::world_size() == 1) return;

  int64_t numel = 0;
  for (const Tensor& p : model->parameters()) numel += p.numel();
  const double all_reduce_ms = blocking_all_reduce_ms(numel);
  profiler::start();
  for (int i = 0; i < kProfiledSteps; ++i) step(x, labels);
  const profiler::Profile profile = profiler::stop();
  double exposed_ns = 0;
  for (const profiler::OpRow& row : profile.ops())
    if (row.op == "all_reduce_start" || row.op == "all_reduce_wait")
      exposed_ns += static_cast<double>(row.total_ns);
  // Each rank's exposed time, as [max, -min] over the ranks.
  Tensor spread = Tensor::empty({2}, DType::Float64);
  spread.data<double>()[0] = exposed_ns / 1e6 / kProfiledSteps;
  spread.data<double>()[1] = -spread.data<double>()[0];
  dist::all_reduce(spread, ReduceOp::Max);
  const double exposed_max_ms = spread.data<double>()[0], exposed_ms = -spread.data<double>()[1];
  state.counters["allreduce_ms"] = all_reduce_ms;
  state.counters["exposed_ms"] = exposed_ms;
  state.counters["exposed_max_ms"] = exposed_max_ms;
  state.counters["hidden"] = 1 - exposed_ms / all_reduce_ms;
  if (const char* path = std::getenv("ENCORE_DIST_BENCH_TRACE"); path != nullptr && *path)
    profile.write_chrome_trace(cat(path, ".rank", dist::rank(), ".json"));
}

}  // namespace

// Rank 0's console: the case's fixed name, without the "/iterations:40/real_time" Google
// Benchmark appends.
class FixedNameConsole : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> renamed = runs;
    for (Run& r : renamed) {
      r.run_name.iterations.clear();
      r.run_name.time_type.clear();
    }
    benchmark::ConsoleReporter::ReportRuns(renamed);
  }
};

// What the ranks other than 0 report: nothing.
class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace encore::bench

int main(int argc, char** argv) {
  using namespace encore;
  dist::init();
  set_num_threads(1);  // one thread per rank: ranks, not threads, share the cores
  openblas_set_num_threads(1);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RegisterBenchmark(cat("DataParallel/MlpLarge/ranks", dist::world_size()).c_str(),
                               bench::BM_DataParallelMlpLarge)
      ->Iterations(bench::kIterations)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  // Every rank runs the case (its collectives must match up); rank 0 reports it.
  bench::FixedNameConsole console;
  bench::SilentReporter silent;
  if (dist::rank() == 0)
    benchmark::RunSpecifiedBenchmarks(&console);
  else
    benchmark::RunSpecifiedBenchmarks(&silent);
  benchmark::Shutdown();
  dist::finalize();
  return 0;
}
