// The op traits table: one row per Op with everything the runtime and the planner need to know of
// it (operand counts, kind, attribute struct, mutated inputs, and whether it is elementwise,
// fusable, broadcasts a one-element operand or draws random numbers). The dispatcher checks
// calls against it, the fused kernel and the planner's passes read it; a new op adds its row here
// and nowhere else. The table is checked at compile time to list every Op in enum order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "runtime/ops.h"

namespace encore {

// OpTraits::flags.
// Output element i depends only on element i of each input, and every input has the output's
// shape (except a broadcast one-element operand, kBroadcastsOne), so the output may overwrite
// an input dying at the step (the planner's in-place reuse).
inline constexpr uint8_t kElementwise = 1 << 0;
// Elementwise (or where, whose bool condition a run reads from outside), one output, and computed
// by the fused kernel (kernels/cpu/fused.cc): a step may be part of a FusedElementwise run
// (runtime/fused.h).
inline constexpr uint8_t kFusable = 1 << 1;
// A binary elementwise op that reads a one-element operand as a scalar.
inline constexpr uint8_t kBroadcastsOne = 1 << 2;
// Draws from a device Generator: its RandomAttrs seed and offset were reserved at call time, and
// a replay must reserve fresh ones.
inline constexpr uint8_t kRandom = 1 << 3;
// An optimizer's in-place update of one parameter (and its state) from its gradient: a plan may
// run it as soon as its inputs are final (schedule/early_updates.cc).
inline constexpr uint8_t kOptimizerUpdate = 1 << 4;
// Its cpu kernel splits large calls across threads (parallel_for): a two-lane schedule may run it
// on both lanes (schedule/lanes.cc). A kernel without it runs on the calling thread alone.
inline constexpr uint8_t kSplits = 1 << 5;
// Works row by row along the last axis (a reduction over it, softmax, layer_norm ...) and the fused
// kernel has its row function (kernels/cpu/fused_rows.h): a step over the last axis may join a
// fused run. At most kMaxRowOpOutputs outputs (FusedInstr::kMaxOutputs).
inline constexpr uint8_t kRowFusable = 1 << 6;
inline constexpr int kMaxRowOpOutputs = 3;
// A collective (dist/): every rank must make the same calls in the same order, and the buffer is
// the communication's between a start and its wait. A plan never drops one (a rank that skipped
// it would leave the others waiting), keeps them in recorded order and runs them on the calling
// thread (schedule/lanes.cc).
inline constexpr uint8_t kCollective = 1 << 7;

// OpTraits::outputs of an op that takes any number of outputs from 1 to kMaxOpOutputs (the
// autograd masks hold 8 bits).
inline constexpr int8_t kAnyOutputs = -2;
inline constexpr int kMaxOpOutputs = 8;

struct OpTraits {
  Op op;
  std::string_view name;
  OpKind kind;
  int8_t min_inputs;
  int8_t max_inputs;  // -1: any number
  int8_t outputs;     // -1: a planner-made op, never dispatched; kAnyOutputs: 1 to 8
  AttrType attrs;     // the attribute struct its calls carry
  uint16_t mutates;   // Inplace: bit i set when input i is written (of each group, see below)
  uint8_t flags;      // kElementwise, kFusable, kBroadcastsOne, kRandom, kOptimizerUpdate, kSplits,
                      // kRowFusable, kCollective
  // 0, or: the inputs come in groups of this many (an optimizer update of several parameters in
  // one call, as PyTorch's foreach), min_inputs is one group, and `mutates` describes each group.
  int8_t group = 0;
};

inline constexpr OpTraits kOpTraits[] = {
    {Op::Add, "add", OpKind::Compute, 2, 2, 1, AttrType::None, 0,
     kElementwise | kFusable | kBroadcastsOne},
    {Op::Sub, "sub", OpKind::Compute, 2, 2, 1, AttrType::None, 0,
     kElementwise | kFusable | kBroadcastsOne},
    {Op::Mul, "mul", OpKind::Compute, 2, 2, 1, AttrType::None, 0,
     kElementwise | kFusable | kBroadcastsOne},
    {Op::Div, "div", OpKind::Compute, 2, 2, 1, AttrType::None, 0,
     kElementwise | kFusable | kBroadcastsOne},
    {Op::AddScalar, "add_scalar", OpKind::Compute, 1, 1, 1, AttrType::Scalar, 0,
     kElementwise | kFusable},
    {Op::MulScalar, "mul_scalar", OpKind::Compute, 1, 1, 1, AttrType::Scalar, 0,
     kElementwise | kFusable},
    {Op::RsubScalar, "rsub_scalar", OpKind::Compute, 1, 1, 1, AttrType::Scalar, 0,
     kElementwise | kFusable},
    {Op::DivScalar, "div_scalar", OpKind::Compute, 1, 1, 1, AttrType::Scalar, 0,
     kElementwise | kFusable},
    {Op::RdivScalar, "rdiv_scalar", OpKind::Compute, 1, 1, 1, AttrType::Scalar, 0,
     kElementwise | kFusable},
    {Op::PowScalar, "pow_scalar", OpKind::Compute, 1, 1, 1, AttrType::Scalar, 0,
     kElementwise | kFusable},
    {Op::Neg, "neg", OpKind::Compute, 1, 1, 1, AttrType::None, 0, kElementwise | kFusable},
    {Op::Exp, "exp", OpKind::Compute, 1, 1, 1, AttrType::None, 0, kElementwise | kFusable},
    {Op::Log, "log", OpKind::Compute, 1, 1, 1, AttrType::None, 0, kElementwise | kFusable},
    {Op::Sqrt, "sqrt", OpKind::Compute, 1, 1, 1, AttrType::None, 0, kElementwise | kFusable},
    {Op::Relu, "relu", OpKind::Compute, 1, 1, 1, AttrType::None, 0, kElementwise | kFusable},
    {Op::LeakyRelu, "leaky_relu", OpKind::Compute, 1, 1, 1, AttrType::Scalar, 0,
     kElementwise | kFusable},
    {Op::Sigmoid, "sigmoid", OpKind::Compute, 1, 1, 1, AttrType::None, 0, kElementwise | kFusable},
    {Op::Tanh, "tanh", OpKind::Compute, 1, 1, 1, AttrType::None, 0, kElementwise | kFusable},
    {Op::Gelu, "gelu", OpKind::Compute, 1, 1, 1, AttrType::Scalar, 0, kElementwise | kFusable},
    {Op::ReluGrad, "relu_grad", OpKind::Compute, 2, 2, 1, AttrType::None, 0,
     kElementwise | kFusable},
    {Op::LeakyReluGrad, "leaky_relu_grad", OpKind::Compute, 2, 2, 1, AttrType::Scalar, 0,
     kElementwise | kFusable},
    {Op::SigmoidGrad, "sigmoid_grad", OpKind::Compute, 2, 2, 1, AttrType::None, 0,
     kElementwise | kFusable},
    {Op::TanhGrad, "tanh_grad", OpKind::Compute, 2, 2, 1, AttrType::None, 0,
     kElementwise | kFusable},
    {Op::GeluGrad, "gelu_grad", OpKind::Compute, 2, 2, 1, AttrType::Scalar, 0,
     kElementwise | kFusable},
    {Op::Equal, "equal", OpKind::Compute, 2, 2, 1, AttrType::None, 0, 0},
    {Op::Greater, "greater", OpKind::Compute, 2, 2, 1, AttrType::None, 0, 0},
    {Op::Where, "where", OpKind::Compute, 3, 3, 1, AttrType::None, 0, kFusable},
    {Op::Matmul, "matmul", OpKind::Compute, 2, 2, 1, AttrType::Matmul, 0, kSplits},
    {Op::Linear, "linear", OpKind::Compute, 2, 3, 1, AttrType::None, 0, kSplits},
    {Op::Sum, "sum", OpKind::Compute, 1, 1, 1, AttrType::Reduce, 0, kRowFusable},
    {Op::Mean, "mean", OpKind::Compute, 1, 1, 1, AttrType::Reduce, 0, kRowFusable},
    {Op::Max, "max", OpKind::Compute, 1, 1, 1, AttrType::Reduce, 0, kRowFusable},
    {Op::Reshape, "reshape", OpKind::View, 1, 1, 1, AttrType::None, 0, 0},
    {Op::Alias, "alias", OpKind::View, 1, 1, 1, AttrType::None, 0, 0},
    {Op::Permute, "permute", OpKind::Compute, 1, 1, 1, AttrType::Permute, 0, 0},
    {Op::BroadcastTo, "broadcast_to", OpKind::Compute, 1, 1, 1, AttrType::None, 0, 0},
    {Op::Concat, "concat", OpKind::Compute, 1, -1, 1, AttrType::Axis, 0, 0},
    {Op::Split, "split", OpKind::Compute, 1, 1, kAnyOutputs, AttrType::Axis, 0, 0},
    {Op::Slice, "slice", OpKind::Compute, 1, 1, 1, AttrType::Slice, 0, 0},
    {Op::SliceGrad, "slice_grad", OpKind::Compute, 1, 1, 1, AttrType::Slice, 0, 0},
    {Op::Copy, "copy", OpKind::Compute, 1, 1, 1, AttrType::None, 0, kElementwise},
    {Op::Softmax, "softmax", OpKind::Compute, 1, 1, 1, AttrType::Axis, 0, kRowFusable},
    {Op::LogSoftmax, "log_softmax", OpKind::Compute, 1, 1, 1, AttrType::Axis, 0, kRowFusable},
    {Op::SoftmaxGrad, "softmax_grad", OpKind::Compute, 2, 2, 1, AttrType::Axis, 0, kRowFusable},
    {Op::LogSoftmaxGrad, "log_softmax_grad", OpKind::Compute, 2, 2, 1, AttrType::Axis, 0,
     kRowFusable},
    {Op::SoftmaxCrossEntropy, "softmax_cross_entropy", OpKind::Compute, 2, 2, 1,
     AttrType::CrossEntropy, 0, 0},
    {Op::SoftmaxCrossEntropyGrad, "softmax_cross_entropy_grad", OpKind::Compute, 3, 3, 1,
     AttrType::CrossEntropy, 0, 0},
    {Op::MeanSquaredError, "mean_squared_error", OpKind::Compute, 2, 2, 1, AttrType::None, 0, 0},
    {Op::Accuracy, "accuracy", OpKind::Compute, 2, 2, 1, AttrType::CrossEntropy, 0, 0},
    {Op::Conv2d, "conv2d", OpKind::Compute, 2, 3, 1, AttrType::Conv2d, 0, kSplits},
    {Op::Conv2dGradInput, "conv2d_grad_input", OpKind::Compute, 2, 2, 1, AttrType::Conv2d, 0,
     kSplits},
    {Op::Conv2dGradWeight, "conv2d_grad_weight", OpKind::Compute, 2, 2, 1, AttrType::Conv2d, 0,
     kSplits},
    {Op::MaxPool2d, "max_pool2d", OpKind::Compute, 1, 1, 1, AttrType::Pool2d, 0, kSplits},
    {Op::MaxPool2dGrad, "max_pool2d_grad", OpKind::Compute, 2, 2, 1, AttrType::Pool2d, 0, kSplits},
    {Op::AvgPool2d, "avg_pool2d", OpKind::Compute, 1, 1, 1, AttrType::Pool2d, 0, kSplits},
    {Op::AvgPool2dGrad, "avg_pool2d_grad", OpKind::Compute, 1, 1, 1, AttrType::Pool2d, 0, kSplits},
    {Op::BatchNorm, "batch_norm", OpKind::Compute, 1, 3, 3, AttrType::BatchNorm, 0, kSplits},
    {Op::BatchNormInference, "batch_norm_inference", OpKind::Compute, 3, 5, 1, AttrType::BatchNorm,
     0, kSplits},
    {Op::BatchNormGrad, "batch_norm_grad", OpKind::Compute, 4, 5, 3, AttrType::BatchNorm, 0,
     kSplits},
    {Op::Dropout, "dropout", OpKind::Compute, 1, 1, 2, AttrType::Random, 0, kRandom | kSplits},
    {Op::Embedding, "embedding", OpKind::Compute, 2, 2, 1, AttrType::Embedding, 0, kSplits},
    {Op::EmbeddingGrad, "embedding_grad", OpKind::Compute, 2, 2, 1, AttrType::Embedding, 0,
     kSplits},
    {Op::LayerNorm, "layer_norm", OpKind::Compute, 1, 3, 3, AttrType::LayerNorm, 0,
     kSplits | kRowFusable},
    {Op::LayerNormGrad, "layer_norm_grad", OpKind::Compute, 4, 5, 3, AttrType::LayerNorm, 0,
     kSplits},
    {Op::Fill, "fill_", OpKind::Inplace, 1, 1, 0, AttrType::Scalar, 0b1, 0},
    {Op::Arange, "arange_", OpKind::Inplace, 1, 1, 0, AttrType::None, 0b1, 0},
    {Op::AddInplace, "add_", OpKind::Inplace, 2, 2, 0, AttrType::None, 0b1, 0},
    {Op::CopyInplace, "copy_", OpKind::Inplace, 2, 2, 0, AttrType::None, 0b1, 0},
    {Op::UniformInit, "uniform_", OpKind::Inplace, 1, 1, 0, AttrType::Random, 0b1, kRandom},
    {Op::NormalInit, "normal_", OpKind::Inplace, 1, 1, 0, AttrType::Random, 0b1, kRandom},
    // The optimizer updates take one group of inputs per parameter, any number of groups.
    // Writes param (inputs: param, grad).
    {Op::SgdUpdate, "sgd_update", OpKind::Inplace, 2, -1, 0, AttrType::Sgd, 0b1, kOptimizerUpdate,
     2},
    // Writes param and velocity (inputs: param, grad, velocity).
    {Op::MomentumSgdUpdate, "momentum_sgd_update", OpKind::Inplace, 3, -1, 0, AttrType::Sgd, 0b101,
     kOptimizerUpdate, 3},
    // Writes param, m, v and the step counter (inputs: param, grad, m, v, step).
    {Op::AdamUpdate, "adam_update", OpKind::Inplace, 5, -1, 0, AttrType::Adam, 0b11101,
     kOptimizerUpdate | kSplits, 5},
    {Op::BatchNormStatsUpdate, "batch_norm_stats_update", OpKind::Inplace, 4, 4, 0,
     AttrType::BatchNorm, 0b11, 0},
    {Op::FusedElementwise, "fused_elementwise", OpKind::Compute, 1, -1, -1, AttrType::Fused, 0, 0},
    {Op::LinearAct, "linear_act", OpKind::Compute, 2, 3, -1, AttrType::Act, 0, kSplits},
    {Op::Conv2dAct, "conv2d_act", OpKind::Compute, 2, 3, -1, AttrType::Conv2dAct, 0, kSplits},
    {Op::MatmulActGrad, "matmul_act_grad", OpKind::Compute, 3, 3, -1, AttrType::MatmulAct, 0,
     kSplits},
    {Op::MatmulAccumulate, "matmul_accumulate", OpKind::Inplace, 3, 3, -1, AttrType::Matmul, 0b100,
     0},
    {Op::WeightBiasGrad, "weight_bias_grad", OpKind::Compute, 2, 2, -1, AttrType::WeightBiasGrad, 0,
     kSplits},
    {Op::LossGradMatmul, "loss_grad_matmul", OpKind::Compute, 4, 7, -1, AttrType::LossGradMatmul, 0,
     kSplits},
    // Writes every input from the third on: the two gradients, and each parameter's update.
    {Op::WeightGradAdam, "weight_grad_adam", OpKind::Inplace, kWeightGradAdamInputs,
     kWeightGradAdamBiasInputs, -1, AttrType::WeightGradAdam, 0xfffc, kSplits},
    {Op::StridedCopy, "strided_copy", OpKind::Compute, 1, -1, kAnyOutputs, AttrType::StridedCopy, 0,
     0},
    {Op::AllReduceStart, "all_reduce_start", OpKind::Compute, 1, 1, 1, AttrType::Collective, 0,
     kCollective},
    // Writes the buffer (inputs: buffer, handle).
    {Op::AllReduceWait, "all_reduce_wait", OpKind::Inplace, 2, 2, 0, AttrType::Collective, 0b01,
     kCollective},
};

namespace detail {
constexpr bool op_traits_consistent() {
  if (std::size(kOpTraits) != kNumOps) return false;
  for (int i = 0; i < kNumOps; ++i) {
    const OpTraits& t = kOpTraits[i];
    if (static_cast<int>(t.op) != i) return false;
    // Fusable implies elementwise (or where) with one output; broadcasting implies fusable and
    // binary.
    if ((t.flags & kFusable) &&
        (!((t.flags & kElementwise) || t.op == Op::Where) || t.outputs != 1))
      return false;
    if ((t.flags & kBroadcastsOne) && (!(t.flags & kFusable) || t.max_inputs != 2)) return false;
    if ((t.flags & kRandom) && t.attrs != AttrType::Random) return false;
    if ((t.flags & kRowFusable) &&
        (t.kind != OpKind::Compute || t.outputs < 1 || t.outputs > kMaxRowOpOutputs))
      return false;
    if ((t.flags & kOptimizerUpdate) && t.kind != OpKind::Inplace) return false;
    if ((t.mutates != 0) != (t.kind == OpKind::Inplace)) return false;
    if ((t.flags & kCollective) && (t.flags & ~kCollective) != 0) return false;
    if (t.group != 0 &&
        (t.group != t.min_inputs || t.max_inputs != -1 || t.kind != OpKind::Inplace))
      return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::op_traits_consistent(),
              "kOpTraits must list every Op in enum order, with consistent flags");

constexpr const OpTraits& op_traits(Op op) {
  return kOpTraits[static_cast<int>(op)];
}

constexpr std::string_view op_name(Op op) {
  return op_traits(op).name;
}
constexpr OpKind op_kind(Op op) {
  return op_traits(op).kind;
}
// The attribute struct calls of `op` carry (the dispatcher checks each call's AttrBlob).
constexpr AttrType op_attr_type(Op op) {
  return op_traits(op).attrs;
}
// Whether the attributes of `op` are a ScalarAttrs.
constexpr bool op_has_scalar_attrs(Op op) {
  return op_attr_type(op) == AttrType::Scalar;
}
// Bit i is set when input i (of each group, for an op with input groups) is written in place
// (its version counter is bumped); 0 for ops that are not Inplace. Use op_writes_input for one
// input of a call.
constexpr uint16_t op_mutated_inputs(Op op) {
  return op_traits(op).mutates;
}
// Inputs per group of an op whose inputs come in groups (OpTraits::group), else 0.
constexpr int op_input_group(Op op) {
  return op_traits(op).group;
}
// See kElementwise, kFusable, kBroadcastsOne, kRandom, kOptimizerUpdate, kSplits, kRowFusable.
constexpr bool op_elementwise(Op op) {
  return (op_traits(op).flags & kElementwise) != 0;
}
constexpr bool op_fusable(Op op) {
  return (op_traits(op).flags & kFusable) != 0;
}
constexpr bool op_broadcasts_one(Op op) {
  return (op_traits(op).flags & kBroadcastsOne) != 0;
}
constexpr bool op_row_fusable(Op op) {
  return (op_traits(op).flags & kRowFusable) != 0;
}
constexpr bool op_draws_random(Op op) {
  return (op_traits(op).flags & kRandom) != 0;
}
constexpr bool op_optimizer_update(Op op) {
  return (op_traits(op).flags & kOptimizerUpdate) != 0;
}
constexpr bool op_splits(Op op) {
  return (op_traits(op).flags & kSplits) != 0;
}
constexpr bool op_collective(Op op) {
  return (op_traits(op).flags & kCollective) != 0;
}
// Whether `op` reads exactly two tensors (a fused instruction's operands a and b).
constexpr bool op_reads_two(Op op) {
  return op_traits(op).min_inputs == 2 && op_traits(op).max_inputs == 2;
}

// The name of an attribute struct, for messages.
constexpr std::string_view attr_type_name(AttrType t) {
  // clang-format off
  constexpr std::string_view kNames[] = {
      "NoAttrs",        "ScalarAttrs",    "MatmulAttrs",         "ReduceAttrs",
      "PermuteAttrs",   "AxisAttrs",      "SliceAttrs",          "CrossEntropyAttrs",
      "Conv2dAttrs",    "Pool2dAttrs",    "BatchNormAttrs",      "RandomAttrs",
      "FusedAttrs",     "SgdAttrs",       "AdamAttrs",           "ActAttrs",
      "Conv2dActAttrs", "MatmulActAttrs", "WeightBiasGradAttrs", "LossGradMatmulAttrs",
      "WeightGradAdamAttrs", "EmbeddingAttrs", "LayerNormAttrs", "CollectiveAttrs",
      "StridedCopyAttrs"};
  // clang-format on
  static_assert(std::size(kNames) == static_cast<size_t>(AttrType::StridedCopy) + 1);
  return kNames[static_cast<int>(t)];
}

// Bit i of a per-operand mask (mutated, saved inputs ...); false past the mask's width, since
// ops such as concat take any number of operands.
constexpr bool mask_bit(uint16_t mask, size_t i) {
  return i < 16 && (mask >> i & 1) != 0;
}

// Whether a call of `op` writes its input i in place.
constexpr bool op_writes_input(Op op, size_t i) {
  const OpTraits& t = op_traits(op);
  return mask_bit(t.mutates, t.group > 0 ? i % static_cast<size_t>(t.group) : i);
}

// Calls f on each operand a step of `op` writes, in order: the inputs an Inplace op updates,
// else the outputs. (The bytes verify mode compares.)
template <typename T, typename F>
void for_each_written(Op op, std::span<const T> in, std::span<const T> out, F&& f) {
  if (op_mutated_inputs(op) != 0) {
    for (size_t i = 0; i < in.size(); ++i)
      if (op_writes_input(op, i)) f(in[i]);
  } else {
    for (const T& o : out) f(o);
  }
}

}  // namespace encore
