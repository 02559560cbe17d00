// A Plan: a Recording made executable. Passes: outputs that leave the call get their own
// storage (a Copy where they alias something else), dead steps are dropped, elementwise steps
// write over an input that dies there, and every other temporary gets an offset in one arena
// (liveness over forward and backward together, placed largest first into the best-fitting
// gap). The Executor part runs the steps over an arena with no lookups or allocation.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/dispatcher.h"
#include "schedule/recording.h"

namespace encore::schedule {

struct ExecStep {
  Op op;
  KernelFn fn;
  AttrBlob attrs;
  uint32_t view = 0;  // first input view; outputs follow the inputs
  uint8_t n_in = 0;
  uint8_t n_out = 0;
  bool random = false;  // draws fresh numbers on every run
  Device device;
  uint64_t random_count = 0;
  int trace_index = 0;  // its position in the recording's forward then backward lists
};

struct MemoryPlan {
  int64_t arena_bytes = 0;
  int64_t lower_bound_bytes = 0;
  int64_t naive_bytes = 0;
  int64_t in_place_steps = 0;
};

// Per-call working state of one arena; reused by later calls once released.
struct Block {
  void* arena = nullptr;
  std::vector<BufferView> views;
  std::vector<void*> ptrs;                 // per buffer, this call's address
  std::vector<IntrusivePtr<Storage>> own;  // per escaping buffer (by escape slot)
  std::vector<Tensor> held;                // tensors a backward reads (arguments, parameters)
  std::vector<uint32_t> versions;          // of `held`, at forward time
  bool backward_done = false;
};

class Plan {
 public:
  // Plans `rec` (forward and, when recorded, backward). Consumes the recording's steps.
  explicit Plan(std::shared_ptr<Recording> rec);
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
  int arena_blocks() const { return static_cast<int>(blocks_.size()); }
  // Buffers of the forward results (after the Copy pass) and of the gradients. A result is in
  // an escaping buffer, or in a bound one (argument, parameter, external): a view of it.
  const std::vector<Operand>& results() const { return results_; }
  const std::vector<Operand>& grads() const { return grads_; }
  // Buffers outside the arena a step reads or writes, with where in the views they go.
  const std::vector<int>& external_buffers() const { return external_; }
  // Buffers written in place that live outside the call (version counters bumped per call).
  const std::vector<int>& mutated_external() const { return mutated_external_; }
  // Non-arena buffers the backward reads (held by a call until its backward).
  const std::vector<int>& backward_reads() const { return backward_reads_; }
  // Escaping buffers first written by the forward steps, and by the backward steps.
  const std::vector<int>& forward_escapes() const { return fwd_escapes_; }
  const std::vector<int>& backward_escapes() const { return bwd_escapes_; }

  Block* acquire();
  void release(Block* b);

  // Patches this call's addresses of non-arena buffers into the block's views.
  void bind(Block& b) const;
  // Runs steps [begin, end). With `snapshots`, appends the bytes each step wrote. While the
  // profiler records, each step is timed (the choice is made once per run, not per step).
  void run(Block& b, int begin, int end,
           std::vector<std::vector<unsigned char>>* snapshots = nullptr);

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
  template <bool kProfile>
  void run_steps(Block& b, int begin, int end, std::vector<std::vector<unsigned char>>* snapshots);
  // Which input a step's output overwrites in place (its index), or -1.
  int in_place_input(const Step& s, int out) const;
  void add_copies();
  void eliminate_dead_steps();
  void plan_memory();
  void build_steps();

  std::shared_ptr<Recording> rec_;
  std::vector<Step> all_;  // forward then backward, after the passes
  std::vector<Step> trace_steps_;
  int recorded_forward_ = 0;
  int n_forward_ = 0;
  std::vector<Operand> results_, grads_;
  std::vector<int> escape_;
  std::vector<int> root_;  // in-place: the buffer whose arena block a buffer shares
  std::vector<int64_t> offset_;
  std::vector<int> external_, mutated_external_, backward_reads_, fwd_escapes_, bwd_escapes_;
  std::vector<std::pair<uint32_t, int>> patches_;  // view -> non-arena buffer
  std::vector<ExecStep> steps_;
  std::vector<BufferView> view_template_;
  std::vector<std::pair<uint32_t, int64_t>> arena_views_;  // view -> arena offset
  MemoryPlan memory_;
  int escapes_ = 0;

  std::vector<std::string_view> profile_args_;  // per step, its shapes (interned when profiled)

  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<Block*> free_;
};

// A Graphviz string literal: `s` in double quotes, with quotes, backslashes and newlines
// escaped (the schedule dump's labels).
std::string dot_quote(std::string_view s);

}  // namespace encore::schedule
