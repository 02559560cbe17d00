// A Plan: a Recording made executable. Passes: outputs that leave the call get their own
// storage (a Copy where they alias something else), dead steps are dropped, activations fold into
// the steps producing their inputs (cpu plans), chains of layout steps become strided copies,
// all-reduce starts move as early as their gradients allow, optimizer updates move to right after
// the last step they depend on, elementwise steps write over an input that dies there, and every
// other temporary gets an offset in one arena (liveness over forward and backward together,
// placed largest first into the best-fitting gap). run() replays a phase's steps over a call's
// arena with no lookups or allocation.
//
// Where each part lives: the passes in passes.cc, activation rewrites in rewrites.cc, layout
// folds in layout_folds.cc, update folds in update_folds.cc (all through rewriter.h), early
// all-reduce starts in early_collectives.cc, early updates in early_updates.cc, elementwise fusion
// in fusion.cc, padded layouts in padded_layouts.cc, placement in memory_plan.cc, the executor
// (compiled steps, call states, the replay loop) in executor.cc, the two-lane schedule and replay
// in lanes.cc, CUDA-graph replay in cuda_graph.cc, the schedule dump in dump.cc.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "runtime/cuda.h"
#include "runtime/dispatcher.h"
#include "runtime/fused.h"
#include "runtime/parallel.h"
#include "runtime/strided_copy.h"
#include "schedule/arena_pool.h"
#include "schedule/lane_schedule.h"
#include "schedule/memory_plan.h"
#include "schedule/recording.h"

namespace encore::schedule {

struct ExecStep {
  Op op;
  KernelFn fn;
  AttrBlob attrs;
  uint32_t view = 0;  // first input view; outputs follow the inputs
  uint32_t n_in = 0;  // any number: a foreach optimizer update takes five per parameter
  uint32_t n_out = 0;
  bool random = false;  // draws fresh numbers on every run
  uint64_t random_count = 0;
  int trace_index = 0;  // its position in the recording's forward then backward lists
  int live = -1;        // reads CallState::live_attrs[live], not `attrs` (Step::live)
};

// How a recording is planned.
struct PlanOptions {
  // Fuse runs of elementwise steps, and chains of layout steps into strided copies.
  bool fuse = true;
  bool redzones = false;  // guard bytes after every arena block, checked after every step
  // Optimizer updates move to right after the steps they depend on; a zero fill_ and the add_
  // into it become one step.
  bool early_updates = true;
  // A lane schedule (lanes.cc): a cpu plan replays its two lanes when num_threads() is 2; a CUDA
  // plan's graphs run its lanes (cuda::graph_streams() of them) on as many streams, side by
  // side on the device.
  bool lanes = true;
  // A cpu plan lays out a convolution's output padded where only stride-1 convolutions read it
  // (padded_layouts.cc).
  bool padded_layouts = true;
  // A cpu plan folds activations into the products and convolutions that feed them, their
  // gradients into the products that feed those, a linear's bias gradient into its weight
  // gradient, a loss's gradient into the product reading it, and runs max pooling before a ReLU
  // (rewrites.cc, loss_folds.cc); a CUDA plan folds all but the pooling into small products
  // (runtime/small_gemm.h), and Adam updates into the weight gradients they read
  // (update_folds.cc; a cpu plan too with fold_cpu_updates).
  bool fold_activations = true;
  // Steps that compute constants from values the function makes itself (a causal mask from
  // arange) are not replayed: their outputs are bound to their values at the trace.
  bool fold_constants = true;
  // Chains of layout steps whose intermediate values only the chain reads become strided copies
  // (layout_folds.cc), where `fuse` is on too.
  bool fold_layouts = true;
  // A linear's Adam updates join its gradients' step (update_folds.cc) in a cpu plan too, where
  // fold_activations is on (a CUDA plan's always do): off by default, since on two lanes the
  // updates then no longer run beside the next gradients' products.
  bool fold_cpu_updates = false;
};

// A buffer a plan laid out padded (padded_layouts.cc): [N, C, H, W] as planes of hp x wp with the
// values at row pad_h, column pad_w, images `image` elements apart (0: not padded).
struct PaddedBuffer {
  int64_t pad_h = 0, pad_w = 0, hp = 0, wp = 0, image = 0;
};

// Verify mode: appends the values of a padded Conv2d or Conv2dAct output `y` (kConvPaddedOutput),
// its [N, C, H, W] interior without the border, as a dense buffer holds them.
void append_padded_interior(std::vector<unsigned char>& bytes, const BufferView& y,
                            const Conv2dAttrs& a);

// One entry of a lane's program (lanes.cc): a step this lane runs, after waiting for the steps of
// the other lane in [waits_begin, waits_end) of the plan's wait list. A wide step is in both
// programs: lane 0 runs it, lane 1 runs the chunks of its loops lane 0 hands over.
struct LaneEntry {
  int32_t step = 0;
  bool wide = false;
  uint32_t waits_begin = 0, waits_end = 0;
};

// Arena blocks start at multiples of the plan's alignment: a block is its buffer's size rounded
// up, then its red zone, if any (the guard begins right after the buffer's last byte), rounded
// up again. 64 bytes (a cache line) on the cpu; on a CUDA device 256, as the caching allocator
// aligns eager buffers: cuBLAS and cuDNN may choose other kernels for other alignments, and a
// replay must compute what eager computes.
constexpr int64_t kArenaAlign = 64;
constexpr int64_t kCudaArenaAlign = 256;
inline int64_t arena_aligned(size_t n, int64_t align = kArenaAlign) {
  return (static_cast<int64_t>(n) + align - 1) / align * align;
}
// Red zones: the guard after each arena block, and the byte it is filled with before every step
// that writes the block.
constexpr int64_t kRedzoneBytes = 64;
constexpr unsigned char kRedzoneFill = 0xCB;

// Verify mode: what a replayed step wrote (its outputs, or the inputs it updates in place), and
// the recorded step that wrote them eagerly (-1: a copy added by the plan). A fused step gives
// one per output: `output` says which output of the recorded step it is (a layer_norm's y, mean
// or rstd); -1: all the recorded step wrote.
struct StepSnapshot {
  int trace_index = -1;
  std::vector<unsigned char> bytes;
  int output = -1;
  int group = -1;  // an update's group of inputs whose writes the bytes hold (the plan split it)
};

// A schedule phase captured as a CUDA graph for one set of buffer addresses.
struct CapturedGraph {
  std::vector<void*> key;  // the addresses of the phase's non-arena views at capture
  // It reads the phase's arguments and incoming gradients where the callers have them (their
  // addresses are in `key`), rather than from staging copies it makes first.
  bool direct = false;
  cuda::Graph graph;
  uint64_t last_use = 0;
  int64_t launches = 0;
};

// Runs of a phase on an arena whose graph keys a later run recognises (CallState::recent_keys).
constexpr size_t kRecentKeys = 4;

// Per-call working state of one arena; reused by later calls once released. A CallState belongs
// to one call at a time (Plan::acquire to Plan::release), so nothing in it is shared between
// threads.
struct CallState {
  void* arena = nullptr;
  std::vector<BufferView> views;
  std::vector<void*> ptrs;                 // per buffer, this call's address
  std::vector<IntrusivePtr<Storage>> own;  // per escaping buffer (by escape slot)
  std::vector<Tensor> held;                // bound tensors a backward reads
  std::vector<uint32_t> versions;          // of `held`, at forward time
  std::vector<uint32_t> escape_versions;   // of the escaping storages a backward reads
  // Per host guard of the recording, its attributes for this call where it is live (else unset).
  std::vector<AttrBlob> live_attrs;
  bool backward_done = false;
  // Two-lane replay: per step, the number of the last run that finished it.
  std::unique_ptr<std::atomic<uint32_t>[]> done;
  uint32_t runs = 0;

  // CUDA. The stream of this arena's last run (and its stream_serial): a call on another stream
  // first waits for it, since the host returns before the device has finished with the arena.
  cuda::StreamHandle stream = nullptr;
  uint64_t stream_serial = 0;
  // Escaping storages kept for reuse once the caller has dropped them (same addresses,
  // so a captured graph stays valid), per escape slot.
  std::vector<std::vector<IntrusivePtr<Storage>>> escape_pool;
  // Per escape slot: the buffer the steps write when every pooled storage is still held, and
  // the (buffer, slot) pairs of this run to copy from it into the call's own storage.
  std::vector<IntrusivePtr<Storage>> escape_fixed;
  std::vector<std::pair<int, int>> copy_out;
  // Graph replay: the graphs read arguments and incoming gradients from staging copies (their
  // callers' addresses change every call), and random steps their {seed, offset} from
  // random_state, written before each launch.
  std::vector<IntrusivePtr<Storage>> staging;  // per staged buffer (by stage slot)
  std::vector<void*> staged;  // per stage slot, where in its staging buffer this call's copy is
  std::vector<cuda::GraphCopy> graph_copies;  // the phase's copies into staging, this call's
  IntrusivePtr<Storage> random_state;
  bool forward_staged = false;  // this call's forward filled the staging buffers
  std::vector<uint64_t> random_host;
  PerPhase<std::vector<CapturedGraph>> graphs;
  // Per phase with live attributes, those of this arena's first run of it. Once a run's differ
  // (`live_varies`: a schedule changed a rate), the phase's graphs read them from live_device (an
  // AttrBlob per host guard, copied from live_attrs before each launch) rather than capturing
  // them, and `device_live` tells run_step so during such a run.
  PerPhase<std::vector<AttrBlob>> first_live;
  PerPhase<bool> live_varies;
  IntrusivePtr<Storage> live_device;
  bool device_live = false;
  // Per phase, a ring of the keys of its last runs on this arena that no direct graph served, with
  // the callers' addresses of the staged buffers: a key seen there again gets a graph that reads
  // those where they are (CapturedGraph::direct).
  PerPhase<std::array<std::vector<void*>, kRecentKeys>> recent_keys;
  PerPhase<uint32_t> recent_next;
  // Per phase, direct graphs evicted having launched only at their capture.
  PerPhase<int> wasted_direct;
  // Addresses whose capture failed on this arena: replayed on the stream, not captured again.
  PerPhase<std::vector<std::vector<void*>>> failed_keys;
  cuda::EventTimeline timeline;  // profiled CUDA runs
};

// How a plan's CUDA replays ran.
struct GraphStats {
  int64_t launches = 0;          // phases replayed as one CUDA-graph launch
  int64_t direct_launches = 0;   // of them, of graphs that read the arguments where they are
  int64_t captures = 0;          // graphs captured (a new arena, or new addresses of bound tensors)
  int64_t stream_replays = 0;    // phases replayed kernel by kernel on the stream
  // Captures that failed (each retried on a new arena or addresses), and launches whose first
  // copies could not take a call's sources (that call replayed on the stream).
  int64_t capture_failures = 0;
  std::string last_failure;  // why the last one failed
  // Captures dropped because a kernel had yet to make a plan (cuda::NotReadyForCapture): the
  // phase ran on the stream instead, and the next call captured. Not failures.
  int64_t deferred_captures = 0;
  std::string last_deferral;  // why the last one was
  std::string fallback;       // why this plan stopped capturing for good (empty: it did not)
};

class Plan {
 public:
  // Plans `rec` (forward and, when recorded, backward). Consumes the recording's steps.
  Plan(std::shared_ptr<Recording> rec, PlanOptions options);
  ~Plan();

  const Recording& recording() const { return *rec_; }
  const MemoryPlan& memory() const { return memory_; }
  int forward_steps() const { return n_forward_; }
  int backward_steps() const { return static_cast<int>(steps_.size()) - n_forward_; }
  const std::vector<ExecStep>& steps() const { return steps_; }
  // The steps as recorded (before the passes), forward then backward; verify compares them.
  const std::vector<Step>& trace_steps() const { return trace_steps_; }
  int recorded_forward() const { return recorded_forward_; }
  // Per buffer: its escape slot (own storage each call), or -1.
  int escape_slot(int buf) const { return escape_[buf]; }
  // Arenas allocated so far (one per call that was under way at once).
  int arenas() const;
  // Buffers of the forward results (after the Copy pass) and of the gradients. A result is in
  // an escaping buffer, or in a bound one (argument, parameter, external): a view of it.
  const std::vector<Operand>& results() const { return results_; }
  const std::vector<Operand>& grads() const { return grads_; }
  // Buffers outside the arena a step reads or writes, with where in the views they go.
  const std::vector<int>& external_buffers() const { return external_; }
  // Buffers written in place that live outside the call (version counters bumped per call).
  const std::vector<int>& mutated_external() const { return mutated_external_; }
  // Bound buffers the backward reads (held by a call until its backward, and checked then
  // not to have been written in place since the forward, as eager checks what it saved).
  const std::vector<int>& backward_reads() const { return backward_reads_; }
  // A cpu plan's checks of input values (labels, ids: runtime/value_checks.h) that its forward
  // steps make on bound buffers (arguments, parameters, externals the forward does not write),
  // in step order: a replay makes them before it changes any state, so a bad label fails the
  // call as eagerly and leaves everything as it was (the steps would fail midway, after updates
  // the lanes or early updates ran ahead of them, and after dropping the .grad it replaces).
  struct ValueCheck {
    Op op;
    AttrBlob attrs;
    int buf;
    DType dtype;
    int64_t n, bound;  // values, and the classes or rows they must be below
  };
  const std::vector<ValueCheck>& value_checks() const { return value_checks_; }
  // Whether a forward step checks values the call computes or writes (no check ahead: it may
  // fail midway), so the replay keeps the .grad its step replaces until the forward ends.
  bool checks_midway() const { return checks_midway_; }
  // Forward results the backward reads: their storages escape to the caller, who must not
  // write them in place before the backward either.
  const std::vector<int>& backward_escape_reads() const { return backward_escape_reads_; }
  // Escaping buffers first written by the forward steps, and by the backward steps.
  const std::vector<int>& forward_escapes() const { return fwd_escapes_; }
  const std::vector<int>& backward_escapes() const { return bwd_escapes_; }

  // A free call state for one call (a new arena when every one is taken), and its return. Safe
  // from several threads at once; the replay itself takes no lock.
  CallState* acquire();
  void release(CallState* b);
  // A cpu plan takes its arenas from `pool` (shared by the planned sizes of a dynamic family) as a
  // call starts and gives them back as it ends, instead of keeping one per call state. Called
  // before the first acquire.
  void share_arenas(std::shared_ptr<ArenaPool> pool);

  // The device every step runs on (cpu for a plan without steps).
  Device device() const { return device_; }
  // Gives the escaping buffers of the forward (or backward) steps their storage for this call:
  // new storage, or on CUDA a kept one the previous caller has dropped.
  void allocate_escapes(CallState& b, Phase phase);
  // Patches this call's addresses of the non-arena buffers the forward (or backward) steps read
  // or write into the state's views.
  void bind(CallState& b, Phase phase) const;
  // Reads the live host guards' attributes for this call (HostGuard::current), which the
  // optimizer updates that take them live run with. Before the forward.
  void take_live_attrs(CallState& b) const;
  // Runs the forward (or backward) schedule. With `snapshots`, appends what each step wrote. While
  // the profiler records, each step is timed (the choice is made once per run, not per step; on
  // CUDA with device events). On CUDA a whole phase without snapshots or profiling is one graph
  // launch (captured on first use, and again when bound addresses change) unless graphs are off or
  // capture failed (graph_stats().fallback). With red zones, the guards of what each step wrote
  // are checked after it (an Error names the step and the buffer) and CUDA phases run on the
  // stream. On the cpu at two threads, without snapshots or profiling, a phase with a two-lane
  // schedule runs on two lanes (lanes.cc).
  void run(CallState& b, Phase phase, std::vector<StepSnapshot>* snapshots = nullptr);
  GraphStats graph_stats() const;
  // Phases replayed on two lanes so far.
  int64_t lane_replays() const { return lane_replays_.load(std::memory_order_relaxed); }

  // ---- Schedule dump ----
  // Names of what a call binds: arguments by position, watched parameters by slot.
  struct Names {
    std::vector<std::string> args, params;
  };
  // The forward and backward steps as text: per step its index, op, attributes and marks
  // (random, in place, added by a pass), then each operand with its buffer, dtype, shape and
  // where it lives.
  std::string steps_text(const Names& names, const std::string& indent = "") const;
  // The same as Graphviz statements for the body of a digraph: a cluster per schedule with a
  // box per step, an ellipse per buffer, edges for reads and writes. Node ids start `prefix`.
  std::string steps_dot(const Names& names, const std::string& prefix) const;
  // Where buffer `buf` lives: "arena [0,64)", "arg 0 'x'", "param 'fc.weight'", ...
  std::string location(int buf, const Names& names) const;
  // The arena offset of buffer `buf` (its in-place root's), or -1 when it is not in the arena.
  int64_t arena_offset(int buf) const { return offset_[root_[buf]]; }

 private:
  // `device_random`: random steps read their {seed, offset} from b.random_state (step i's pair
  // random_pair_[i]). kRedzones: the guards of what each step writes are filled before it and
  // checked after it.
  template <bool kProfile, bool kRedzones>
  void run_steps(CallState& b, int begin, int end, std::vector<StepSnapshot>* snapshots,
                 bool device_random = false);
  void run_graph(CallState& b, Phase phase, int begin, int end);
  // Step i's kernel over the state's views (random steps reserve their numbers here, or with
  // `device_random` read their pair).
  void run_step(CallState& b, int i, bool device_random) const;
  // Two lanes (lanes.cc): the schedule, whether a run uses it, the run, and one lane's program;
  // on CUDA, the capture of a phase's steps on several streams.
  void plan_lanes();
  bool use_lanes(Phase phase) const;
  void run_lanes(CallState& b, Phase phase);
  // `at`: the step the lane ran last (the one that threw, when it throws). `first_failure`: the
  // lowest step that threw on either lane.
  void run_lane(CallState& b, Phase phase, int lane, uint32_t run, LanePair& pair, int& at,
                const std::atomic<int>& first_failure) const;
  // CUDA: a phase's steps queued on its streams for a capture (graph_queue_): streams[0] is the
  // capture's, the others its branches.
  void queue_lanes(CallState& b, Phase phase, cuda::Graph& graph,
                   std::span<const cuda::StreamHandle> streams);
  void plan_graphs();
  void finish_copy_out(CallState& b);
  // Red zones: fills the guards of the blocks step `i` writes, and after it throws when one
  // has changed.
  void fill_redzones(CallState& b, int i) const;
  void check_redzones(const CallState& b, int i) const;
  // The forward's (or backward's) steps, [begin, end).
  std::pair<int, int> step_range(Phase phase) const {
    return phase == Phase::Backward ? std::pair{n_forward_, static_cast<int>(all_.size())}
                                    : std::pair{0, n_forward_};
  }
  // The forward's (or backward's) range of patches_.
  std::pair<size_t, size_t> patch_range(Phase phase) const {
    return phase == Phase::Backward ? std::pair{forward_patches_, patches_.size()}
                                    : std::pair{size_t{0}, forward_patches_};
  }
  // Whether a step is an optimizer update the plan moved before steps recorded ahead of it.
  bool moved_early(const Step& s) const { return s.index >= 0 && moved_early_[s.index]; }
  // The recorded zero fill_ folded into a step (an add_ become add_scalar), or -1.
  int folded_fill(const Step& s) const { return s.index >= 0 ? folded_fill_[s.index] : -1; }
  // Which input a step's output overwrites in place (its index), or -1.
  int in_place_input(const Step& s, int out) const;
  void add_copies();
  void fold_constants();
  void eliminate_dead_steps();
  // Fewer passes over activations (rewrites.cc): max pooling before a ReLU, activations folded
  // into their producers, activation gradients into the products feeding them.
  void rewrite_activations();
  // Chains of layout steps whose intermediate values only the chain reads become StridedCopy
  // steps (layout_folds.cc).
  void fold_layouts();
  // What the rewrites did to the step writing what `s` writes first (the dump), or null.
  const std::string* rewrite_note(const Step& s) const;
  void fold_zero_fills();
  // Whether step `s` (a cpu plan's) checks values no check ahead covers: it may throw midway, so
  // no write outside the arena recorded after it may run before it (value_checks.cc).
  bool throws_midway(const Step& s) const;
  void plan_value_checks();
  // Puts each phase's steps in a new order: order(begin, end) returns the indices of all_ in
  // [begin, end), each once (passes.cc).
  void reorder_phases(absl::FunctionRef<std::vector<int>(int begin, int end)> order);
  // All-reduce starts, with the steps they depend on, ahead of the steps they do not
  // (early_collectives.cc).
  void move_collectives_early();
  void move_updates_early();
  // A linear's weight and bias gradients and the Adam updates reading them in one step
  // (update_folds.cc).
  void fold_updates();
  // Per buffer, an id of the storage it lies in: the first buffer over that storage.
  std::vector<int> storage_ids() const;
  void fuse_elementwise();
  // An elementwise step whose result only a copy_ right after it reads writes the copy's
  // destination itself (passes.cc).
  void fold_copies();
  // Removes the steps `drop` marks (one flag per step of all_), keeping the phases' split.
  void drop_steps(const std::vector<char>& drop);
  void plan_padded_layouts();
  void plan_memory();
  void build_steps();

  std::shared_ptr<Recording> rec_;
  PlanOptions options_;
  std::vector<Step> all_;  // forward then backward, after the passes
  std::vector<Step> trace_steps_;
  int recorded_forward_ = 0;
  int n_forward_ = 0;
  int folded_constants_ = 0;       // recorded steps whose outputs became bound constants
  std::vector<char> moved_early_;  // per recorded step: an update moved before other steps
  std::vector<int> folded_fill_;   // per recorded add_: the recorded zero fill_ folded into it
  // Per buffer: what rewrite_activations did to the step writing it (dump.cc).
  absl::flat_hash_map<int, std::string> rewrite_notes_;
  std::vector<Operand> results_, grads_;
  std::vector<int> escape_;
  std::vector<int> root_;  // in-place: the buffer whose arena block a buffer shares
  std::vector<int64_t> offset_;
  std::vector<int> external_, mutated_external_, backward_reads_, backward_escape_reads_,
      fwd_escapes_, bwd_escapes_;
  std::vector<std::pair<uint32_t, int>> patches_;  // view -> non-arena buffer, in step order
  size_t forward_patches_ = 0;                     // how many belong to forward steps
  std::vector<ExecStep> steps_;
  PerPhase<bool> live_phase_;  // a step of the phase takes live attributes (ExecStep::live)
  std::vector<ValueCheck> value_checks_;
  bool checks_midway_ = false;
  // Per step: what its kernel resolved on its first run (KernelArgs::state).
  std::unique_ptr<std::atomic<void*>[]> kernel_state_;
  std::vector<BufferView> view_template_;
  std::vector<std::pair<uint32_t, int64_t>> arena_views_;  // view -> arena offset
  MemoryPlan memory_;
  int escapes_ = 0;
  std::vector<std::unique_ptr<FusedProgram>> programs_;  // of the FusedElementwise steps
  std::vector<std::unique_ptr<StridedCopyProgram>> layout_programs_;  // of the StridedCopy steps
  std::string unfused_reason_;        // why the device could not run a fused program, or ""
  std::vector<PaddedBuffer> padded_;  // per buffer (padded_layouts.cc)

  // Red zones: the guards of the arena blocks each step writes, step i's from guard_begin_[i].
  struct Guard {
    int64_t begin, end;  // arena offsets
    int buf;             // the buffer the step wrote
  };
  std::vector<Guard> guards_;
  std::vector<uint32_t> guard_begin_;

  // Two-lane replay: per phase the programs of lanes 0 and 1, the steps their entries wait for,
  // and per step its lane for the dump.
  PerPhase<std::array<std::vector<LaneEntry>, 2>> lanes_;
  std::vector<int32_t> lane_waits_;
  std::vector<int8_t> step_lane_;
  std::atomic<int64_t> lane_replays_{0};
  // CUDA graphs on several streams: per phase whose steps are on more than one lane, its steps in
  // the order they are queued (plan step indices), the marks between the streams and how many
  // streams they use.
  PerPhase<StreamQueue> graph_queue_;

  std::vector<std::string_view> profile_args_;  // per step, its shapes (interned when profiled)
  std::once_flag profile_args_once_;

  std::shared_ptr<ArenaPool> shared_arenas_;  // see share_arenas
  mutable std::mutex pool_mu_;                // guards states_ and free_
  std::vector<std::unique_ptr<CallState>> states_;
  std::vector<CallState*> free_;

  // CUDA graph replay.
  Device device_;
  int64_t align_ = kArenaAlign;  // of arena blocks: kCudaArenaAlign on a CUDA device
  // A block's bytes in the arena: the buffer's, then its red zone, rounded up to align_.
  int64_t block_bytes(size_t nbytes) const;
  std::vector<int> stage_slot_;  // per buffer: its staging slot, or -1
  size_t stage_slots_ = 0;
  PerPhase<std::vector<std::pair<uint32_t, int>>> staged_views_;  // view -> staging slot
  // Staged buffers the forward reads, and those only the backward reads.
  PerPhase<std::vector<int>> staged_;
  std::vector<int> staged_both_;          // staged buffers both phases read
  std::vector<int> random_steps_;         // in step order: step r uses {seed, offset} pair r
  std::vector<int> random_pair_;          // per step: its pair in random_state, or -1
  size_t random_forward_ = 0;             // random steps of the forward (they come first)
  std::atomic<uint64_t> graph_clock_{0};  // for least-recently-used eviction
  // GraphStats, counted by concurrent calls; the failure, deferral and fallback reasons are
  // written under their mutex, the fallback before `graphs_off_` is set.
  // Each adds one to the plan's count and to the process's (graph_use_counts()).
  void count_launch(bool direct);
  void count_capture();
  // Why a phase replays on the stream, where a graph may not run (GraphUseCounts).
  enum class StreamReplay { kOther, kVerified };
  void count_stream_replay(StreamReplay why = StreamReplay::kOther);
  std::atomic<int64_t> graph_launches_{0}, direct_launches_{0}, graph_captures_{0},
      stream_replays_{0}, capture_failures_{0}, deferred_captures_{0};
  std::atomic<bool> graphs_off_{false};
  mutable std::mutex fallback_mu_;
  std::string fallback_, last_failure_, last_deferral_;
};

// A new temporary buffer (not escaping) for a value shaped like `like`, added by a pass: its
// number in `bufs` (and `escape`, which grows with it).
int add_temp_buffer(std::vector<Buffer>& bufs, std::vector<int>& escape, const Operand& like);

// A Graphviz string literal: `s` in double quotes, with quotes, backslashes and newlines
// escaped (the schedule dump's labels).
std::string dot_quote(std::string_view s);

}  // namespace encore::schedule
