// StaticGraph::Impl: a static function's cache of entries, its lock and statistics, and the
// parts of a call (trace, replay, verify, dynamic shapes) that static_graph.cc, trace.cc,
// replay.cc, verify.cc, dynamic.cc, dynamic_trace.cc and reports.cc define. Internal to schedule/.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "schedule/cache_entry.h"
#include "schedule/recording.h"
#include "schedule/signature.h"
#include "schedule/static_graph.h"

namespace encore::schedule {
namespace detail {
struct VerifyState;
}  // namespace detail

// A function's cache and statistics, shared by the threads that call it: `mu` guards the entry
// list, the statistics and every entry's hit count; an entry's other fields are published by its
// state (Entry::publish). A call holds the lock to find its entry, never while it traces or
// replays. Held by shared_ptr, so an entry whose first backward outlives the function can still
// tell it (weak_ptr).
struct StaticGraph::Impl : std::enable_shared_from_this<StaticGraph::Impl> {
  using Entry = detail::Entry;

  static constexpr size_t kHistory = 64;   // traces kept in stats().traces_history
  static constexpr size_t kWarnings = 64;  // warnings kept in stats().warnings
  static constexpr size_t kSubjects = 64;  // changing signature parts the storm warning tracks
  // First backwards of one signature that may fail in a row before it runs eagerly for good.
  static constexpr int kMaxBackwardFailures = 3;
  // How a retrace after a trace whose outputs got no backward begins (the storm warning counts
  // them).
  static constexpr std::string_view kNoBackward =
      "no backward reached the outputs of the previous trace";

  const Body body;
  const Config config;
  const int verify_every;
  const std::string_view label;  // the name, interned: nodes may outlive the function

  std::mutex mu;
  std::list<std::shared_ptr<Entry>> entries;  // most recently used first
  StaticStats stats;
  std::vector<char> recent;  // whether each of the last calls traced (ring of 10)
  size_t recent_pos = 0;
  int64_t last_storm_warning = -100;
  bool warned_unwatched_mode = false;  // once per function
  struct Seen {
    int64_t call;
    int64_t value;     // the new size of a dimension, else -1
    std::string text;  // "argument 0 'x' dtype changed float32 -> float64"
    int arg = -1, dim = -1;  // the dimension, when a dimension changed
  };
  std::map<std::string, std::vector<Seen>> changes;  // subject -> its latest changes, in order

  // Dynamic shapes (dynamic.cc): families, most recently used first, each with its planned
  // sizes (entries, most recently used first); the dimensions that stay static, and why.
  struct Family {
    int64_t id = 0;
    std::unique_ptr<detail::ShapeFamily> shapes;
    std::shared_ptr<Entry> proto;  // the latest trace's entry: guards, slots, options
    std::list<std::shared_ptr<Entry>> sizes;
    std::shared_ptr<ArenaPool> arenas;  // the cpu arenas its planned sizes share
    std::vector<int64_t> traces;
    int64_t hits = 0, planned = 0, evictions = 0;
  };
  std::list<std::shared_ptr<Family>> families;
  std::map<detail::DynDim, std::string> static_dims;
  // Sets of dimensions whose family failed together (each warned about once).
  std::set<std::vector<detail::DynDim>> failed_dim_sets;
  // Sets of dimensions whose first two traces ran other ops, given a third trace to tell which
  // of the two was the odd one (dynamic_trace.cc): the smaller is set aside (a size of 1 made
  // from the dimensions may explain it, and no later trace is checked against it), and a family
  // of the larger and a later trace must refuse its sizes (a branch on the size would not).
  struct OddTrace {
    std::vector<detail::DynDim> dims;
    detail::Signature sig;
    int64_t id = 0;
    std::string why;  // how it differs from the larger
  };
  std::set<std::vector<detail::DynDim>> retried_dim_sets;
  std::vector<OddTrace> odd_traces;
  // The signature of the latest trace if it threw, until a trace succeeds: what the next trace's
  // reason compares with where the cache is empty.
  std::optional<detail::Signature> threw;
  std::vector<int64_t> family_sizes_scratch;  // a call's symbol values (dynamic_entry)
  std::vector<std::string> unlogged;  // warnings and trace lines, printed once `mu` is released
  uint64_t structure_seen = 0;         // config.structure() when the slots were last compared

  Impl(Body b, Config c);

  int64_t mode() const { return config.mode ? config.mode() : -1; }
  // With `mu` held: where the modules' structure changed since the last call, marks the entries
  // whose watched slots are no longer the modules' stale (their signatures trace again).
  void check_structure();
  // With `mu` held.
  void note_call(bool traced) { recent[recent_pos++ % recent.size()] = traced; }
  void warn(std::string w);
  // With `mu` held: a line printed once `mu` is released when ENCORE_LOG=retrace is on.
  void log_retrace(std::string line);
  // Releases `lock`, then prints what was noted under it.
  void unlock_and_log(std::unique_lock<std::mutex>& lock);
  // Appends `item`, keeping the first and the latest `cap` items; whether one was dropped.
  template <typename T>
  static bool keep_bounded(std::vector<T>& list, T item, size_t cap) {
    const bool drop = list.size() >= cap;
    if (drop) list.erase(list.begin() + 1);
    list.push_back(std::move(item));
    return drop;
  }

  void call(std::span<const Tensor> args, const std::string* key, std::vector<Tensor>& results);
  // Traces `e` (a placeholder in the cache): runs the function under a recorder, fills the
  // entry's fields and plans it when its schedules are complete. Returns why the trace is
  // unsafe ("" when it is not).
  std::string trace(const std::shared_ptr<Entry>& e, std::span<const Tensor> args,
                    std::vector<Tensor>& results);
  void replay(const std::shared_ptr<Entry>& e, std::span<const Tensor> args,
              std::vector<Tensor>& results, bool verify);
  std::unique_ptr<detail::VerifyState> run_for_verify(const Entry& e, std::span<const Tensor> args);
  // With `lock` held, after the entry list missed: the entry of a dynamic family for this call
  // (a size planned before, or planned now from the family, with `lock` released meanwhile).
  // Returns null with `lock` held when no family fits (`reason` says why one could not serve);
  // else the entry, its hit count in `hits`.
  std::shared_ptr<Entry> dynamic_entry(std::span<const Tensor> args, const std::string* key,
                                       bool grad, int64_t mode, std::unique_lock<std::mutex>& lock,
                                       std::string& reason, int64_t& hits);
  // With `mu` held, for a call that traces though dynamic families exist: what the family
  // nearest its signature does not serve (a dimension it keeps static, a dynamic one at 1 that
  // no trace had at 1), fewest changes first; empty where no family differs only that way.
  std::vector<detail::Change> family_changes(const detail::Signature& sig) const;
  // With `mu` held, for a new trace `e`: the dimensions it may make dynamic and the traces to
  // check it against (none: `e` stays a signature of its own).
  void prepare_dynamic(Entry& e);
  // Without `mu` held, once `e` is planned: checks it against its evidence and makes its
  // dimensions dynamic, or records why they stay static.
  void make_dynamic(const std::shared_ptr<Entry>& e);
  // `threw_now`: the trace threw.
  void after_trace(const Entry& e, const std::string& reason,
                   const std::vector<detail::Change>& changes, double ms, bool threw_now = false);
  // The first backward through the outputs of a trace of `e` failed (e is Failed).
  void backward_failed(const Entry& e);

  // Runs the function eagerly under `recorder` on leaves standing for its arguments (so the
  // backward of its graph stops at the subgraph's boundary), returned in `aliases`. An argument
  // passed twice has one alias, so the function's graph has one leaf for it, as eagerly.
  std::vector<Tensor> run_recorded(Recorder& recorder, std::span<const Tensor> args,
                                   const std::vector<ParamSlot>& slots,
                                   std::vector<Tensor>& aliases);
};

// Whether a family keeps the sizes its ranges name between their traced values
// (detail::ShapeFamily::ranges): automatic ones do; explicit ones, whose dimensions the user
// named, plan any size.
inline bool ranges_apply(const Config& c) {
  return c.dynamic == DynamicShapes::Automatic;
}

}  // namespace encore::schedule
