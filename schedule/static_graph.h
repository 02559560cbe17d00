// The static-graph engine: signature cache, trace, plan and replay of one static function.
// Users reach it through api/encore/static_graph.h (static_graph(), ENCORE_STATIC_GRAPH).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace encore::schedule {

enum class OnUnsafe { Error, Eager };

// Which argument dimensions may serve every size with one schedule (shape_family.h).
enum class DynamicShapes : uint8_t {
  // A dimension whose value changes between two traces of the function becomes dynamic once the
  // two traces agree on everything but sizes and every size in them is explained by the
  // dimensions; later sizes are planned from the trace without running the function.
  Automatic,
  // Only the dimensions in dynamic_dims may become dynamic (like torch's mark_dynamic, or a None
  // in a tf.function input signature); every other size is its own signature.
  Explicit,
  // Every size is its own signature (each traces once).
  Off,
};

// Dimension `dim` of argument `arg` (by position).
struct DynamicDim {
  int arg = 0;
  int dim = 0;
};

// A watched parameter: read through its slot on every call, so a replaced tensor is rebound.
struct ParamSlot {
  std::string name;
  Tensor* slot = nullptr;
};

struct Config {
  std::string name = "static";
  int cache_limit = 8;
  OnUnsafe on_unsafe = OnUnsafe::Error;
  int verify_every = 0;
  std::vector<std::string> arg_names;
  // Train/eval mode of the watched modules and all their descendants: -1 none, 0 all eval, 1 all
  // train, 2 and up one code per mix of the two.
  std::function<int64_t()> mode;
  // A mix (a `mode` of 2 and up) in words, naming the modules in the fewer of the two modes.
  std::function<std::string(int64_t)> mode_text;
  // The watched parameters (called at every trace).
  std::function<std::vector<ParamSlot>()> params;
  // A number that changes whenever a module anywhere gains a parameter, buffer or child: the
  // calls after a change compare the watched modules' tree and parameters with each entry's (a
  // layer added to a watched Sequential after its trace traces again).
  std::function<uint64_t()> structure;
  // The watched modules and their descendants, depth first (called at every trace, and after a
  // change of `structure`).
  std::function<std::vector<const void*>()> tree;
  DynamicShapes dynamic = DynamicShapes::Automatic;
  std::vector<DynamicDim> dynamic_dims;  // DynamicShapes::Explicit
  // Sizes a dynamic family keeps planned (least recently used evicted: its next call plans
  // again, without tracing).
  int size_limit = 16;
};

struct RetraceEvent {
  int64_t trace = 0;  // 1 for the first trace, 2 for the first retrace, ...
  int64_t call = 0;   // the call (1-based) that traced
  double cost_ms = 0;
  std::string reason;   // "first call", "argument 0 'x' dim 0 changed 32 -> 17", ...
  int entries = 0;      // cache entries after the trace
  std::string message;  // the full line as ENCORE_LOG=retrace prints it
};

// One cache entry: its signature and memory plan.
struct EntryReport {
  int64_t id = 0;           // the trace that made it (1, 2, ...): "[entry 2]" in dumps, profiles
  std::string signature;    // "x: float32[32,784] requires_grad; grad on; train; key ''"
  bool complete = false;    // schedules planned (a grad-mode forward waits for its backward)
  bool eager_only = false;  // unsafe trace run eagerly (OnUnsafe::Eager)
  int forward_steps = 0;
  int backward_steps = 0;
  int64_t arena_bytes = 0;        // one arena (a call before its backward holds one)
  int64_t lower_bound_bytes = 0;  // the largest total of planned bytes alive at one step
  int64_t naive_bytes = 0;        // every planned intermediate in its own buffer
  int64_t in_place_steps = 0;     // steps writing over an input that dies there
  int64_t arenas = 0;             // arenas allocated (more than one: calls before backward)
  int64_t hits = 0;
  // CUDA replay: schedules launched as one CUDA graph, graphs captured (per arena, and again
  // when bound addresses change), schedules replayed kernel by kernel on the stream (graphs off,
  // profiling, verify, or a failed capture), and why capture stopped (empty: it did not).
  int64_t graph_launches = 0;
  // Of them, launches of graphs that read the call's arguments where they are (no copies).
  int64_t graph_direct_launches = 0;
  int64_t graph_captures = 0;
  // CPU replay: phases replayed on two lanes (two threads, see set_static_lanes_enabled).
  int64_t lane_replays = 0;
  int64_t stream_replays = 0;
  // Captures that failed (each retried on a new arena or with new addresses, at most 3 before
  // graphs go off: graph_fallback), launches whose argument copies could not take a call's
  // sources (that call replayed on the stream), and why the last one failed.
  int64_t graph_capture_failures = 0;
  std::string graph_last_failure;
  std::string graph_fallback;
  // Captures put off to the next call because a kernel had yet to make a plan (a cuDNN or
  // cuBLASLt algorithm for a new size or alignment; that phase replayed on the stream and made
  // it), and why the last one was.
  int64_t graph_deferred_captures = 0;
  std::string graph_last_deferral;
  // A line for reports, as schedule_text() shows it: "40 graph launches, 2 captures, 0 stream
  // replays", with "; graphs off: <why>" after a failed capture ("" on the cpu).
  std::string graph_text() const;
};

// A family of dynamic shapes: one trace serving every size of some argument dimensions.
struct DynamicReport {
  int64_t id = 0;                 // the trace that completed it
  std::string signature;          // "x: float32[s0,784]; grad on; train"
  std::vector<std::string> dims;  // "argument 0 'x' dim 0 = s0"
  // Sizes an automatic family plans only between traced ones (StaticOptions::dynamic): "step 0
  // (forward) slice's stop, 2 at every traced size, keeps s0 within 8 to 11".
  std::vector<std::string> ranges;
  std::vector<int64_t> traces;    // the traces it was checked against (its evidence)
  int64_t hits = 0;               // calls it served (a size's first call, planning it, included)
  int64_t sizes_planned = 0;      // sizes planned from it without running the function
  int64_t evictions = 0;          // planned sizes evicted (size_limit)
  // On the cpu the planned sizes share their arenas: a call takes a block big enough for its
  // size's arena and gives it back as it ends. The bytes of those blocks (one per call under
  // way at once, as big as the largest size's arena needed).
  int64_t shared_arena_bytes = 0;
  // The planned sizes, most recently used first: their signature is "s0=17", their arena and
  // replays as for a cache entry.
  std::vector<EntryReport> sizes;
};

struct StaticStats {
  std::string name;
  int64_t calls = 0;   // every call, eager ones included
  int64_t traces = 0;  // calls that traced
  int64_t hits = 0;    // calls that replayed
  // Calls run eagerly: switch off, unsafe, nested, waiting for the first backward, or while
  // another thread traces their signature.
  int64_t eager_calls = 0;
  int64_t evictions = 0;
  int64_t verifications = 0;     // replays checked against eager
  int64_t failed_backwards = 0;  // recorded first backwards that failed (each retraces)
  int entries = 0;
  std::vector<RetraceEvent> traces_history;  // the first trace and the latest (up to 64)
  // Retrace storms, evictions, unsafe traces, failed first backwards: the first and the latest
  // (up to 64); `warnings_dropped` counts those left out.
  std::vector<std::string> warnings;
  int64_t warnings_dropped = 0;
  std::vector<EntryReport> cache;  // most recently used first
  // Dynamic shapes: dimensions that became dynamic (each such event, not counted in `traces`
  // beyond the trace that showed it), sizes planned from a family without tracing, the
  // families, and the dimensions that stay static with why ("argument 0 'x' dim 0 stays static:
  // step 7 (forward) relu: ...").
  int64_t dynamic_events = 0;
  int64_t sizes_planned = 0;
  std::vector<DynamicReport> dynamic;
  std::vector<std::string> dynamic_history;  // the "became dynamic" lines (up to 64)
  std::vector<std::string> static_dims;
};

// The process-wide switch (ENCORE_STATIC=0 starts it off).
bool set_enabled(bool on);
bool enabled();
// Whether signatures traced from now on fuse runs of elementwise steps of their cpu plans
// (ENCORE_STATIC_FUSE=0 starts it off). Returns the previous setting.
bool set_fusion_enabled(bool on);
bool fusion_enabled();
// Whether signatures traced from now on move each optimizer update of their plans to right after
// the last step it depends on, and write a zero-filled buffer's first add_ at once
// (ENCORE_STATIC_EARLY_UPDATES=0 starts it off). Returns the previous setting.
bool set_early_updates_enabled(bool on);

// How every CUDA plan of the process has replayed so far: phases launched as CUDA graphs, graphs
// captured, phases replayed kernel by kernel on the stream, and captures that failed (after which
// that plan replays on the stream). Of the stream replays: `deferred`, captures put off until a
// library plan exists; `verified`, replays checked against eager step by step (verify mode).
// Of the launches, `direct`: of graphs that read the arguments where they are. Tests take the
// difference around a scenario.
struct GraphUseCounts {
  int64_t launches = 0, captures = 0, stream_replays = 0, fallbacks = 0, deferred = 0;
  int64_t forked = 0;  // captures whose graph forks (a phase's lanes on several streams)
  int64_t verified = 0;
  int64_t direct = 0;
};
GraphUseCounts graph_use_counts();
// Whether a CUDA plan's graphs read the arguments and incoming gradients of a call where they are
// once an arena has seen their addresses before (on by default; ENCORE_CUDA_GRAPH_DIRECT_ARGS=0
// starts it off), rather than copying them into staging buffers first at every launch. Returns
// the previous setting.
bool set_graph_direct_arguments_enabled(bool on);
bool graph_direct_arguments_enabled();
// For tests: the next `n` CUDA-graph captures of the process fail (after capturing, as one that
// allocated would), so that a test sees a failed capture replayed on the stream and retried.
void fail_next_graph_captures(int n);
// For tests: the next `n` fused programs planned are refused as a backend refuses one it cannot
// compile (CUDA without NVRTC), so that a test sees a run's steps put back, on any device.
void refuse_next_fused_programs(int n);
bool early_updates_enabled();
// Whether signatures traced from now on get a two-lane schedule for their cpu plans, replayed on
// two threads when num_threads() is 2 (ENCORE_STATIC_LANES=0 starts it off). Returns the previous
// setting.
bool set_lanes_enabled(bool on);
bool lanes_enabled();
// Whether signatures traced from now on lay a convolution's output out padded in their cpu plans
// where only stride-1 convolutions read it, so they read it in place (ENCORE_STATIC_PADDED=0
// starts it off). Returns the previous setting.
bool set_padded_layouts_enabled(bool on);
bool padded_layouts_enabled();
// Whether signatures traced from now on fold activations into the steps producing their inputs
// (and their gradients likewise) and run max pooling before a ReLU in their cpu plans
// (ENCORE_STATIC_FOLD=0 starts it off). Returns the previous setting.
bool set_fold_activations_enabled(bool on);
bool fold_activations_enabled();
// Whether signatures traced from now on bind the results of steps that compute constants from
// values the function makes itself (a causal mask from arange) to their values at the trace
// instead of replaying those steps (ENCORE_STATIC_FOLD_CONSTANTS=0 starts it off). Returns the
// previous setting.
bool set_fold_constants_enabled(bool on);
bool fold_constants_enabled();
// Whether signatures traced from now on fold chains of layout steps into strided copies, where
// fusion is on too (ENCORE_STATIC_FOLD_LAYOUTS=0 starts it off). Returns the previous setting.
bool set_fold_layouts_enabled(bool on);
bool fold_layouts_enabled();
// Whether signatures traced from now on fold a linear's Adam updates into its gradients' step on
// the cpu too (ENCORE_STATIC_FOLD_CPU_UPDATES=1 starts it on; CUDA plans always do, under
// set_fold_activations_enabled). Returns the previous setting.
bool set_fold_cpu_updates_enabled(bool on);
bool fold_cpu_updates_enabled();
// Whether calls from now on may make argument dimensions dynamic and be served by dynamic
// families (Config::dynamic; ENCORE_STATIC_DYNAMIC=0 starts it off). Off, every size is a
// signature of its own, as with DynamicShapes::Off. Returns the previous setting.
bool set_dynamic_enabled(bool on);
bool dynamic_enabled();
// Where warnings and retrace lines go (stderr by default). Returns the previous sink. A sink
// that throws fails no call: the line and what it threw go to stderr.
using LogSink = std::function<void(const std::string&)>;
LogSink set_log_sink(LogSink sink);
// Whether each retrace is printed as it happens (ENCORE_LOG=retrace starts it on).
bool set_log_retraces(bool on);
// Whether signatures traced from now on put red zones (guard bytes) after their arena blocks and
// check them after every replayed step (ENCORE_STATIC_REDZONE=1 starts it on; verify mode
// always does). Returns the previous setting.
bool set_redzones_enabled(bool on);
bool redzones_enabled();

// A traced forward as exporters read it (recording.h).
struct ForwardTrace;

class StaticGraph {
 public:
  // Runs the user's function on `args`, appending its results.
  using Body = std::function<void(std::span<const Tensor> args, std::vector<Tensor>& results)>;

  StaticGraph(Body body, Config config);
  ~StaticGraph();
  StaticGraph(const StaticGraph&) = delete;
  StaticGraph& operator=(const StaticGraph&) = delete;

  // One call: replays the entry of this signature, or traces a new one.
  void call(std::span<const Tensor> args, const std::string* key, std::vector<Tensor>& results);

  StaticStats stats() const;
  // Every cache entry's schedules as text: its signature and memory plan, then each forward
  // and backward step with its operands (dtype, shape, where each lives, in-place marks).
  std::string schedule_text() const;
  // The same as a Graphviz digraph: a cluster per entry, in it one per schedule.
  std::string schedule_dot() const;
  void clear();
  const Config& config() const;
  // The forward of an eval entry, its steps as traced (before any pass): the most recently used
  // planned entry with its modules in eval mode (or, with no modules, grad mode off) that ran no
  // backward; with `like` given, the one whose arguments have their shapes and dtypes. Null when
  // there is none.
  std::shared_ptr<const ForwardTrace> eval_forward(std::span<const Tensor> like = {}) const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// Every live StaticGraph's stats, in creation order.
std::vector<StaticStats> report_all();
std::string report_table();

}  // namespace encore::schedule
