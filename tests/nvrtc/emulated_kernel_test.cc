// The generated CUDA kernels run on the host (emulated_kernel.h: the host compiler, each CUDA
// thread a fiber, the warp's shuffles at barriers) against a reference computed here in double:
// each CUDA row op between elementwise steps reading every layout, over rows shorter and longer
// than a warp, over two blocks whose grid-stride loop comes round again; and an elementwise kernel
// with where and a tile. This checks what the kernels compute where (indices, layouts, folds, the
// lane that writes a value per row); the [cuda] tests check the device's bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "runtime/fused.h"
#include "tests/nvrtc/emulated_kernel.h"
#include "tests/nvrtc/row_programs.h"

using namespace encore;
using testing::around;
using testing::EmulatedKernels;
using testing::kRowOps;

namespace {

using Rows = std::vector<std::vector<double>>;

// A buffer of n values of T, filled from `values` (converted) or zeros.
struct Buffer {
  std::vector<float> f;
  std::vector<double> d;
  bool is_double;
  Buffer(DType dtype, size_t n) : is_double(dtype == DType::Float64) {
    (is_double ? d.resize(n) : f.resize(n));
  }
  void* data() { return is_double ? static_cast<void*>(d.data()) : static_cast<void*>(f.data()); }
  void set(size_t i, double v) { is_double ? void(d[i] = v) : void(f[i] = static_cast<float>(v)); }
  double get(size_t i) const { return is_double ? d[i] : f[i]; }
};

// A value the reference computed, and a bound on the magnitudes it was computed from: rounding
// errors of the kernel's order of operations stay within a few ulps of that bound (a sum or a dot
// product that cancels can come out near 0 with an error of its terms' size).
struct Want {
  double value, scale;
};
using WantRows = std::vector<std::vector<Want>>;

// The reference of around(op, ...)'s outputs over rows h (double): op's outputs, then op's first
// output times 2, each a value per element or per row.
std::vector<WantRows> reference(Op op, uint8_t affine, const Rows& h, const Rows& gy,
                                const std::vector<double>& gamma, const std::vector<double>& beta) {
  const size_t rows = h.size(), c = h[0].size();
  std::vector<WantRows> out(op == Op::LayerNorm ? 3 : 1, WantRows(rows));
  for (size_t r = 0; r < rows; ++r) {
    const std::vector<double>& x = h[r];
    double max = -INFINITY, sum = 0, dot = 0, size = 0;  // size: sum of the terms' magnitudes
    for (double v : x) max = std::max(max, v), sum += v, size += std::abs(v);
    std::vector<Want>& y = out[0][r];
    switch (op) {
      case Op::Softmax:
      case Op::LogSoftmax: {
        double s = 0;
        for (double v : x) s += std::exp(v - max);
        for (double v : x) {
          const double w = op == Op::Softmax ? std::exp(v - max) / s : v - max - std::log(s);
          y.push_back({w, std::abs(v) + std::abs(max) + std::abs(std::log(s)) + 1});
        }
        break;
      }
      case Op::SoftmaxGrad:
        for (size_t k = 0; k < c; ++k) dot += gy[r][k] * x[k], size += std::abs(gy[r][k] * x[k]);
        for (size_t k = 0; k < c; ++k)
          y.push_back({x[k] * (gy[r][k] - dot), std::abs(x[k]) * (std::abs(gy[r][k]) + size)});
        break;
      case Op::LogSoftmaxGrad:
        for (size_t k = 0; k < c; ++k) dot += gy[r][k], size += std::abs(gy[r][k]);
        for (size_t k = 0; k < c; ++k)
          y.push_back({gy[r][k] - std::exp(x[k]) * dot,
                       std::abs(gy[r][k]) + std::exp(x[k]) * (std::abs(dot) + size)});
        break;
      case Op::LayerNorm: {
        const double mean = sum / c;
        double var = 0;
        for (double v : x) var += (v - mean) * (v - mean);
        const double rstd = 1 / std::sqrt(var / c + 1e-5);
        for (size_t k = 0; k < c; ++k) {
          const double g = affine & kLayerNormGamma ? gamma[k] : 1;
          const double b = affine & kLayerNormBeta ? beta[k] : 0;
          const double h = (x[k] - mean) * rstd;
          y.push_back(
              {h * g + b, (std::abs(x[k]) + size / c) * rstd * (std::abs(g) + 1) + std::abs(b)});
        }
        out[1][r] = {{mean, size / c}};
        out[2][r] = {{rstd, rstd}};
        break;
      }
      case Op::Sum:
        y = {{sum, size}};
        break;
      case Op::Mean:
        y = {{sum / c, size / c}};
        break;
      default:
        y = {{max, std::abs(max)}};
    }
  }
  WantRows twice(rows);
  for (size_t r = 0; r < rows; ++r)
    for (size_t k = 0; k < c; ++k) {
      const Want& w = out[0][r][out[0][r].size() == 1 ? 0 : k];
      twice[r].push_back({2 * w.value, 2 * w.scale});
    }
  out.push_back(twice);
  return out;
}

}  // namespace

TEST_CASE("generated row kernels compute each row op over the rows the program reads (emulated)",
          "[nvrtc][emulated]") {
  std::mt19937 rng(29);
  std::uniform_real_distribution<double> uniform(-2, 2);
  const int64_t rows = 19;  // two blocks of 8 warps: rows 16 to 18 on the loop's second round
  struct Case {
    Op op;
    DType dtype;
    int64_t c;
    uint8_t affine;
  };
  std::vector<Case> cases;
  std::vector<FusedProgram> programs;
  for (Op op : kRowOps)
    for (DType dtype : {DType::Float32, DType::Float64})
      for (int n = 0; n < 4; ++n) {
        const int64_t c = std::array<int64_t, 4>{5, 40, 64, 100}[n];
        // layer_norm: no gamma nor beta, gamma, beta, both.
        const uint8_t affine = op == Op::LayerNorm ? static_cast<uint8_t>(n) : 0;
        cases.push_back({op, dtype, c, affine});
        programs.push_back(around(op, dtype, c, affine, rows));
      }
  const EmulatedKernels kernels(programs);
  for (size_t program = 0; program < cases.size(); ++program) {
    const auto [op, dtype, c, affine] = cases[program];
    const FusedProgram& p = programs[program];
    INFO(op_name(op) << " " << name(dtype) << " rows of " << c << " affine " << int{affine});
    // Inputs: x, w (one row), b (one per row), a [4, c] tile, gy, gamma, beta.
    const size_t sizes[] = {size_t(rows * c), size_t(c), size_t(rows), size_t(4 * c),
                            size_t(rows * c), size_t(c), size_t(c)};
    std::vector<Buffer> in;
    for (size_t n : sizes) {
      in.emplace_back(dtype, n);
      for (size_t i = 0; i < n; ++i) in.back().set(i, uniform(rng));
    }
    std::vector<Buffer> out;
    for (int k = 0; k < p.n_out; ++k) out.emplace_back(dtype, p.out_column[k] ? rows : rows * c);
    std::vector<void*> buffers;
    for (Buffer& b : in) buffers.push_back(b.data());
    for (Buffer& b : out) buffers.push_back(b.data());
    kernels.run(program, 2, rows, buffers);

    Rows h(rows), gy(rows);
    std::vector<double> gamma, beta;
    for (int64_t k = 0; k < c; ++k) gamma.push_back(in[5].get(k)), beta.push_back(in[6].get(k));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < c; ++k) {
        const int64_t i = r * c + k;
        // As the program rounds: x * w, + b, + tile, each in T.
        const double xw = dtype == DType::Float32
                              ? double(float(in[0].get(i)) * float(in[1].get(k)))
                              : in[0].get(i) * in[1].get(k);
        double v = xw + in[2].get(r);
        if (dtype == DType::Float32) v = float(v);
        v += in[3].get(i % (4 * c));
        h[r].push_back(dtype == DType::Float32 ? double(float(v)) : v);
        gy[r].push_back(in[4].get(i));
      }
    const std::vector<WantRows> want = reference(op, affine, h, gy, gamma, beta);
    // A few ulps of the magnitudes each value comes from, per term of its row's folds.
    const double ulps = 4 * (dtype == DType::Float32 ? 0x1p-23 : 0x1p-52) * c;
    REQUIRE(want.size() == out.size());
    for (size_t k = 0; k < out.size(); ++k)
      for (int64_t r = 0; r < rows; ++r)
        for (size_t e = 0; e < want[k][r].size(); ++e) {
          const Want& w = want[k][r][e];
          const double got = out[k].get(want[k][r].size() == 1 ? r : r * c + e);
          INFO("output " << k << " row " << r << " element " << e << ": " << got << " against "
                         << w.value << ", magnitude " << w.scale);
          REQUIRE(std::abs(got - w.value) <= ulps * (1 + w.scale));
        }
  }
}

TEST_CASE("a generated elementwise kernel reads a bool condition and a tile (emulated)",
          "[nvrtc][emulated]") {
  // out = where(mask[i % 12], fill, x * 0.5): mask a [3, 4] tile over [5, 3, 4], fill one value.
  FusedProgram p;
  p.dtype = DType::Float32;
  p.numel = 60;
  p.row = 4;
  p.by_rows = true;
  p.in_layout = {FusedLayout::Full, FusedLayout::Tile, FusedLayout::One};
  p.in_tile = {0, 12, 0};
  p.in_bool = {false, true, false};
  p.n_in = 3;
  FusedInstr half;
  half.op = Op::MulScalar;
  half.a = 0;
  half.scalar = 0.5;
  half.out[0] = static_cast<uint8_t>(p.scratch_reg(0));
  FusedInstr pick;
  pick.op = Op::Where;
  pick.a = 1;
  pick.la = FusedLayout::Tile;
  pick.b = 2;
  pick.lb = FusedLayout::One;
  pick.c = half.out[0];
  pick.out[0] = static_cast<uint8_t>(p.out_reg(0));
  p.instrs = {half, pick};
  p.trace_index = {0, 1};
  p.n_scratch = 1;
  p.n_out = 1;
  p.out_instr = {{1, 0}};
  p.out_column = {false};
  const EmulatedKernels kernel({p});
  std::vector<float> x(60), out(60, 0);
  std::vector<unsigned char> mask(12);
  for (int i = 0; i < 60; ++i) x[i] = static_cast<float>(i) - 20;
  for (int i = 0; i < 12; ++i) mask[i] = static_cast<unsigned char>(i % 5 == 0);
  float fill = -7;
  kernel.run(0, 1, 60, {x.data(), mask.data(), &fill, out.data()});
  for (int i = 0; i < 60; ++i) {
    INFO("element " << i);
    CHECK(out[i] == (mask[i % 12] ? fill : x[i] * 0.5f));
  }
}
