// The ops' shape rules of a shape family's sizes (family_builder.h): the output sizes of a
// convolution, pooling, concat, split, slice, matmul, linear, reduction, embedding, permute and
// broadcast from their inputs; the shapes a convolution's or pooling's gradient requires of its
// incoming gradient; and the sizes steps' attributes hold (slice bounds, batch-norm counts,
// layer-norm columns, scalars made from a size).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "runtime/op_traits.h"
#include "schedule/family_builder.h"

namespace encore::schedule::detail {
namespace {

bool is_batch_norm(Op op) {
  return op == Op::BatchNorm || op == Op::BatchNormInference || op == Op::BatchNormGrad ||
         op == Op::BatchNormStatsUpdate;
}

}  // namespace

ExprId SizeBuilder::out_size(ExprId in, int64_t pad2_minus_extent, int64_t stride) {
  return x_.add(x_.floor_div(x_.add(in, x_.constant(pad2_minus_extent)), x_.constant(stride)),
                x_.constant(1));
}

SizeBuilder::Dims SizeBuilder::conv_out(const Dims& x, const Dims& w, const Conv2dAttrs& a) {
  Dims r;
  if (x.rank != 4 || w.rank != 4 || !x_.is_const(w.d[2]) || !x_.is_const(w.d[3])) return r;
  r.rank = 4;
  r.d[0] = x.d[0];
  r.d[1] = w.d[0];
  for (int h = 0; h < 2; ++h) {
    const int64_t extent = int64_t{a.dilation[h]} * (x_.node(w.d[2 + h]).c - 1) + 1;
    r.d[2 + h] = out_size(x.d[2 + h], 2 * int64_t{a.padding[h]} - extent, a.stride[h]);
  }
  return r;
}

SizeBuilder::Dims SizeBuilder::pool_out(const Dims& x, const Pool2dAttrs& a) {
  Dims r;
  if (x.rank != 4) return r;
  r.rank = 4;
  r.d[0] = x.d[0];
  r.d[1] = x.d[1];
  for (int h = 0; h < 2; ++h)
    r.d[2 + h] = out_size(x.d[2 + h], 2 * int64_t{a.padding[h]} - a.kernel[h], a.stride[h]);
  return r;
}

void SizeBuilder::unify_gradient(const Step& s, std::span<const Dims> ins, const Dims& out) {
  // The incoming gradient of a convolution or pooling has the shape of its output.
  auto same = [&](const Dims& a, const Dims& b) {
    if (a.rank != b.rank) return;
    for (int d = 0; d < a.rank; ++d)
      if (a.d[d] >= 0 && b.d[d] >= 0) unify(a.d[d], b.d[d]);
  };
  switch (s.op) {
    case Op::MaxPool2dGrad:  // (x, gy) -> gx
      if (ins.size() == 2) same(ins[1], pool_out(ins[0], s.attrs.as<Pool2dAttrs>()));
      break;
    case Op::AvgPool2dGrad:  // (gy) -> gx
      if (ins.size() == 1) same(ins[0], pool_out(out, s.attrs.as<Pool2dAttrs>()));
      break;
    case Op::Conv2dGradInput:  // (gy, w) -> gx
      if (ins.size() == 2) same(ins[0], conv_out(out, ins[1], s.attrs.as<Conv2dAttrs>()));
      break;
    case Op::Conv2dGradWeight:  // (x, gy) -> gw
      if (ins.size() == 2) same(ins[1], conv_out(ins[0], out, s.attrs.as<Conv2dAttrs>()));
      break;
    default:
      break;
  }
}

SizeBuilder::Dims SizeBuilder::rule_out(int i, int k, std::span<const Dims> ins,
                                        const ExprId* attr_exprs) {
  Dims r;
  const Step& s = step(0, i);
  r.rank = s.out[k].shape.rank();
  auto known = [&](const Dims& d) {
    for (int a = 0; a < d.rank; ++a)
      if (d.d[a] < 0) return false;
    return true;
  };
  for (const Dims& in : ins)
    if (!known(in)) return r;
  switch (s.op) {
    case Op::Conv2d:
      if (ins.size() >= 2 && r.rank == 4) r = conv_out(ins[0], ins[1], s.attrs.as<Conv2dAttrs>());
      break;
    case Op::MaxPool2d:
    case Op::AvgPool2d:
      if (!ins.empty() && r.rank == 4) r = pool_out(ins[0], s.attrs.as<Pool2dAttrs>());
      break;
    case Op::Concat: {
      const int axis = s.attrs.as<AxisAttrs>().axis;
      if (ins.empty() || ins[0].rank != r.rank || axis >= r.rank) break;
      ExprId sum = x_.constant(0);
      for (const Dims& in : ins) {
        if (in.rank != r.rank) return r;
        sum = x_.add(sum, in.d[axis]);
      }
      for (int d = 0; d < r.rank; ++d) r.d[d] = ins[0].d[d];
      r.d[axis] = sum;
      break;
    }
    case Op::Split: {  // the parts' sizes along the axis are their own (below)
      const int axis = s.attrs.as<AxisAttrs>().axis;
      if (ins.empty() || ins[0].rank != r.rank) break;
      for (int d = 0; d < r.rank; ++d)
        if (d != axis) r.d[d] = ins[0].d[d];
      break;
    }
    case Op::Slice: {
      const SliceAttrs& a = s.attrs.as<SliceAttrs>();
      if (ins.empty() || ins[0].rank != r.rank || a.axis >= r.rank || a.step <= 0) break;
      if (attr_exprs[0] < 0 || attr_exprs[1] < 0) break;
      for (int d = 0; d < r.rank; ++d) r.d[d] = ins[0].d[d];
      const ExprId len = x_.add(attr_exprs[1], x_.mul(attr_exprs[0], x_.constant(-1)));
      r.d[a.axis] = x_.floor_div(x_.add(len, x_.constant(a.step - 1)), x_.constant(a.step));
      break;
    }
    case Op::Matmul: {
      if (ins.size() != 2 || ins[0].rank < 2 || ins[1].rank < 2 || r.rank < 2) break;
      const MatmulAttrs& a = s.attrs.as<MatmulAttrs>();
      const Dims &A = ins[0], &B = ins[1];
      r.d[r.rank - 2] = A.d[A.rank - (a.trans_a ? 1 : 2)];
      r.d[r.rank - 1] = B.d[B.rank - (a.trans_b ? 2 : 1)];
      // Batch dimensions broadcast: the one that is not 1 (from the right).
      for (int d = r.rank - 3, da = A.rank - 3, db = B.rank - 3; d >= 0; --d, --da, --db) {
        const ExprId ea = da >= 0 ? A.d[da] : x_.constant(1);
        const ExprId eb = db >= 0 ? B.d[db] : x_.constant(1);
        r.d[d] = x_.is_const(ea) && x_.node(ea).c == 1 ? eb : ea;
      }
      break;
    }
    case Op::Linear: {
      if (ins.size() < 2 || ins[1].rank != 2 || ins[0].rank != r.rank) break;
      for (int d = 0; d + 1 < r.rank; ++d) r.d[d] = ins[0].d[d];
      r.d[r.rank - 1] = ins[1].d[0];
      break;
    }
    case Op::Sum:
    case Op::Mean:
    case Op::Max: {
      if (ins.empty()) break;
      const ReduceAttrs& a = s.attrs.as<ReduceAttrs>();
      int o = 0;
      for (int d = 0; d < ins[0].rank; ++d) {
        const bool reduced = (a.axes_mask >> d & 1) != 0;
        if (reduced && !a.keepdims) continue;
        if (o >= r.rank) return Dims{};
        r.d[o++] = reduced ? x_.constant(1) : ins[0].d[d];
      }
      if (o != r.rank) return Dims{};
      break;
    }
    case Op::Embedding: {
      if (ins.size() != 2 || ins[0].rank != 2 || ins[1].rank + 1 != r.rank) break;
      for (int d = 0; d < ins[1].rank; ++d) r.d[d] = ins[1].d[d];
      r.d[r.rank - 1] = ins[0].d[1];
      break;
    }
    case Op::Permute: {
      if (ins.empty() || ins[0].rank != r.rank) break;
      const PermuteAttrs& a = s.attrs.as<PermuteAttrs>();
      for (int d = 0; d < r.rank; ++d)
        if (a.perm[d] >= 0 && a.perm[d] < r.rank) r.d[d] = ins[0].d[a.perm[d]];
      break;
    }
    case Op::BroadcastTo: {  // aligned from the right: the input's size where it is not 1
      if (ins.empty() || ins[0].rank > r.rank) break;
      for (int d = r.rank - 1, di = ins[0].rank - 1; di >= 0; --d, --di)
        if (!(x_.is_const(ins[0].d[di]) && x_.node(ins[0].d[di]).c == 1)) r.d[d] = ins[0].d[di];
      break;
    }
    default:
      break;
  }
  return r;
}

// A slice's bounds are the bounds asked for, clamped as Python clamps them; a size served must
// clamp them the same way as every traced point did. A bound is, at every point, either as asked
// (a size or a constant, then kept within the dimension by a guard), or clamped to the
// dimension's end (what was asked stays at or past it, by a guard), or counted from the end (a
// negative b asked: the dimension's size + b, kept at or above 0 by a guard), or clamped to 0
// from there (b at or below minus the size, by a guard). On a dimension of one size, a bound
// asked alike at every point is the same at every size. A bound that is one of these at some
// points and another at others keeps the dimension static.
bool SizeBuilder::slice_bounds(int i, std::span<const Dims> ins, ExprId* attr_exprs,
                               std::string& why) {
  const std::string label = step_label(rec(0), i);
  const SliceAttrs& a0 = step(0, i).attrs.as<SliceAttrs>();
  const ExprId n = !ins.empty() && a0.axis < ins[0].rank ? ins[0].d[a0.axis] : -1;
  if (n < 0) {
    why = cat(label, ": the size of the dimension it slices is not known");
    return false;
  }
  // A copy: resolve() makes nodes, which may move the pool's values.
  std::array<int64_t, kMaxFamilyPoints> nv{}, got{}, asked{};
  std::copy_n(x_.values(n).begin(), P_, nv.begin());
  const std::span<const int64_t> gs(got.data(), P_), as(asked.data(), P_);
  for (int bound = 0; bound < 2; ++bound) {
    const char* name = bound == 0 ? "start" : "stop";
    for (size_t p = 0; p < P_; ++p) {
      const SliceAttrs& s = step(p, i).attrs.as<SliceAttrs>();
      got[p] = bound == 0 ? s.start : s.stop;
      asked[p] = bound == 0 ? s.asked_start : s.asked_stop;
    }
    auto every = [&](auto pred) {
      for (size_t p = 0; p < P_; ++p)
        if (!pred(p)) return false;
      return true;
    };
    // The ways each point's bound follows from what was asked, a bit each; `common`: those of
    // every point.
    enum : unsigned { kAsAsked = 1, kToEnd = 2, kFromEnd = 4, kToZero = 8 };
    unsigned common = kAsAsked | kToEnd | kFromEnd | kToZero;
    bool each_one_way = true;
    for (size_t p = 0; p < P_; ++p) {
      const unsigned ways = (asked[p] >= 0 && asked[p] == got[p] ? kAsAsked : 0u) |
                            (got[p] == nv[p] && asked[p] >= nv[p] ? kToEnd : 0u) |
                            (asked[p] < 0 && got[p] == nv[p] + asked[p] ? kFromEnd : 0u) |
                            (asked[p] < 0 && got[p] == 0 && nv[p] + asked[p] <= 0 ? kToZero : 0u);
      common &= ways;
      each_one_way = each_one_way && ways != 0;
    }
    const bool same_asked = every([&](size_t p) { return asked[p] == asked[0]; });
    const std::string what = cat(label, "'s ", name);
    ExprId e = -1;
    bool asked_alike = false;  // the bound is what was asked, and that is one constant
    if (x_.is_const(n) && same_asked && every([&](size_t p) { return got[p] == got[0]; }) &&
        !symbolic_gives(as, ins)) {
      e = x_.constant(got[0]);  // a constant bound of a dimension of one size: clamped alike
    } else if ((common & kAsAsked) != 0) {
      e = resolve(gs, ins, what);
      if (e >= 0) guard(e, n, what, /*at_most=*/true);
      asked_alike = e >= 0 && x_.is_const(e);
    } else if ((common & kToEnd) != 0) {
      if (const ExprId past = resolve(as, ins, what); past >= 0) {
        e = n;
        guard(n, past, cat(what, " (clamped to the end)"), /*at_most=*/true);
      }
    } else if ((common & kFromEnd) != 0) {
      if (same_asked) {
        e = x_.add(n, x_.constant(asked[0]));
        guard(x_.constant(0), e, cat(what, " (from the end)"), /*at_most=*/true);
        asked_alike = true;
      }
    } else if ((common & kToZero) != 0) {
      if (same_asked) {
        e = x_.constant(0);
        guard(n, x_.constant(-asked[0]), cat(what, " (from the end, clamped to 0)"),
              /*at_most=*/true);
      }
    }
    if (e < 0) {
      // Each point alone one of the ways, but no one way at every point: the clamping differs
      // between the traced sizes.
      f_.clamps_differ = each_one_way && common == 0;
      why =
          cat(what, " is ", values_text(gs), " (", values_text(as), " asked) at the traced sizes, ",
              f_.clamps_differ ? "clamped at some and not at others"
                               : "which no size of the trace explains");
      return false;
    }
    attr_exprs[bound] = e;
    // A bound of the function's own slice asked alike and followed as asked in a dimension
    // whose size changes (not a start of 0, one left out; one clamped is kept so by a guard; the
    // backward's slices follow the forward's shapes) may be the function's arithmetic on that
    // size: the family keeps the size between its traced values (ShapeFamily::ranges).
    // So may a bound asked as the whole size at every point (n - n % 4 at multiples of 4).
    const bool forward_of_dynamic = !x_.is_const(n) && i < static_cast<int>(rec(0).forward.size());
    const auto [lo, hi] = std::minmax_element(nv.begin(), nv.begin() + P_);
    if (forward_of_dynamic && asked_alike && (asked[0] != 0 || bound == 1))
      f_.ranges.push_back({n, *lo, *hi, 0, cat(what, ", ", asked[0], " at every traced size,")});
    if (forward_of_dynamic && (common & kAsAsked) != 0 &&
        every([&](size_t p) { return got[p] == nv[p]; })) {
      int64_t step = 0;
      for (size_t p = 0; p < P_; ++p) step = std::gcd(step, nv[p] - *lo);
      f_.ranges.push_back(
          {n, *lo, *hi, step, cat(what, ", the whole size it slices at every traced size,")});
    }
    if (!x_.is_const(e)) {
      f_.attrs.push_back({i, bound == 0 ? kSliceStart : kSliceStop, e, 0, 0});
      Dims bound_size;  // the slice's gradient reads the same bound
      bound_size.rank = 1;
      bound_size.d[0] = e;
      remember(bound_size);
    }
  }
  guard(attr_exprs[0], attr_exprs[1], cat(label, "'s start (within its stop)"), /*at_most=*/true);
  return true;
}

bool SizeBuilder::resolve_attrs(int i, std::span<const Dims> ins, ExprId* attr_exprs,
                                std::string& why) {
  const Step& s0 = step(0, i);
  const std::string label = step_label(rec(0), i);
  std::array<int64_t, kMaxFamilyPoints> v{};
  const std::span<const int64_t> vs(v.data(), P_);
  auto int_slot = [&](uint8_t field, int slot, auto get, ExprId rule, const char* name) {
    for (size_t p = 0; p < P_; ++p) v[p] = get(step(p, i).attrs);
    const ExprId e =
        rule >= 0 && values_are(rule, vs) ? rule : resolve(vs, ins, cat(label, "'s ", name));
    if (e < 0) {
      why = cat(label, ": its ", name, " is ", values_text(vs),
                " at the traced sizes, which no size of the trace explains");
      return false;
    }
    attr_exprs[slot] = e;
    if (!x_.is_const(e)) f_.attrs.push_back({i, field, e, 0, 0});
    return true;
  };
  if (s0.op == Op::Slice) return slice_bounds(i, ins, attr_exprs, why);
  if (s0.attrs.holds<SliceAttrs>())  // a slice's gradient: the bounds its slice checked
    return int_slot(
               kSliceStart, 0, [](const AttrBlob& a) { return a.as<SliceAttrs>().start; }, -1,
               "start") &&
           int_slot(
               kSliceStop, 1, [](const AttrBlob& a) { return a.as<SliceAttrs>().stop; }, -1,
               "stop");
  if (is_batch_norm(s0.op)) {
    ExprId rule = -1;  // elements per channel: numel(x) / x.size(1)
    if (!ins.empty() && ins[0].rank >= 2 && s0.op != Op::BatchNormStatsUpdate)
      rule = x_.floor_div(product(ins[0], 0, ins[0].rank), ins[0].d[1]);
    if (!int_slot(
            kBatchNormCount, 0, [](const AttrBlob& a) { return a.as<BatchNormAttrs>().count; },
            rule, "count"))
      return false;
    Dims count;
    count.rank = 1;
    count.d[0] = attr_exprs[0];
    remember(count);  // the statistics update reads the same count
    return true;
  }
  if (s0.attrs.holds<LayerNormAttrs>())
    return int_slot(
        kLayerNormCols, 0, [](const AttrBlob& a) { return a.as<LayerNormAttrs>().cols; }, -1,
        "columns");
  if (!s0.attrs.holds<ScalarAttrs>()) return true;

  // A scalar: the same at every size (a constant, unless a size gives it as well), a size, or
  // k / a size (the gradients of mean and mean_squared_error).
  double sv[kMaxFamilyPoints] = {};
  for (size_t p = 0; p < P_; ++p) sv[p] = step(p, i).attrs.as<ScalarAttrs>().value;
  const bool constant =
      std::all_of(sv, sv + P_, [&](double y) { return std::memcmp(&y, &sv[0], sizeof y) == 0; });
  const bool integral =
      std::all_of(sv, sv + P_, [](double y) { return std::abs(y) < 9e15 && y == std::floor(y); });
  if (integral) {
    for (size_t p = 0; p < P_; ++p) v[p] = static_cast<int64_t>(sv[p]);
    if (constant) {
      // A constant, unless a size of the trace gives the same value at every point: guarded.
      if (auto it = seen_.find(key(vs)); it != seen_.end())
        for (ExprId e : it->second) guard(x_.constant(v[0]), e, cat(label, "'s scalar"));
    } else if (const ExprId e = resolve(vs, ins, cat(label, "'s scalar")); e >= 0) {
      f_.attrs.push_back({i, kScalar, e, 0, 0});
      return true;
    }
  }
  // k / e: k from the first point, checked bit for bit at every point (not for 0 or an
  // infinity, which k / e gives for any e). A scalar the same at every point is a constant,
  // unless 1 / e or 2 / e (a mean's, a squared error's gradient) gives it: guarded. k must be a
  // power of two: then k / e, k * (1 / e) and (1 / e) * k round alike, so the value is eager's
  // at every size whichever the code computed; for another k they may differ at a size not
  // traced.
  const bool finite_nonzero =
      std::all_of(sv, sv + P_, [](double y) { return std::isfinite(y) && y != 0; });
  if (finite_nonzero)
    for (ExprId e : seen_list_) {
      const std::span<const int64_t> u = x_.values(e);
      if (std::any_of(u.begin(), u.end(), [](int64_t y) { return y <= 0; })) continue;
      double k = sv[0] * static_cast<double>(u[0]);
      if (const double r = std::nearbyint(k); std::abs(k - r) <= 1e-9 * std::abs(k)) k = r;
      if (constant && k != 1 && k != 2) continue;
      if (int exp = 0; std::abs(std::frexp(k, &exp)) != 0.5) continue;
      bool fits = true;
      for (size_t p = 0; p < P_ && fits; ++p) fits = k / static_cast<double>(u[p]) == sv[p];
      if (!fits) continue;
      if (constant) {
        guard(x_.constant(u[0]), e, cat(label, "'s scalar"));
        continue;
      }
      f_.attrs.push_back({i, kScalar, e, 1, k});
      return true;
    }
  if (constant) return true;
  std::string seen;
  for (size_t p = 0; p < P_; ++p) seen += cat(p ? ", " : "", sv[p]);
  why = cat(label, ": its scalar is ", seen,
            " at the traced sizes, computed from a size by code the trace cannot follow");
  return false;
}

}  // namespace encore::schedule::detail
