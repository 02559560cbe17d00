// MlpSmall/eager, MlpLarge/eager: one eager Adam training step of the 784-h-h-10 perceptron
// per iteration (forward, softmax cross entropy, zero_grad, backward, update) on inputs fixed
// before the loop. Compare with GemmBound/* (gemm_bound_bench.cc), the time of the same step's
// sgemm calls alone.
#include <benchmark/benchmark.h>

#include <cstdint>

#include "bench/bench_util.h"
#include "encore/encore.h"

namespace encore::bench {
namespace {

void BM_MlpEager(benchmark::State& state, int64_t hidden, int64_t batch) {
  manual_seed(0);
  auto model = nn::mlp(784, hidden, 10);
  optim::Adam opt(model->parameters());
  const Tensor x = rand({batch, 784});
  const Tensor labels = Tensor::empty({batch}, DType::Int32);
  int32_t* l = labels.data<int32_t>();
  for (int64_t i = 0; i < batch; ++i) l[i] = static_cast<int32_t>((i * 7) % 10);

  auto train_step = [&] {
    Tensor loss = F::softmax_cross_entropy((*model)(x), labels);
    model->zero_grad();
    loss.backward();
    opt.step();
  };
  // Warm-up: the first steps create the gradients and fill the allocator's cache.
  for (int i = 0; i < 3; ++i) train_step();

  AllocatorProbe probe;
  for (auto _ : state) train_step();
  probe.report(state);
  set_blas_threads_counter(state);
}

BENCHMARK_CAPTURE(BM_MlpEager, small, 100, 32)
    ->Name("MlpSmall/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpEager, large, 1000, 100)
    ->Name("MlpLarge/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace encore::bench
