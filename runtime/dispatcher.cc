#include "runtime/dispatcher.h"

#include "absl/container/inlined_vector.h"
#include "runtime/autograd.h"

namespace encore {
namespace {

struct OpTraits {
  std::string_view name;
  OpKind kind;
  uint8_t mutates = 0;  // Inplace: bit i set when input i is written
};

constexpr OpTraits kOpTraits[] = {
    {"add", OpKind::Compute}, {"sub", OpKind::Compute}, {"mul", OpKind::Compute},
    {"div", OpKind::Compute}, {"add_scalar", OpKind::Compute}, {"mul_scalar", OpKind::Compute},
    {"rsub_scalar", OpKind::Compute}, {"div_scalar", OpKind::Compute},
    {"rdiv_scalar", OpKind::Compute}, {"pow_scalar", OpKind::Compute}, {"neg", OpKind::Compute},
    {"exp", OpKind::Compute}, {"log", OpKind::Compute}, {"sqrt", OpKind::Compute},
    {"relu", OpKind::Compute}, {"leaky_relu", OpKind::Compute}, {"sigmoid", OpKind::Compute},
    {"tanh", OpKind::Compute}, {"relu_grad", OpKind::Compute},
    {"leaky_relu_grad", OpKind::Compute}, {"sigmoid_grad", OpKind::Compute},
    {"tanh_grad", OpKind::Compute}, {"equal", OpKind::Compute}, {"greater", OpKind::Compute},
    {"where", OpKind::Compute}, {"matmul", OpKind::Compute}, {"linear", OpKind::Compute},
    {"sum", OpKind::Compute}, {"mean", OpKind::Compute}, {"max", OpKind::Compute},
    {"reshape", OpKind::View}, {"permute", OpKind::Compute}, {"broadcast_to", OpKind::Compute},
    {"concat", OpKind::Compute}, {"slice", OpKind::Compute}, {"slice_grad", OpKind::Compute},
    {"copy", OpKind::Compute}, {"softmax", OpKind::Compute}, {"log_softmax", OpKind::Compute},
    {"softmax_grad", OpKind::Compute}, {"log_softmax_grad", OpKind::Compute},
    {"softmax_cross_entropy", OpKind::Compute},
    {"softmax_cross_entropy_grad", OpKind::Compute},
    {"mean_squared_error", OpKind::Compute}, {"accuracy", OpKind::Compute},
    {"fill_", OpKind::Inplace, 0b1}, {"add_", OpKind::Inplace, 0b1},
    {"copy_", OpKind::Inplace, 0b1}, {"uniform_", OpKind::Inplace, 0b1},
    {"normal_", OpKind::Inplace, 0b1}, {"sgd_update", OpKind::Inplace, 0b1},
    {"momentum_sgd_update", OpKind::Inplace, 0b101},  // param, grad, velocity
    {"adam_update", OpKind::Inplace, 0b11101},        // param, grad, m, v, step
};
static_assert(std::size(kOpTraits) == kNumOps, "kOpTraits must list every Op in order");

KernelFn g_kernels[kNumOps][kNumDeviceTypes] = {};
BackwardDef g_backward[kNumOps] = {};
thread_local Tracer* t_tracer = nullptr;

}  // namespace

std::string_view op_name(Op op) { return kOpTraits[static_cast<int>(op)].name; }
uint8_t op_mutated_inputs(Op op) { return kOpTraits[static_cast<int>(op)].mutates; }
OpKind op_kind(Op op) { return kOpTraits[static_cast<int>(op)].kind; }

void register_kernel(Op op, DeviceType device, KernelFn fn) {
  g_kernels[static_cast<int>(op)][static_cast<int>(device)] = fn;
}

KernelFn lookup_kernel(Op op, DeviceType device) {
  KernelFn fn = g_kernels[static_cast<int>(op)][static_cast<int>(device)];
  ENCORE_CHECK(fn != nullptr, op_name(op), ": no kernel for device type ",
               device == DeviceType::CPU ? "cpu" : "cuda");
  return fn;
}

void register_backward(Op op, BackwardDef def) { g_backward[static_cast<int>(op)] = def; }
const BackwardDef& backward_def(Op op) { return g_backward[static_cast<int>(op)]; }

Tracer* current_tracer() { return t_tracer; }
TracerScope::TracerScope(Tracer* t) : previous_(t_tracer) { t_tracer = t; }
TracerScope::~TracerScope() { t_tracer = previous_; }

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
    ENCORE_CHECK(outputs[i].defined() && outputs[i].device() == device, op_name(op),
                 ": output ", i, " is not allocated on ", device);

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
