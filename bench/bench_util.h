// Helpers shared by the benchmark cases: allocator counters, the BLAS thread count, the check
// that a static case really replayed, and the CUDA cases' registry (registered at run time, only
// where a GPU is available).
#pragma once

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/device_activity.h"
#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/cuda.h"

namespace encore::bench {

// The threads a CPU case ran on: encore's (parallel_for, GEMM parts) and OpenBLAS's own.
inline void set_threads_counters(benchmark::State& state) {
  state.counters["threads"] = num_threads();
  state.counters["blas_threads"] = openblas_get_num_threads();
}

// Runs a case at a thread count of its own, whatever ENCORE_NUM_THREADS says (the *_t2 cases),
// and restores the previous one.
class ThreadsSetting {
 public:
  explicit ThreadsSetting(int threads) : saved_(num_threads()) { set_num_threads(threads); }
  ThreadsSetting(const ThreadsSetting&) = delete;
  ThreadsSetting& operator=(const ThreadsSetting&) = delete;
  ~ThreadsSetting() { set_num_threads(saved_); }

 private:
  int saved_;
};

// Records the activity of a device's allocator (the CPU's by default) over the measured loop:
// construct just before the loop (resets the peak), call report() after it.
class AllocatorProbe {
 public:
  explicit AllocatorProbe(Device device = Device::cpu()) : allocator_(allocator_for(device)) {
    allocator_.reset_peak();
    start_ = allocator_.stats();
  }

  // peak_bytes: highest bytes in use during the loop (parameters and optimizer state
  // included); system_allocations: calls that reached the system allocator (0 in steady
  // state); allocs_per_iter: allocate() calls per iteration.
  void report(benchmark::State& state) const {
    const AllocatorStats end = allocator_.stats();
    const auto iters = static_cast<double>(state.iterations());
    state.counters["peak_bytes"] =
        benchmark::Counter(static_cast<double>(end.peak_bytes), benchmark::Counter::kDefaults,
                           benchmark::Counter::kIs1024);
    state.counters["system_allocations"] =
        static_cast<double>(end.system_allocations - start_.system_allocations);
    state.counters["allocs_per_iter"] =
        iters > 0 ? static_cast<double>(end.allocation_count - start_.allocation_count) / iters : 0;
  }

 private:
  Allocator& allocator_;
  AllocatorStats start_;
};

// A byte count as a counter (printed in binary units on the console).
inline benchmark::Counter bytes_counter(int64_t bytes) {
  return benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kDefaults,
                            benchmark::Counter::kIs1024);
}

// Marks the run as failed unless every call of the static function since its creation
// replayed except `traces` traces (a run that fell back to eager would be mislabelled).
inline bool check_replayed(benchmark::State& state, const StaticStats& s, int64_t traces) {
  if (s.traces == traces && s.eager_calls == 0 && s.hits == s.calls - traces) return true;
  const std::string msg = s.name + ": expected " + std::to_string(traces) + " trace(s), the " +
                          "other calls replayed; got calls " + std::to_string(s.calls) +
                          ", traces " + std::to_string(s.traces) + ", hits " +
                          std::to_string(s.hits) + ", eager " + std::to_string(s.eager_calls) +
                          (static_enabled() ? "" : " (static off: ENCORE_STATIC=0?)");
  state.SkipWithError(msg.c_str());
  return false;
}

// One training step: forward, softmax cross entropy, zero_grad, backward, optimizer update;
// with clip_norm > 0, the gradients clipped to that 2-norm before the update.
template <typename Model, typename Opt>
struct TrainStep {
  std::shared_ptr<Model> model;
  Opt opt;
  double clip_norm = 0;
  Tensor operator()(const Tensor& x, const Tensor& labels) {
    Tensor loss = F::softmax_cross_entropy((*model)(x), labels);
    model->zero_grad();
    loss.backward();
    if (clip_norm > 0) nn::clip_grad_norm_(model->parameters(), clip_norm);
    opt.step();
    return loss;
  }
};

// int32 labels 0, 7, 4, 1, ... ((i * 7) % 10), made on the host and copied to `device`.
inline Tensor cyclic_labels(int64_t n, Device device = Device::cpu()) {
  Tensor t = Tensor::empty({n}, DType::Int32);
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 7) % 10);
  return t.to(device);
}

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  if (v.size() % 2 == 1) return *mid;
  return (*mid + *std::max_element(v.begin(), mid)) / 2;
}

// A static call and an eager step beside it, timed in each iteration: the ratio of their medians
// is what the drift of a shared machine affects least.
struct PairedTimes {
  std::vector<double> mine, eager;  // seconds
  // Counters `eager_ms` (the median eager step) and `ratio` = median(mine) / median(eager).
  void report(benchmark::State& state, const char* ratio) const {
    const double e = median(eager);
    state.counters[ratio] = e > 0 ? median(mine) / e : 0;
    state.counters["eager_ms"] = e * 1e3;
  }
};

// The measured loop of a case cycling through `sizes` inputs (VarSize/*, VarBatch/*):
// run(k, static_on) steps on input k. A warm-up calls every input once; then one step per
// iteration, k = 0, 1, ..., sizes - 1, 0, .... A static case (`fn` the static function) reports
// `traces` (per measured step), `traces_total` (every trace of the run), `planned` and
// `planned_total` (sizes planned from a dynamic family without tracing) and `evictions`; it is
// timed by hand (register it with UseManualTime): after each static step an eager step on the
// same input and model is timed too (PairedTimes: `ratio_to_eager`, `eager_ms`).
template <typename Static, typename Run>
void cycle_sizes(benchmark::State& state, const Static& fn, bool static_on, size_t sizes, Run run) {
  for (size_t k = 0; k < sizes; ++k) run(k, static_on);
  const StaticStats before = fn.stats();
  size_t i = 0;
  if (!static_on) {
    for (auto _ : state) run(i++ % sizes, false);
    return;
  }
  PairedTimes times;
  for (auto _ : state) {
    const size_t k = i++ % sizes;
    Clock::time_point start = Clock::now();
    run(k, true);
    times.mine.push_back(seconds_since(start));
    state.SetIterationTime(times.mine.back());
    start = Clock::now();
    run(k, false);
    times.eager.push_back(seconds_since(start));
  }
  const StaticStats after = fn.stats();
  state.counters["traces"] = benchmark::Counter(static_cast<double>(after.traces - before.traces),
                                                benchmark::Counter::kAvgIterations);
  state.counters["traces_total"] = static_cast<double>(after.traces);
  state.counters["evictions"] = static_cast<double>(after.evictions);
  state.counters["planned"] =
      benchmark::Counter(static_cast<double>(after.sizes_planned - before.sizes_planned),
                         benchmark::Counter::kAvgIterations);
  state.counters["planned_total"] = static_cast<double>(after.sizes_planned);
  times.report(state, "ratio_to_eager");
}

// ---- CUDA ----------------------------------------------------------------------------------
// The "/cuda" cases run the CPU cases' models and data on Device::cuda() (made on the host with
// the same seeds, then moved). Each iteration ends with cuda::synchronize(), so the wall time of
// an iteration is the real time of a step, not of queueing it.

inline bool on_cuda(Device device) {
  return device.type == DeviceType::CUDA;
}

// Waits for the work queued on a CUDA device; nothing on the CPU.
inline void finish_step(Device device) {
  if (on_cuda(device)) cuda::synchronize(device.index);
}

// The measured loop: `step()` per iteration, followed on a CUDA device by a synchronize (the CPU
// loop is exactly `for (auto _ : state) step();`).
template <typename Step>
void step_loop(benchmark::State& state, Device device, Step&& step) {
  if (!on_cuda(device)) {
    for (auto _ : state) step();
    return;
  }
  for (auto _ : state) {
    step();
    cuda::synchronize(device.index);
  }
}

// How a static case replays on CUDA: captured as CUDA graphs (the default) or as a stream of
// kernel launches (`static_nograph`).
enum class Replay { Graphs, NoGraphs };

// For a `static_nograph` case, turns CUDA graphs off for its lifetime and restores the previous
// setting; declare it before the static function, so that the function is traced, replayed and
// destroyed without graphs. A `Graphs` case leaves the setting alone (ENCORE_CUDA_GRAPHS=0 or
// set_graphs_enabled(false) stay in force), and ok() is false when graphs are off: the case then
// ends with an error instead of showing stream-replay times under the graphs' name (as a static
// case under ENCORE_STATIC=0 does). Does nothing on the CPU.
class GraphsSetting {
 public:
  GraphsSetting(benchmark::State& state, Device device, Replay replay)
      : restore_(on_cuda(device) && replay == Replay::NoGraphs) {
    if (restore_) previous_ = cuda::set_graphs_enabled(false);
    if (on_cuda(device) && replay == Replay::Graphs && !cuda::graphs_enabled()) {
      state.SkipWithError("CUDA graphs are off (ENCORE_CUDA_GRAPHS=0?): see static_nograph");
      ok_ = false;
    }
  }
  ~GraphsSetting() {
    if (restore_) cuda::set_graphs_enabled(previous_);
  }
  GraphsSetting(const GraphsSetting&) = delete;
  GraphsSetting& operator=(const GraphsSetting&) = delete;

  bool ok() const { return ok_; }

 private:
  bool restore_;
  bool previous_ = true;
  bool ok_ = true;
};

// A CUDA static case shows the static function's warnings (a capture that fell back to stream
// replay says so there) as its label, so a row that did not run as named is visible.
inline void label_warnings(benchmark::State& state, Device device, const StaticStats& stats) {
  if (on_cuda(device) && !stats.warnings.empty()) state.SetLabel(stats.warnings.back());
}

// The name of the /cuda case that is running (set by register_cuda_cases()'s wrapper).
inline std::string& running_cuda_case() {
  static std::string name;
  return name;
}

// ENCORE_BENCH_BREAKDOWN=DIR: each KernelSum case writes where its device time goes to
// DIR/<case, '/' as '_'>.txt: the profiler's table of the replayed steps (each op's device time,
// over all `iterations`) and, with CUPTI, the kernels by name per step and the timeline of the
// graph launch of median span (`median`, or null). On a GPU machine this is what ncu and nsys
// would be run for, in the benchmark run itself.
inline void write_breakdown(const profiler::Profile& profile, const DeviceActivity& activity,
                            const LaunchTimeline* median, int64_t iterations) {
  const char* dir = std::getenv("ENCORE_BENCH_BREAKDOWN");
  if (dir == nullptr || *dir == '\0' || iterations <= 0) return;
  std::string file = running_cuda_case();
  std::replace(file.begin(), file.end(), '/', '_');
  std::ofstream out(std::string(dir) + "/" + (file.empty() ? "case" : file) + ".txt");
  out << running_cuda_case() << ", " << iterations << " steps\n\nReplayed ops (device time):\n"
      << profile.table(30);
  const std::string kernels = kernel_table(activity, iterations);
  out << "\nKernels per step (CUPTI, unprofiled replay):\n"
      << (kernels.empty() ? "none recorded (no CUPTI in this build, or no kernel ran)\n" : kernels);
  if (median != nullptr)
    out << "\nThe graph launch of median span (CUPTI, unprofiled replay; idle: the device ran "
           "none of its kernels, copies or fills):\n"
        << timeline_table(*median, activity.names);
}

// KernelSum/<case>/cuda: the summed device time of the kernels of one replayed step, the bound
// a graph replay can approach. `replay()` runs one static step (without synchronizing). The
// measured loop replays under the profiler, whose rows in mode Replay carry each replayed
// step's device time on CUDA; the Time column is the wall time of those profiled steps.
// Counters, per step:
//   kernel_us:  the device time of the replayed steps (the Replay rows' total / iterations);
//   replay_ops: replayed steps (op calls) per training step;
//   other_ops:  ops run outside a replay per step (0 unless part of the step ran eagerly, whose
//               kernels kernel_us would then miss);
//   replay_us:  the same replay unprofiled (graphs as configured), timed over as many steps
//               after the loop, as <case>/static/cuda measures it;
//   replay_over_kernel: replay_us / kernel_us;
// and, where the build has CUPTI (bench/device_activity.h), of the same replay unprofiled:
//   device_us:  the summed device time of its kernels, copies and fills, each as the device ran
//               it (no event between kernels; the kernel nodes of graph launches included);
//   device_kernels, device_copies: how many ran per step;
//   replay_over_device: replay_us / device_us (MlpSmall's target: at most 1.2);
//   launch_span_us, launch_idle_us: of the graph launch of median span (bench/device_timeline.h),
//               from its first start to its last end on the device, and how much of that the
//               device ran none of its kernels, copies or fills (waits between dependent kernels);
//   graph_launches: graph launches per step (where no span was left out).
template <typename ReplayFn>
void kernel_sum_loop(benchmark::State& state, Device device, ReplayFn&& replay) {
  profiler::Options options;
  options.record_shapes = false;
  options.max_events = 1 << 14;  // the rows' totals stay exact when events are dropped
  options.reserve_events = 1 << 14;
  try {
    profiler::start(options);
  } catch (const Error& e) {
    state.SkipWithError((std::string("profiler::start: ") + e.what()).c_str());
    return;
  }
  step_loop(state, device, replay);
  cuda::synchronize(device.index);
  const profiler::Profile profile = profiler::stop();

  const int64_t iterations = static_cast<int64_t>(state.iterations());
  if (iterations == 0) return;
  const auto iters = static_cast<double>(iterations);
  int64_t replay_calls = 0;
  for (const profiler::OpRow& row : profile.ops())
    if (row.mode == profiler::Mode::Replay) replay_calls += row.calls;
  const double kernel_ns = static_cast<double>(profile.total_ns(profiler::Mode::Replay)) / iters;
  state.counters["kernel_us"] = kernel_ns * 1e-3;
  state.counters["replay_ops"] = static_cast<double>(replay_calls) / iters;
  state.counters["other_ops"] = static_cast<double>(profile.total_calls() - replay_calls) / iters;

  // The unprofiled replay: two untimed steps first (the first replay after profiling may
  // capture its graphs again).
  for (int i = 0; i < 2; ++i) replay();
  cuda::synchronize(device.index);
  auto replay_steps = [&] {
    for (int64_t i = 0; i < iterations; ++i) {
      replay();
      cuda::synchronize(device.index);
    }
  };
  const auto start = std::chrono::steady_clock::now();
  replay_steps();
  const std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
  const double replay_ns = elapsed.count() / iters;
  state.counters["replay_us"] = replay_ns * 1e-3;
  state.counters["replay_over_kernel"] = kernel_ns > 0 ? replay_ns / kernel_ns : 0;
  // Its device time from CUPTI's records, over a loop of its own (recording costs host time).
  DeviceActivity a;
  if (const std::string why = start_device_activity(); why.empty()) {
    replay_steps();
    a = stop_device_activity();
    const double device_ns = static_cast<double>(a.kernel_ns + a.copy_ns) / iters;
    state.counters["device_us"] = device_ns * 1e-3;
    state.counters["device_kernels"] = static_cast<double>(a.kernels) / iters;
    state.counters["device_copies"] = static_cast<double>(a.copies) / iters;
    if (a.dropped > 0) state.counters["device_dropped"] = static_cast<double>(a.dropped);
    if (device_ns > 0) state.counters["replay_over_device"] = replay_ns / device_ns;
  } else {
    state.SetLabel("no device_us: " + why);
  }
  const std::vector<LaunchTimeline> launches = graph_launches(a.spans);
  const int median = median_launch(launches);
  if (median >= 0) {
    state.counters["launch_span_us"] = static_cast<double>(launches[median].span_ns) * 1e-3;
    state.counters["launch_idle_us"] = static_cast<double>(launches[median].idle_ns()) * 1e-3;
    if (a.spans_left_out == 0)
      state.counters["graph_launches"] = static_cast<double>(launches.size()) / iters;
  }
  write_breakdown(profile, a, median >= 0 ? &launches[median] : nullptr, iterations);
}

// A training step's measurement: `warmup` untimed calls of run(), then run() per iteration
// timed by step_loop() or, with `kernel_sum`, by kernel_sum_loop() (CUDA), with the allocator's
// counters and, on the CPU, the thread counts.
template <typename Run>
void measure_steps(benchmark::State& state, Device device, int warmup, bool kernel_sum, Run run) {
  for (int i = 0; i < warmup; ++i) run();
  finish_step(device);
  AllocatorProbe probe(device);
  if (kernel_sum)
    kernel_sum_loop(state, device, run);
  else
    step_loop(state, device, run);
  probe.report(state);
  if (!on_cuda(device)) set_threads_counters(state);
}

// The CUDA cases, registered with Google Benchmark at run time by register_cuda_cases() (from
// main) when a device is available; the files that define them add them here with
// add_cuda_case() during static initialisation, under #ifdef ENCORE_HAS_CUDA.
struct CudaCase {
  int order = 0;  // registration order (then by name)
  std::string name;
  std::function<void(benchmark::State&)> run;
  benchmark::TimeUnit unit = benchmark::kMillisecond;
};

// The rooms' places in the registration order.
inline constexpr int kOpChainOrder = 0, kMlpSmallOrder = 1, kMlpLargeOrder = 2, kSeedCnnOrder = 3,
                     kSequenceOrder = 4, kKernelSumOrder = 5;

inline std::vector<CudaCase>& cuda_cases() {
  static std::vector<CudaCase> cases;
  return cases;
}

inline void add_cuda_case(int order, std::string name, std::function<void(benchmark::State&)> run,
                          benchmark::TimeUnit unit = benchmark::kMillisecond) {
  cuda_cases().push_back({order, std::move(name), std::move(run), unit});
}

// Registers the CUDA cases (wall time, UseRealTime) when a CUDA device is available. Returns a
// line for the context printed above the results: how many were registered, or why none were.
inline std::string register_cuda_cases() {
  if (!cuda::is_available()) {
    const std::string why = cuda::is_built() ? cuda::unavailable_reason() : "not built";
    return "no /cuda cases (" + why + ")";
  }
  std::vector<CudaCase> cases = cuda_cases();
  std::stable_sort(cases.begin(), cases.end(), [](const CudaCase& a, const CudaCase& b) {
    return a.order != b.order ? a.order < b.order : a.name < b.name;
  });
  // An Error (a case that cannot run on this device) ends its case, not the whole run.
  for (CudaCase& c : cases)
    benchmark::RegisterBenchmark(c.name.c_str(),
                                 [run = c.run, name = c.name](benchmark::State& state) {
                                   running_cuda_case() = name;
                                   try {
                                     run(state);
                                   } catch (const Error& e) {
                                     state.SkipWithError(e.what());
                                   }
                                 })
        ->UseRealTime()
        ->Unit(c.unit);
  return std::to_string(cases.size()) + " /cuda cases on " + std::to_string(cuda::device_count()) +
         " device(s)";
}

}  // namespace encore::bench
