// The CUDA source of fused programs with row ops (softmax, log_softmax, their gradients and
// layer_norm over rows of up to kMaxCudaRow elements), compiled with NVRTC for sm_90 (no GPU
// needed): each row op between elementwise steps reading operands in every layout, in float32
// and float64, at row lengths around the warp's; and random runs mixing row ops with elementwise
// steps. The [cuda] tests run the kernels against the unfused steps' bits.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/fused_source.h"
#include "runtime/error.h"
#include "runtime/fused.h"
#include "tests/nvrtc/compile_check.h"
#include "tests/nvrtc/row_programs.h"

using namespace encore;
using encore::kernels::cuda::fused_source;
using encore::kernels::cuda::fused_unsupported;
using encore::testing::around;
using encore::testing::check_compiles;
using encore::testing::kRowOps;
using encore::testing::new_output;

TEST_CASE("each CUDA row op compiles between elementwise steps into a warp-per-row kernel",
          "[nvrtc]") {
  for (Op op : kRowOps)
    for (DType dtype : {DType::Float32, DType::Float64})
      for (int64_t row :
           {int64_t{2}, int64_t{31}, int64_t{64}, int64_t{100}, kMaxCudaReduceRow, kMaxCudaRow})
        for (uint8_t affine = 0; affine < (op == Op::LayerNorm ? 4 : 1); ++affine) {
          if (row_reduction(op) && row > kMaxCudaReduceRow) continue;
          INFO(op_name(op) << " " << name(dtype) << " rows of " << row << " affine "
                           << int{affine});
          const FusedProgram p = around(op, dtype, row, affine);
          REQUIRE(fused_unsupported(p) == "");
          const std::string src = fused_source(p);
          CHECK_THAT(src, Catch::Contains(cat("constexpr int K = ", (row + 31) / 32, ";")));
          CHECK_THAT(src, Catch::Contains("warp_reduce<"));
          if (op == Op::LayerNorm) {
            CHECK_THAT(src, Catch::Contains("if (g == 0) out1[j] = v3_1;"));
            CHECK_THAT(src, Catch::Contains("if (g == 0) out2[j] = v3_2;"));
            CHECK_THAT(src, Catch::Contains("rowop::layer_norm_rstd(var3, 0x1.4f8b588e368f1p-17)"));
          }
          if (row_reduction(op)) CHECK_THAT(src, Catch::Contains("if (g == 0) out0[j] = v3_0;"));
          if (row == 64 || row == kMaxCudaRow) check_compiles(p);  // the rest: the text
        }
}

TEST_CASE("random fused runs with row ops compile", "[nvrtc]") {
  std::mt19937 rng(20261129);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::vector<Op> ops(std::begin(kRowOps), std::end(kRowOps));
  for (int k = 0; k < kNumOps; ++k)
    if (op_fusable(static_cast<Op>(k)) && static_cast<Op>(k) != Op::Where)
      ops.push_back(static_cast<Op>(k));
  for (int round = 0; round < 12; ++round) {
    FusedProgram p;
    p.dtype = round % 3 == 2 ? DType::Float64 : DType::Float32;
    p.row = 2 + pick(static_cast<int>(kMaxCudaRow) - 1);
    p.numel = p.row * (1 + pick(100));
    p.row_ops = p.by_rows = true;
    p.n_in = 1 + pick(12);
    // Registers elementwise steps may read; those holding a value per element (what a row op
    // reads: input 0 is one); inputs of one row (layer_norm's gamma and beta).
    std::vector<uint8_t> readable, per_element, one_row;
    for (int k = 0; k < p.n_in; ++k) {
      const auto l = k == 0 ? FusedLayout::Full : static_cast<FusedLayout>(pick(kFusedLayouts));
      p.in_layout.push_back(l);
      p.in_tile.push_back(l == FusedLayout::Tile ? p.row * (1 + pick(3)) : 0);
      readable.push_back(static_cast<uint8_t>(k));
      if (l != FusedLayout::One && l != FusedLayout::Column)
        per_element.push_back(static_cast<uint8_t>(k));
      if (l == FusedLayout::Row) one_row.push_back(static_cast<uint8_t>(k));
    }
    auto from = [&](const std::vector<uint8_t>& regs) {
      return regs[pick(static_cast<int>(regs.size()))];
    };
    const int steps = 2 + pick(20);
    for (int t = 0; t < steps; ++t) {
      FusedInstr ins;
      ins.op = ops[pick(static_cast<int>(ops.size()))];
      if (row_reduction(ins.op) && p.row > kMaxCudaReduceRow) ins.op = Op::Softmax;
      const bool row_op = op_row_fusable(ins.op);
      ins.a = from(row_op ? per_element : readable);
      ins.b = from(row_op ? per_element : readable);
      ins.c = from(readable);
      ins.scalar = ins.op == Op::LayerNorm ? 1e-5 : 0.25 * (1 + pick(8));
      if (ins.op == Op::LayerNorm && !one_row.empty()) {
        ins.flags = static_cast<uint8_t>(pick(4));
        ins.b = from(one_row);
        ins.c = from(one_row);
      }
      ins.n_out = static_cast<uint8_t>(ins.op == Op::LayerNorm ? 3 : 1);
      if (ins.n_out == 1 && t + 1 < steps && pick(3) != 0) {
        ins.out[0] = static_cast<uint8_t>(p.scratch_reg(pick(FusedProgram::kMaxScratch)));
      } else {
        for (int o = 0; o < ins.n_out; ++o)
          ins.out[o] = new_output(p, t, o, o > 0 || row_reduction(ins.op));
      }
      for (int o = 0; o < ins.n_out; ++o) readable.push_back(ins.out[o]);
      if (!row_reduction(ins.op)) per_element.push_back(ins.out[0]);
      p.instrs.push_back(ins);
      p.trace_index.push_back(t);
    }
    INFO("round " << round << ": rows of " << p.row << ", " << steps << " steps");
    REQUIRE(fused_unsupported(p) == "");
    check_compiles(p);
  }
}

TEST_CASE("row programs a CUDA kernel cannot run are refused with the reason", "[nvrtc]") {
  // Past 512 elements the unfused reduction runs a block per row.
  const FusedProgram sum = around(Op::Sum, DType::Float32, kMaxCudaReduceRow + 88, 0);
  CHECK_THAT(fused_unsupported(sum),
             Catch::Contains("no CUDA row function for sum over rows of 600"));
  CHECK_THROWS_AS(fused_source(sum), Error);

  const FusedProgram long_rows = around(Op::Softmax, DType::Float32, kMaxCudaRow + 1, 0);
  CHECK_THAT(fused_unsupported(long_rows), Catch::Contains("rows of 1025 elements"));

  FusedProgram flat = around(Op::Softmax, DType::Float32, 64, 0);
  flat.row_ops = false;
  CHECK_THAT(fused_unsupported(flat),
             Catch::Contains("softmax in a program without row operations"));

  FusedProgram two = around(Op::LayerNorm, DType::Float32, 64, 3);
  two.instrs[3].n_out = 2;
  CHECK_THAT(fused_unsupported(two), Catch::Contains("layer_norm with 2 outputs"));

  FusedProgram column = around(Op::LayerNorm, DType::Float32, 64, 3);
  column.out_column[1] = false;  // the mean is one value per row
  CHECK_THAT(fused_unsupported(column), Catch::Contains("outputs as they write them"));

  FusedProgram per_row = around(Op::Softmax, DType::Float32, 64, 0);
  per_row.instrs[3].a = 2;  // the input of one value per row
  CHECK_THAT(fused_unsupported(per_row), Catch::Contains("softmax over one value per row"));

  FusedProgram full_gamma = around(Op::LayerNorm, DType::Float32, 64, 3);
  full_gamma.instrs[3].b = 0;  // x's [rows, C] as gamma
  CHECK_THAT(fused_unsupported(full_gamma),
             Catch::Contains("gamma or beta other than as an input"));

  FusedProgram bool_row = around(Op::SoftmaxGrad, DType::Float32, 64, 0);
  bool_row.in_bool.assign(bool_row.n_in, false);
  bool_row.in_bool[4] = true;  // gy
  CHECK_THAT(fused_unsupported(bool_row), Catch::Contains("reads a bool input as a value"));
}
