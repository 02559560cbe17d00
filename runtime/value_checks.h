// The input values some kernels check where no routine can (a routine reading them would read
// tensor values on the host, which a trace must not bake in): class labels and embedding ids.
// The cpu kernels check them before writing anything, and a static cpu replay checks those it is
// handed before it changes any state (schedule/replay.cc), both with these functions, so both
// raise eager's Error.
#pragma once

#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/kernel_abi.h"
#include "runtime/op_traits.h"
#include "runtime/ops.h"

namespace encore {

// The input of `op` whose values its kernel checks (-1: none): labels, or ids.
constexpr int checked_input(Op op) {
  switch (op) {
    case Op::SoftmaxCrossEntropy:
    case Op::SoftmaxCrossEntropyGrad:
    case Op::Accuracy:
      return 1;
    case Op::Embedding:
    case Op::EmbeddingGrad:
      return 0;
    default:
      return -1;
  }
}

// Whether label `l` of sample `i` counts (it is not the ignore label); Error naming `op` (or
// cross_entropy's 'targets') unless it is a class index in [0, classes).
template <typename L>
bool label_counted(L l, int64_t i, int64_t classes, const CrossEntropyAttrs& attrs, Op op) {
  if (static_cast<int64_t>(l) == attrs.ignore_label) return false;
  if (l < 0 || static_cast<int64_t>(l) >= classes) {
    if (attrs.from_cross_entropy != 0)
      fail("cross_entropy: argument 'targets': label ", l, " at flat index ", i,
           " is out of range [0, ", classes, ")");
    fail(op_name(op), ": label ", l, " of sample ", i, " is out of range [0, ", classes, ")");
  }
  return true;
}

// Error naming `op` unless each of the n ids is in [0, rows).
template <typename I>
void check_ids(const I* ids, int64_t n, int64_t rows, Op op) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || static_cast<int64_t>(ids[i]) >= rows)
      fail(op_name(op), ": argument 'ids' holds ", static_cast<int64_t>(ids[i]), " at flat index ",
           i, ", outside [0, ", rows, ") (weight has ", rows, " rows)");
}

// The check `op`'s kernel makes of its checked input: `n` values of `dtype` (int32 or int64) at
// `values`, against `bound` (the classes of the logits, or the weight's rows).
inline void check_values(Op op, const AttrBlob& attrs, const void* values, DType dtype, int64_t n,
                         int64_t bound) {
  auto check = [&]<typename I>(const I* v) {
    if (checked_input(op) == 0) return check_ids(v, n, bound, op);
    const CrossEntropyAttrs& a = attrs.as<CrossEntropyAttrs>();
    for (int64_t i = 0; i < n; ++i) label_counted(v[i], i, bound, a, op);
  };
  if (dtype == DType::Int32) check(static_cast<const int32_t*>(values));
  if (dtype == DType::Int64) check(static_cast<const int64_t*>(values));
}

}  // namespace encore
