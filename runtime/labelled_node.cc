// Autograd nodes named by a label (labelled_node.h).
#include "runtime/labelled_node.h"

namespace encore {

IntrusivePtr<Node> labelled_node(std::string_view label, BackwardFn backward, size_t inputs,
                                 size_t outputs) {
  auto n = make_intrusive<Node>();
  n->op = Op::Copy;  // unused: the label names the node
  n->label = label;
  n->sequence_nr = autograd::next_sequence_nr();
  n->backward = backward;
  n->next.reserve(inputs);
  n->inputs.reserve(inputs);
  n->outputs.reserve(outputs);
  return n;
}

void add_input(Node& n, const Tensor& t) {
  n.next.push_back(gradient_edge(t));
  n.inputs.push_back(TensorMeta::of(t));
}

void add_output(const IntrusivePtr<Node>& n, TensorImpl& out) {
  n->outputs.push_back({out.shape, out.dtype, out.storage->device()});
  set_gradient_edge(out, n, static_cast<uint32_t>(n->outputs.size() - 1));
}

}  // namespace encore
