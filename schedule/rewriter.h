// A rewrite of a plan's steps (rewrites.cc: activations folded into their producers and
// gradients, bias gradients into weight gradients; loss_folds.cc: a loss's gradient into the
// product reading it; update_folds.cc: Adam updates into the weight gradients they read;
// layout_folds.cc: chains of layout steps as one strided copy): who reads and
// writes each storage, and the edits, applied by finish().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "runtime/strided_copy.h"
#include "schedule/plan.h"

namespace encore::schedule {

// One rewrite over the plan's steps: who reads and writes each storage, and the edits.
class Rewriter {
 public:
  Rewriter(std::vector<Step>& steps, int& n_forward, std::vector<Buffer>& bufs,
           std::vector<int>& escape, const std::vector<int>& memory, int recorded_forward,
           absl::flat_hash_map<int, std::string>& notes)
      : steps_(steps),
        n_forward_(n_forward),
        bufs_(bufs),
        escape_(escape),
        memory_(memory),
        recorded_forward_(recorded_forward),
        notes_(notes) {
    readers_.resize(bufs.size());
    writers_.resize(bufs.size());
    for (int t = 0; t < static_cast<int>(steps.size()); ++t) {
      const Step& s = steps[t];
      for (const Operand& o : s.in) readers_[memory_[o.buf]].push_back(t);
      for_each_written(s.op, std::span<const Operand>(s.in), std::span<const Operand>(s.out),
                       [&](const Operand& o) { writers_[memory_[o.buf]].push_back(t); });
    }
    drop_.assign(steps.size(), 0);
    after_.resize(steps.size());
  }

  void swap_pool_relu();
  // On CUDA only where the product runs on a small GEMM kernel (runtime/small_gemm.h).
  void fold_producers(DeviceType device);
  void fold_gradients(DeviceType device);
  void fold_accumulations();
  // On CUDA only where the weight gradient runs on a small GEMM kernel that sums its columns.
  void fold_bias_gradients(DeviceType device);
  // On CUDA only where the product runs on a small GEMM kernel that computes its a as a loss's
  // gradient.
  void fold_loss_gradients(DeviceType device);
  // Then the linear computing the logits into that step, on CUDA where its kernel computes them.
  void fold_loss_logits(DeviceType device);
  // The Adam updates of a linear's weight and bias into the step computing their gradients
  // (update_folds.cc; `throws`: per step, whether it may throw midway). On CUDA only where that
  // step runs on a small GEMM kernel.
  void fold_adam_updates(DeviceType device, const std::vector<char>& throws);
  // Chains of layout steps as StridedCopy steps, whose programs go to `programs`
  // (layout_folds.cc).
  void fold_layouts(std::vector<std::unique_ptr<StridedCopyProgram>>& programs);
  // Applies the edits: dropped steps go, inserted ones follow their step.
  void finish();

 private:
  // fold_layouts' copies side by side from one buffer as one step (`single`: per step, the
  // program of the one copy fold_layouts made it, or null).
  void merge_side_by_side(const std::vector<StridedCopyProgram*>& single);
  // From Linear step l to LossGradMatmul step s, the first step that checks labels where it is
  // s's loss (a SoftmaxCrossEntropy) over the same logits and labels and no step before it writes
  // what outlives the call's temporaries; else -1 (fold_loss_logits).
  int checked_first(int l, int s) const;
  // A temporary of the call that nothing outside it sees, written by step t alone.
  // (A buffer this pass made is none: its readers and writers are not listed.)
  bool private_value(const Operand& o, int t) const {
    if (o.buf >= static_cast<int>(memory_.size())) return false;
    const int m = memory_[o.buf];
    return bufs_[o.buf].kind == BufKind::Temp && escape_[o.buf] < 0 && o.nbytes() == nbytes(o) &&
           writers_[m].size() == 1 && writers_[m][0] == t;
  }
  size_t nbytes(const Operand& o) const { return bufs_[o.buf].nbytes; }
  const std::vector<int>& readers(const Operand& o) const { return readers_[memory_[o.buf]]; }
  const std::vector<int>& writers(const Operand& o) const { return writers_[memory_[o.buf]]; }
  bool floating(const Operand& o) const {
    return o.dtype == DType::Float32 || o.dtype == DType::Float64;
  }
  bool same_phase(int a, int b) const { return (a < n_forward_) == (b < n_forward_); }
  // A recorded step's number within its phase, as the dump shows it.
  int recorded(int index) const {
    return index < recorded_forward_ ? index : index - recorded_forward_;
  }
  // "recorded as steps 3 and 4" (or "recorded as step 3" when b is a step added by the plan).
  std::string recorded_as(int a, int b) const {
    if (b < 0) return cat("recorded as step ", recorded(a));
    return cat("recorded as steps ", recorded(a), " and ", recorded(b));
  }
  void note(int buf, const std::string& text) {
    std::string& n = notes_[buf];
    n += cat(n.empty() ? "" : "; ", text);
  }
  Operand new_temp(const Operand& like) {
    return Operand{add_temp_buffer(bufs_, escape_, like), like.shape, like.dtype};
  }

  std::vector<Step>& steps_;
  int& n_forward_;
  std::vector<Buffer>& bufs_;
  std::vector<int>& escape_;
  const std::vector<int>& memory_;
  const int recorded_forward_;
  absl::flat_hash_map<int, std::string>& notes_;
  std::vector<std::vector<int>> readers_, writers_;  // per storage, in step order
  std::vector<char> drop_;
  std::vector<std::vector<Step>> after_;  // per step: steps inserted right after it
};

}  // namespace encore::schedule
