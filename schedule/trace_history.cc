// A trace's account: its line in the history and the log, the changes it adds to those the
// storm warning tracks, and that warning, when half of the recent calls traced; and the warning
// for a recorded first backward that failed.
#include <algorithm>
#include <cstdio>

#include "schedule/static_graph_impl.h"

namespace encore::schedule {
using namespace detail;

void StaticGraph::Impl::after_trace(const Entry& e, const std::string& reason,
                                    const std::vector<Change>& ch, double ms, bool threw_now) {
  RetraceEvent ev;
  ev.trace = e.id;
  ev.call = e.traced_call;
  ev.cost_ms = ms;
  ev.reason = reason;
  ev.entries = static_cast<int>(entries.size());
  char cost[32];
  std::snprintf(cost, sizeof cost, ms < 10 ? "%.2f" : "%.1f", ms);
  ev.message =
      ev.trace == 1
          ? cat(config.name, ": trace (cost ", cost, " ms): ", reason, "; cache now ", ev.entries,
                ev.entries == 1 ? " entry" : " entries")
          : cat(config.name, ": retrace #", ev.trace - 1, " (cost ", cost, " ms): ", reason,
                "; cache now ", ev.entries, ev.entries == 1 ? " entry" : " entries");
  log_retrace(ev.message);
  // The history keeps the first trace and the latest ones, so a storm cannot grow it forever.
  keep_bounded(stats.traces_history, std::move(ev), kHistory);
  for (const Change& c : ch) {
    auto it = changes.find(c.subject);
    if (it == changes.end()) {
      if (changes.size() >= kSubjects) continue;
      it = changes.emplace(c.subject, std::vector<Seen>()).first;
    }
    std::vector<Seen>& seen = it->second;
    if (seen.size() >= 16) seen.erase(seen.begin());
    seen.push_back({e.traced_call, c.value, c.text, c.arg, c.dim});
  }

  // A storm: half of the recent calls traced. It names the subject that changed most often
  // within those calls (one that changed before may have become dynamic since), else the
  // latest reason.
  const int window = static_cast<int>(recent.size());
  int traced = 0;
  for (char r : recent) traced += r;
  if (stats.calls >= window && traced * 2 >= window && stats.calls - last_storm_warning >= window) {
    last_storm_warning = stats.calls;
    std::string what = threw_now ? cat("its traces keep throwing (latest: ", reason, ")")
                                 : cat("it keeps tracing (latest: ", reason, ")");
    size_t best = 0;
    bool best_sized = false;  // the subject is a size (a value), not a mode or a key
    detail::DynDim best_dim{-1, -1};
    for (const auto& [subject, seen] : changes) {
      const auto first = std::find_if(seen.begin(), seen.end(),
                                      [&](const Seen& s) { return s.call > stats.calls - window; });
      const size_t n = static_cast<size_t>(seen.end() - first);
      if (n <= best) continue;
      best = n;
      std::string values;
      for (auto at = n > 8 ? seen.end() - 8 : first; at != seen.end(); ++at)
        values += cat(values.empty() ? "" : ", ", at->value);
      what = seen.back().value >= 0
                 ? cat(subject, " keeps changing (recent values ", values, ")")
                 : cat(subject, " keeps changing (latest: ", seen.back().text, ")");
      best_dim = {seen.back().arg, seen.back().dim};
      best_sized = seen.back().value >= 0;
    }
    // Traces dropped because no backward reached their outputs (a function evaluated in grad
    // mode): the cause when they are most of the window's, whatever changed beside them.
    int unreached = 0;
    for (const RetraceEvent& ev : stats.traces_history)
      unreached += ev.call > stats.calls - window && ev.reason.starts_with(kNoBackward);
    const bool evaluating = unreached * 2 > traced;
    if (!threw_now && evaluating)
      what = cat(unreached,
                 " of these traces followed one whose outputs no backward reached "
                 "(latest: ",
                 reason, ")");
    // A dimension a family serves traced at sizes the family could not plan (a size of 1, a
    // guard the traced sizes could not settle): its traces say why, bucketing is beside the point.
    int64_t family = -1;
    for (const auto& f : families)
      if (std::find(f->shapes->dims.begin(), f->shapes->dims.end(), best_dim) !=
          f->shapes->dims.end()) {
        family = f->id;
        break;
      }
    // A family that plans only between its traced sizes traces each size beyond (a length
    // growing by one): naming its dimensions plans any size.
    std::string ranged;
    for (const auto& f : families)
      if (ranges_apply(config) && !f->shapes->ranges.empty()) {
        ranged = cat("; dynamic family ", f->id, " plans only sizes between its traced ones (",
                     f->shapes->ranges[0].what,
                     " may be computed from the size): DynamicShapes::Explicit naming its "
                     "dimensions plans any size");
        break;
      }
    const std::string advice =
        threw_now ? std::string(
                        "Its latest trace threw: a trace that throws caches nothing, so "
                        "each call traces again until one succeeds")
        : evaluating
            ? std::string(
                  "A trace in grad mode keeps its schedule only once a backward reaches its "
                  "outputs; called without one (evaluating), the next call traces again: call "
                  "it under NoGradGuard where no backward follows")
        : best == 0 ? std::string(
                          "No argument, key or mode changed in these calls: each traces again "
                          "for the reason given")
        : family >= 0 ? cat("It is dynamic (family ", family,
                            "), but the family could not plan these sizes (latest: ", reason,
                            "); each such size traces once, and extends the family or keeps a "
                            "schedule of its own")
                      : cat("Every new value traces and plans again; ",
                            best_sized ? "pad or bucket it to a few fixed sizes, " : "",
                            "raise cache_limit (now ", config.cache_limit,
                            ") if only a few values occur, or run this function eagerly "
                            "(ENCORE_STATIC=0)");
    warn(cat(config.name, ": ", traced, " of the last ", window, " calls retraced; ", what, ". ",
             advice, ranged));
  }
}

void StaticGraph::Impl::backward_failed(const Entry& e) {
  std::unique_lock<std::mutex> lock(mu);
  ++stats.failed_backwards;
  warn(e.backward_failures < kMaxBackwardFailures
           ? cat(config.name, ": the first backward through the outputs of trace ", e.id,
                 " failed (", e.failure, "); the next call with its signature traces again")
           : cat(config.name, ": the first backward through the outputs of trace ", e.id,
                 " failed (", e.failure, "), ", e.backward_failures,
                 " times in a row for its signature; that signature runs eagerly from now on "
                 "(clear() traces it again)"));
  unlock_and_log(lock);
}

}  // namespace encore::schedule
