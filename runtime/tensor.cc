#include "runtime/tensor.h"

#include <charconv>
#include <cstring>
#include <type_traits>

#include "runtime/autograd.h"
#include "runtime/convert.h"
#include "runtime/cuda.h"
#include "runtime/dispatcher.h"
#include "runtime/labelled_node.h"

namespace encore {

TensorImpl::TensorImpl(IntrusivePtr<Storage> storage, int64_t offset, const Shape& shape,
                       DType dtype)
    : storage(std::move(storage)), offset(offset), shape(shape), dtype(dtype) {}
TensorImpl::~TensorImpl() = default;

void Tensor::throw_undefined() {
  fail("Tensor: use of an undefined tensor (default-constructed, or a gradient never computed)");
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  // Shape keeps numel <= 2^59, so the byte count cannot overflow.
  auto storage = make_intrusive<Storage>(shape.numel() * itemsize(dtype), device);
  return Tensor(make_intrusive<TensorImpl>(std::move(storage), 0, shape, dtype));
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  auto storage = make_intrusive<Storage>(shape.numel() * itemsize(dtype), Device::cpu(),
                                         &cuda::pinned_allocator());
  return Tensor(make_intrusive<TensorImpl>(std::move(storage), 0, shape, dtype));
}

Tensor Tensor::view_of(const Tensor& base, const Shape& shape) {
  ENCORE_CHECK(base.numel() == shape.numel(), "view: cannot view ", base.shape(), " as ", shape);
  const TensorImpl& b = *base.impl();
  return Tensor(make_intrusive<TensorImpl>(b.storage, b.offset, shape, b.dtype));
}

Tensor& Tensor::set_requires_grad(bool on) {
  ENCORE_CHECK(defined(), "set_requires_grad: undefined tensor");
  ENCORE_CHECK(is_leaf(), "set_requires_grad: only a leaf tensor can be marked; this one is ",
               "the output of ", op_name(impl_->grad_fn->op));
  ENCORE_CHECK(!on || is_floating(dtype()),
               "set_requires_grad: only floating tensors can require a gradient; tensor is ",
               dtype());
  impl_->requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  const TensorImpl& impl = checked();
  if (Tracer* tr = current_tracer()) tr->on_grad_read(*this);
  return Tensor(impl.grad);
}

void Tensor::set_grad(const Tensor& g) {
  checked();
  if (g.defined()) {
    ENCORE_CHECK(g.shape() == shape() && g.dtype() == dtype() && g.device() == device(),
                 "set_grad: gradient is ", g.str(), " but the tensor is ", str());
    ENCORE_CHECK(!g.grad_fn(), "set_grad: the gradient ", g.shape(),
                 " is the output of an op that records a gradient; pass g.detach()");
    ENCORE_CHECK(!g.shares_storage(*this), "set_grad: the gradient ", g.shape(),
                 " shares storage with the tensor itself");
  }
  impl_->grad = g.impl_;
  if (Tracer* tr = current_tracer()) tr->on_grad_replaced(*this, g);
}

Tensor Tensor::detach() const {
  Tensor out = view_of(*this, shape());
  dispatch(Op::Alias, {*this}, {out});
  return out;
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  ENCORE_CHECK(defined(), "backward: undefined tensor");
  const Tensor roots[] = {*this};
  const Tensor grads[] = {grad};
  autograd::backward(roots,
                     grad.defined() ? std::span<const Tensor>(grads) : std::span<const Tensor>(),
                     retain_graph);
}

namespace {
// Converts the first n elements of t to T, as copy_ does (convert_value: NaN is 0 and values out
// of an integer T's range saturate).
template <typename T>
void read_as(const Tensor& t, T* dst, int64_t n) {
  const void* src = t.raw_data();
  auto convert = [&](const auto* from) {
    for (int64_t i = 0; i < n; ++i) dst[i] = convert_value<T>(from[i]);
  };
  switch (t.dtype()) {
    case DType::Float32:
      return convert(static_cast<const float*>(src));
    case DType::Float64:
      return convert(static_cast<const double*>(src));
    case DType::Int32:
      return convert(static_cast<const int32_t*>(src));
    case DType::Int64:
      return convert(static_cast<const int64_t*>(src));
    case DType::Bool:
      return convert(static_cast<const bool*>(src));
  }
}

// t itself on the cpu; a device tensor's values copied to the host (waiting for its stream).
Tensor host_values(const Tensor& t, const char* what) {
  ENCORE_CHECK(t.defined(), what, ": undefined tensor");
  if (t.device().type == DeviceType::CPU) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype(), Device::cpu());
  cuda::copy_bytes(h.raw_data(), Device::cpu(), t.raw_data(), t.device(), t.nbytes());
  return h;
}
}  // namespace

namespace {

// The gradient of to(device): the output's gradient copied back to the source's device.
void to_backward(BackwardContext& ctx) {
  ctx.set_input_grad(0, ctx.grad_output(0).to(ctx.input_meta(0).device));
}

}  // namespace

Tensor Tensor::to(Device device, bool non_blocking) const {
  const TensorImpl& i = checked();
  if (device == this->device()) return *this;
  notify_host_access("to");
  // A non-blocking copy to the host lands in pinned memory, so it can overlap (as PyTorch's).
  const bool pinned_out =
      non_blocking && device.type == DeviceType::CPU && this->device().type == DeviceType::CUDA;
  Tensor out = pinned_out ? empty_pinned(shape(), dtype()) : empty(shape(), dtype(), device);
  cuda::copy_bytes(out.raw_data(), device, raw_data(), this->device(), nbytes(), non_blocking);
  if (non_blocking && device.type == DeviceType::CUDA && is_pinned()) {
    // The copy reads pinned memory later (pageable memory is staged before the call returns):
    // keep its storage, whose block the caching allocator would hand out again, until the stream
    // has passed the copy.
    auto* keep = new IntrusivePtr<Storage>(i.storage);
    cuda::call_after_stream(
        device.index, [](void* p) { delete static_cast<IntrusivePtr<Storage>*>(p); }, keep);
  }
  if (i.requires_grad && GradMode::enabled()) {
    IntrusivePtr<Node> node = labelled_node("to", &to_backward, 1, 1);
    add_input(*node, *this);
    add_output(node, *out.impl_);
  }
  return out;
}

Tensor Tensor::pin_memory() const {
  ENCORE_CHECK(device().type == DeviceType::CPU, "pin_memory: the tensor is on ", device(),
               "; only cpu tensors can be pinned");
  if (is_pinned()) return *this;
  Tensor out = empty_pinned(shape(), dtype());
  if (nbytes() > 0) std::memcpy(out.raw_data(), raw_data(), nbytes());
  return out;
}

void Tensor::record_stream(void* stream) const {
  ENCORE_CHECK(device().type == DeviceType::CUDA, "record_stream: the tensor is on ", device(),
               "; only CUDA tensors are used by streams");
  checked().storage->record_stream(stream);
}

bool Tensor::is_pinned() const {
  return device().type == DeviceType::CPU && cuda::is_built() && cuda::is_available() &&
         &checked().storage->allocator() == &cuda::pinned_allocator();
}

void Tensor::notify_host_access(const char* what) const {
  if (Tracer* tr = current_tracer()) tr->on_host_read(*this, what);
}

template <typename T>
T Tensor::item() const {
  ENCORE_CHECK(defined(), "item: undefined tensor");
  ENCORE_CHECK(numel() == 1, "item: tensor must have one element, it is ", shape());
  notify_host_access("item");
  T v{};
  read_as<T>(host_values(*this, "item"), &v, 1);
  return v;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  const Tensor h = host_values(*this, "to_vector");
  notify_host_access("to_vector");
  std::vector<T> out(numel());
  read_as<T>(h, out.data(), numel());
  return out;
}

#define ENCORE_INSTANTIATE(T)         \
  template T Tensor::item<T>() const; \
  template std::vector<T> Tensor::to_vector<T>() const;
ENCORE_INSTANTIATE(float)
ENCORE_INSTANTIATE(double)
ENCORE_INSTANTIATE(int32_t)
ENCORE_INSTANTIATE(int64_t)
#undef ENCORE_INSTANTIATE

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return cat("Tensor", shape(), " ", dtype(), " ", device());
}

namespace {
// v exactly (an integer), as true or false, or in the fewest digits that read back as v.
template <typename T>
void append_value(std::string& out, T v) {
  if constexpr (std::is_same_v<T, bool>) {
    out += v ? "true" : "false";
  } else {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof(buf), v);
    out.append(buf, r.ptr);
  }
}
}  // namespace

std::string to_string(const Tensor& t, int max_elements) {
  ENCORE_CHECK(max_elements >= 0, "to_string: max_elements must be >= 0, it is ", max_elements);
  if (!t.defined()) return t.str();
  std::string out = t.str() + " {";
  const int64_t n = std::min<int64_t>(t.numel(), max_elements);
  const Tensor h = host_values(t, "to_string");
  auto print = [&](const auto* v) {
    for (int64_t i = 0; i < n; ++i) {
      if (i) out += ", ";
      append_value(out, v[i]);
    }
  };
  const void* data = h.raw_data();
  switch (h.dtype()) {
    case DType::Float32:
      print(static_cast<const float*>(data));
      break;
    case DType::Float64:
      print(static_cast<const double*>(data));
      break;
    case DType::Int32:
      print(static_cast<const int32_t*>(data));
      break;
    case DType::Int64:
      print(static_cast<const int64_t*>(data));
      break;
    case DType::Bool:
      print(static_cast<const bool*>(data));
      break;
  }
  if (n < t.numel()) out += n ? ", ..." : "...";
  return out + "}";
}

}  // namespace encore
