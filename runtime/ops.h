// The op vocabulary: every op the dispatcher knows, and the attribute structs its kernels read.
// Routines (api/) create calls with these; kernels (kernels/) implement them; the tracer records
// them. An attribute struct is trivially copyable so a schedule can store it by value. What each
// op is (kind, operands, attribute struct, elementwise, fusable ...) is in runtime/op_traits.h.
#pragma once

#include <cstdint>

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
  Gelu,  // ScalarAttrs.value: 0 exact (erf), 1 the tanh approximation (kGeluTanh)
  // Backward helpers (gradients of the activations above; not differentiable themselves).
  ReluGrad,
  LeakyReluGrad,
  SigmoidGrad,
  TanhGrad,
  GeluGrad,  // x, gy -> gx
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
  Split,  // the inverse of Concat: one output per part
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
  // Convolution and pooling over NCHW tensors.
  Conv2d,            // x [N,C,H,W], w [O,C/g,kh,kw], optional bias [O] -> y [N,O,Ho,Wo]
  Conv2dGradInput,   // gy, w -> gx (its shape is the output's)
  Conv2dGradWeight,  // x, gy -> gw
  MaxPool2d,
  MaxPool2dGrad,  // x, gy -> gx (the gradient goes to the first maximum of each window)
  AvgPool2d,
  AvgPool2dGrad,  // gy -> gx
  // Normalisation and dropout.
  BatchNorm,           // x [N,C,...], optional gamma, beta [C] -> y, batch mean [C], batch var [C]
  BatchNormInference,  // x, running mean, running var, optional gamma, beta -> y
  BatchNormGrad,       // x, mean, var, gy, optional gamma -> gx, ggamma, gbeta
  Dropout,             // x -> y, mask (the kept elements scaled by 1/(1-ratio), others 0)
  // Sequence models.
  Embedding,      // ids [...] (int32, int64), weight [V, D] -> y [..., D] (EmbeddingAttrs)
  EmbeddingGrad,  // ids, gy [..., D] -> gw [V, D], a scatter-add in id order (no atomics)
  // x [R, C] (seen so: C the normalised elements), optional gamma, beta [C] (LayerNormAttrs says
  // which) -> y, mean [R], rstd [R] (1/sqrt(biased var + eps))
  LayerNorm,
  LayerNormGrad,  // x, mean, rstd, gy, optional gamma -> gx, ggamma [C], gbeta [C]
  // In-place: fills, accumulation, initialisers, optimizer updates.
  Fill,
  Arange,  // t[i] = i, over a 1-D t (arange())
  AddInplace,
  CopyInplace,
  UniformInit,
  NormalInit,
  SgdUpdate,
  MomentumSgdUpdate,
  AdamUpdate,
  // running mean, running var, batch mean, batch var: running = (1-m) running + m batch, the
  // variance unbiased by count/(count-1).
  BatchNormStatsUpdate,
  // Made by the planner, never dispatched: a run of elementwise steps of a cpu plan executed
  // block by block (FusedAttrs).
  FusedElementwise,
  // Made by the planner (schedule/rewrites.cc; on CUDA over small products, runtime/small_gemm.h),
  // never dispatched: a producer that applies an activation, or an activation's gradient, to each
  // element as it writes it.
  LinearAct,      // x, w, optional bias -> act(linear(x, w, bias)) (ActAttrs)
  Conv2dAct,      // x, w, optional bias -> act(conv2d(x, w, bias)) (Conv2dActAttrs)
  MatmulActGrad,  // a, b, y -> act_grad(y, matmul(a, b)), y what the gradient reads
                  // (MatmulActAttrs)
  // a, b, c (updated) -> c + matmul(a, b) for an outer product (k = 1; MatmulAttrs): each
  // product rounded, then added, as a Matmul and an add_ give.
  MatmulAccumulate,
  // a [k, m], b [k, n] -> a^T b [m, n] and a's column sums [m] (WeightBiasGradAttrs): a linear's
  // weight and bias gradients (gy^T x, sum(gy, 0)) in one step, each with the bits its own op
  // gives (schedule/rewrites.cc).
  WeightBiasGrad,
  // logits [m, k], labels [m], gy [], b, optional y -> the product of the cross-entropy gradient
  // g [m, k] and b (then MatmulActAttrs' activation gradient, y what it reads), and g itself
  // (LossGradMatmulAttrs): a loss's gradient and the input gradient of the linear before it in one
  // step, each with the bits its own op gives (schedule/loss_folds.cc). With `linear`, the logits
  // are computed too, from that linear's x, w and optional bias in their place, and are a third
  // output (loss_grad_matmul_inputs says where each input is).
  LossGradMatmul,
  // a [k, m], b [k, n], then per parameter an AdamUpdate group (the parameter, its gradient, m, v
  // and the step count; all written), first the weight's, then the bias's where there is one:
  // writes a^T b (the weight gradient) into the first group's gradient and sum(a, 0) (the bias
  // gradient) into the second's, then updates each parameter by Adam from it
  // (WeightGradAdamAttrs): a linear's weight and bias gradients and their optimizer updates in one
  // step, each with the bits its own op gives (schedule/update_folds.cc).
  WeightGradAdam,
  // Made by the planner for every device (schedule/layout_folds.cc), never dispatched: a chain
  // of layout steps (permute, slice, split, concat, copy) as one copy of its inputs' elements
  // into its output (StridedCopyAttrs; runtime/strided_copy.h).
  StridedCopy,
  // Collectives over the processes of a data-parallel job (dist/): every rank makes the same
  // calls in the same order (CollectiveAttrs).
  // buffer -> handle (int64 [1]): starts an in-place all-reduce of the buffer across ranks and
  // returns at once; the buffer belongs to the communication until the wait.
  AllReduceStart,
  // buffer (updated), handle: waits for the all-reduce the handle stands for; the buffer then
  // holds the reduction times CollectiveAttrs::scale (a mean's 1 / world_size: no pass of its own).
  AllReduceWait,
  kCount
};
inline constexpr int kNumOps = static_cast<int>(Op::kCount);

// How an op treats its operands.
enum class OpKind : uint8_t {
  Compute,  // writes fresh outputs
  View,     // output aliases input 0's storage; no kernel runs
  Inplace,  // writes input 0 (and, for optimizer updates, its state inputs); no outputs
};

// ---- Attribute structs --------------------------------------------------------------------
// No implicit padding: an AttrBlob copies the struct's bytes, and schedules compare blobs
// bytewise, so every byte must be a member with a defined value.

// Which attribute struct a call carries: the tag an AttrBlob keeps of the struct written into it
// (attr_type_of<T>), and each op's declared one (op_attr_type, runtime/op_traits.h).
enum class AttrType : uint8_t {
  None,  // NoAttrs, or a blob nothing was written into
  Scalar,
  Matmul,
  Reduce,
  Permute,
  Axis,
  Slice,
  CrossEntropy,
  Conv2d,
  Pool2d,
  BatchNorm,
  Random,
  Fused,
  Sgd,
  Adam,
  Act,
  Conv2dAct,
  MatmulAct,
  WeightBiasGrad,
  LossGradMatmul,
  WeightGradAdam,
  Embedding,
  LayerNorm,
  Collective,
  StridedCopy,
};
// AttrTypeOf<T>::value: the tag of attribute struct T (a struct without one does not compile).
template <typename T>
struct AttrTypeOf;
template <typename T>
inline constexpr AttrType attr_type_of = AttrTypeOf<T>::value;

struct NoAttrs {};

struct ScalarAttrs {  // AddScalar ... PowScalar, LeakyRelu(Grad) slope, Gelu(Grad) form, Fill value
  double value = 0;
};
// Gelu(Grad)'s ScalarAttrs.value: the exact form is 0, the tanh approximation this.
inline constexpr double kGeluTanh = 1;

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
struct AxisAttrs {  // Concat, Split; Softmax, LogSoftmax and their grads
  int32_t axis = 0;
};

struct SliceAttrs {  // Slice and SliceGrad: elements start, start+step, ... < stop along axis
  int64_t axis = 0;
  int64_t start = 0;
  int64_t stop = 0;
  int64_t step = 1;
  // The bounds the caller asked for, which Python's clamping made start and stop: a schedule
  // planned for another size clamps them as eager would (schedule/shape_rules.cc).
  int64_t asked_start = 0;
  int64_t asked_stop = 0;
};

struct CrossEntropyAttrs {  // SoftmaxCrossEntropy(Grad), Accuracy
  int64_t ignore_label = -1;
  // 1 for F::cross_entropy's call: a label out of range names it and its argument 'targets'
  // (int64_t: the blob holds no padding bytes).
  int64_t from_cross_entropy = 0;
};

struct Conv2dAttrs {  // Conv2d and its grads; [0] is height, [1] width
  int32_t stride[2] = {1, 1};
  int32_t padding[2] = {0, 0};
  int32_t dilation[2] = {1, 1};
  int32_t groups = 1;
  // Set only by a static cpu plan's padded layouts (runtime/padded_layout.h), 0 in every eager
  // call: a mask of kConvPaddedInput and kConvPaddedOutput.
  int32_t layout = 0;
  int16_t out_padding[2] = {0, 0};  // kConvPaddedOutput: zero rows, columns around each plane
};
// Conv2dAttrs::layout. Input x (Conv2d, Conv2dAct, Conv2dGradWeight) already lies padded by
// `padding` (padded_image_elements apart, runtime/padded_layout.h): the kernel reads it in place.
constexpr int32_t kConvPaddedInput = 1;
// Conv2d (Conv2dAct) writes y padded by `out_padding`, and zeros to every image's border and to
// the elements after its planes.
constexpr int32_t kConvPaddedOutput = 2;

struct Pool2dAttrs {  // MaxPool2d, AvgPool2d and their grads; [0] is height, [1] width
  int32_t kernel[2] = {1, 1};
  int32_t stride[2] = {1, 1};
  int32_t padding[2] = {0, 0};
  bool count_include_pad = true;  // AvgPool2d: padded zeros count in the divisor (PyTorch)
  uint8_t unused[7] = {};
};

struct BatchNormAttrs {  // BatchNorm, BatchNormInference, BatchNormGrad, BatchNormStatsUpdate
  double eps = 1e-5;
  double momentum = 0.1;
  int64_t count = 0;  // elements per channel in the batch (BatchNormStatsUpdate)
};

// UniformInit: U[a, b); NormalInit: N(a, b^2); Dropout: a is the ratio dropped. Philox stream
// (seed, offset).
struct RandomAttrs {
  double a = 0;
  double b = 1;
  uint64_t seed = 0;
  uint64_t offset = 0;
  // CUDA only, 0 elsewhere: the device address of a {seed, offset} pair the kernel reads instead
  // of the two fields above, so a replay captured in a CUDA graph draws fresh numbers each launch
  // (the plan writes the pair before the launch).
  uint64_t state_ptr = 0;
};

// FusedElementwise: the program of the step, owned by its plan.
struct FusedProgram;
struct FusedAttrs {
  const FusedProgram* program = nullptr;
};

// StridedCopy: the program of the step, owned by its plan.
struct StridedCopyProgram;
struct StridedCopyAttrs {
  const StridedCopyProgram* program = nullptr;
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

struct EmbeddingAttrs {  // Embedding, EmbeddingGrad: the row that gets no gradient, -1 for none
  int64_t padding_idx = -1;
};

// LayerNorm, LayerNormGrad: x is [R, cols] (its last dims flattened), `affine` a mask of
// kLayerNormGamma and kLayerNormBeta naming the optional inputs after x, in that order.
struct LayerNormAttrs {
  double eps = 1e-5;
  int64_t cols = 0;
  uint8_t affine = 0;
  uint8_t unused[7] = {};
};
inline constexpr uint8_t kLayerNormGamma = 1;
inline constexpr uint8_t kLayerNormBeta = 2;

// LinearAct, Conv2dAct, MatmulActGrad: the activation (Relu, LeakyRelu, Sigmoid, Tanh) or the
// activation gradient (ReluGrad, LeakyReluGrad, SigmoidGrad, TanhGrad) the producer applies, with
// the op's scalar (leaky_relu's slope).
struct ActAttrs {
  Op op = Op::Relu;
  uint16_t unused[3] = {};
  double scalar = 0;
};
struct Conv2dActAttrs {
  Conv2dAttrs conv;
  int32_t unused = 0;
  ActAttrs act;
};
struct MatmulActAttrs {
  MatmulAttrs matmul;
  uint8_t unused[6] = {};
  ActAttrs act;
};

// WeightBiasGrad: the recorded step whose value its second output (the column sums) holds, for
// verify mode (the first output's is the step's own).
struct WeightBiasGradAttrs {
  int32_t sum_index = -1;
};

// LossGradMatmul: the product (act.op Op::Matmul for none), the loss's attributes, the recorded
// steps whose values its second output (the loss gradient) and third (the logits, with `linear`)
// hold, for verify mode, and whether it computes the logits (`linear`) from a linear with a bias
// (`linear_bias`). With `linear` it runs before the loss (SoftmaxCrossEntropy) that eagerly
// checks the labels first: it checks them as that loss does (`loss` holds the loss's attributes).
struct LossGradMatmulAttrs {
  MatmulActAttrs product;
  CrossEntropyAttrs loss;
  int32_t grad_index = -1;
  int32_t logits_index = -1;
  uint8_t linear = 0;
  uint8_t linear_bias = 0;
  uint8_t unused[6] = {};
};

// Where LossGradMatmul's inputs are: the logits, or the linear's x, w and bias (`linear`); the
// labels, gy, the product's b and the activation gradient's y; -1 where absent.
struct LossGradMatmulInputs {
  int logits, x, w, bias, labels, gy, b, y;
};
constexpr LossGradMatmulInputs loss_grad_matmul_inputs(const LossGradMatmulAttrs& a) {
  const int head = a.linear == 0 ? 1 : a.linear_bias != 0 ? 3 : 2;
  return {a.linear == 0 ? 0 : -1,
          a.linear != 0 ? 0 : -1,
          a.linear != 0 ? 1 : -1,
          a.linear != 0 && a.linear_bias != 0 ? 2 : -1,
          head,
          head + 1,
          head + 2,
          a.product.act.op != Op::Matmul ? head + 3 : -1};
}

// WeightGradAdam: the optimizer's attributes (AdamAttrs' members; a live step's at the call
// replace them: schedule/executor.cc), then, for verify mode, the recorded steps whose values it
// writes besides its own index's (the weight gradient): the Sum's (the bias gradient) and the
// AdamUpdates of the weight and of the bias (-1: none).
struct WeightGradAdamAttrs {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool decoupled = false;
  uint8_t unused[3] = {};
  int32_t sum_index = -1;
  int32_t weight_update = -1;
  int32_t bias_update = -1;
};
constexpr AdamAttrs adam_attrs(const WeightGradAdamAttrs& a) {
  return {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.decoupled, {}};
}
// `a` with the optimizer's attributes `adam`.
constexpr WeightGradAdamAttrs with_adam(WeightGradAdamAttrs a, const AdamAttrs& adam) {
  a.lr = adam.lr;
  a.beta1 = adam.beta1;
  a.beta2 = adam.beta2;
  a.eps = adam.eps;
  a.weight_decay = adam.weight_decay;
  a.decoupled = adam.decoupled;
  return a;
}
// Its inputs: a, b, then per parameter an AdamUpdate group of kWeightGradAdamGroup (the parameter,
// its gradient, m, v and the step count), the weight's, then the bias's when it has
// kWeightGradAdamBiasInputs.
inline constexpr int kWeightGradAdamGroup = 5;
inline constexpr int kWeightGradAdamInputs = 2 + kWeightGradAdamGroup;
inline constexpr int kWeightGradAdamBiasInputs = 2 + 2 * kWeightGradAdamGroup;

// How a collective combines the ranks' values.
enum class ReduceOp : uint8_t { Sum, Max, Min };

struct CollectiveAttrs {  // AllReduceStart, AllReduceWait
  int32_t comm = 0;       // the communicator's index (0: every process of the job)
  ReduceOp reduce = ReduceOp::Sum;
  uint8_t unused[3] = {};
  // AllReduceWait on the cpu: the result is multiplied by this (in the dtype, as mul_scalar
  // does), float32 and float64 only.
  double scale = 1;
};

// The tags of the structs above.
template <AttrType kType>
struct AttrTag {
  static constexpr AttrType value = kType;
};
template <>
struct AttrTypeOf<NoAttrs> : AttrTag<AttrType::None> {};
template <>
struct AttrTypeOf<ScalarAttrs> : AttrTag<AttrType::Scalar> {};
template <>
struct AttrTypeOf<MatmulAttrs> : AttrTag<AttrType::Matmul> {};
template <>
struct AttrTypeOf<ReduceAttrs> : AttrTag<AttrType::Reduce> {};
template <>
struct AttrTypeOf<PermuteAttrs> : AttrTag<AttrType::Permute> {};
template <>
struct AttrTypeOf<AxisAttrs> : AttrTag<AttrType::Axis> {};
template <>
struct AttrTypeOf<SliceAttrs> : AttrTag<AttrType::Slice> {};
template <>
struct AttrTypeOf<CrossEntropyAttrs> : AttrTag<AttrType::CrossEntropy> {};
template <>
struct AttrTypeOf<Conv2dAttrs> : AttrTag<AttrType::Conv2d> {};
template <>
struct AttrTypeOf<Pool2dAttrs> : AttrTag<AttrType::Pool2d> {};
template <>
struct AttrTypeOf<BatchNormAttrs> : AttrTag<AttrType::BatchNorm> {};
template <>
struct AttrTypeOf<RandomAttrs> : AttrTag<AttrType::Random> {};
template <>
struct AttrTypeOf<FusedAttrs> : AttrTag<AttrType::Fused> {};
template <>
struct AttrTypeOf<StridedCopyAttrs> : AttrTag<AttrType::StridedCopy> {};
template <>
struct AttrTypeOf<SgdAttrs> : AttrTag<AttrType::Sgd> {};
template <>
struct AttrTypeOf<AdamAttrs> : AttrTag<AttrType::Adam> {};
template <>
struct AttrTypeOf<ActAttrs> : AttrTag<AttrType::Act> {};
template <>
struct AttrTypeOf<Conv2dActAttrs> : AttrTag<AttrType::Conv2dAct> {};
template <>
struct AttrTypeOf<MatmulActAttrs> : AttrTag<AttrType::MatmulAct> {};
template <>
struct AttrTypeOf<WeightBiasGradAttrs> : AttrTag<AttrType::WeightBiasGrad> {};
template <>
struct AttrTypeOf<LossGradMatmulAttrs> : AttrTag<AttrType::LossGradMatmul> {};
template <>
struct AttrTypeOf<WeightGradAdamAttrs> : AttrTag<AttrType::WeightGradAdam> {};
template <>
struct AttrTypeOf<EmbeddingAttrs> : AttrTag<AttrType::Embedding> {};
template <>
struct AttrTypeOf<LayerNormAttrs> : AttrTag<AttrType::LayerNorm> {};
template <>
struct AttrTypeOf<CollectiveAttrs> : AttrTag<AttrType::Collective> {};

}  // namespace encore
