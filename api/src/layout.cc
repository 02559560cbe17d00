// Layout routines: reshape/flatten (views), permute, broadcast_to, concat, slice.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "api/src/routine.h"

namespace encore {
namespace F = functions;
using detail::call1;
using detail::check_defined;

namespace detail {
Tensor slice_grad(const Tensor& gy, const Shape& input_shape, const SliceAttrs& attrs) {
  return call1(Op::SliceGrad, {gy}, input_shape, gy.dtype(), AttrBlob::of(attrs));
}
}  // namespace detail

namespace {

void reshape_backward(BackwardContext& c) {
  c.set_input_grad(0, F::reshape(c.grad_output(), c.input_meta(0).shape.dims()));
}

void permute_backward(BackwardContext& c) {
  const auto& at = c.attrs<PermuteAttrs>();
  const int r = c.grad_output().rank();
  int inverse[Shape::kMaxRank];
  for (int i = 0; i < r; ++i) inverse[at.perm[i]] = i;
  c.set_input_grad(0, F::permute(c.grad_output(), std::span<const int>(inverse, r)));
}

void broadcast_to_backward(BackwardContext& c) {
  c.set_input_grad(0, detail::sum_to_or_self(c.grad_output(), c.input_meta(0).shape));
}

void concat_backward(BackwardContext& c) {
  const int axis = c.attrs<AxisAttrs>().axis;
  int64_t offset = 0;
  for (int i = 0; i < c.num_inputs(); ++i) {
    const int64_t n = c.input_meta(i).shape[axis];
    if (c.needs_input_grad(i))
      c.set_input_grad(i, F::slice(c.grad_output(), axis, offset, offset + n));
    offset += n;
  }
}

// The parts' gradients side by side (an unused part's is zeros, filled by the engine).
void split_backward(BackwardContext& c) {
  std::vector<Tensor> parts;
  for (int i = 0; i < c.num_outputs(); ++i) parts.push_back(c.grad_output(i));
  c.set_input_grad(0, F::concat(parts, c.attrs<AxisAttrs>().axis));
}

void slice_backward(BackwardContext& c) {
  c.set_input_grad(
      0, detail::slice_grad(c.grad_output(), c.input_meta(0).shape, c.attrs<SliceAttrs>()));
}

const bool kRegistered = [] {
  register_backward(Op::Reshape, {reshape_backward});
  register_backward(Op::Permute, {permute_backward});
  register_backward(Op::BroadcastTo, {broadcast_to_backward});
  register_backward(Op::Concat, {concat_backward});
  register_backward(Op::Split, {split_backward});
  register_backward(Op::Slice, {slice_backward});
  return true;
}();

}  // namespace

namespace functions {

Tensor reshape(const Tensor& x, std::span<const int64_t> shape) {
  check_defined("reshape", "x", x);
  ENCORE_CHECK(shape.size() <= Shape::kMaxRank, "reshape: rank ", shape.size(),
               " exceeds the maximum of ", Shape::kMaxRank);
  int infer = -1;
  int64_t known = 1;
  Shape s;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      ENCORE_CHECK(infer < 0, "reshape: more than one -1 in the new shape of ", x.shape());
      infer = static_cast<int>(i);
      s.push_back(1);
      continue;
    }
    ENCORE_CHECK(shape[i] >= 0, "reshape: invalid dimension ", shape[i], " for ", x.shape());
    ENCORE_CHECK(!__builtin_mul_overflow(known, shape[i], &known), "reshape: the new shape of ",
                 x.shape(), " has too many elements");
    s.push_back(shape[i]);
  }
  if (infer >= 0) {
    ENCORE_CHECK(known > 0 && x.numel() % known == 0, "reshape: cannot reshape ", x.shape(), " (",
                 x.numel(), " elements) with a -1 into ", known, "-element blocks");
    s.set(infer, x.numel() / known);
  }
  ENCORE_CHECK(s.numel() == x.numel(), "reshape: cannot reshape ", x.shape(), " (", x.numel(),
               " elements) to ", s, " (", s.numel(), " elements)");
  if (s == x.shape()) return x;
  Tensor y = Tensor::view_of(x, s);
  dispatch(Op::Reshape, {x}, {y});
  return y;
}

Tensor reshape(const Tensor& x, std::initializer_list<int64_t> shape) {
  return reshape(x, std::span<const int64_t>(shape.begin(), shape.size()));
}

Tensor flatten(const Tensor& x, int start_dim, int end_dim) {
  check_defined("flatten", "x", x);
  if (x.rank() == 0) return reshape(x, {1});
  const int s = normalize_axis(start_dim, x.rank(), "flatten");
  const int e = normalize_axis(end_dim, x.rank(), "flatten");
  ENCORE_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim, " for ",
               x.shape());
  int64_t dims[Shape::kMaxRank];
  int n = 0;
  for (int i = 0; i < s; ++i) dims[n++] = x.shape()[i];
  int64_t merged = 1;
  for (int i = s; i <= e; ++i) merged *= x.shape()[i];
  dims[n++] = merged;
  for (int i = e + 1; i < x.rank(); ++i) dims[n++] = x.shape()[i];
  return reshape(x, std::span<const int64_t>(dims, n));
}

Tensor permute(const Tensor& x, std::span<const int> perm) {
  check_defined("permute", "x", x);
  const int r = x.rank();
  ENCORE_CHECK(static_cast<int>(perm.size()) == r, "permute: ", perm.size(), " axes given for ",
               x.shape());
  PermuteAttrs at;
  Shape s;
  uint32_t seen = 0;
  bool identity = true;
  for (int i = 0; i < r; ++i) {
    const int p = normalize_axis(perm[i], r, "permute");
    ENCORE_CHECK(!(seen >> p & 1), "permute: axis ", perm[i], " appears twice for ", x.shape());
    seen |= 1u << p;
    at.perm[i] = static_cast<int8_t>(p);
    identity &= p == i;
    s.push_back(x.shape()[p]);
  }
  if (identity) return clone(x);  // a new tensor, as any permutation gives
  return call1(Op::Permute, {x}, s, x.dtype(), AttrBlob::of(at));
}

Tensor permute(const Tensor& x, std::initializer_list<int> perm) {
  return permute(x, std::span<const int>(perm.begin(), perm.size()));
}

Tensor transpose(const Tensor& x, int dim0, int dim1) {
  check_defined("transpose", "x", x);
  const int r = x.rank();
  const int a = normalize_axis(dim0, r, "transpose"), b = normalize_axis(dim1, r, "transpose");
  int perm[Shape::kMaxRank];
  std::iota(perm, perm + r, 0);
  std::swap(perm[a], perm[b]);
  return permute(x, std::span<const int>(perm, r));
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  check_defined("broadcast_to", "x", x);
  ENCORE_CHECK(broadcast_shapes(x.shape(), shape, "broadcast_to", "x", "the shape") == shape,
               "broadcast_to: cannot broadcast ", x.shape(), " to ", shape);
  if (x.shape() == shape) return clone(x);  // a new tensor, as any broadcast gives
  return call1(Op::BroadcastTo, {x}, shape, x.dtype());
}

Tensor concat(std::span<const Tensor> xs, int axis) {
  ENCORE_CHECK(!xs.empty(), "concat: no tensors given");
  for (size_t i = 0; i < xs.size(); ++i)
    ENCORE_CHECK(xs[i].defined(), "concat: tensor ", i, " is undefined");
  const Tensor& x0 = xs[0];
  ENCORE_CHECK(x0.rank() > 0, "concat: cannot concatenate 0-d tensors");
  const int ax = normalize_axis(axis, x0.rank(), "concat");
  Shape s = x0.shape();
  for (size_t i = 1; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    ENCORE_CHECK(x.dtype() == x0.dtype(), "concat: tensor ", i, " is ", x.dtype(),
                 " but tensor 0 is ", x0.dtype());
    bool ok = x.rank() == x0.rank();
    for (int d = 0; ok && d < x0.rank(); ++d) ok = d == ax || x.shape()[d] == x0.shape()[d];
    ENCORE_CHECK(ok, "concat: tensor ", i, " ", x.shape(), " does not match tensor 0 ", x0.shape(),
                 " outside axis ", ax);
    s.set(ax, s[ax] + x.shape()[ax]);
  }
  Tensor out = Tensor::empty(s, x0.dtype(), x0.device());
  dispatch(Op::Concat, xs, std::span<Tensor>(&out, 1), AttrBlob::of(AxisAttrs{ax}));
  return out;
}

Tensor concat(std::initializer_list<Tensor> xs, int axis) {
  return concat(std::span<const Tensor>(xs.begin(), xs.size()), axis);
}

namespace {

// Split into up to kMaxOpOutputs parts (one op); more parts split into groups first, so that
// every op's backward is one concat.
void split_into(const Tensor& x, std::span<const int64_t> sizes, int axis,
                std::vector<Tensor>& out) {
  const auto n = static_cast<int64_t>(sizes.size());
  if (n <= kMaxOpOutputs) {
    std::vector<Tensor> parts;
    for (int64_t s : sizes) {
      Shape shape = x.shape();
      shape.set(axis, s);
      parts.push_back(Tensor::empty(shape, x.dtype(), x.device()));
    }
    dispatch(Op::Split, std::span<const Tensor>(&x, 1), parts, AttrBlob::of(AxisAttrs{axis}));
    for (Tensor& p : parts) out.push_back(std::move(p));
    return;
  }
  // At most kMaxOpOutputs groups of consecutive parts.
  const int64_t per_group = (n + kMaxOpOutputs - 1) / kMaxOpOutputs;
  std::vector<int64_t> group_sizes;
  for (int64_t g = 0; g < n; g += per_group) {
    int64_t total = 0;
    for (int64_t i = g; i < std::min(n, g + per_group); ++i) total += sizes[i];
    group_sizes.push_back(total);
  }
  std::vector<Tensor> groups;
  split_into(x, group_sizes, axis, groups);
  for (size_t k = 0; k < groups.size(); ++k) {
    const int64_t g = static_cast<int64_t>(k) * per_group;
    split_into(groups[k], sizes.subspan(g, std::min(n, g + per_group) - g), axis, out);
  }
}

}  // namespace

std::vector<Tensor> split(const Tensor& x, std::span<const int64_t> sizes, int axis) {
  check_defined("split", "x", x);
  ENCORE_CHECK(x.rank() > 0, "split: cannot split a 0-d tensor");
  const int ax = normalize_axis(axis, x.rank(), "split");
  ENCORE_CHECK(!sizes.empty(), "split: no sizes given for x ", x.shape());
  int64_t total = 0;
  for (int64_t s : sizes) {
    ENCORE_CHECK(s >= 0, "split: sizes must be >= 0, got ", s, " for x ", x.shape());
    ENCORE_CHECK(!__builtin_add_overflow(total, s, &total), "split: sizes add up to more than ",
                 INT64_MAX, " (x ", x.shape(), " has ", x.shape()[ax], " along axis ", ax, ")");
  }
  ENCORE_CHECK(total == x.shape()[ax], "split: sizes add up to ", total, " but x ", x.shape(),
               " has ", x.shape()[ax], " along axis ", ax);
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  split_into(x, sizes, ax, out);
  return out;
}

std::vector<Tensor> split(const Tensor& x, std::initializer_list<int64_t> sizes, int axis) {
  return split(x, std::span<const int64_t>(sizes.begin(), sizes.size()), axis);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int axis) {
  check_defined("chunk", "x", x);
  ENCORE_CHECK(x.rank() > 0, "chunk: cannot chunk a 0-d tensor");
  const int ax = normalize_axis(axis, x.rank(), "chunk");
  const int64_t n = x.shape()[ax];
  ENCORE_CHECK(chunks > 0 && n % chunks == 0, "chunk: x ", x.shape(), " has ", n, " along axis ",
               ax, ", not a positive multiple of ", chunks, " chunks");
  return split(x, std::vector<int64_t>(static_cast<size_t>(chunks), n / chunks), ax);
}

Tensor slice(const Tensor& x, int axis, int64_t start, int64_t stop, int64_t step) {
  check_defined("slice", "x", x);
  ENCORE_CHECK(x.rank() > 0, "slice: cannot slice a 0-d tensor");
  const int ax = normalize_axis(axis, x.rank(), "slice");
  ENCORE_CHECK(step > 0, "slice: step must be positive, it is ", step);
  const int64_t n = x.shape()[ax];
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  const int64_t first = clamp(start), end = std::max(first, clamp(stop));
  Shape s = x.shape();
  s.set(ax, end > first ? (end - first - 1) / step + 1 : 0);
  return call1(Op::Slice, {x}, s, x.dtype(),
               AttrBlob::of(SliceAttrs{ax, first, end, step, start, stop}));
}

}  // namespace functions
}  // namespace encore
