// CharLstm/eager, CharLstm/static: one Adam training step of the character LSTM (bench/
// sequence_step.h) per iteration, eager or replayed as one static function. TinyGpt/eager,
// TinyGpt/static: the same for the small GPT with AdamW. LstmCellChain/eager,
// LstmCellChain/static: forward and backward through 35 steps of one LSTMCell at batch 1 (the
// small-op regime: every op is a few hundred elements). Compare with GemmBound/CharLstm and
// GemmBound/TinyGpt (gemm_bound_sequence_bench.cc).
#include <benchmark/benchmark.h>

#include "bench/bench_util.h"
#include "bench/sequence_step.h"

namespace encore::bench {
namespace {

constexpr int kWarmupSteps = 3;

template <typename Step>
void eager_case(benchmark::State& state, Step& step) {
  for (int i = 0; i < kWarmupSteps; ++i) step.run();
  AllocatorProbe probe;
  for (auto _ : state) step.run();
  probe.report(state);
  set_threads_counters(state);
}

// `replay()` after the warm-up; the run fails unless every measured call replayed.
template <typename Static, typename Replay>
void static_case(benchmark::State& state, Static& fn, Replay replay) {
  for (int i = 0; i < kWarmupSteps; ++i) replay();
  AllocatorProbe probe;
  for (auto _ : state) replay();
  probe.report(state);
  set_threads_counters(state);
  const StaticStats stats = fn.stats();
  if (!check_replayed(state, stats, /*traces=*/1)) return;
  state.counters["arena_bytes"] = bytes_counter(stats.cache.at(0).arena_bytes);
  state.counters["steps"] =
      stats.cache.at(0).forward_steps + stats.cache.at(0).backward_steps;
}

void BM_CharLstmEager(benchmark::State& state) {
  auto step = make_char_lstm_step();
  eager_case(state, *step);
}
void BM_CharLstmStatic(benchmark::State& state) {
  auto step = make_char_lstm_step();
  auto fn = step->make_static();
  static_case(state, fn, [&] { fn(step->x(), step->t()); });
}
void BM_TinyGptEager(benchmark::State& state) {
  auto step = make_tiny_gpt_step();
  eager_case(state, *step);
}
void BM_TinyGptStatic(benchmark::State& state) {
  auto step = make_tiny_gpt_step();
  auto fn = step->make_static();
  static_case(state, fn, [&] { fn(step->x(), step->t()); });
}
void BM_LstmCellChainEager(benchmark::State& state) {
  CellChain chain;
  eager_case(state, chain);
}
void BM_LstmCellChainStatic(benchmark::State& state) {
  CellChain chain;
  auto fn = chain.make_static();
  static_case(state, fn, [&] { fn(chain.h0(), chain.c0()); });
}

BENCHMARK(BM_CharLstmEager)->Name("CharLstm/eager")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CharLstmStatic)
    ->Name("CharLstm/static")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
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

}  // namespace
}  // namespace encore::bench
