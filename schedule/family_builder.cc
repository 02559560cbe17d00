// A shape family's sizes as expressions in its symbols (shape_family.h), walked over all the
// traced recordings at once, step by step. Each operand's dimensions come, in this order of
// preference, from
//  - the buffer it reads: the shape its producer wrote (the same shape, or a reshape of it,
//    grouped by equal products);
//  - the op's shape rule (shape_rules.cc);
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

#include "runtime/op_traits.h"
#include "schedule/family_builder.h"

namespace encore::schedule::detail {

void SizeBuilder::remember(const Dims& s) {
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

absl::InlinedVector<ExprId, 4> SizeBuilder::candidates(std::span<const int64_t> v,
                                                       std::span<const Dims> locals) {
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
  return cands;
}

bool SizeBuilder::symbolic_gives(std::span<const int64_t> v, std::span<const Dims> locals) {
  const absl::InlinedVector<ExprId, 4> cands = candidates(v, locals);
  return std::any_of(cands.begin(), cands.end(), [&](ExprId e) { return !x_.is_const(e); });
}

ExprId SizeBuilder::resolve(std::span<const int64_t> v, std::span<const Dims> locals,
                            const std::string& what) {
  const bool constant = std::all_of(v.begin(), v.end(), [&](int64_t y) { return y == v[0]; });
  const absl::InlinedVector<ExprId, 4> cands = candidates(v, locals);
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

void SizeBuilder::from_source(const Dims& src, const Ops& ops, Dims& out) {
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

bool SizeBuilder::operand(const Ops& ops, const Dims* src, const Dims* rule,
                          std::span<const Dims> locals, Dims& out, const std::string& what,
                          std::string& why) {
  out.rank = ops[0]->shape.rank();
  // A tensor bound by reference has one shape at every size: its sizes are constants, even
  // where a size of the trace happens to take the same values at the traced points.
  const BufKind kind = rec(0).buffers[ops[0]->buf].kind;
  if (kind == BufKind::Param || kind == BufKind::External || kind == BufKind::GradSlot) {
    for (int d = 0; d < out.rank; ++d) {
      const std::span<const int64_t> v = dim_values(ops, d);
      if (std::any_of(v.begin(), v.end(), [&](int64_t y) { return y != v[0]; })) {
        why = cat(what, " reads ",
                  kind == BufKind::Param      ? "a parameter"
                  : kind == BufKind::GradSlot ? "a gradient"
                                              : "a tensor made outside the schedule (a constant "
                                                "made in the call, or a captured tensor)",
                  " whose shape changes with the size (", ops[0]->shape, " at one size)");
        return false;
      }
      out.d[d] = x_.constant(v[0]);
    }
    for (int d = 0; d < out.rank; ++d) f_.dim_exprs.push_back(out.d[d]);
    remember(out);
    return true;
  }
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
  for (int d = 0; d < out.rank; ++d) f_.dim_exprs.push_back(out.d[d]);
  remember(out);
  return true;
}

void SizeBuilder::unify_elementwise(const Step& s, std::span<const Dims> ins, const Dims& out) {
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

void SizeBuilder::settle_variables() {
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
  for (ShapeFamily::Range& r : f_.ranges) r.n = sub(r.n);
  std::vector<ShapeFamily::Guard> kept;
  for (ShapeFamily::Guard& g : f_.guards) {
    g.taken = sub(g.taken);
    g.other = sub(g.other);
    if (g.taken == g.other) continue;
    if (std::none_of(kept.begin(), kept.end(), [&](const ShapeFamily::Guard& k) {
          return k.taken == g.taken && k.other == g.other && k.at_most == g.at_most;
        }))
      kept.push_back(std::move(g));
  }
  f_.guards = std::move(kept);
}

bool SizeBuilder::run_steps(int begin, int end, std::string& why) {
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
    guard_coincidences(i, ins, label);
  }
  return true;
}

void SizeBuilder::guard_coincidences(int i, std::span<const Dims> ins, const std::string& label) {
  // Sizes of one step's operands that had equal values at every trace but come from different
  // places, each made from the dynamic sizes, may be equal because the op needs them to be (a
  // convolution's channels, a bias's length, targets against logits) or by chance: either way a
  // size where they differ is traced, not planned. (A size equal to a constant, a pooled height
  // to a channel count, is taken for chance; so are two sizes of one operand, and the outputs'
  // sizes, which the op's rule gives.)
  auto symbolic = [this](ExprId e) {
    const ExprPool::Kind k = x_.node(e).kind;
    return k != ExprPool::Kind::Const && k != ExprPool::Kind::Var;
  };
  struct Seen {
    ExprId e;
    int k, d;  // input and dimension
  };
  std::vector<Seen> seen;
  auto value = [&](size_t p, int k, int d) { return step(p, i).in[k].shape[d]; };
  auto visit = [&](const Dims& dims, int k) {
    for (int d = 0; d < dims.rank; ++d) {
      if (dims.d[d] < 0) continue;
      const ExprId e = find(dims.d[d]);
      if (!symbolic(e)) continue;
      for (const Seen& o : seen) {
        if (o.k == k || find(o.e) == e) continue;
        bool equal = true;
        for (size_t p = 0; p < P_ && equal; ++p) equal = value(p, k, d) == value(p, o.k, o.d);
        if (equal) guard(e, find(o.e), cat(label, "'s operand sizes, equal at every trace"));
      }
      seen.push_back({e, k, d});
    }
  };
  for (size_t k = 0; k < ins.size(); ++k) visit(ins[k], static_cast<int>(k));
}

bool SizeBuilder::run(std::string& why) {
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

bool derive_sizes(ShapeFamily& f, std::string& why) {
  return SizeBuilder(f).run(why);
}

}  // namespace encore::schedule::detail
