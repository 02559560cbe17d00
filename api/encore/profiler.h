// profiler: per-op counts and times, eager and replayed, as a table and as a Chrome trace.
//
//   namespace prof = encore::profiler;
//   prof::start();
//   for (int i = 0; i < 10; ++i) step(x, t);      // eager ops, static replays, backward passes
//   prof::Profile p = prof::stop();
//   std::cout << p.table(20);                       // like Python's cProfile, largest total first
//   p.write_chrome_trace("step.json");              // open in ui.perfetto.dev or chrome://tracing
//
//   { prof::Scope s({}, "epoch.json"); train_epoch(); }  // RAII: writes the trace at scope end
//   { prof::Range r("data"); batch = loader.next(); }     // a named span of your own
//
// Each op is counted under how it ran: `eager` (dispatched), `trace` (dispatched while a static
// function recorded its first call, or checked it in verify mode) or `replay` (a step of a
// replayed static schedule), so the same op's eager and replayed costs sit side by side. An
// eager op's time is its whole dispatch (checks, kernel, autograd recording); a replayed
// step's is its kernel call.
//
// The trace holds one complete ("X") event per op and per span, on the thread that ran it:
// spans for each static call's forward replay and its backward replay, named with the function
// and cache entry ("step [entry 1] forward replay"; the entry numbers match the schedule dump,
// StaticFunction::schedule_text()), each replayed step inside its span with its index and
// shapes; a static function's trace (first call) and its first backward; each
// autograd::backward pass; user Ranges.
//
// ENCORE_PROFILE=path profiles the whole process: recording starts when the library loads, and
// at exit the Chrome trace is written to `path`, the full table to `path`.txt, and the table's
// first 25 rows are printed to stderr.
//
// Off, profiling costs one relaxed atomic load per dispatched op and per replayed schedule.
// On, events are kept in memory (per thread, `Options::reserve_events` reserved up front) up to
// `Options::max_events`; past it events are dropped and counted, while the table's counts and
// totals stay exact.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/profiler.h"

namespace encore::profiler {

// One op in one mode.
struct OpRow {
  std::string op;
  Mode mode = Mode::Eager;
  int64_t calls = 0;
  int64_t total_ns = 0;
  double share = 0;  // of the time of all ops, 0..1
  double per_call_ns() const { return calls ? static_cast<double>(total_ns) / calls : 0; }
};

// A span name (forward replay of an entry, an autograd backward pass, a Range ...).
struct SpanRow {
  std::string name;
  SpanKind kind = SpanKind::User;
  int64_t calls = 0;
  int64_t total_ns = 0;
};

// What one session recorded.
class Profile {
 public:
  Profile() = default;
  explicit Profile(Recorded recorded);

  // Per (op, mode), largest total time first.
  const std::vector<OpRow>& ops() const { return ops_; }
  // Per span name, largest total time first.
  const std::vector<SpanRow>& spans() const { return spans_; }
  // Every kept event, sorted by thread, then start time (a parent before its children).
  const std::vector<Event>& events() const { return events_; }

  // Calls of `op` in `mode` (0 when it never ran so).
  int64_t calls(std::string_view op, Mode mode) const;
  // The sum over every row: the time spent in ops (optionally in one mode).
  int64_t total_ns() const { return total_ns_; }
  int64_t total_ns(Mode mode) const;
  int64_t total_calls() const;
  int64_t wall_ns() const { return wall_ns_; }
  int64_t dropped_events() const { return dropped_; }

  // The rows as a cProfile-like table: calls, total ms, per call us, share, mode, op; then the
  // spans. `max_rows` > 0 keeps the largest rows of each part.
  std::string table(int max_rows = 0) const;
  // The events as Chrome Trace Event JSON ({"traceEvents": [...]}, times in microseconds).
  std::string chrome_trace() const;
  // Writes chrome_trace() to `path`; throws Error when the file cannot be written.
  void write_chrome_trace(const std::string& path) const;

 private:
  std::vector<OpRow> ops_;
  std::vector<SpanRow> spans_;
  std::vector<Event> events_;
  int64_t total_ns_ = 0, wall_ns_ = 0, dropped_ = 0;
};

// Starts recording; throws Error when a session is already running.
void start(const Options& options = {});
// Stops recording and returns the profile (empty when nothing was running).
Profile stop();
// Whether a session is recording.
inline bool enabled() {
  return active();
}

// Records for its lifetime. With a `trace_path`, the destructor writes the Chrome trace there
// (unless stop() was called).
class Scope {
 public:
  explicit Scope(const Options& options = {}, std::string trace_path = {});
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  Profile stop();

 private:
  std::string trace_path_;
  bool running_ = true;
};

// A span of your own, recorded while a session is on (category "user").
class Range {
 public:
  explicit Range(std::string_view name);
  ~Range();
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  std::string_view name_;
  int64_t start_;
};

// ENCORE_PROFILE: when the variable names a file and no session runs, starts one whose report
// finish_env() writes, and makes sure it runs at exit. Returns whether it started one. Called
// when the library loads; callable again (after setenv) to start another.
bool start_from_env();
// Ends the ENCORE_PROFILE session now: the Chrome trace to its path, the table to path.txt and
// (its first 25 rows) to stderr. Returns the path written, or "" when none was running.
std::string finish_env();

}  // namespace encore::profiler
