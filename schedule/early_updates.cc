// Early optimizer updates: a whole training step records the optimizer's in-place updates after
// the whole backward, when each gradient has long left the cache. Each update moves to right
// after the last step it depends on, so it runs while its gradient and parameter are still warm
// (and the gradient's block is free sooner). Only the order of independent steps changes, so
// every value is the one eager computes.
#include <algorithm>
#include <vector>

#include "runtime/fused.h"
#include "schedule/plan.h"

namespace encore::schedule {

// Per phase, each update goes right after the last earlier step that writes a buffer it reads or
// writes (read and write after write) or reads a buffer it writes (write after read: the
// backward's matmul still reading the old weight), or may throw midway (a check of a computed
// label: the update must not have run when it fails); buffers over one storage count as one.
// Behind that step it also passes updates already moved there (they keep their recorded order)
// and, when the plan fuses, the rest of a run of fusable steps (elementwise or row ops) it would
// split. Nothing but an update moves, so random steps keep their order.
void Plan::move_updates_early() {
  const std::vector<Buffer>& bufs = rec_->buffers;
  const int nb = static_cast<int>(bufs.size());
  const std::vector<int> memory = storage_ids();
  const bool fuses = options_.fuse;

  reorder_phases([&](int begin, int end) {
    // The phase's steps (indices into all_) in their new order, each one's place in it, and per
    // memory its last reader and last writer so far (in the new order).
    std::vector<int> order, place(all_.size(), -1);
    std::vector<int> last_read(nb, -1), last_write(nb, -1);
    int last_throw = -1;  // the last step so far that may throw midway (value_checks.cc)
    auto later = [&](int a, int b) { return (b < 0 || (a >= 0 && place[a] > place[b])) ? a : b; };
    for (int t = begin; t < end; ++t) {
      const Step& s = all_[t];
      auto writes = [&](auto&& fn) {
        for (size_t i = 0; i < s.in.size(); ++i)
          if (op_writes_input(s.op, i)) fn(memory[s.in[i].buf]);
        for (const Operand& o : s.out) fn(memory[o.buf]);
      };
      int at = static_cast<int>(order.size());
      if (op_optimizer_update(s.op)) {
        int after = last_throw;  // the last step it must follow
        for (const Operand& i : s.in) after = later(after, last_write[memory[i.buf]]);
        writes([&](int m) { after = later(later(after, last_write[m]), last_read[m]); });
        int to = after < 0 ? 0 : place[after] + 1;
        auto fusable = [&](int k) {
          const Op op = all_[order[k]].op;
          return op_fusable(op) || fused_row_op(device_.type, op, 2);
        };
        while (to < at && (op_optimizer_update(all_[order[to]].op) ||
                           (fuses && to > 0 && fusable(to - 1) && fusable(to))))
          ++to;
        if (to < at && s.index >= 0) moved_early_[s.index] = 1;
        at = to;
      }
      order.insert(order.begin() + at, t);
      for (int k = at; k < static_cast<int>(order.size()); ++k) place[order[k]] = k;
      // A step reads all its inputs (an in-place one too); the new step may sit before earlier
      // readers, so the last reader is whichever comes later.
      for (const Operand& i : s.in) last_read[memory[i.buf]] = later(t, last_read[memory[i.buf]]);
      writes([&](int m) { last_write[m] = later(t, last_write[m]); });
      if (throws_midway(s)) last_throw = later(t, last_throw);
    }
    return order;
  });
}

}  // namespace encore::schedule
