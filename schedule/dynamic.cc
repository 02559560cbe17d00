// Dynamic shapes in the call path: a call that a family serves, a size planned before or one
// planned now from the family's recording without running the function; and why a call no
// family serves traces, against the nearest family. (A trace that may make dimensions dynamic:
// dynamic_trace.cc.)
#include <algorithm>

#include "schedule/static_graph_impl.h"

namespace encore::schedule {
using namespace detail;
namespace {

// Why the views of `rec` (a family's recording at a call's sizes) do not fit, or empty. An
// operand that covered its whole buffer at the trace (`base`) covers it here too, and one of an
// argument covers the argument: a view's sizes may have come from another operand's, which only
// agreed with them at the traces (logits reshaped from x, rows counted like the labels).
std::string views_fit(const Recording& base, const Recording& rec, std::span<const Tensor> args) {
  std::vector<char> whole;
  for_each_operand(
      base, [&](const Operand& o) { whole.push_back(o.nbytes() == base.buffers[o.buf].nbytes); });
  std::vector<size_t> have(rec.buffers.size(), 0);
  for (size_t b = 0; b < rec.buffers.size(); ++b) {
    const Buffer& buf = rec.buffers[b];
    if (buf.kind != BufKind::Arg) continue;
    const TensorImpl& a = *args[static_cast<size_t>(buf.index)].impl();
    have[b] = a.storage->nbytes() - static_cast<size_t>(a.offset) * itemsize(a.dtype);
  }
  std::string bad;
  size_t k = 0;
  for_each_operand(rec, [&](const Operand& o) {
    if (!bad.empty() || !whole[k++]) return;
    const Buffer& buf = rec.buffers[o.buf];
    if (buf.kind == BufKind::Arg ? o.nbytes() != have[o.buf] : o.nbytes() != buf.nbytes)
      bad = cat(buf.kind == BufKind::Arg ? cat("argument ", buf.index) : cat("buffer ", o.buf),
                " would be viewed as ", o.shape, ", which does not cover it as at the traces");
  });
  for (size_t b = 0; b < rec.buffers.size() && bad.empty(); ++b)
    if (rec.buffers[b].kind == BufKind::Arg && rec.buffers[b].nbytes > have[b])
      bad = cat("argument ", rec.buffers[b].index, " would be read past its end");
  return bad;
}

// An entry for the family's recording at `sizes`, planned; null (and why) when it has none.
// `anywhere`: beyond the family's ranges too (shape_family.h).
std::shared_ptr<Entry> plan_size(const StaticGraph::Impl::Family& f, std::span<const Tensor> args,
                                 const std::string* key, int64_t mode,
                                 std::span<const int64_t> sizes, bool anywhere, std::string& why) {
  std::shared_ptr<Recording> rec = instantiate(*f.shapes, sizes, why, anywhere);
  if (!rec) return nullptr;
  if (std::string bad = views_fit(*f.shapes->base, *rec, args); !bad.empty()) {
    why = cat("no schedule at ", sizes_text(sizes), ": ", bad);
    return nullptr;
  }
  const Entry& p = *f.proto;
  auto e = std::make_shared<Entry>();
  e->name = p.name;
  e->id = p.id;
  e->traced_call = p.traced_call;
  e->sig = signature_of(args, key, mode);
  e->owner = p.owner;
  e->node = p.node;
  e->plan_options = p.plan_options;
  e->slots = p.slots;
  e->params = p.params;
  e->grads = p.grads;
  e->leaf_hooks = p.leaf_hooks;
  e->read_only = p.read_only;
  e->updaters_seen.store(p.updaters_seen.load(std::memory_order_relaxed),
                         std::memory_order_relaxed);
  e->grad_in = p.grad_in;
  e->grad_given = p.grad_given;
  e->stale = p.stale;
  e->family = f.id;
  e->early_clear = p.early_clear;
  e->rec = rec;
  try {
    e->plan = std::make_shared<Plan>(std::move(rec), e->plan_options);
    e->plan->share_arenas(f.arenas);
  } catch (const std::exception& ex) {
    why = cat("planning ", sizes_text(sizes), " failed: ", ex.what());
    return nullptr;
  }
  e->publish(EntryState::Ready);
  return e;
}

}  // namespace

std::shared_ptr<Entry> StaticGraph::Impl::dynamic_entry(std::span<const Tensor> args,
                                                        const std::string* key, bool grad,
                                                        int64_t mode,
                                                        std::unique_lock<std::mutex>& lock,
                                                        std::string& reason, int64_t& hits) {
  if (config.dynamic == DynamicShapes::Off || families.empty() || !dynamic_enabled())
    return nullptr;
  std::vector<int64_t>& sizes = family_sizes_scratch;  // under `mu`: no allocation per call
  // Whether the family at `it` can serve this call: its sizes fit (written to `sizes`) and its
  // guards hold. Else `it` moves on (a stale family is dropped), and `reason` says why where it
  // said nothing yet.
  using FamilyIt = std::list<std::shared_ptr<Family>>::iterator;
  const auto serves = [&](FamilyIt& it) {
    const Family& f = **it;
    if (!family_sizes(*f.shapes, args, key, grad, mode, sizes)) {
      ++it;
      return false;
    }
    if (const Stale why = f.proto->stale->load(std::memory_order_acquire); why != Stale::No) {
      if (reason.empty()) reason = stale_reason(why);
      it = families.erase(it);
      return false;
    }
    std::string failed = guard_failure(*f.proto);
    if (failed.empty()) failed = alias_failure(*f.proto, args);
    if (!failed.empty()) {
      if (reason.empty()) reason = std::move(failed);
      ++it;
      return false;
    }
    return true;
  };
  // A size that a family serving this call planned before: replayed, with no planning and no
  // allocation.
  for (FamilyIt it = families.begin(); it != families.end();) {
    if (!serves(it)) continue;
    Family& f = **it;
    const auto s = std::find_if(f.sizes.begin(), f.sizes.end(), [&](const auto& e) {
      return matches(e->sig, args, key, grad, mode);
    });
    if (s == f.sizes.end()) {
      ++it;
      continue;
    }
    families.splice(families.begin(), families, it);
    f.sizes.splice(f.sizes.begin(), f.sizes, s);
    std::shared_ptr<Entry> hit = f.sizes.front();
    ++hit->hits;
    hits = ++f.hits;  // verify mode's cadence: the family's replays, whatever their sizes
    ++stats.hits;
    note_call(false);
    lock.unlock();
    return hit;
  }
  // Else the size is planned now, outside the lock, from the first family serving the call
  // (most recently used first) whose guards allow it; after one that cannot, the next is tried
  // from the front again, since the list may change while the lock is released. The call counts
  // as a hit meanwhile, so that stats() read then adds up (calls = traces + hits + eager calls).
  std::vector<int64_t> tried;  // the families that could not plan it
  for (FamilyIt it = families.begin(); it != families.end();) {
    if (std::find(tried.begin(), tried.end(), (*it)->id) != tried.end()) {
      ++it;
      continue;
    }
    if (!serves(it)) continue;
    const std::shared_ptr<Family> f = *it;
    const std::vector<int64_t> at = sizes;
    ++stats.hits;
    lock.unlock();
    std::string why;
    std::shared_ptr<Entry> e = plan_size(*f, args, key, mode, at, !ranges_apply(config), why);
    lock.lock();
    if (!e) {
      --stats.hits;  // it traces instead, unless another family plans it
      if (tried.empty()) reason = cat(why, " (planned from dynamic family ", f->id, ")");
      tried.push_back(f->id);
      it = families.begin();
      continue;
    }
    if (const auto at_now = std::find(families.begin(), families.end(), f);
        at_now != families.end())
      families.splice(families.begin(), families, at_now);
    // Another call may have planned this size meanwhile: one entry per size.
    auto same = std::find_if(f->sizes.begin(), f->sizes.end(),
                             [&](const auto& s) { return matches(s->sig, args, key, grad, mode); });
    if (same != f->sizes.end()) {
      e = *same;
    } else {
      f->sizes.push_front(e);
      ++f->planned;
      ++stats.sizes_planned;
      const int keep = std::max(1, config.size_limit);
      while (static_cast<int>(f->sizes.size()) > keep) {
        f->sizes.pop_back();
        // Once as many sizes went as the family keeps, it may be planning the same ones again
        // and again (planning a size costs about what tracing it does).
        if (++f->evictions == keep)
          warn(cat(config.name, ": dynamic family ", f->id, " has evicted ", keep,
                   keep == 1 ? " planned size" : " planned sizes", " (size_limit ",
                   config.size_limit,
                   "); a size that recurs after it went is planned again, at about the cost of a "
                   "trace: raise size_limit if the sizes that recur are few enough to keep"));
      }
    }
    ++e->hits;
    hits = ++f->hits;
    note_call(false);
    unlock_and_log(lock);
    return e;
  }
  return nullptr;
}

std::vector<Change> StaticGraph::Impl::family_changes(const Signature& sig) const {
  std::vector<Change> best;
  for (const auto& f : families) {
    const ShapeFamily& fs = *f->shapes;
    std::vector<Change> left;
    for (Change& c : diff(fs.sig, sig, config)) {
      const auto it = std::find(fs.dims.begin(), fs.dims.end(), DynDim{c.arg, c.dim});
      if (c.dim < 0 || it == fs.dims.end()) {
        left.push_back(std::move(c));
        continue;
      }
      const int symbol = fs.symbol_of[static_cast<size_t>(it - fs.dims.begin())];
      if (c.value == 1 && !fs.serves_one[static_cast<size_t>(symbol)]) {
        c.text = cat(c.subject, " is 1, which dynamic family ", f->id,
                     " serves only where a trace had it at 1");
        left.push_back(std::move(c));
      }
    }
    if (!left.empty() && (best.empty() || left.size() < best.size())) best = std::move(left);
  }
  return best;
}

}  // namespace encore::schedule
