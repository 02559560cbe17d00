// StaticGraph: the call path that finds a call's cache entry and traces, replays or runs the
// function eagerly, with the reason of each trace; the process-wide switches, log and registry.
#include "schedule/static_graph.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <limits>
#include <mutex>

#include "runtime/autograd.h"
#include "runtime/env.h"
#include "runtime/profiler.h"
#include "schedule/static_graph_impl.h"

namespace encore::schedule {
using namespace detail;
namespace {

// ---- Process-wide switches, log and registry ---------------------------------------------

std::atomic<bool> g_enabled{env::flag("ENCORE_STATIC", true)};
std::atomic<bool> g_fusion{env::flag("ENCORE_STATIC_FUSE", true)};
std::atomic<bool> g_early_updates{env::flag("ENCORE_STATIC_EARLY_UPDATES", true)};
std::atomic<bool> g_lanes{env::flag("ENCORE_STATIC_LANES", true)};
std::atomic<bool> g_padded_layouts{env::flag("ENCORE_STATIC_PADDED", true)};
std::atomic<bool> g_fold_activations{env::flag("ENCORE_STATIC_FOLD", true)};
std::atomic<bool> g_fold_constants{env::flag("ENCORE_STATIC_FOLD_CONSTANTS", true)};
std::atomic<bool> g_fold_layouts{env::flag("ENCORE_STATIC_FOLD_LAYOUTS", true)};
std::atomic<bool> g_fold_cpu_updates{env::flag("ENCORE_STATIC_FOLD_CPU_UPDATES", false)};
std::atomic<bool> g_dynamic{env::flag("ENCORE_STATIC_DYNAMIC", true)};
std::atomic<bool> g_redzones{env::flag("ENCORE_STATIC_REDZONE", false)};
std::atomic<bool> g_log_retraces{env::listed("ENCORE_LOG", "retrace", {"retrace"})};

// Read once, so that a value not understood is reported once.
int env_verify_every() {
  static const int every =
      static_cast<int>(env::integer("ENCORE_STATIC_VERIFY", 0, std::numeric_limits<int>::max(), 0));
  return every;
}

std::mutex g_mu;
LogSink g_sink;
std::vector<StaticGraph*> g_registry;

void log_line(const std::string& line) {
  LogSink sink;
  {
    std::lock_guard<std::mutex> l(g_mu);
    sink = g_sink;
  }
  if (!sink) {
    std::cerr << "encore: " << line << std::endl;
    return;
  }
  // A line is told after the call's work is done: a sink that throws must not fail the call.
  try {
    sink(line);
  } catch (const std::exception& e) {
    std::cerr << "encore: the log sink threw (" << e.what() << "); its line: " << line << std::endl;
  } catch (...) {
    std::cerr << "encore: the log sink threw; its line: " << line << std::endl;
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

bool set_enabled(bool on) {
  return g_enabled.exchange(on);
}
bool enabled() {
  return g_enabled.load();
}
bool set_fusion_enabled(bool on) {
  return g_fusion.exchange(on);
}
bool fusion_enabled() {
  return g_fusion.load();
}
bool set_early_updates_enabled(bool on) {
  return g_early_updates.exchange(on);
}
bool early_updates_enabled() {
  return g_early_updates.load();
}
bool set_lanes_enabled(bool on) {
  return g_lanes.exchange(on);
}
bool lanes_enabled() {
  return g_lanes.load();
}
bool set_padded_layouts_enabled(bool on) {
  return g_padded_layouts.exchange(on);
}
bool padded_layouts_enabled() {
  return g_padded_layouts.load();
}
bool set_fold_activations_enabled(bool on) {
  return g_fold_activations.exchange(on);
}
bool fold_activations_enabled() {
  return g_fold_activations.load();
}
bool set_fold_constants_enabled(bool on) {
  return g_fold_constants.exchange(on);
}
bool fold_constants_enabled() {
  return g_fold_constants.load();
}
bool set_fold_layouts_enabled(bool on) {
  return g_fold_layouts.exchange(on);
}
bool fold_layouts_enabled() {
  return g_fold_layouts.load();
}
bool set_fold_cpu_updates_enabled(bool on) {
  return g_fold_cpu_updates.exchange(on);
}
bool fold_cpu_updates_enabled() {
  return g_fold_cpu_updates.load();
}
bool set_dynamic_enabled(bool on) {
  return g_dynamic.exchange(on);
}
bool dynamic_enabled() {
  return g_dynamic.load();
}
LogSink set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> l(g_mu);
  std::swap(g_sink, sink);
  return sink;
}
bool set_log_retraces(bool on) {
  return g_log_retraces.exchange(on);
}
bool set_redzones_enabled(bool on) {
  return g_redzones.exchange(on);
}
bool redzones_enabled() {
  return g_redzones.load();
}

// ---- StaticGraph ----------------------------------------------------------------------------

StaticGraph::Impl::Impl(Body b, Config c)
    : body(std::move(b)),
      config(std::move(c)),
      verify_every(config.verify_every > 0 ? config.verify_every : env_verify_every()),
      label(intern(config.name)) {
  stats.name = config.name;
  recent.assign(10, 0);
}

void StaticGraph::Impl::warn(std::string w) {
  unlogged.push_back(w);
  if (keep_bounded(stats.warnings, std::move(w), kWarnings)) ++stats.warnings_dropped;
}

void StaticGraph::Impl::log_retrace(std::string line) {
  if (g_log_retraces.load()) unlogged.push_back(std::move(line));
}

void StaticGraph::Impl::unlock_and_log(std::unique_lock<std::mutex>& lock) {
  std::vector<std::string> lines = std::move(unlogged);
  unlogged.clear();
  lock.unlock();
  for (const std::string& l : lines) log_line(l);
}

void StaticGraph::Impl::check_structure() {
  if (!config.structure) return;
  const uint64_t now = config.structure();
  if (now == structure_seen) return;
  const std::vector<ParamSlot> slots = config.params();
  const std::vector<const void*> tree = config.tree();
  auto check = [&](Entry& e) {
    const bool same =
        e.tree == tree && std::equal(e.slots.begin(), e.slots.end(), slots.begin(), slots.end(),
                                     [](const ParamSlot& a, const ParamSlot& b) {
                                       return a.slot == b.slot && a.name == b.name;
                                     });
    if (!same) e.stale->store(Stale::ModulesChanged, std::memory_order_release);
  };
  // An entry still tracing took its slots before or after the change: the calls after its
  // trace compare again.
  bool tracing = false;
  for (const auto& e : entries) {
    if (e->load_state() == EntryState::Tracing)
      tracing = true;
    else
      check(*e);
  }
  for (const auto& f : families) check(*f->proto);
  if (!tracing) structure_seen = now;
}

void StaticGraph::Impl::call(std::span<const Tensor> args, const std::string* key,
                             std::vector<Tensor>& results) {
  // Off, or inside another static function's trace (which records these ops itself).
  if (!enabled() || current_tracer() != nullptr) {
    {
      std::lock_guard<std::mutex> l(mu);
      ++stats.calls;
      ++stats.eager_calls;
      note_call(false);
    }
    return body(args, results);
  }
  if (config.dynamic == DynamicShapes::Explicit)
    for (const DynamicDim& d : config.dynamic_dims)
      ENCORE_CHECK(d.arg >= 0 && static_cast<size_t>(d.arg) < args.size() && d.dim >= 0 &&
                       (!args[d.arg].defined() || d.dim < args[d.arg].rank()),
                   config.name, ": dynamic_dims names dim ", d.dim, " of argument ", d.arg,
                   ", which the call does not have (", args.size(),
                   args.size() == 1 ? " argument" : " arguments",
                   static_cast<size_t>(d.arg) < args.size() && d.arg >= 0
                       ? cat(", that one ", args[d.arg].defined() ? args[d.arg].shape().str()
                                                                  : std::string("undefined"))
                       : std::string(),
                   ")");
  const bool grad = GradMode::enabled();
  const int64_t m = mode();
  std::unique_lock<std::mutex> lock(mu);
  ++stats.calls;
  check_structure();
  std::string guard_reason;
  int failures = 0;  // failed first backwards of this signature, carried into its next trace
  for (auto next = entries.begin(); next != entries.end();) {
    const auto it = next++;
    Entry& e = **it;
    if (!matches(e.sig, args, key, grad, m)) continue;
    const EntryState state = e.load_state();
    if (const Stale why = e.stale->load(std::memory_order_acquire); why != Stale::No) {
      // Its families go too: they replay its backward.
      if (guard_reason.empty()) guard_reason = stale_reason(why);
      const int64_t id = e.id;
      families.remove_if([id](const std::shared_ptr<Family>& f) {
        return std::find(f->traces.begin(), f->traces.end(), id) != f->traces.end();
      });
      entries.erase(it);
      continue;
    }
    if (state == EntryState::Retrace) {
      // Never replayed; an older entry of the signature may serve this call.
      if (guard_reason.empty()) guard_reason = cat("the previous trace ", e.rec->retrace);
      entries.erase(it);
      continue;
    }
    if (state == EntryState::Abandoned ||
        (state == EntryState::Failed && e.backward_failures < kMaxBackwardFailures)) {
      guard_reason = state != EntryState::Abandoned
                         ? cat("the first backward of the previous trace failed (", e.failure, ")")
                     : e.sig.grad
                         ? cat(kNoBackward, " (evaluating in grad mode? wrap it in NoGradGuard)")
                         : cat(kNoBackward,
                               " (the function turns grad mode on inside: its results carry a "
                               "graph, which only a backward completes)");
      if (state == EntryState::Failed) failures = e.backward_failures;
      entries.erase(it);
      break;
    }
    if (state != EntryState::Tracing) {
      std::string why = guard_failure(e);
      // (Other states run eagerly, where sharing is harmless; a Waiting entry's recording may
      // still grow on the thread running its first backward.)
      if (why.empty() && state == EntryState::Ready) why = alias_failure(e, args);
      if (!why.empty()) {
        if (guard_reason.empty()) guard_reason = std::move(why);
        continue;
      }
    }
    std::shared_ptr<Entry> hit = *it;
    entries.splice(entries.begin(), entries, it);
    note_call(false);
    if (state != EntryState::Ready) {
      // Being traced by another call, waiting for its first backward, unsafe, or its first
      // backward failed too often: the function runs eagerly.
      ++stats.eager_calls;
      lock.unlock();
      return body(args, results);
    }
    const int64_t hits = ++hit->hits;
    ++stats.hits;
    const bool verify = verify_every > 0 && hits % verify_every == 0;
    lock.unlock();
    return replay(hit, args, results, verify);
  }

  // A size of a dynamic family (dynamic.cc).
  int64_t dynamic_hits = 0;
  if (std::shared_ptr<Entry> d =
          dynamic_entry(args, key, grad, m, lock, guard_reason, dynamic_hits))
    return replay(d, args, results, verify_every > 0 && dynamic_hits % verify_every == 0);

  // A new signature: a placeholder entry, so that concurrent calls with it run eagerly while
  // this one traces outside the lock.
  const auto t0 = std::chrono::steady_clock::now();
  Signature sig = signature_of(args, key, m);
  std::vector<Change> ch;
  std::string reason;
  if (!guard_reason.empty()) {
    reason = guard_reason;
    // What changed still feeds the storm warning (a size a family's guards or range refused).
    if (!entries.empty()) ch = diff(entries.front()->sig, sig, config);
  } else if (entries.empty() && threw) {
    // The cache is empty and the latest trace threw: what changed since that one.
    ch = diff(*threw, sig, config);
    reason = "the previous trace threw";
    for (size_t k = 0; k < ch.size(); ++k) reason += cat(k == 0 ? "; " : ", ", ch[k].text);
  } else if (entries.empty()) {
    reason = "first call";
  } else {
    ch = diff(entries.front()->sig, sig, config);
    // Against a dynamic family, only what it does not serve: where fewer, that is the reason.
    if (std::vector<Change> f = family_changes(sig); !f.empty() && f.size() < ch.size())
      ch = std::move(f);
    for (const Change& c : ch) reason += (reason.empty() ? "" : ", ") + c.text;
  }
  note_call(true);
  auto e = std::make_shared<Entry>();
  e->name = label;
  e->id = ++stats.traces;
  e->traced_call = stats.calls;
  e->plan_options = {fusion_enabled(),          redzones_enabled() || verify_every > 0,
                     early_updates_enabled(),   lanes_enabled(),
                     padded_layouts_enabled(),  fold_activations_enabled(),
                     fold_constants_enabled(),  fold_layouts_enabled(),
                     fold_cpu_updates_enabled()};
  e->sig = std::move(sig);
  e->owner = weak_from_this();
  e->backward_failures = failures;
  prepare_dynamic(*e);
  // In the cache while it traces (calls with its signature meanwhile run eagerly); the least
  // recently used entry goes once the trace succeeded (a trace that throws evicts nothing).
  entries.push_front(e);
  unlock_and_log(lock);

  std::string unsafe;
  try {
    profiler::ScopedSpan span({}, profiler::SpanKind::Trace);
    if (span.recording()) {
      span.set_name(span_name(*e, profiler::SpanKind::Trace));
      span.set_args(intern(cat("reason: ", reason, "; signature: ", describe(e->sig, config))));
    }
    unsafe = trace(e, args, results);
  } catch (...) {
    // The trace counts, and its history and log say how it ended.
    std::string what = "the function threw";
    try {
      throw;
    } catch (const std::exception& ex) {
      // (A reason that already quotes the Error: a hyper-parameter step() refuses.)
      what = reason.find(ex.what()) != std::string::npos ? "the function threw it"
                                                         : cat("the function threw: ", ex.what());
    } catch (...) {
    }
    lock.lock();
    entries.remove(e);
    threw = e->sig;
    after_trace(*e, cat(reason, "; ", what), ch, ms_since(t0), /*threw=*/true);
    unlock_and_log(lock);
    throw;
  }
  lock.lock();
  e->publish(e->eager_only              ? EntryState::Eager
             : e->node                  ? EntryState::Waiting
             : !e->rec->retrace.empty() ? EntryState::Retrace
                                        : EntryState::Ready);
  threw.reset();
  // (Traces under way on other threads, which may yet throw, do not count.)
  auto kept = [&] {
    return std::count_if(entries.begin(), entries.end(), [](const std::shared_ptr<Entry>& x) {
      return x->load_state() != EntryState::Tracing;
    });
  };
  for (auto it = entries.end();
       kept() > std::max(1, config.cache_limit) && it != entries.begin();) {
    if ((*--it)->load_state() == EntryState::Tracing) continue;
    ++stats.evictions;
    if (!(*it)->in_family)
      warn(cat(config.name, ": cache full (cache_limit ", config.cache_limit,
               "); evicted the least recently used signature (", describe((*it)->sig, config),
               ")"));
    it = entries.erase(it);
  }
  if (!unsafe.empty()) warn(cat(unsafe, " (running this signature eagerly)"));
  if (!e->rec->unwatched_mode.empty() && !warned_unwatched_mode) {
    warned_unwatched_mode = true;
    warn(cat(config.name, ": the trace read the train/eval mode of ", e->rec->unwatched_mode,
             ", which is not among the modules it watches: the replays keep the mode it had, and "
             "train()/eval() are not seen. Give its model in StaticOptions::modules (the "
             "ENCORE_STATIC_GRAPH form watches its module)"));
  }
  after_trace(*e, reason, ch, ms_since(t0));
  unlock_and_log(lock);
  if (!e->dynamic_dims.empty() && e->load_state() == EntryState::Ready) make_dynamic(e);
}

StaticGraph::StaticGraph(Body body, Config config)
    : impl_(std::make_shared<Impl>(std::move(body), std::move(config))) {
  std::lock_guard<std::mutex> l(g_mu);
  g_registry.push_back(this);
}

StaticGraph::~StaticGraph() {
  std::lock_guard<std::mutex> l(g_mu);
  std::erase(g_registry, this);
}

const Config& StaticGraph::config() const {
  return impl_->config;
}

void StaticGraph::call(std::span<const Tensor> args, const std::string* key,
                       std::vector<Tensor>& results) {
  impl_->call(args, key, results);
}

void StaticGraph::clear() {
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->entries.clear();
  impl_->families.clear();
  impl_->static_dims.clear();
  impl_->failed_dim_sets.clear();
  impl_->retried_dim_sets.clear();
  impl_->odd_traces.clear();
  impl_->threw.reset();
}

std::vector<StaticStats> report_all() {
  // Under the registry's lock, so no function is destroyed meanwhile (a function's own lock is
  // never held while the registry's is taken).
  std::lock_guard<std::mutex> l(g_mu);
  std::vector<StaticStats> out;
  for (StaticGraph* g : g_registry) out.push_back(g->stats());
  return out;
}

}  // namespace encore::schedule
