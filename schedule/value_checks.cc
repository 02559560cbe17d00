// Input values a cpu plan's steps check (labels, ids: runtime/value_checks.h). Eagerly, a bad
// label fails its op before the ops after it run; a replay runs steps in another order (two
// lanes, optimizer updates moved early, a replaced .grad dropped as the call starts), so a step
// that failed midway could leave parameters updated and gradients gone. Checks of values the
// call is handed (arguments, parameters, externals the forward does not write) run before
// anything else (Plan::value_checks, schedule/replay.cc); a step checking values the call
// computes keeps every write outside the arena recorded after it behind it (lanes.cc,
// early_updates.cc), and its plan keeps the replaced .grad until the forward ends.
#include "runtime/value_checks.h"

#include "schedule/plan.h"

namespace encore::schedule {
namespace {

// What the values of step `s`'s checked input must be below: the classes of the logits, or the
// rows of the embedding's weight (its gradient's).
int64_t check_bound(const Step& s) {
  switch (s.op) {
    case Op::Embedding:
      return s.in[1].shape[0];
    case Op::EmbeddingGrad:
      return s.out[0].shape[0];
    default:
      return s.in[0].shape[1];
  }
}

// Whether the checked input of `s` is a buffer the call is handed and the forward never writes.
bool checked_ahead(const Step& s, const std::vector<Buffer>& bufs) {
  const Buffer& b = bufs[s.in[checked_input(s.op)].buf];
  return (b.kind == BufKind::Arg || b.kind == BufKind::Param || b.kind == BufKind::External) &&
         !b.mutated;
}

}  // namespace

bool Plan::throws_midway(const Step& s) const {
  return device_.type == DeviceType::CPU && checked_input(s.op) >= 0 &&
         !checked_ahead(s, rec_->buffers);
}

void Plan::plan_value_checks() {
  if (device_.type != DeviceType::CPU) return;  // cuda kernels report at the next wait
  for (int t = 0; t < n_forward_; ++t) {
    const Step& s = all_[t];
    if (checked_input(s.op) < 0) continue;
    if (throws_midway(s)) {
      checks_midway_ = true;
      continue;
    }
    const Operand& v = s.in[checked_input(s.op)];
    value_checks_.push_back({s.op, s.attrs, v.buf, v.dtype, v.shape.numel(), check_bound(s)});
  }
}

}  // namespace encore::schedule
