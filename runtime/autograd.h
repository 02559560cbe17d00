// Define-by-run autograd: one Node per differentiable op call, holding exactly the tensors its
// backward declared (BackwardDef::save_inputs/save_outputs), edges to the producers of its
// inputs, and the metadata needed to check the gradients it returns.
//
//   Tensor w = randn({3, 3}).set_requires_grad();
//   Tensor loss = F::sum(F::tanh(F::matmul(x, w)));
//   loss.backward();            // w.grad() now holds d loss / d w
//   { NoGradGuard g; ... }      // ops inside record nothing
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "runtime/dispatcher.h"
#include "runtime/tensor.h"

namespace encore {

// Whether ops record autograd nodes on this thread (on by default).
struct GradMode {
  static bool enabled();
  static void set_enabled(bool on);
};

class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

struct TensorMeta {
  Shape shape;
  DType dtype = DType::Float32;
  Device device;
  static TensorMeta of(const Tensor& t) { return {t.shape(), t.dtype(), t.device()}; }
};

// A tensor described by `m`, filled with `value` (implicit and missing gradients).
Tensor filled(const TensorMeta& m, double value);

// Where the gradient of one input goes: the node that produced it, or the leaf it accumulates
// into, or nowhere (the input needs no gradient).
struct Edge {
  IntrusivePtr<Node> node;
  uint32_t output_nr = 0;
  IntrusivePtr<TensorImpl> leaf;
  bool active() const { return node || leaf; }
};

class Node final : public RefCounted {
 public:
  Node() = default;
  // Frees the chain of nodes only this one keeps alive iteratively, so dropping a graph of
  // millions of nodes cannot overflow the stack.
  ~Node() override;

  Op op;
  AttrBlob attrs;
  uint64_t sequence_nr;  // creation order; backward runs nodes in decreasing order
  BackwardFn backward;
  absl::InlinedVector<Edge, 2> next;           // one per input
  absl::InlinedVector<TensorMeta, 2> inputs;   // one per input
  absl::InlinedVector<TensorMeta, 1> outputs;  // one per output
  absl::InlinedVector<Tensor, 2> saved;        // saved inputs, then saved outputs (by def order)
  absl::InlinedVector<uint32_t, 2> saved_versions;
  uint8_t save_inputs = 0;
  uint8_t save_outputs = 0;
  uint8_t no_grad_outputs = 0;  // BackwardDef::no_grad_outputs: no gradient, not even zeros
  // Outputs nothing flowed into get zeros; without, they stay undefined (a static call's node
  // back-propagates only what reached it, as eager would).
  bool materialize_grads = true;
  bool released = false;  // saved tensors freed after a backward without retain_graph
  // State of a backward that is not one op's (a static subgraph's frame): dropped with the
  // saved tensors. `label` then names the node in messages instead of the op; it must outlive
  // the node (static_graph interns its names).
  IntrusivePtr<RefCounted> payload;
  std::string_view label;

  // Engine scratch, valid during one backward pass.
  absl::InlinedVector<Tensor, 1> pending_grads;
  bool enqueued = false;
  uint64_t checked_walk = 0;  // the last pre-pass walk (backward's check) that reached the node
};

// What a backward formula sees. It returns input gradients with set_input_grad(), computed
// with routines (so they pass through the dispatcher).
class BackwardContext {
 public:
  BackwardContext(Node& node, std::span<Tensor> grad_outputs, std::span<Tensor> grad_inputs)
      : node_(node), grad_outputs_(grad_outputs), grad_inputs_(grad_inputs) {}

  template <typename T>
  const T& attrs() const {
    return node_.attrs.as<T>();
  }
  // Input i as saved at forward time (requires bit i of save_inputs; for an input of
  // BackwardDef::save_for_other, that the other input needs a gradient).
  const Tensor& input(int i) const;
  // Output i as saved at forward time (requires bit i of save_outputs).
  const Tensor& output(int i = 0) const;
  // Gradient of output i (zeros when nothing flowed into it; undefined for an output the op's
  // BackwardDef declares not differentiable, or when the node does not materialize_grads).
  const Tensor& grad_output(int i = 0) const { return grad_outputs_[i]; }
  bool needs_input_grad(int i) const { return node_.next[i].active(); }
  const TensorMeta& input_meta(int i) const { return node_.inputs[i]; }
  const TensorMeta& output_meta(int i) const { return node_.outputs[i]; }
  int num_inputs() const { return static_cast<int>(node_.inputs.size()); }
  int num_outputs() const { return static_cast<int>(node_.outputs.size()); }
  RefCounted* payload() const { return node_.payload.get(); }
  void set_input_grad(int i, Tensor g) { grad_inputs_[i] = std::move(g); }

 private:
  Node& node_;
  std::span<Tensor> grad_outputs_;
  std::span<Tensor> grad_inputs_;
};

// The op name of a node, or its label.
std::string_view node_name(const Node& node);

// Where a gradient of `t` (which requires grad) goes: the node that produced it, or `t` itself
// when it is a leaf.
Edge gradient_edge(const Tensor& t);
// Makes `t` output `output_nr` of `node`: it requires grad from then on.
void set_gradient_edge(TensorImpl& t, IntrusivePtr<Node> node, uint32_t output_nr);

namespace autograd {

// The next node creation number (a node standing for many ops takes one as well).
uint64_t next_sequence_nr();

// Called by dispatch(): records a node for a differentiable op when grad mode is on and an input
// requires a gradient.
void record(Op op, const AttrBlob& attrs, const BackwardDef& def, std::span<const Tensor> inputs,
            std::span<Tensor> outputs);

// Back-propagates from `roots` with output gradients `grads` (empty: each root must have one
// element and gets 1). Gradients accumulate into the `.grad` of leaves.
void backward(std::span<const Tensor> roots, std::span<const Tensor> grads, bool retain_graph);

// ---- Hooks (what data parallelism needs of the engine, as PyTorch's DDP does) ----------------

// Called each time a backward pass has accumulated a gradient into the .grad of `leaf` (PyTorch's
// register_post_accumulate_grad_hook), with the leaf; it runs inside the pass, so the ops it
// dispatches are traced with the backward (a static whole step records them where the gradient
// became final). Returns an id for remove_post_accumulate_grad_hook. `leaf` must require grad.
// Unlike PyTorch's, which runs once per backward with the leaf's contributions summed, it runs
// after each contribution: a leaf a pass reaches twice (a weight used twice) calls it twice,
// current_pass() telling a pass's first call from a later one. Code that must run once per pass
// with the whole gradient (an optimizer step inside the backward) queues a callback for the
// pass's end (queue_callback) from its first call.
using GradHook = std::function<void(const Tensor& leaf)>;
uint64_t add_post_accumulate_grad_hook(const Tensor& leaf, GradHook hook);
void remove_post_accumulate_grad_hook(const Tensor& leaf, uint64_t id);
// Counts the hooks added and removed in the process: a static function compares a leaf's hooks
// with its trace's only when it moved.
uint64_t hooks_epoch();
// The ids of `leaf`'s post-accumulate hooks, folded into one number (0: none).
uint64_t hooks_digest(const Tensor& leaf);

// Runs `fn` once when the outermost backward pass running on this thread has finished its
// nodes, before backward() returns (PyTorch's queue_callback); callbacks run in the order they
// were queued, and one may queue another. An aborted pass drops its callbacks. Throws Error
// outside a backward pass.
void queue_callback(std::function<void()> fn);

// The number of the outermost backward pass running on this thread (each pass gets a new one),
// 0 outside any: a hook tells the first gradient of a pass from a later one.
uint64_t current_pass();

// While it lives, every gradient a pass accumulates into the leaf `stand_in` goes into `leaf`'s
// .grad instead, delivery by delivery (set, then added in place), and runs `leaf`'s hooks: a
// static function's trace runs the function on a stand-in for a leaf argument, and eager would
// have delivered those gradients to the argument itself, in order with any the function sends
// it directly (a tensor it also captured). Both must outlive it.
class GradRedirect {
 public:
  GradRedirect(const Tensor& stand_in, const Tensor& leaf);
  ~GradRedirect();
  GradRedirect(const GradRedirect&) = delete;
  GradRedirect& operator=(const GradRedirect&) = delete;

 private:
  TensorImpl* stand_in_;
};

}  // namespace autograd

// The post-accumulate hooks of a leaf, and where its gradients go instead (autograd::GradRedirect).
struct GradHooks {
  std::vector<std::pair<uint64_t, autograd::GradHook>> hooks;
  TensorImpl* redirect = nullptr;
};

}  // namespace encore
