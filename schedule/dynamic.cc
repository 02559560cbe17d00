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

// Why such a family does not plan `sizes`, or empty: they lie between no two traced points that
// differ from them in one symbol alone (for one symbol: beyond the traced sizes, named by the
// first dimension it stands for).
std::string beyond_traced(const Config& c, const StaticGraph::Impl::Family& f,
                          std::span<const int64_t> sizes) {
  const ShapeFamily& s = *f.shapes;
  if (!interpolates(c, s)) return {};
  for (size_t i = 0; i < sizes.size(); ++i) {
    bool below = false, above = false;
    for (const std::vector<int64_t>& t : s.traced) {
      bool line = true;  // t is `sizes` but in symbol i
      for (size_t j = 0; j < sizes.size() && line; ++j) line = j == i || t[j] == sizes[j];
      below = below || (line && t[i] <= sizes[i]);
      above = above || (line && t[i] >= sizes[i]);
    }
    if (below && above) return {};
  }
  if (s.lo.size() == 1)
    return cat(arg_label(c, static_cast<size_t>(s.dims[0].arg)), " dim ", s.dims[0].dim, " is ",
               sizes[0], ", beyond the sizes dynamic family ", f.id, " was traced at (", s.lo[0],
               " to ", s.hi[0], "), where ", s.bound_asked_alike,
               " may not hold; traced to extend the family");
  std::string at;
  for (size_t p = 0; p < s.traced.size(); ++p)
    at += cat(p == 0 ? "" : p + 1 == s.traced.size() ? " and " : "; ", sizes_text(s.traced[p]));
  return cat(sizes_text(sizes), " lies between no two sizes dynamic family ", f.id,
             " was traced at that differ from it in one symbol alone (", at, "), where ",
             s.bound_asked_alike, " may not hold; traced to extend the family");
}

// An entry for the family's recording at `sizes`, planned; null (and why) when it has none.
std::shared_ptr<Entry> plan_size(const StaticGraph::Impl::Family& f, std::span<const Tensor> args,
                                 const std::string* key, int64_t mode,
                                 std::span<const int64_t> sizes, std::string& why) {
  std::shared_ptr<Recording> rec = instantiate(*f.shapes, sizes, why);
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
  e->grad_in = p.grad_in;
  e->grad_given = p.grad_given;
  e->stale = p.stale;
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

bool interpolates(const Config& c, const ShapeFamily& f) {
  return c.dynamic == DynamicShapes::Automatic && !f.bound_asked_alike.empty();
}

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
    if (f.proto->stale->load(std::memory_order_acquire)) {
      if (reason.empty()) reason = kStaleReason;
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
    if (std::string far = beyond_traced(config, *f, sizes); !far.empty()) {
      if (tried.empty()) reason = std::move(far);
      tried.push_back(f->id);
      ++it;
      continue;
    }
    const std::vector<int64_t> at = sizes;
    ++stats.hits;
    lock.unlock();
    std::string why;
    std::shared_ptr<Entry> e = plan_size(*f, args, key, mode, at, why);
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
      while (static_cast<int>(f->sizes.size()) > std::max(1, config.size_limit)) {
        f->sizes.pop_back();
        ++f->evictions;
      }
    }
    ++e->hits;
    hits = ++f->hits;
    note_call(false);
    lock.unlock();
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
