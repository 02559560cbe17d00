// GemmBound/CharLstm, GemmBound/TinyGpt: the lower bound of one training step of the sequence
// models of sequence_bench.cc: exactly the matrix products the step performs, as whole sgemm
// calls on preallocated buffers, one OpenBLAS thread. flops counts 2*M*N*K per product; GFLOPS
// is the sgemm throughput of this run, so flops / GFLOPS is the time shown.
//
// CharLstm (B 32, T 35, embedding 64, hidden 256, vocabulary 96; R = B*T rows):
//   forward:  every step's input projection [R,64]x[64,1024]; per step but the first (a zero
//             state needs none) h W_hh^T [32,256]x[256,1024]; the head [R,256]x[256,96]
//   backward: per linear its weight gradient dY^T X and its input gradient dY W (the embedding's
//             output needs one too)
// TinyGpt (B 16, T 64, width 128, 4 heads of 32, vocabulary 96; R = B*T rows), per block:
//   q,k,v [R,128]x[128,384]; per batch and head q k^T [64,32]x[32,64] and p v [64,64]x[64,32];
//   the output projection [R,128]x[128,128]; the MLP [R,128]x[128,512], [R,512]x[512,128]; then
//   the head [R,128]x[128,96]; backward: two products per product of the forward.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bench/bench_util.h"
#include "bench/sequence_step.h"

namespace encore::bench {
namespace {

// C[m,n] = op(A) op(B), `count` times.
struct Gemm {
  int m, n, k;
  bool ta, tb;
  int count;
};

// A linear layer x [rows, in] -> [rows, out]: its forward product and, backward, its weight
// gradient and (when `dx`) its input gradient.
void add_linear(std::vector<Gemm>& g, int rows, int in, int out, bool dx, int count = 1) {
  g.push_back({rows, out, in, false, true, count});
  g.push_back({out, in, rows, true, false, count});
  if (dx) g.push_back({rows, in, out, false, false, count});
}

// A batched product [batch; m,k]x[batch; k,n] and its two gradients.
void add_batched(std::vector<Gemm>& g, int batch, int m, int n, int k) {
  g.push_back({m, n, k, false, false, batch});
  g.push_back({m, k, n, false, true, batch});  // dA = dC B^T
  g.push_back({k, n, m, true, false, batch});  // dB = A^T dC
}

std::vector<Gemm> char_lstm_gemms() {
  const int b = kCharLstmBatch, t = kCharLstmSteps, e = kCharLstmEmbed, h = kCharLstmHidden;
  const int g4 = 4 * h, rows = b * t, v = kCharVocab;
  std::vector<Gemm> g;
  add_linear(g, rows, e, g4, /*dx=*/true);
  add_linear(g, b, h, g4, /*dx=*/true, t - 1);
  add_linear(g, rows, h, v, /*dx=*/true);
  return g;
}

std::vector<Gemm> tiny_gpt_gemms() {
  const int rows = kTinyGptBatch * kTinyGptContext, w = kTinyGptWidth, t = kTinyGptContext;
  const int heads = kTinyGptBatch * kTinyGptHeads, d = kTinyGptWidth / kTinyGptHeads;
  std::vector<Gemm> g;
  for (int block = 0; block < kTinyGptBlocks; ++block) {
    add_linear(g, rows, w, 3 * w, /*dx=*/true);
    add_batched(g, heads, t, t, d);  // q k^T
    add_batched(g, heads, t, d, t);  // p v
    add_linear(g, rows, w, w, /*dx=*/true);
    add_linear(g, rows, w, 4 * w, /*dx=*/true);
    add_linear(g, rows, 4 * w, w, /*dx=*/true);
  }
  add_linear(g, rows, w, kCharVocab, /*dx=*/true);
  return g;
}

void BM_SequenceGemmBound(benchmark::State& state, std::vector<Gemm> gemms) {
  size_t a_size = 0, b_size = 0, c_size = 0;
  double flops = 0;
  for (const Gemm& g : gemms) {
    a_size = std::max(a_size, static_cast<size_t>(g.m) * static_cast<size_t>(g.k));
    b_size = std::max(b_size, static_cast<size_t>(g.k) * static_cast<size_t>(g.n));
    c_size = std::max(c_size, static_cast<size_t>(g.m) * static_cast<size_t>(g.n));
    flops += 2.0 * g.m * g.n * g.k * g.count;
  }
  std::vector<float> a(a_size, 0.01f), b(b_size, 0.02f), c(c_size);
  auto step = [&] {
    for (const Gemm& g : gemms)
      for (int i = 0; i < g.count; ++i)
        cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans,
                    g.tb ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, 1.f, a.data(),
                    g.ta ? g.m : g.k, b.data(), g.tb ? g.k : g.n, 0.f, c.data(), g.n);
  };
  step();
  for (auto _ : state) step();
  state.counters["flops"] = flops;
  state.counters["GFLOPS"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_threads_counters(state);
}

BENCHMARK_CAPTURE(BM_SequenceGemmBound, char_lstm, char_lstm_gemms())
    ->Name("GemmBound/CharLstm")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SequenceGemmBound, tiny_gpt, tiny_gpt_gemms())
    ->Name("GemmBound/TinyGpt")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace encore::bench
