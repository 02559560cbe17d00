// The sizes of a shape family as expressions in its symbols (shape_family.h): walked over all the
// traced recordings at once, step by step. Each operand's dimensions come, in this order of
// preference, from
//  - the buffer it reads: the shape its producer wrote (the same shape, or a reshape of it,
//    grouped by equal products);
//  - the op's shape rule (convolution, pooling, concat, slice, matmul, linear, reductions,
//    embedding, permute, broadcast);
//  - an input of the step with the same shape (elementwise ops, softmax, normalisation, most
//    gradients);
//  - the sizes seen so far with the same values at every traced point;
//  - a constant, when the size is the same at every point.
// Where more than one of the last two fits, the first is taken and a guard that the others
// equal it is kept (shape_family.h). A size the same at every point that a symbolic size gives as
// well is first a variable: an elementwise op that reads it beside an operand of the same shape
// settles it as that operand's size (the op needs equal shapes at every size the family serves),
// which drops the guard; a variable nothing settles is the constant, guarded.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "runtime/error.h"
#include "runtime/op_traits.h"
#include "schedule/shape_family.h"

namespace encore::schedule::detail {
namespace {

using Key = std::array<int64_t, kMaxFamilyPoints>;

bool is_batch_norm(Op op) {
  return op == Op::BatchNorm || op == Op::BatchNormInference || op == Op::BatchNormGrad ||
         op == Op::BatchNormStatsUpdate;
}

std::string values_text(std::span<const int64_t> v) {
  std::string s;
  for (size_t p = 0; p < v.size(); ++p) s += cat(p ? ", " : "", v[p]);
  return s;
}

class Builder {
 public:
  explicit Builder(ShapeFamily& f) : f_(f), x_(f.pool), P_(f.points.size()) {}
  bool run(std::string& why);

 private:
  // An operand's dimensions as expressions (-1: not known yet).
  struct Dims {
    std::array<ExprId, Shape::kMaxRank> d;
    int rank = 0;
    Dims() { d.fill(-1); }
  };
  // One operand at every point.
  using Ops = std::vector<const Operand*>;

  const Recording& rec(size_t p) const { return *f_.points[p].rec; }
  const Step& step(size_t p, int i) const {
    const int nf = static_cast<int>(rec(p).forward.size());
    return i < nf ? rec(p).forward[i] : rec(p).backward[i - nf];
  }
  Key key(std::span<const int64_t> v) const {
    Key k{};
    std::copy(v.begin(), v.end(), k.begin());
    return k;
  }
  std::span<const int64_t> dim_values(const Ops& ops, int d) {
    for (size_t p = 0; p < P_; ++p) scratch_[p] = ops[p]->shape[d];
    return {scratch_.data(), P_};
  }
  bool values_are(ExprId e, std::span<const int64_t> v) const {
    const std::span<const int64_t> got = x_.values(e);
    return std::equal(got.begin(), got.end(), v.begin(), v.end());
  }
  // Whether `s` has the operand's shape at every point.
  bool same_shape(const Dims& s, const Ops& ops) {
    if (s.rank != ops[0]->shape.rank()) return false;
    for (int d = 0; d < s.rank; ++d)
      if (s.d[d] < 0 || !values_are(s.d[d], dim_values(ops, d))) return false;
    return true;
  }
  ExprId product(const Dims& s, int i, int j) {
    ExprId e = x_.constant(1);
    for (int k = i; k < j; ++k) e = x_.mul(e, s.d[k]);
    return e;
  }
  // `a` was taken for `what`, which `b` gives as well at every point.
  void guard(ExprId a, ExprId b, const std::string& what) {
    if (a == b) return;
    for (const ShapeFamily::Guard& g : f_.guards)
      if (g.taken == a && g.other == b) return;
    f_.guards.push_back({a, b, what});
  }
  // Remembers a shape's dimensions and products of consecutive dimensions (symbolic ones).
  void remember(const Dims& s);
  // A size with values `v` at the points from the dimensions (or products of consecutive
  // dimensions) of `locals`, from the sizes seen so far, or a constant; -1 when none has them.
  ExprId resolve(std::span<const int64_t> v, std::span<const Dims> locals, const std::string& what);
  // The operand's dimensions from `src` (the shape its buffer was written with) when it is that
  // shape or a reshape of it: groups of consecutive dimensions with equal products.
  void from_source(const Dims& src, const Ops& ops, Dims& out);
  // The rule of step i's output k, from its inputs (entries -1 where it has none).
  Dims rule_out(int i, int k, std::span<const Dims> ins, const ExprId* attr_exprs);
  bool resolve_attrs(int i, std::span<const Dims> ins, ExprId* attr_exprs, std::string& why);
  // Fills `out` for an operand: entries already set stay; the rest from `src`, `rule`, the
  // inputs of the same shape, then one by one. Then checks bound buffers keep their shapes,
  // stores the expressions and remembers them.
  bool operand(const Ops& ops, const Dims* src, const Dims* rule, std::span<const Dims> locals,
               Dims& out, const std::string& what, std::string& why);
  bool run_steps(int begin, int end, std::string& why);
  // The variable `e` is settled as (itself when not a variable, or not settled).
  ExprId find(ExprId e) {
    while (x_.is_var(e)) {
      auto it = parent_.find(e);
      if (it == parent_.end()) break;
      e = it->second;
    }
    return e;
  }
  void unify(ExprId a, ExprId b) {
    a = find(a);
    b = find(b);
    if (a == b) return;
    if (x_.is_var(a))
      parent_[a] = b;
    else if (x_.is_var(b))
      parent_[b] = a;
  }
  // The operands of an elementwise step of the same shape as its output: their sizes are equal.
  void unify_elementwise(const Step& s, std::span<const Dims> ins, const Dims& out);
  // A convolution's or pooling's gradient: its incoming gradient has the forward output's shape.
  void unify_gradient(const Step& s, std::span<const Dims> ins, const Dims& out);
  // Output sizes of a convolution (x, w) and of a pooling (x), or rank 0 when not 4-D.
  ExprId out_size(ExprId in, int64_t pad2_minus_extent, int64_t stride);
  Dims conv_out(const Dims& x, const Dims& w, const Conv2dAttrs& a);
  Dims pool_out(const Dims& x, const Pool2dAttrs& a);
  // Every stored expression with its variables replaced by what settled them (or their value).
  void settle_variables();

  ShapeFamily& f_;
  ExprPool& x_;
  const size_t P_;
  std::array<int64_t, kMaxFamilyPoints> scratch_{};
  absl::flat_hash_map<Key, absl::InlinedVector<ExprId, 2>> seen_;
  std::vector<ExprId> seen_list_;  // the first expression of each key, in order
  std::vector<Dims> buf_dims_;     // per buffer: the shape it was written (or bound) with
  absl::flat_hash_map<ExprId, ExprId> parent_;  // variable -> what settled it
};

void Builder::remember(const Dims& s) {
  for (int i = 0; i < s.rank; ++i) {
    bool symbolic = false;
    ExprId e = x_.constant(1);
    for (int j = i; j < s.rank; ++j) {
      if (s.d[j] < 0) break;
      symbolic = symbolic || !x_.is_const(s.d[j]);
      e = x_.mul(e, s.d[j]);
      if (!symbolic) continue;
      auto& list = seen_[key(x_.values(e))];
      if (std::find(list.begin(), list.end(), e) != list.end()) continue;
      if (list.empty()) seen_list_.push_back(e);
      if (list.size() < 4) list.push_back(e);
    }
  }
}

ExprId Builder::resolve(std::span<const int64_t> v, std::span<const Dims> locals,
                        const std::string& what) {
  const bool constant = std::all_of(v.begin(), v.end(), [&](int64_t y) { return y == v[0]; });
  absl::InlinedVector<ExprId, 4> cands;
  auto add = [&](ExprId e) {
    if (std::find(cands.begin(), cands.end(), e) == cands.end()) cands.push_back(e);
  };
  for (const Dims& s : locals)
    for (int i = 0; i < s.rank; ++i)
      if (s.d[i] >= 0 && values_are(s.d[i], v)) add(s.d[i]);
  if (cands.empty())
    for (const Dims& s : locals)
      for (int i = 0; i < s.rank; ++i)
        for (int j = i + 2; j <= s.rank; ++j) {
          if (s.d[j - 1] < 0) break;
          if (const ExprId e = product(s, i, j); values_are(e, v)) add(e);
        }
  if (auto it = seen_.find(key(v)); it != seen_.end())
    for (ExprId e : it->second) add(e);
  if (constant) {
    if (std::all_of(cands.begin(), cands.end(), [&](ExprId e) { return x_.is_const(e); }))
      return x_.constant(v[0]);
    const ExprId var = x_.variable(v[0]);
    for (ExprId e : cands)
      if (!x_.is_const(e)) guard(var, e, what);
    return var;
  }
  if (cands.empty()) return -1;
  for (size_t k = 1; k < cands.size(); ++k) guard(cands[0], cands[k], what);
  return cands[0];
}

void Builder::from_source(const Dims& src, const Ops& ops, Dims& out) {
  const int rank = ops[0]->shape.rank();
  std::array<int64_t, kMaxFamilyPoints> ps{}, pv{};
  auto view_one = [&](int d) {  // a view dimension that is 1 at every point
    const std::span<const int64_t> v = dim_values(ops, d);
    return std::all_of(v.begin(), v.end(), [](int64_t y) { return y == 1; });
  };
  auto src_one = [&](int d) { return x_.is_const(src.d[d]) && x_.node(src.d[d]).c == 1; };
  auto take_src = [&](int d) {
    for (size_t p = 0; p < P_; ++p) ps[p] *= x_.values(src.d[d])[p];
  };
  auto take_view = [&](int d) {
    for (size_t p = 0; p < P_; ++p) pv[p] *= ops[p]->shape[d];
  };
  int i = 0, j = 0;
  while (true) {
    while (j < rank && view_one(j)) {
      if (out.d[j] < 0) out.d[j] = x_.constant(1);
      ++j;
    }
    while (i < src.rank && src_one(i)) ++i;
    if (i >= src.rank || j >= rank) return;  // done, or sizes left over: not a reshape
    // A group: source dims [i0, i) and view dims [j0, j) with equal products at every point.
    const int i0 = i, j0 = j;
    ps.fill(1);
    pv.fill(1);
    take_src(i++);
    take_view(j++);
    while (ps[0] != pv[0]) {
      if (ps[0] < pv[0]) {
        if (i >= src.rank) return;
        take_src(i++);
      } else {
        if (j >= rank) return;
        take_view(j++);
      }
    }
    if (!std::equal(ps.begin(), ps.begin() + static_cast<std::ptrdiff_t>(P_), pv.begin()))
      return;  // a reshape at the first point only
    // One view size is the product of its source sizes; a source size split into several view
    // sizes leaves them to resolve(), which finds each among the sizes seen.
    if (j - j0 == 1 && out.d[j0] < 0) out.d[j0] = product(src, i0, i);
  }
}

ExprId Builder::out_size(ExprId in, int64_t pad2_minus_extent, int64_t stride) {
  return x_.add(x_.floor_div(x_.add(in, x_.constant(pad2_minus_extent)), x_.constant(stride)),
                x_.constant(1));
}

Builder::Dims Builder::conv_out(const Dims& x, const Dims& w, const Conv2dAttrs& a) {
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

Builder::Dims Builder::pool_out(const Dims& x, const Pool2dAttrs& a) {
  Dims r;
  if (x.rank != 4) return r;
  r.rank = 4;
  r.d[0] = x.d[0];
  r.d[1] = x.d[1];
  for (int h = 0; h < 2; ++h)
    r.d[2 + h] = out_size(x.d[2 + h], 2 * int64_t{a.padding[h]} - a.kernel[h], a.stride[h]);
  return r;
}

void Builder::unify_gradient(const Step& s, std::span<const Dims> ins, const Dims& out) {
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

Builder::Dims Builder::rule_out(int i, int k, std::span<const Dims> ins, const ExprId* attr_exprs) {
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

bool Builder::resolve_attrs(int i, std::span<const Dims> ins, ExprId* attr_exprs,
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
  if (s0.attrs.holds<SliceAttrs>())
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
  // unless 1 / e or 2 / e (a mean's, a squared error's gradient) gives it: guarded.
  const bool finite_nonzero =
      std::all_of(sv, sv + P_, [](double y) { return std::isfinite(y) && y != 0; });
  if (finite_nonzero)
    for (ExprId e : seen_list_) {
      const std::span<const int64_t> u = x_.values(e);
      if (std::any_of(u.begin(), u.end(), [](int64_t y) { return y <= 0; })) continue;
      double k = sv[0] * static_cast<double>(u[0]);
      if (const double r = std::nearbyint(k); std::abs(k - r) <= 1e-9 * std::abs(k)) k = r;
      if (constant && k != 1 && k != 2) continue;
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

bool Builder::operand(const Ops& ops, const Dims* src, const Dims* rule,
                      std::span<const Dims> locals, Dims& out, const std::string& what,
                      std::string& why) {
  out.rank = ops[0]->shape.rank();
  if (src != nullptr && src->rank > 0) {
    if (same_shape(*src, ops))
      out = *src;
    else
      from_source(*src, ops, out);
  }
  for (int d = 0; d < out.rank; ++d)
    if (out.d[d] < 0 && rule != nullptr && d < rule->rank && rule->d[d] >= 0 &&
        values_are(rule->d[d], dim_values(ops, d)))
      out.d[d] = rule->d[d];
  for (const Dims& in : locals)
    if (same_shape(in, ops)) {
      for (int d = 0; d < out.rank; ++d)
        if (out.d[d] < 0) out.d[d] = in.d[d];
      break;
    }
  for (int d = 0; d < out.rank; ++d) {
    if (out.d[d] >= 0) continue;
    const std::span<const int64_t> v = dim_values(ops, d);
    std::vector<Dims> near(locals.begin(), locals.end());
    if (src != nullptr && src->rank > 0) near.insert(near.begin(), *src);
    out.d[d] = resolve(v, near, cat(what, " dim ", d));
    if (out.d[d] < 0) {
      why = cat(what, " dim ", d, " is ", values_text(dim_values(ops, d)),
                " at the traced sizes, which no size of the trace explains");
      return false;
    }
  }
  const BufKind kind = rec(0).buffers[ops[0]->buf].kind;
  if (kind == BufKind::Param || kind == BufKind::External || kind == BufKind::GradSlot)
    for (int d = 0; d < out.rank; ++d)
      if (!x_.is_const(out.d[d])) {
        why = cat(what, " reads ",
                  kind == BufKind::Param      ? "a parameter"
                  : kind == BufKind::GradSlot ? "a gradient"
                                              : "a tensor made outside the schedule (a constant "
                                                "made in the call, or a captured tensor)",
                  " whose shape changes with the size (", ops[0]->shape, " at one size)");
        return false;
      }
  for (int d = 0; d < out.rank; ++d) f_.dim_exprs.push_back(out.d[d]);
  remember(out);
  return true;
}

void Builder::unify_elementwise(const Step& s, std::span<const Dims> ins, const Dims& out) {
  const bool same_shapes = (op_elementwise(s.op) && s.out.size() == 1) || s.op == Op::AddInplace ||
                           s.op == Op::CopyInplace;
  if (!same_shapes) return;
  const Dims& ref = s.out.empty() ? ins[0] : out;
  for (size_t k = 0; k < ins.size(); ++k) {
    const Dims& in = ins[k];
    if (in.rank != ref.rank) continue;
    bool same = true;
    for (int d = 0; d < in.rank && same; ++d) {
      const std::span<const int64_t> a = x_.values(in.d[d]), b = x_.values(ref.d[d]);
      same = std::equal(a.begin(), a.end(), b.begin(), b.end());
    }
    if (same)
      for (int d = 0; d < in.rank; ++d) unify(in.d[d], ref.d[d]);
  }
}

void Builder::settle_variables() {
  absl::flat_hash_map<ExprId, ExprId> memo;
  auto with = [&](ExprId var) {
    const ExprId r = find(var);
    return x_.is_var(r) ? x_.constant(x_.node(r).c) : r;
  };
  // What settled a variable may hold variables itself: substituted until none is left.
  auto sub = [&](ExprId e) {
    for (int round = 0; round < 8; ++round) {
      const ExprId next = x_.substitute(e, with, memo);
      if (next == e) break;
      e = next;
    }
    return e;
  };
  for (ExprId& e : f_.dim_exprs) e = sub(e);
  for (ShapeFamily::AttrSlot& a : f_.attrs) a.e = sub(a.e);
  std::vector<ShapeFamily::Guard> kept;
  for (ShapeFamily::Guard& g : f_.guards) {
    g.taken = sub(g.taken);
    g.other = sub(g.other);
    if (g.taken == g.other) continue;
    if (std::none_of(kept.begin(), kept.end(), [&](const ShapeFamily::Guard& k) {
          return k.taken == g.taken && k.other == g.other;
        }))
      kept.push_back(std::move(g));
  }
  f_.guards = std::move(kept);
}

bool Builder::run_steps(int begin, int end, std::string& why) {
  Ops ops(P_);
  for (int i = begin; i < end; ++i) {
    const Step& s0 = step(0, i);
    const std::string label = step_label(rec(0), i);
    std::vector<Dims> ins(s0.in.size());
    for (size_t k = 0; k < s0.in.size(); ++k) {
      for (size_t p = 0; p < P_; ++p) ops[p] = &step(p, i).in[k];
      const int buf = s0.in[k].buf;
      if (!operand(ops, &buf_dims_[buf], nullptr, std::span<const Dims>(ins.data(), k), ins[k],
                   cat(label, ": input ", k), why))
        return false;
      // A buffer first seen here (a bound tensor, or a temporary an in-place op fills) has this
      // shape from now on.
      if (buf_dims_[buf].rank == 0 && ins[k].rank > 0) buf_dims_[buf] = ins[k];
    }
    ExprId attr_exprs[2] = {-1, -1};
    if (!resolve_attrs(i, ins, attr_exprs, why)) return false;
    for (size_t k = 0; k < s0.out.size(); ++k) {
      for (size_t p = 0; p < P_; ++p) ops[p] = &step(p, i).out[k];
      const Dims rule = rule_out(i, static_cast<int>(k), ins, attr_exprs);
      Dims out;
      if (!operand(ops, nullptr, &rule, ins, out, cat(label, ": output ", k), why)) return false;
      buf_dims_[s0.out[k].buf] = out;
      if (k == 0) {
        unify_elementwise(s0, ins, out);
        unify_gradient(s0, ins, out);
      }
    }
    if (s0.out.empty()) unify_elementwise(s0, ins, Dims());
  }
  return true;
}

bool Builder::run(std::string& why) {
  const Recording& r0 = rec(0);
  buf_dims_.assign(r0.buffers.size(), Dims());
  // The arguments' shapes: symbols for the dynamic dimensions, constants elsewhere.
  const Signature& sig = f_.points.back().sig;
  std::vector<Dims> args(sig.args.size());
  for (size_t a = 0; a < sig.args.size(); ++a) {
    args[a].rank = sig.args[a].shape.rank();
    for (int d = 0; d < args[a].rank; ++d) args[a].d[d] = x_.constant(sig.args[a].shape[d]);
  }
  for (size_t k = 0; k < f_.dims.size(); ++k)
    args[f_.dims[k].arg].d[f_.dims[k].dim] = x_.symbol(f_.symbol_of[k]);
  for (const Dims& s : args) remember(s);
  for (size_t b = 0; b < r0.buffers.size(); ++b)
    if (r0.buffers[b].kind == BufKind::Arg &&
        static_cast<size_t>(r0.buffers[b].index) < args.size())
      buf_dims_[b] = args[r0.buffers[b].index];

  const int nf = static_cast<int>(r0.forward.size());
  const int n = nf + static_cast<int>(r0.backward.size());
  if (!run_steps(0, nf, why)) return false;
  Ops ops(P_);
  std::vector<Dims> results(r0.results.size());
  for (size_t k = 0; k < r0.results.size(); ++k) {
    for (size_t p = 0; p < P_; ++p) ops[p] = &rec(p).results[k];
    if (!operand(ops, &buf_dims_[r0.results[k].buf], nullptr, {}, results[k], cat("result ", k),
                 why))
      return false;
  }
  // The incoming gradients of the differentiable results have their shapes.
  for (size_t b = 0; b < r0.buffers.size(); ++b)
    if (r0.buffers[b].kind == BufKind::GradIn && r0.buffers[b].index >= 0 &&
        static_cast<size_t>(r0.buffers[b].index) < r0.differentiable.size())
      buf_dims_[b] = results[static_cast<size_t>(r0.differentiable[r0.buffers[b].index])];
  if (!run_steps(nf, n, why)) return false;
  for (size_t k = 0; k < r0.contributions.size(); ++k) {
    for (size_t p = 0; p < P_; ++p) ops[p] = &rec(p).contributions[k].grad;
    Dims out;
    if (!operand(ops, &buf_dims_[r0.contributions[k].grad.buf], nullptr, {}, out,
                 cat("gradient ", k), why))
      return false;
  }
  settle_variables();
  return true;
}

}  // namespace

bool derive_sizes(ShapeFamily& f, std::string& why) {
  return Builder(f).run(why);
}

}  // namespace encore::schedule::detail
