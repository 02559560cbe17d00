// A cache entry's guards and its profiler span names.
#include "schedule/cache_entry.h"

#include <algorithm>

#include "runtime/autograd.h"
#include "runtime/param_updaters.h"

namespace encore::schedule::detail {
namespace {

std::string_view span_name(std::string_view name, int64_t id, profiler::SpanKind kind) {
  static constexpr const char* kWhat[] = {"forward replay", "backward replay", "trace",
                                          "trace backward"};
  return intern(cat(name, " [entry ", id, "] ", kWhat[static_cast<int>(kind)]));
}

std::string leaf_label(const Entry& e, const Leaf& l) {
  return l.param >= 0 ? cat("parameter '", e.slots[l.param].name, "'")
                      : cat("captured tensor ", l.tensor.shape());
}

// Whether the guarded gradients share storage now as they did when traced (empty: they do; then
// their storages' serials are remembered, so that the next call compares only if one of them
// moved). Only a storage another tensor holds as well can be shared: those are sorted, so that
// each gradient finds the first guard it shares with (the usual call has none to sort).
std::string grads_sharing(const Entry& e) {
  const size_t n = e.grads.size();
  // Each guard's .grad as it is held (no copy: its reference counts are what they are).
  auto grad_of = [&](size_t k) -> const TensorImpl* {
    const Tensor& t = leaf_now(e, e.rec->leaves[e.grads[k].leaf]);
    return t.defined() ? t.impl()->grad.get() : nullptr;
  };
  std::vector<std::pair<const Storage*, int>>& held = e.grads_held;
  held.clear();
  held.reserve(n);
  for (size_t k = 0; k < n; ++k)
    if (const TensorImpl* g = grad_of(k);
        g != nullptr && (g->use_count() > 1 || g->storage->use_count() > 1))
      held.emplace_back(g->storage.get(), static_cast<int>(k));
  std::sort(held.begin(), held.end());
  // Per guard, the first guard whose gradient shares its storage, or -1.
  std::vector<int>& first_of = e.grads_first;
  first_of.assign(n, -1);
  for (size_t i = 1, group = 0; i < held.size(); ++i) {
    if (held[i].first != held[group].first)
      group = i;
    else
      first_of[static_cast<size_t>(held[i].second)] = held[group].second;
  }
  for (size_t k = 0; k < n; ++k) {
    const int was = e.grads[k].shares, first = first_of[k];
    if (first == was) continue;
    const Leaf& a = e.rec->leaves[e.grads[k].leaf];
    const Leaf& b = e.rec->leaves[e.grads[static_cast<size_t>(first >= 0 ? first : was)].leaf];
    return cat("the gradients of ", leaf_label(e, b), " and ", leaf_label(e, a),
               first >= 0 ? " share storage now and did not when traced"
                          : " shared storage when traced and do not now");
  }
  e.grads_seen.resize(n);
  for (size_t k = 0; k < n; ++k) {
    const TensorImpl* g = grad_of(k);
    e.grads_seen[k] = g != nullptr ? g->storage->serial() : 0;
  }
  return {};
}

// An updater (optimizer) made since e.updaters_seen holding a tensor the trace read but did not
// update: its step() is not in the schedule, which the replays would run without it.
std::string newer_updater(const Entry& e) {
  const uint64_t since = e.updaters_seen.load(std::memory_order_relaxed);
  std::string kind;
  for (const Entry::ReadOnly& r : e.read_only) {
    if (!r.param && static_cast<size_t>(r.index) >= e.rec->buffers.size()) continue;
    const Tensor& t = r.param ? *e.slots[r.index].slot : e.rec->buffers[r.index].bound;
    if (!param_updater_since(since, t, kind)) continue;
    return cat(kind == "optimizer" ? "an optimizer" : kind, " made after the trace holds ",
               r.param ? cat("parameter '", e.slots[r.index].name, "'")
                       : cat("a captured tensor ", t.shape()),
               ", which the traced step read but did not update (the schedule does not hold "
               "that optimizer's step)");
  }
  return {};
}

}  // namespace

std::string_view span_name(Entry& e, profiler::SpanKind kind) {
  std::call_once(e.span_names_once, [&e] {
    for (int k = 0; k < 4; ++k)
      e.span_names[k] = span_name(e.name, e.id, static_cast<profiler::SpanKind>(k));
  });
  return e.span_names[static_cast<int>(kind)];
}

std::string guard_failure(const Entry& e) {
  if (e.eager_only) return {};  // runs the function itself
  for (const ParamGuard& g : e.params) {
    const Tensor& p = *e.slots[g.slot].slot;
    const std::string& name = e.slots[g.slot].name;
    if (!p.defined()) return cat("parameter '", name, "' is now undefined");
    if (!(p.shape() == g.shape))
      return cat("parameter '", name, "' shape changed ", g.shape, " -> ", p.shape());
    if (p.dtype() != g.dtype)
      return cat("parameter '", name, "' dtype changed ", g.dtype, " -> ", p.dtype());
    if (p.device() != g.device)
      return cat("parameter '", name, "' device changed ", g.device, " -> ", p.device());
    if (p.requires_grad() != g.requires_grad)
      return cat("parameter '", name, "' requires_grad changed ",
                 g.requires_grad ? "true -> false" : "false -> true");
    if (g.written != nullptr && p.impl() != g.written)
      return cat("parameter '", name,
                 "' was replaced by another tensor; the trace updated the one it had in place");
    for (const int k : g.tied)
      if (!same_place(*e.slots[k].slot, p))
        return cat("parameters '", e.slots[k].name, "' and '", name,
                   "' were one tensor when traced (tied) and are not now");
  }
  // A live guard's changes reach the replays (the steps read its current attributes).
  for (size_t k = 0; k < e.rec->host_guards.size(); ++k) {
    const HostGuard& g = *e.rec->host_guards[k];
    if (std::string why = e.rec->guard_live[k] ? g.unreplayable() : g.changed(); !why.empty())
      return why;
  }
  for (const CapturedGuard& g : e.captured)
    if (const Tensor& t = e.rec->buffers[g.buf].bound; t.requires_grad() != g.requires_grad)
      return cat("a captured tensor ", t.shape(), " requires_grad changed ",
                 g.requires_grad ? "true -> false" : "false -> true");
  bool moved = e.grads_seen.size() != e.grads.size();
  for (size_t k = 0; k < e.grads.size(); ++k) {
    const GradGuard& g = e.grads[k];
    const Leaf& l = e.rec->leaves[g.leaf];
    const Tensor& t = leaf_now(e, l);
    const Tensor grad = t.defined() ? t.grad() : Tensor();
    if (grad.defined() != g.defined)
      return cat("gradient of ", leaf_label(e, l), " changed ", g.defined ? "defined" : "undefined",
                 " -> ", grad.defined() ? "defined" : "undefined");
    if (g.defined && !(grad.shape() == g.shape))
      return cat("gradient of ", leaf_label(e, l), " shape changed ", g.shape, " -> ",
                 grad.shape());
    moved = moved || e.grads_seen[k] != (grad.defined() ? grad.impl()->storage->serial() : 0);
  }
  if (moved) {
    if (std::string why = grads_sharing(e); !why.empty()) return why;
  }
  if (!e.read_only.empty()) {
    if (const uint64_t serial = param_updaters_serial();
        serial != e.updaters_seen.load(std::memory_order_relaxed)) {
      if (std::string why = newer_updater(e); !why.empty()) return why;
      e.updaters_seen.store(serial, std::memory_order_relaxed);
    }
  }
  if (const uint64_t epoch = autograd::hooks_epoch(); epoch != e.hooks_seen) {
    for (size_t i = 0; i < e.leaf_hooks.size(); ++i) {
      const Leaf& l = e.rec->leaves[i];
      if (autograd::hooks_digest(leaf_now(e, l)) != e.leaf_hooks[i])
        return cat("the post-accumulate-grad hooks of ", leaf_label(e, l),
                   " changed (a hook added or removed; the schedule runs the ops of the hooks it "
                   "traced)");
    }
    e.hooks_seen = epoch;
  }
  return {};
}

void set_alias_guards(Entry& e) {
  const Recording& rec = *e.rec;
  e.alias_params.clear();
  e.alias_externals.clear();
  e.arg_written.assign(e.sig.args.size(), 0);
  for (const Buffer& buf : rec.buffers)
    if (buf.kind == BufKind::Arg && static_cast<size_t>(buf.index) < e.arg_written.size())
      e.arg_written[buf.index] |= static_cast<char>(buf.mutated);
  const bool any_written =
      std::any_of(e.arg_written.begin(), e.arg_written.end(), [](char w) { return w != 0; });
  for (size_t b = 0; b < rec.buffers.size(); ++b) {
    const Buffer& buf = rec.buffers[b];
    if (!buf.mutated && !any_written) continue;  // no call can make it a hazard
    if (buf.kind == BufKind::Param)
      e.alias_params.push_back({nullptr, buf.index, buf.mutated});
    else if (buf.kind == BufKind::External)
      e.alias_externals.push_back(
          {buf.bound.impl()->storage.get(), static_cast<int>(b), buf.mutated});
  }
  std::sort(e.alias_externals.begin(), e.alias_externals.end(),
            [](const AliasGuard& a, const AliasGuard& b) { return a.storage < b.storage; });
}

std::string alias_failure(const Entry& e, std::span<const Tensor> args, bool traced) {
  if (e.eager_only) return {};
  const Recording& rec = *e.rec;
  auto why = [&](size_t i, const std::string& what) {
    return cat("argument ", i, " ", args[i].shape(), " shares storage with ", what,
               traced ? ", which the trace cannot tell from it"
                      : ", and the function writes one of them; the schedule keeps them apart");
  };
  auto param_name = [&](int slot) { return cat("parameter '", e.slots[slot].name, "'"); };
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].defined()) continue;
    const Storage* s = args[i].impl()->storage.get();
    auto shares = [s](const Tensor& t) { return t.defined() && t.impl()->storage.get() == s; };
    if (traced) {  // every bound tensor, and every watched one (Param buffers among them)
      if (rec.captured_arg == static_cast<int>(i))
        return cat(why(i, cat("a tensor ", rec.captured_shape, " the function uses")),
                   " (a view made outside encore's ops, as Tensor::view_of makes? F::reshape "
                   "makes one the trace follows)");
      for (const Buffer& b : rec.buffers)
        if (b.kind == BufKind::External && shares(b.bound))
          return why(i, cat("a tensor ", b.bound.shape(), " the function uses"));
      for (size_t k = 0; k < e.slots.size(); ++k)
        if (shares(*e.slots[k].slot)) return why(i, param_name(static_cast<int>(k)));
      for (const Leaf& l : rec.leaves)
        if (l.param < 0 && shares(l.tensor))
          return why(i, cat("a captured tensor ", l.tensor.shape(), " that requires grad"));
      continue;
    }
    const int first = e.sig.args[i].same_as >= 0 ? e.sig.args[i].same_as : static_cast<int>(i);
    const bool written = static_cast<size_t>(first) < e.arg_written.size() && e.arg_written[first];
    for (const AliasGuard& g : e.alias_params)
      if ((g.written || written) && shares(*e.slots[g.index].slot))
        return why(i, param_name(g.index));
    auto at = std::lower_bound(e.alias_externals.begin(), e.alias_externals.end(), s,
                               [](const AliasGuard& g, const Storage* x) { return g.storage < x; });
    for (; at != e.alias_externals.end() && at->storage == s; ++at)
      if (at->written || written)
        return why(i, cat("a tensor ", rec.buffers[at->index].bound.shape(), " the function uses"));
  }
  return {};
}

}  // namespace encore::schedule::detail
