// NvrtcCompile/N: what fusing costs a CUDA plan when its signature is traced: generating the
// CUDA source of a program of N elementwise instructions (a chain of add, mul by a scalar and tanh
// over two inputs, float32) and compiling it with NVRTC for sm_90 (host time; no GPU needed). A
// plan compiles all its new programs in one NVRTC program, so N stands for the instructions of
// all its runs; runs already compiled (a cell repeated in a model, a retrace) cost nothing.
#include <benchmark/benchmark.h>

#ifdef ENCORE_HAS_CUDA

#include "kernels/cuda/fused_source.h"
#include "kernels/cuda/nvrtc.h"
#include "runtime/fused.h"

namespace encore::bench {
namespace {

FusedProgram chain(int n) {
  FusedProgram p;
  p.dtype = DType::Float32;
  p.numel = 1 << 16;
  p.row = 256;
  p.n_in = 2;
  p.in_layout = {FusedLayout::Full, FusedLayout::Full};
  uint8_t value = 0;  // the register the chain's last value is in
  for (int t = 0; t < n; ++t) {
    FusedInstr ins;
    ins.op = t % 3 == 0 ? Op::Add : t % 3 == 1 ? Op::MulScalar : Op::Tanh;
    ins.a = value;
    ins.b = 1;
    ins.scalar = 0.5;
    const bool last = t + 1 == n;
    ins.out[0] = static_cast<uint8_t>(last ? p.out_reg(0) : p.scratch_reg(t % 2));
    value = ins.out[0];
    p.instrs.push_back(ins);
  }
  p.n_out = 1;
  p.out_instr.push_back({n - 1, 0});
  p.out_column.push_back(false);
  return p;
}

void BM_NvrtcCompile(benchmark::State& state) {
  if (const std::string& why = kernels::cuda::nvrtc_unavailable(); !why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  const FusedProgram p = chain(static_cast<int>(state.range(0)));
  size_t bytes = 0;
  for (auto _ : state) {
    const std::string cubin = kernels::cuda::nvrtc_compile(kernels::cuda::fused_source(p), 90);
    bytes = cubin.size();
    benchmark::DoNotOptimize(cubin.data());
  }
  state.counters["cubin_bytes"] = static_cast<double>(bytes);
}

BENCHMARK(BM_NvrtcCompile)
    ->Name("NvrtcCompile")
    ->Arg(1)
    ->Arg(16)
    ->Arg(128)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace encore::bench

#endif
