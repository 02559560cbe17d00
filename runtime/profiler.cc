#include "runtime/profiler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "runtime/dispatcher.h"
#include "runtime/error.h"

namespace encore::profiler {
namespace detail {
std::atomic<bool> g_active{false};
std::atomic<bool> g_tsc{false};
}  // namespace detail

namespace {

struct OpCell {
  int64_t calls = 0;
  int64_t total_ns = 0;  // in ticks until the session stops
};

// One thread's events and counts, timed in ticks() (events from the session's start) until
// stop_session converts them. Recording locks only its own buffer's mutex (uncontended but for
// stop_session), so threads never wait on each other.
struct ThreadBuffer {
  std::mutex mu;
  uint32_t tid = 0;
  uint64_t session = 0;   // the session its contents belong to
  bool orphaned = false;  // its thread has exited
  std::vector<Event> events;
  std::array<OpCell, kNumOps * kNumModes> ops{};
  absl::flat_hash_map<std::string_view, SpanStat> spans;

  void reset() {
    events.clear();
    ops.fill(OpCell{});
    spans.clear();
  }
};

// Never destroyed: an at-exit report may run after other static objects are gone.
struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;
  uint32_t next_tid = 1;
  bool running = false;
  bool calibrated = false;
  int64_t calib_ticks = 0, calib_ns = 0;  // a reading of both clocks at the first start
  int64_t start_ns = 0;                   // of the running session
};
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

std::atomic<uint64_t> g_session{0};
std::atomic<int64_t> g_epoch{0};  // the session's start, in ticks
std::atomic<int64_t> g_events{0};
std::atomic<int64_t> g_dropped{0};
std::atomic<int64_t> g_max_events{0};
std::atomic<bool> g_record_shapes{true};
std::atomic<int64_t> g_reserve{0};

ThreadBuffer* acquire_buffer() {
  Registry& r = registry();
  std::lock_guard<std::mutex> l(r.mu);
  const uint64_t now = g_session.load();
  for (auto& b : r.buffers) {
    std::lock_guard<std::mutex> bl(b->mu);
    if (b->orphaned && b->session != now) {  // what it held was collected or abandoned
      b->orphaned = false;
      return b.get();
    }
  }
  r.buffers.push_back(std::make_unique<ThreadBuffer>());
  r.buffers.back()->tid = r.next_tid++;
  return r.buffers.back().get();
}

struct ThreadSlot {
  ThreadBuffer* buffer = nullptr;
  ~ThreadSlot() {
    if (buffer == nullptr) return;
    std::lock_guard<std::mutex> l(buffer->mu);
    buffer->orphaned = true;
  }
};

ThreadBuffer& this_thread_buffer() {
  thread_local ThreadSlot slot;
  if (slot.buffer == nullptr) slot.buffer = acquire_buffer();
  return *slot.buffer;
}

// Whether the kernel keeps time with the TSC (so it is invariant and synchronised across cores).
bool kernel_trusts_tsc() {
#if defined(__x86_64__)
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string source;
  return f >> source && source == "tsc";
#else
  return false;
#endif
}

// Under the registry's mutex: picks the clock once, reading both clocks some milliseconds apart
// so that even a first, short session converts its ticks accurately.
void calibrate(Registry& r) {
  if (r.calibrated) return;
  r.calibrated = true;
  detail::g_tsc.store(kernel_trusts_tsc());
  if (!detail::g_tsc.load()) return;
  r.calib_ticks = ticks();
  r.calib_ns = now_ns();
  while (now_ns() - r.calib_ns < 2'000'000) {
  }
}

// Nanoseconds per tick, from the first reading to now.
double ns_per_tick(const Registry& r) {
  if (!detail::g_tsc.load()) return 1.0;
  const int64_t t = ticks(), ns = now_ns();
  return t > r.calib_ticks
             ? static_cast<double>(ns - r.calib_ns) / static_cast<double>(t - r.calib_ticks)
             : 1.0;
}

// Under b.mu: whether to record an interval that began at `start` (not when it began before
// this session), making the buffer the current session's.
bool begin_record(ThreadBuffer& b, int64_t start) {
  if (!active() || start < g_epoch.load(std::memory_order_relaxed)) return false;
  const uint64_t s = g_session.load(std::memory_order_relaxed);
  if (b.session != s) {
    b.reset();
    b.session = s;
    b.events.reserve(static_cast<size_t>(g_reserve.load(std::memory_order_relaxed)));
  }
  return true;
}

// How many of `n` more events the buffer has room for (counting the others as dropped).
int64_t take_event_slots(int64_t n) {
  const int64_t before = g_events.fetch_add(n, std::memory_order_relaxed);
  const int64_t room =
      std::clamp<int64_t>(g_max_events.load(std::memory_order_relaxed) - before, 0, n);
  if (room < n) g_dropped.fetch_add(n - room, std::memory_order_relaxed);
  return room;
}

template <typename T>
std::string operands_text(std::span<const T> in, std::span<const T> out) {
  std::string s;
  auto add = [&s](const T& t) {
    if constexpr (std::is_same_v<T, Tensor>)
      s += cat(t.dtype(), t.shape());
    else
      s += cat(t.dtype, t.shape);
  };
  for (size_t i = 0; i < in.size(); ++i) {
    if (i) s += ", ";
    add(in[i]);
  }
  if (!out.empty()) {
    s += " -> ";
    for (size_t i = 0; i < out.size(); ++i) {
      if (i) s += ", ";
      add(out[i]);
    }
  }
  return s;
}

}  // namespace

std::string_view mode_name(Mode m) {
  switch (m) {
    case Mode::Eager:
      return "eager";
    case Mode::Trace:
      return "trace";
    case Mode::Replay:
      return "replay";
  }
  return "?";
}

std::string_view span_kind_name(SpanKind k) {
  switch (k) {
    case SpanKind::ForwardReplay:
      return "forward_replay";
    case SpanKind::BackwardReplay:
      return "backward_replay";
    case SpanKind::Trace:
      return "trace";
    case SpanKind::TraceBackward:
      return "trace_backward";
    case SpanKind::Backward:
      return "autograd_backward";
    case SpanKind::User:
      return "user";
    case SpanKind::Communication:
      return "communication";
  }
  return "?";
}

std::string shapes_text(std::span<const Tensor> in, std::span<const Tensor> out) {
  return operands_text(in, out);
}
std::string shapes_text(std::span<const BufferView> in, std::span<const BufferView> out) {
  return operands_text(in, out);
}

void start_session(const Options& options) {
  ENCORE_CHECK(options.max_events >= 0, "profiler: max_events must be >= 0, got ",
               options.max_events);
  Registry& r = registry();
  std::lock_guard<std::mutex> l(r.mu);
  ENCORE_CHECK(!r.running, "profiler: already running; stop() the current session first");
  r.running = true;
  g_events.store(0);
  g_dropped.store(0);
  g_max_events.store(options.max_events);
  g_record_shapes.store(options.record_shapes);
  g_reserve.store(std::max<int64_t>(0, std::min(options.reserve_events, options.max_events)));
  calibrate(r);
  g_session.fetch_add(1);
  r.start_ns = now_ns();
  g_epoch.store(ticks());
  detail::g_active.store(true);
}

Recorded stop_session() {
  Registry& r = registry();
  std::lock_guard<std::mutex> l(r.mu);
  Recorded out;
  if (!r.running) return out;
  detail::g_active.store(false);
  r.running = false;
  out.wall_ns = now_ns() - r.start_ns;
  const uint64_t s = g_session.load();
  std::array<OpCell, kNumOps * kNumModes> ops{};
  absl::flat_hash_map<std::string_view, SpanStat> spans;
  for (auto& b : r.buffers) {
    std::lock_guard<std::mutex> bl(b->mu);
    if (b->session != s) continue;
    ++out.threads;
    if (out.events.empty())
      out.events = std::move(b->events);
    else
      out.events.insert(out.events.end(), std::make_move_iterator(b->events.begin()),
                        std::make_move_iterator(b->events.end()));
    for (size_t i = 0; i < ops.size(); ++i) {
      ops[i].calls += b->ops[i].calls;
      ops[i].total_ns += b->ops[i].total_ns;
    }
    for (const auto& [name, st] : b->spans) {
      SpanStat& t = spans[name];
      t.name = st.name;
      t.kind = st.kind;
      t.calls += st.calls;
      t.total_ns += st.total_ns;
    }
    b->reset();
    b->events.shrink_to_fit();
    b->session = 0;
  }
  for (int op = 0; op < kNumOps; ++op)
    for (int m = 0; m < kNumModes; ++m) {
      const OpCell& c = ops[op * kNumModes + m];
      if (c.calls > 0)
        out.ops.push_back({static_cast<Op>(op), static_cast<Mode>(m), c.calls, c.total_ns});
    }
  for (const auto& [name, st] : spans) out.spans.push_back(st);
  out.dropped = g_dropped.load();

  // Ticks to nanoseconds; an event's ends are converted (not its length), so a child's interval
  // stays within its parent's.
  const double k = ns_per_tick(r);
  auto ns = [k](int64_t t) { return std::llround(static_cast<double>(t) * k); };
  for (Event& e : out.events) {
    const int64_t begin = ns(e.start_ns), end = ns(e.start_ns + e.dur_ns);
    e.start_ns = begin;
    e.dur_ns = end - begin;
  }
  for (OpStat& o : out.ops) o.total_ns = ns(o.total_ns);
  for (SpanStat& s : out.spans) s.total_ns = ns(s.total_ns);
  return out;
}

bool recording_shapes() {
  return g_record_shapes.load(std::memory_order_relaxed);
}

void record_op(Op op, Mode mode, int64_t start, std::span<const Tensor> inputs,
               std::span<const Tensor> outputs) {
  const int64_t end = ticks();
  ThreadBuffer& b = this_thread_buffer();
  std::lock_guard<std::mutex> l(b.mu);
  if (!begin_record(b, start)) return;
  OpCell& c = b.ops[static_cast<int>(op) * kNumModes + static_cast<int>(mode)];
  ++c.calls;
  c.total_ns += end - start;
  if (take_event_slots(1) == 0) return;
  Event e;
  e.start_ns = start - g_epoch.load(std::memory_order_relaxed);
  e.dur_ns = end - start;
  e.name = op_name(op);
  if (g_record_shapes.load(std::memory_order_relaxed))
    e.args = intern(shapes_text(inputs, outputs));
  e.tid = b.tid;
  e.mode = mode;
  b.events.push_back(std::move(e));
}

void record_steps(std::span<const StepTime> steps) {
  if (steps.empty()) return;
  ThreadBuffer& b = this_thread_buffer();
  std::lock_guard<std::mutex> l(b.mu);
  if (!begin_record(b, steps.front().start)) return;
  const int64_t epoch = g_epoch.load(std::memory_order_relaxed);
  const int64_t room = take_event_slots(static_cast<int64_t>(steps.size()));
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepTime& s = steps[i];
    OpCell& c = b.ops[static_cast<int>(s.op) * kNumModes + static_cast<int>(Mode::Replay)];
    ++c.calls;
    c.total_ns += s.end - s.start;
    if (static_cast<int64_t>(i) >= room) continue;
    Event e;
    e.start_ns = s.start - epoch;
    e.dur_ns = s.end - s.start;
    e.name = op_name(s.op);
    e.args = s.args;
    e.tid = b.tid;
    e.mode = Mode::Replay;
    e.step = s.step;
    e.backward_schedule = s.backward;
    b.events.push_back(e);
  }
}

void record_span(std::string_view name, SpanKind kind, int64_t start, std::string_view args) {
  const int64_t end = ticks();
  ThreadBuffer& b = this_thread_buffer();
  std::lock_guard<std::mutex> l(b.mu);
  if (!begin_record(b, start)) return;
  SpanStat& st = b.spans[name];
  st.name = name;
  st.kind = kind;
  ++st.calls;
  st.total_ns += end - start;
  if (take_event_slots(1) == 0) return;
  Event e;
  e.start_ns = start - g_epoch.load(std::memory_order_relaxed);
  e.dur_ns = end - start;
  e.name = name;
  e.args = args;
  e.tid = b.tid;
  e.is_span = true;
  e.kind = kind;
  b.events.push_back(std::move(e));
}

int64_t ticks_from_ns(int64_t ns) {
  return static_cast<int64_t>(static_cast<double>(ns) / ns_per_tick(registry()));
}

}  // namespace encore::profiler
