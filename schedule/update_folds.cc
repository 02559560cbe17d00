// A linear's weight and bias gradients and the Adam updates reading them in one step, after the
// early updates (passes.cc): CUDA plans unless ENCORE_STATIC_FOLD=0, cpu plans only where
// ENCORE_STATIC_FOLD_CPU_UPDATES=1 asks (on two lanes their updates otherwise run beside the next
// gradients' products, which measured faster). A WeightBiasGrad (gy^T x and sum(gy, 0)), or a
// weight gradient's Matmul (gy^T x) alone, and the groups of a later AdamUpdate whose gradients
// these are become one WeightGradAdam step at the product's place, writing the gradients and
// updating the parameters from them. On CUDA the product's small GEMM kernel updates each
// parameter element right after it computes its gradient, with the update kernel's code
// (kernels/cuda/weight_adam_gemm.cuh): a training step's last kernel, the optimizer's, leaves its
// critical path, where the product runs on that kernel (runtime/small_gemm.h). On the cpu the step
// runs the product's kernel, then the update's (kernels/cpu/matmul.cc). The AdamUpdate keeps the
// groups of other parameters (a foreach update of several), or goes.
//
// Verify mode compares the step's writes with the product's, the Sum's and the update's recorded
// steps (their indices: the step's own and WeightGradAdamAttrs'), an update's groups one by one
// where the plan split them (executor.cc).
#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/small_gemm.h"
#include "schedule/rewriter.h"

namespace encore::schedule {
namespace {

// Whether product step w (a WeightBiasGrad, or a Matmul gy^T x) can update parameters from the
// gradients it computes on `device`: on the cpu (its kernel runs the update after the product),
// on CUDA where its small GEMM kernel does.
bool updates_parameters(const Step& w, DeviceType device) {
  return device != DeviceType::CUDA ||
         cuda_small_gemm_updates_parameters(
             matmul_shape(w.in[0].shape, w.in[1].shape, w.out[0].shape,
                          MatmulAttrs{.trans_a = true}),
             w.op == Op::WeightBiasGrad);
}

}  // namespace

// A product (step w: a WeightBiasGrad, or a Matmul of two matrices with a transposed: a weight
// gradient gy^T x) and, for each gradient it writes (alone, all of it), the group of a later
// AdamUpdate (step u, any number of groups: p, g, m, v, t each) whose g it is, become one
// WeightGradAdam step at w: each group's update moves to w. So nothing from w to u may read or
// write the group's parameter or state, nor may throw midway (`throws`, per step: a check of
// labels the call computed, which must fail with the parameters as they were), and the parameter
// and state share no storage with the product's operands. A WeightBiasGrad folds only with both
// of its gradients' groups.
void Rewriter::fold_adam_updates(DeviceType device, const std::vector<char>& throws) {
  constexpr int kGroup = kWeightGradAdamGroup;
  const int n = static_cast<int>(steps_.size());
  std::vector<std::vector<char>> taken(static_cast<size_t>(n));  // per update step, its groups
  struct Found {
    int u = -1, k = -1;
  };
  // The update group reading all of gradient o, its parameter and state untouched after w.
  const auto update_of = [&](int w, const Operand& o) {
    if (!floating(o) || o.nbytes() != nbytes(o) || writers(o) != std::vector<int>{w})
      return Found{};
    for (int u : readers(o)) {
      const Step& up = steps_[u];
      if (u <= w || up.op != Op::AdamUpdate || drop_[u] || !same_phase(w, u)) continue;
      if (std::any_of(throws.begin() + w + 1, throws.begin() + u, [](char c) { return c != 0; }))
        return Found{};
      const int groups = static_cast<int>(up.in.size()) / kGroup;
      taken[u].resize(static_cast<size_t>(groups), 0);
      for (int k = 0; k < groups; ++k) {
        const Operand& g = up.in[k * kGroup + 1];
        if (taken[u][k] || g.buf != o.buf || !(g.shape == o.shape) || g.dtype != o.dtype) continue;
        const auto between = [&](const std::vector<int>& ts) {
          return std::any_of(ts.begin(), ts.end(), [&](int t) { return t > w && t < u; });
        };
        const Step& prod = steps_[w];
        for (int i : {0, 2, 3, 4}) {
          const Operand& s = up.in[k * kGroup + i];
          const auto shares = [&](const Operand& x) { return memory_[x.buf] == memory_[s.buf]; };
          if (between(readers(s)) || between(writers(s)) ||
              std::any_of(prod.in.begin(), prod.in.end(), shares) ||
              std::any_of(prod.out.begin(), prod.out.end(), shares))
            return Found{};
        }
        return Found{u, k};
      }
    }
    return Found{};
  };
  for (int w = 0; w < n; ++w) {
    const Step& prod = steps_[w];
    const bool bias = prod.op == Op::WeightBiasGrad;
    if ((!bias && prod.op != Op::Matmul) || drop_[w] || !after_[w].empty() ||
        prod.in[0].shape.rank() != 2 || prod.in[1].shape.rank() != 2)
      continue;
    if (!bias) {
      const MatmulAttrs& a = prod.attrs.as<MatmulAttrs>();
      if (!a.trans_a || a.trans_b) continue;
    }
    const Found weight = update_of(w, prod.out[0]);
    if (weight.u < 0) continue;
    const Found b = bias ? update_of(w, prod.out[1]) : Found{};
    if ((bias && b.u < 0) || !updates_parameters(prod, device)) continue;
    const Step& wu = steps_[weight.u];
    const AdamAttrs& adam = wu.attrs.as<AdamAttrs>();
    // One step reads one set of attributes: both updates' (the same optimizer's, or the same).
    if (bias && (steps_[b.u].live != wu.live ||
                 std::memcmp(steps_[b.u].attrs.bytes, wu.attrs.bytes, AttrBlob::kCapacity) != 0))
      continue;
    decltype(Step::in) in{prod.in[0], prod.in[1]};
    for (const Found& f : {weight, b})
      if (f.u >= 0)
        in.insert(in.end(), steps_[f.u].in.begin() + f.k * kGroup,
                  steps_[f.u].in.begin() + (f.k + 1) * kGroup);
    WeightGradAdamAttrs attrs = with_adam({}, adam);
    attrs.sum_index = bias ? prod.attrs.as<WeightBiasGradAttrs>().sum_index : -1;
    attrs.weight_update = wu.index;
    attrs.bias_update = b.u >= 0 ? steps_[b.u].index : -1;
    // (On the weight gradient, beside the product's own: what the dump shows it by.)
    note(in[3].buf,
         cat(op_name(prod.op), " and adam_update in one: ", recorded_as(prod.index, wu.index)));
    taken[weight.u][weight.k] = 1;
    if (b.u >= 0) taken[b.u][b.k] = 1;
    Step& folded = steps_[w];  // keeps its index, the weight gradient's
    folded.op = Op::WeightGradAdam;
    folded.attrs = AttrBlob::of(attrs);
    folded.in = std::move(in);
    folded.out.clear();
    folded.live = wu.live;
  }
  // Each update keeps the groups left, or goes.
  for (int u = 0; u < n; ++u) {
    if (taken[u].empty()) continue;
    Step& up = steps_[u];
    decltype(Step::in) left;
    for (size_t k = 0; k < taken[u].size(); ++k)
      if (!taken[u][k])
        left.insert(left.end(), up.in.begin() + k * kGroup, up.in.begin() + (k + 1) * kGroup);
    if (left.empty()) {
      drop_[u] = 1;
    } else if (left.size() != up.in.size()) {
      up.in = std::move(left);
    }
  }
}

// After the early updates, so that each update already follows the steps it depends on (and an
// update the plan moved early has been counted as such).
void Plan::fold_updates() {
  std::vector<char> throws(all_.size());
  for (size_t t = 0; t < all_.size(); ++t) throws[t] = throws_midway(all_[t]) ? 1 : 0;
  const std::vector<int> memory = storage_ids();
  Rewriter r(all_, n_forward_, rec_->buffers, escape_, memory, recorded_forward_, rewrite_notes_);
  r.fold_adam_updates(device_.type, throws);
  r.finish();
}

}  // namespace encore::schedule
