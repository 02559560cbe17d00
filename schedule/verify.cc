// Verify mode: the eager run a verified replay is checked against, and the check.
#include "schedule/verify.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/autograd.h"
#include "runtime/rng.h"
#include "schedule/static_graph_impl.h"

namespace encore::schedule {
namespace detail {
namespace {

// The attributes worth showing in a message (the scalar of scalar ops).
std::string attrs_text(Op op, const AttrBlob& a) {
  return op_has_scalar_attrs(op) ? cat(" with scalar ", a.as<ScalarAttrs>().value) : "";
}

std::string step_text(Op op, std::span<const Operand> in, std::span<const Operand> out,
                      const AttrBlob& attrs) {
  std::string s = std::string(op_name(op)) + "(";
  for (size_t i = 0; i < in.size(); ++i) s += cat(i ? ", " : "", in[i].dtype, in[i].shape);
  s += cat(")", attrs_text(op, attrs));  // not ")" + ...: GCC 12 -O3 misreports -Wrestrict
  if (!out.empty()) s += cat(" -> ", out[0].dtype, out[0].shape);
  return s;
}

bool same_attrs(Op op, const AttrBlob& a, const AttrBlob& b) {
  if (op_draws_random(op)) {  // the stream differs by design; the distribution must not
    const RandomAttrs &x = a.as<RandomAttrs>(), &y = b.as<RandomAttrs>();
    return x.a == y.a && x.b == y.b;
  }
  if (a.holds<SliceAttrs>() && b.holds<SliceAttrs>()) {
    // What a slice does is its axis, bounds and step; the bounds as asked only say how Python's
    // clamping reached them, and a size planned from a family keeps its latest trace's.
    const SliceAttrs &x = a.as<SliceAttrs>(), &y = b.as<SliceAttrs>();
    return x.axis == y.axis && x.start == y.start && x.stop == y.stop && x.step == y.step;
  }
  return std::memcmp(a.bytes, b.bytes, AttrBlob::kCapacity) == 0;
}

// Whether a replayed step wrote the values the eager run did, `parts` the operands the bytes hold
// one after the other: the same bytes, except that any NaN equals any NaN. Which NaN an operation
// on two NaNs returns (its sign and payload) follows the operand order the compiler chose for the
// loop, which differs between a fused step and the op's own kernel; IEEE 754 leaves it open.
bool same_values(std::span<const Operand> parts, std::span<const unsigned char> a,
                 std::span<const unsigned char> b) {
  if (a.size() != b.size()) return false;
  if (std::equal(a.begin(), a.end(), b.begin())) return true;
  size_t at = 0;
  auto same_part = [&](const Operand& o) {
    const size_t n = o.nbytes();
    if (at + n > a.size()) return false;
    const unsigned char* x = a.data() + at;
    const unsigned char* y = b.data() + at;
    at += n;
    auto same_floats = [&]<typename T>(T) {
      for (size_t i = 0; i < n / sizeof(T); ++i) {
        T u, v;
        std::memcpy(&u, x + i * sizeof(T), sizeof(T));
        std::memcpy(&v, y + i * sizeof(T), sizeof(T));
        if (std::memcmp(&u, &v, sizeof(T)) != 0 && !(std::isnan(u) && std::isnan(v))) return false;
      }
      return true;
    };
    if (o.dtype == DType::Float32) return same_floats(float{});
    if (o.dtype == DType::Float64) return same_floats(double{});
    return std::memcmp(x, y, n) == 0;
  };
  bool same = true;
  for (const Operand& o : parts) same = same && same_part(o);
  return same && at == a.size();
}

// Whether a replayed snapshot of step s holds the values of `eager`, the bytes of all s wrote in
// the eager run, one operand after another: all of them, the one output the snapshot is of (a
// fused step's), or one group's writes (an update the plan split).
bool same_values(const Step& s, const StepSnapshot& mine, const std::vector<unsigned char>& eager) {
  if (s.op == Op::AllReduceStart) return true;  // its handle is a request slot, not a value
  std::vector<Operand> written;
  for_each_written(s.op, std::span<const Operand>(s.in), std::span<const Operand>(s.out),
                   [&](const Operand& o) { written.push_back(o); });
  size_t first = 0, last = written.size();
  if (mine.output >= 0) first = static_cast<size_t>(mine.output), last = first + 1;
  if (const int size = op_input_group(s.op); mine.group >= 0 && size > 0) {
    size_t per = 0;  // writes per group
    for (int i = 0; i < size; ++i) per += op_writes_input(s.op, static_cast<size_t>(i)) ? 1 : 0;
    first = static_cast<size_t>(mine.group) * per, last = first + per;
  }
  if (last > written.size()) return false;
  size_t at = 0, n = 0, total = 0;
  for (size_t k = 0; k < written.size(); ++k) {
    const size_t bytes = written[k].nbytes();
    if (k < first) at += bytes;
    if (k >= first && k < last) n += bytes;
    total += bytes;
  }
  if (total != eager.size()) return false;
  return same_values(std::span<const Operand>(written).subspan(first, last - first), mine.bytes,
                     std::span<const unsigned char>(eager).subspan(at, n));
}

}  // namespace

void verify_backward(Recorder& recorder, std::span<const Tensor> inner,
                     const std::vector<char>& given, std::vector<Tensor> grads,
                     const std::vector<Tensor>& aliases, const std::vector<Tensor>& leaves) {
  std::vector<IntrusivePtr<TensorImpl>> stash;
  for (const Tensor& l : leaves) stash.push_back(std::move(l.impl()->grad));
  for (const Tensor& a : aliases)
    if (a.defined()) a.impl()->grad.reset();  // (an argument left out is undefined)
  struct Restore {
    const std::vector<Tensor>& leaves;
    std::vector<IntrusivePtr<TensorImpl>>& stash;
    ~Restore() {
      for (size_t i = 0; i < leaves.size(); ++i) leaves[i].impl()->grad = std::move(stash[i]);
    }
  } restore{leaves, stash};
  std::vector<Tensor> roots;
  for (size_t k = 0; k < given.size(); ++k)
    if (given[k]) {
      recorder.add_grad_in(static_cast<int>(k), grads[roots.size()]);
      roots.push_back(inner[k]);
    }
  TracerScope scope(&recorder);
  autograd::backward(roots, grads, /*retain_graph=*/true);
}

void compare_runs(std::string_view name, const Plan& p, const Recording& eager,
                  const std::vector<StepSnapshot>& replayed, Phase phase) {
  const bool backward = phase == Phase::Backward;
  const std::vector<Step>& want = p.trace_steps();
  const int begin = backward ? p.recorded_forward() : 0;
  const int end = backward ? static_cast<int>(want.size()) : p.recorded_forward();
  const std::vector<Step>& got = backward ? eager.backward : eager.forward;
  const char* what = phase_name(phase);
  for (int i = begin; i < end; ++i) {
    const int k = i - begin;
    const Step& a = want[i];
    ENCORE_CHECK(k < static_cast<int>(got.size()), "verify: ", name,
                 ": the eager run stopped after ", got.size(), " ", what, " ops; the schedule has ",
                 end - begin, ": the function is not static");
    const Step& b = got[k];
    // A live step's attributes are the optimizer's at the call, not the trace's (Step::live).
    const bool live = a.live >= 0 && p.recording().guard_live[a.live];
    bool same = a.op == b.op && a.in.size() == b.in.size() && a.out.size() == b.out.size() &&
                (live ? a.attrs.type == b.attrs.type : same_attrs(a.op, a.attrs, b.attrs));
    for (size_t j = 0; same && j < a.in.size(); ++j)
      same = a.in[j].shape == b.in[j].shape && a.in[j].dtype == b.in[j].dtype;
    for (size_t j = 0; same && j < a.out.size(); ++j)
      same = a.out[j].shape == b.out[j].shape && a.out[j].dtype == b.out[j].dtype;
    ENCORE_CHECK(same, "verify: ", name, ": ", what, " op ", k, " differs: the schedule has ",
                 step_text(a.op, a.in, a.out, a.attrs), ", the eager run now does ",
                 step_text(b.op, b.in, b.out, b.attrs),
                 " (different op, shapes or attributes): the function is not static; its ops "
                 "depend on something outside its signature");
  }
  ENCORE_CHECK(static_cast<int>(got.size()) == end - begin, "verify: ", name,
               ": the eager run did ", got.size(), " ", what, " ops; the schedule has ",
               end - begin, ": the function is not static");
  // The replay ran the steps in the plan's order, which may differ from the recorded one (updates
  // moved early); values are compared in recorded order, so the difference reported is the first
  // in the function's own order, with the op numbers the message uses.
  std::vector<const StepSnapshot*> in_order;
  in_order.reserve(replayed.size());
  for (const StepSnapshot& mine : replayed)
    if (mine.trace_index >= 0) in_order.push_back(&mine);
  std::stable_sort(
      in_order.begin(), in_order.end(),
      [](const StepSnapshot* x, const StepSnapshot* y) { return x->trace_index < y->trace_index; });
  const int offset = backward ? static_cast<int>(eager.forward.size()) : 0;
  for (const StepSnapshot* snap : in_order) {
    const StepSnapshot& mine = *snap;
    const int k = mine.trace_index - begin;
    const Step& a = want[mine.trace_index];
    ENCORE_CHECK(same_values(a, mine, eager.snapshots[offset + k]), "verify: ", name, ": ", what,
                 " op ", k, " ", step_text(a.op, a.in, a.out, a.attrs),
                 mine.output > 0   ? cat(" (output ", mine.output, ")")
                 : mine.group >= 0 ? cat(" (parameter ", mine.group, ")")
                                   : std::string(),
                 " computed different values in the replay and in the eager run: the function "
                 "is not static (it reads values the schedule bound at trace time)");
  }
}

void restore_before(VerifyState& vs, const Recording& rec, bool counters) {
  for (auto& [t, bytes] : vs.written_before)
    cuda::copy_bytes(t.raw_data(), t.device(), bytes.data(), Device::cpu(), bytes.size());
  for (auto& [t, gimpl] : vs.grads_before) t.impl()->grad = gimpl;
  if (vs.generator != nullptr) vs.generator->set_state(vs.stream_before);
  for (size_t k = 0; counters && k < vs.counters_before.size(); ++k)
    rec.counters[k]->store(vs.counters_before[k], std::memory_order_relaxed);
}

}  // namespace detail

using namespace detail;

// Runs the function eagerly under a recorder that keeps every op's values, then undoes what it
// changed (state updated in place, .grad, the random streams) so the replay starts from the
// same state.
std::unique_ptr<VerifyState> StaticGraph::Impl::run_for_verify(const Entry& e,
                                                               std::span<const Tensor> args) {
  {
    std::lock_guard<std::mutex> l(mu);
    ++stats.verifications;
  }
  const Recording& rec = e.plan->recording();
  auto vs = std::make_unique<VerifyState>();
  Tensor scratch;
  for (int buf : e.plan->mutated_external()) {
    const Tensor* t = bound_tensor(e, rec.buffers[buf], args, scratch);
    if (t == nullptr || !t->defined()) continue;
    std::vector<unsigned char> bytes(t->nbytes());
    cuda::copy_bytes(bytes.data(), Device::cpu(), t->raw_data(), t->device(), bytes.size());
    vs->written_before.emplace_back(*t, std::move(bytes));
  }
  for (const Leaf& l : rec.leaves) {
    const Tensor& t = leaf_now(e, l);
    if (t.defined()) vs->grads_before.emplace_back(t, t.impl()->grad);
  }
  vs->generator = &default_generator(e.plan->device());
  vs->stream_before = vs->generator->state();
  for (const auto& c : rec.counters) vs->counters_before.push_back(c->load());
  vs->recorder = std::make_unique<Recorder>(vs->rec, config.name, false, true);
  vs->inner = run_recorded(*vs->recorder, args, e.slots, vs->aliases);
  restore_before(*vs, rec, /*counters=*/false);
  // The results that carry the node, by differentiable index, as the trace's.
  ENCORE_CHECK(vs->inner.size() == rec.results.size(), "verify: ", config.name,
               ": the eager run returned ", vs->inner.size(), " results; the schedule has ",
               rec.results.size(), ": the function is not static");
  std::vector<Tensor> inner;
  for (int k : rec.differentiable) {
    ENCORE_CHECK(vs->inner[k].requires_grad(), "verify: ", config.name, ": result ", k,
                 " of the eager run does not require grad; the schedule's does: the function is "
                 "not static");
    inner.push_back(vs->inner[k]);
  }
  vs->inner = std::move(inner);
  return vs;
}

}  // namespace encore::schedule
