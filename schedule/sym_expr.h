// Integer expressions over the symbols of a dynamic entry (s0, s1, ...: its dynamic dimensions),
// the sizes a shape-polymorphic schedule is written in. Internal to schedule/.
//
// An ExprPool holds the nodes; an expression is a node id. Nodes are hash-consed and constants
// folded, so one expression has one id. A pool made with `points` (the symbols' values at each
// traced size) also keeps every node's value at each point as it is made: the family builder
// (shape_family.cc) checks each candidate expression against the traces by those values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace encore::schedule {

using ExprId = int32_t;

class ExprPool {
 public:
  // Var: a size the same at every traced point that may yet turn out to be an expression (the
  // family builder settles each, then substitutes it away).
  enum class Kind : uint8_t { Const, Sym, Add, Mul, FloorDiv, Var };
  struct Node {
    Kind kind;
    int64_t c;    // Const, Var: the value; Sym: the symbol
    ExprId a, b;  // operands (Var: its number)
  };

  ExprPool() = default;
  // `points[p][k]`: symbol k's value at point p.
  explicit ExprPool(std::vector<std::vector<int64_t>> points);

  ExprId constant(int64_t c);
  ExprId symbol(int k);
  ExprId add(ExprId a, ExprId b);
  ExprId mul(ExprId a, ExprId b);
  // Floor of a / b; evaluating it with a < 0 or b <= 0 fails (no size is negative).
  ExprId floor_div(ExprId a, ExprId b);
  // A new variable of value `c` at every point.
  ExprId variable(int64_t c) { return make(Kind::Var, c, vars_++, -1); }
  bool is_var(ExprId e) const { return node(e).kind == Kind::Var; }
  // `e` with each variable v replaced by `with(v)` (memoised in `memo`, by node).
  template <typename F>
  ExprId substitute(ExprId e, F&& with, absl::flat_hash_map<ExprId, ExprId>& memo);

  const Node& node(ExprId e) const { return nodes_[static_cast<size_t>(e)]; }
  bool is_const(ExprId e) const { return node(e).kind == Kind::Const; }
  size_t size() const { return nodes_.size(); }
  // The value of `e` at each point (a pool made with points).
  std::span<const int64_t> values(ExprId e) const {
    return {point_values_.data() + static_cast<size_t>(e) * points_.size(), points_.size()};
  }
  size_t points() const { return points_.size(); }

  // Every node's value for these symbol values, in `out` (by node id). False on overflow, or
  // when a division has a negative dividend or a non-positive divisor (a convolution's kernel
  // larger than its padded input: no such size).
  bool eval(std::span<const int64_t> symbols, std::vector<int64_t>& out) const;
  // "s0", "s0*784", "(s1+-1)/2+1".
  std::string text(ExprId e) const;

  // A pool of just the nodes `roots` reach, which are renumbered in place.
  ExprPool compact(std::vector<ExprId*> roots) const;

 private:
  ExprId make(Kind kind, int64_t c, ExprId a, ExprId b);

  std::vector<Node> nodes_;
  absl::flat_hash_map<std::tuple<uint8_t, int64_t, ExprId, ExprId>, ExprId> index_;
  ExprId vars_ = 0;
  std::vector<std::vector<int64_t>> points_;
  std::vector<int64_t> point_values_;  // node-major: node e's values at points [e*P, e*P+P)
};

template <typename F>
ExprId ExprPool::substitute(ExprId e, F&& with, absl::flat_hash_map<ExprId, ExprId>& memo) {
  if (auto it = memo.find(e); it != memo.end()) return it->second;
  const Node n = node(e);
  ExprId out = e;
  switch (n.kind) {
    case Kind::Var:
      out = with(e);
      break;
    case Kind::Add:
      out = add(substitute(n.a, with, memo), substitute(n.b, with, memo));
      break;
    case Kind::Mul:
      out = mul(substitute(n.a, with, memo), substitute(n.b, with, memo));
      break;
    case Kind::FloorDiv:
      out = floor_div(substitute(n.a, with, memo), substitute(n.b, with, memo));
      break;
    default:
      break;
  }
  memo.emplace(e, out);
  return out;
}

}  // namespace encore::schedule
