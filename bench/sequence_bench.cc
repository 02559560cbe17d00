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

// An eager case: make(device) gives the step (sequence_step.h), run() per iteration.
template <typename Make>
void eager_case(benchmark::State& state, Device device, Make make) {
  auto step = make(device);
  measure_steps(state, device, kWarmupSteps, /*kernel_sum=*/false, [&] { step->run(); });
}

// A static case: the step's static function replayed on its data after the warm-up, measured per
// step or, with `kernel_sum`, by kernel_sum_loop(); `replay_mode` matters only on CUDA. The run
// fails unless every measured call replayed.
template <typename Make>
void static_case(benchmark::State& state, Device device, Replay replay_mode, bool kernel_sum,
                 Make make) {
  GraphsSetting graphs(state, device, replay_mode);
  if (!graphs.ok()) return;
  auto step = make(device);
  auto fn = step->make_static();
  measure_steps(state, device, kWarmupSteps, kernel_sum, [&] { step->replay(fn); });
  const StaticStats stats = fn.stats();
  label_warnings(state, device, stats);
  if (!check_replayed(state, stats, /*traces=*/1)) return;
  state.counters["arena_bytes"] = bytes_counter(stats.cache.at(0).arena_bytes);
  state.counters["steps"] = stats.cache.at(0).forward_steps + stats.cache.at(0).backward_steps;
}

template <typename Make>
void BM_Eager(benchmark::State& state, Make make) {
  eager_case(state, Device::cpu(), make);
}
template <typename Make>
void BM_Static(benchmark::State& state, Make make) {
  static_case(state, Device::cpu(), Replay::Graphs, /*kernel_sum=*/false, make);
}

BENCHMARK_CAPTURE(BM_Eager, char_lstm, make_char_lstm_step)
    ->Name("CharLstm/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Static, char_lstm, make_char_lstm_step)
    ->Name("CharLstm/static")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Eager, tiny_gpt, make_tiny_gpt_step)
    ->Name("TinyGpt/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Static, tiny_gpt, make_tiny_gpt_step)
    ->Name("TinyGpt/static")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Eager, cell_chain, make_cell_chain)
    ->Name("LstmCellChain/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Static, cell_chain, make_cell_chain)
    ->Name("LstmCellChain/static")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

#ifdef ENCORE_HAS_CUDA
// <room>/eager/cuda, static/cuda, static_nograph/cuda and KernelSum/<room>/cuda.
template <typename Make>
void add_sequence_cuda_cases(const std::string& room, Make make, benchmark::TimeUnit unit) {
  const Device cuda = Device::cuda();
  add_cuda_case(
      kSequenceOrder, room + "/eager/cuda", [=](benchmark::State& s) { eager_case(s, cuda, make); },
      unit);
  add_cuda_case(
      kSequenceOrder, room + "/static/cuda",
      [=](benchmark::State& s) { static_case(s, cuda, Replay::Graphs, false, make); }, unit);
  add_cuda_case(
      kSequenceOrder, room + "/static_nograph/cuda",
      [=](benchmark::State& s) { static_case(s, cuda, Replay::NoGraphs, false, make); }, unit);
  add_cuda_case(
      kKernelSumOrder, "KernelSum/" + room + "/cuda",
      [=](benchmark::State& s) { static_case(s, cuda, Replay::Graphs, true, make); }, unit);
}

[[maybe_unused]] const bool kCudaCasesAdded = [] {
  add_sequence_cuda_cases("CharLstm", make_char_lstm_step, benchmark::kMillisecond);
  add_sequence_cuda_cases("TinyGpt", make_tiny_gpt_step, benchmark::kMillisecond);
  add_sequence_cuda_cases("LstmCellChain", make_cell_chain, benchmark::kMicrosecond);
  return true;
}();
#endif  // ENCORE_HAS_CUDA

}  // namespace
}  // namespace encore::bench
