// The profiler's recorder: what dispatch(), the static-graph replay loop and the autograd engine
// report while profiling is on. Users reach it through api/encore/profiler.h (start, stop, the
// table, the Chrome trace, ENCORE_PROFILE).
//
// Off, it costs one relaxed atomic load per dispatched op and per replayed schedule (never per
// replayed step: a replay picks the profiled loop once). On, times are read from ticks() (the
// TSC where the kernel trusts it) and each thread appends to its own buffer; a replay loop
// hands its step times over in one batch when it ends. Per-op counts and times are kept apart
// from the events, so they stay exact when the event buffer is full and events are dropped.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/intern.h"
#include "runtime/op_traits.h"

namespace encore {
class Tensor;
struct BufferView;
}  // namespace encore

namespace encore::profiler {

// How an op ran.
enum class Mode : uint8_t {
  Eager,   // dispatched with no tracer active
  Trace,   // dispatched while a static function recorded it (its first call, or verify)
  Replay,  // a step of a replayed static schedule
};
inline constexpr int kNumModes = 3;
std::string_view mode_name(Mode m);  // "eager", "trace", "replay"

// What a span stands for.
enum class SpanKind : uint8_t {
  ForwardReplay,   // a static call replaying its forward schedule
  BackwardReplay,  // the backward schedule of a replayed call
  Trace,           // a static call that traced (its first call with a signature)
  TraceBackward,   // the first backward of a traced call (recorded into its schedule)
  Backward,        // one autograd::backward pass
  User,            // a profiler::Range
  // A collective in flight (dist/), from its start to the test that found it complete; the
  // Chrome trace puts these on a lane of their own beside the threads' compute.
  Communication,
};
std::string_view span_kind_name(SpanKind k);  // "forward_replay", ..., "user"

struct Options {
  bool record_shapes = true;         // operand dtypes and shapes as event arguments
  int64_t max_events = 2'000'000;    // beyond this, events are dropped (and counted)
  int64_t reserve_events = 1 << 16;  // per thread, reserved when the thread first records
};

// One timed interval. Times are nanoseconds since the session started.
struct Event {
  int64_t start_ns = 0;
  int64_t dur_ns = 0;
  // Both interned (valid for the process): the op or span name, and the op's operands
  // ("float32[8], float32[8] -> float32[8]") or the span's details.
  std::string_view name;
  std::string_view args;
  uint32_t tid = 0;  // 1, 2, ... in the order threads first recorded
  bool is_span = false;
  Mode mode = Mode::Eager;         // ops
  SpanKind kind = SpanKind::User;  // spans
  int32_t step = -1;               // replay: the step's index in its schedule
  bool backward_schedule = false;  // replay: a step of the backward schedule
};

struct OpStat {
  Op op = Op::Add;
  Mode mode = Mode::Eager;
  int64_t calls = 0;
  int64_t total_ns = 0;
};
struct SpanStat {
  std::string_view name;
  SpanKind kind = SpanKind::User;
  int64_t calls = 0;
  int64_t total_ns = 0;
};

// Everything one session recorded (stop() hands it over).
struct Recorded {
  std::vector<Event> events;  // per thread in the order they ended; threads one after another
  std::vector<OpStat> ops;    // every (op, mode) that ran at least once
  std::vector<SpanStat> spans;
  int64_t dropped = 0;  // events not kept (max_events reached); still in ops and spans
  int64_t wall_ns = 0;  // from start to stop
  int threads = 0;
};

namespace detail {
extern std::atomic<bool> g_active;
extern std::atomic<bool> g_tsc;
}  // namespace detail

// Whether a session is recording (one relaxed load: the check on every hot path).
inline bool active() {
  return detail::g_active.load(std::memory_order_relaxed);
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The recorder's clock, read only while recording: the time-stamp counter on x86-64 when the
// kernel trusts it as its clock source (a few ns to read, against tens for steady_clock), else
// now_ns(). Recorded ticks become nanoseconds when the session stops.
inline int64_t ticks() {
#if defined(__x86_64__)
  if (detail::g_tsc.load(std::memory_order_relaxed))
    return static_cast<int64_t>(__builtin_ia32_rdtsc());
#endif
  return now_ns();
}

// Starts a session (clearing what an earlier one left). Throws Error when one is running.
void start_session(const Options& options);
// Ends the session and hands over what it recorded (empty when none was running).
Recorded stop_session();
// Whether the session records operand shapes (Options::record_shapes).
bool recording_shapes();

// "float32[8], float32[8] -> float32[8]"
std::string shapes_text(std::span<const Tensor> in, std::span<const Tensor> out);
std::string shapes_text(std::span<const BufferView> in, std::span<const BufferView> out);

// Records one dispatched op that began at `start` (ticks()) and ends now.
void record_op(Op op, Mode mode, int64_t start, std::span<const Tensor> inputs,
               std::span<const Tensor> outputs);
// One replayed step as the replay loop timed it.
struct StepTime {
  Op op = Op::Add;
  bool backward = false;       // a step of the backward schedule
  int32_t step = 0;            // its index in its schedule
  std::string_view args;       // interned shapes text (may be empty)
  int64_t start = 0, end = 0;  // ticks()
};
// A duration measured elsewhere (a device's clock) in ticks().
int64_t ticks_from_ns(int64_t ns);
// Records the steps of one replay loop at once (one lock per run, not per step).
void record_steps(std::span<const StepTime> steps);
// Records a span from `start` (ticks()) to now (`name` and `args` interned).
void record_span(std::string_view name, SpanKind kind, int64_t start, std::string_view args);

// Times the enclosing scope as a span when a session is on at its start.
class ScopedSpan {
 public:
  ScopedSpan(std::string_view name, SpanKind kind)
      : name_(name), start_(active() ? ticks() : -1), kind_(kind) {}
  ~ScopedSpan() {
    if (start_ >= 0) [[unlikely]]
      record_span(name_, kind_, start_, args_);
  }
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

  bool recording() const { return start_ >= 0; }
  // For names and details made only while recording (interned: they outlive the session).
  void set_name(std::string_view name) { name_ = name; }
  void set_args(std::string_view args) { args_ = args; }

 private:
  std::string_view name_;
  int64_t start_;
  SpanKind kind_;
  std::string_view args_;
};

}  // namespace encore::profiler
