// Whether two traces of a static function differ in anything but sizes (structure_diff): what a
// shape family needs of its evidence (shape_family.h), and, when they differ, the first
// difference, which is why their dimensions stay static.
#include <cstring>
#include <vector>

#include "runtime/cuda.h"
#include "runtime/error.h"
#include "runtime/op_traits.h"
#include "schedule/shape_family.h"  // structure_diff, step_label

namespace encore::schedule::detail {
namespace {

// The attributes of a step with its sizes zeroed, so that two traces' steps compare equal when
// they differ in sizes only.
AttrBlob without_sizes(Op op, const AttrBlob& a) {
  AttrBlob b = a;
  if (op_draws_random(op)) {  // each trace draws its own stream; the distribution must agree
    RandomAttrs r = a.as<RandomAttrs>();
    r.seed = r.offset = r.state_ptr = 0;
    b = AttrBlob::of(r);
  } else if (a.holds<SliceAttrs>()) {
    SliceAttrs s = a.as<SliceAttrs>();
    s.start = s.stop = s.asked_start = s.asked_stop = 0;
    b = AttrBlob::of(s);
  } else if (a.holds<BatchNormAttrs>()) {
    BatchNormAttrs s = a.as<BatchNormAttrs>();
    s.count = 0;
    b = AttrBlob::of(s);
  } else if (a.holds<LayerNormAttrs>()) {
    LayerNormAttrs s = a.as<LayerNormAttrs>();
    s.cols = 0;
    b = AttrBlob::of(s);
  } else if (a.holds<ScalarAttrs>()) {
    b = AttrBlob::of(ScalarAttrs{});
  }
  return b;
}

// Whether a bound tensor holds the same values at two traces (constants made inside each call
// are different tensors; a value read from a size would make them differ).
bool same_bound(const Tensor& a, const Tensor& b) {
  if (a.is_same(b) || (a.defined() && b.defined() && a.impl()->storage == b.impl()->storage &&
                       a.impl()->offset == b.impl()->offset))
    return true;
  if (!a.defined() || !b.defined() || a.dtype() != b.dtype() || !(a.shape() == b.shape()))
    return false;
  std::vector<unsigned char> x(a.nbytes()), y(b.nbytes());
  cuda::copy_bytes(x.data(), Device::cpu(), a.raw_data(), a.device(), x.size());
  cuda::copy_bytes(y.data(), Device::cpu(), b.raw_data(), b.device(), y.size());
  return x == y;
}

// " (first read by step 12 (forward) add)": where a buffer is first read, for messages.
std::string first_reader(const Recording& r, size_t buf) {
  const int nf = static_cast<int>(r.forward.size()), n = nf + static_cast<int>(r.backward.size());
  for (int i = 0; i < n; ++i) {
    const Step& s = i < nf ? r.forward[i] : r.backward[i - nf];
    for (const Operand& o : s.in)
      if (static_cast<size_t>(o.buf) == buf) return cat(" (first read by ", step_label(r, i), ")");
  }
  return "";
}

}  // namespace

// How two traces differ in anything but sizes ("" when they do not).
std::string structure_diff(const Recording& a, const Recording& b) {
  if (!a.unsafe.empty() || !b.unsafe.empty()) return "a trace was unsafe";
  if (a.saw_backward != b.saw_backward) return "one trace ran a backward inside, the other not";
  auto same_operand = [](const Operand& x, const Operand& y) {
    return x.buf == y.buf && x.dtype == y.dtype && x.shape.rank() == y.shape.rank();
  };
  const std::vector<Step>* phases_a[] = {&a.forward, &a.backward};
  const std::vector<Step>* phases_b[] = {&b.forward, &b.backward};
  for (int ph = 0; ph < 2; ++ph)
    if (phases_a[ph]->size() != phases_b[ph]->size())
      return cat(
          "the ", ph == 0 ? "forward" : "backward", " ran ", phases_a[ph]->size(),
          " ops at one traced size and ", phases_b[ph]->size(),
          " at another (a loop over a size, or a size made from it that is 1 at one of them?)");
  for (int ph = 0; ph < 2; ++ph) {
    const std::vector<Step>&x = *phases_a[ph], &y = *phases_b[ph];
    const char* what = ph == 0 ? "forward" : "backward";
    for (size_t i = 0; i < x.size(); ++i) {
      const Step &s = x[i], &t = y[i];
      if (s.op != t.op)
        return cat("step ", i, " (", what, ") is ", op_name(s.op), " at one traced size and ",
                   op_name(t.op), " at another");
      bool same = s.in.size() == t.in.size() && s.out.size() == t.out.size();
      for (size_t k = 0; same && k < s.in.size(); ++k) same = same_operand(s.in[k], t.in[k]);
      for (size_t k = 0; same && k < s.out.size(); ++k) same = same_operand(s.out[k], t.out[k]);
      if (!same)
        return cat("step ", i, " (", what, ") ", op_name(s.op),
                   " reads or writes other tensors at one traced size than at another");
      // Live attributes (a learning rate) are read at every call, whatever each trace saw.
      const bool live_s = s.live >= 0 && a.guard_live[s.live],
                 live_t = t.live >= 0 && b.guard_live[t.live];
      if (live_s != live_t)
        return cat("step ", i, " (", what, ") ", op_name(s.op),
                   " takes its attributes live at one traced size and not at another");
      const AttrBlob p = without_sizes(s.op, s.attrs), q = without_sizes(t.op, t.attrs);
      if (!live_s && std::memcmp(p.bytes, q.bytes, AttrBlob::kCapacity) != 0)
        return cat("step ", i, " (", what, ") ", op_name(s.op),
                   " has other attributes at one traced size than at another");
    }
  }
  if (a.buffers.size() != b.buffers.size())
    return cat("the traces used ", a.buffers.size(), " and ", b.buffers.size(), " buffers");
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    const Buffer &x = a.buffers[i], &y = b.buffers[i];
    if (x.kind != y.kind || x.index != y.index || x.device != y.device || x.mutated != y.mutated)
      return cat("buffer ", i, first_reader(a, i), " is a different kind of tensor in the traces");
    if (x.kind == BufKind::External && !same_bound(x.bound, y.bound))
      return cat("buffer ", i, first_reader(a, i),
                 " is a tensor made in the call (a constant) or captured, ", x.bound.shape(),
                 " and ", y.bound.shape(), ", whose values differ between the traces");
  }
  if (a.leaves.size() != b.leaves.size()) return "the traces touched different leaves";
  for (size_t i = 0; i < a.leaves.size(); ++i) {
    const Leaf &x = a.leaves[i], &y = b.leaves[i];
    if (x.param != y.param || x.buf != y.buf || x.first != y.first ||
        x.final_grad != y.final_grad || !x.tensor.is_same(y.tensor))
      return cat("leaf ", i, " is used differently in the traces");
  }
  if (a.results.size() != b.results.size() || a.differentiable != b.differentiable ||
      a.result_twin != b.result_twin || a.result_arg != b.result_arg ||
      a.result_leaf != b.result_leaf || a.grad_given != b.grad_given)
    return "the traces returned different results";
  for (size_t i = 0; i < a.results.size(); ++i)
    if (!same_operand(a.results[i], b.results[i]))
      return cat("result ", i, " is a different tensor in the traces");
  if (a.contributions.size() != b.contributions.size())
    return "the traces' backwards delivered different gradients";
  for (size_t i = 0; i < a.contributions.size(); ++i) {
    const auto &x = a.contributions[i], &y = b.contributions[i];
    if (x.arg != y.arg || x.index != y.index || !same_operand(x.grad, y.grad))
      return cat("gradient contribution ", i, " differs between the traces");
  }
  return {};
}

}  // namespace encore::schedule::detail
