#include "runtime/dispatcher.h"

#include "runtime/cuda.h"

#include "absl/container/inlined_vector.h"
#include "runtime/autograd.h"
#include "runtime/comm_progress.h"
#include "runtime/profiler.h"

namespace encore {
namespace {

KernelFn g_kernels[kNumOps][kNumDeviceTypes] = {};
BackwardDef g_backward[kNumOps] = {};
thread_local Tracer* t_tracer = nullptr;

}  // namespace

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
  const OpTraits& traits = op_traits(op);
  const OpKind kind = traits.kind;
  const int n_in = static_cast<int>(inputs.size()), n_out = static_cast<int>(outputs.size());
  ENCORE_CHECK(n_in >= traits.min_inputs && (traits.max_inputs < 0 || n_in <= traits.max_inputs) &&
                   (traits.outputs == kAnyOutputs ? n_out >= 1 && n_out <= kMaxOpOutputs
                                                  : n_out == traits.outputs),
               traits.name, ": called with ", n_in, " inputs and ", n_out, " outputs; it takes ",
               traits.min_inputs,
               traits.max_inputs == traits.min_inputs ? ""
               : traits.max_inputs < 0                ? " or more"
                                                      : cat(" to ", traits.max_inputs),
               " inputs and ",
               traits.outputs == kAnyOutputs ? cat("1 to ", kMaxOpOutputs) : cat(traits.outputs),
               " outputs");
  ENCORE_CHECK(traits.group == 0 || n_in % traits.group == 0, traits.name, ": called with ", n_in,
               " inputs; it takes groups of ", static_cast<int>(traits.group),
               " (one per parameter)");
  ENCORE_CHECK(attrs.type == traits.attrs, traits.name, ": called with ",
               attr_type_name(attrs.type), "; it reads ", attr_type_name(traits.attrs));
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

  if (kind == OpKind::Inplace && GradMode::enabled()) {
    for (size_t i = 0; i < inputs.size(); ++i)
      ENCORE_CHECK(!op_writes_input(op, i) || !inputs[i].requires_grad(), traits.name,
                   ": in-place update of argument ", i, " ", inputs[i].shape(),
                   ", which requires grad, while grad mode is on; run it under NoGradGuard");
  }

  if (kind == OpKind::Inplace && t_tracer != nullptr) t_tracer->before_inplace(op, inputs);
  if (kind != OpKind::View) {
    KernelFn fn = lookup_kernel(op, device.type);
    if (device.type == DeviceType::CUDA) cuda::set_device(device.index);
    absl::InlinedVector<BufferView, 8> views;
    views.reserve(inputs.size() + outputs.size());
    for (const Tensor& t : inputs) views.push_back({t.raw_data(), t.shape(), t.dtype()});
    for (const Tensor& t : outputs) views.push_back({t.raw_data(), t.shape(), t.dtype()});
    const std::span<const BufferView> all(views.data(), views.size());
    fn(KernelArgs{all.first(inputs.size()), all.subspan(inputs.size()), attrs});
    comm_progress::poll();
  }

  if (kind == OpKind::Inplace) {
    for (size_t i = 0; i < inputs.size(); ++i)
      if (op_writes_input(op, i)) inputs[i].impl()->storage->bump_version();
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
