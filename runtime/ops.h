// The op vocabulary: every op the dispatcher knows, and the attribute structs its kernels read.
// Routines (api/) create calls with these; kernels (kernels/) implement them; the tracer records
// them. An attribute struct is trivially copyable so a schedule can store it by value.
#pragma once

#include <cstdint>
#include <string_view>

namespace encore {

enum class Op : uint16_t {
  // Elementwise binary with broadcasting.
  Add,
  Sub,
  Mul,
  Div,
  // Tensor-scalar: x+s, x*s, s-x, x/s, s/x, x^s.
  AddScalar,
  MulScalar,
  RsubScalar,
  DivScalar,
  RdivScalar,
  PowScalar,
  // Elementwise unary.
  Neg,
  Exp,
  Log,
  Sqrt,
  Relu,
  LeakyRelu,
  Sigmoid,
  Tanh,
  // Backward helpers (gradients of the activations above; not differentiable themselves).
  ReluGrad,
  LeakyReluGrad,
  SigmoidGrad,
  TanhGrad,
  // Comparisons (bool output) and selection.
  Equal,
  Greater,
  Where,
  // Linear algebra.
  Matmul,
  Linear,
  // Reductions over an axis set.
  Sum,
  Mean,
  Max,
  // Layout.
  Reshape,
  Alias,  // detach(): a view cut from the graph
  Permute,
  BroadcastTo,
  Concat,
  Slice,
  SliceGrad,
  Copy,
  // Softmax family and losses.
  Softmax,
  LogSoftmax,
  SoftmaxGrad,
  LogSoftmaxGrad,
  SoftmaxCrossEntropy,
  SoftmaxCrossEntropyGrad,
  MeanSquaredError,
  Accuracy,
  // In-place: fills, accumulation, initialisers, optimizer updates.
  Fill,
  AddInplace,
  CopyInplace,
  UniformInit,
  NormalInit,
  SgdUpdate,
  MomentumSgdUpdate,
  AdamUpdate,
  kCount
};
inline constexpr int kNumOps = static_cast<int>(Op::kCount);

// How an op treats its operands.
enum class OpKind : uint8_t {
  Compute,  // writes fresh outputs
  View,     // output aliases input 0's storage; no kernel runs
  Inplace,  // writes input 0 (and, for optimizer updates, its state inputs); no outputs
};

std::string_view op_name(Op op);
OpKind op_kind(Op op);
// For Inplace ops: bit i is set when input i is written (its version counter is bumped).
uint8_t op_mutated_inputs(Op op);
// Whether the op draws from a device Generator (its RandomAttrs seed and offset were reserved at
// call time; a replay must reserve fresh ones).
bool op_draws_random(Op op);

// ---- Attribute structs --------------------------------------------------------------------
// No implicit padding: an AttrBlob copies the struct's bytes, and schedules compare blobs
// bytewise, so every byte must be a member with a defined value.

struct NoAttrs {};

struct ScalarAttrs {  // AddScalar ... PowScalar, LeakyRelu(Grad) slope, Fill value
  double value = 0;
};

// Whether the attributes of `op` are a ScalarAttrs.
constexpr bool op_has_scalar_attrs(Op op) {
  switch (op) {
    case Op::AddScalar:
    case Op::MulScalar:
    case Op::RsubScalar:
    case Op::DivScalar:
    case Op::RdivScalar:
    case Op::PowScalar:
    case Op::LeakyRelu:
    case Op::LeakyReluGrad:
    case Op::Fill:
      return true;
    default:
      return false;
  }
}

struct MatmulAttrs {  // C = op(A) op(B), op = transpose when the flag is set (last two axes)
  bool trans_a = false;
  bool trans_b = false;
};

struct ReduceAttrs {  // Sum, Mean, Max: axes as a bit mask over the input's dimensions
  uint8_t axes_mask = 0;
  bool keepdims = false;
};

struct PermuteAttrs {
  int8_t perm[8] = {};
};

// Axes in attributes are non-negative: routines resolve negative axes before dispatch.
struct AxisAttrs {  // Concat; Softmax, LogSoftmax and their grads
  int32_t axis = 0;
};

struct SliceAttrs {  // Slice and SliceGrad: elements start, start+step, ... < stop along axis
  int64_t axis = 0;
  int64_t start = 0;
  int64_t stop = 0;
  int64_t step = 1;
};

struct CrossEntropyAttrs {  // SoftmaxCrossEntropy(Grad), Accuracy
  int64_t ignore_label = -1;
};

struct RandomAttrs {  // UniformInit: U[a, b); NormalInit: N(a, b^2). Philox stream (seed, offset).
  double a = 0;
  double b = 1;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

struct SgdAttrs {  // SgdUpdate, MomentumSgdUpdate
  double lr = 0.01;
  double momentum = 0;
  double weight_decay = 0;
};

struct AdamAttrs {  // AdamUpdate; bias correction uses the step counter held in a state tensor
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool decoupled = false;  // AdamW
  uint8_t padding[7] = {};
};

}  // namespace encore
