// The trace IR and the Recorder that builds it from the dispatcher's notifications.
//
// A Recording lists the kernel calls of a traced function (forward) and of the first backward
// through its outputs (backward) as Steps over buffers. A buffer is one storage: an argument, a
// watched parameter, a tensor bound by reference (state, constants), the .grad of a leaf, an
// incoming output gradient, or a temporary produced inside (planned into the arena, or given
// its own storage when it leaves the call). Views (reshape, detach) need no step: an operand is
// a buffer read with a shape.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "runtime/dispatcher.h"
#include "runtime/tensor.h"
#include "schedule/static_graph.h"

namespace encore::schedule {

// The two schedules of a static call: its forward, and the first backward through its outputs.
enum class Phase : uint8_t { Forward, Backward };

// One T per phase.
template <typename T>
struct PerPhase {
  T forward{}, backward{};
  T& operator[](Phase p) { return p == Phase::Forward ? forward : backward; }
  const T& operator[](Phase p) const { return p == Phase::Forward ? forward : backward; }
};

inline const char* phase_name(Phase p) {
  return p == Phase::Forward ? "forward" : "backward";
}

enum class BufKind : uint8_t {
  Arg,       // argument `index` of the call
  Param,     // watched parameter slot `index`, read at every call
  External,  // a tensor bound by reference (`bound`): optimizer state, statistics, constants
  GradSlot,  // the .grad of leaf `index` as the call found it
  GradIn,    // backward: the gradient of differentiable result `index`
  Temp,      // produced by a step of the recording
};

struct Buffer {
  BufKind kind = BufKind::Temp;
  int index = -1;
  size_t nbytes = 0;
  Device device;
  Tensor bound;          // External: the tensor read by reference; Arg/Param: trace-time tensor
  bool mutated = false;  // written by an in-place step
  // A constant: a tensor made inside the call from host values (External), or a Temp that a
  // deterministic step computed from constants alone (a private copy of its value at the trace
  // in `trace_value`), unwritten since. A plan binds such a Temp by reference to that copy
  // instead of running its step (Plan::fold_constants).
  bool constant = false;
  Tensor trace_value;
};

struct Operand {
  int buf = -1;
  Shape shape;
  DType dtype = DType::Float32;
  size_t nbytes() const { return static_cast<size_t>(shape.numel()) * itemsize(dtype); }
};

struct Step {
  Op op;
  AttrBlob attrs;
  int index = -1;  // position in the recording (forward, then backward); -1: added by a pass
  absl::InlinedVector<Operand, 3> in;
  absl::InlinedVector<Operand, 1> out;
  // An optimizer update whose attributes a replay reads from host guard `live` (its current())
  // when Recording::guard_live says the guard is live; -1: `attrs` as recorded.
  int live = -1;
  // The recorded copy_ this step's output now goes to directly (Plan::fold_copies), or -1.
  int folded_copy = -1;
};

// A leaf that requires grad and that the trace used or whose .grad it touched.
struct Leaf {
  Tensor tensor;      // the leaf at trace time
  int param = -1;     // its watched slot, or -1 for a captured tensor
  int buf = -1;       // its buffer
  Tensor entry_grad;  // its .grad when the trace began (watched) or first saw it
  // The first thing the trace did with the .grad: it decides what a replay requires. Read: an
  // op read its values, or the code asked for it (Tensor::grad) and may have branched on whether
  // it was defined; a replay requires the .grad defined (with its shape) or undefined, as found.
  enum class First : uint8_t { None, EngineSet, Replaced, Read } first = First::None;
  // What .grad is when the call ends: kUntouched, kCleared, or the buffer it lives in.
  static constexpr int kUntouched = -2, kCleared = -1;
  int final_grad = kUntouched;
};

struct Recording {
  std::vector<Buffer> buffers;
  std::vector<Step> forward, backward;
  std::vector<Leaf> leaves;
  std::vector<Operand> results;     // what the function returned
  std::vector<int> differentiable;  // indices of results that carry the subgraph node
  // Per result, what it is as a tensor (-1: none), so that a call returns what eager returns:
  // the same tensor as an earlier result (`result_twin`), argument `result_arg` itself, or the
  // tensor of leaf `result_leaf` (a parameter, or a captured leaf, returned as it is). None
  // carries the node: their gradients accumulate where eager accumulates them.
  std::vector<int> result_twin, result_arg, result_leaf;
  // Per differentiable result: whether the recorded backward got its gradient (Entry::grad_given).
  std::vector<char> grad_given;
  // Backward: every gradient the recorded backward delivered to an argument or a leaf, in the
  // order the engine delivered them. A replay's node has one input per contribution, so they
  // accumulate into .grad (or an argument's producer) one by one, in eager's order.
  struct Contribution {
    bool arg = false;  // argument `index`, or leaf `index`
    int index = -1;
    Operand grad;
  };
  std::vector<Contribution> contributions;
  bool saw_backward = false;  // a backward ran inside the function (a whole training step)
  // Host counters the traced code advanced, once per advance: every replay adds one to each.
  std::vector<std::shared_ptr<std::atomic<int64_t>>> counters;
  // Host state the trace baked in, checked at every call (HostGuard), and per guard whether
  // its steps take its attributes live (every update step after it had its traced() ones).
  std::vector<std::shared_ptr<const HostGuard>> host_guards;
  // The first module whose forward read its train/eval mode (Tracer::on_mode_read) and that the
  // function does not watch, described: its mode is baked in (the call warns once).
  std::string unwatched_mode;
  std::vector<char> guard_live;
  // An argument's storage the function also reached through a tensor that is not the argument
  // (a tensor it captured, or a view of one, at the argument's place): the trace cannot tell
  // the two apart, so it is never replayed. -1: none.
  int captured_arg = -1;
  Shape captured_shape;  // the captured tensor's
  std::string unsafe;    // why the trace cannot be replayed (empty: it can)
  // Why the trace must not be replayed, and the next call traces again, as a phrase after "the
  // trace": "ran a one-time set-up (...)", "cannot be replayed: its argument 0 ... shares
  // storage with ...", "changed what a replay bakes in (SGD lr 0.1 -> 0.05)".
  std::string retrace;
  // Verify mode: the bytes each forward (then backward) step wrote, in step order.
  std::vector<std::vector<unsigned char>> snapshots;
};

// A forward as traced, for exporters (StaticGraph::eval_forward): its steps over the buffers of
// its recording, before any pass. Buffers keep their trace-time tensors (`bound`).
struct ForwardTrace {
  std::string name;                    // the function's
  std::string signature;               // "x: float32[32,784]; grad off; eval"
  std::vector<std::string> arg_names;  // as the function names them (may be fewer than args)
  std::vector<Shape> arg_shapes;       // every argument's, by position
  std::vector<DType> arg_dtypes;
  std::vector<Buffer> buffers;
  std::vector<Step> steps;
  std::vector<Operand> results;
  std::vector<std::string> param_names;  // watched parameter slots' names, by index
};

// Records what the dispatcher runs into a Recording while it is the active tracer.
class Recorder final : public Tracer {
 public:
  // `throw_unsafe`: a host read or a parameter created during the trace throws at once.
  Recorder(Recording& rec, const std::string& name, bool throw_unsafe, bool snapshot);

  void add_arg(int index, const Tensor& alias);
  void add_watched(const std::vector<ParamSlot>& slots);
  // The gradient of differentiable result `index`, in a buffer of its own: a tensor already
  // recorded (one gradient given to two results) is first replaced by a copy, so that a replay
  // given two tensors reads each where it belongs.
  void add_grad_in(int index, Tensor& g);
  void set_phase(Phase p) { phase_ = p; }
  // The operand a tensor is (registering an External for a tensor never seen).
  Operand operand_of(const Tensor& t);
  // After the traced code returned `results`: a temporary the call made that is still held,
  // though not by the results, their graph or a .grad, is state the replays would not update
  // (a lazily made optimizer state, a tensor kept for later): unsafe.
  void check_escapes(std::span<const Tensor> results);

  void on_op(Op op, const AttrBlob& attrs, std::span<const Tensor> inputs,
             std::span<const Tensor> outputs) override;
  void before_inplace(Op op, std::span<const Tensor> inputs) override;
  void on_host_read(const Tensor& t, std::string_view what) override;
  void on_host_value(std::string_view what) override;
  void on_mode_read(const void* module, std::string_view what) override;
  // The modules the function watches (Config::tree): a mode read of another is unwatched_mode.
  void watch_modules(std::vector<const void*> tree) { watched_modules_ = std::move(tree); }
  void on_grad_set(const Tensor& leaf, const Tensor& grad) override;
  void on_grad_replaced(const Tensor& leaf, const Tensor& grad) override;
  void on_grad_read(const Tensor& leaf) override;
  void on_host_guard(std::shared_ptr<const HostGuard> guard) override;
  void on_backward() override;
  void on_count(const std::shared_ptr<std::atomic<int64_t>>& counter) override;
  void on_unrepeatable(std::string_view why) override;
  bool on_leaf_grad(const Tensor& leaf, const Tensor& grad) override;
  void on_saved_alias(const Tensor& base, const Tensor& alias) override;

 private:
  struct Key {
    uint64_t serial;
    int64_t offset;
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.serial, k.offset);
    }
  };
  static Key key_of(const Tensor& t);
  static size_t bytes_from_data(const Tensor& t);  // of its storage, from its first element
  int new_buffer(const Tensor& t, BufKind kind, int index);
  static Tensor constant_value(const Tensor& t, size_t nbytes);
  int resolve_input(const Tensor& t, bool written);
  int leaf_for(const Tensor& leaf);  // its leaf record, made on first sight
  void unsafe(std::string why);
  // The advice an unsafe trace's Error ends with (none where the signature then runs eagerly).
  const char* or_eager() const {
    return throw_unsafe_ ? ", or pass on_unsafe = OnUnsafe::Eager" : "";
  }
  std::string lazy_parameter(const Tensor& t) const;
  // Notes `t` as captured when buffer `b` is an argument's and `t` is not the argument or a
  // view made of it during the call.
  void check_arg_view(int b, const Tensor& t);
  void add_arg_view(const Tensor& base, const Tensor& view);

  Recording& rec_;
  std::string name_;
  std::vector<const void*> watched_modules_;  // watch_modules: the tree the function watches
  bool throw_unsafe_;
  bool snapshot_;
  bool fold_constants_;  // mark constants, with a copy of their values (Plan::fold_constants)
  Phase phase_ = Phase::Forward;
  std::optional<Device> device_;  // of the first op: a schedule runs on one device
  uint64_t start_serial_;
  uint64_t start_sequence_;                     // of the autograd nodes the call made
  // The storages of Temp buffers, while alive; released by check_escapes (or with the
  // recorder: a verify-mode recorder never checks).
  std::optional<StorageWatch> temps_;
  // Per buffer: its values computed from constants alone, folded or not (see on_op); every
  // `constant` buffer is fixed.
  std::vector<char> fixed_;
  bool fixed(int b) const { return static_cast<size_t>(b) < fixed_.size() && fixed_[b]; }
  void set_fixed(int b, bool on) {
    if (fixed_.size() <= static_cast<size_t>(b)) fixed_.resize(b + 1, 0);
    fixed_[b] = on;
  }
  absl::flat_hash_map<uint64_t, int> temp_of_;  // storage serial -> its Temp buffer
  absl::flat_hash_map<Key, int> buf_of_;
  absl::flat_hash_map<Key, int> watched_;          // storage of a watched parameter -> slot
  const std::vector<ParamSlot>* slots_ = nullptr;  // add_watched's (they outlive the recorder)
  absl::flat_hash_map<Key, int> entry_grad_;       // storage of a leaf's entry .grad -> leaf
  std::vector<const TensorImpl*> args_;            // the aliases standing for the arguments
  // The aliases and every view made of them during the call (held: no address is reused).
  absl::flat_hash_set<const TensorImpl*> arg_views_;
  std::vector<Tensor> arg_view_keep_;
  // Tensors made inside the call and filled from host values (Tensor::data) that no step has
  // written yet: constants, until an in-place op writes one (before_inplace).
  absl::flat_hash_set<Key> host_filled_;
  // The live host guard just recorded (its index, -1: none) and its traced() attributes: the
  // optimizer updates dispatched right after it, up to the next other op, take them live.
  int live_guard_ = -1;
  AttrBlob live_attrs_;
};

}  // namespace encore::schedule
