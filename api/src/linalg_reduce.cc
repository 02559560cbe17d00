// matmul, linear and reductions, with their backward definitions.
#include "api/src/routine.h"

namespace encore {
namespace F = functions;
using detail::call1;
using detail::check_floating;

namespace detail {

uint8_t axes_mask(const char* op, std::span<const int> axes, int rank) {
  if (axes.empty()) return rank == 0 ? 0 : static_cast<uint8_t>((1u << rank) - 1);
  if (rank == 0) {  // as PyTorch: axis 0 (or -1) names a 0-d tensor's one value, once
    for (size_t i = 0; i < axes.size(); ++i) {
      ENCORE_CHECK(axes[i] == 0 || axes[i] == -1, op, ": axis ", axes[i],
                   " is out of range for a 0-d tensor (0 and -1 are its only axes)");
      ENCORE_CHECK(i == 0, op, ": axis ", axes[i], " is given twice (x is 0-d)");
    }
    return 0;
  }
  uint8_t mask = 0;
  for (int a : axes) {
    const int ax = normalize_axis(a, rank, op);
    ENCORE_CHECK(!(mask >> ax & 1), op, ": axis ", a, " is given twice");
    mask |= static_cast<uint8_t>(1u << ax);
  }
  return mask;
}

Shape reduced_shape(const Shape& shape, uint8_t mask, bool keepdims) {
  Shape out;
  for (int i = 0; i < shape.rank(); ++i) {
    if (!(mask >> i & 1))
      out.push_back(shape[i]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

Tensor matmul_t(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const int r = a.rank();
  const int64_t m = trans_a ? a.size(-1) : a.size(-2);
  const int64_t n = trans_b ? b.size(-2) : b.size(-1);
  Shape s;
  if (r == 3) s.push_back(a.size(0));
  s.push_back(m);
  s.push_back(n);
  return call1(Op::Matmul, {a, b}, s, a.dtype(), AttrBlob::of(MatmulAttrs{trans_a, trans_b}));
}

// The batch dimensions of x: all but its last two.
Shape batch_dims(const Tensor& x) {
  Shape s;
  for (int i = 0; i + 2 < x.rank(); ++i) s.push_back(x.shape()[i]);
  return s;
}

// x [..., R, C] as [P, R, C] over the batch shape `batch` (P its element count): a view when x's
// batch dimensions are `batch`, else a broadcast copy (its gradient summed back by broadcast_to).
Tensor as_batches(const Tensor& x, const Shape& batch) {
  const int64_t rows = x.size(-2), cols = x.size(-1);
  Tensor full = x;
  if (!(batch_dims(x) == batch)) {
    Shape s = batch;
    s.push_back(rows);
    s.push_back(cols);
    full = F::broadcast_to(x, s);
  }
  return F::reshape(full, {batch.numel(), rows, cols});
}

Tensor batched_matmul(const char* name, const Tensor& a, const Tensor& b, bool trans_a,
                      bool trans_b) {
  check_floating(name, "a", a);
  check_floating(name, "b", b);
  detail::check_same_dtype(name, a, b);
  ENCORE_CHECK(a.rank() >= 2 && b.rank() >= 2, name, ": operands must be at least 2-D: a is ",
               a.shape(), ", b is ", b.shape());
  const int64_t ka = trans_a ? a.size(-2) : a.size(-1), kb = trans_b ? b.size(-1) : b.size(-2);
  ENCORE_CHECK(ka == kb, name, ": inner dimensions differ: a is ", a.shape(),
               trans_a ? " (transposed)" : "", ", b is ", b.shape(),
               trans_b ? " (transposed)" : "");
  const Shape ba = batch_dims(a), bb = batch_dims(b);
  const int rank = std::max(ba.rank(), bb.rank());
  Shape batch;
  for (int i = 0; i < rank; ++i) {
    const int64_t da = i + ba.rank() >= rank ? ba[i + ba.rank() - rank] : 1;
    const int64_t db = i + bb.rank() >= rank ? bb[i + bb.rank() - rank] : 1;
    ENCORE_CHECK(da == db || da == 1 || db == 1, name, ": batch dimensions do not broadcast: a is ",
                 a.shape(), ", b is ", b.shape());
    batch.push_back(da == 1 ? db : da);
  }
  const int64_t m = trans_a ? a.size(-1) : a.size(-2), n = trans_b ? b.size(-2) : b.size(-1);
  Shape out = batch;
  out.push_back(m);
  out.push_back(n);
  if (rank == 0) return matmul_t(a, b, trans_a, trans_b);
  if (bb.numel() == 1 && !trans_a) {  // b shared by every batch: one GEMM over a's rows
    const Tensor b2 = F::reshape(b, {b.size(-2), b.size(-1)});
    const Tensor a2 = F::reshape(a, {ba.numel() * a.size(-2), a.size(-1)});
    return F::reshape(matmul_t(a2, b2, false, trans_b), out.dims());
  }
  const Tensor y = matmul_t(as_batches(a, batch), as_batches(b, batch), trans_a, trans_b);
  return F::reshape(y, out.dims());
}

}  // namespace detail

namespace {

// Each operand's gradient reads only the other operand (save_for_other: the one kept).
void matmul_backward(BackwardContext& c) {
  const auto& at = c.attrs<MatmulAttrs>();
  const Tensor& gy = c.grad_output();
  // C = op(A) op(B): dA = dC op(B)^T (transposed back when A was), dB likewise.
  if (c.needs_input_grad(0)) {
    const Tensor& b = c.input(1);
    c.set_input_grad(0, at.trans_a ? detail::matmul_t(b, gy, at.trans_b, true)
                                   : detail::matmul_t(gy, b, false, !at.trans_b));
  }
  if (c.needs_input_grad(1)) {
    const Tensor& a = c.input(0);
    c.set_input_grad(1, at.trans_b ? detail::matmul_t(gy, a, true, at.trans_a)
                                   : detail::matmul_t(a, gy, !at.trans_a, false));
  }
}

// x's gradient reads only w, w's only x, the bias's neither (save_for_other: what is kept).
void linear_backward(BackwardContext& c) {
  const Shape& x_shape = c.input_meta(0).shape;
  const Shape& w_shape = c.input_meta(1).shape;
  const Tensor& gy = c.grad_output();
  const int64_t out_features = w_shape[0], in_features = w_shape[1];
  int64_t rows = 1;  // x viewed as [rows, in]
  for (int i = 0; i + 1 < x_shape.rank(); ++i) rows *= x_shape[i];
  const Tensor gy2 = F::reshape(gy, {rows, out_features});  // views; no-ops for 2-D x
  if (c.needs_input_grad(0))
    c.set_input_grad(0,
                     F::reshape(detail::matmul_t(gy2, c.input(1), false, false), x_shape.dims()));
  if (c.needs_input_grad(1))
    c.set_input_grad(
        1, detail::matmul_t(gy2, F::reshape(c.input(0), {rows, in_features}), true, false));
  if (c.num_inputs() == 3 && c.needs_input_grad(2)) c.set_input_grad(2, F::sum(gy2, {0}));
}

// Reduces `x` over the axes in `mask` (no argument checks).
Tensor reduce_masked(Op op, const Tensor& x, uint8_t mask, bool keepdims) {
  return call1(op, {x}, detail::reduced_shape(x.shape(), mask, keepdims), x.dtype(),
               AttrBlob::of(ReduceAttrs{mask, keepdims}));
}

// gy broadcast back over the reduced axes of the input.
Tensor expand_reduced(const Tensor& gy, const TensorMeta& in, uint8_t mask) {
  const Tensor kept = F::reshape(gy, detail::reduced_shape(in.shape, mask, true).dims());
  return kept.shape() == in.shape ? kept : F::broadcast_to(kept, in.shape);
}

void sum_backward(BackwardContext& c) {
  const auto& at = c.attrs<ReduceAttrs>();
  c.set_input_grad(0, expand_reduced(c.grad_output(), c.input_meta(0), at.axes_mask));
}

void mean_backward(BackwardContext& c) {
  const auto& at = c.attrs<ReduceAttrs>();
  const TensorMeta& in = c.input_meta(0);
  // The reduced extents' product (not numel(in) / numel(gy), which is 0 for an empty batch: a
  // dynamic family would read a divisor of 4 at batch 4 and 0 at batch 0 as the batch size).
  int64_t reduced = 1;
  for (int d = 0; d < in.shape.rank(); ++d)
    if ((at.axes_mask >> d) & 1) reduced *= in.shape[d];
  const double count = static_cast<double>(reduced);
  c.set_input_grad(0, expand_reduced(F::div(c.grad_output(), count), in, at.axes_mask));
}

// Shared equally among tied maxima, as torch.amax: (gy / ties) * (x == max), so a slice whose
// maximum is NaN (no element equal to it) gets (gy / 0) * 0 = NaN throughout.
void max_backward(BackwardContext& c) {
  const auto& at = c.attrs<ReduceAttrs>();
  const Tensor& x = c.input(0);
  const Shape keep = detail::reduced_shape(x.shape(), at.axes_mask, true);
  const Tensor one = full({}, 1.0, x.dtype(), x.device());
  const Tensor zero = full({}, 0.0, x.dtype(), x.device());
  const Tensor is_max = F::where(F::equal(x, F::reshape(c.output(), keep.dims())), one, zero);
  const Tensor ties = reduce_masked(Op::Sum, is_max, at.axes_mask, true);
  c.set_input_grad(0, F::mul(F::div(F::reshape(c.grad_output(), keep.dims()), ties), is_max));
}

const bool kRegistered = [] {
  register_backward(Op::Matmul,
                    {.fn = matmul_backward, .save_inputs = 0b11, .save_for_other = 0b11});
  register_backward(Op::Linear,
                    {.fn = linear_backward, .save_inputs = 0b11, .save_for_other = 0b11});
  register_backward(Op::Sum, {sum_backward});
  register_backward(Op::Mean, {mean_backward});
  register_backward(Op::Max, {max_backward, 0b1, 0b1});
  return true;
}();

Tensor reduce(Op op, const char* name, const Tensor& x, std::span<const int> axes, bool keepdims) {
  check_floating(name, "x", x);
  const uint8_t mask = detail::axes_mask(name, axes, x.rank());
  if (op == Op::Max) {  // an empty slice has no maximum; an empty result is fine
    for (int i = 0; i < x.rank(); ++i)
      ENCORE_CHECK(!(mask >> i & 1) || x.shape()[i] > 0, "max: cannot reduce x ", x.shape(),
                   " over axis ", i, ", which is empty (a maximum needs one value)");
  }
  return reduce_masked(op, x, mask, keepdims);
}

}  // namespace

namespace functions {

Tensor matmul(const Tensor& a, const Tensor& b) {
  return detail::batched_matmul("matmul", a, b, false, false);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_floating("linear", "x", x);
  check_floating("linear", "weight", weight);
  ENCORE_CHECK(weight.dtype() == x.dtype(), "linear: dtypes differ: x is ", x.dtype(), " ",
               x.shape(), ", weight is ", weight.dtype(), " ", weight.shape());
  ENCORE_CHECK(weight.rank() == 2, "linear: weight must be 2-D [out, in], it is ", weight.shape());
  ENCORE_CHECK(x.rank() >= 1 && x.size(-1) == weight.size(1), "linear: x ", x.shape(),
               " does not match weight ", weight.shape(), " (expected x [..., ", weight.size(1),
               "])");
  Shape out_shape;
  for (int i = 0; i + 1 < x.rank(); ++i) out_shape.push_back(x.shape()[i]);
  out_shape.push_back(weight.size(0));
  if (!bias.defined()) return call1(Op::Linear, {x, weight}, out_shape, x.dtype());
  check_floating("linear", "bias", bias);
  ENCORE_CHECK(bias.dtype() == x.dtype(), "linear: dtypes differ: x is ", x.dtype(), " ", x.shape(),
               ", bias is ", bias.dtype(), " ", bias.shape());
  ENCORE_CHECK(bias.rank() == 1 && bias.size(0) == weight.size(0), "linear: bias ", bias.shape(),
               " does not match weight ", weight.shape(), " (expected [", weight.size(0), "])");
  return call1(Op::Linear, {x, weight, bias}, out_shape, x.dtype());
}

Tensor sum(const Tensor& x, std::vector<int> axes, bool keepdims) {
  return reduce(Op::Sum, "sum", x, axes, keepdims);
}
Tensor mean(const Tensor& x, std::vector<int> axes, bool keepdims) {
  return reduce(Op::Mean, "mean", x, axes, keepdims);
}
Tensor max(const Tensor& x, std::vector<int> axes, bool keepdims) {
  return reduce(Op::Max, "max", x, axes, keepdims);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  check_floating("sum_to", "x", x);
  if (x.shape() == shape) return clone(x);  // a new tensor, as any sum gives
  return detail::sum_to_or_self(x, shape);
}

}  // namespace functions

Tensor detail::sum_to_or_self(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int lead = x.rank() - shape.rank();
  ENCORE_CHECK(lead >= 0, "sum_to: cannot sum ", x.shape(), " to the larger rank of ", shape);
  uint8_t mask = 0;
  for (int i = 0; i < x.rank(); ++i) {
    if (i < lead) {
      mask |= static_cast<uint8_t>(1u << i);
      continue;
    }
    const int64_t want = shape[i - lead];
    ENCORE_CHECK(want == x.shape()[i] || want == 1, "sum_to: cannot sum ", x.shape(), " to ",
                 shape);
    if (want == 1 && x.shape()[i] != 1) mask |= static_cast<uint8_t>(1u << i);
  }
  return F::reshape(reduce_masked(Op::Sum, x, mask, true), shape.dims());
}

}  // namespace encore
