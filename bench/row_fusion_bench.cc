// SoftmaxRows/static{,_unfused}: the elementwise part of attention on the cpu, fused by rows or
// not. Scores [64, 512] (float32, 128 KiB) requiring grad are scaled, masked by keys (a row
// broadcast over the rows) and go through a softmax over the last axis; the loss multiplies the
// probabilities by fixed weights and sums them. Fused, the forward is one step (scale, mask,
// softmax, product and sum) and the backward's softmax_grad runs with its neighbours.
//
// CausalSoftmax/static{,_unfused}: attention's scale, causal mask and softmax over TinyGpt's
// scores [16, 4, 64, 64] (float32, 1 MiB), the mask [64, 64] made in the function (a constant of
// the plan, read as a tile of the scores); the loss multiplies the probabilities by fixed weights
// and sums them. Fused, the scale, mask and softmax are one step, and their gradients one.
//
// CentredRows/static{,_unfused}: h = x * gain + bias (gain and bias one row each, broadcast over
// the rows), h - mean(h, -1, keepdims), relu, over [256, 1024] float32 (1 MiB per tensor, past
// L2 on most machines): memory traffic rather than exp.
#include <benchmark/benchmark.h>

#include <limits>

#include "bench/bench_util.h"
#include "encore/encore.h"
#include "encore/static_graph.h"

namespace encore::bench {
namespace {

// f(x) and its backward after three untimed calls (trace, first backward, a warm replay), then
// per iteration; the run fails unless every call but the first replayed. `steps`: the schedule's.
template <typename Static>
void measure(benchmark::State& state, Static& f, Tensor& x) {
  for (int i = 0; i < 3; ++i) {
    f(x).backward();
    x.set_grad(Tensor());
  }
  for (auto _ : state) {
    f(x).backward();
    x.set_grad(Tensor());
  }
  const StaticStats stats = f.stats();
  if (!check_replayed(state, stats, /*traces=*/1)) return;
  state.counters["steps"] = stats.cache[0].forward_steps + stats.cache[0].backward_steps;
}

void BM_SoftmaxRows(benchmark::State& state, bool fuse) {
  const bool previous = set_static_fusion_enabled(fuse);
  Tensor x = rand({64, 512}, DType::Float32, Device::cpu(), -2, 2).set_requires_grad();
  const Tensor mask = rand({512}, DType::Float32, Device::cpu(), -1, 0);
  const Tensor w = rand({64, 512}, DType::Float32, Device::cpu(), 0, 1);
  auto f = static_graph(
      [&](const Tensor& s) {
        return F::sum(F::mul(F::softmax(F::add(F::mul(s, 0.125), mask), -1), w));
      },
      {.name = fuse ? "softmax_rows" : "softmax_rows_unfused"});
  measure(state, f, x);
  set_static_fusion_enabled(previous);
}
BENCHMARK_CAPTURE(BM_SoftmaxRows, fused, true)
    ->Name("SoftmaxRows/static")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_SoftmaxRows, unfused, false)
    ->Name("SoftmaxRows/static_unfused")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

void BM_CausalSoftmax(benchmark::State& state, bool fuse) {
  const bool previous = set_static_fusion_enabled(fuse);
  constexpr int64_t kT = 64;
  Tensor x = rand({16, 4, kT, kT}, DType::Float32, Device::cpu(), -2, 2).set_requires_grad();
  const Tensor w = rand({16, 4, kT, kT}, DType::Float32, Device::cpu(), 0, 1);
  auto f = static_graph(
      [&](const Tensor& s) {
        const Tensor rows = F::reshape(arange(kT), {kT, 1}), cols = F::reshape(arange(kT), {1, kT});
        const Tensor masked = F::masked_fill(F::mul(s, 0.125), F::greater(cols, rows),
                                             -std::numeric_limits<double>::infinity());
        return F::sum(F::mul(F::softmax(masked, -1), w));
      },
      {.name = fuse ? "causal_softmax" : "causal_softmax_unfused"});
  measure(state, f, x);
  set_static_fusion_enabled(previous);
}
BENCHMARK_CAPTURE(BM_CausalSoftmax, fused, true)
    ->Name("CausalSoftmax/static")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CausalSoftmax, unfused, false)
    ->Name("CausalSoftmax/static_unfused")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

void BM_CentredRows(benchmark::State& state, bool fuse) {
  const bool previous = set_static_fusion_enabled(fuse);
  Tensor x = rand({256, 1024}, DType::Float32, Device::cpu(), -2, 2).set_requires_grad();
  const Tensor gain = rand({1024}, DType::Float32, Device::cpu(), 0.5, 1.5);
  const Tensor bias = rand({1024}, DType::Float32, Device::cpu(), -1, 1);
  auto f = static_graph(
      [&](const Tensor& s) {
        const Tensor h = F::add(F::mul(s, gain), bias);
        return F::sum(F::relu(F::sub(h, F::mean(h, {-1}, true))));
      },
      {.name = fuse ? "centred_rows" : "centred_rows_unfused"});
  measure(state, f, x);
  set_static_fusion_enabled(previous);
}
BENCHMARK_CAPTURE(BM_CentredRows, fused, true)
    ->Name("CentredRows/static")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CentredRows, unfused, false)
    ->Name("CentredRows/static_unfused")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace encore::bench
