// The CUDA source of fused programs, compiled with NVRTC for sm_90 (no GPU needed): every
// fusable op in float32 and float64, every way a binary op reads its operands, and random runs
// of up to a program's limits. A fusable op without a CUDA element function, or generated code
// NVRTC rejects, fails here; the [cuda] tests run the kernels and compare their bits with the
// unfused steps'.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/fused_source.h"
#include "kernels/cuda/nvrtc.h"
#include "runtime/error.h"
#include "runtime/fused.h"
#include "tests/nvrtc/compile_check.h"

using namespace encore;
using encore::kernels::cuda::fused_source;
using encore::kernels::cuda::fused_unsupported;
using encore::kernels::cuda::nvrtc_compile;
using encore::testing::check_compiles;

namespace {

constexpr int kArch = testing::kNvrtcArch;

// Reads of an op: three for where, two for binary ops and gradients, one for the rest.
int reads_of(Op op) {
  switch (op) {
    case Op::Where:
      return 3;
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::ReluGrad:
    case Op::LeakyReluGrad:
    case Op::SigmoidGrad:
    case Op::TanhGrad:
    case Op::GeluGrad:
      return 2;
    default:
      return 1;
  }
}

// A program of one instruction over inputs read in `layouts` (where's first a bool condition; a
// tile 120 elements).
FusedProgram one_step(Op op, DType dtype, std::vector<FusedLayout> layouts, double scalar) {
  FusedProgram p;
  p.dtype = dtype;
  p.numel = 3000;
  p.row = 60;
  p.n_in = static_cast<int>(layouts.size());
  p.in_layout = layouts;
  for (int k = 0; k < p.n_in; ++k) {
    const FusedLayout l = layouts[k];
    p.by_rows |= l != FusedLayout::Full && l != FusedLayout::One;
    p.in_tile.push_back(l == FusedLayout::Tile ? 120 : 0);
    p.in_bool.push_back(op == Op::Where && k == 0);
  }
  FusedInstr ins;
  ins.op = op;
  ins.a = 0;
  ins.b = static_cast<uint8_t>(p.n_in > 1 ? 1 : 0);
  ins.c = static_cast<uint8_t>(p.n_in > 2 ? 2 : 0);
  ins.la = layouts[0];
  ins.lb = layouts[ins.b];
  ins.lc = layouts[ins.c];
  ins.out[0] = static_cast<uint8_t>(p.out_reg(0));
  ins.scalar = scalar;
  p.instrs.push_back(ins);
  p.n_out = 1;
  p.out_instr.push_back({0, 0});
  p.out_column.push_back(false);
  p.trace_index.push_back(0);
  return p;
}

}  // namespace

TEST_CASE("NVRTC loads", "[nvrtc]") {
  CHECK(kernels::cuda::nvrtc_unavailable() == "");
}

TEST_CASE("every fusable op compiles into a fused CUDA kernel", "[nvrtc]") {
  int ops = 0;
  for (int k = 0; k < kNumOps; ++k) {
    const Op op = static_cast<Op>(k);
    if (!op_fusable(op)) continue;
    ++ops;
    for (DType dtype : {DType::Float32, DType::Float64}) {
      INFO(op_name(op) << " " << name(dtype));
      const int n = reads_of(op);
      const FusedProgram p =
          one_step(op, dtype, std::vector<FusedLayout>(n, FusedLayout::Full), 0.5);
      REQUIRE(fused_unsupported(p) == "");
      CHECK_THAT(fused_source(p), Catch::Contains(std::string(op_name(op))));
      check_compiles(p);
    }
  }
  CHECK(ops >= 25);  // add ... gelu_grad, where
}

TEST_CASE("a binary op reads its operands in every layout", "[nvrtc]") {
  const FusedLayout all[] = {FusedLayout::Full, FusedLayout::One, FusedLayout::Row,
                             FusedLayout::Column, FusedLayout::Tile};
  FusedProgram p;
  p.dtype = DType::Float32;
  p.numel = 4096;
  p.row = 64;
  p.by_rows = true;
  // One input per layout; instruction k reads inputs a and b in every pair of layouts, each result
  // an output.
  for (FusedLayout l : all) {
    p.in_layout.push_back(l);
    p.in_tile.push_back(l == FusedLayout::Tile ? 1024 : 0);
  }
  p.n_in = kFusedLayouts;
  for (int a = 0; a < kFusedLayouts; ++a)
    for (int b = 0; b < kFusedLayouts; ++b) {
      FusedInstr ins;
      ins.op = (a + b) % 2 ? Op::Mul : Op::Sub;
      ins.a = static_cast<uint8_t>(a);
      ins.b = static_cast<uint8_t>(b);
      ins.la = all[a];
      ins.lb = all[b];
      ins.out[0] = static_cast<uint8_t>(p.out_reg(p.n_out));
      p.out_instr.push_back({static_cast<int>(p.instrs.size()), 0});
      p.out_column.push_back(false);
      p.instrs.push_back(ins);
      ++p.n_out;
    }
  const std::string src = fused_source(p);
  CHECK_THAT(src, Catch::Contains("in1[0]"));                  // One
  CHECK_THAT(src, Catch::Contains("in2[c]"));                  // Row
  CHECK_THAT(src, Catch::Contains("in3[j]"));                  // Column
  CHECK_THAT(src, Catch::Contains("in4[(I)i % (I)1024ull]"));  // Tile
  check_compiles(p);
}

TEST_CASE("where reads a bool condition and its values in every layout", "[nvrtc]") {
  for (DType dtype : {DType::Float32, DType::Float64})
    for (int c = 0; c < kFusedLayouts; ++c)
      for (int v = 0; v < kFusedLayouts; ++v) {
        const auto lc = static_cast<FusedLayout>(c), lv = static_cast<FusedLayout>(v);
        INFO(name(dtype) << " condition layout " << c << ", values " << v);
        const FusedProgram p = one_step(Op::Where, dtype, {lc, lv, FusedLayout::Full}, 0);
        REQUIRE(fused_unsupported(p) == "");
        const std::string src = fused_source(p);
        CHECK_THAT(src, Catch::Contains("const unsigned char* in0"));
        CHECK_THAT(src, Catch::Contains("el::where(x0, x1, x2)"));
        check_compiles(p);
      }
}

TEST_CASE("scalars keep their value: non-finite ones and the double nearest a decimal", "[nvrtc]") {
  for (double s : {0.1, -0.0, 1e300, 1.0 / 0.0, -1.0 / 0.0, 0.0 / 0.0}) {
    INFO(s);
    FusedProgram p = one_step(Op::MulScalar, DType::Float64, {FusedLayout::Full}, s);
    check_compiles(p);
  }
  CHECK_THAT(fused_source(one_step(Op::AddScalar, DType::Float32, {FusedLayout::Full}, 0.1)),
             Catch::Contains("T(0x1.999999999999ap-4)"));
  // pow with an exponent of exactly 2 (as a double) squares, as the unfused kernel does; one a
  // float32 cannot tell from 2 still calls pow.
  CHECK_THAT(fused_source(one_step(Op::PowScalar, DType::Float32, {FusedLayout::Full}, 2.0)),
             Catch::Contains("el::square(x0)"));
  const FusedProgram near_two =
      one_step(Op::PowScalar, DType::Float32, {FusedLayout::Full}, 2.0 + 1e-12);
  CHECK_THAT(fused_source(near_two),
             Catch::Contains("el::pow_scalar(x0, T(0x1.00000000008ccp+1))"));
  check_compiles(near_two);
}

TEST_CASE("random fused runs compile", "[nvrtc]") {
  std::mt19937 rng(20261126);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::vector<Op> ops;
  for (int k = 0; k < kNumOps; ++k)
    if (op_fusable(static_cast<Op>(k))) ops.push_back(static_cast<Op>(k));
  for (int round = 0; round < 30; ++round) {
    FusedProgram p;
    p.dtype = round % 3 == 2 ? DType::Float64 : DType::Float32;
    p.row = 1 + pick(300);
    p.numel = p.row * (1 + pick(5000));
    p.n_in = 1 + pick(FusedProgram::kMaxInputs);
    // Registers holding values: the inputs but bool ones, then scratch slots and outputs as
    // instructions write them (a scratch slot rewritten, an output written once). Input 0 is a
    // value; about one in six others is a bool condition.
    std::vector<uint8_t> readable, conditions;
    for (int k = 0; k < p.n_in; ++k) {
      const auto l = static_cast<FusedLayout>(pick(kFusedLayouts));
      p.in_layout.push_back(l);
      p.in_tile.push_back(l == FusedLayout::Tile ? p.row * (1 + pick(4)) : 0);
      p.by_rows |= l != FusedLayout::Full && l != FusedLayout::One;
      p.in_bool.push_back(k > 0 && pick(6) == 0);
      (p.in_bool.back() ? conditions : readable).push_back(static_cast<uint8_t>(k));
    }
    const int steps = 2 + pick(round < 2 ? FusedProgram::kMaxSteps - 1 : 40);
    for (int t = 0; t < steps; ++t) {
      FusedInstr ins;
      do ins.op = ops[pick(static_cast<int>(ops.size()))];
      while (ins.op == Op::Where && conditions.empty());
      auto value = [&] { return readable[pick(static_cast<int>(readable.size()))]; };
      ins.a = ins.op == Op::Where ? conditions[pick(static_cast<int>(conditions.size()))] : value();
      ins.b = value();
      ins.c = value();
      ins.scalar = 0.25 * (1 + pick(8));
      if (t + 1 < steps && pick(3) != 0) {
        ins.out[0] = static_cast<uint8_t>(p.scratch_reg(pick(FusedProgram::kMaxScratch)));
      } else {
        ins.out[0] = static_cast<uint8_t>(p.out_reg(p.n_out++));
        p.out_instr.push_back({t, 0});
        p.out_column.push_back(false);
      }
      readable.push_back(ins.out[0]);
      p.instrs.push_back(ins);
    }
    INFO("round " << round << ": " << p.n_in << " inputs, " << steps << " steps");
    REQUIRE(fused_unsupported(p) == "");
    check_compiles(p);
  }
}

TEST_CASE("a plan's programs compile together, each kernel under its own name", "[nvrtc]") {
  // As the CUDA backend compiles a plan: one prelude, then each program's kernel.
  const FusedProgram a = one_step(Op::Tanh, DType::Float32, {FusedLayout::Full}, 0);
  const FusedProgram b =
      one_step(Op::Mul, DType::Float64, {FusedLayout::Full, FusedLayout::Row}, 0);
  const std::string source = kernels::cuda::fused_prelude() +
                             kernels::cuda::fused_kernel_source(a, "encore_fused_0") +
                             kernels::cuda::fused_kernel_source(b, "encore_fused_1");
  INFO(source);
  const std::string cubin = nvrtc_compile(source, kArch);
  CHECK(cubin.find("encore_fused_0") != std::string::npos);
  CHECK(cubin.find("encore_fused_1") != std::string::npos);
  // A kernel does not depend on the element count (but for 32-bit indices), so plans of other
  // sizes share it.
  FusedProgram larger = a;
  larger.numel = 7 * a.numel;
  CHECK(kernels::cuda::fused_kernel_source(larger, "k") ==
        kernels::cuda::fused_kernel_source(a, "k"));
  // The whole-source form is the prelude and the kernel under kFusedKernelName.
  CHECK(fused_source(a) ==
        kernels::cuda::fused_prelude() +
            kernels::cuda::fused_kernel_source(a, kernels::cuda::kFusedKernelName));
}

TEST_CASE("programs a CUDA kernel cannot run are refused with the reason", "[nvrtc]") {
  FusedProgram sum = one_step(Op::Sum, DType::Float32, {FusedLayout::Full}, 0);
  CHECK_THAT(fused_unsupported(sum), Catch::Contains("sum in a program without row operations"));

  FusedProgram equal = one_step(Op::Equal, DType::Float32, {FusedLayout::Full}, 0);
  CHECK_THAT(fused_unsupported(equal), Catch::Contains("no CUDA element function for equal"));

  FusedProgram ints = one_step(Op::Add, DType::Int64, {FusedLayout::Full, FusedLayout::Full}, 0);
  CHECK_THAT(fused_unsupported(ints), Catch::Contains("int64"));

  FusedProgram unwritten = one_step(Op::Add, DType::Float32, {FusedLayout::Full}, 0);
  unwritten.instrs[0].b = static_cast<uint8_t>(unwritten.scratch_reg(3));
  CHECK_THAT(fused_unsupported(unwritten), Catch::Contains("reads a register no instruction"));

  const std::vector<FusedLayout> three(3, FusedLayout::Full);
  FusedProgram value_condition = one_step(Op::Where, DType::Float32, three, 0);
  value_condition.in_bool[0] = false;
  CHECK_THAT(fused_unsupported(value_condition), Catch::Contains("condition that is not a bool"));
  FusedProgram bool_value = one_step(Op::Where, DType::Float32, three, 0);
  bool_value.in_bool[2] = true;
  CHECK_THAT(fused_unsupported(bool_value), Catch::Contains("reads a bool input as a value"));
  FusedProgram bool_add =
      one_step(Op::Add, DType::Float32, {FusedLayout::Full, FusedLayout::Full}, 0);
  bool_add.in_bool[1] = true;
  CHECK_THAT(fused_unsupported(bool_add), Catch::Contains("reads a bool input as a value"));
  FusedProgram no_length = one_step(Op::Exp, DType::Float32, {FusedLayout::Tile}, 0);
  no_length.in_tile[0] = 0;
  CHECK_THAT(fused_unsupported(no_length), Catch::Contains("tile without a length"));
}

TEST_CASE("NVRTC's errors name the op and carry its log", "[nvrtc]") {
  try {
    nvrtc_compile("this is not CUDA", kArch);
    FAIL("compiled");
  } catch (const kernels::cuda::NvrtcRejected& e) {  // the source's fault: cached for good
    CHECK_THAT(e.what(), Catch::Contains("fused_elementwise"));
    CHECK_THAT(e.what(), Catch::Contains("sm_90"));
    CHECK_THAT(e.what(), Catch::Contains("error"));
  }
}
