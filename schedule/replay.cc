// Replay: a call of a planned entry binds its tensors into a call state and runs the forward
// schedule; the subgraph node's backward runs the backward schedule.
#include "runtime/autograd.h"
#include "runtime/labelled_node.h"
#include "runtime/profiler.h"
#include "runtime/value_checks.h"
#include "schedule/static_graph_impl.h"
#include "schedule/verify.h"

namespace encore::schedule {
using namespace detail;
namespace {

// What a replayed call keeps until its backward: its call state (arena) and the plan it belongs to.
struct Frame final : RefCounted {
  std::shared_ptr<Entry> entry;
  std::shared_ptr<Plan> plan;
  CallState* state = nullptr;
  std::unique_ptr<VerifyState> verify;
  ~Frame() override {
    if (state != nullptr) plan->release(state);
  }
};

Tensor tensor_on(const IntrusivePtr<Storage>& s, const Operand& o) {
  return Tensor(make_intrusive<TensorImpl>(s, 0, o.shape, o.dtype));
}

Tensor grad_tensor(CallState& b, const Plan& p, const Entry& e, int buf, const Tensor& leaf) {
  const Buffer& B = p.recording().buffers[buf];
  if (B.kind == BufKind::Temp)
    return tensor_on(b.own[p.escape_slot(buf)], Operand{buf, leaf.shape(), leaf.dtype()});
  Tensor scratch;
  const Tensor* t = bound_tensor(e, B, {}, scratch);
  return t != nullptr ? *t : Tensor();
}

[[noreturn]] void fail_modified_result(const Plan& p, int buf, uint32_t then, uint32_t now) {
  Shape shape;
  for (const Operand& r : p.results())
    if (r.buf == buf) shape = r.shape;
  fail("backward of a static call: its result ", shape,
       ", which the backward reads, was modified in place (version ", then, " -> ", now, ")");
}

// A gradient for differentiable result k, which the first backward did not get: the backward
// schedule has no steps for it. The signature traces again at its next call.
[[noreturn]] void fail_new_gradient(const Entry& e, int k, const TensorMeta& m) {
  e.stale->store(Stale::NewGradient, std::memory_order_release);
  fail("backward of a static call: its result ", e.plan->recording().differentiable[k], " ",
       m.shape,
       " got a gradient, but the first backward of its trace got none for it, so the replayed "
       "backward cannot compute its part; the next call traces again (or back-propagate through "
       "the same results at every call)");
}

// A part of verify mode: its eager run, or its comparison with the replay. Where it fails at a
// size a dynamic family planned, the family's schedule does not do what the function does at that
// size: the family goes, with its sizes and the trace that made it, and the next call traces.
template <typename F>
void verify_part(const Entry& e, F&& compare) {
  if (e.family < 0) return compare();
  try {
    compare();
  } catch (const Error& ex) {
    e.stale->store(Stale::VerifyFailed, std::memory_order_release);
    throw Error(cat(ex.what(), " (at a size planned from dynamic family ", e.family,
                    ", which goes: the next call traces)"));
  }
}

void replay_backward(BackwardContext& ctx) {
  Frame& f = static_cast<Frame&>(*ctx.payload());
  profiler::ScopedSpan span({}, profiler::SpanKind::BackwardReplay);
  if (span.recording()) {
    span.set_name(span_name(*f.entry, profiler::SpanKind::BackwardReplay));
    span.set_args(f.entry->span_args);
  }
  Plan& p = *f.plan;
  CallState& b = *f.state;
  ENCORE_CHECK(!b.backward_done, "backward: a replayed static call was back-propagated twice ",
               "(retain_graph); its arena is reused by the backward, so run the function again");
  const Entry& e = *f.entry;
  // The gradients as the first backward got them: one it did not get has no steps in the
  // schedule; one it got and this call did not is zeros.
  std::vector<Tensor> zeros;
  for (int k = 0; k < ctx.num_outputs(); ++k) {
    const Tensor& g = ctx.grad_output(k);
    if (g.defined() && !e.grad_given[k]) fail_new_gradient(e, k, ctx.output_meta(k));
    const int buf = static_cast<size_t>(k) < e.grad_in.size() ? e.grad_in[k] : -1;
    if (buf < 0) continue;
    if (g.defined()) {
      b.ptrs[buf] = g.raw_data();
    } else {
      zeros.push_back(filled(ctx.output_meta(k), 0.0));
      b.ptrs[buf] = zeros.back().raw_data();
    }
  }
  if (f.verify) {
    VerifyState& v = *f.verify;
    std::vector<Tensor> grads;
    for (int k = 0; k < ctx.num_outputs(); ++k)
      if (e.grad_given[k])
        grads.push_back(ctx.grad_output(k).defined() ? ctx.grad_output(k)
                                                     : filled(ctx.output_meta(k), 0.0));
    verify_backward(*v.recorder, v.inner, e.grad_given, std::move(grads), v.aliases, v.leaves);
  }
  for (size_t i = 0; i < b.held.size(); ++i)
    ENCORE_CHECK(b.held[i].version() == b.versions[i], "backward of a static call: a tensor ",
                 b.held[i].shape(), " it saved was modified in place (version ", b.versions[i],
                 " -> ", b.held[i].version(), ")");
  const std::vector<int>& escaped = p.backward_escape_reads();
  for (size_t i = 0; i < escaped.size(); ++i) {
    const uint32_t now = b.own[p.escape_slot(escaped[i])]->version();
    if (now != b.escape_versions[i]) fail_modified_result(p, escaped[i], b.escape_versions[i], now);
  }
  p.allocate_escapes(b, Phase::Backward);
  p.bind(b, Phase::Backward);
  std::vector<StepSnapshot> snaps;
  p.run(b, Phase::Backward, f.verify ? &snaps : nullptr);
  b.backward_done = true;
  if (f.verify)
    verify_part(e, [&] { compare_runs(e.name, p, f.verify->rec, snaps, Phase::Backward); });
  const std::vector<Operand>& grads = p.grads();
  for (size_t j = 0; j < grads.size(); ++j)
    ctx.set_input_grad(static_cast<int>(j),
                       tensor_on(b.own[p.escape_slot(grads[j].buf)], grads[j]));
}

}  // namespace

void StaticGraph::Impl::replay(const std::shared_ptr<Entry>& e, std::span<const Tensor> args,
                               std::vector<Tensor>& results, bool verify) {
  profiler::ScopedSpan span({}, profiler::SpanKind::ForwardReplay);
  if (span.recording()) {
    span.set_name(span_name(*e, profiler::SpanKind::ForwardReplay));
    std::call_once(e->span_args_once, [&] {
      e->span_args = intern(cat("signature: ", describe(e->sig, config), "; arena bytes ",
                                e->plan->memory().arena_bytes, "; steps ", e->plan->forward_steps(),
                                " forward, ", e->plan->backward_steps(), " backward"));
    });
    span.set_args(e->span_args);
  }
  Plan& p = *e->plan;
  const Recording& rec = p.recording();
  Tensor scratch;
  // Labels and ids the call is handed are checked before anything changes (plan.h).
  for (const Plan::ValueCheck& c : p.value_checks())
    if (const Tensor* t = bound_tensor(*e, rec.buffers[c.buf], args, scratch); t != nullptr)
      check_values(c.op, c.attrs, t->raw_data(), c.dtype, c.n, c.bound);
  std::unique_ptr<VerifyState> vs;
  std::vector<StepSnapshot> snaps;
  if (verify) verify_part(*e, [&] { vs = run_for_verify(*e, args); });

  // The .grad the step replaces goes before the new ones are allocated, unless a step may still
  // fail midway (the call must then leave it as it was; the end of the call replaces it).
  if (!p.checks_midway())
    for (int li : e->early_clear) leaf_now(*e, rec.leaves[li]).impl()->grad.reset();
  CallState* b = p.acquire();
  struct ReleaseOnError {
    Plan& p;
    CallState*& b;
    ~ReleaseOnError() {
      if (b != nullptr) p.release(b);
    }
  } guard{p, b};
  for (int buf : p.external_buffers()) {
    const Tensor* t = bound_tensor(*e, rec.buffers[buf], args, scratch);
    if (t != nullptr) b->ptrs[buf] = t->raw_data();
  }
  p.allocate_escapes(*b, Phase::Forward);
  p.bind(*b, Phase::Forward);
  p.take_live_attrs(*b);
  p.run(*b, Phase::Forward, verify ? &snaps : nullptr);
  // In-place writes to bound tensors count as eager's do, and host counters advance as the traced
  // code advanced them. A verified call's eager run already bumped their versions and counters (its
  // state restore does not), and the tensors it saved for backward were saved at those versions.
  if (!verify) {
    for (const auto& c : rec.counters) c->fetch_add(1, std::memory_order_relaxed);
    for (int buf : p.mutated_external()) {
      const Tensor* t = bound_tensor(*e, rec.buffers[buf], args, scratch);
      if (t != nullptr) t->impl()->storage->bump_version();
    }
  }
  // What the backward reads outside the arena stays alive, and must not change, until then.
  for (int buf : p.backward_reads()) {
    const Tensor* t = bound_tensor(*e, rec.buffers[buf], args, scratch);
    b->held.push_back(*t);
    b->versions.push_back(t->version());
  }
  for (int buf : p.backward_escape_reads())
    b->escape_versions.push_back(b->own[p.escape_slot(buf)]->version());
  for (const Leaf& l : rec.leaves) {
    if (l.final_grad == Leaf::kUntouched) continue;
    const Tensor& leaf = leaf_now(*e, l);
    leaf.impl()->grad = l.final_grad == Leaf::kCleared
                            ? IntrusivePtr<TensorImpl>()
                            : grad_tensor(*b, p, *e, l.final_grad, leaf).impl_ptr();
  }
  results.clear();
  results.reserve(p.results().size());
  for (size_t k = 0; k < p.results().size(); ++k) {
    const Operand& r = p.results()[k];
    if (rec.result_twin[k] >= 0) {  // what eager returns: the same tensor
      results.push_back(results[rec.result_twin[k]]);
      continue;
    }
    if (rec.result_arg[k] >= 0) {
      results.push_back(args[rec.result_arg[k]]);
      continue;
    }
    if (rec.result_leaf[k] >= 0) {
      results.push_back(leaf_now(*e, rec.leaves[rec.result_leaf[k]]));
      continue;
    }
    if (p.escape_slot(r.buf) < 0) {  // a view of a tensor bound to this call
      const Tensor* t = bound_tensor(*e, rec.buffers[r.buf], args, scratch);
      results.push_back(Tensor(
          make_intrusive<TensorImpl>(t->impl()->storage, t->impl()->offset, r.shape, r.dtype)));
      continue;
    }
    results.push_back(tensor_on(b->own[p.escape_slot(r.buf)], r));
  }
  if (verify)
    verify_part(*e, [&] {
      try {
        compare_runs(config.name, p, vs->rec, snaps, Phase::Forward);
      } catch (...) {
        restore_before(*vs, rec, /*counters=*/true);  // the state as the call found it
        throw;
      }
      vs->written_before.clear();  // the backward (if any) needs none of it
      vs->grads_before.clear();
    });

  if (!e->node) return;  // the guard releases the call state
  auto frame = make_intrusive<Frame>();
  frame->entry = e;
  frame->plan = e->plan;
  frame->state = b;
  b = nullptr;
  if (verify) {
    vs->recorder->set_phase(Phase::Backward);
    for (const Leaf& l : rec.leaves) vs->leaves.push_back(leaf_now(*e, l));
    frame->verify = std::move(vs);
  }
  IntrusivePtr<Node> n =
      labelled_node(label, &replay_backward, rec.contributions.size(), rec.differentiable.size());
  n->materialize_grads = false;
  for (const Recording::Contribution& c : rec.contributions)
    add_input(*n, c.arg ? args[c.index] : leaf_now(*e, rec.leaves[c.index]));
  for (int k : rec.differentiable) add_output(n, *results[k].impl());
  n->payload = std::move(frame);
}

}  // namespace encore::schedule
