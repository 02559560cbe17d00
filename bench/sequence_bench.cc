// CharLstm/eager, CharLstm/static: one Adam training step of the character LSTM (bench/
// sequence_step.h) per iteration, eager or replayed as one static function. TinyGpt/eager,
// TinyGpt/static: the same for the small GPT with AdamW. LstmCellChain/eager,
// LstmCellChain/static: forward and backward through 35 steps of one LSTMCell at batch 1 (the
// small-op regime: every op is a few hundred elements). Compare with GemmBound/CharLstm and
// GemmBound/TinyGpt (gemm_bound_sequence_bench.cc).
// With a GPU (registered at run time, see bench_util.h): each case on Device::cuda() with the
// suffix /cuda, static_nograph/cuda (static replay without CUDA graphs), and
// KernelSum/<case>/cuda (the summed device time of the replayed step's kernels).
#include <benchmark/benchmark.h>

#include "bench/bench_util.h"
#include "bench/sequence_step.h"

namespace encore::bench {
namespace {

constexpr int kWarmupSteps = 3;

template <typename Step>
void eager_case(benchmark::State& state, Step& step, Device device = Device::cpu()) {
  for (int i = 0; i < kWarmupSteps; ++i) step.run();
  finish_step(device);
  AllocatorProbe probe(device);
  step_loop(state, device, [&] { step.run(); });
  probe.report(state);
  if (!on_cuda(device)) set_threads_counters(state);
}

// `replay()` after the warm-up, measured per step or, with `kernel_sum`, by kernel_sum_loop();
// the run fails unless every measured call replayed.
template <typename Static, typename ReplayFn>
void static_case(benchmark::State& state, Static& fn, ReplayFn replay,
                 Device device = Device::cpu(), bool kernel_sum = false) {
  for (int i = 0; i < kWarmupSteps; ++i) replay();
  finish_step(device);
  AllocatorProbe probe(device);
  if (kernel_sum)
    kernel_sum_loop(state, device, replay);
  else
    step_loop(state, device, replay);
  probe.report(state);
  if (!on_cuda(device)) set_threads_counters(state);
  const StaticStats stats = fn.stats();
  label_warnings(state, device, stats);
  if (!check_replayed(state, stats, /*traces=*/1)) return;
  state.counters["arena_bytes"] = bytes_counter(stats.cache.at(0).arena_bytes);
  state.counters["steps"] = stats.cache.at(0).forward_steps + stats.cache.at(0).backward_steps;
}

// The static cases, on any device; `replay_mode` matters only on CUDA.
void char_lstm_static(benchmark::State& state, Device device, Replay replay_mode, bool kernel_sum) {
  GraphsSetting graphs(state, device, replay_mode);
  if (!graphs.ok()) return;
  auto step = make_char_lstm_step(device);
  auto fn = step->make_static();
  static_case(
      state, fn, [&] { fn(step->x(), step->t()); }, device, kernel_sum);
}
void tiny_gpt_static(benchmark::State& state, Device device, Replay replay_mode, bool kernel_sum) {
  GraphsSetting graphs(state, device, replay_mode);
  if (!graphs.ok()) return;
  auto step = make_tiny_gpt_step(device);
  auto fn = step->make_static();
  static_case(
      state, fn, [&] { fn(step->x(), step->t()); }, device, kernel_sum);
}
void cell_chain_static(benchmark::State& state, Device device, Replay replay_mode,
                       bool kernel_sum) {
  GraphsSetting graphs(state, device, replay_mode);
  if (!graphs.ok()) return;
  CellChain chain(device);
  auto fn = chain.make_static();
  static_case(
      state, fn, [&] { fn(chain.h0(), chain.c0()); }, device, kernel_sum);
}

void BM_CharLstmEager(benchmark::State& state) {
  auto step = make_char_lstm_step();
  eager_case(state, *step);
}
void BM_CharLstmStatic(benchmark::State& state) {
  char_lstm_static(state, Device::cpu(), Replay::Graphs, false);
}
void BM_TinyGptEager(benchmark::State& state) {
  auto step = make_tiny_gpt_step();
  eager_case(state, *step);
}
void BM_TinyGptStatic(benchmark::State& state) {
  tiny_gpt_static(state, Device::cpu(), Replay::Graphs, false);
}
void BM_LstmCellChainEager(benchmark::State& state) {
  CellChain chain;
  eager_case(state, chain);
}
void BM_LstmCellChainStatic(benchmark::State& state) {
  cell_chain_static(state, Device::cpu(), Replay::Graphs, false);
}

BENCHMARK(BM_CharLstmEager)->Name("CharLstm/eager")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CharLstmStatic)->Name("CharLstm/static")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TinyGptEager)->Name("TinyGpt/eager")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TinyGptStatic)->Name("TinyGpt/static")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LstmCellChainEager)
    ->Name("LstmCellChain/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LstmCellChainStatic)
    ->Name("LstmCellChain/static")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

#ifdef ENCORE_HAS_CUDA
using StaticFn = void (*)(benchmark::State&, Device, Replay, bool);

void add_sequence_cuda_cases(const std::string& room, std::function<void(benchmark::State&)> eager,
                             StaticFn run_static, benchmark::TimeUnit unit) {
  const Device cuda = Device::cuda();
  add_cuda_case(kSequenceOrder, room + "/eager/cuda", std::move(eager), unit);
  add_cuda_case(
      kSequenceOrder, room + "/static/cuda",
      [=](benchmark::State& s) { run_static(s, cuda, Replay::Graphs, false); }, unit);
  add_cuda_case(
      kSequenceOrder, room + "/static_nograph/cuda",
      [=](benchmark::State& s) { run_static(s, cuda, Replay::NoGraphs, false); }, unit);
  add_cuda_case(
      kKernelSumOrder, "KernelSum/" + room + "/cuda",
      [=](benchmark::State& s) { run_static(s, cuda, Replay::Graphs, true); }, unit);
}

[[maybe_unused]] const bool kCudaCasesAdded = [] {
  add_sequence_cuda_cases(
      "CharLstm",
      [](benchmark::State& s) {
        auto step = make_char_lstm_step(Device::cuda());
        eager_case(s, *step, Device::cuda());
      },
      char_lstm_static, benchmark::kMillisecond);
  add_sequence_cuda_cases(
      "TinyGpt",
      [](benchmark::State& s) {
        auto step = make_tiny_gpt_step(Device::cuda());
        eager_case(s, *step, Device::cuda());
      },
      tiny_gpt_static, benchmark::kMillisecond);
  add_sequence_cuda_cases(
      "LstmCellChain",
      [](benchmark::State& s) {
        CellChain chain(Device::cuda());
        eager_case(s, chain, Device::cuda());
      },
      cell_chain_static, benchmark::kMicrosecond);
  return true;
}();
#endif  // ENCORE_HAS_CUDA

}  // namespace
}  // namespace encore::bench
