// The escape check of a trace (Recorder::check_escapes): which tensors the traced call made are
// still held after it by something a replay would not update, the results, their graph and
// the .grads aside.
#include "runtime/autograd.h"
#include "runtime/error.h"
#include "schedule/recording.h"

namespace encore::schedule {

void Recorder::check_escapes(std::span<const Tensor> results) {
  if (!temps_) return;
  const std::vector<uint64_t> alive = temps_->alive();
  temps_.reset();  // (every storage freed from now on would take the watches' lock)
  if (!rec_.unsafe.empty() || !rec_.retrace.empty()) return;
  // What the call legitimately leaves holding its temporaries: its results, the tensors their
  // graph saved for a backward (nodes the call made), and .grads. `handles` counts the handles
  // of each tensor these hold.
  absl::flat_hash_set<uint64_t> held;
  absl::flat_hash_map<const TensorImpl*, int64_t> handles;
  auto hold = [&held, &handles](const TensorImpl* t) {
    if (t == nullptr) return;
    held.insert(t->storage->serial());
    ++handles[t];
  };
  std::vector<const Node*> stack;
  absl::flat_hash_set<const Node*> seen;
  auto visit = [&](const Node* n) {
    if (n != nullptr && n->sequence_nr >= start_sequence_ && seen.insert(n).second)
      stack.push_back(n);
  };
  for (const Tensor& r : results) {
    hold(r.impl());
    if (r.defined()) visit(r.impl()->grad_fn.get());
  }
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const Tensor& t : n->saved) hold(t.impl());
    for (const Edge& e : n->next) {
      visit(e.node.get());
      if (e.leaf && e.leaf->grad) held.insert(e.leaf->grad->storage->serial());
    }
  }
  for (const Leaf& l : rec_.leaves) hold(l.tensor.impl()->grad.get());
  for (const Buffer& buf : rec_.buffers) hold(buf.bound.impl());
  // A result the call made that its code also assigned to a variable (a module's `last = y`,
  // an RNN's `h = hn.detach()` returned too): a replay returns a new tensor and assigns
  // nothing, so the variable keeps the trace's values.
  for (const Tensor& r : results) {
    if (!r.defined() || r.impl()->storage->serial() < start_serial_) continue;
    const auto it = buf_of_.find(key_of(r));
    if (it != buf_of_.end() && fixed(it->second)) continue;
    if (r.impl()->use_count() > handles[r.impl()])
      unsafe(cat(name_, ": a tensor ", r.shape(),
                 " the traced call returns is also held by "
                 "a variable its code assigned it to: a replay returns a new tensor and assigns "
                 "no variable, which would keep the trace's values. Use what each call returns",
                 or_eager()));
  }
  if (!rec_.unsafe.empty()) return;
  // Values computed from constants alone, unwritten since (a mask or table cached on the first
  // call): every replay computes them again the same, which is what the holder has too.
  int b = -1;  // the first made of those held elsewhere
  for (const uint64_t serial : alive) {
    const int t = temp_of_.at(serial);
    if (!held.contains(serial) && !fixed(t) && (b < 0 || t < b)) b = t;
  }
  if (b >= 0) {
    // The step that first wrote it, for the message.
    std::string made;
    for (const auto* steps : {&rec_.forward, &rec_.backward})
      for (const Step& s : *steps)
        for (size_t i = 0; i < s.in.size() + s.out.size() && made.empty(); ++i) {
          const bool out = i >= s.in.size();
          const Operand& o = out ? s.out[i - s.in.size()] : s.in[i];
          if (o.buf == b && (out || op_writes_input(s.op, i)))
            made =
                cat(" ", o.shape, " the traced call made (first written by ", op_name(s.op), ")");
        }
    unsafe(cat(name_, ": a tensor", made.empty() ? " the traced call made" : made,
               " is still held after the call, and not returned: the replays would leave it as the "
               "trace did (state made lazily on the first call, or a tensor kept for later). Make "
               "state before the first call and update it in place (as encore's optimizers make "
               "theirs in their constructors), or return the tensor and use what each call "
               "returns (a replay does not assign your variables)",
               or_eager()));
  }
}

}  // namespace encore::schedule
