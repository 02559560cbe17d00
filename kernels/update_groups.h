// The inputs of an optimizer update (cpu and cuda host code): one group per parameter (the
// parameter, its gradient, the optimizer's state; op_traits.h), checked before anything is written
// so that a bad call leaves every parameter as it was. The groups of one call must not share
// memory (CUDA updates them at once): the optimizers pass a parameter, and its state, once, and
// update parameters that share a storage one call each.
#pragma once

#include <cstddef>
#include <span>

#include "runtime/error.h"
#include "runtime/kernel_abi.h"
#include "runtime/op_traits.h"

namespace encore::kernels {

// What a group of an update op holds: `arrays` inputs of the parameter's dtype and size (the
// parameter first, then its gradient and state), and at `counter` (-1: none) Adam's step count.
struct UpdateGroup {
  int size, arrays, counter;
};
constexpr UpdateGroup update_group(Op op) {
  switch (op) {
    case Op::SgdUpdate:
      return {op_input_group(op), 2, -1};
    case Op::MomentumSgdUpdate:
      return {op_input_group(op), 3, -1};
    case Op::AdamUpdate:
      return {op_input_group(op), 4, 4};
    default:
      return {op_input_group(op), 0, -1};
  }
}

// Every parameter has parameter 0's dtype, the arrays of each group have their parameter's dtype
// and element count, and each group's step counter (Adam's) is one int64.
inline void check_update_groups(std::span<const BufferView> in, Op op) {
  const auto [size, arrays, counter] = update_group(op);
  const size_t group = static_cast<size_t>(size);
  const BufferView& first = in[0];
  for (size_t g = 0; g + group <= in.size(); g += group) {
    const BufferView& p = in[g];
    ENCORE_CHECK(p.dtype == first.dtype, op_name(op), ": parameter ", g / group, " (argument ", g,
                 ") is ", p.dtype, p.shape, " but parameter 0 is ", first.dtype, first.shape,
                 "; one call updates parameters of one dtype");
    for (size_t a = 1; a < static_cast<size_t>(arrays); ++a) {
      const BufferView& x = in[g + a];
      ENCORE_CHECK(x.dtype == p.dtype && x.numel() == p.numel(), op_name(op), ": argument ", g + a,
                   " is ", x.dtype, x.shape, " but its parameter (argument ", g, ") is ", p.dtype,
                   p.shape);
    }
    if (counter >= 0) {
      const BufferView& t = in[g + static_cast<size_t>(counter)];
      ENCORE_CHECK(t.dtype == DType::Int64 && t.numel() == 1, op_name(op), ": argument ",
                   g + static_cast<size_t>(counter), ", the step counter of parameter ", g / group,
                   ", must be one int64; it is ", t.dtype, t.shape);
    }
  }
}

}  // namespace encore::kernels
