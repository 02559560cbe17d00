#include "runtime/dispatcher.h"

#include "absl/container/inlined_vector.h"
#include "runtime/autograd.h"

namespace encore {
namespace {

struct OpTraits {
  Op op;
  std::string_view name;
  OpKind kind;
  uint8_t mutates = 0;  // Inplace: bit i set when input i is written
};

constexpr OpTraits kOpTraits[] = {
    {Op::Add, "add", OpKind::Compute},
    {Op::Sub, "sub", OpKind::Compute},
    {Op::Mul, "mul", OpKind::Compute},
    {Op::Div, "div", OpKind::Compute},
    {Op::AddScalar, "add_scalar", OpKind::Compute},
    {Op::MulScalar, "mul_scalar", OpKind::Compute},
    {Op::RsubScalar, "rsub_scalar", OpKind::Compute},
    {Op::DivScalar, "div_scalar", OpKind::Compute},
    {Op::RdivScalar, "rdiv_scalar", OpKind::Compute},
    {Op::PowScalar, "pow_scalar", OpKind::Compute},
    {Op::Neg, "neg", OpKind::Compute},
    {Op::Exp, "exp", OpKind::Compute},
    {Op::Log, "log", OpKind::Compute},
    {Op::Sqrt, "sqrt", OpKind::Compute},
    {Op::Relu, "relu", OpKind::Compute},
    {Op::LeakyRelu, "leaky_relu", OpKind::Compute},
    {Op::Sigmoid, "sigmoid", OpKind::Compute},
    {Op::Tanh, "tanh", OpKind::Compute},
    {Op::ReluGrad, "relu_grad", OpKind::Compute},
    {Op::LeakyReluGrad, "leaky_relu_grad", OpKind::Compute},
    {Op::SigmoidGrad, "sigmoid_grad", OpKind::Compute},
    {Op::TanhGrad, "tanh_grad", OpKind::Compute},
    {Op::Equal, "equal", OpKind::Compute},
    {Op::Greater, "greater", OpKind::Compute},
    {Op::Where, "where", OpKind::Compute},
    {Op::Matmul, "matmul", OpKind::Compute},
    {Op::Linear, "linear", OpKind::Compute},
    {Op::Sum, "sum", OpKind::Compute},
    {Op::Mean, "mean", OpKind::Compute},
    {Op::Max, "max", OpKind::Compute},
    {Op::Reshape, "reshape", OpKind::View},
    {Op::Permute, "permute", OpKind::Compute},
    {Op::BroadcastTo, "broadcast_to", OpKind::Compute},
    {Op::Concat, "concat", OpKind::Compute},
    {Op::Slice, "slice", OpKind::Compute},
    {Op::SliceGrad, "slice_grad", OpKind::Compute},
    {Op::Copy, "copy", OpKind::Compute},
    {Op::Softmax, "softmax", OpKind::Compute},
    {Op::LogSoftmax, "log_softmax", OpKind::Compute},
    {Op::SoftmaxGrad, "softmax_grad", OpKind::Compute},
    {Op::LogSoftmaxGrad, "log_softmax_grad", OpKind::Compute},
    {Op::SoftmaxCrossEntropy, "softmax_cross_entropy", OpKind::Compute},
    {Op::SoftmaxCrossEntropyGrad, "softmax_cross_entropy_grad", OpKind::Compute},
    {Op::MeanSquaredError, "mean_squared_error", OpKind::Compute},
    {Op::Accuracy, "accuracy", OpKind::Compute},
    {Op::Fill, "fill_", OpKind::Inplace, 0b1},
    {Op::AddInplace, "add_", OpKind::Inplace, 0b1},
    {Op::CopyInplace, "copy_", OpKind::Inplace, 0b1},
    {Op::UniformInit, "uniform_", OpKind::Inplace, 0b1},
    {Op::NormalInit, "normal_", OpKind::Inplace, 0b1},
    {Op::SgdUpdate, "sgd_update", OpKind::Inplace, 0b1},
    // Writes param and velocity (inputs: param, grad, velocity).
    {Op::MomentumSgdUpdate, "momentum_sgd_update", OpKind::Inplace, 0b101},
    // Writes param, m, v and the step counter (inputs: param, grad, m, v, step).
    {Op::AdamUpdate, "adam_update", OpKind::Inplace, 0b11101},
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
  const OpKind kind = op_kind(op);
  ENCORE_CHECK(!inputs.empty(), op_name(op), ": no inputs");
  for (size_t i = 0; i < inputs.size(); ++i)
    ENCORE_CHECK(inputs[i].defined(), op_name(op), ": argument ", i, " is an undefined tensor");
  const Device device = inputs[0].device();
  for (size_t i = 1; i < inputs.size(); ++i)
    ENCORE_CHECK(inputs[i].device() == device, op_name(op), ": argument ", i, " is on ",
                 inputs[i].device(), " but argument 0 is on ", device);
  for (size_t i = 0; i < outputs.size(); ++i)
    ENCORE_CHECK(outputs[i].defined() && outputs[i].device() == device, op_name(op), ": output ", i,
                 " is not allocated on ", device);

  const uint8_t mutates = kOpTraits[static_cast<int>(op)].mutates;
  if (kind == OpKind::Inplace && GradMode::enabled()) {
    for (size_t i = 0; i < inputs.size(); ++i)
      ENCORE_CHECK(!(mutates >> i & 1) || !inputs[i].requires_grad(), op_name(op),
                   ": in-place update of argument ", i, " ", inputs[i].shape(),
                   ", which requires grad, while grad mode is on; run it under NoGradGuard");
  }

  if (kind != OpKind::View) {
    KernelFn fn = lookup_kernel(op, device.type);
    absl::InlinedVector<BufferView, 4> views;
    views.reserve(inputs.size() + outputs.size());
    for (const Tensor& t : inputs) views.push_back({t.raw_data(), t.shape(), t.dtype()});
    for (const Tensor& t : outputs) views.push_back({t.raw_data(), t.shape(), t.dtype()});
    const std::span<const BufferView> all(views.data(), views.size());
    fn(KernelArgs{all.first(inputs.size()), all.subspan(inputs.size()), attrs});
  }

  if (kind == OpKind::Inplace) {
    for (size_t i = 0; i < inputs.size(); ++i)
      if (mutates >> i & 1) inputs[i].impl()->storage->bump_version();
  } else if (GradMode::enabled()) {
    const BackwardDef& def = g_backward[static_cast<int>(op)];
    if (def.fn != nullptr) autograd::record(op, attrs, def, inputs, outputs);
  }

  if (t_tracer != nullptr) t_tracer->on_op(op, attrs, inputs, outputs);
}

}  // namespace encore
