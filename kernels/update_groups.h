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

// Every parameter has parameter 0's dtype, the first `arrays` inputs of each group have their
// parameter's dtype and element count, and input `counter` of each group (-1: none) is one int64.
inline void check_update_groups(std::span<const BufferView> in, Op op, size_t arrays, int counter) {
  const size_t group = static_cast<size_t>(op_input_group(op));
  const BufferView& first = in[0];
  for (size_t g = 0; g + group <= in.size(); g += group) {
    const BufferView& p = in[g];
    ENCORE_CHECK(p.dtype == first.dtype, op_name(op), ": parameter ", g / group, " (argument ", g,
                 ") is ", p.dtype, p.shape, " but parameter 0 is ", first.dtype, first.shape,
                 "; one call updates parameters of one dtype");
    for (size_t a = 1; a < arrays; ++a) {
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
