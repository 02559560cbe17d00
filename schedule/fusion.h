// What elementwise fusion (fusion.cc) needs to know about an op beyond fusable_op(), shared
// with the schedule dump, which prints a fused step's program.
#pragma once

#include "runtime/ops.h"

namespace encore::schedule {

// Elementwise ops that broadcast an operand (here: one of a single element).
bool broadcasting(Op op);
// Fusable ops reading two tensors.
bool reads_two(Op op);

}  // namespace encore::schedule
