#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "runtime/autograd.h"
#include "runtime/cuda.h"
#include "runtime/error.h"
#include "schedule/recording.h"
#include "schedule/static_graph.h"

namespace encore::schedule {

Recorder::Recorder(Recording& rec, const std::string& name, bool throw_unsafe, bool snapshot)
    : rec_(rec),
      name_(name),
      throw_unsafe_(throw_unsafe),
      snapshot_(snapshot),
      fold_constants_(!snapshot && fold_constants_enabled()),
      start_serial_(Storage::next_serial()),
      start_sequence_(autograd::next_sequence_nr()) {
  if (!snapshot) temps_.emplace();  // (verify mode's recorder checks no escapes)
}

size_t Recorder::bytes_from_data(const Tensor& t) {
  const TensorImpl& impl = *t.impl();
  return impl.storage->nbytes() - impl.offset * itemsize(impl.dtype);
}

Recorder::Key Recorder::key_of(const Tensor& t) {
  return {t.impl()->storage->serial(),
          t.impl()->offset * static_cast<int64_t>(itemsize(t.dtype()))};
}

int Recorder::new_buffer(const Tensor& t, BufKind kind, int index) {
  Buffer b;
  b.kind = kind;
  b.index = index;
  const TensorImpl& impl = *t.impl();
  b.nbytes = bytes_from_data(t);
  b.device = t.device();
  if (kind == BufKind::External || kind == BufKind::Arg || kind == BufKind::Param) b.bound = t;
  rec_.buffers.push_back(std::move(b));
  const int id = static_cast<int>(rec_.buffers.size()) - 1;
  buf_of_[key_of(t)] = id;
  if (kind == BufKind::Temp && impl.storage->serial() >= start_serial_ &&
      temp_of_.emplace(impl.storage->serial(), id).second && temps_)
    temps_->add(*impl.storage);
  return id;
}

void Recorder::add_arg(int index, const Tensor& alias) {
  if (args_.size() <= static_cast<size_t>(index)) args_.resize(index + 1, nullptr);
  args_[index] = alias.impl();
  if (arg_views_.insert(alias.impl()).second) arg_view_keep_.push_back(alias);
  if (!buf_of_.contains(key_of(alias))) new_buffer(alias, BufKind::Arg, index);
}

void Recorder::add_arg_view(const Tensor& base, const Tensor& view) {
  if (arg_views_.contains(base.impl()) && arg_views_.insert(view.impl()).second)
    arg_view_keep_.push_back(view);
}

void Recorder::check_arg_view(int b, const Tensor& t) {
  if (rec_.buffers[b].kind != BufKind::Arg || arg_views_.contains(t.impl()) ||
      rec_.captured_arg >= 0)
    return;
  rec_.captured_arg = rec_.buffers[b].index;
  rec_.captured_shape = t.shape();
}

void Recorder::on_saved_alias(const Tensor& base, const Tensor& alias) {
  add_arg_view(base, alias);
}

void Recorder::add_watched(const std::vector<ParamSlot>& slots) {
  slots_ = &slots;
  for (size_t i = 0; i < slots.size(); ++i) {
    const Tensor& p = *slots[i].slot;
    if (!p.defined()) continue;
    watched_[key_of(p)] = static_cast<int>(i);
    if (p.requires_grad() && p.is_leaf()) leaf_for(p);  // its .grad as the call found it
  }
}

void Recorder::add_grad_in(int index, Tensor& g) {
  if (buf_of_.contains(key_of(g))) {
    Tensor copy = Tensor::empty(g.shape(), g.dtype(), g.device());
    dispatch(Op::Copy, {g}, {copy});
    g = std::move(copy);
  }
  new_buffer(g, BufKind::GradIn, index);
}

int Recorder::leaf_for(const Tensor& leaf) {
  for (size_t i = 0; i < rec_.leaves.size(); ++i)
    if (rec_.leaves[i].tensor.is_same(leaf)) return static_cast<int>(i);
  Leaf l;
  l.tensor = leaf;
  auto w = watched_.find(key_of(leaf));
  l.param = w == watched_.end() ? -1 : w->second;
  l.entry_grad = Tensor(leaf.impl()->grad);  // (not grad(): that would call on_grad_read)
  rec_.leaves.push_back(std::move(l));
  const int id = static_cast<int>(rec_.leaves.size()) - 1;
  if (rec_.leaves[id].entry_grad.defined())
    entry_grad_.try_emplace(key_of(rec_.leaves[id].entry_grad), id);
  return id;
}

std::string Recorder::lazy_parameter(const Tensor& t) const {
  return cat(name_, ": the traced call creates parameters (a new tensor ", t.shape(),
             " requiring grad); a trace must not initialise parameters lazily: create them (or "
             "run the function once with set_static_enabled(false)) before the first static call");
}

void Recorder::unsafe(std::string why) {
  if (rec_.unsafe.empty()) rec_.unsafe = why;
  if (throw_unsafe_) throw Error(std::move(why));
}

int Recorder::resolve_input(const Tensor& t, bool written) {
  const Key k = key_of(t);
  if (auto it = buf_of_.find(k); it != buf_of_.end()) {
    check_arg_view(it->second, t);
    return it->second;
  }
  if (auto it = watched_.find(k); it != watched_.end()) {
    if (t.requires_grad() && !t.is_leaf() && phase_ == Phase::Forward)
      unsafe(cat(name_, ": the traced function uses parameter '", (*slots_)[it->second].name, "' ",
                 t.shape(), ", which requires grad and was computed outside it (it is not ",
                 "a leaf); a replay would send its gradient through the graph of the traced call. "
                 "Pass it as an argument, or make the parameter a leaf"));
    const int b = new_buffer(t, BufKind::Param, it->second);
    if (t.requires_grad() && t.is_leaf()) rec_.leaves[leaf_for(t)].buf = b;
    return b;
  }
  if (auto it = entry_grad_.find(k); it != entry_grad_.end()) {
    Leaf& l = rec_.leaves[it->second];
    if (l.first == Leaf::First::None) l.first = Leaf::First::Read;
    return new_buffer(t, BufKind::GradSlot, it->second);
  }
  if (t.impl()->storage->serial() >= start_serial_) {
    if (t.requires_grad() && t.is_leaf()) unsafe(lazy_parameter(t));
    // Made inside the call: a temporary born at this in-place write (zeros(), ones()), or a
    // constant filled from host values (tensor()), bound by reference.
    if (written) return new_buffer(t, BufKind::Temp, -1);
    const int b = new_buffer(t, BufKind::External, -1);
    rec_.buffers[b].constant = true;
    set_fixed(b, true);
    return b;
  }
  if (t.requires_grad()) {
    if (t.is_leaf()) {
      const int b = new_buffer(t, BufKind::External, -1);
      rec_.leaves[leaf_for(t)].buf = b;
      return b;
    }
    if (phase_ == Phase::Forward)
      unsafe(cat(name_, ": the traced function uses a tensor ", t.shape(),
                 " that requires grad and was computed outside it; its gradient cannot flow "
                 "through the static subgraph: pass it as an argument"));
  }
  return new_buffer(t, BufKind::External, -1);
}

Operand Recorder::operand_of(const Tensor& t) {
  return Operand{resolve_input(t, false), t.shape(), t.dtype()};
}

namespace {

// Ops whose results are functions of their inputs and attributes alone, the same at any thread
// count: elementwise arithmetic, comparisons and selection, layout, copies and fills.
bool folds_to_constant(Op op) {
  if (op_elementwise(op)) return true;
  switch (op) {
    case Op::Equal:
    case Op::Greater:
    case Op::Where:
    case Op::Permute:
    case Op::BroadcastTo:
    case Op::Concat:
    case Op::Slice:
    case Op::Copy:
    case Op::Fill:
    case Op::Arange:
    case Op::CopyInplace:
      return true;
    default:
      return false;
  }
}

}  // namespace

// A private copy of a constant's value now (`nbytes` from its data): later writes to `t` (by the
// caller it is returned to, or through a view) do not reach it.
Tensor Recorder::constant_value(const Tensor& t, size_t nbytes) {
  auto storage = make_intrusive<Storage>(nbytes, t.device());
  Tensor copy(make_intrusive<TensorImpl>(std::move(storage), 0, t.shape(), t.dtype()));
  cuda::copy_bytes(copy.raw_data(), t.device(), t.raw_data(), t.device(), nbytes);
  return copy;
}

void Recorder::on_op(Op op, const AttrBlob& attrs, std::span<const Tensor> inputs,
                     std::span<const Tensor> outputs) {
  // A live guard's window: the updates its optimizer dispatches right after it.
  if (live_guard_ >= 0 && !op_optimizer_update(op)) live_guard_ = -1;
  const OpKind kind = op_kind(op);
  if (kind == OpKind::View) {  // no step: an operand is a buffer read with its own shape
    resolve_input(inputs[0], false);
    add_arg_view(inputs[0], outputs[0]);
    return;
  }
  const Device device = (inputs.empty() ? outputs : inputs)[0].device();
  if (!device_)
    device_ = device;
  else if (device != *device_)
    unsafe(cat(name_, ": the traced function runs ops on ", *device_, " and on ", device,
               "; a static function's schedule runs on one device. Move its tensors to one "
               "device",
               or_eager()));
  Step s{op, attrs, -1, {}, {}};
  // A step of an op whose element values depend on its inputs and attributes alone (not on the
  // thread count, as a parallel GEMM's do) that reads constants alone computes constants: its
  // outputs, and a tensor made inside the call that it writes first (an empty() that copy_ or
  // fill_ fills).
  bool from_constants = folds_to_constant(op);
  // Values any replay computes the same from constants (a sum or softmax of them too, folded or
  // not): a tensor of them the call caches is no escape (check_escapes).
  bool from_fixed = !op_draws_random(op) && !op_optimizer_update(op);
  absl::InlinedVector<std::pair<int, size_t>, 1> born;  // (buffer, input) first written here
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool written = op_writes_input(op, i);
    const size_t buffers_before = rec_.buffers.size();
    const int b = resolve_input(inputs[i], written);
    if (rec_.buffers[b].kind == BufKind::Temp && inputs[i].requires_grad() && inputs[i].is_leaf())
      unsafe(lazy_parameter(inputs[i]));
    if (written) {
      rec_.buffers[b].mutated = true;
      rec_.buffers[b].constant = false;
      rec_.buffers[b].trace_value = Tensor();
      set_fixed(b, false);
      if (rec_.buffers.size() > buffers_before && rec_.buffers[b].kind == BufKind::Temp) {
        born.emplace_back(b, i);
      } else {
        from_constants = false;
        from_fixed = false;
      }
    } else {
      from_constants &= rec_.buffers[b].constant;
      from_fixed &= fixed(b);
    }
    s.in.push_back(Operand{b, inputs[i].shape(), inputs[i].dtype()});
  }
  for (const auto& [b, i] : born) set_fixed(b, from_fixed);
  from_constants &= fold_constants_;
  if (from_constants)
    for (const auto& [b, i] : born) {
      rec_.buffers[b].constant = true;
      rec_.buffers[b].trace_value = constant_value(inputs[i], rec_.buffers[b].nbytes);
    }
  for (const Tensor& t : outputs) {
    const Key k = key_of(t);
    int b;
    if (auto it = buf_of_.find(k); it != buf_of_.end()) {
      b = it->second;
      check_arg_view(b, t);
      if (rec_.buffers[b].kind != BufKind::Temp) rec_.buffers[b].mutated = true;
      rec_.buffers[b].constant = false;  // written again: its value is no longer the trace's
      rec_.buffers[b].trace_value = Tensor();
      set_fixed(b, false);
    } else {
      b = new_buffer(t, BufKind::Temp, -1);
      set_fixed(b, from_fixed && !t.requires_grad());
      if (from_constants && !t.requires_grad()) {
        rec_.buffers[b].constant = true;
        rec_.buffers[b].trace_value = constant_value(t, rec_.buffers[b].nbytes);
      }
    }
    s.out.push_back(Operand{b, t.shape(), t.dtype()});
  }
  if (live_guard_ >= 0 && op_optimizer_update(op)) {
    // An update with other attributes than the guard's (an optimizer that passes its own to
    // dispatch_updates) keeps them baked in: the guard then retraces on any change.
    if (attrs.type == live_attrs_.type &&
        std::memcmp(attrs.bytes, live_attrs_.bytes, AttrBlob::kCapacity) == 0)
      s.live = live_guard_;
    else
      rec_.guard_live[live_guard_] = 0;
  }
  if (snapshot_) {
    // One snapshot per step: the bytes of everything it wrote, in operand order.
    std::vector<unsigned char>& snap = rec_.snapshots.emplace_back();
    for_each_written(op, inputs, outputs, [&snap](const Tensor& t) {
      const size_t at = snap.size();
      snap.resize(at + t.nbytes());
      cuda::copy_bytes(snap.data() + at, Device::cpu(), t.raw_data(), t.device(), t.nbytes());
    });
  }
  (phase_ == Phase::Forward ? rec_.forward : rec_.backward).push_back(std::move(s));
}

void Recorder::before_inplace(Op op, std::span<const Tensor> inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Key k = key_of(inputs[i]);
    if (!op_writes_input(op, i) || host_filled_.erase(k) == 0) continue;
    // A host-filled tensor about to be written: every call starts from the values the host
    // gave it, so a replay copies them from a private copy into a temporary the write then
    // updates (instead of updating, call after call, the tensor the trace filled).
    const Tensor& t = inputs[i];
    const Tensor value = constant_value(t, bytes_from_data(t));
    int from;
    if (auto it = buf_of_.find(k); it != buf_of_.end()) {  // read since: bound to `t` so far
      from = it->second;
      rec_.buffers[from].bound = value;
      buf_of_.erase(it);
    } else {
      from = new_buffer(value, BufKind::External, -1);
      rec_.buffers[from].constant = true;
      set_fixed(from, true);
    }
    const int to = new_buffer(t, BufKind::Temp, -1);
    Step s{Op::Copy,
           {},
           -1,
           {Operand{from, t.shape(), t.dtype()}},
           {Operand{to, t.shape(), t.dtype()}}};
    if (snapshot_) {
      std::vector<unsigned char>& snap = rec_.snapshots.emplace_back(rec_.buffers[from].nbytes);
      cuda::copy_bytes(snap.data(), Device::cpu(), value.raw_data(), value.device(), snap.size());
    }
    (phase_ == Phase::Forward ? rec_.forward : rec_.backward).push_back(std::move(s));
  }
}

void Recorder::on_host_read(const Tensor& t, std::string_view what) {
  if (!buf_of_.contains(key_of(t)) && t.impl()->storage->serial() >= start_serial_) {
    // A tensor made inside the call being filled from host values: a constant (bound by
    // reference where it is read), unless an in-place op writes it (before_inplace).
    host_filled_.insert(key_of(t));
    return;
  }
  if (what == "data")
    unsafe(cat(name_,
               ": the traced function reads or writes tensor values on the host (data() of "
               "a ",
               t.shape(),
               " tensor that ops made or read); a replay would bake in what it "
               "read and would not repeat what it wrote. Make the values with ops, or return the "
               "tensor and read it outside the static function",
               or_eager()));
  else
    unsafe(cat(name_, ": the traced function reads tensor values on the host (", what, " of a ",
               t.shape(),
               " tensor); a replay would bake the value in. Return the tensor and read "
               "it outside the static function",
               or_eager()));
}

void Recorder::on_host_value(std::string_view what) {
  unsafe(cat(name_, ": the traced function reads ", what,
             " on the host; a replay would bake in the value it had at the trace. Keep such a "
             "value in a tensor the function updates with ops (a count: add_(count, 1.0)), or "
             "read it outside the static function",
             or_eager()));
}

void Recorder::on_mode_read(const void* module, std::string_view what) {
  if (rec_.unwatched_mode.empty() &&
      std::find(watched_modules_.begin(), watched_modules_.end(), module) == watched_modules_.end())
    rec_.unwatched_mode = what;
}

void Recorder::on_unrepeatable(std::string_view why) {
  if (rec_.retrace.empty()) rec_.retrace = cat("ran a one-time set-up (", why, ")");
}

void Recorder::on_grad_set(const Tensor& leaf, const Tensor& grad) {
  if (phase_ != Phase::Forward) return;  // the subgraph's backward collects its own gradients
  const int li = leaf_for(leaf);
  const int b = resolve_input(grad, false);
  Leaf& l = rec_.leaves[li];
  if (l.first == Leaf::First::None) l.first = Leaf::First::EngineSet;
  l.final_grad = b;
}

void Recorder::on_grad_replaced(const Tensor& leaf, const Tensor& grad) {
  if (phase_ != Phase::Forward || !leaf.requires_grad()) return;
  const int li = leaf_for(leaf);
  const int b = grad.defined() ? resolve_input(grad, false) : Leaf::kCleared;
  Leaf& l = rec_.leaves[li];
  if (l.first == Leaf::First::None) l.first = Leaf::First::Replaced;
  l.final_grad = b;
}

void Recorder::on_grad_read(const Tensor& leaf) {
  if (phase_ != Phase::Forward || !leaf.requires_grad() || !leaf.is_leaf()) return;
  for (const TensorImpl* a : args_)
    if (a == leaf.impl()) return;  // an argument's alias: its .grad is the call's own
  Leaf& l = rec_.leaves[leaf_for(leaf)];
  if (l.first == Leaf::First::None) l.first = Leaf::First::Read;
}

bool Recorder::on_leaf_grad(const Tensor& leaf, const Tensor& grad) {
  if (phase_ != Phase::Backward) return false;  // a whole step: its accumulation is recorded
  Recording::Contribution c;
  for (size_t i = 0; i < args_.size(); ++i)
    if (args_[i] == leaf.impl()) {
      c.arg = true;
      c.index = static_cast<int>(i);
    }
  if (!c.arg) c.index = leaf_for(leaf);
  c.grad = operand_of(grad);
  rec_.contributions.push_back(std::move(c));
  return true;
}

void Recorder::on_backward() {
  if (phase_ != Phase::Forward) return;
  rec_.saw_backward = true;
  // A whole step's backward would accumulate into stand-ins for its arguments, not into the
  // arguments' .grad or their producers (and a replay has no place to send such gradients).
  for (size_t i = 0; i < args_.size(); ++i)
    if (args_[i] != nullptr && args_[i]->requires_grad)
      fail(name_, ": the traced function runs a backward, and its argument ", i, " ",
           args_[i]->shape, " requires grad; a static function that runs its own backward (a ",
           "whole training step) cannot deliver gradients to its arguments. Make the tensor a ",
           "parameter (of a module in .modules, or captured by the function), or pass "
           "it detached");
}

void Recorder::on_host_guard(std::shared_ptr<const HostGuard> guard) {
  live_guard_ = -1;
  if (phase_ != Phase::Forward) return;
  if (guard->live()) {
    live_guard_ = static_cast<int>(rec_.host_guards.size());
    live_attrs_ = guard->traced();
  }
  rec_.guard_live.push_back(guard->live() ? 1 : 0);
  rec_.host_guards.push_back(std::move(guard));
}

void Recorder::on_count(const std::shared_ptr<std::atomic<int64_t>>& counter) {
  rec_.counters.push_back(counter);
}

}  // namespace encore::schedule
