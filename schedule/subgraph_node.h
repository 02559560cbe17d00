// The autograd node that stands for a whole static call, traced or replayed. Internal to
// schedule/.
#pragma once

#include <cstddef>
#include <string_view>

#include "runtime/autograd.h"

namespace encore::schedule::detail {

// The autograd node of one static call: it stands for every op of the call.
IntrusivePtr<Node> subgraph_node(std::string_view label, BackwardFn backward, size_t inputs,
                                 size_t outputs);
void add_input(Node& n, const Tensor& t);
void add_output(const IntrusivePtr<Node>& n, TensorImpl& out);

}  // namespace encore::schedule::detail
