// GemmBound/MlpSmall, GemmBound/MlpLarge: the lower bound of an Adam step of the perceptron,
// exactly the sgemm calls the step performs, on preallocated buffers:
//   forward, per layer:      Y[B,out] = X[B,in] W^T        (W stored [out,in], row-major)
//   backward, per layer:     dW[out,in] = dY^T X
//                            dX[B,in]   = dY W              (not for the first layer: the
//                                                            input needs no gradient)
// flops counts 2*M*N*K per call; GFLOPS is the sgemm throughput of this run, so flops / GFLOPS
// is the time shown. Whole products on one OpenBLAS thread (encore sets OpenBLAS to one thread
// and splits products itself): the bound of the one-thread cases.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdint>
#include <vector>

#include "bench/bench_util.h"

namespace encore::bench {
namespace {

// One Linear layer's buffers, row-major: W and dW [out,in], Y and dY [B,out], dX [B,in].
struct Layer {
  Layer(int batch, int in, int out, bool needs_dx)
      : in(in),
        out(out),
        w(size(out, in), 0.01f),
        dw(size(out, in)),
        y(size(batch, out)),
        dy(size(batch, out), 1e-3f),
        dx(needs_dx ? size(batch, in) : 0) {}
  static size_t size(int rows, int cols) {
    return static_cast<size_t>(rows) * static_cast<size_t>(cols);
  }

  int in, out;
  std::vector<float> w, dw, y, dy, dx;
};

void BM_GemmBound(benchmark::State& state, int hidden, int batch) {
  const int widths[] = {784, hidden, hidden, 10};
  const int b = batch;
  std::vector<float> x0(Layer::size(b, 784), 0.5f);
  std::vector<Layer> layers;
  double flops = 0;
  for (int i = 0; i < 3; ++i) {
    const int in = widths[i], out = widths[i + 1];
    layers.emplace_back(b, in, out, /*needs_dx=*/i > 0);
    flops += 2.0 * b * in * out * (i > 0 ? 3 : 2);
  }

  auto step = [&] {
    const float* x = x0.data();
    for (Layer& l : layers) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, l.out, l.in, 1.f, x, l.in, l.w.data(),
                  l.in, 0.f, l.y.data(), l.out);
      x = l.y.data();
    }
    for (int i = 2; i >= 0; --i) {
      Layer& l = layers[static_cast<size_t>(i)];
      const float* in = i > 0 ? layers[static_cast<size_t>(i) - 1].y.data() : x0.data();
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, l.out, l.in, b, 1.f, l.dy.data(), l.out,
                  in, l.in, 0.f, l.dw.data(), l.in);
      if (i > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, l.in, l.out, 1.f, l.dy.data(),
                    l.out, l.w.data(), l.in, 0.f, l.dx.data(), l.in);
    }
  };
  step();  // start OpenBLAS's threads

  for (auto _ : state) step();

  state.counters["flops"] = flops;
  state.counters["GFLOPS"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_threads_counters(state);
}

BENCHMARK_CAPTURE(BM_GemmBound, small, 100, 32)
    ->Name("GemmBound/MlpSmall")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GemmBound, large, 1000, 100)
    ->Name("GemmBound/MlpLarge")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace encore::bench
