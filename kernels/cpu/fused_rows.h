// The row ops of the fused kernel (fused.cc; runtime/fused.h): an op marked kRowFusable
// (runtime/op_traits.h) works on whole rows of a block, each with the row function its own
// kernel uses (reduce_row.h, softmax_util.h, layer_norm_row.h), so the bits equal the unfused
// step's.
//
// To add a row op: mark it kRowFusable in its traits row; give its cpu kernel an inline row
// function in a header and call it from both the kernel and a case below; say in
// schedule/fusion.cc (row_op_fits, row_op_input, row_op_output) which of its calls work on the
// last axis and how each operand is read and written. See schedule/README.md, Fusion.
#pragma once

#include <cstdint>

#include "kernels/cpu/layer_norm_row.h"
#include "kernels/cpu/reduce_row.h"
#include "kernels/cpu/softmax_util.h"
#include "runtime/error.h"
#include "runtime/fused.h"

namespace encore::kernels::cpu {

// ins over `rows` rows of n elements: Full operands start at the block's first row, Row ones
// (layer_norm's gamma and beta) at the row's start; a reduction (and layer_norm's mean and rstd)
// writes one value per row. `whole`: the rows are the whole tensor's only row.
template <typename T>
void run_row_op(const FusedInstr& ins, T* const* reg, int64_t rows, int64_t n, bool whole) {
  const T* a = reg[ins.a];
  const T* b = reg[ins.b];
  T* o = reg[ins.out[0]];
  switch (ins.op) {
    case Op::Sum:
      for (int64_t r = 0; r < rows; ++r) o[r] = reduce_last_axis_row<SumOp>(a + r * n, n, whole);
      return;
    case Op::Mean: {
      const T count = static_cast<T>(n);
      for (int64_t r = 0; r < rows; ++r)
        o[r] = reduce_last_axis_row<SumOp>(a + r * n, n, whole) / count;
      return;
    }
    case Op::Max:
      for (int64_t r = 0; r < rows; ++r) o[r] = reduce_last_axis_row<MaxOp>(a + r * n, n, whole);
      return;
    case Op::Softmax:
      for (int64_t r = 0; r < rows; ++r) softmax_lane<false>(a + r * n, o + r * n, n, kUnitStride);
      return;
    case Op::LogSoftmax:
      for (int64_t r = 0; r < rows; ++r) softmax_lane<true>(a + r * n, o + r * n, n, kUnitStride);
      return;
    case Op::SoftmaxGrad:
      for (int64_t r = 0; r < rows; ++r)
        softmax_grad_lane<false>(a + r * n, b + r * n, o + r * n, n, kUnitStride);
      return;
    case Op::LogSoftmaxGrad:
      for (int64_t r = 0; r < rows; ++r)
        softmax_grad_lane<true>(a + r * n, b + r * n, o + r * n, n, kUnitStride);
      return;
    case Op::LayerNorm: {
      const T* gamma = ins.flags & kLayerNormGamma ? b : nullptr;
      const T* beta = ins.flags & kLayerNormBeta ? reg[ins.c] : nullptr;
      layer_norm_rows(a, gamma, beta, o, reg[ins.out[1]], reg[ins.out[2]], rows, n, ins.scalar);
      return;
    }
    default:
      throw Error(cat("fused_elementwise: ", op_name(ins.op), " has no row function"));
  }
}

}  // namespace encore::kernels::cpu
