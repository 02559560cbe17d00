// Verify mode: an eager run of a replayed call, recorded with every op's values, and the
// comparison of that recording with what the plan's replay computed. Internal to schedule/.
#pragma once

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "runtime/rng.h"
#include "schedule/plan.h"
#include "schedule/recording.h"

namespace encore::schedule::detail {

// What a verified call keeps for its backward: the eager run's graph and recorder; and, until
// its forward is compared, the state the call found (the tensors it writes outside the arena,
// the leaves' .grad, the random stream, the host counters), which a failed comparison puts back.
struct VerifyState {
  Recording rec;
  std::unique_ptr<Recorder> recorder;
  std::vector<Tensor> aliases, inner, leaves;
  std::vector<std::pair<Tensor, std::vector<unsigned char>>> written_before;
  std::vector<std::pair<Tensor, IntrusivePtr<TensorImpl>>> grads_before;
  Generator* generator = nullptr;
  Generator::Stream stream_before{};
  std::vector<int64_t> counters_before;  // the recording's host counters (optimizer steps)
};

// Puts back the state a verified call found: after the eager run (whose counter advances the
// replay keeps as its own), and, `counters` too, after a replay that failed its comparison, so
// that the call leaves the user's state as it was.
void restore_before(VerifyState& vs, const Recording& rec, bool counters);

// Verify: runs the graph of `inner`'s results that `given` marks (as the first backward got
// them), from `grads` (one per marked result), eagerly under `recorder` with the leaves' .grad
// set aside and put back after, so the check leaves no gradient behind.
void verify_backward(Recorder& recorder, std::span<const Tensor> inner,
                     const std::vector<char>& given, std::vector<Tensor> grads,
                     const std::vector<Tensor>& aliases, const std::vector<Tensor>& leaves);

// Compares a fresh eager recording with the plan's, step by step (structure, then values).
void compare_runs(std::string_view name, const Plan& p, const Recording& eager,
                  const std::vector<StepSnapshot>& replayed, Phase phase);

}  // namespace encore::schedule::detail
