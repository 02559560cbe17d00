// Reports: a function's statistics and cache entries, its schedules as text and as Graphviz,
// and the table of every live function.
#include <algorithm>
#include <cstdio>

#include "schedule/static_graph_impl.h"

namespace encore::schedule {
using namespace detail;

namespace {

EntryReport entry_report(const Entry& e, std::string signature) {
  const EntryState state = e.load_state();
  EntryReport r;
  r.id = e.id;
  r.signature = std::move(signature);
  r.complete = state == EntryState::Ready;
  r.eager_only = state == EntryState::Eager;
  r.hits = e.hits;
  if (state == EntryState::Ready) {
    const MemoryPlan& m = e.plan->memory();
    r.forward_steps = e.plan->forward_steps();
    r.backward_steps = e.plan->backward_steps();
    r.arena_bytes = m.arena_bytes;
    r.lower_bound_bytes = m.lower_bound_bytes;
    r.naive_bytes = m.naive_bytes;
    r.in_place_steps = m.in_place_steps;
    r.arenas = e.plan->arenas();
    const GraphStats gs = e.plan->graph_stats();
    r.graph_launches = gs.launches;
    r.graph_direct_launches = gs.direct_launches;
    r.lane_replays = e.plan->lane_replays();
    r.graph_captures = gs.captures;
    r.stream_replays = gs.stream_replays;
    r.graph_capture_failures = gs.capture_failures;
    r.graph_last_failure = gs.last_failure;
    r.graph_fallback = gs.fallback;
    r.graph_deferred_captures = gs.deferred_captures;
    r.graph_last_deferral = gs.last_deferral;
  }
  return r;
}

// The symbols' values of a planned size of family `f`: "s0=17, s1=40".
std::string size_label(const StaticGraph::Impl::Family& f, const Entry& e) {
  std::vector<int64_t> v(static_cast<size_t>(f.shapes->symbols), 0);
  for (size_t k = 0; k < f.shapes->dims.size(); ++k) {
    const DynDim& d = f.shapes->dims[k];
    v[static_cast<size_t>(f.shapes->symbol_of[k])] = e.sig.args[d.arg].shape[d.dim];
  }
  return sizes_text(v);
}

DynamicReport dynamic_report(const StaticGraph::Impl::Family& f, const Config& c) {
  DynamicReport r;
  r.id = f.id;
  r.signature = describe(f.shapes->sig, c, symbol_names(*f.shapes));
  for (size_t k = 0; k < f.shapes->dims.size(); ++k)
    r.dims.push_back(cat(arg_label(c, static_cast<size_t>(f.shapes->dims[k].arg)), " dim ",
                         f.shapes->dims[k].dim, " = s", f.shapes->symbol_of[k]));
  if (ranges_apply(c))
    for (const ShapeFamily::Range& g : f.shapes->ranges)
      r.ranges.push_back(range_text(*f.shapes, g));
  r.traces = f.traces;
  r.hits = f.hits;
  r.sizes_planned = f.planned;
  r.evictions = f.evictions;
  r.shared_arena_bytes = f.arenas ? f.arenas->bytes() : 0;
  for (const auto& e : f.sizes) r.sizes.push_back(entry_report(*e, size_label(f, *e)));
  return r;
}

}  // namespace

StaticStats StaticGraph::stats() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  StaticStats s = impl_->stats;
  s.entries = static_cast<int>(impl_->entries.size());
  for (const auto& e : impl_->entries)
    s.cache.push_back(entry_report(*e, describe(e->sig, impl_->config)));
  for (const auto& f : impl_->families) s.dynamic.push_back(dynamic_report(*f, impl_->config));
  for (const auto& [dim, why] : impl_->static_dims)
    if (std::find(s.static_dims.begin(), s.static_dims.end(), why) == s.static_dims.end())
      s.static_dims.push_back(why);
  return s;
}

namespace {

// A cache entry as the schedule dump shows it: the entry, its state and its hits when listed.
struct Listed {
  std::shared_ptr<const Entry> entry;
  EntryState state;
  int64_t hits;
};

// The cache's entries by id (the trace that made each).
std::vector<Listed> entries_by_id(StaticGraph::Impl& impl) {
  std::vector<Listed> out;
  {
    std::lock_guard<std::mutex> l(impl.mu);
    for (const auto& e : impl.entries) out.push_back({e, e->load_state(), e->hits});
  }
  std::sort(out.begin(), out.end(),
            [](const Listed& a, const Listed& b) { return a.entry->id < b.entry->id; });
  return out;
}

Plan::Names names_of(const Entry& e, const Config& c) {
  Plan::Names n;
  n.args = c.arg_names;
  for (const ParamSlot& s : e.slots) n.params.push_back(s.name);
  return n;
}

// Why an entry has no schedules to show (empty: it has).
std::string no_schedule(const Entry& e, EntryState state) {
  switch (state) {
    case EntryState::Ready:
      return {};
    case EntryState::Tracing:
      return "being traced";
    case EntryState::Eager:
      return "runs eagerly: its trace was unsafe";
    case EntryState::Waiting:
      return "not planned yet: waits for the first backward through its outputs";
    case EntryState::Failed:
      return cat("the first backward through its outputs failed (", e.failure, ")");
    case EntryState::Abandoned:
      return "no backward reached the outputs of its trace; the next call traces again";
    case EntryState::Retrace:
      return cat("its trace ", e.rec->retrace, "; the next call traces again");
  }
  return {};
}

std::string memory_text(const Plan& p) {
  const MemoryPlan& m = p.memory();
  return cat("arena ", m.arena_bytes, " bytes (lower bound ", m.lower_bound_bytes, ", naive sum ",
             m.naive_bytes, "); ", m.in_place_steps, " steps in place; ", p.arenas(),
             p.arenas() == 1 ? " arena" : " arenas", " allocated");
}

// "40 graph launches (38 reading the arguments where they are), 2 captures, 0 stream replays[; 1
// capture deferred (why), ...][; graphs off: why]".
std::string graph_counts(const GraphStats& s) {
  std::string deferred, failed;
  if (s.deferred_captures > 0)
    deferred = cat("; ", s.deferred_captures,
                   s.deferred_captures == 1 ? " capture deferred (" : " captures deferred (",
                   s.last_deferral, "), replayed on the stream and captured at the next call");
  if (!s.fallback.empty())
    failed = cat("; graphs off: ", s.fallback);
  else if (s.capture_failures > 0)
    failed = cat("; ", s.capture_failures,
                 s.capture_failures == 1 ? " failed capture (" : " failed captures (",
                 s.last_failure, "), retried on new addresses or arenas");
  const std::string direct =
      s.direct_launches > 0 ? cat(" (", s.direct_launches, " reading the arguments where they are)")
                            : std::string();
  return cat(s.launches, s.launches == 1 ? " graph launch" : " graph launches", direct, ", ",
             s.captures, s.captures == 1 ? " capture, " : " captures, ", s.stream_replays,
             s.stream_replays == 1 ? " stream replay" : " stream replays", deferred, failed);
}
}  // namespace

std::string EntryReport::graph_text() const {
  if (graph_launches == 0 && graph_captures == 0 && stream_replays == 0 &&
      graph_capture_failures == 0 && graph_deferred_captures == 0)
    return {};
  return graph_counts({.launches = graph_launches,
                       .direct_launches = graph_direct_launches,
                       .captures = graph_captures,
                       .stream_replays = stream_replays,
                       .capture_failures = graph_capture_failures,
                       .last_failure = graph_last_failure,
                       .deferred_captures = graph_deferred_captures,
                       .last_deferral = graph_last_deferral,
                       .fallback = graph_fallback});
}

std::string StaticGraph::schedule_text() const {
  const Config& config = impl_->config;
  const std::vector<Listed> es = entries_by_id(*impl_);
  std::string out = cat("static function '", config.name, "': ", es.size(),
                        es.size() == 1 ? " cache entry\n" : " cache entries\n");
  for (const auto& [e, state, hits] : es) {
    out += cat("\nentry ", e->id, " (traced at call ", e->traced_call, ", ", hits,
               hits == 1 ? " replay" : " replays", "): ", describe(e->sig, config), "\n");
    if (std::string why = no_schedule(*e, state); !why.empty()) {
      out += cat("  ", why, "\n");
      continue;
    }
    out += cat("  ", memory_text(*e->plan), "\n");
    if (e->plan->device().type == DeviceType::CUDA) {
      const GraphStats gs = e->plan->graph_stats();
      out += cat("  on ", e->plan->device(), ": ", graph_counts(gs), "\n");
    }
    out += e->plan->steps_text(names_of(*e, config), "  ");
  }
  std::vector<std::shared_ptr<StaticGraph::Impl::Family>> fams;
  std::vector<std::string> static_dims;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    fams.assign(impl_->families.begin(), impl_->families.end());
    for (const auto& [dim, why] : impl_->static_dims) static_dims.push_back(why);
  }
  for (const auto& f : fams) {
    const DynamicReport r = [&] {
      std::lock_guard<std::mutex> l(impl_->mu);
      return dynamic_report(*f, config);
    }();
    out += cat("\ndynamic family ", r.id, " (traces");
    for (int64_t t : r.traces) out += cat(" ", t);
    out += cat("): ", r.signature, "\n");
    for (const std::string& d : r.dims) out += cat("  ", d, "\n");
    for (const std::string& g : r.ranges) out += cat("  planned within traced sizes: ", g, "\n");
    out += cat("  ", r.sizes_planned, r.sizes_planned == 1 ? " size" : " sizes",
               " planned without tracing, ", r.hits, r.hits == 1 ? " replay" : " replays",
               " of planned sizes, ", r.evictions, r.evictions == 1 ? " eviction" : " evictions",
               "; shared arenas ", r.shared_arena_bytes, " bytes\n");
    std::vector<std::shared_ptr<Entry>> sizes;
    {
      std::lock_guard<std::mutex> l(impl_->mu);
      sizes.assign(f->sizes.begin(), f->sizes.end());
    }
    for (size_t k = 0; k < r.sizes.size() && k < sizes.size(); ++k) {
      const EntryReport& e = r.sizes[k];
      out +=
          cat("\n  size ", e.signature, " (", e.hits, e.hits == 1 ? " call" : " calls",
              "): ", describe(sizes[k]->sig, config), "\n    ", memory_text(*sizes[k]->plan), "\n");
      out += sizes[k]->plan->steps_text(names_of(*sizes[k], config), "    ");
    }
  }
  for (const std::string& why : static_dims) out += cat("\n", why, "\n");
  return out;
}

std::string StaticGraph::schedule_dot() const {
  const Config& config = impl_->config;
  std::string out = cat("digraph ", dot_quote(cat("static function '", config.name, "'")),
                        " {\n  graph [fontname=\"monospace\", fontsize=10];\n"
                        "  node [fontname=\"monospace\", fontsize=10];\n"
                        "  edge [fontname=\"monospace\", fontsize=9];\n");
  for (const auto& [e, state, hits] : entries_by_id(*impl_)) {
    const std::string prefix = cat("e", e->id, "_");
    std::string label = cat("entry ", e->id, ": ", describe(e->sig, config));
    const std::string why = no_schedule(*e, state);
    label += "\n" + (why.empty() ? memory_text(*e->plan) : why);
    out += cat("  subgraph cluster_e", e->id, " {\n    label=", dot_quote(label), ";\n");
    if (why.empty())
      out += e->plan->steps_dot(names_of(*e, config), prefix);
    else
      out += cat("    ", prefix, "none [shape=plaintext, label=", dot_quote(why), "];\n");
    out += "  }\n";
  }
  // Dynamic families: a cluster each, in it one per planned size.
  std::vector<
      std::pair<std::shared_ptr<StaticGraph::Impl::Family>, std::vector<std::shared_ptr<Entry>>>>
      fams;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    for (const auto& f : impl_->families)
      fams.emplace_back(f, std::vector<std::shared_ptr<Entry>>(f->sizes.begin(), f->sizes.end()));
  }
  for (const auto& [f, sizes] : fams) {
    const std::string label = cat("dynamic family ", f->id, ": ",
                                  describe(f->shapes->sig, config, symbol_names(*f->shapes)));
    out += cat("  subgraph cluster_d", f->id, " {\n    label=", dot_quote(label), ";\n");
    for (size_t k = 0; k < sizes.size(); ++k) {
      const Entry& e = *sizes[k];
      const std::string prefix = cat("d", f->id, "_", k, "_");
      out += cat("    subgraph cluster_d", f->id, "_", k, " {\n      label=",
                 dot_quote(cat("size ", size_label(*f, e), "\n", memory_text(*e.plan))), ";\n");
      out += e.plan->steps_dot(names_of(e, config), prefix);
      out += "    }\n";
    }
    out += "  }\n";
  }
  return out + "}\n";
}

std::string report_table() {
  const std::vector<StaticStats> all = report_all();
  std::string out = "static functions\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-20s %8s %7s %8s %7s %8s %9s %12s %12s\n", "name", "calls",
                "traces", "hits", "eager", "entries", "evictions", "arena bytes", "lower bound");
  out += line;
  for (const StaticStats& s : all) {
    int64_t arena = 0, lower = 0;
    for (const EntryReport& r : s.cache) {
      arena += r.arena_bytes;
      lower += r.lower_bound_bytes;
    }
    for (const DynamicReport& d : s.dynamic)
      for (const EntryReport& r : d.sizes) {
        arena += r.arena_bytes;
        lower += r.lower_bound_bytes;
      }
    std::snprintf(line, sizeof line, "%-20s %8lld %7lld %8lld %7lld %8d %9lld %12lld %12lld\n",
                  s.name.substr(0, 20).c_str(), static_cast<long long>(s.calls),
                  static_cast<long long>(s.traces), static_cast<long long>(s.hits),
                  static_cast<long long>(s.eager_calls), s.entries,
                  static_cast<long long>(s.evictions), static_cast<long long>(arena),
                  static_cast<long long>(lower));
    out += line;
    for (const RetraceEvent& ev : s.traces_history) out += "  " + ev.message + "\n";
    for (const std::string& d : s.dynamic_history) out += "  " + d + "\n";
    for (const DynamicReport& d : s.dynamic) {
      int64_t bytes = 0;
      for (const EntryReport& r : d.sizes) bytes += r.arena_bytes;
      out +=
          cat("  dynamic ", d.id, ": ", d.signature, "; ", d.sizes.size(), " sizes planned (",
              bytes, " arena bytes), ", d.sizes_planned, " planned in all, ", d.hits, " replays\n");
    }
    for (const std::string& w : s.static_dims) out += "  " + w + "\n";
    for (const std::string& w : s.warnings) out += "  warning: " + w + "\n";
  }
  return out;
}

}  // namespace encore::schedule
