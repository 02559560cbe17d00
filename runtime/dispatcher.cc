#include "runtime/dispatcher.h"

#include "runtime/cuda.h"

#include "absl/container/inlined_vector.h"
#include "runtime/autograd.h"
#include "runtime/profiler.h"

namespace encore {
namespace {

struct OpTraits {
  Op op;
  std::string_view name;
  OpKind kind;
  int8_t min_inputs;
  int8_t max_inputs;    // -1: any number
  int8_t outputs;       // -1: a planner-made op, never dispatched
  uint8_t mutates = 0;  // Inplace: bit i set when input i is written
  bool random = false;  // draws from a Generator (RandomAttrs)
};

constexpr OpTraits kOpTraits[] = {
    {Op::Add, "add", OpKind::Compute, 2, 2, 1},
    {Op::Sub, "sub", OpKind::Compute, 2, 2, 1},
    {Op::Mul, "mul", OpKind::Compute, 2, 2, 1},
    {Op::Div, "div", OpKind::Compute, 2, 2, 1},
    {Op::AddScalar, "add_scalar", OpKind::Compute, 1, 1, 1},
    {Op::MulScalar, "mul_scalar", OpKind::Compute, 1, 1, 1},
    {Op::RsubScalar, "rsub_scalar", OpKind::Compute, 1, 1, 1},
    {Op::DivScalar, "div_scalar", OpKind::Compute, 1, 1, 1},
    {Op::RdivScalar, "rdiv_scalar", OpKind::Compute, 1, 1, 1},
    {Op::PowScalar, "pow_scalar", OpKind::Compute, 1, 1, 1},
    {Op::Neg, "neg", OpKind::Compute, 1, 1, 1},
    {Op::Exp, "exp", OpKind::Compute, 1, 1, 1},
    {Op::Log, "log", OpKind::Compute, 1, 1, 1},
    {Op::Sqrt, "sqrt", OpKind::Compute, 1, 1, 1},
    {Op::Relu, "relu", OpKind::Compute, 1, 1, 1},
    {Op::LeakyRelu, "leaky_relu", OpKind::Compute, 1, 1, 1},
    {Op::Sigmoid, "sigmoid", OpKind::Compute, 1, 1, 1},
    {Op::Tanh, "tanh", OpKind::Compute, 1, 1, 1},
    {Op::ReluGrad, "relu_grad", OpKind::Compute, 2, 2, 1},
    {Op::LeakyReluGrad, "leaky_relu_grad", OpKind::Compute, 2, 2, 1},
    {Op::SigmoidGrad, "sigmoid_grad", OpKind::Compute, 2, 2, 1},
    {Op::TanhGrad, "tanh_grad", OpKind::Compute, 2, 2, 1},
    {Op::Equal, "equal", OpKind::Compute, 2, 2, 1},
    {Op::Greater, "greater", OpKind::Compute, 2, 2, 1},
    {Op::Where, "where", OpKind::Compute, 3, 3, 1},
    {Op::Matmul, "matmul", OpKind::Compute, 2, 2, 1},
    {Op::Linear, "linear", OpKind::Compute, 2, 3, 1},
    {Op::Sum, "sum", OpKind::Compute, 1, 1, 1},
    {Op::Mean, "mean", OpKind::Compute, 1, 1, 1},
    {Op::Max, "max", OpKind::Compute, 1, 1, 1},
    {Op::Reshape, "reshape", OpKind::View, 1, 1, 1},
    {Op::Alias, "alias", OpKind::View, 1, 1, 1},
    {Op::Permute, "permute", OpKind::Compute, 1, 1, 1},
    {Op::BroadcastTo, "broadcast_to", OpKind::Compute, 1, 1, 1},
    {Op::Concat, "concat", OpKind::Compute, 1, -1, 1},
    {Op::Slice, "slice", OpKind::Compute, 1, 1, 1},
    {Op::SliceGrad, "slice_grad", OpKind::Compute, 1, 1, 1},
    {Op::Copy, "copy", OpKind::Compute, 1, 1, 1},
    {Op::Softmax, "softmax", OpKind::Compute, 1, 1, 1},
    {Op::LogSoftmax, "log_softmax", OpKind::Compute, 1, 1, 1},
    {Op::SoftmaxGrad, "softmax_grad", OpKind::Compute, 2, 2, 1},
    {Op::LogSoftmaxGrad, "log_softmax_grad", OpKind::Compute, 2, 2, 1},
    {Op::SoftmaxCrossEntropy, "softmax_cross_entropy", OpKind::Compute, 2, 2, 1},
    {Op::SoftmaxCrossEntropyGrad, "softmax_cross_entropy_grad", OpKind::Compute, 3, 3, 1},
    {Op::MeanSquaredError, "mean_squared_error", OpKind::Compute, 2, 2, 1},
    {Op::Accuracy, "accuracy", OpKind::Compute, 2, 2, 1},
    {Op::Conv2d, "conv2d", OpKind::Compute, 2, 3, 1},
    {Op::Conv2dGradInput, "conv2d_grad_input", OpKind::Compute, 2, 2, 1},
    {Op::Conv2dGradWeight, "conv2d_grad_weight", OpKind::Compute, 2, 2, 1},
    {Op::MaxPool2d, "max_pool2d", OpKind::Compute, 1, 1, 1},
    {Op::MaxPool2dGrad, "max_pool2d_grad", OpKind::Compute, 2, 2, 1},
    {Op::AvgPool2d, "avg_pool2d", OpKind::Compute, 1, 1, 1},
    {Op::AvgPool2dGrad, "avg_pool2d_grad", OpKind::Compute, 1, 1, 1},
    {Op::BatchNorm, "batch_norm", OpKind::Compute, 1, 3, 3},
    {Op::BatchNormInference, "batch_norm_inference", OpKind::Compute, 3, 5, 1},
    {Op::BatchNormGrad, "batch_norm_grad", OpKind::Compute, 4, 5, 3},
    {Op::Dropout, "dropout", OpKind::Compute, 1, 1, 2, 0, true},
    {Op::Fill, "fill_", OpKind::Inplace, 1, 1, 0, 0b1},
    {Op::AddInplace, "add_", OpKind::Inplace, 2, 2, 0, 0b1},
    {Op::CopyInplace, "copy_", OpKind::Inplace, 2, 2, 0, 0b1},
    {Op::UniformInit, "uniform_", OpKind::Inplace, 1, 1, 0, 0b1, true},
    {Op::NormalInit, "normal_", OpKind::Inplace, 1, 1, 0, 0b1, true},
    {Op::SgdUpdate, "sgd_update", OpKind::Inplace, 2, 2, 0, 0b1},
    // Writes param and velocity (inputs: param, grad, velocity).
    {Op::MomentumSgdUpdate, "momentum_sgd_update", OpKind::Inplace, 3, 3, 0, 0b101},
    // Writes param, m, v and the step counter (inputs: param, grad, m, v, step).
    {Op::AdamUpdate, "adam_update", OpKind::Inplace, 5, 5, 0, 0b11101},
    {Op::BatchNormStatsUpdate, "batch_norm_stats_update", OpKind::Inplace, 4, 4, 0, 0b11},
    {Op::FusedElementwise, "fused_elementwise", OpKind::Compute, 1, -1, -1},
};
constexpr bool lists_every_op_in_order() {
  if (std::size(kOpTraits) != kNumOps) return false;
  for (int i = 0; i < kNumOps; ++i)
    if (static_cast<int>(kOpTraits[i].op) != i) return false;
  return true;
}
static_assert(lists_every_op_in_order(), "kOpTraits must list every Op, in enum order");

KernelFn g_kernels[kNumOps][kNumDeviceTypes] = {};
BackwardDef g_backward[kNumOps] = {};
thread_local Tracer* t_tracer = nullptr;

}  // namespace

std::string_view op_name(Op op) {
  return kOpTraits[static_cast<int>(op)].name;
}
uint8_t op_mutated_inputs(Op op) {
  return kOpTraits[static_cast<int>(op)].mutates;
}
bool op_draws_random(Op op) {
  return kOpTraits[static_cast<int>(op)].random;
}
OpKind op_kind(Op op) {
  return kOpTraits[static_cast<int>(op)].kind;
}

void register_kernel(Op op, DeviceType device, KernelFn fn) {
  g_kernels[static_cast<int>(op)][static_cast<int>(device)] = fn;
}

KernelFn lookup_kernel(Op op, DeviceType device) {
  KernelFn fn = g_kernels[static_cast<int>(op)][static_cast<int>(device)];
  ENCORE_CHECK(fn != nullptr, op_name(op), ": no kernel for device type ",
               device == DeviceType::CPU ? "cpu" : "cuda");
  return fn;
}

void register_backward(Op op, BackwardDef def) {
  g_backward[static_cast<int>(op)] = def;
}
const BackwardDef& backward_def(Op op) {
  return g_backward[static_cast<int>(op)];
}

Tracer* current_tracer() {
  return t_tracer;
}
TracerScope::TracerScope(Tracer* t) : previous_(t_tracer) {
  t_tracer = t;
}
TracerScope::~TracerScope() {
  t_tracer = previous_;
}

void dispatch(Op op, std::span<const Tensor> inputs, std::span<Tensor> outputs,
              const AttrBlob& attrs) {
  const int64_t profile_start = profiler::active() ? profiler::ticks() : -1;
  const OpTraits& traits = kOpTraits[static_cast<int>(op)];
  const OpKind kind = traits.kind;
  const int n_in = static_cast<int>(inputs.size()), n_out = static_cast<int>(outputs.size());
  ENCORE_CHECK(n_in >= traits.min_inputs && (traits.max_inputs < 0 || n_in <= traits.max_inputs) &&
                   n_out == traits.outputs,
               traits.name, ": called with ", n_in, " inputs and ", n_out, " outputs; it takes ",
               traits.min_inputs,
               traits.max_inputs == traits.min_inputs ? ""
               : traits.max_inputs < 0                ? " or more"
                                                      : cat(" to ", traits.max_inputs),
               " inputs and ", traits.outputs, " outputs");
  for (size_t i = 0; i < inputs.size(); ++i)
    ENCORE_CHECK(inputs[i].defined(), traits.name, ": argument ", i, " is an undefined tensor");
  const Device device = inputs[0].device();
  for (size_t i = 1; i < inputs.size(); ++i)
    ENCORE_CHECK(inputs[i].device() == device, traits.name, ": argument ", i, " ",
                 inputs[i].shape(), " is on ", inputs[i].device(), " but argument 0 ",
                 inputs[0].shape(), " is on ", device, "; move them to one device with .to()");
  for (size_t i = 0; i < outputs.size(); ++i)
    ENCORE_CHECK(outputs[i].defined() && outputs[i].device() == device, traits.name, ": output ", i,
                 " is not allocated on ", device);

  const uint8_t mutates = traits.mutates;
  if (kind == OpKind::Inplace && GradMode::enabled()) {
    for (size_t i = 0; i < inputs.size(); ++i)
      ENCORE_CHECK(!mask_bit(mutates, i) || !inputs[i].requires_grad(), traits.name,
                   ": in-place update of argument ", i, " ", inputs[i].shape(),
                   ", which requires grad, while grad mode is on; run it under NoGradGuard");
  }

  if (kind != OpKind::View) {
    KernelFn fn = lookup_kernel(op, device.type);
    if (device.type == DeviceType::CUDA) cuda::set_device(device.index);
    absl::InlinedVector<BufferView, 8> views;
    views.reserve(inputs.size() + outputs.size());
    for (const Tensor& t : inputs) views.push_back({t.raw_data(), t.shape(), t.dtype()});
    for (const Tensor& t : outputs) views.push_back({t.raw_data(), t.shape(), t.dtype()});
    const std::span<const BufferView> all(views.data(), views.size());
    fn(KernelArgs{all.first(inputs.size()), all.subspan(inputs.size()), attrs});
  }

  if (kind == OpKind::Inplace) {
    for (size_t i = 0; i < inputs.size(); ++i)
      if (mask_bit(mutates, i)) inputs[i].impl()->storage->bump_version();
  } else if (GradMode::enabled()) {
    const BackwardDef& def = g_backward[static_cast<int>(op)];
    if (def.fn != nullptr) autograd::record(op, attrs, def, inputs, outputs);
  }

  if (t_tracer != nullptr) t_tracer->on_op(op, attrs, inputs, outputs);
  if (profile_start >= 0) [[unlikely]]
    profiler::record_op(op, t_tracer != nullptr ? profiler::Mode::Trace : profiler::Mode::Eager,
                        profile_start, inputs, outputs);
}

}  // namespace encore
