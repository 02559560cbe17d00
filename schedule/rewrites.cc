// Fewer passes over activations and gradients (unless ENCORE_STATIC_FOLD=0): six rewrites of a
// recording that each keep eager's bits, the sixth in loss_folds.cc. CUDA plans get the first two,
// the fifth and the sixth, for the products small enough for encore's own GEMM kernels
// (runtime/small_gemm.h), whose outputs are finished by the activation (or its gradient) in the
// same kernel, which sum a bias gradient beside its weight gradient, and which compute a loss's
// gradient as the rows of their a: cpu plans get all six.
//
// 1. Producer and activation in one (forward): a Linear or Conv2d whose output only an activation
//    (relu, leaky_relu, sigmoid, tanh, gelu) reads becomes a LinearAct or Conv2dAct step that
//    applies the activation to each part of its output right after computing it
//    (kernels/cpu/matmul.cc, conv.cc), with the activation's own element function: the
//    pre-activation is never stored, and the separate pass that read it and wrote the activation
//    is gone. ReLU's, sigmoid's and tanh's gradients read the activation's output, so the
//    pre-activation usually has no other reader; leaky_relu's and gelu's gradients read its input,
//    which keeps that pair apart in a training step (without a backward they fold). The
//    activation's attribute (leaky_relu's slope, gelu's form) is the ActAttrs scalar.
// 2. Gradient product and activation gradient in one (backward): an activation gradient
//    (relu_grad, leaky_relu_grad, sigmoid_grad, tanh_grad, gelu_grad) whose incoming gradient
//    comes from a Matmul that nothing else reads becomes a MatmulActGrad step: each part of the
//    product goes through the gradient's element function (relu_grad is a select, y <= 0 ? +0 :
//    gy, not a product, so -0.0 and NaN in gy pass as they do eagerly) right after the part is
//    computed.
// 3. Outer product added into a gradient: an add_ (G += d) whose d comes from a Matmul with k = 1
//    (a weight gradient at batch 1) that nothing else reads becomes one MatmulAccumulate step
//    adding each product into G as it is computed (kernels/cpu/matmul.cc): d is never stored.
// 4. Max pooling before a ReLU: max_pool2d(relu(x)) runs as relu(max_pool2d(x)) (the ReLU over a
//    quarter of the elements for 2x2 windows), and its backward, relu_grad(r, max_pool2d_grad(r,
//    gp)), as max_pool2d_grad(x, relu_grad(p, gp)). Exact for every input, see swap_pool_relu.
// 5. Weight and bias gradients in one: a linear's gy^T x (a Matmul) and sum(gy, 0) after it
//    become one WeightBiasGrad step writing both. On CUDA its small GEMM kernel sums gy's columns
//    in the order of CUDA's column sum (kernels/cuda/column_sum.cuh), so one kernel replaces two;
//    on the cpu its kernel is the Matmul's, then the Sum's.
// 6. A loss's gradient and the product reading it in one, then the linear computing the logits
//    too (LossGradMatmul): loss_folds.cc.
//
// The rewritten step that writes what a recorded step wrote takes its index, so verify mode
// compares its bytes with that step's eager ones (a WeightBiasGrad's sums: the Sum's, and a
// LossGradMatmul's gradient: the SoftmaxCrossEntropyGrad's, whose indices their attributes hold); a
// step writing a value eager never computed (the pooled pre-activation, the masked gradient before
// it is pooled back, a fold writing one of these) has index -1 and is checked through what is
// computed from it. A recorded step whose value no step writes any more (the pre-activation, the
// unmasked gradient) is not compared.
#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/small_gemm.h"
#include "schedule/rewriter.h"

namespace encore::schedule {
namespace {

bool is_activation(Op op) {
  return op == Op::Relu || op == Op::LeakyRelu || op == Op::Sigmoid || op == Op::Tanh ||
         op == Op::Gelu;
}
bool is_activation_grad(Op op) {
  return op == Op::ReluGrad || op == Op::LeakyReluGrad || op == Op::SigmoidGrad ||
         op == Op::TanhGrad || op == Op::GeluGrad;
}
double scalar_of(const Step& s) {
  return op_has_scalar_attrs(s.op) ? s.attrs.as<ScalarAttrs>().value : 0.0;
}

// Whether product step s (a Linear, Conv2d or Matmul) can apply an activation or its gradient to
// its outputs on `device`: every one on the cpu; on CUDA a Linear or Matmul whose product runs on
// a small GEMM kernel (the kernels decide with the same functions from the same shapes).
bool takes_activation(const Step& s, DeviceType device) {
  if (device != DeviceType::CUDA) return true;
  if (s.op == Op::Conv2d) return false;
  const GemmShape g =
      s.op == Op::Linear
          ? linear_shape(s.in[0].shape, s.in[1].shape, s.out[0].shape)
          : matmul_shape(s.in[0].shape, s.in[1].shape, s.out[0].shape, s.attrs.as<MatmulAttrs>());
  return cuda_small_gemm(g) != SmallGemm::kNone;
}

// Whether weight-gradient step mm (a Matmul gy^T x) can also sum gy's columns on `device`: on the
// cpu (its kernel runs the Sum's after the product), on CUDA where its small GEMM kernel does.
bool sums_columns(const Step& mm, DeviceType device) {
  return device != DeviceType::CUDA ||
         cuda_small_gemm_sums_columns(matmul_shape(mm.in[0].shape, mm.in[1].shape, mm.out[0].shape,
                                                   mm.attrs.as<MatmulAttrs>()));
}

}  // namespace

// relu (step a: x -> r), max_pool2d (step m: r -> p) and, when the backward is recorded,
// max_pool2d_grad (g1: r, gp -> gr) and relu_grad (g2: r, gr -> gx) become max_pool2d (x -> p'),
// relu (p' -> p) at m, and relu_grad (p, gp -> gp'), max_pool2d_grad (x, gp' -> gx) at g1 and g2.
// Nothing else may read r or gr; x must be written once, before a.
//
// Why the bits are eager's, per window W (relu(v) = v <= 0 ? +0 : v keeps a NaN's bits; max_nan
// returns which NaN of W by the positions of the NaNs alone; the gradient goes to the first
// position equal to the maximum, NaN matching NaN):
// - W holds a NaN: r has NaNs at the same positions with the same bits, so both maxima are the
//   same NaN, relu keeps it, and the first maximum is the same position. relu_grad(NaN, g) is g
//   (NaN <= 0 is false) on both sides.
// - The maximum of x over W is positive: relu keeps every positive value and sends the rest to
//   +0, below it, so the maxima are equal and the positions equal to them are the same: same
//   first maximum, p = the maximum, and relu_grad passes gp unchanged on both sides.
// - The maximum is <= 0 (-0.0, -inf included): r is +0 over W and p is +0 both ways. Eagerly the
//   first position of W gets gp, and relu_grad sends it to +0 (r is +0 there); rewritten, gp' is
//   +0 and the first maximum of x gets +0 + 0 = +0.
// The pooling gradient adds each window's share into zeros in output order; an element of x > 0
// is the first maximum of the same windows of x and of r, and one <= 0 only of windows whose
// share is +0 rewritten and whose sum relu_grad replaces by +0 eagerly. So every element of the
// input gradient is the same sum in the same order. Padding does not matter: windows are clipped
// to the input (kernels/cpu/pool_passes.h), never padded with values.
void Rewriter::swap_pool_relu() {
  for (int a = 0; a < static_cast<int>(steps_.size()); ++a) {
    const Step& relu = steps_[a];
    if (relu.op != Op::Relu || drop_[a] || !floating(relu.out[0])) continue;
    const Operand x = relu.in[0], r = relu.out[0];
    if (!private_value(r, a) || bufs_[x.buf].kind != BufKind::Temp || escape_[x.buf] >= 0 ||
        writers(x).size() != 1 || writers(x)[0] >= a)
      continue;
    // Its readers: the pooling, then (a whole step records its backward in the same phase)
    // the pooling's gradient and relu_grad.
    int m = -1, g1 = -1, g2 = -1;
    bool other = false;
    for (int t : readers(r)) {
      const Step& s = steps_[t];
      const bool reads_r_first = s.in[0].buf == r.buf && s.in.size() == 2 && s.in[1].buf != r.buf;
      if (s.op == Op::MaxPool2d && m < 0 && same_phase(t, a) && s.in[0].nbytes() == nbytes(r))
        m = t;
      else if (s.op == Op::MaxPool2dGrad && m >= 0 && g1 < 0 && reads_r_first)
        g1 = t;
      else if (s.op == Op::ReluGrad && g1 >= 0 && g2 < 0 && same_phase(t, g1) && reads_r_first)
        g2 = t;
      else
        other = true;
    }
    if (other || m < 0 || drop_[m] || !after_[m].empty() || (g1 < 0) != (g2 < 0)) continue;
    const Step& pool = steps_[m];
    const Operand p = pool.out[0];
    if (!private_value(p, m)) continue;
    if (g1 >= 0) {
      const Step &pg = steps_[g1], &rg = steps_[g2];
      const Operand gr = pg.out[0];
      if (drop_[g1] || drop_[g2] || !private_value(gr, g1) || readers(gr) != std::vector<int>{g2} ||
          rg.in[1].buf != gr.buf ||
          std::memcmp(pg.attrs.bytes, pool.attrs.bytes, AttrBlob::kCapacity) != 0 ||
          !(pg.in[1].shape == p.shape))
        continue;
    }

    const Operand pooled = new_temp(p);
    Step pool_x{
        Op::MaxPool2d, pool.attrs, -1, {Operand{x.buf, pool.in[0].shape, x.dtype}}, {pooled}};
    Step relu_p{Op::Relu, relu.attrs, pool.index, {pooled}, {p}};
    note(pooled.buf, cat("max_pool2d before relu: ", recorded_as(relu.index, pool.index)));
    note(p.buf, cat("relu after max_pool2d: writes what step ", recorded(pool.index), " did"));
    steps_[m] = std::move(pool_x);
    after_[m].push_back(std::move(relu_p));
    drop_[a] = 1;
    if (g1 < 0) continue;
    Step &pg = steps_[g1], &rg = steps_[g2];
    const Operand gp = pg.in[1];
    const Operand masked = new_temp(gp);
    Step mask{Op::ReluGrad, rg.attrs, -1, {p, gp}, {masked}};
    Step unpool{Op::MaxPool2dGrad,
                pg.attrs,
                rg.index,
                {Operand{x.buf, pg.in[0].shape, x.dtype}, masked},
                {rg.out[0]}};
    note(masked.buf, cat("relu_grad before max_pool2d_grad: ", recorded_as(pg.index, rg.index)));
    note(rg.out[0].buf,
         cat("max_pool2d_grad after relu_grad: writes what step ", recorded(rg.index), " did"));
    pg = std::move(mask);
    rg = std::move(unpool);
  }
}

// A Linear or Conv2d (step l: ... -> h) and the activation that alone reads h (step a: h -> y)
// become one step at l writing y. Nothing between them reads or writes y (written by a alone).
void Rewriter::fold_producers(DeviceType device) {
  for (int a = 0; a < static_cast<int>(steps_.size()); ++a) {
    const Step& act = steps_[a];
    if (!is_activation(act.op) || drop_[a]) continue;
    const Operand h = act.in[0], y = act.out[0];
    if (!floating(y) || h.dtype != y.dtype || writers(h).size() != 1) continue;
    const int l = writers(h)[0];
    if (l >= a || !same_phase(l, a) || drop_[l] || !after_[l].empty()) continue;
    const Step& prod = steps_[l];
    if ((prod.op != Op::Linear && prod.op != Op::Conv2d) || !takes_activation(prod, device) ||
        prod.out[0].buf != h.buf || !private_value(h, l) || readers(h) != std::vector<int>{a} ||
        y.nbytes() != nbytes(y) || writers(y) != std::vector<int>{a} ||
        (!readers(y).empty() && readers(y)[0] < a))
      continue;
    const ActAttrs fn{act.op, {}, scalar_of(act)};
    const AttrBlob attrs = prod.op == Op::Linear
                               ? AttrBlob::of(fn)
                               : AttrBlob::of(Conv2dActAttrs{prod.attrs.as<Conv2dAttrs>(), 0, fn});
    note(y.buf, cat(op_name(prod.op), " and ", op_name(act.op),
                    " in one: ", recorded_as(prod.index, act.index)));
    steps_[l] = Step{prod.op == Op::Linear ? Op::LinearAct : Op::Conv2dAct,
                     attrs,
                     act.index,
                     prod.in,
                     {Operand{y.buf, prod.out[0].shape, y.dtype}}};
    drop_[a] = 1;
  }
}

// An activation gradient (step g: a, gy -> gx) whose gy comes from a Matmul (step m) that
// nothing else reads becomes one MatmulActGrad step at m writing gx. a must not change between
// m and g, and nothing between them reads or writes gx (written by g alone).
void Rewriter::fold_gradients(DeviceType device) {
  for (int g = 0; g < static_cast<int>(steps_.size()); ++g) {
    const Step& grad = steps_[g];
    if (!is_activation_grad(grad.op) || drop_[g]) continue;
    const Operand a = grad.in[0], gy = grad.in[1], gx = grad.out[0];
    if (!floating(gx) || a.dtype != gx.dtype || gy.dtype != gx.dtype || writers(gy).size() != 1 ||
        memory_[a.buf] == memory_[gy.buf])
      continue;
    const int m = writers(gy)[0];
    if (m >= g || !same_phase(m, g) || drop_[m] || !after_[m].empty()) continue;
    const Step& mm = steps_[m];
    if (mm.op != Op::Matmul || !takes_activation(mm, device) || mm.out[0].buf != gy.buf ||
        !private_value(gy, m) || readers(gy) != std::vector<int>{g} || gx.nbytes() != nbytes(gx) ||
        writers(gx) != std::vector<int>{g} || (!readers(gx).empty() && readers(gx)[0] < g) ||
        a.shape.numel() != gy.shape.numel())
      continue;
    const std::vector<int>& wa = writers(a);
    if (std::any_of(wa.begin(), wa.end(), [&](int t) { return t >= m && t < g; })) continue;
    const MatmulActAttrs attrs{
        mm.attrs.as<MatmulAttrs>(), {}, ActAttrs{grad.op, {}, scalar_of(grad)}};
    const Shape& shape = mm.out[0].shape;
    note(gx.buf,
         cat("matmul and ", op_name(grad.op), " in one: ", recorded_as(mm.index, grad.index)));
    steps_[m] = Step{Op::MatmulActGrad,
                     AttrBlob::of(attrs),
                     grad.index,
                     {mm.in[0], mm.in[1], Operand{a.buf, shape, a.dtype}},
                     {Operand{gx.buf, shape, gx.dtype}}};
    drop_[g] = 1;
  }
}

// An add_ (step u: G += d) whose d, of G's shape and dtype, comes from a Matmul (step m) of two
// matrices with k = 1 that nothing else reads becomes one MatmulAccumulate step at m updating G.
// Nothing between them reads or writes G, and G is neither factor nor just filled (a zeroed
// gradient's first contribution is the early-updates pass's, passes.cc).
void Rewriter::fold_accumulations() {
  for (int u = 0; u < static_cast<int>(steps_.size()); ++u) {
    const Step& add = steps_[u];
    if (add.op != Op::AddInplace || drop_[u]) continue;
    const Operand g = add.in[0], d = add.in[1];
    if (!floating(g) || d.dtype != g.dtype || !(d.shape == g.shape) || d.shape.rank() != 2 ||
        writers(d).size() != 1 || memory_[g.buf] == memory_[d.buf])
      continue;
    const int m = writers(d)[0];
    if (m >= u || !same_phase(m, u) || drop_[m] || !after_[m].empty()) continue;
    const Step& mm = steps_[m];
    if (mm.op != Op::Matmul || mm.out[0].buf != d.buf || !private_value(d, m) ||
        readers(d) != std::vector<int>{u} || g.nbytes() != nbytes(g))
      continue;
    const MatmulAttrs& attrs = mm.attrs.as<MatmulAttrs>();
    const Shape& a = mm.in[0].shape;
    if (a.rank() != 2 || mm.in[1].shape.rank() != 2 || (attrs.trans_a ? a[0] : a[1]) != 1) continue;
    if (memory_[mm.in[0].buf] == memory_[g.buf] || memory_[mm.in[1].buf] == memory_[g.buf])
      continue;
    const auto between = [&](const std::vector<int>& ts) {
      return std::any_of(ts.begin(), ts.end(), [&](int t) { return t > m && t < u; });
    };
    if (between(readers(g)) || between(writers(g))) continue;
    // A G just filled (zero_grad(false)) is the early-updates pass's: fill_ and add_ in one.
    const std::vector<int>& wg = writers(g);
    const auto before = std::find_if(wg.rbegin(), wg.rend(), [&](int t) { return t < m; });
    if (before != wg.rend() && steps_[*before].op == Op::Fill) continue;
    note(g.buf, cat("matmul and add_ in one: ", recorded_as(mm.index, add.index)));
    Step& folded = steps_[m];  // keeps its attributes (MatmulAttrs) and operands a, b
    folded.op = Op::MatmulAccumulate;
    folded.index = add.index;
    folded.in.push_back(g);
    folded.out.clear();
    drop_[u] = 1;
  }
}

// A Matmul (step m: gy^T x, gy stored [k, m]) and a later Sum of the same gy over its rows
// (step s: sum(gy, 0)) become one WeightBiasGrad step at m writing both. gy must not change
// between them, and the sum, written by s alone, must not be read before s (it is now written
// at m). On CUDA only where the product's kernel computes the sums too.
void Rewriter::fold_bias_gradients(DeviceType device) {
  for (int s = 0; s < static_cast<int>(steps_.size()); ++s) {
    const Step& sum = steps_[s];
    if (sum.op != Op::Sum || drop_[s]) continue;
    const Operand gy = sum.in[0], gb = sum.out[0];
    const ReduceAttrs& r = sum.attrs.as<ReduceAttrs>();
    if (!floating(gb) || gy.dtype != gb.dtype || gy.shape.rank() != 2 || r.axes_mask != 1 ||
        r.keepdims || gb.nbytes() != nbytes(gb) || writers(gb) != std::vector<int>{s})
      continue;
    const std::vector<int>& read_gb = readers(gb);
    const std::vector<int>& wrote_gy = writers(gy);
    if (!read_gb.empty() && read_gb[0] < s) continue;
    for (int m : readers(gy)) {
      if (m >= s) break;
      const Step& mm = steps_[m];
      if (mm.op != Op::Matmul || drop_[m] || !after_[m].empty() || !same_phase(m, s) ||
          mm.in[0].buf != gy.buf || !(mm.in[0].shape == gy.shape) || mm.in[1].shape.rank() != 2 ||
          mm.out[0].dtype != gb.dtype)
        continue;
      const MatmulAttrs& attrs = mm.attrs.as<MatmulAttrs>();
      if (!attrs.trans_a || attrs.trans_b) continue;
      if (memory_[gb.buf] == memory_[mm.out[0].buf] || memory_[gb.buf] == memory_[gy.buf] ||
          memory_[gb.buf] == memory_[mm.in[1].buf])
        continue;
      if (std::any_of(wrote_gy.begin(), wrote_gy.end(), [&](int t) { return t >= m && t < s; }) ||
          !sums_columns(mm, device))
        continue;
      note(mm.out[0].buf, cat("matmul and sum in one: ", recorded_as(mm.index, sum.index)));
      steps_[m] = Step{Op::WeightBiasGrad,
                       AttrBlob::of(WeightBiasGradAttrs{sum.index}),
                       mm.index,
                       {mm.in[0], mm.in[1]},
                       {mm.out[0], gb}};
      drop_[s] = 1;
      break;
    }
  }
}

void Rewriter::finish() {
  std::vector<Step> kept;
  int n_forward = 0;
  for (int t = 0; t < static_cast<int>(steps_.size()); ++t) {
    const int before = static_cast<int>(kept.size());
    if (!drop_[t]) kept.push_back(std::move(steps_[t]));
    for (Step& s : after_[t]) kept.push_back(std::move(s));
    if (t < n_forward_) n_forward += static_cast<int>(kept.size()) - before;
  }
  steps_ = std::move(kept);
  n_forward_ = n_forward;
}

// Each rewrite is its own pass over fresh reader and writer lists, in this order: the swap puts
// the ReLU after the pooling and its gradient before the pooling's, where the folds may take them.
void Plan::rewrite_activations() {
  const DeviceType device = device_.type;
  auto run = [&](auto rewrite) {
    const std::vector<int> memory = storage_ids();
    Rewriter r(all_, n_forward_, rec_->buffers, escape_, memory, recorded_forward_, rewrite_notes_);
    rewrite(r);
    r.finish();
  };
  if (device == DeviceType::CPU) run([](Rewriter& r) { r.swap_pool_relu(); });
  run([&](Rewriter& r) { r.fold_producers(device); });
  run([&](Rewriter& r) { r.fold_gradients(device); });
  if (device == DeviceType::CPU) run([](Rewriter& r) { r.fold_accumulations(); });
  run([&](Rewriter& r) { r.fold_bias_gradients(device); });
  run([&](Rewriter& r) { r.fold_loss_gradients(device); });
  run([&](Rewriter& r) { r.fold_loss_logits(device); });
}

}  // namespace encore::schedule
