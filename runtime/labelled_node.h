// Autograd nodes no single op's BackwardDef describes, named by a label instead of an op: the
// node of a whole static call (schedule/trace.cc, replay.cc) and of a copy between devices
// (Tensor::to).
#pragma once

#include <cstddef>
#include <string_view>

#include "runtime/autograd.h"

namespace encore {

// A node named `label` in messages (it must outlive the node) whose backward is `backward`, with
// room for `inputs` inputs and `outputs` outputs.
IntrusivePtr<Node> labelled_node(std::string_view label, BackwardFn backward, size_t inputs,
                                 size_t outputs);
// Adds `t` as the node's next input: where its gradient goes, and its metadata.
void add_input(Node& n, const Tensor& t);
// Makes `out` the node's next output: it requires grad from then on, its gradient flowing into n.
void add_output(const IntrusivePtr<Node>& n, TensorImpl& out);

}  // namespace encore
