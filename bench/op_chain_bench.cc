// OpChain/eager, OpChain/static: the fixed cost of one op with autograd on. A chain of kChainOps
// cheap elementwise ops on an 8-element float32 tensor that requires grad, then sum and
// backward. The data are tiny but the kernels still show: while tanh called libm's scalar
// tanhf, it was half of the static replay. Eager, the time is dispatch, autograd recording,
// allocation and the backward engine; static, the chain and its sum are one static function, so
// the time is the replay of its forward and backward schedules.
//
// With a GPU (registered at run time, see bench_util.h): OpChain/eager/cuda, static/cuda,
// static_nograph/cuda and KernelSum/OpChain/cuda, the same chain on Device::cuda(); there every
// op is at least one kernel launch, which is what CUDA graphs save.
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

// The chain's input x (requires grad) and its tensor-tensor operand w (no grad), drawn on the
// host and copied to `device`.
struct ChainInputs {
  explicit ChainInputs(Device device = Device::cpu(), int64_t n = 8)
      : x(rand({n}, DType::Float32, Device::cpu(), -1, 1).to(device).set_requires_grad()),
        w(rand({n}, DType::Float32, Device::cpu(), 0.5, 1.5).to(device)) {}
  Tensor x, w;
};

// Times `iteration` (forward, backward and clearing x's gradient; on CUDA then a synchronize)
// after `warmup` untimed calls and reports it per op.
template <typename Iteration>
void time_chain(benchmark::State& state, Device device, int warmup, Iteration&& iteration) {
  for (int i = 0; i < warmup; ++i) iteration();
  finish_step(device);

  AllocatorProbe probe(device);
  const auto start = std::chrono::steady_clock::now();
  step_loop(state, device, iteration);
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

void BM_OpChainEager(benchmark::State& state, Device device) {
  ChainInputs in(device);
  time_chain(state, device, /*warmup=*/1, [&] {  // warm the allocator's cache
    chain_sum(in.x, in.w).backward();
    in.x.set_grad(Tensor());
  });
}
BENCHMARK_CAPTURE(BM_OpChainEager, cpu, Device::cpu())
    ->Name("OpChain/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The chain and its sum as one static function of x.
auto make_static_chain(ChainInputs& in) {
  StaticOptions options;
  options.name = "op_chain";
  options.arg_names = {"x"};
  return static_graph([&in](const Tensor& x) { return chain_sum(x, in.w); }, options);
}

void BM_OpChainStatic(benchmark::State& state, Device device, Replay replay) {
  GraphsSetting graphs(state, device, replay);
  if (!graphs.ok()) return;
  ChainInputs in(device);
  auto chain = make_static_chain(in);
  // Warm-up: the first call traces the forward and its backward the backward; two replays
  // warm the allocator's cache.
  time_chain(state, device, /*warmup=*/3, [&] {
    chain(in.x).backward();
    in.x.set_grad(Tensor());
  });
  label_warnings(state, device, chain.stats());
  check_replayed(state, chain.stats(), /*traces=*/1);
}
BENCHMARK_CAPTURE(BM_OpChainStatic, cpu, Device::cpu(), Replay::Graphs)
    ->Name("OpChain/static")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The static chain on the cpu with elementwise fusion on (1) or off (0) while it is traced, over
// `n` elements: OpChain/static_unfused (8 elements) shows what fusion adds to the fixed
// cost per op; ElementwiseChain/static{,_unfused} (65,536 elements, 256 KiB per tensor) what it
// saves in memory traffic once the data leave L1.
void BM_ChainFusion(benchmark::State& state, bool fuse, int64_t n) {
  const bool previous = set_static_fusion_enabled(fuse);
  ChainInputs in(Device::cpu(), n);
  auto chain = make_static_chain(in);
  time_chain(state, Device::cpu(), /*warmup=*/3, [&] {
    chain(in.x).backward();
    in.x.set_grad(Tensor());
  });
  set_static_fusion_enabled(previous);
  const StaticStats stats = chain.stats();
  if (!check_replayed(state, stats, /*traces=*/1)) return;
  state.counters["steps"] = stats.cache[0].forward_steps + stats.cache[0].backward_steps;
  state.counters["arena_bytes"] = static_cast<double>(stats.cache[0].arena_bytes);
}
BENCHMARK_CAPTURE(BM_ChainFusion, unfused_8, false, 8)
    ->Name("OpChain/static_unfused")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ChainFusion, fused_64k, true, 1 << 16)
    ->Name("ElementwiseChain/static")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ChainFusion, unfused_64k, false, 1 << 16)
    ->Name("ElementwiseChain/static_unfused")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

#ifdef ENCORE_HAS_CUDA
// KernelSum/OpChain/cuda: the OpChain/static/cuda iteration replayed under the profiler (see
// kernel_sum_loop() for the counters; kernel_us is per chain, forward and backward).
void BM_OpChainKernelSum(benchmark::State& state) {
  const Device device = Device::cuda();
  ChainInputs in(device);
  auto chain = make_static_chain(in);
  auto iteration = [&] {
    chain(in.x).backward();
    in.x.set_grad(Tensor());
  };
  for (int i = 0; i < 3; ++i) iteration();
  finish_step(device);
  kernel_sum_loop(state, device, iteration);
  label_warnings(state, device, chain.stats());
  check_replayed(state, chain.stats(), /*traces=*/1);
}

[[maybe_unused]] const bool kCudaCasesAdded = [] {
  const Device cuda = Device::cuda();
  const auto us = benchmark::kMicrosecond;
  add_cuda_case(
      kOpChainOrder, "OpChain/eager/cuda", [=](benchmark::State& s) { BM_OpChainEager(s, cuda); },
      us);
  add_cuda_case(
      kOpChainOrder, "OpChain/static/cuda",
      [=](benchmark::State& s) { BM_OpChainStatic(s, cuda, Replay::Graphs); }, us);
  add_cuda_case(
      kOpChainOrder, "OpChain/static_nograph/cuda",
      [=](benchmark::State& s) { BM_OpChainStatic(s, cuda, Replay::NoGraphs); }, us);
  add_cuda_case(kKernelSumOrder, "KernelSum/OpChain/cuda", BM_OpChainKernelSum, us);
  return true;
}();
#endif  // ENCORE_HAS_CUDA

}  // namespace
}  // namespace encore::bench
