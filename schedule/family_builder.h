// The builder of a shape family's sizes (shape_family.h): its walk over the traced recordings,
// the resolution of each size (family_builder.cc) and the ops' shape rules and attribute sizes
// (shape_rules.cc). Internal to schedule/.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "schedule/shape_family.h"

namespace encore::schedule::detail {

using SizeKey = std::array<int64_t, kMaxFamilyPoints>;

// "3, 8": sizes at the traced points, for messages.
inline std::string values_text(std::span<const int64_t> v) {
  std::string s;
  for (size_t p = 0; p < v.size(); ++p) s += cat(p ? ", " : "", v[p]);
  return s;
}

class SizeBuilder {
 public:
  explicit SizeBuilder(ShapeFamily& f) : f_(f), x_(f.pool), P_(f.points.size()) {}
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
  SizeKey key(std::span<const int64_t> v) const {
    SizeKey k{};
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
  // `a` was taken for `what`, which `b` gives as well at every point (at_most: `a` was at most
  // `b` at every point, which `what` needs).
  void guard(ExprId a, ExprId b, const std::string& what, bool at_most = false) {
    if (a == b) return;
    for (const ShapeFamily::Guard& g : f_.guards)
      if (g.taken == a && g.other == b && g.at_most == at_most) return;
    f_.guards.push_back({a, b, what, at_most});
  }
  // Remembers a shape's dimensions and products of consecutive dimensions (symbolic ones).
  void remember(const Dims& s);
  // A size with values `v` at the points from the dimensions (or products of consecutive
  // dimensions) of `locals`, from the sizes seen so far, or a constant; -1 when none has them.
  ExprId resolve(std::span<const int64_t> v, std::span<const Dims> locals, const std::string& what);
  // The sizes with values `v` at every point, each once: dimensions of `locals` (else products
  // of their consecutive dimensions), then the sizes seen so far.
  absl::InlinedVector<ExprId, 4> candidates(std::span<const int64_t> v,
                                            std::span<const Dims> locals);
  // Whether a size that is not a constant has values `v` at every point (resolve would then
  // give a variable, guarded to equal it).
  bool symbolic_gives(std::span<const int64_t> v, std::span<const Dims> locals);
  // The operand's dimensions from `src` (the shape its buffer was written with) when it is that
  // shape or a reshape of it: groups of consecutive dimensions with equal products.
  void from_source(const Dims& src, const Ops& ops, Dims& out);
  // The rule of step i's output k, from its inputs (entries -1 where it has none).
  Dims rule_out(int i, int k, std::span<const Dims> ins, const ExprId* attr_exprs);
  bool resolve_attrs(int i, std::span<const Dims> ins, ExprId* attr_exprs, std::string& why);
  bool slice_bounds(int i, std::span<const Dims> ins, ExprId* attr_exprs, std::string& why);
  // Fills `out` for an operand: entries already set stay; the rest from `src`, `rule`, the
  // inputs of the same shape, then one by one. Then checks bound buffers keep their shapes,
  // stores the expressions and remembers them.
  bool operand(const Ops& ops, const Dims* src, const Dims* rule, std::span<const Dims> locals,
               Dims& out, const std::string& what, std::string& why);
  bool run_steps(int begin, int end, std::string& why);
  // Guards every two sizes of step i's operands whose values agreed at every trace.
  void guard_coincidences(int i, std::span<const Dims> ins, const std::string& label);
  // The variable `e` is settled as (itself when not a variable, or not settled).
  ExprId find(ExprId e) {
    while (x_.is_var(e)) {
      auto it = parent_.find(e);
      if (it == parent_.end()) break;
      e = it->second;
    }
    return e;
  }
  // `a` and `b` are sizes a step takes to be equal: a variable is settled by the other; two
  // expressions that only happened to agree at the traces are guarded to agree.
  void unify(ExprId a, ExprId b) {
    a = find(a);
    b = find(b);
    if (a == b) return;
    if (x_.is_var(a))
      parent_[a] = b;
    else if (x_.is_var(b))
      parent_[b] = a;
    else
      guard(a, b, "a size a step takes from two operands");
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
  absl::flat_hash_map<SizeKey, absl::InlinedVector<ExprId, 2>> seen_;
  std::vector<ExprId> seen_list_;  // the first expression of each key, in order
  std::vector<Dims> buf_dims_;     // per buffer: the shape it was written (or bound) with
  absl::flat_hash_map<ExprId, ExprId> parent_;  // variable -> what settled it
};

}  // namespace encore::schedule::detail
