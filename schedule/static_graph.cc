#include "schedule/static_graph.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <list>
#include <map>
#include <mutex>

#include "runtime/autograd.h"
#include "runtime/profiler.h"
#include "runtime/rng.h"
#include "schedule/plan.h"
#include "schedule/recording.h"

namespace encore::schedule {
namespace {

// ---- Process-wide switches, log and registry ---------------------------------------------

bool env_flag_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr &&
         (std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0 || std::strcmp(v, "false") == 0);
}

std::atomic<bool> g_enabled{!env_flag_off("ENCORE_STATIC")};
std::atomic<bool> g_fusion{!env_flag_off("ENCORE_STATIC_FUSE")};
std::atomic<bool> g_redzones{[] {
  const char* v = std::getenv("ENCORE_STATIC_REDZONE");
  return v != nullptr && *v != '\0' && !env_flag_off("ENCORE_STATIC_REDZONE");
}()};
std::atomic<bool> g_log_retraces{[] {
  const char* v = std::getenv("ENCORE_LOG");
  return v != nullptr && std::strstr(v, "retrace") != nullptr;
}()};

int env_verify_every() {
  const char* v = std::getenv("ENCORE_STATIC_VERIFY");
  return v == nullptr ? 0 : std::max(0, std::atoi(v));
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
  if (sink)
    sink(line);
  else
    std::cerr << "encore: " << line << std::endl;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// ---- Signature ----------------------------------------------------------------------------

struct ArgSig {
  Shape shape;
  DType dtype;
  Device device;
  bool requires_grad;
  // Aliasing between arguments: the first earlier argument that is this very tensor (the
  // function's graph then has one leaf for both), and the first earlier argument on the same
  // storage with the byte offset from it (the schedule binds one buffer per storage and offset).
  int same_as = -1;
  int shares_with = -1;
  int64_t shared_offset = 0;
};

struct Signature {
  std::vector<ArgSig> args;
  bool grad = true;
  int mode = -1;
  std::string key;
};

int64_t byte_offset(const TensorImpl& t) {
  return t.offset * static_cast<int64_t>(itemsize(t.dtype));
}

// The aliasing fields of argument i's ArgSig.
void alias_of(std::span<const Tensor> args, size_t i, ArgSig& a) {
  const TensorImpl& t = *args[i].impl();
  a.same_as = a.shares_with = -1;
  a.shared_offset = 0;
  for (size_t j = 0; j < i; ++j) {
    const TensorImpl& u = *args[j].impl();
    if (a.same_as < 0 && &u == &t) a.same_as = static_cast<int>(j);
    if (a.shares_with < 0 && u.storage == t.storage) {
      a.shares_with = static_cast<int>(j);
      a.shared_offset = byte_offset(t) - byte_offset(u);
    }
  }
}

Signature signature_of(std::span<const Tensor> args, const std::string* key, int mode) {
  Signature s;
  s.args.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const Tensor& t = args[i];
    ArgSig& a = s.args.emplace_back(ArgSig{t.shape(), t.dtype(), t.device(), t.requires_grad()});
    alias_of(args, i, a);
  }
  s.grad = GradMode::enabled();
  s.mode = mode;
  if (key != nullptr) s.key = *key;
  return s;
}

bool matches(const Signature& s, std::span<const Tensor> args, const std::string* key, bool grad,
             int mode) {
  if (s.args.size() != args.size() || s.grad != grad || s.mode != mode) return false;
  if ((key == nullptr ? !s.key.empty() : s.key != *key)) return false;
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSig& a = s.args[i];
    const TensorImpl& t = *args[i].impl();
    if (t.dtype != a.dtype || t.requires_grad != a.requires_grad || !(t.shape == a.shape) ||
        t.storage->device() != a.device)
      return false;
  }
  for (size_t i = 1; i < args.size(); ++i) {
    ArgSig now;
    alias_of(args, i, now);
    const ArgSig& a = s.args[i];
    if (now.same_as != a.same_as || now.shares_with != a.shares_with ||
        now.shared_offset != a.shared_offset)
      return false;
  }
  return true;
}

// " (same tensor as argument 0)", " (shares storage with argument 0 at byte offset 16)", "".
std::string alias_text(const ArgSig& a) {
  if (a.same_as >= 0) return cat(" (same tensor as argument ", a.same_as, ")");
  if (a.shares_with < 0) return {};
  return cat(" (shares storage with argument ", a.shares_with,
             a.shared_offset == 0 ? std::string() : cat(" at byte offset ", a.shared_offset), ")");
}

std::string mode_name(int mode) {
  switch (mode) {
    case 0:
      return "eval";
    case 1:
      return "train";
    case 2:
      return "mixed train/eval";
    default:
      return "no module";
  }
}

std::string arg_label(const Config& c, size_t i) {
  return i < c.arg_names.size() && !c.arg_names[i].empty()
             ? cat("argument ", i, " '", c.arg_names[i], "'")
             : cat("argument ", i);
}

std::string describe(const Signature& s, const Config& c) {
  std::string out;
  for (size_t i = 0; i < s.args.size(); ++i) {
    const ArgSig& a = s.args[i];
    out += cat(i ? ", " : "",
               i < c.arg_names.size() && !c.arg_names[i].empty() ? c.arg_names[i] : cat("arg", i),
               ": ", a.dtype, a.shape, a.device == Device::cpu() ? "" : cat(" ", a.device),
               a.requires_grad ? " requires_grad" : "", alias_text(a));
  }
  return cat(out, "; grad ", s.grad ? "on" : "off", s.mode < 0 ? "" : "; " + mode_name(s.mode),
             s.key.empty() ? "" : cat("; key '", s.key, "'"));
}

// One change between signatures: what changed (for the storm warning) and the full text.
struct Change {
  std::string subject;  // "argument 0 'x' dim 0"
  std::string text;     // "argument 0 'x' dim 0 changed 32 -> 17"
  int64_t value = -1;   // the new size when a dimension changed
};

std::vector<Change> diff(const Signature& old, const Signature& now, const Config& c) {
  std::vector<Change> out;
  if (old.args.size() != now.args.size())
    out.push_back({"the number of arguments",
                   cat("number of arguments changed ", old.args.size(), " -> ", now.args.size())});
  for (size_t i = 0; i < std::min(old.args.size(), now.args.size()); ++i) {
    const ArgSig &a = old.args[i], &b = now.args[i];
    const std::string arg = arg_label(c, i);
    if (a.dtype != b.dtype)
      out.push_back({arg + " dtype", cat(arg, " dtype changed ", a.dtype, " -> ", b.dtype)});
    if (a.device != b.device)
      out.push_back({arg + " device", cat(arg, " device changed ", a.device, " -> ", b.device)});
    if (a.shape.rank() != b.shape.rank()) {
      out.push_back({arg + " rank", cat(arg, " shape changed ", a.shape, " -> ", b.shape)});
    } else {
      for (int d = 0; d < a.shape.rank(); ++d)
        if (a.shape[d] != b.shape[d])
          out.push_back({cat(arg, " dim ", d),
                         cat(arg, " dim ", d, " changed ", a.shape[d], " -> ", b.shape[d]),
                         b.shape[d]});
    }
    if (a.requires_grad != b.requires_grad)
      out.push_back({arg + " requires_grad",
                     cat(arg, " requires_grad changed ", a.requires_grad ? "true" : "false", " -> ",
                         b.requires_grad ? "true" : "false")});
    if (alias_text(a) != alias_text(b)) {
      const std::string was = alias_text(a), now = alias_text(b);
      out.push_back(
          {arg + " aliasing", cat(arg, " aliasing changed", was.empty() ? " (no alias)" : was,
                                  " ->", now.empty() ? " (no alias)" : now)});
    }
  }
  if (old.grad != now.grad)
    out.push_back({"grad mode", cat("grad mode changed ", old.grad ? "on" : "off", " -> ",
                                    now.grad ? "on" : "off")});
  if (old.mode != now.mode)
    out.push_back({"mode", cat("mode changed ", mode_name(old.mode), " -> ", mode_name(now.mode))});
  if (old.key != now.key)
    out.push_back({"key", cat("key changed '", old.key, "' -> '", now.key, "'")});
  return out;
}

// ---- Cache entries ------------------------------------------------------------------------

struct ParamGuard {
  int buf;  // the Param buffer
  int slot;
  Shape shape;
  DType dtype;
  Device device;
  bool requires_grad;
};

struct GradGuard {
  int leaf;
  bool defined;  // what the .grad must be when a call starts
  Shape shape;
};

// Where an entry is in its life. Tracing, it is a placeholder: other calls with its signature
// run eagerly meanwhile, and only its signature may be read. The trace publishes Ready (planned),
// Waiting (for the first backward through its outputs) or Eager (unsafe); from Waiting, that
// backward makes it Ready or Failed, and outputs that die unused make it Abandoned. The state is
// stored (release) after the fields it publishes are written, and loaded (acquire) before they
// are read.
enum class EntryState : uint8_t { Tracing, Waiting, Ready, Eager, Failed, Abandoned };

struct Entry {
  std::string_view name;  // the function's (interned)
  int64_t id = 0;         // the trace that made it (1, 2, ...)
  int64_t traced_call = 0;
  Signature sig;
  std::weak_ptr<StaticGraph::Impl> owner;  // told when the first backward fails
  std::atomic<EntryState> state{EntryState::Tracing};
  std::shared_ptr<Recording> rec;
  std::shared_ptr<Plan> plan;  // Ready
  bool eager_only = false;
  bool node = false;  // results carry a subgraph node
  // The switches when the trace began (and verify mode's red zones).
  PlanOptions plan_options;
  std::vector<ParamSlot> slots;
  std::vector<ParamGuard> params;
  std::vector<GradGuard> grads;
  std::vector<int> grad_in;  // GradIn buffers, by differentiable result
  int64_t hits = 0;          // guarded by the function's mutex
  // Failed: why, and how many first backwards of this signature failed in a row (a retrace
  // carries the count over).
  std::string failure;
  int backward_failures = 0;
  // Leaves whose .grad the call replaces before reading it: dropped as a replay starts, so the
  // old gradients are freed before the new ones are allocated.
  std::vector<int> early_clear;
  // Profiler span names by SpanKind (forward replay ... trace backward), interned on first use,
  // and the arguments its spans carry.
  std::once_flag span_names_once, span_args_once;
  std::string_view span_names[4];
  std::string_view span_args;

  EntryState load_state() const { return state.load(std::memory_order_acquire); }
  void publish(EntryState s) { state.store(s, std::memory_order_release); }
};

// The name of a span of entry `e` (made while profiling only: interned names are never freed).
std::string_view span_name(std::string_view name, int64_t id, profiler::SpanKind kind) {
  static constexpr const char* kWhat[] = {"forward replay", "backward replay", "trace",
                                          "trace backward"};
  return intern(cat(name, " [entry ", id, "] ", kWhat[static_cast<int>(kind)]));
}
std::string_view span_name(Entry& e, profiler::SpanKind kind) {
  std::call_once(e.span_names_once, [&e] {
    for (int k = 0; k < 4; ++k)
      e.span_names[k] = span_name(e.name, e.id, static_cast<profiler::SpanKind>(k));
  });
  return e.span_names[static_cast<int>(kind)];
}

const Tensor& leaf_now(const Entry& e, const Leaf& l) {
  return l.param >= 0 ? *e.slots[l.param].slot : l.tensor;
}

std::string leaf_label(const Entry& e, const Leaf& l) {
  return l.param >= 0 ? cat("parameter '", e.slots[l.param].name, "'")
                      : cat("captured tensor ", l.tensor.shape());
}

// Why the entry's guards fail for this call (empty: they hold).
std::string guard_failure(const Entry& e) {
  if (e.eager_only) return {};  // runs the function itself
  for (const ParamGuard& g : e.params) {
    const Tensor& p = *e.slots[g.slot].slot;
    const std::string& name = e.slots[g.slot].name;
    if (!p.defined()) return cat("parameter '", name, "' is now undefined");
    if (!(p.shape() == g.shape))
      return cat("parameter '", name, "' shape changed ", g.shape, " -> ", p.shape());
    if (p.dtype() != g.dtype)
      return cat("parameter '", name, "' dtype changed ", g.dtype, " -> ", p.dtype());
    if (p.device() != g.device)
      return cat("parameter '", name, "' device changed ", g.device, " -> ", p.device());
    if (p.requires_grad() != g.requires_grad)
      return cat("parameter '", name, "' requires_grad changed ",
                 g.requires_grad ? "true -> false" : "false -> true");
  }
  for (const GradGuard& g : e.grads) {
    const Leaf& l = e.rec->leaves[g.leaf];
    const Tensor& t = leaf_now(e, l);
    const Tensor grad = t.defined() ? t.grad() : Tensor();
    if (grad.defined() != g.defined)
      return cat("gradient of ", leaf_label(e, l), " changed ", g.defined ? "defined" : "undefined",
                 " -> ", grad.defined() ? "defined" : "undefined");
    if (g.defined && !(grad.shape() == g.shape))
      return cat("gradient of ", leaf_label(e, l), " shape changed ", g.shape, " -> ",
                 grad.shape());
  }
  return {};
}

// ---- The subgraph node of a replayed call ---------------------------------------------------

// What a verified call keeps for its backward: the eager run's graph and recorder.
struct VerifyState {
  Recording rec;
  std::unique_ptr<Recorder> recorder;
  std::vector<Tensor> aliases, inner, leaves;
};

// What a replayed call keeps until its backward: its call state (arena) and the plan it belongs to.
struct Frame final : RefCounted {
  std::shared_ptr<Entry> entry;
  std::shared_ptr<Plan> plan;
  CallState* state = nullptr;
  std::unique_ptr<VerifyState> verify;
  ~Frame() override {
    if (state != nullptr) plan->release(state);
  }
};

// The autograd node of one static call: it stands for every op of the call.
IntrusivePtr<Node> subgraph_node(std::string_view label, BackwardFn backward, size_t inputs,
                                 size_t outputs) {
  auto n = make_intrusive<Node>();
  n->op = Op::Copy;  // unused: the label names the node
  n->label = label;
  n->sequence_nr = autograd::next_sequence_nr();
  n->backward = backward;
  n->next.reserve(inputs);
  n->inputs.reserve(inputs);
  n->outputs.reserve(outputs);
  return n;
}

void add_input(Node& n, const Tensor& t) {
  n.next.push_back(gradient_edge(t));
  n.inputs.push_back(TensorMeta::of(t));
}

void add_output(const IntrusivePtr<Node>& n, TensorImpl& out) {
  n->outputs.push_back({out.shape, out.dtype, out.storage->device()});
  set_gradient_edge(out, n, static_cast<uint32_t>(n->outputs.size() - 1));
}

// Plans a recording whose schedules are complete. The entry keeps its recording (the plan
// shares it): calls that check the guards of a Waiting entry read its leaves meanwhile.
void complete_entry(Entry& e) {
  e.plan = std::make_shared<Plan>(e.rec, e.plan_options);
}

Tensor tensor_on(const IntrusivePtr<Storage>& s, const Operand& o) {
  return Tensor(make_intrusive<TensorImpl>(s, 0, o.shape, o.dtype));
}

// Verify: runs `inner`'s graph eagerly under `recorder` with the leaves' .grad set aside and
// put back after, so the check leaves no gradient behind.
void verify_backward(Recorder& recorder, std::span<const Tensor> inner,
                     std::span<const Tensor> grads, const std::vector<Tensor>& aliases,
                     const std::vector<Tensor>& leaves) {
  std::vector<IntrusivePtr<TensorImpl>> stash;
  for (const Tensor& l : leaves) stash.push_back(std::move(l.impl()->grad));
  for (const Tensor& a : aliases) a.impl()->grad.reset();
  struct Restore {
    const std::vector<Tensor>& leaves;
    std::vector<IntrusivePtr<TensorImpl>>& stash;
    ~Restore() {
      for (size_t i = 0; i < leaves.size(); ++i) leaves[i].impl()->grad = std::move(stash[i]);
    }
  } restore{leaves, stash};
  for (size_t k = 0; k < grads.size(); ++k) recorder.add_grad_in(static_cast<int>(k), grads[k]);
  TracerScope scope(&recorder);
  autograd::backward(inner, grads, /*retain_graph=*/true);
}

void replay_backward(BackwardContext& ctx);

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

// A function's cache and statistics, shared by the threads that call it: `mu` guards the entry
// list, the statistics and every entry's hit count; an entry's other fields are published by its
// state (Entry::publish). A call holds the lock to find its entry, never while it traces or
// replays. Held by shared_ptr, so an entry whose first backward outlives the function can still
// tell it (weak_ptr).
struct StaticGraph::Impl : std::enable_shared_from_this<StaticGraph::Impl> {
  static constexpr size_t kHistory = 64;   // traces kept in stats().traces_history
  static constexpr size_t kWarnings = 64;  // warnings kept in stats().warnings
  static constexpr size_t kSubjects = 64;  // changing signature parts the storm warning tracks
  // First backwards of one signature that may fail in a row before it runs eagerly for good.
  static constexpr int kMaxBackwardFailures = 3;

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
  std::map<std::string, std::vector<int64_t>> changes;  // subject -> new values, in order
  std::vector<std::string> unlogged;  // warnings and trace lines, printed once `mu` is released

  Impl(Body b, Config c)
      : body(std::move(b)),
        config(std::move(c)),
        verify_every(config.verify_every > 0 ? config.verify_every : env_verify_every()),
        label(intern(config.name)) {
    stats.name = config.name;
    recent.assign(10, 0);
  }

  int mode() const { return config.mode ? config.mode() : -1; }
  // With `mu` held.
  void note_call(bool traced) { recent[recent_pos++ % recent.size()] = traced; }
  void warn(std::string w) {
    unlogged.push_back(w);
    if (keep_bounded(stats.warnings, std::move(w), kWarnings)) ++stats.warnings_dropped;
  }
  // Releases `lock`, then prints what was noted under it.
  void unlock_and_log(std::unique_lock<std::mutex>& lock) {
    std::vector<std::string> lines = std::move(unlogged);
    unlogged.clear();
    lock.unlock();
    for (const std::string& l : lines) log_line(l);
  }
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
  std::unique_ptr<VerifyState> run_for_verify(const Entry& e, std::span<const Tensor> args);
  void after_trace(const Entry& e, const std::string& reason, const std::vector<Change>& changes,
                   double ms);
  // The first backward through the outputs of a trace of `e` failed (e is Failed).
  void backward_failed(const Entry& e);

  // Runs the function eagerly under `recorder` on leaves standing for its arguments (so the
  // backward of its graph stops at the subgraph's boundary), returned in `aliases`. An argument
  // passed twice has one alias, so the function's graph has one leaf for it, as eagerly.
  std::vector<Tensor> run_recorded(Recorder& recorder, std::span<const Tensor> args,
                                   const std::vector<ParamSlot>& slots,
                                   std::vector<Tensor>& aliases) {
    aliases.clear();
    for (size_t i = 0; i < args.size(); ++i) {
      const Tensor& a = args[i];
      const auto same = std::find_if(args.begin(), args.begin() + i,
                                     [&a](const Tensor& b) { return b.impl() == a.impl(); });
      if (same != args.begin() + i) {
        aliases.push_back(aliases[same - args.begin()]);
        continue;
      }
      Tensor alias = a.detach();
      if (a.requires_grad()) alias.set_requires_grad(true);
      aliases.push_back(std::move(alias));
    }
    for (size_t i = 0; i < aliases.size(); ++i) recorder.add_arg(static_cast<int>(i), aliases[i]);
    recorder.add_watched(slots);
    std::vector<Tensor> results;
    TracerScope scope(&recorder);
    body(aliases, results);
    return results;
  }
};

void StaticGraph::Impl::call(std::span<const Tensor> args, const std::string* key,
                             std::vector<Tensor>& results) {
  for (size_t i = 0; i < args.size(); ++i)
    ENCORE_CHECK(args[i].defined(), config.name, ": ", arg_label(config, i),
                 " is an undefined tensor");
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
  const bool grad = GradMode::enabled();
  const int m = mode();
  std::unique_lock<std::mutex> lock(mu);
  ++stats.calls;
  std::string guard_reason;
  int failures = 0;  // failed first backwards of this signature, carried into its next trace
  for (auto it = entries.begin(); it != entries.end(); ++it) {
    Entry& e = **it;
    if (!matches(e.sig, args, key, grad, m)) continue;
    const EntryState state = e.load_state();
    if (state == EntryState::Abandoned ||
        (state == EntryState::Failed && e.backward_failures < kMaxBackwardFailures)) {
      guard_reason = state == EntryState::Abandoned
                         ? "no backward reached the outputs of the previous trace (evaluating in "
                           "grad mode? wrap it in NoGradGuard)"
                         : cat("the first backward of the previous trace failed (", e.failure, ")");
      if (state == EntryState::Failed) failures = e.backward_failures;
      entries.erase(it);
      break;
    }
    if (state != EntryState::Tracing) {
      std::string why = guard_failure(e);
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

  // A new signature: a placeholder entry, so that concurrent calls with it run eagerly while
  // this one traces outside the lock.
  const auto t0 = std::chrono::steady_clock::now();
  Signature sig = signature_of(args, key, m);
  std::vector<Change> ch;
  std::string reason;
  if (!guard_reason.empty()) {
    reason = guard_reason;
  } else if (entries.empty()) {
    reason = "first call";
  } else {
    ch = diff(entries.front()->sig, sig, config);
    for (const Change& c : ch) reason += (reason.empty() ? "" : ", ") + c.text;
  }
  note_call(true);
  auto e = std::make_shared<Entry>();
  e->name = label;
  e->id = ++stats.traces;
  e->traced_call = stats.calls;
  e->plan_options = {fusion_enabled(), redzones_enabled() || verify_every > 0};
  e->sig = std::move(sig);
  e->owner = weak_from_this();
  e->backward_failures = failures;
  entries.push_front(e);
  while (static_cast<int>(entries.size()) > std::max(1, config.cache_limit)) {
    ++stats.evictions;
    warn(cat(config.name, ": cache full (", config.cache_limit,
             " entries); evicted the least recently used signature (",
             describe(entries.back()->sig, config), ")"));
    entries.pop_back();
  }
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
    lock.lock();
    entries.remove(e);
    throw;
  }
  lock.lock();
  e->publish(e->eager_only ? EntryState::Eager : e->node ? EntryState::Waiting : EntryState::Ready);
  if (!unsafe.empty()) warn(cat(unsafe, " (running this signature eagerly)"));
  after_trace(*e, reason, ch, ms_since(t0));
  unlock_and_log(lock);
}

void StaticGraph::Impl::after_trace(const Entry& e, const std::string& reason,
                                    const std::vector<Change>& ch, double ms) {
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
  if (g_log_retraces.load()) unlogged.push_back(ev.message);
  // The history keeps the first trace and the latest ones, so a storm cannot grow it forever.
  keep_bounded(stats.traces_history, std::move(ev), kHistory);
  for (const Change& c : ch) {
    if (c.value < 0) continue;
    auto it = changes.find(c.subject);
    if (it == changes.end()) {
      if (changes.size() >= kSubjects) continue;
      it = changes.emplace(c.subject, std::vector<int64_t>()).first;
    }
    std::vector<int64_t>& values = it->second;
    if (values.size() >= 16) values.erase(values.begin());
    values.push_back(c.value);
  }

  // A storm: half of the recent calls traced.
  const int window = static_cast<int>(recent.size());
  int traced = 0;
  for (char r : recent) traced += r;
  if (stats.calls >= window && traced * 2 >= window && stats.calls - last_storm_warning >= window) {
    last_storm_warning = stats.calls;
    std::string what = "its signature keeps changing";
    size_t best = 0;
    for (const auto& [subject, values] : changes)
      if (values.size() > best) {
        best = values.size();
        std::string seen;
        for (size_t i = values.size() > 8 ? values.size() - 8 : 0; i < values.size(); ++i)
          seen += cat(seen.empty() ? "" : ", ", values[i]);
        what = cat(subject, " keeps changing (recent values ", seen, ")");
      }
    warn(cat(config.name, ": ", traced, " of the last ", window, " calls retraced; ", what,
             ". Every new value traces and plans again; pad or bucket it to a few fixed sizes, "
             "raise cache_limit (now ",
             config.cache_limit,
             ") if only a few values occur, or run this function "
             "eagerly (ENCORE_STATIC=0)"));
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

namespace {

// The node of a traced call: its backward runs the call's own autograd graph eagerly, recorded
// the first time into the entry's backward schedule.
struct TraceFrame final : RefCounted {
  std::shared_ptr<Entry> entry;
  std::shared_ptr<Recording> rec;
  std::unique_ptr<Recorder> recorder;
  std::vector<Tensor> args;     // the call's arguments
  std::vector<Tensor> aliases;  // the arguments as the function saw them (leaves)
  std::vector<Tensor> inner;    // its differentiable results, with their graph
  // Arguments with a producer, each tensor once (its first position): the node's inputs.
  std::vector<int> node_args;
  bool recorded = false;
  ~TraceFrame() override {
    EntryState waiting = EntryState::Waiting;
    if (!recorded)
      entry->state.compare_exchange_strong(waiting, EntryState::Abandoned,
                                           std::memory_order_acq_rel);
  }
};

void trace_backward(BackwardContext& ctx);

}  // namespace

std::string StaticGraph::Impl::trace(const std::shared_ptr<Entry>& entry,
                                     std::span<const Tensor> args, std::vector<Tensor>& results) {
  Entry& e = *entry;
  if (config.params) e.slots = config.params();
  auto rec = std::make_shared<Recording>();
  auto recorder =
      std::make_unique<Recorder>(*rec, config.name, config.on_unsafe == OnUnsafe::Error, false);
  std::vector<Tensor> aliases;
  const std::vector<Tensor> inner = run_recorded(*recorder, args, e.slots, aliases);
  for (const Tensor& r : inner) {
    ENCORE_CHECK(r.defined(), config.name, ": the function returned an undefined tensor");
    rec->results.push_back(recorder->operand_of(r));
  }
  e.eager_only = !rec->unsafe.empty();

  const bool node =
      GradMode::enabled() && !rec->saw_backward &&
      std::any_of(inner.begin(), inner.end(), [](const Tensor& t) { return t.requires_grad(); });
  e.node = node;
  // Guards: watched parameters' shapes; the state of .grad the trace depended on.
  for (size_t b = 0; b < rec->buffers.size(); ++b) {
    const Buffer& buf = rec->buffers[b];
    if (buf.kind == BufKind::Param)
      e.params.push_back({static_cast<int>(b), buf.index, buf.bound.shape(), buf.bound.dtype(),
                          buf.bound.device(), buf.bound.requires_grad()});
  }
  for (size_t i = 0; i < rec->leaves.size(); ++i) {
    const Leaf& l = rec->leaves[i];
    const bool entry_read =
        std::any_of(rec->buffers.begin(), rec->buffers.end(), [i](const Buffer& b) {
          return b.kind == BufKind::GradSlot && b.index == static_cast<int>(i);
        });
    if (l.first == Leaf::First::Replaced && !entry_read)
      e.early_clear.push_back(static_cast<int>(i));
    if (l.first == Leaf::First::EngineSet)
      e.grads.push_back({static_cast<int>(i), false, Shape()});
    else if (l.first == Leaf::First::Read)
      e.grads.push_back({static_cast<int>(i), true, l.entry_grad.shape()});
  }
  e.rec = rec;

  results.clear();
  if (!node) {
    // Results leave the trace cut from its graph (a whole step already ran its backward).
    for (const Tensor& r : inner) results.push_back(r.requires_grad() ? r.detach() : r);
    if (!e.eager_only) complete_entry(e);
    return rec->unsafe;
  }

  // The subgraph node: its inputs are the arguments with a producer (leaves, parameters
  // included, take their gradients directly, as eagerly); its outputs the differentiable
  // results.
  auto frame = make_intrusive<TraceFrame>();
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].requires_grad() && !args[i].is_leaf() && e.sig.args[i].same_as < 0)
      frame->node_args.push_back(static_cast<int>(i));
  for (size_t k = 0; k < inner.size(); ++k)
    if (inner[k].requires_grad()) rec->differentiable.push_back(static_cast<int>(k));

  IntrusivePtr<Node> n =
      subgraph_node(label, &trace_backward, frame->node_args.size(), rec->differentiable.size());
  for (int a : frame->node_args) add_input(*n, args[a]);
  for (size_t k = 0; k < inner.size(); ++k) {
    Tensor out = inner[k].detach();
    if (inner[k].requires_grad()) {
      add_output(n, *out.impl());
      frame->inner.push_back(inner[k]);
    }
    results.push_back(std::move(out));
  }
  frame->entry = entry;
  frame->rec = rec;
  frame->recorder = std::move(recorder);
  frame->aliases = std::move(aliases);
  frame->args.assign(args.begin(), args.end());
  if (e.eager_only) frame->recorded = true;  // nothing to record; just the gradients
  n->payload = std::move(frame);
  return rec->unsafe;
}

namespace {

// Records the first backward of a traced call and plans its entry; a failure makes the entry
// Failed (the next call with its signature traces again) and reaches the caller.
void record_backward(TraceFrame& f, std::span<const Tensor> grads_out) {
  Entry& e = *f.entry;
  try {
    f.recorder->set_phase(Phase::Backward);
    for (size_t k = 0; k < grads_out.size(); ++k)
      f.recorder->add_grad_in(static_cast<int>(k), grads_out[k]);
    {
      TracerScope scope(f.recorder.get());
      autograd::backward(f.inner, grads_out, /*retain_graph=*/true);
    }
    if (e.eager_only) return;
    const Recording& rec = *f.rec;
    for (size_t b = 0; b < rec.buffers.size(); ++b)
      if (rec.buffers[b].kind == BufKind::GradIn) {
        if (e.grad_in.size() <= static_cast<size_t>(rec.buffers[b].index))
          e.grad_in.resize(rec.buffers[b].index + 1, -1);
        e.grad_in[rec.buffers[b].index] = static_cast<int>(b);
      }
    f.recorder.reset();
    complete_entry(e);
    e.publish(EntryState::Ready);
  } catch (const std::exception& ex) {
    if (e.eager_only) throw;
    e.failure = ex.what();
    ++e.backward_failures;
    e.publish(EntryState::Failed);
    if (std::shared_ptr<StaticGraph::Impl> owner = e.owner.lock()) owner->backward_failed(e);
    throw;
  }
}

void trace_backward(BackwardContext& ctx) {
  TraceFrame& f = static_cast<TraceFrame&>(*ctx.payload());
  profiler::ScopedSpan span({}, profiler::SpanKind::TraceBackward);
  if (span.recording()) span.set_name(span_name(*f.entry, profiler::SpanKind::TraceBackward));
  const bool record = !f.recorded;
  f.recorded = true;
  std::vector<Tensor> grads_out;
  for (int k = 0; k < ctx.num_outputs(); ++k) grads_out.push_back(ctx.grad_output(k));
  // Exactly eager's accumulation: parameters take their gradients into .grad directly; an
  // argument that is a leaf shares its .grad with the alias standing for it; one with a
  // producer gets the alias's gradient through this node. The recorder notes each delivery.
  for (size_t i = 0; i < f.aliases.size(); ++i)
    if (f.aliases[i].requires_grad())
      f.aliases[i].impl()->grad = f.args[i].is_leaf() ? f.args[i].impl()->grad : nullptr;
  if (record)
    record_backward(f, grads_out);
  else
    autograd::backward(f.inner, grads_out, /*retain_graph=*/true);
  for (size_t i = 0; i < f.aliases.size(); ++i)
    if (f.aliases[i].requires_grad() && f.args[i].is_leaf())
      f.args[i].impl()->grad = f.aliases[i].impl()->grad;
  for (size_t j = 0; j < f.node_args.size(); ++j) {
    Tensor g = f.aliases[f.node_args[j]].grad();
    if (g.defined()) ctx.set_input_grad(static_cast<int>(j), std::move(g));
  }
}
}  // namespace

namespace {

// The tensor a non-arena buffer is for this call (null for GradIn and temporaries).
const Tensor* bound_tensor(const Entry& e, const Buffer& b, std::span<const Tensor> args,
                           Tensor& scratch) {
  switch (b.kind) {
    case BufKind::Arg:
      return &args[b.index];
    case BufKind::Param:
      return e.slots[b.index].slot;
    case BufKind::External:
      return &b.bound;
    case BufKind::GradSlot:
      scratch = leaf_now(e, e.plan->recording().leaves[b.index]).grad();
      return &scratch;
    default:
      return nullptr;
  }
}

Tensor grad_tensor(CallState& b, const Plan& p, const Entry& e, int buf, const Tensor& leaf) {
  const Buffer& B = p.recording().buffers[buf];
  if (B.kind == BufKind::Temp)
    return tensor_on(b.own[p.escape_slot(buf)], Operand{buf, leaf.shape(), leaf.dtype()});
  Tensor scratch;
  const Tensor* t = bound_tensor(e, B, {}, scratch);
  return t != nullptr ? *t : Tensor();
}

// The attributes worth showing in a message (the scalar of scalar ops).
std::string attrs_text(Op op, const AttrBlob& a) {
  return op_has_scalar_attrs(op) ? cat(" with scalar ", a.as<ScalarAttrs>().value) : "";
}

std::string step_text(Op op, std::span<const Operand> in, std::span<const Operand> out,
                      const AttrBlob& attrs) {
  std::string s = std::string(op_name(op)) + "(";
  for (size_t i = 0; i < in.size(); ++i) s += cat(i ? ", " : "", in[i].dtype, in[i].shape);
  s += ")" + attrs_text(op, attrs);
  if (!out.empty()) s += cat(" -> ", out[0].dtype, out[0].shape);
  return s;
}

bool same_attrs(Op op, const AttrBlob& a, const AttrBlob& b) {
  if (op_draws_random(op)) {  // the stream differs by design; the distribution must not
    const RandomAttrs &x = a.as<RandomAttrs>(), &y = b.as<RandomAttrs>();
    return x.a == y.a && x.b == y.b;
  }
  return std::memcmp(a.bytes, b.bytes, AttrBlob::kCapacity) == 0;
}

// Whether a replayed step wrote the values the eager run did: the same bytes, except that any
// NaN equals any NaN. Which NaN an operation on two NaNs returns (its sign and payload) follows
// the operand order the compiler chose for the loop, which differs between a fused step and
// the op's own kernel; IEEE 754 leaves it open.
bool same_values(const Step& s, const std::vector<unsigned char>& a,
                 const std::vector<unsigned char>& b) {
  if (a == b) return true;
  if (a.size() != b.size()) return false;
  size_t at = 0;
  auto same_part = [&](const Operand& o) {
    const size_t n = o.nbytes();
    if (at + n > a.size()) return false;
    const unsigned char* x = a.data() + at;
    const unsigned char* y = b.data() + at;
    at += n;
    auto same_floats = [&]<typename T>(T) {
      for (size_t i = 0; i < n / sizeof(T); ++i) {
        T u, v;
        std::memcpy(&u, x + i * sizeof(T), sizeof(T));
        std::memcpy(&v, y + i * sizeof(T), sizeof(T));
        if (std::memcmp(&u, &v, sizeof(T)) != 0 && !(std::isnan(u) && std::isnan(v))) return false;
      }
      return true;
    };
    if (o.dtype == DType::Float32) return same_floats(float{});
    if (o.dtype == DType::Float64) return same_floats(double{});
    return std::memcmp(x, y, n) == 0;
  };
  bool same = true;
  for_each_written(s.op, std::span<const Operand>(s.in), std::span<const Operand>(s.out),
                   [&](const Operand& o) { same = same && same_part(o); });
  return same && at == a.size();
}

// Compares a fresh eager recording with the plan's, step by step (structure, then values).
void compare_runs(std::string_view name, const Plan& p, const Recording& eager,
                  const std::vector<StepSnapshot>& replayed, Phase phase) {
  const bool backward = phase == Phase::Backward;
  const std::vector<Step>& want = p.trace_steps();
  const int begin = backward ? p.recorded_forward() : 0;
  const int end = backward ? static_cast<int>(want.size()) : p.recorded_forward();
  const std::vector<Step>& got = backward ? eager.backward : eager.forward;
  const char* what = phase_name(phase);
  for (int i = begin; i < end; ++i) {
    const int k = i - begin;
    const Step& a = want[i];
    ENCORE_CHECK(k < static_cast<int>(got.size()), "verify: ", name,
                 ": the eager run stopped after ", got.size(), " ", what,
                 " ops; the schedule has ", end - begin, ": the function is not static");
    const Step& b = got[k];
    bool same = a.op == b.op && a.in.size() == b.in.size() && a.out.size() == b.out.size() &&
                same_attrs(a.op, a.attrs, b.attrs);
    for (size_t j = 0; same && j < a.in.size(); ++j)
      same = a.in[j].shape == b.in[j].shape && a.in[j].dtype == b.in[j].dtype;
    for (size_t j = 0; same && j < a.out.size(); ++j)
      same = a.out[j].shape == b.out[j].shape && a.out[j].dtype == b.out[j].dtype;
    ENCORE_CHECK(same, "verify: ", name, ": ", what, " op ", k, " differs: the schedule has ",
                 step_text(a.op, a.in, a.out, a.attrs), ", the eager run now does ",
                 step_text(b.op, b.in, b.out, b.attrs),
                 " (different op, shapes or attributes): the function is not static; its ops "
                 "depend on something outside its signature");
  }
  ENCORE_CHECK(static_cast<int>(got.size()) == end - begin, "verify: ", name,
               ": the eager run did ", got.size(), " ", what, " ops; the schedule has ",
               end - begin, ": the function is not static");
  const int offset = backward ? static_cast<int>(eager.forward.size()) : 0;
  for (const StepSnapshot& mine : replayed) {
    if (mine.trace_index < 0) continue;
    const int k = mine.trace_index - begin;
    const Step& a = want[mine.trace_index];
    ENCORE_CHECK(same_values(a, mine.bytes, eager.snapshots[offset + k]), "verify: ", name, ": ",
                 what, " op ", k, " ", step_text(a.op, a.in, a.out, a.attrs),
                 " computed different values in the replay and in the eager run: the function "
                 "is not static (it reads values the schedule bound at trace time)");
  }
}

void replay_backward(BackwardContext& ctx) {
  Frame& f = static_cast<Frame&>(*ctx.payload());
  profiler::ScopedSpan span({}, profiler::SpanKind::BackwardReplay);
  if (span.recording()) {
    span.set_name(span_name(*f.entry, profiler::SpanKind::BackwardReplay));
    span.set_args(f.entry->span_args);
  }
  Plan& p = *f.plan;
  CallState& b = *f.state;
  ENCORE_CHECK(!b.backward_done, "backward: a replayed static call was back-propagated twice ",
               "(retain_graph); its arena is reused by the backward, so run the function again");
  std::vector<Tensor> grads_out;
  if (f.verify) {
    VerifyState& v = *f.verify;
    for (int k = 0; k < ctx.num_outputs(); ++k) grads_out.push_back(ctx.grad_output(k));
    verify_backward(*v.recorder, v.inner, grads_out, v.aliases, v.leaves);
  }
  for (size_t i = 0; i < f.entry->grad_in.size(); ++i)
    if (f.entry->grad_in[i] >= 0) b.ptrs[f.entry->grad_in[i]] = ctx.grad_output(i).raw_data();
  for (size_t i = 0; i < b.held.size(); ++i)
    ENCORE_CHECK(b.held[i].version() == b.versions[i], "backward of a static call: a tensor ",
                 b.held[i].shape(), " it saved was modified in place (version ", b.versions[i],
                 " -> ", b.held[i].version(), ")");
  p.allocate_escapes(b, Phase::Backward);
  p.bind(b, Phase::Backward);
  std::vector<StepSnapshot> snaps;
  p.run(b, Phase::Backward, f.verify ? &snaps : nullptr);
  b.backward_done = true;
  if (f.verify) compare_runs(f.entry->name, p, f.verify->rec, snaps, Phase::Backward);
  const std::vector<Operand>& grads = p.grads();
  for (size_t j = 0; j < grads.size(); ++j)
    ctx.set_input_grad(static_cast<int>(j),
                       tensor_on(b.own[p.escape_slot(grads[j].buf)], grads[j]));
}

}  // namespace

// Runs the function eagerly under a recorder that keeps every op's values, then undoes what it
// changed (state updated in place, .grad, the random streams) so the replay starts from the
// same state.
std::unique_ptr<VerifyState> StaticGraph::Impl::run_for_verify(const Entry& e,
                                                               std::span<const Tensor> args) {
  {
    std::lock_guard<std::mutex> l(mu);
    ++stats.verifications;
  }
  const Recording& rec = e.plan->recording();
  std::vector<std::pair<Tensor, std::vector<unsigned char>>> saved;
  Tensor scratch;
  for (int buf : e.plan->mutated_external()) {
    const Tensor* t = bound_tensor(e, rec.buffers[buf], args, scratch);
    if (t == nullptr || !t->defined()) continue;
    std::vector<unsigned char> bytes(t->nbytes());
    cuda::copy_bytes(bytes.data(), Device::cpu(), t->raw_data(), t->device(), bytes.size());
    saved.emplace_back(*t, std::move(bytes));
  }
  std::vector<std::pair<Tensor, IntrusivePtr<TensorImpl>>> grads;
  for (const Leaf& l : rec.leaves) {
    const Tensor& t = leaf_now(e, l);
    if (t.defined()) grads.emplace_back(t, t.impl()->grad);
  }
  Generator& gen = default_generator(e.plan->device());
  const Generator::Stream gen_state = gen.state();

  auto vs = std::make_unique<VerifyState>();
  vs->recorder = std::make_unique<Recorder>(vs->rec, config.name, false, true);
  vs->inner = run_recorded(*vs->recorder, args, e.slots, vs->aliases);
  for (auto& [t, bytes] : saved)
    cuda::copy_bytes(t.raw_data(), t.device(), bytes.data(), Device::cpu(), bytes.size());
  for (auto& [t, gimpl] : grads) t.impl()->grad = gimpl;
  gen.set_state(gen_state);
  std::erase_if(vs->inner, [](const Tensor& t) { return !t.requires_grad(); });
  return vs;
}

void StaticGraph::Impl::replay(const std::shared_ptr<Entry>& e, std::span<const Tensor> args,
                               std::vector<Tensor>& results, bool verify) {
  profiler::ScopedSpan span({}, profiler::SpanKind::ForwardReplay);
  if (span.recording()) {
    span.set_name(span_name(*e, profiler::SpanKind::ForwardReplay));
    std::call_once(e->span_args_once, [&] {
      e->span_args = intern(cat("signature: ", describe(e->sig, config), "; arena bytes ",
                                e->plan->memory().arena_bytes, "; steps ", e->plan->forward_steps(),
                                " forward, ", e->plan->backward_steps(), " backward"));
    });
    span.set_args(e->span_args);
  }
  Plan& p = *e->plan;
  const Recording& rec = p.recording();
  std::unique_ptr<VerifyState> vs;
  std::vector<StepSnapshot> snaps;
  if (verify) vs = run_for_verify(*e, args);

  for (int li : e->early_clear) leaf_now(*e, rec.leaves[li]).impl()->grad.reset();
  CallState* b = p.acquire();
  struct ReleaseOnError {
    Plan& p;
    CallState*& b;
    ~ReleaseOnError() {
      if (b != nullptr) p.release(b);
    }
  } guard{p, b};
  Tensor scratch;
  for (int buf : p.external_buffers()) {
    const Tensor* t = bound_tensor(*e, rec.buffers[buf], args, scratch);
    if (t != nullptr) b->ptrs[buf] = t->raw_data();
  }
  p.allocate_escapes(*b, Phase::Forward);
  p.bind(*b, Phase::Forward);
  p.run(*b, Phase::Forward, verify ? &snaps : nullptr);
  // In-place writes to bound tensors count as eager's do. A verified call's eager run already
  // bumped their versions (its state restore does not), and the tensors it saved for backward
  // were saved at those versions.
  if (!verify) {
    for (int buf : p.mutated_external()) {
      const Tensor* t = bound_tensor(*e, rec.buffers[buf], args, scratch);
      if (t != nullptr) t->impl()->storage->bump_version();
    }
  }
  // What the backward reads outside the arena stays alive, and must not change, until then.
  for (int buf : p.backward_reads()) {
    const Tensor* t = bound_tensor(*e, rec.buffers[buf], args, scratch);
    b->held.push_back(*t);
    b->versions.push_back(t->version());
  }
  for (const Leaf& l : rec.leaves) {
    if (l.final_grad == Leaf::kUntouched) continue;
    const Tensor& leaf = leaf_now(*e, l);
    leaf.impl()->grad = l.final_grad == Leaf::kCleared
                            ? IntrusivePtr<TensorImpl>()
                            : grad_tensor(*b, p, *e, l.final_grad, leaf).impl_ptr();
  }
  results.clear();
  results.reserve(p.results().size());
  for (const Operand& r : p.results()) {
    if (p.escape_slot(r.buf) < 0) {  // a view of a tensor bound to this call
      const Tensor* t = bound_tensor(*e, rec.buffers[r.buf], args, scratch);
      results.push_back(Tensor(
          make_intrusive<TensorImpl>(t->impl()->storage, t->impl()->offset, r.shape, r.dtype)));
      continue;
    }
    results.push_back(tensor_on(b->own[p.escape_slot(r.buf)], r));
  }
  if (verify) compare_runs(config.name, p, vs->rec, snaps, Phase::Forward);

  if (!e->node) return;  // the guard releases the call state
  auto frame = make_intrusive<Frame>();
  frame->entry = e;
  frame->plan = e->plan;
  frame->state = b;
  b = nullptr;
  if (verify) {
    vs->recorder->set_phase(Phase::Backward);
    for (const Leaf& l : rec.leaves) vs->leaves.push_back(leaf_now(*e, l));
    frame->verify = std::move(vs);
  }
  IntrusivePtr<Node> n =
      subgraph_node(label, &replay_backward, rec.contributions.size(), rec.differentiable.size());
  for (const Recording::Contribution& c : rec.contributions)
    add_input(*n, c.arg ? args[c.index] : leaf_now(*e, rec.leaves[c.index]));
  for (int k : rec.differentiable) add_output(n, *results[k].impl());
  n->payload = std::move(frame);
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
}

StaticStats StaticGraph::stats() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  StaticStats s = impl_->stats;
  s.entries = static_cast<int>(impl_->entries.size());
  for (const auto& e : impl_->entries) {
    const EntryState state = e->load_state();
    EntryReport r;
    r.id = e->id;
    r.signature = describe(e->sig, impl_->config);
    r.complete = state == EntryState::Ready;
    r.eager_only = state == EntryState::Eager;
    r.hits = e->hits;
    if (state == EntryState::Ready) {
      const MemoryPlan& m = e->plan->memory();
      r.forward_steps = e->plan->forward_steps();
      r.backward_steps = e->plan->backward_steps();
      r.arena_bytes = m.arena_bytes;
      r.lower_bound_bytes = m.lower_bound_bytes;
      r.naive_bytes = m.naive_bytes;
      r.in_place_steps = m.in_place_steps;
      r.arenas = e->plan->arenas();
      const GraphStats gs = e->plan->graph_stats();
      r.graph_launches = gs.launches;
      r.graph_captures = gs.captures;
      r.stream_replays = gs.stream_replays;
      r.graph_fallback = gs.fallback;
    }
    s.cache.push_back(std::move(r));
  }
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
  }
  return {};
}

std::string memory_text(const Plan& p) {
  const MemoryPlan& m = p.memory();
  return cat("arena ", m.arena_bytes, " bytes (lower bound ", m.lower_bound_bytes, ", naive sum ",
             m.naive_bytes, "); ", m.in_place_steps, " steps in place; ", p.arenas(),
             p.arenas() == 1 ? " arena" : " arenas", " allocated");
}

// "40 graph launches, 2 captures, 0 stream replays[; graphs off: why]".
std::string graph_counts(int64_t launches, int64_t captures, int64_t replays,
                         const std::string& fallback) {
  return cat(launches, launches == 1 ? " graph launch, " : " graph launches, ", captures,
             captures == 1 ? " capture, " : " captures, ", replays,
             replays == 1 ? " stream replay" : " stream replays",
             fallback.empty() ? std::string() : cat("; graphs off: ", fallback));
}
}  // namespace

std::string EntryReport::graph_text() const {
  if (graph_launches == 0 && graph_captures == 0 && stream_replays == 0 && graph_fallback.empty())
    return {};
  return graph_counts(graph_launches, graph_captures, stream_replays, graph_fallback);
}

std::string StaticGraph::schedule_text() const {
  const Config& config_ = impl_->config;
  const std::vector<Listed> es = entries_by_id(*impl_);
  std::string out = cat("static function '", config_.name, "': ", es.size(),
                        es.size() == 1 ? " cache entry\n" : " cache entries\n");
  for (const auto& [e, state, hits] : es) {
    out += cat("\nentry ", e->id, " (traced at call ", e->traced_call, ", ", hits,
               hits == 1 ? " replay" : " replays", "): ", describe(e->sig, config_), "\n");
    if (std::string why = no_schedule(*e, state); !why.empty()) {
      out += cat("  ", why, "\n");
      continue;
    }
    out += cat("  ", memory_text(*e->plan), "\n");
    if (e->plan->device().type == DeviceType::CUDA) {
      const GraphStats gs = e->plan->graph_stats();
      out += cat("  on ", e->plan->device(), ": ",
                 graph_counts(gs.launches, gs.captures, gs.stream_replays, gs.fallback), "\n");
    }
    out += e->plan->steps_text(names_of(*e, config_), "  ");
  }
  return out;
}

std::string StaticGraph::schedule_dot() const {
  const Config& config_ = impl_->config;
  std::string out = cat("digraph ", dot_quote(cat("static function '", config_.name, "'")),
                        " {\n  graph [fontname=\"monospace\", fontsize=10];\n"
                        "  node [fontname=\"monospace\", fontsize=10];\n"
                        "  edge [fontname=\"monospace\", fontsize=9];\n");
  for (const auto& [e, state, hits] : entries_by_id(*impl_)) {
    const std::string prefix = cat("e", e->id, "_");
    std::string label = cat("entry ", e->id, ": ", describe(e->sig, config_));
    const std::string why = no_schedule(*e, state);
    label += "\n" + (why.empty() ? memory_text(*e->plan) : why);
    out += cat("  subgraph cluster_e", e->id, " {\n    label=", dot_quote(label), ";\n");
    if (why.empty())
      out += e->plan->steps_dot(names_of(*e, config_), prefix);
    else
      out += cat("    ", prefix, "none [shape=plaintext, label=", dot_quote(why), "];\n");
    out += "  }\n";
  }
  return out + "}\n";
}

std::vector<StaticStats> report_all() {
  // Under the registry's lock, so no function is destroyed meanwhile (a function's own lock is
  // never held while the registry's is taken).
  std::lock_guard<std::mutex> l(g_mu);
  std::vector<StaticStats> out;
  for (StaticGraph* g : g_registry) out.push_back(g->stats());
  return out;
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
    std::snprintf(line, sizeof line, "%-20s %8lld %7lld %8lld %7lld %8d %9lld %12lld %12lld\n",
                  s.name.substr(0, 20).c_str(), static_cast<long long>(s.calls),
                  static_cast<long long>(s.traces), static_cast<long long>(s.hits),
                  static_cast<long long>(s.eager_calls), s.entries,
                  static_cast<long long>(s.evictions), static_cast<long long>(arena),
                  static_cast<long long>(lower));
    out += line;
    for (const RetraceEvent& ev : s.traces_history) out += "  " + ev.message + "\n";
    for (const std::string& w : s.warnings) out += "  warning: " + w + "\n";
  }
  return out;
}

}  // namespace encore::schedule
