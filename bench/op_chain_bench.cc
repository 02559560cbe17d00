// OpChain/eager, OpChain/static: the fixed cost of one op with autograd on. A chain of kChainOps
// cheap elementwise ops on an 8-element float32 tensor that requires grad, then sum and
// backward. The data are tiny but the kernels still show: while tanh called libm's scalar
// tanhf, it was half of the static replay. Eager, the time is dispatch, autograd recording,
// allocation and the backward engine; static, the chain and its sum are one static function, so
// the time is the replay of its forward and backward schedules.
#include <benchmark/benchmark.h>

#include <chrono>

#include "bench/bench_util.h"
#include "encore/encore.h"
#include "encore/static_graph.h"

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

// The whole chain and its sum: the loss whose backward an iteration runs.
Tensor chain_sum(const Tensor& x, const Tensor& w) {
  Tensor y = x;
  for (int i = 0; i < kChainOps; ++i) y = chain_op(i, y, w);
  return F::sum(y);
}

// The chain's input x (requires grad) and its tensor-tensor operand w (no grad).
struct ChainInputs {
  Tensor x = rand({8}, DType::Float32, Device::cpu(), -1, 1).set_requires_grad();
  Tensor w = rand({8}, DType::Float32, Device::cpu(), 0.5, 1.5);
};

// Times `iteration` (forward, backward and clearing x's gradient) after `warmup` untimed calls
// and reports it per op.
template <typename Iteration>
void time_chain(benchmark::State& state, int warmup, Iteration&& iteration) {
  for (int i = 0; i < warmup; ++i) iteration();

  AllocatorProbe probe;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) iteration();
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

void BM_OpChainEager(benchmark::State& state) {
  ChainInputs in;
  time_chain(state, /*warmup=*/1, [&] {  // warm the allocator's cache
    chain_sum(in.x, in.w).backward();
    in.x.set_grad(Tensor());
  });
}
BENCHMARK(BM_OpChainEager)->Name("OpChain/eager")->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_OpChainStatic(benchmark::State& state) {
  ChainInputs in;
  StaticOptions options;
  options.name = "op_chain";
  options.arg_names = {"x"};
  auto chain = static_graph([&in](const Tensor& x) { return chain_sum(x, in.w); }, options);
  // Warm-up: the first call traces the forward and its backward the backward; two replays
  // warm the allocator's cache.
  time_chain(state, /*warmup=*/3, [&] {
    chain(in.x).backward();
    in.x.set_grad(Tensor());
  });
  check_replayed(state, chain.stats(), /*traces=*/1);
}
BENCHMARK(BM_OpChainStatic)->Name("OpChain/static")->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace encore::bench
