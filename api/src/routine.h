// Helpers shared by the routines, and the backward-only routines their formulas use.
#pragma once

#include "encore/functions.h"
#include "runtime/dispatcher.h"

namespace encore::detail {

inline void check_defined(const char* op, const char* arg, const Tensor& t) {
  ENCORE_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

// Defined and float32/float64.
inline void check_floating(const char* op, const char* arg, const Tensor& t) {
  check_defined(op, arg, t);
  ENCORE_CHECK(is_floating(t.dtype()), op, ": argument '", arg,
               "' must be float32 or float64, it is ", t.dtype(), " ", t.shape());
}

// A value a tensor of `dtype` can be filled with (full, fill_, masked_fill): an integer dtype
// takes a finite value in its range, float32 a finite value within its range or an infinity
// (factories.cc).
void check_fill_value(const char* op, double value, DType dtype);

inline void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  ENCORE_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ: a is ", a.dtype(), " ", a.shape(),
               ", b is ", b.dtype(), " ", b.shape());
}

// Runs a single-output op whose output has `shape` and `dtype`, on input 0's device (dispatch()
// rejects inputs on other devices, naming the argument).
inline Tensor call1(Op op, std::initializer_list<Tensor> in, const Shape& shape, DType dtype,
                    const AttrBlob& attrs = {}) {
  Tensor out = Tensor::empty(shape, dtype, in.begin()->device());
  dispatch(op, in, {out}, attrs);
  return out;
}

// Writes a height and width into an attribute pair ([0] height, [1] width).
inline void set_pair(int32_t (&dst)[2], Size2 s) {
  dst[0] = s.h;
  dst[1] = s.w;
}

// Drops (set_to_none) or zeroes the gradients of `params` (Module and Optimizer zero_grad).
void zero_grads(std::span<const Tensor> params, bool set_to_none);

// Bit mask of `axes` over a rank-`rank` tensor (all axes when empty); rejects duplicates.
uint8_t axes_mask(const char* op, std::span<const int> axes, int rank);
// `shape` with the axes in `mask` removed (or set to 1 with keepdims).
Shape reduced_shape(const Shape& shape, uint8_t mask, bool keepdims);

// F::sum_to for backward formulas: x itself when it already has `shape` (F::sum_to returns a new
// tensor then, as every op does; a gradient needs no copy).
Tensor sum_to_or_self(const Tensor& x, const Shape& shape);

// Backward-only routines (not differentiable themselves).
Tensor matmul_t(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);

// F::matmul with op(a) op(b) (transposing the last two axes of an operand whose flag is set)
// and NumPy broadcasting of the batch dimensions; errors name `name`.
Tensor batched_matmul(const char* name, const Tensor& a, const Tensor& b, bool trans_a,
                      bool trans_b);
Tensor slice_grad(const Tensor& gy, const Shape& input_shape, const SliceAttrs& attrs);
Tensor softmax_cross_entropy_grad(const Tensor& logits, const Tensor& labels, const Tensor& gy,
                                  int64_t ignore_label);

}  // namespace encore::detail
