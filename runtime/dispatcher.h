// The dispatcher: the single path every op takes.
//
//   Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
//   dispatch(Op::Relu, {x}, {y});
//
// dispatch() checks operands, looks up the kernel for (op, device), runs it on raw buffer
// views, records an autograd node when a gradient is needed, and notifies the active Tracer.
// Kernels are plain functions over BufferViews (runtime/kernel_abi.h): they allocate nothing and
// know nothing of autograd, so a replay loop can call them again with other buffers.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "runtime/kernel_abi.h"
#include "runtime/op_traits.h"
#include "runtime/tensor.h"

namespace encore {

// ---- Autograd definition of an op ---------------------------------------------------------

class BackwardContext;
using BackwardFn = void (*)(BackwardContext&);

struct BackwardDef {
  BackwardFn fn = nullptr;   // null: not differentiable
  uint8_t save_inputs = 0;   // bit i: input i is kept for backward
  uint8_t save_outputs = 0;  // bit i: output i is kept for backward
  // bit i: output i is not differentiable (e.g. batch statistics, a dropout mask): it gets no
  // gradient edge, and its grad_output() in the backward is undefined.
  uint8_t no_grad_outputs = 0;
  // bit i (0 or 1) of save_inputs, further: input i is kept only when input 1 - i needs a
  // gradient (an operand of a product, read by the other operand's gradient only).
  uint8_t save_for_other = 0;
};

// Registers how `op` differentiates (routines do this next to their forward definition).
void register_backward(Op op, BackwardDef def);
const BackwardDef& backward_def(Op op);

// ---- Tracer -----------------------------------------------------------------------------

// Host state the traced code read and a replay bakes in: a call finding it changed traces again.
// A guard may instead hand its state to the replays live (an optimizer's hyper-parameters, the
// attributes of its update steps): the update steps dispatched right after the guard with
// traced() as their attributes run with current() at every replay, and only what
// unreplayable() names makes a call trace again.
class HostGuard {
 public:
  virtual ~HostGuard() = default;
  // What changed since the guard was made ("Adam lr 0.001 -> 0.05"); empty: nothing. Called at
  // every call of a static function: it must not allocate unless something changed.
  virtual std::string changed() const = 0;
  // Live attributes (none by default).
  virtual bool live() const { return false; }
  virtual AttrBlob traced() const { return {}; }
  virtual AttrBlob current() const { return {}; }
  // What keeps a replay from running with current() (a replaced optimizer, values its step()
  // refuses); empty: nothing. As changed(), it must not allocate unless it reports something.
  virtual std::string unreplayable() const { return changed(); }
};

// Notified of every op the dispatcher executes while it is active (static_graph records with it).
class Tracer {
 public:
  virtual ~Tracer() = default;
  virtual void on_op(Op op, const AttrBlob& attrs, std::span<const Tensor> inputs,
                     std::span<const Tensor> outputs) = 0;
  // An in-place op is about to write its inputs (`op_writes_input`): called before its kernel,
  // while they still hold what the traced code put there.
  virtual void before_inplace(Op op, std::span<const Tensor> inputs) {
    (void)op;
    (void)inputs;
  }
  // A tensor's values were accessed on the host (`what`: "item", "to_vector", or "data" for
  // Tensor::data, a read or a write): not capturable.
  virtual void on_host_read(const Tensor& t, std::string_view what) {
    (void)t;
    (void)what;
  }
  // Host state other than a tensor's values was read (`what`, e.g. "Adam's steps()"): a replay
  // would bake it in.
  virtual void on_host_value(std::string_view what) { (void)what; }
  // The autograd engine made `grad` the .grad of `leaf` (the leaf had none). `grad` is either
  // the incoming gradient itself or a Copy of it (already reported through on_op). Later
  // accumulation into an existing .grad is an AddInplace op.
  virtual void on_grad_set(const Tensor& leaf, const Tensor& grad) {
    (void)leaf;
    (void)grad;
  }
  // Tensor::set_grad made `grad` the .grad of `leaf` (undefined: cleared it).
  virtual void on_grad_replaced(const Tensor& leaf, const Tensor& grad) {
    (void)leaf;
    (void)grad;
  }
  // Tensor::grad was called on `leaf`: what the traced code does next may depend on whether the
  // .grad is defined (zero_grad fills one and leaves none alone), not only on its values.
  virtual void on_grad_read(const Tensor& leaf) { (void)leaf; }
  // The traced code read host state that a replay bakes in (see HostGuard).
  virtual void on_host_guard(std::shared_ptr<const HostGuard> guard) { (void)guard; }
  // A module's forward read its train/eval mode (`module`, described by `what`): a static function
  // watches the modes of the modules it was given, and bakes another's into its replays.
  virtual void on_mode_read(const void* module, std::string_view what) {
    (void)module;
    (void)what;
  }
  // The autograd engine saved `alias`, a detached alias of the op output `base`, for a backward
  // formula (one not made through the dispatcher, unlike detach()).
  virtual void on_saved_alias(const Tensor& base, const Tensor& alias) {
    (void)base;
    (void)alias;
  }
  // A backward pass starts on this thread (autograd::backward).
  virtual void on_backward() {}
  // The traced code added one to a host counter (an optimizer's step count): a replay of the
  // call adds one too, as the code it stands for would have.
  virtual void on_count(const std::shared_ptr<std::atomic<int64_t>>& counter) { (void)counter; }
  // The traced code ran a set-up that happens once and that a replay must not repeat (the first
  // backward of dist::DataParallel, which learns how each parameter is used): the trace is
  // dropped after its call, and the next call traces again, saying `why`.
  virtual void on_unrepeatable(std::string_view why) { (void)why; }
  // The engine is about to accumulate `grad` into the .grad of `leaf`. Returning true takes the
  // contribution: the accumulation still happens, but its ops are not reported.
  virtual bool on_leaf_grad(const Tensor& leaf, const Tensor& grad) {
    (void)leaf;
    (void)grad;
    return false;
  }
};

Tracer* current_tracer();

// Makes `t` the active tracer of this thread for the scope's lifetime.
class TracerScope {
 public:
  explicit TracerScope(Tracer* t);
  ~TracerScope();
  TracerScope(const TracerScope&) = delete;
  TracerScope& operator=(const TracerScope&) = delete;

 private:
  Tracer* previous_;
};

// ---- The call path ----------------------------------------------------------------------

// Runs `op`. Outputs are allocated by the caller with their final shapes (views: already
// aliasing input 0). Throws Error for an undefined operand or operands on different devices.
void dispatch(Op op, std::span<const Tensor> inputs, std::span<Tensor> outputs,
              const AttrBlob& attrs = {});
inline void dispatch(Op op, std::initializer_list<Tensor> inputs,
                     std::initializer_list<Tensor> outputs, const AttrBlob& attrs = {}) {
  dispatch(op, std::span<const Tensor>(inputs.begin(), inputs.size()),
           std::span<Tensor>(const_cast<Tensor*>(outputs.begin()), outputs.size()), attrs);
}

}  // namespace encore
