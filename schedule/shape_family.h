// Shape families: one recording written in the symbols of its dynamic dimensions, built from
// traces of one function at different sizes, and instantiated for the sizes of a later call
// without running the function. Internal to schedule/.
//
// The evidence is the traces themselves. Two or more recordings of one function whose signatures
// differ only in some argument dimensions must have the same structure (ops, attributes that are
// not sizes, buffers, leaves, results) and every size in them (each operand's dimensions, the
// attributes that hold sizes: slice bounds, batch-norm counts, layer-norm columns, a scalar that
// is a size or its reciprocal) must be explained, at every traced point, by one expression in
// the dimensions' symbols:
//  - an op's shape rule where its output sizes are new values (convolution and pooling outputs,
//    concat, slice);
//  - else a dimension or a product of consecutive dimensions of one of the step's inputs (an
//    elementwise output, a matmul's rows, a reshape that flattens or splits), or of anything the
//    trace computed before (a gradient buffer shaped like a forward value);
//  - else a constant, when it has the same value at every point.
// A size no expression explains (user code that computes a shape or a scalar from a size in a
// way the trace cannot see, a branch on a size) means the dimensions cannot be dynamic, and the
// reason names the step and the op. Where two expressions explain a size equally well at every
// point (a pooled size that happens to be equal at both traced sizes, and a constant), the
// builder takes one and keeps a guard that the two agree: a later size at which they do not is
// traced again, and the family is rebuilt with that size as more evidence. A point where a
// dynamic dimension is 1 may differ from the others (broadcasting needs no op at size 1): a
// family serves size 1 only when it was traced at 1. A slice bound that user code computed from
// the size it slices and that was the same at every traced point (n / 2 at 8 and 9) looks like a
// constant: the family plans only sizes between the traced ones (ShapeFamily::ranges), and a
// size beyond traces and extends it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/tensor.h"
#include "schedule/recording.h"
#include "schedule/signature.h"
#include "schedule/sym_expr.h"

namespace encore::schedule::detail {

// Most traced sizes a family is built from.
inline constexpr size_t kMaxFamilyPoints = 4;

// Dimension `dim` of argument `arg`.
struct DynDim {
  int arg = 0;
  int dim = 0;
  bool operator==(const DynDim&) const = default;
  auto operator<=>(const DynDim&) const = default;
};

// One traced size: the recording as traced (before planning) and its signature.
struct FamilyPoint {
  std::shared_ptr<const Recording> rec;
  Signature sig;
};

// The sizes a step's attributes hold (ShapeFamily::AttrSlot::field).
enum AttrField : uint8_t { kSliceStart, kSliceStop, kBatchNormCount, kLayerNormCols, kScalar };

struct ShapeFamily {
  std::vector<DynDim> dims;  // the dynamic dimensions, sorted
  std::vector<int>
      symbol_of;  // per dimension, its symbol (dimensions equal at every point share one)
  int symbols = 0;
  Signature sig;  // the latest point's; its dynamic dimensions are the symbols
  ExprPool pool;
  // The latest point's recording, instantiated with every size below replaced.
  std::shared_ptr<const Recording> base;
  std::vector<ExprId> dim_exprs;  // per operand dimension, in for_each_operand's order
  // Per operand dimension: 1 at some traced point (a size served may make it 1 only then).
  std::vector<char> one_at_trace;
  struct AttrSlot {
    int step = 0;       // forward steps, then backward steps
    uint8_t field = 0;  // which size of the step's attributes (see shape_family.cc)
    ExprId e = -1;
    // ScalarAttrs::value: 0 the size e, 1 k / e.
    uint8_t scalar_form = 0;
    double k = 0;
  };
  std::vector<AttrSlot> attrs;
  // Expressions that agreed at every traced point and must agree at a size served: `taken` for
  // the size `what` names, which `other` gave as well. `at_most`: `taken` was at most `other` at
  // every point, as `what` needs (a slice's bound within its dimension) and must stay.
  struct Guard {
    ExprId taken = -1, other = -1;
    std::string what;  // "step 23 (backward) div_scalar's scalar"
    bool at_most = false;
  };
  std::vector<Guard> guards;
  std::vector<char> serves_one;     // per symbol: traced at 1, so it serves 1
  // Sizes kept within their traced values. A forward slice's bound asked alike at every traced
  // point in a dimension whose size n changes may be the function's arithmetic on n (n / 2 at 8
  // and 9, n - n % 2 at 8 and 9, max(1, n / 8) at 4 and 12): any such function that grows or
  // shrinks with n and gave the bound at the smallest and largest traced n gives it between
  // them, and nothing tells beyond. The family plans only sizes where n lies between them. A
  // bound that was n itself at every traced point may be n cut to a multiple (n - n % 4, traced
  // at multiples of 4): it is n at sizes that differ from the traced ones by multiples of what
  // theirs differ by (`step`), and the family plans only those. Explicit families, whose
  // dimensions the user named, plan any size.
  struct Range {
    ExprId n = -1;
    int64_t lo = 0, hi = 0;
    int64_t step = 0;  // 0: every size from lo to hi; else lo + k * step
    std::string what;  // "step 3 (forward) slice's stop, 4 at every traced size,"
  };
  std::vector<Range> ranges;
  std::vector<FamilyPoint> points;  // the evidence, oldest first
  // Set where the sizes could not be derived because a slice bound was clamped at some points
  // and not at others (each point alone is one of the ways shape_rules.cc follows).
  bool clamps_differ = false;
};

// What building a family found.
struct FamilyBuild {
  std::unique_ptr<ShapeFamily> family;  // null: not built
  std::string why;                      // why not: "step 7 (forward) relu: ..."
  // Not built because a slice bound was clamped at some traces and not at others: no dimension
  // is to blame (traces at sizes clamped alike may make a family).
  bool clamps_differ = false;
  // Not built because the traces ran other ops (structure_diff), not because a size had no
  // expression.
  bool structure_differs = false;
};

// Fills f.pool, f.dim_exprs, f.attrs and f.guards from f.points and f.dims (shape_rules.cc):
// false, with why, when some size has no expression.
bool derive_sizes(ShapeFamily& f, std::string& why);

// Every operand of a recording, in the order a family stores their dimensions: each forward
// step's inputs then outputs, the results, each backward step's inputs then outputs, the
// contributions.
template <typename R, typename F>
void for_each_operand(R& rec, F&& f) {
  for (auto& s : rec.forward) {
    for (auto& o : s.in) f(o);
    for (auto& o : s.out) f(o);
  }
  for (auto& o : rec.results) f(o);
  for (auto& s : rec.backward) {
    for (auto& o : s.in) f(o);
    for (auto& o : s.out) f(o);
  }
  for (auto& c : rec.contributions) f(c.grad);
}

// "step 7 (forward) relu".
std::string step_label(const Recording& rec, int step);

// How two traces differ in anything but sizes, the first difference ("" when they do not):
// their steps, attributes, buffers, leaves and results (trace_diff.cc).
std::string structure_diff(const Recording& a, const Recording& b);

// Builds the family of `points` (2 to kMaxFamilyPoints traces whose signatures differ only in
// `dims`).
FamilyBuild build_family(std::vector<FamilyPoint> points, std::vector<DynDim> dims);

// The symbols' values for a call: false when the arguments do not fit the family (a dimension
// that is not dynamic differs, dimensions sharing a symbol differ, a dynamic one is 0, or 1 where
// the family was not traced at 1).
bool family_sizes(const ShapeFamily& f, std::span<const Tensor> args, const std::string* key,
                  bool grad, int64_t mode, std::vector<int64_t>& symbols);

// The family's recording at these sizes, ready to plan; null (and why) when the sizes are
// impossible for it (a kernel larger than its padded input, a product that overflows, operands
// that no longer agree) or when a guard fails (the traces do not tell what these sizes need).
// `anywhere`: beyond the ranges too (an explicit family).
std::shared_ptr<Recording> instantiate(const ShapeFamily& f, std::span<const int64_t> symbols,
                                       std::string& why, bool anywhere = false);

// "step 3 (forward) slice's stop, 4 at every traced size, keeps s0 within 8 to 11".
std::string range_text(const ShapeFamily& f, const ShapeFamily::Range& r);

// Every dimension of an argument as the family sees it: "s0" for a dynamic one, "" otherwise.
std::vector<std::vector<std::string>> symbol_names(const ShapeFamily& f);

// "s0=17, s1=40".
std::string sizes_text(std::span<const int64_t> symbols);

}  // namespace encore::schedule::detail
