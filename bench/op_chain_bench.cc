// OpChain/eager: the fixed cost of one eager op with autograd on. A chain of kChainOps cheap
// elementwise ops on an 8-element float32 tensor that requires grad, then sum and backward;
// the data are too small for the kernels to matter, so the time is dispatch, autograd
// recording, allocation and the backward engine.
#include <benchmark/benchmark.h>

#include <chrono>

#include "bench/bench_util.h"
#include "encore/encore.h"

namespace encore::bench {
namespace {

constexpr int kChainOps = 100;

// One link of the chain; cycles through scalar and tensor-tensor ops. tanh keeps the values
// bounded over any length.
Tensor chain_op(int i, const Tensor& y, const Tensor& w) {
  switch (i % 5) {
    case 0:
      return F::mul(y, 0.9);
    case 1:
      return F::add(y, 0.1);
    case 2:
      return F::mul(y, w);
    case 3:
      return F::tanh(y);
    default:
      return F::sub(y, 0.05);
  }
}

void BM_OpChainEager(benchmark::State& state) {
  Tensor x = rand({8}, DType::Float32, Device::cpu(), -1, 1).set_requires_grad();
  const Tensor w = rand({8}, DType::Float32, Device::cpu(), 0.5, 1.5);  // no grad
  auto run_chain = [&] {
    Tensor y = x;
    for (int i = 0; i < kChainOps; ++i) y = chain_op(i, y, w);
    F::sum(y).backward();
    x.set_grad(Tensor());
  };
  run_chain();  // warm the allocator's cache

  AllocatorProbe probe;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) run_chain();
  const std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
  probe.report(state);

  state.SetItemsProcessed(state.iterations() * kChainOps);
  // Wall time per op, forward and backward together. (A kInvert rate counter would print
  // with a misleading "s" suffix.)
  state.counters["per_op_ns"] =
      elapsed.count() / static_cast<double>(state.iterations() * kChainOps);
  state.counters["allocs_per_op"] = state.counters["allocs_per_iter"].value / kChainOps;
  state.counters.erase("peak_bytes");
}
BENCHMARK(BM_OpChainEager)->Name("OpChain/eager")->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace encore::bench
