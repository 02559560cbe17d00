// Dynamic shapes in the call path: a call that a family serves (a size planned before, or one
// planned now from the family's recording without running the function), a new trace that may
// make dimensions dynamic, and the check that does so once that trace is planned.
#include <algorithm>

#include "schedule/static_graph_impl.h"

namespace encore::schedule {
using namespace detail;
namespace {

// "argument 0 'x' dim 0", "argument 0 'x' dims 2 and 3, argument 1 'y' dim 0".
std::string dims_text(const Config& c, std::span<const DynDim> dims) {
  std::string out;
  for (size_t k = 0; k < dims.size();) {
    size_t j = k;
    while (j < dims.size() && dims[j].arg == dims[k].arg) ++j;
    out += cat(out.empty() ? "" : ", ", arg_label(c, static_cast<size_t>(dims[k].arg)),
               j - k == 1 ? " dim " : " dims ");
    for (size_t i = k; i < j; ++i)
      out += cat(i == k ? "" : i + 1 == j ? " and " : ", ", dims[i].dim);
    k = j;
  }
  return out;
}

std::string ids_text(std::span<const int64_t> ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i)
    s += cat(i == 0 ? "" : i + 1 == ids.size() ? " and " : ", ", ids[i]);
  return s;
}

// Whether `now` differs from `was` in argument sizes only (same arguments, dtypes, devices,
// ranks, requires-grad, aliasing, grad mode, train/eval mode and key); the dimensions that
// differ in `changed`.
bool only_sizes_differ(const Signature& was, const Signature& now, std::vector<DynDim>& changed) {
  changed.clear();
  if (was.args.size() != now.args.size() || was.grad != now.grad || was.mode != now.mode ||
      was.key != now.key)
    return false;
  for (size_t i = 0; i < was.args.size(); ++i) {
    const ArgSig &a = was.args[i], &b = now.args[i];
    if (a.dtype != b.dtype || a.device != b.device || a.requires_grad != b.requires_grad ||
        a.same_as != b.same_as || a.shares_with != b.shares_with ||
        a.shared_offset != b.shared_offset || a.shape.rank() != b.shape.rank())
      return false;
    for (int d = 0; d < a.shape.rank(); ++d)
      if (a.shape[d] != b.shape[d]) changed.push_back({static_cast<int>(i), d});
  }
  return true;
}

// The points at which no dimension of `dims` is 1, by index.
std::vector<size_t> without_size_one(const std::vector<FamilyPoint>& points,
                                     const std::vector<DynDim>& dims) {
  std::vector<size_t> keep;
  for (size_t k = 0; k < points.size(); ++k)
    if (std::none_of(dims.begin(), dims.end(),
                     [&](const DynDim& d) { return points[k].sig.args[d.arg].shape[d.dim] == 1; }))
      keep.push_back(k);
  return keep;
}

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

// Whether the dimensions had equal sizes at every traced point (a sequence length in the inputs
// and in the targets): a failure is then theirs together; else traces that differ in fewer of
// them can tell which one it is.
bool one_group(const std::vector<FamilyPoint>& points, const std::vector<DynDim>& dims) {
  for (const FamilyPoint& p : points)
    for (const DynDim& d : dims)
      if (p.sig.args[d.arg].shape[d.dim] != p.sig.args[dims[0].arg].shape[dims[0].dim])
        return false;
  return true;
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

void StaticGraph::Impl::prepare_dynamic(Entry& e) {
  if (config.dynamic == DynamicShapes::Off || !dynamic_enabled()) return;
  e.keep_trace = true;
  auto eligible = [&](const DynDim& d) {
    if (static_dims.contains(d)) return false;
    if (config.dynamic == DynamicShapes::Automatic) return true;
    return std::any_of(config.dynamic_dims.begin(), config.dynamic_dims.end(),
                       [&](const DynamicDim& x) { return x.arg == d.arg && x.dim == d.dim; });
  };
  std::vector<DynDim> changed, dims;
  std::vector<FamilyPoint> evidence;
  std::vector<int64_t> ids;
  int64_t family = -1;
  // The dimensions a family with this evidence would make dynamic, into `into`; false for a set
  // that already failed together.
  auto with = [&](const std::vector<DynDim>& more, std::vector<DynDim>& into) {
    into = changed;
    into.insert(into.end(), more.begin(), more.end());
    std::sort(into.begin(), into.end());
    into.erase(std::unique(into.begin(), into.end()), into.end());
    return !failed_dim_sets.contains(into);
  };
  // The most recently used family, else entry, whose signature differs from this call's in
  // eligible sizes only.
  for (const auto& f : families) {
    if (!only_sizes_differ(f->shapes->sig, e.sig, changed) ||
        !std::all_of(changed.begin(), changed.end(), eligible) ||
        !guard_failure(*f->proto).empty() || f->proto->stale->load() ||
        !with(f->shapes->dims, dims))
      continue;
    evidence = f->shapes->points;
    ids = f->traces;
    family = f->id;
    break;
  }
  // The entry that differs in the fewest sizes (the most recently used of those), not one of
  // `skip`'s traces: a dimension that cannot be dynamic must not keep one that changed beside it
  // from being so. Its dimensions into `out_dims`, its evidence into `out` and `out_ids`.
  auto nearest_entry = [&](std::span<const int64_t> skip, std::vector<DynDim>& out_dims,
                           std::vector<FamilyPoint>& out, std::vector<int64_t>& out_ids) {
    const Entry* best = nullptr;
    std::vector<DynDim> best_dims, b_dims;
    for (const auto& b : entries) {
      if (b.get() == &e || b->load_state() != EntryState::Ready || !b->pristine ||
          b->stale->load() || std::find(skip.begin(), skip.end(), b->id) != skip.end() ||
          !only_sizes_differ(b->sig, e.sig, changed) || changed.empty() ||
          !std::all_of(changed.begin(), changed.end(), eligible) || !guard_failure(*b).empty() ||
          !with(b->pending_points.empty() ? std::vector<DynDim>() : b->dynamic_dims, b_dims))
        continue;
      if (best != nullptr && b_dims.size() >= best_dims.size()) continue;
      best = b.get();
      best_dims = b_dims;
    }
    if (best == nullptr) return;
    out_dims = std::move(best_dims);
    if (!best->pending_points.empty()) {
      out = best->pending_points;
      out_ids = best->pending_ids;
    } else {
      out = {FamilyPoint{best->pristine, best->sig}};
      out_ids = {best->id};
    }
  };
  if (evidence.empty()) {
    nearest_entry({}, dims, evidence, ids);
  } else {
    // Where the family cannot take this trace (a size its guards left out, clamped otherwise),
    // the nearest entry outside it may make a family of its own with it.
    nearest_entry(ids, e.alternate_dims, e.alternate, e.alternate_ids);
  }
  if (evidence.empty()) return;
  while (evidence.size() >= kMaxFamilyPoints) {  // the oldest go
    evidence.erase(evidence.begin());
    ids.erase(ids.begin());
  }
  e.dynamic_dims = std::move(dims);
  e.evidence = std::move(evidence);
  e.evidence_ids = std::move(ids);
  e.evidence_family = family;
}

void StaticGraph::Impl::make_dynamic(const std::shared_ptr<Entry>& e) {
  std::vector<FamilyPoint> points = e->evidence;
  points.push_back({e->pristine, e->sig});
  std::vector<int64_t> ids = e->evidence_ids;
  ids.push_back(e->id);
  // Traces whose first backwards got gradients for different results have other backwards,
  // whatever the sizes: no family, and no dimension is to blame.
  for (size_t k = 0; k + 1 < points.size(); ++k)
    if (points[k].rec->grad_given != e->pristine->grad_given) {
      std::unique_lock<std::mutex> lock(mu);
      e->evidence.clear();
      log_retrace(cat(config.name, ": ", dims_text(config, e->dynamic_dims),
                      " not made dynamic: the first backwards of traces ", ids[k], " and ", e->id,
                      " got gradients for different results"));
      unlock_and_log(lock);
      return;
    }
  auto build = [](std::vector<FamilyPoint> at, const std::vector<DynDim>& dims) {
    FamilyBuild out;
    try {
      out = build_family(std::move(at), dims);
    } catch (const std::exception& ex) {
      out.family.reset();
      out.why = ex.what();
    }
    return out;
  };
  FamilyBuild b = build(points, e->dynamic_dims);
  int64_t beside = -1;  // the family this trace could not join, where another family takes it
  if (!b.family && !e->alternate.empty() &&
      std::all_of(e->alternate.begin(), e->alternate.end(), [&](const FamilyPoint& p) {
        return p.rec->grad_given == e->pristine->grad_given;
      })) {
    // The family could not take this trace: the nearest entry outside it may.
    std::vector<FamilyPoint> near = e->alternate;
    near.push_back({e->pristine, e->sig});
    if (FamilyBuild other = build(std::move(near), e->alternate_dims); other.family) {
      b = std::move(other);
      beside = e->evidence_family;
      ids = e->alternate_ids;
      ids.push_back(e->id);
      e->dynamic_dims = e->alternate_dims;
    }
  }
  e->alternate.clear();
  std::unique_lock<std::mutex> lock(mu);
  e->evidence.clear();  // the earlier recordings now live in the family, if any
  const std::string what = dims_text(config, e->dynamic_dims);
  if (b.family) {
    auto f = std::make_shared<Family>();
    f->id = e->id;
    f->proto = e;
    f->traces = ids;
    f->shapes = std::move(b.family);
    f->arenas =
        std::make_shared<ArenaPool>(e->sig.args.empty() ? Device::cpu() : e->sig.args[0].device);
    // A family this one extends (its traces are this one's evidence), or one it covers (made
    // meanwhile by another thread from other traces of these sizes), goes; not the family this
    // trace could not join (`beside`), which still serves the sizes its guards allow.
    std::vector<DynDim> changed;
    families.remove_if([&](const std::shared_ptr<Family>& old) {
      if (old->id == beside) return false;
      if (std::find(ids.begin(), ids.end(), old->id) != ids.end()) return true;
      const std::vector<DynDim>& dims = f->shapes->dims;
      return only_sizes_differ(old->shapes->sig, f->shapes->sig, changed) &&
             std::includes(dims.begin(), dims.end(), old->shapes->dims.begin(),
                           old->shapes->dims.end()) &&
             std::includes(dims.begin(), dims.end(), changed.begin(), changed.end());
    });
    const std::string line = cat(config.name, ": ", what, " became dynamic (traces ", ids_text(ids),
                                 " agree in everything but sizes): one schedule serves ",
                                 describe(f->shapes->sig, config, symbol_names(*f->shapes)));
    families.push_front(std::move(f));
    while (static_cast<int>(families.size()) > std::max(1, config.cache_limit)) families.pop_back();
    ++stats.dynamic_events;
    keep_bounded(stats.dynamic_history, line, kHistory);
    log_retrace(line);
  } else if (std::any_of(families.begin(), families.end(), [&](const auto& f) {
               return f->id == e->evidence_family && f->shapes->dims == e->dynamic_dims;
             })) {
    // A size the family's guards left out, in none but its dynamic dimensions: the family still
    // serves the sizes they allow, so no dimension is to blame; this trace serves its own size.
    // (A dimension the family keeps static that changed too is blamed as without a family.)
    log_retrace(cat(config.name, ": trace ", e->id, " keeps a schedule of its own: ", what,
                    " cannot join dynamic family ", e->evidence_family, " (", b.why, "; traces ",
                    ids_text(ids), "); the family still serves the sizes its guards allow"));
  } else if (b.clamps_differ) {
    // Traces at sizes clamped alike may yet make a family: the next one is checked against
    // this one, the most recently used.
    log_retrace(cat(config.name, ": trace ", e->id, " keeps a schedule of its own: ", what,
                    " not made dynamic (", b.why, "; traces ", ids_text(ids),
                    "); a trace at another size is checked against this one"));
  } else if (std::vector<size_t> keep = without_size_one(points, e->dynamic_dims);
             !keep.empty() && keep.size() < points.size()) {
    // A trace where a dimension is 1 may have other ops (broadcasting needs none at size 1):
    // the others wait for a trace at another size.
    for (size_t k : keep) {
      e->pending_points.push_back(points[k]);
      e->pending_ids.push_back(ids[k]);
    }
    log_retrace(cat(config.name, ": ", what, " may be dynamic, but the traces at size 1 differ (",
                    b.why, "); the next size is checked against trace ", ids_text(e->pending_ids)));
  } else if (one_group(points, e->dynamic_dims) || failed_dim_sets.size() >= kSubjects) {
    const std::string line = cat(what, e->dynamic_dims.size() == 1 ? " stays" : " stay",
                                 " static: ", b.why, " (traces ", ids_text(ids), ")");
    for (const DynDim& d : e->dynamic_dims)
      if (static_dims.size() < kSubjects) static_dims.try_emplace(d, line);
    warn(cat(config.name, ": ", line));
  } else if (failed_dim_sets.insert(e->dynamic_dims).second) {
    // Which of them the failure is due to, traces that differ in fewer of them tell: until
    // then each may still become dynamic.
    warn(cat(config.name, ": ", what, " cannot all be dynamic: ", b.why, " (traces ", ids_text(ids),
             "); each may still become dynamic where two traces differ in fewer"));
  }
  unlock_and_log(lock);
}

}  // namespace encore::schedule
