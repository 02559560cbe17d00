// Dynamic shapes once a call traces: the evidence a trace that differs from a family or an
// entry in sizes only carries (prepare_dynamic), and the family its planned recording makes
// with it, or the dimension it blames (make_dynamic).
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
    if (a.defined != b.defined || a.dtype != b.dtype || a.device != b.device ||
        a.requires_grad != b.requires_grad || a.same_as != b.same_as ||
        a.shares_with != b.shares_with || a.shared_offset != b.shared_offset ||
        a.shape.rank() != b.shape.rank())
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
        !guard_failure(*f->proto).empty() || f->proto->stale->load() != Stale::No ||
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
          b->stale->load() != Stale::No ||
          std::any_of(odd_traces.begin(), odd_traces.end(),
                      [&](const OddTrace& o) { return o.id == b->id; }) ||
          std::find(skip.begin(), skip.end(), b->id) != skip.end() ||
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
  // The oldest go, but not one that alone holds a dimension's smallest or largest size: a
  // family's ranges keep sizes between those (ShapeFamily::ranges).
  auto size_at = [&](size_t k, const DynDim& d) {
    return (k < evidence.size() ? evidence[k].sig : e.sig).args[d.arg].shape[d.dim];
  };
  auto sole_extreme = [&](size_t k) {
    return std::any_of(dims.begin(), dims.end(), [&](const DynDim& d) {
      bool below = true, above = true;
      for (size_t j = 0; j <= evidence.size(); ++j)
        if (j != k) {
          below = below && size_at(k, d) < size_at(j, d);
          above = above && size_at(k, d) > size_at(j, d);
        }
      return below || above;
    });
  };
  while (evidence.size() >= kMaxFamilyPoints) {
    size_t drop = 0;
    while (drop < evidence.size() && sole_extreme(drop)) ++drop;
    if (drop == evidence.size()) drop = 0;
    evidence.erase(evidence.begin() + static_cast<std::ptrdiff_t>(drop));
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(drop));
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
  const std::vector<DynDim> asked = e->dynamic_dims;  // (the alternate path below may swap them)
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
  // Traces set aside as the odd one of their dimensions' first two, of dimensions the family
  // covers (or, without one, of the dimensions asked): the family must not serve their sizes,
  // which ran other ops (it refuses them where a size of 1 explains those ops).
  std::vector<OddTrace> odd;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const OddTrace& o : odd_traces)
      if (b.family ? std::includes(b.family->dims.begin(), b.family->dims.end(), o.dims.begin(),
                                   o.dims.end())
                   : o.dims == asked)
        odd.push_back(o);
  }
  std::vector<int64_t> named = ids;  // the traces a message names
  for (const OddTrace& o : odd) {
    if (!b.family) break;
    const ShapeFamily& f = *b.family;
    std::vector<int64_t> at(static_cast<size_t>(f.symbols));
    for (size_t k = 0; k < f.dims.size(); ++k)
      at[static_cast<size_t>(f.symbol_of[k])] = o.sig.args[f.dims[k].arg].shape[f.dims[k].dim];
    std::string refused;
    if (instantiate(f, at, refused, !ranges_apply(config))) {
      b.family.reset();
      b.why = cat(o.why, ", and a family of traces ", ids_text(ids), " would plan trace ", o.id,
                  "'s sizes with the ops of the others");
      named.insert(named.begin(), o.id);
    }
  }
  std::unique_lock<std::mutex> lock(mu);
  e->evidence.clear();  // the earlier recordings now live in the family, if any
  const std::string what = dims_text(config, e->dynamic_dims);
  // The odd traces looked at have had their check.
  std::erase_if(odd_traces, [&](const OddTrace& o) {
    return std::any_of(odd.begin(), odd.end(), [&](const OddTrace& x) { return x.id == o.id; });
  });
  if (b.family) {
    auto f = std::make_shared<Family>();
    f->id = e->id;
    f->proto = e;
    f->traces = ids;
    f->shapes = std::move(b.family);
    f->arenas =
        std::make_shared<ArenaPool>(e->sig.args.empty() ? Device::cpu() : e->sig.args[0].device);
    // The family this trace extends in its own dimensions (to sizes beyond its traced ones, or
    // to one it could not plan), or none.
    const bool extends = beside < 0 && std::any_of(families.begin(), families.end(), [&](auto& o) {
                           return o->id == e->evidence_family && o->shapes->dims == f->shapes->dims;
                         });
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
    std::string line =
        cat(config.name, ": ",
            extends ? cat("trace ", e->id, " extends dynamic family ", e->evidence_family)
                    : cat(what, " became dynamic"),
            " (traces ", ids_text(ids), " agree in everything but sizes): one schedule serves ",
            describe(f->shapes->sig, config, symbol_names(*f->shapes)));
    for (size_t k = 0; k < f->shapes->ranges.size() && ranges_apply(config); ++k)
      line += cat(k == 0 ? "; within traced sizes: " : "; ",
                  range_text(*f->shapes, f->shapes->ranges[k]));
    for (const auto& t : entries)
      if (std::find(ids.begin(), ids.end(), t->id) != ids.end()) t->in_family = true;
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
  } else if (b.structure_differs && points.size() == 2 && one_group(points, e->dynamic_dims) &&
             odd_traces.size() < kSubjects && retried_dim_sets.insert(e->dynamic_dims).second) {
    // Two traces that ran other ops may differ only because a size made from the dimensions was
    // 1 at one of them (a pooled map of 1x1: a reduction over one element, a broadcast from 1,
    // need no op of their own), and that is the smaller one: the larger is the next trace's
    // evidence, and a third failure blames the dimensions.
    const DynDim& d = e->dynamic_dims[0];
    const size_t larger =
        points[0].sig.args[d.arg].shape[d.dim] > points[1].sig.args[d.arg].shape[d.dim] ? 0 : 1;
    odd_traces.push_back({e->dynamic_dims, points[1 - larger].sig, ids[1 - larger], b.why});
    log_retrace(cat(config.name, ": ", what, " not made dynamic yet (", b.why, "; traces ",
                    ids_text(ids), "): the next size is checked against trace ", ids[larger],
                    ", the larger"));
  } else if (one_group(points, e->dynamic_dims) || failed_dim_sets.size() >= kSubjects) {
    const std::string line = cat(what, e->dynamic_dims.size() == 1 ? " stays" : " stay",
                                 " static: ", b.why, " (traces ", ids_text(named), ")");
    for (const DynDim& d : e->dynamic_dims)
      if (static_dims.size() < kSubjects) static_dims.try_emplace(d, line);
    warn(cat(config.name, ": ", line));
  } else if (failed_dim_sets.insert(e->dynamic_dims).second) {
    // Which of them the failure is due to, traces that differ in fewer of them tell: until
    // then each may still become dynamic.
    warn(cat(config.name, ": ", what, " cannot all be dynamic: ", b.why, " (traces ",
             ids_text(named), "); each may still become dynamic where two traces differ in fewer"));
  }
  unlock_and_log(lock);
}

}  // namespace encore::schedule
