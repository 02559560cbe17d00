// A loss's gradient and the product reading it in one step, then the linear computing the logits
// too (the sixth of the rewrites rewrites.cc runs, unless ENCORE_STATIC_FOLD=0): a
// SoftmaxCrossEntropyGrad (g, the gradient of the logits) and a later Matmul or MatmulActGrad of
// g, not transposed, by b (a classifier's last linear: its input gradient g W) become one
// LossGradMatmul step writing both g and the product; then the Linear computing the logits joins
// it, a third output. On CUDA the product's small GEMM kernel computes g's rows itself, as the
// gradient kernel does, and the logits in the kDot kernel's order, and stores them beside the
// product (kernels/cuda/loss_grad_gemm.cuh): one kernel for three on a training step's critical
// path, where its kernel takes the shapes (runtime/small_gemm.h). On the cpu its kernel runs the
// linear's, the gradient's and the product's kernels in turn (kernels/cpu/matmul.cc). Verify mode
// compares the step's outputs with the product's, the gradient's and the linear's recorded steps
// (their indices: the step's own and LossGradMatmulAttrs').
#include <algorithm>
#include <vector>

#include "runtime/small_gemm.h"
#include "runtime/value_checks.h"
#include "schedule/rewriter.h"

namespace encore::schedule {
namespace {

// Whether product step mm (a Matmul or MatmulActGrad, its attributes `product`) can compute its a
// as a loss's gradient on `device`: on the cpu (its kernel runs the gradient's first), on CUDA
// where its small GEMM kernel does.
bool computes_loss_grad(const Step& mm, const MatmulActAttrs& product, DeviceType device) {
  return device != DeviceType::CUDA ||
         cuda_small_gemm_computes_loss_grad(
             matmul_shape(mm.in[0].shape, mm.in[1].shape, mm.out[0].shape, product.matmul),
             mm.out[0].dtype);
}

// Whether LossGradMatmul step s can compute its logits too from Linear step lin on `device`: on
// the cpu (its kernel runs the linear's first), on CUDA where its kernel does.
bool computes_logits(const Step& s, const Step& lin, DeviceType device) {
  if (device != DeviceType::CUDA) return true;
  const GemmShape product = matmul_shape(s.out[1].shape, s.in[3].shape, s.out[0].shape,
                                         s.attrs.as<LossGradMatmulAttrs>().product.matmul);
  return cuda_small_gemm_computes_logits(
      product, linear_shape(lin.in[0].shape, lin.in[1].shape, lin.out[0].shape), s.out[0].dtype);
}

}  // namespace

// A SoftmaxCrossEntropyGrad (step c: logits, labels, gy -> g) and a later Matmul or
// MatmulActGrad (step m: g, b[, y] -> d) whose a is all of g, not transposed, become one
// LossGradMatmul step at c writing d and g. g stays written at c (other steps read it: the weight
// gradient); d, written by m alone, is written at c now, so nothing before m may read it, and
// nothing from c to m may write b or y.
void Rewriter::fold_loss_gradients(DeviceType device) {
  for (int c = 0; c < static_cast<int>(steps_.size()); ++c) {
    const Step& ce = steps_[c];
    if (ce.op != Op::SoftmaxCrossEntropyGrad || drop_[c] || !after_[c].empty()) continue;
    const Operand g = ce.out[0];
    if (!floating(g) || g.shape.rank() != 2 || g.nbytes() != nbytes(g) ||
        writers(g) != std::vector<int>{c})
      continue;
    for (int m : readers(g)) {
      if (m <= c) continue;
      const Step& mm = steps_[m];
      if ((mm.op != Op::Matmul && mm.op != Op::MatmulActGrad) || drop_[m] || !after_[m].empty() ||
          !same_phase(c, m) || mm.in[0].buf != g.buf || !(mm.in[0].shape == g.shape) ||
          mm.in[1].shape.rank() != 2 || mm.out[0].dtype != g.dtype)
        continue;
      const MatmulActAttrs product =
          mm.op == Op::Matmul
              ? MatmulActAttrs{mm.attrs.as<MatmulAttrs>(), {}, ActAttrs{Op::Matmul, {}, 0}}
              : mm.attrs.as<MatmulActAttrs>();
      if (product.matmul.trans_a) continue;
      // d is written by m alone and read after it only, and shares no storage with what the step
      // reads (its kernel's blocks read the logits, labels and gy while others write d).
      const Operand d = mm.out[0];
      const auto shares_d = [&](const Operand& o) { return memory_[o.buf] == memory_[d.buf]; };
      if (d.nbytes() != nbytes(d) || writers(d) != std::vector<int>{m} ||
          (!readers(d).empty() && readers(d)[0] < m) || shares_d(g) ||
          std::any_of(ce.in.begin(), ce.in.end(), shares_d))
        continue;
      const auto changes = [&](const Operand& o) {
        const std::vector<int>& w = writers(o);
        return memory_[o.buf] == memory_[g.buf] ||
               std::any_of(w.begin(), w.end(), [&](int t) { return t > c && t < m; });
      };
      if (std::any_of(mm.in.begin() + 1, mm.in.end(), changes) ||
          !computes_loss_grad(mm, product, device))
        continue;
      note(d.buf, cat(op_name(ce.op), " and ", op_name(mm.op),
                      " in one: ", recorded_as(ce.index, mm.index)));
      decltype(Step::in) in{ce.in[0], ce.in[1], ce.in[2]};
      in.insert(in.end(), mm.in.begin() + 1, mm.in.end());
      steps_[c] = Step{
          Op::LossGradMatmul,
          AttrBlob::of(LossGradMatmulAttrs{product, ce.attrs.as<CrossEntropyAttrs>(), ce.index}),
          mm.index,
          std::move(in),
          {d, g}};
      drop_[m] = 1;
      break;
    }
  }
}

// A Linear (step l: x, w[, bias] -> logits) and the LossGradMatmul (step s) reading its output as
// its logits become one LossGradMatmul step at l computing the logits too (a third output, still
// written at l for the loss and any other reader). s's other inputs must not change from l to s,
// and its outputs, written by s alone, must not be read before s. The step now checks the labels
// before the loss does: the first step from l to s that checks any must be the
// SoftmaxCrossEntropy of these logits and labels, which eagerly fails first on a bad one, and the
// step checks them as that loss (LossGradMatmulAttrs::linear), having written only the logits; no
// step before that loss may write what outlives the call's temporaries (eagerly it runs before the
// failure).
int Rewriter::checked_first(int l, int s) const {
  const Step& lg = steps_[s];
  for (int t = l + 1; t < s; ++t) {
    if (drop_[t]) continue;
    const Step& st = steps_[t];
    if (checked_input(st.op) >= 0) {
      const bool loss = st.op == Op::SoftmaxCrossEntropy && st.in[0].buf == lg.in[0].buf &&
                        st.in[0].shape == lg.in[0].shape && st.in[1].buf == lg.in[1].buf &&
                        st.attrs.as<CrossEntropyAttrs>().ignore_label ==
                            lg.attrs.as<LossGradMatmulAttrs>().loss.ignore_label;
      return loss ? t : -1;
    }
    bool state = false;
    for_each_written(st.op, std::span<const Operand>(st.in), std::span<const Operand>(st.out),
                     [&](const Operand& o) {
                       state = state || o.buf >= static_cast<int>(memory_.size()) ||
                               bufs_[o.buf].kind != BufKind::Temp || escape_[o.buf] >= 0;
                     });
    if (state) return -1;
  }
  return -1;  // no loss between them
}

void Rewriter::fold_loss_logits(DeviceType device) {
  for (int s = 0; s < static_cast<int>(steps_.size()); ++s) {
    const Step& lg = steps_[s];
    if (lg.op != Op::LossGradMatmul || drop_[s] || !after_[s].empty()) continue;
    const LossGradMatmulAttrs& attrs = lg.attrs.as<LossGradMatmulAttrs>();
    if (attrs.linear != 0) continue;
    const Operand logits = lg.in[0];
    if (writers(logits).size() != 1) continue;
    const int l = writers(logits)[0];
    if (l >= s || !same_phase(l, s) || drop_[l] || !after_[l].empty()) continue;
    const Step& lin = steps_[l];
    if (lin.op != Op::Linear || lin.out[0].buf != logits.buf ||
        lin.out[0].shape.numel() != logits.shape.numel() || logits.nbytes() != nbytes(logits))
      continue;
    const auto changes = [&](const Operand& o) {
      const std::vector<int>& w = writers(o);
      return memory_[o.buf] == memory_[logits.buf] ||
             std::any_of(w.begin(), w.end(), [&](int t) { return t > l && t < s; });
    };
    const auto read_early = [&](const Operand& o) {
      const std::vector<int>& r = readers(o);
      return writers(o) != std::vector<int>{s} || (!r.empty() && r[0] < s);
    };
    if (std::any_of(lg.in.begin() + 1, lg.in.end(), changes) ||
        std::any_of(lg.out.begin(), lg.out.end(), read_early) || !computes_logits(lg, lin, device))
      continue;
    const int loss = checked_first(l, s);
    if (loss < 0) continue;
    note(lg.out[0].buf, cat("linear and softmax_cross_entropy_grad in one: ",
                            recorded_as(lin.index, attrs.grad_index)));
    LossGradMatmulAttrs folded = attrs;
    folded.loss = steps_[loss].attrs.as<CrossEntropyAttrs>();  // checked as the loss checks
    folded.linear = 1;
    folded.linear_bias = lin.in.size() == 3 ? 1 : 0;
    folded.logits_index = lin.index;
    decltype(Step::in) in(lin.in.begin(), lin.in.end());
    in.insert(in.end(), lg.in.begin() + 1, lg.in.end());
    steps_[l] = Step{Op::LossGradMatmul,
                     AttrBlob::of(folded),
                     lg.index,
                     std::move(in),
                     {lg.out[0], lg.out[1], lin.out[0]}};
    drop_[s] = 1;
  }
}

}  // namespace encore::schedule
