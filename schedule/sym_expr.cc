// Symbolic sizes: hash-consed integer expressions, their values at the traced points, evaluation
// for a new size, and their text.
#include "schedule/sym_expr.h"

#include <algorithm>
#include <utility>

#include "runtime/error.h"

namespace encore::schedule {
namespace {

// a + b, a * b without overflow into undefined behaviour: false when it would overflow.
bool checked_add(int64_t a, int64_t b, int64_t& out) {
  return !__builtin_add_overflow(a, b, &out);
}
bool checked_mul(int64_t a, int64_t b, int64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}

// A node's value from its operands' values; false on overflow or a division ExprPool::eval
// refuses.
bool apply(const ExprPool::Node& n, int64_t a, int64_t b, int64_t& out) {
  switch (n.kind) {
    case ExprPool::Kind::Const:
      out = n.c;
      return true;
    case ExprPool::Kind::Sym:
      return false;  // read from the symbols
    case ExprPool::Kind::Var:
      out = n.c;
      return true;
    case ExprPool::Kind::Add:
      return checked_add(a, b, out);
    case ExprPool::Kind::Mul:
      return checked_mul(a, b, out);
    case ExprPool::Kind::FloorDiv:
      if (a < 0 || b <= 0) return false;
      out = a / b;
      return true;
  }
  return false;
}

}  // namespace

ExprPool::ExprPool(std::vector<std::vector<int64_t>> points) : points_(std::move(points)) {}

ExprId ExprPool::make(Kind kind, int64_t c, ExprId a, ExprId b) {
  const auto key = std::make_tuple(static_cast<uint8_t>(kind), c, a, b);
  if (auto it = index_.find(key); it != index_.end()) return it->second;
  const ExprId id = static_cast<ExprId>(nodes_.size());
  nodes_.push_back({kind, c, a, b});
  index_.emplace(key, id);
  if (!points_.empty()) {
    const size_t P = points_.size();
    point_values_.resize(nodes_.size() * P);
    for (size_t p = 0; p < P; ++p) {
      int64_t v = 0;
      if (kind == Kind::Sym) {
        v = points_[p][static_cast<size_t>(c)];
      } else if (kind != Kind::Const && kind != Kind::Var) {
        // Values outside the sizes' range (a negative intermediate) still get a value here: the
        // builder only compares them with traced sizes, which are never negative.
        const int64_t x = point_values_[static_cast<size_t>(a) * P + p];
        const int64_t y = point_values_[static_cast<size_t>(b) * P + p];
        if (kind == Kind::Add)
          v = x + y;
        else if (kind == Kind::Mul)
          v = x * y;
        else
          v = y > 0 ? (x >= 0 ? x / y : -((-x + y - 1) / y)) : -1;
      } else {
        v = c;
      }
      point_values_[id * P + p] = v;
    }
  }
  return id;
}

ExprId ExprPool::constant(int64_t c) {
  return make(Kind::Const, c, -1, -1);
}

ExprId ExprPool::symbol(int k) {
  return make(Kind::Sym, k, -1, -1);
}

ExprId ExprPool::add(ExprId a, ExprId b) {
  // Sums are kept as terms (a term times its integer coefficient), like terms combined, in term
  // id order, then the constant: s0 + s0 is s0*2, (s0 + s0) + s0*-1 is s0.
  int64_t c = 0;
  std::vector<std::pair<ExprId, int64_t>> terms;
  auto gather = [&](auto&& self, ExprId x, int64_t k) -> void {
    const Node& n = node(x);
    if (n.kind == Kind::Const) {
      c += k * n.c;
    } else if (n.kind == Kind::Add) {
      self(self, n.a, k);
      self(self, n.b, k);
    } else if (n.kind == Kind::Mul && is_const(n.b)) {  // term * coefficient (mul's form)
      self(self, n.a, k * node(n.b).c);
    } else {
      terms.emplace_back(x, k);
    }
  };
  gather(gather, a, 1);
  gather(gather, b, 1);
  std::sort(terms.begin(), terms.end());
  ExprId e = -1;
  for (size_t i = 0; i < terms.size();) {
    int64_t k = 0;
    size_t j = i;
    for (; j < terms.size() && terms[j].first == terms[i].first; ++j) k += terms[j].second;
    if (k != 0) {
      const ExprId t = k == 1 ? terms[i].first : mul(terms[i].first, constant(k));
      e = e < 0 ? t : make(Kind::Add, 0, e, t);
    }
    i = j;
  }
  if (e < 0) return constant(c);
  return c == 0 ? e : make(Kind::Add, 0, e, constant(c));
}

ExprId ExprPool::mul(ExprId a, ExprId b) {
  // Products are kept as one constant times the other factors in id order, so that a product of
  // the same factors is one expression however it was grouped ((a*b)*c, a*(b*c), c*b*a).
  int64_t c = 1;
  std::vector<ExprId> factors;
  auto gather = [&](auto&& self, ExprId x) -> void {
    const Node& n = node(x);
    if (n.kind == Kind::Const) {
      c *= n.c;
    } else if (n.kind == Kind::Mul) {
      self(self, n.a);
      self(self, n.b);
    } else {
      factors.push_back(x);
    }
  };
  gather(gather, a);
  gather(gather, b);
  if (c == 0 || factors.empty()) return constant(factors.empty() ? c : 0);
  std::sort(factors.begin(), factors.end());
  ExprId e = factors[0];
  for (size_t i = 1; i < factors.size(); ++i) e = make(Kind::Mul, 0, e, factors[i]);
  return c == 1 ? e : make(Kind::Mul, 0, e, constant(c));
}

ExprId ExprPool::floor_div(ExprId a, ExprId b) {
  if (is_const(b) && node(b).c == 1) return a;
  if (is_const(a) && is_const(b) && node(a).c >= 0 && node(b).c > 0)
    return constant(node(a).c / node(b).c);
  return make(Kind::FloorDiv, 0, a, b);
}

bool ExprPool::eval(std::span<const int64_t> symbols, std::vector<int64_t>& out) const {
  out.resize(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (n.kind == Kind::Sym) {
      if (n.c < 0 || static_cast<size_t>(n.c) >= symbols.size()) return false;
      out[i] = symbols[static_cast<size_t>(n.c)];
      continue;
    }
    if (n.kind == Kind::Const || n.kind == Kind::Var) {
      out[i] = n.c;
      continue;
    }
    if (!apply(n, out[static_cast<size_t>(n.a)], out[static_cast<size_t>(n.b)], out[i]))
      return false;
  }
  return true;
}

std::string ExprPool::text(ExprId e) const {
  const Node& n = node(e);
  auto operand = [this](ExprId x) {
    const Kind k = node(x).kind;
    return k == Kind::Add ? cat("(", text(x), ")") : text(x);
  };
  switch (n.kind) {
    case Kind::Const:
    case Kind::Var:
      return cat(n.c);
    case Kind::Sym:
      return cat("s", n.c);
    case Kind::Add:
      return is_const(n.b) && node(n.b).c < 0 ? cat(text(n.a), node(n.b).c)
                                              : cat(text(n.a), "+", text(n.b));
    case Kind::Mul:
      return cat(operand(n.a), "*", operand(n.b));
    case Kind::FloorDiv:
      return cat(operand(n.a), "/", operand(n.b));
  }
  return "?";
}

ExprPool ExprPool::compact(std::vector<ExprId*> roots) const {
  ExprPool out;
  std::vector<ExprId> map(nodes_.size(), -1);
  // Nodes refer to earlier nodes only, so one pass in order copies every reached node after
  // its operands.
  std::vector<char> reached(nodes_.size(), 0);
  for (ExprId* r : roots)
    if (*r >= 0) reached[static_cast<size_t>(*r)] = 1;
  for (size_t i = nodes_.size(); i-- > 0;) {
    if (!reached[i]) continue;
    const Node& n = nodes_[i];
    if (n.kind == Kind::Add || n.kind == Kind::Mul || n.kind == Kind::FloorDiv) {
      reached[static_cast<size_t>(n.a)] = 1;
      reached[static_cast<size_t>(n.b)] = 1;
    }
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!reached[i]) continue;
    const Node& n = nodes_[i];
    const bool operands = n.kind == Kind::Add || n.kind == Kind::Mul || n.kind == Kind::FloorDiv;
    const ExprId a = operands ? map[static_cast<size_t>(n.a)] : n.a;
    const ExprId b = operands ? map[static_cast<size_t>(n.b)] : n.b;
    map[i] = out.make(n.kind, n.c, a, b);
  }
  for (ExprId* r : roots)
    if (*r >= 0) *r = map[static_cast<size_t>(*r)];
  return out;
}

}  // namespace encore::schedule
