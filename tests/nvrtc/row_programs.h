// Fused programs with row ops for the NVRTC tests (fused_row_source_test.cc,
// emulated_kernel_test.cc): each CUDA row op between elementwise steps reading every layout.
#pragma once

#include <cstdint>
#include <iterator>

#include "runtime/fused.h"

namespace encore::testing {

inline constexpr Op kRowOps[] = {Op::Softmax,   Op::LogSoftmax, Op::SoftmaxGrad, Op::LogSoftmaxGrad,
                                 Op::LayerNorm, Op::Sum,        Op::Mean,        Op::Max};

// Appends an output register written by instruction `instr` as its output `output`.
inline uint8_t new_output(FusedProgram& p, int instr, int output, bool column) {
  p.out_instr.push_back({instr, output});
  p.out_column.push_back(column);
  return static_cast<uint8_t>(p.out_reg(p.n_out++));
}

// Over `rows` rows of `row`: h = x * w + b (w one row, b one value per row, a [4, row] tile added
// too; inputs 0 to 3),
// then `op` over h (a gradient's gy is input 4; layer_norm's gamma and beta inputs 5 and 6, read
// as `affine` says), then op's output (one value per row for a reduction) times 2. Outputs: every
// output of op, and the product.
inline FusedProgram around(Op op, DType dtype, int64_t row, uint8_t affine, int64_t rows = 24) {
  FusedProgram p;
  p.dtype = dtype;
  p.row = row;
  p.numel = row * rows;
  p.row_ops = p.by_rows = true;
  const FusedLayout in[] = {FusedLayout::Full, FusedLayout::Row,  FusedLayout::Column,
                            FusedLayout::Tile, FusedLayout::Full, FusedLayout::Row,
                            FusedLayout::Row};
  for (FusedLayout l : in) {
    p.in_layout.push_back(l);
    p.in_tile.push_back(l == FusedLayout::Tile ? 4 * row : 0);
  }
  p.n_in = static_cast<int>(std::size(in));
  auto instr = [&p](Op o, uint8_t a, FusedLayout la, uint8_t b, FusedLayout lb, uint8_t out) {
    FusedInstr ins;
    ins.op = o;
    ins.a = a;
    ins.la = la;
    ins.b = b;
    ins.lb = lb;
    ins.out[0] = out;
    p.instrs.push_back(ins);
    p.trace_index.push_back(0);
    return static_cast<int>(p.instrs.size()) - 1;
  };
  const auto s0 = static_cast<uint8_t>(p.scratch_reg(0)),
             s1 = static_cast<uint8_t>(p.scratch_reg(1));
  p.n_scratch = 2;
  instr(Op::Mul, 0, FusedLayout::Full, 1, FusedLayout::Row, s0);
  instr(Op::Add, s0, FusedLayout::Full, 2, FusedLayout::Column, s1);
  instr(Op::Add, s1, FusedLayout::Full, 3, FusedLayout::Tile, s0);
  const int k = instr(op, s0, FusedLayout::Full, 4, FusedLayout::Full, 0);
  FusedInstr& r = p.instrs[k];
  if (op == Op::LayerNorm) {
    r.n_out = 3;
    r.flags = affine;
    r.scalar = 1e-5;
    r.b = 5;
    r.lb = FusedLayout::Row;
    r.c = 6;
    r.lc = FusedLayout::Row;
  }
  for (int o = 0; o < r.n_out; ++o) r.out[o] = new_output(p, k, o, o > 0 || row_reduction(op));
  const uint8_t y = r.out[0];
  FusedInstr twice;
  twice.op = Op::MulScalar;
  twice.a = y;
  twice.scalar = 2;
  twice.out[0] = new_output(p, k + 1, 0, false);
  p.instrs.push_back(twice);
  p.trace_index.push_back(0);
  return p;
}

}  // namespace encore::testing
