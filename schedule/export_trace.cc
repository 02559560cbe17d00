// StaticGraph::eval_forward: the forward of an eval entry, as traced, for exporters.
#include <algorithm>

#include "schedule/static_graph_impl.h"

namespace encore::schedule {
using namespace detail;
namespace {

// Whether `e` holds an inference forward: planned, replayable, no backward inside it, and its
// modules in eval mode (a function without modules: traced with grad mode off).
bool is_eval_entry(const Entry& e) {
  if (e.load_state() != EntryState::Ready || e.eager_only || !e.plan) return false;
  // (A graph's inputs are tensors: an argument left undefined has none.)
  if (std::any_of(e.sig.args.begin(), e.sig.args.end(), [](const ArgSig& a) { return !a.defined; }))
    return false;
  if (e.plan->recording().saw_backward) return false;
  return e.sig.mode == 0 || (e.sig.mode == -1 && !e.sig.grad);
}

bool same_arguments(const Signature& sig, std::span<const Tensor> like) {
  if (like.empty()) return true;
  if (sig.args.size() != like.size()) return false;
  for (size_t i = 0; i < like.size(); ++i)
    if (!like[i].defined() || sig.args[i].shape != like[i].shape() ||
        sig.args[i].dtype != like[i].dtype())
      return false;
  return true;
}

}  // namespace

std::shared_ptr<const ForwardTrace> StaticGraph::eval_forward(std::span<const Tensor> like) const {
  std::shared_ptr<Entry> found;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    auto take = [&](const std::shared_ptr<Entry>& e) {
      if (!found && is_eval_entry(*e) && same_arguments(e->sig, like)) found = e;
    };
    for (const auto& e : impl_->entries) take(e);
    // Sizes a dynamic family planned without tracing: their recordings are instantiated from
    // the trace, step for step.
    for (const auto& f : impl_->families) {
      for (const auto& e : f->sizes) take(e);
      if (f->proto) take(f->proto);
    }
  }
  if (!found) return nullptr;
  const Plan& plan = *found->plan;
  auto t = std::make_shared<ForwardTrace>();
  t->name = impl_->config.name;
  t->signature = describe(found->sig, impl_->config);
  t->arg_names = impl_->config.arg_names;
  for (const ArgSig& a : found->sig.args) {
    t->arg_shapes.push_back(a.shape);
    t->arg_dtypes.push_back(a.dtype);
  }
  const Recording& rec = plan.recording();
  t->buffers = rec.buffers;
  t->steps.assign(plan.trace_steps().begin(), plan.trace_steps().begin() + plan.recorded_forward());
  t->results = rec.results;
  for (const ParamSlot& s : found->slots) t->param_names.push_back(s.name);
  return t;
}

}  // namespace encore::schedule
