// A cache entry of a static function: its signature, guards, recording and plan, published by
// its state; and what the parts of a call read from it (its leaves' tensors now, the tensor
// each bound buffer stands for in a call). Internal to schedule/.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/profiler.h"
#include "schedule/plan.h"
#include "schedule/recording.h"
#include "schedule/shape_family.h"
#include "schedule/signature.h"
#include "schedule/static_graph.h"

namespace encore::schedule::detail {

struct ParamGuard {
  int slot;
  Shape shape;
  DType dtype;
  Device device;
  bool requires_grad;
  // For a parameter the trace wrote in place (an optimizer's update), the tensor it wrote: the
  // code that wrote it may hold that tensor (an optimizer does), so a slot now holding another
  // one traces again. Null for one it only read, which a replay rebinds.
  const TensorImpl* written = nullptr;
  // Other slots that held the same tensor when traced (tied weights): the trace read them all
  // through this slot's buffer, so each must still hold that slot's tensor (storage and offset).
  std::vector<int> tied;
};

// A tensor the function captured (an External buffer) and whether it required grad when traced:
// a call finding that flipped traces again (the schedule has, or lacks, its gradient).
struct CapturedGuard {
  int buf;
  bool requires_grad;
};

struct GradGuard {
  int leaf;
  bool defined;  // what the .grad must be when a call starts
  Shape shape;
  // The first earlier guard whose .grad shared this one's storage when traced, or -1: the
  // schedule took them for one buffer, or for separate ones whose writes its passes reorder.
  int shares = -1;
};

// A bound buffer (Param or External) of the entry's recording that a call's arguments must not
// share storage with: the plan takes them for separate memory, and its passes reorder a write
// of one and the reads of the other (early updates, lanes, in place).
struct AliasGuard {
  const Storage* storage;  // External: its storage (the recording holds the tensor)
  int index;               // Param: its watched slot; External: its buffer
  bool written;  // the function writes it (else only an argument it writes may not share it)
};

// Where an entry is in its life. Tracing, it is a placeholder: other calls with its signature
// run eagerly meanwhile, and only its signature may be read. The trace publishes Ready (planned),
// Waiting (for the first backward through its outputs), Eager (unsafe) or Retrace (its trace ran
// a one-time set-up: the next call traces again); from Waiting, that backward makes it Ready,
// Retrace or Failed, and outputs that die unused make it Abandoned. The state is
// stored (release) after the fields it publishes are written, and loaded (acquire) before they
// are read.
enum class EntryState : uint8_t { Tracing, Waiting, Ready, Eager, Failed, Abandoned, Retrace };

// Whether an entry's schedule may still serve its signature (Entry::stale).
enum class Stale : uint8_t { No, NewGradient, VerifyFailed, ModulesChanged };

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
  std::vector<const void*> tree;  // the watched modules when traced (Config::tree)
  std::vector<ParamGuard> params;
  std::vector<GradGuard> grads;
  // The storage serial of each guard's .grad when the guards last held (0: undefined): a call
  // compares how they share storage only where one of them lives in another storage since.
  // `grads_held`: scratch for that comparison (no allocation once sized).
  mutable std::vector<uint64_t> grads_seen;
  mutable std::vector<std::pair<const Storage*, int>> grads_held;
  mutable std::vector<int> grads_first;
  // Per leaf, its post-accumulate hooks when traced (autograd::hooks_digest): the schedule runs
  // the ops those hooks dispatched, so a hook added or removed since traces again. Compared when
  // the process's hooks moved (autograd::hooks_epoch) since `hooks_seen`.
  std::vector<uint64_t> leaf_hooks;
  mutable uint64_t hooks_seen = 0;
  // Where the trace ran an optimizer's step: the watched parameters (slots) and captured floating
  // tensors (External buffers) it read but did not update, and the newest ParamUpdaterRegistration
  // serial when traced, or when a call last found no updater made since holding one of them (a
  // parameter group added as a new optimizer, whose step() the schedule does not hold): a call
  // finding one traces again.
  struct ReadOnly {
    bool param;  // a slot's tensor, else an External buffer's
    int index;
  };
  std::vector<ReadOnly> read_only;
  mutable std::atomic<uint64_t> updaters_seen{0};
  std::vector<CapturedGuard> captured;
  std::vector<int> grad_in;  // GradIn buffers, by differentiable result
  // By differentiable result: whether the first backward got its gradient (one that got none is
  // not back-propagated, as eagerly, and its branch is not in the backward schedule).
  std::vector<char> grad_given;
  // Set by a replayed backward that got a gradient the first backward did not (the schedule
  // cannot give it), or by verify mode finding a size planned from a dynamic family computing
  // other than the function: the signature traces again. Shared by the sizes a dynamic family
  // plans, with the trace that made it.
  std::shared_ptr<std::atomic<Stale>> stale = std::make_shared<std::atomic<Stale>>(Stale::No);
  int64_t family = -1;  // the dynamic family that planned it, or -1
  // Param buffers, and External ones sorted by storage (checked by a binary search: an optimizer's
  // state is most of them).
  std::vector<AliasGuard> alias_params, alias_externals;
  std::vector<char> arg_written;  // per argument: the function writes it
  int64_t hits = 0;               // guarded by the function's mutex
  // Failed: why, and how many first backwards of this signature failed in a row (a retrace
  // carries the count over).
  std::string failure;
  int backward_failures = 0;
  // Dynamic shapes (shape_family.h). `keep_trace`: the recording as traced is kept in `pristine`
  // when planned, for families built from it. `dynamic_dims`: the dimensions this trace may make
  // dynamic, checked against the earlier traces in `evidence` (their ids in `evidence_ids`)
  // once it is planned; `evidence_family`: the id of the family whose traces they are (a size
  // its guards left out), else -1. When a trace at size 1 kept that check from succeeding,
  // `pending_points`: the other traces, which a later trace at another size adds to.
  bool keep_trace = false;
  // A dynamic family was made from this trace (guarded by the function's mutex): evicting it
  // says nothing, since the family plans its size again.
  bool in_family = false;
  std::shared_ptr<const Recording> pristine;
  std::vector<DynDim> dynamic_dims;
  std::vector<FamilyPoint> evidence;
  std::vector<int64_t> evidence_ids;
  int64_t evidence_family = -1;
  // Where the evidence is a family: the nearest entry outside it (`alternate_ids`), which may
  // make a family of its own with this trace where that one cannot take it; the dimensions
  // that family would make dynamic.
  std::vector<DynDim> alternate_dims;
  std::vector<FamilyPoint> alternate;
  std::vector<int64_t> alternate_ids;
  std::vector<FamilyPoint> pending_points;
  std::vector<int64_t> pending_ids;
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

// Why an entry went stale (Entry::stale): the reason its signature traces again.
inline const char* stale_reason(Stale s) {
  switch (s) {
    case Stale::NewGradient:
      return "a backward of the previous trace's replays got a gradient for a result its first "
             "backward got none for";
    case Stale::VerifyFailed:
      return "verify mode found a size planned from a dynamic family of the previous trace "
             "computing other than the function";
    case Stale::ModulesChanged:
      return "the watched modules changed since the previous trace (a layer, parameter or "
             "buffer added)";
    default:
      return "";
  }
}

// The name of a span of entry `e` (made while profiling only: interned names are never freed).
std::string_view span_name(Entry& e, profiler::SpanKind kind);

inline const Tensor& leaf_now(const Entry& e, const Leaf& l) {
  return l.param >= 0 ? *e.slots[l.param].slot : l.tensor;
}

// Why the entry's guards fail for this call (empty: they hold).
std::string guard_failure(const Entry& e);

// Whether a and b are defined and start at the same place of one storage.
inline bool same_place(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.impl()->storage.get() == b.impl()->storage.get() &&
         a.impl()->offset * itemsize(a.dtype()) == b.impl()->offset * itemsize(b.dtype());
}

// Fills e.alias_params, e.alias_externals and e.arg_written from its recording.
void set_alias_guards(Entry& e);
// Why this call's arguments share storage with a bound tensor the entry's plan keeps apart from
// them (empty: none does). At a trace (`traced`), sharing any watched parameter, captured leaf
// or bound tensor counts: the recorder took the shared tensor for the argument.
std::string alias_failure(const Entry& e, std::span<const Tensor> args, bool traced = false);

// The tensor a non-arena buffer is for this call (null for GradIn and temporaries).
inline const Tensor* bound_tensor(const Entry& e, const Buffer& b, std::span<const Tensor> args,
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

}  // namespace encore::schedule::detail
