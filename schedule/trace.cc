// Tracing: the first call of a signature runs the function under a recorder, and the first
// backward through its outputs is recorded into the entry's backward schedule.
#include <algorithm>
#include <optional>

#include "absl/container/inlined_vector.h"
#include "runtime/autograd.h"
#include "runtime/labelled_node.h"
#include "runtime/param_updaters.h"
#include "runtime/profiler.h"
#include "schedule/static_graph_impl.h"

namespace encore::schedule {
using namespace detail;
namespace {

// The node of a traced call: its backward runs the call's own autograd graph eagerly, recorded
// the first time into the entry's backward schedule.
struct TraceFrame final : RefCounted {
  std::shared_ptr<Entry> entry;
  std::shared_ptr<Recording> rec;
  std::unique_ptr<Recorder> recorder;
  std::vector<Tensor> args;     // the call's arguments
  std::vector<Tensor> aliases;  // the arguments as the function saw them (leaves)
  std::vector<Tensor> inner;    // its differentiable results, with their graph
  // Arguments with a producer, each tensor once (its first position): the node's inputs.
  std::vector<int> node_args;
  bool recorded = false;
  ~TraceFrame() override {
    EntryState waiting = EntryState::Waiting;
    if (!recorded)
      entry->state.compare_exchange_strong(waiting, EntryState::Abandoned,
                                           std::memory_order_acq_rel);
  }
};

// Plans a recording whose schedules are complete. The entry keeps its recording (the plan
// shares it): calls that check the guards of a Waiting entry read its leaves meanwhile.
void complete_entry(Entry& e) {
  if (e.keep_trace) e.pristine = std::make_shared<const Recording>(*e.rec);
  e.plan = std::make_shared<Plan>(e.rec, e.plan_options);
}

// The results that got a gradient, and their gradients: what is back-propagated. A result that
// got none is left out, as eager leaves out what no gradient reached.
struct Given {
  std::vector<Tensor> roots, grads;
  std::vector<char> mask;  // per differentiable result
  Given(const TraceFrame& f, const BackwardContext& ctx) : mask(ctx.num_outputs(), 0) {
    for (int k = 0; k < ctx.num_outputs(); ++k)
      if (const Tensor& g = ctx.grad_output(k); g.defined()) {
        roots.push_back(f.inner[k]);
        grads.push_back(g);
        mask[k] = 1;
      }
  }
};

// Records the first backward of a traced call and plans its entry; a failure makes the entry
// Failed (the next call with its signature traces again) and reaches the caller.
void record_backward(TraceFrame& f, Given& given) {
  Entry& e = *f.entry;
  try {
    f.recorder->set_phase(Phase::Backward);
    for (size_t k = 0, j = 0; k < given.mask.size(); ++k)
      if (given.mask[k]) f.recorder->add_grad_in(static_cast<int>(k), given.grads[j++]);
    e.grad_given = given.mask;
    f.rec->grad_given = given.mask;
    {
      TracerScope scope(f.recorder.get());
      autograd::backward(given.roots, given.grads, /*retain_graph=*/true);
    }
    if (e.eager_only) return;
    const Recording& rec = *f.rec;
    if (!rec.retrace.empty()) {
      f.recorder.reset();
      e.publish(EntryState::Retrace);
      return;
    }
    for (size_t b = 0; b < rec.buffers.size(); ++b)
      if (rec.buffers[b].kind == BufKind::GradIn) {
        if (e.grad_in.size() <= static_cast<size_t>(rec.buffers[b].index))
          e.grad_in.resize(rec.buffers[b].index + 1, -1);
        e.grad_in[rec.buffers[b].index] = static_cast<int>(b);
      }
    f.recorder.reset();
    complete_entry(e);
    e.publish(EntryState::Ready);
    if (!e.dynamic_dims.empty())
      if (std::shared_ptr<StaticGraph::Impl> owner = e.owner.lock()) owner->make_dynamic(f.entry);
  } catch (const std::exception& ex) {
    if (e.eager_only) throw;
    e.failure = ex.what();
    ++e.backward_failures;
    e.publish(EntryState::Failed);
    if (std::shared_ptr<StaticGraph::Impl> owner = e.owner.lock()) owner->backward_failed(e);
    throw;
  }
}

void trace_backward(BackwardContext& ctx) {
  TraceFrame& f = static_cast<TraceFrame&>(*ctx.payload());
  profiler::ScopedSpan span({}, profiler::SpanKind::TraceBackward);
  if (span.recording()) span.set_name(span_name(*f.entry, profiler::SpanKind::TraceBackward));
  const bool record = !f.recorded;
  f.recorded = true;
  Given given(f, ctx);
  // Exactly eager's accumulation: parameters take their gradients into .grad directly; the
  // alias standing for an argument that is a leaf sends each of its gradients into the
  // argument's .grad as it comes (in order with those the function sends the argument itself,
  // where it captured it too); one with a producer gets the alias's gradient through this node.
  // The recorder notes each delivery.
  absl::InlinedVector<std::optional<autograd::GradRedirect>, 4> redirects(f.aliases.size());
  for (size_t i = 0; i < f.aliases.size(); ++i)
    if (f.aliases[i].defined() && f.aliases[i].requires_grad()) {
      if (f.args[i].is_leaf())
        redirects[i].emplace(f.aliases[i], f.args[i]);
      else
        f.aliases[i].impl()->grad = nullptr;
    }
  if (record)
    record_backward(f, given);
  else
    autograd::backward(given.roots, given.grads, /*retain_graph=*/true);
  for (size_t j = 0; j < f.node_args.size(); ++j) {
    Tensor g(f.aliases[f.node_args[j]].impl()->grad);
    if (g.defined()) ctx.set_input_grad(static_cast<int>(j), std::move(g));
  }
}

}  // namespace

std::vector<Tensor> StaticGraph::Impl::run_recorded(Recorder& recorder,
                                                    std::span<const Tensor> args,
                                                    const std::vector<ParamSlot>& slots,
                                                    std::vector<Tensor>& aliases) {
  aliases.clear();
  for (size_t i = 0; i < args.size(); ++i) {
    const Tensor& a = args[i];
    if (!a.defined()) {  // the function gets it undefined
      aliases.emplace_back();
      continue;
    }
    const auto same = std::find_if(args.begin(), args.begin() + i,
                                   [&a](const Tensor& b) { return b.impl() == a.impl(); });
    if (same != args.begin() + i) {
      aliases.push_back(aliases[same - args.begin()]);
      continue;
    }
    Tensor alias = a.detach();
    if (a.requires_grad()) alias.set_requires_grad(true);
    aliases.push_back(std::move(alias));
  }
  for (size_t i = 0; i < aliases.size(); ++i)
    if (aliases[i].defined()) recorder.add_arg(static_cast<int>(i), aliases[i]);
  recorder.add_watched(slots);
  std::vector<Tensor> results;
  TracerScope scope(&recorder);
  body(aliases, results);
  return results;
}

std::string StaticGraph::Impl::trace(const std::shared_ptr<Entry>& entry,
                                     std::span<const Tensor> args, std::vector<Tensor>& results) {
  Entry& e = *entry;
  if (config.params) e.slots = config.params();
  if (config.tree) e.tree = config.tree();
  auto rec = std::make_shared<Recording>();
  auto recorder =
      std::make_unique<Recorder>(*rec, config.name, config.on_unsafe == OnUnsafe::Error, false);
  recorder->watch_modules(e.tree);
  std::vector<Tensor> aliases;
  const std::vector<Tensor> inner = run_recorded(*recorder, args, e.slots, aliases);
  // (After the function ran: a call with the wrong number of tensors says so first.)
  ENCORE_CHECK(config.arg_names.size() <= args.size(), config.name, ": arg_names has ",
               config.arg_names.size(), " names, but the call has ", args.size(),
               args.size() == 1 ? " argument" : " arguments");
  recorder->check_escapes(inner);
  for (size_t k = 0; k < inner.size(); ++k) {
    const Tensor& r = inner[k];
    ENCORE_CHECK(r.defined(), config.name, ": the function returned an undefined tensor");
    rec->results.push_back(recorder->operand_of(r));
    auto same = [&r](const Tensor& t) { return t.impl() == r.impl(); };
    const auto twin = std::find_if(inner.begin(), inner.begin() + k, same);
    const auto arg = std::find_if(aliases.begin(), aliases.end(), same);
    rec->result_twin.push_back(twin != inner.begin() + k ? static_cast<int>(twin - inner.begin())
                                                         : -1);
    rec->result_arg.push_back(arg != aliases.end() ? static_cast<int>(arg - aliases.begin()) : -1);
    const auto leaf = std::find_if(rec->leaves.begin(), rec->leaves.end(),
                                   [&same](const Leaf& l) { return same(l.tensor); });
    const bool is_leaf =
        rec->result_twin[k] < 0 && rec->result_arg[k] < 0 && leaf != rec->leaves.end();
    rec->result_leaf.push_back(is_leaf ? static_cast<int>(leaf - rec->leaves.begin()) : -1);
  }
  e.eager_only = !rec->unsafe.empty();

  // Results that are an earlier result, an argument or a leaf carry no node (they are that
  // tensor).
  auto as_is = [&rec](size_t k) {
    return rec->result_twin[k] >= 0 || rec->result_arg[k] >= 0 || rec->result_leaf[k] >= 0;
  };
  bool carried = false;
  for (size_t k = 0; k < inner.size(); ++k) carried |= inner[k].requires_grad() && !as_is(k);
  // (Whatever the grad mode of the call: a function that turns grad on inside returns results
  // with a graph, as eagerly.)
  const bool node = !rec->saw_backward && carried;
  e.node = node;
  // Guards: watched parameters' shapes; whether captured tensors require grad; the state of
  // .grad the trace depended on.
  for (const Buffer& buf : rec->buffers)
    if (buf.kind == BufKind::Param) {
      ParamGuard& g = e.params.emplace_back();
      g.slot = buf.index;
      g.shape = buf.bound.shape();
      g.dtype = buf.bound.dtype();
      g.device = buf.bound.device();
      g.requires_grad = buf.bound.requires_grad();
      g.written = buf.mutated ? e.slots[buf.index].slot->impl() : nullptr;
      for (size_t k = 0; k < e.slots.size(); ++k)
        if (static_cast<int>(k) != buf.index && same_place(*e.slots[k].slot, buf.bound))
          g.tied.push_back(static_cast<int>(k));
    }
  for (size_t b = 0; b < rec->buffers.size(); ++b)
    if (const Buffer& buf = rec->buffers[b]; buf.kind == BufKind::External && buf.bound.defined())
      e.captured.push_back({static_cast<int>(b), buf.bound.requires_grad()});
  if (!rec->host_guards.empty()) {  // (the guards of the optimizers the step ran)
    for (size_t b = 0; b < rec->buffers.size(); ++b) {
      const Buffer& buf = rec->buffers[b];
      if (buf.mutated || !buf.bound.defined() || !is_floating(buf.bound.dtype())) continue;
      if (buf.kind == BufKind::Param) e.read_only.push_back({true, buf.index});
      if (buf.kind == BufKind::External) e.read_only.push_back({false, static_cast<int>(b)});
    }
    e.updaters_seen.store(param_updaters_serial(), std::memory_order_relaxed);
  }
  for (size_t i = 0; i < rec->leaves.size(); ++i) {
    const Leaf& l = rec->leaves[i];
    const bool entry_read =
        std::any_of(rec->buffers.begin(), rec->buffers.end(), [i](const Buffer& b) {
          return b.kind == BufKind::GradSlot && b.index == static_cast<int>(i);
        });
    if (l.first == Leaf::First::Replaced && !entry_read)
      e.early_clear.push_back(static_cast<int>(i));
    if (l.first == Leaf::First::EngineSet) {
      e.grads.push_back({static_cast<int>(i), false, Shape()});
    } else if (l.first == Leaf::First::Read) {
      GradGuard g{static_cast<int>(i), l.entry_grad.defined(),
                  l.entry_grad.defined() ? l.entry_grad.shape() : Shape()};
      for (size_t k = 0; k < e.grads.size() && g.defined && g.shares < 0; ++k) {
        const Tensor& other = rec->leaves[e.grads[k].leaf].entry_grad;
        if (other.defined() && other.impl()->storage.get() == l.entry_grad.impl()->storage.get())
          g.shares = static_cast<int>(k);
      }
      e.grads.push_back(std::move(g));
    }
    e.leaf_hooks.push_back(autograd::hooks_digest(l.tensor));
  }
  e.rec = rec;
  set_alias_guards(e);
  if (std::string why = alias_failure(e, args, /*traced=*/true);
      !why.empty() && rec->retrace.empty())
    rec->retrace = cat("cannot be replayed: its ", why);
  for (const auto& g : rec->host_guards)
    if (std::string why = g->changed(); !why.empty() && rec->retrace.empty())
      rec->retrace = cat("changed what a replay bakes in (", why, ")");

  results.clear();
  results.reserve(inner.size());  // (as_eager points into it)
  // A result that is an earlier one, an argument or a leaf is returned as that tensor.
  auto as_eager = [&](size_t k) -> const Tensor* {
    if (rec->result_twin[k] >= 0) return &results[rec->result_twin[k]];
    if (rec->result_arg[k] >= 0) return &args[rec->result_arg[k]];
    if (rec->result_leaf[k] >= 0) return &rec->leaves[rec->result_leaf[k]].tensor;
    return nullptr;
  };
  if (!node) {
    // Results leave the trace cut from its graph (a whole step already ran its backward).
    for (size_t k = 0; k < inner.size(); ++k) {
      const Tensor* same = as_eager(k);
      results.push_back(same != nullptr            ? *same
                        : inner[k].requires_grad() ? inner[k].detach()
                                                   : inner[k]);
    }
    if (!e.eager_only && rec->retrace.empty()) complete_entry(e);
    return rec->unsafe;
  }

  // The subgraph node: its inputs are the arguments with a producer (leaves, parameters
  // included, take their gradients directly, as eagerly); its outputs the differentiable
  // results.
  auto frame = make_intrusive<TraceFrame>();
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].defined() && args[i].requires_grad() && !args[i].is_leaf() &&
        e.sig.args[i].same_as < 0)
      frame->node_args.push_back(static_cast<int>(i));
  for (size_t k = 0; k < inner.size(); ++k)
    if (inner[k].requires_grad() && !as_is(k)) rec->differentiable.push_back(static_cast<int>(k));

  IntrusivePtr<Node> n =
      labelled_node(label, &trace_backward, frame->node_args.size(), rec->differentiable.size());
  n->materialize_grads = false;
  for (int a : frame->node_args) add_input(*n, args[a]);
  for (size_t k = 0; k < inner.size(); ++k) {
    if (const Tensor* same = as_eager(k)) {
      results.push_back(*same);
      continue;
    }
    Tensor out = inner[k].detach();
    if (inner[k].requires_grad()) {
      add_output(n, *out.impl());
      frame->inner.push_back(inner[k]);
    }
    results.push_back(std::move(out));
  }
  frame->entry = entry;
  frame->rec = rec;
  frame->recorder = std::move(recorder);
  frame->aliases = std::move(aliases);
  frame->args.assign(args.begin(), args.end());
  if (e.eager_only) frame->recorded = true;  // nothing to record; just the gradients
  n->payload = std::move(frame);
  return rec->unsafe;
}

}  // namespace encore::schedule
