// Tensor: a handle to a contiguous, row-major n-d array with shared ownership.
//
//   Tensor x = Tensor::empty({32, 784}, DType::Float32);
//   float* p = x.data<float>();
//
// Copying a Tensor copies the handle, not the data. reshape/flatten give views that share
// storage; every other op writes a new tensor. Ops and factories live in api/ (encore.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/intrusive_ptr.h"
#include "runtime/shape.h"
#include "runtime/storage.h"

namespace encore {

class Node;
class Tensor;
struct GradHooks;

class TensorImpl final : public RefCounted {
 public:
  // Out of line: Node is incomplete here.
  TensorImpl(IntrusivePtr<Storage> storage, int64_t offset, const Shape& shape, DType dtype);
  ~TensorImpl() override;

  IntrusivePtr<Storage> storage;
  int64_t offset;  // in elements
  Shape shape;
  DType dtype;
  bool requires_grad = false;
  uint32_t output_nr = 0;      // which output of grad_fn this tensor is
  IntrusivePtr<Node> grad_fn;  // null for leaves
  IntrusivePtr<TensorImpl> grad;
  std::unique_ptr<GradHooks> grad_hooks;  // a leaf's (autograd::add_post_accumulate_grad_hook)
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(IntrusivePtr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // A new uninitialised tensor.
  static Tensor empty(const Shape& shape, DType dtype = DType::Float32,
                      Device device = Device::cpu());
  // A new uninitialised cpu tensor in page-locked memory (cuda::pinned_allocator()).
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::Float32);
  // A tensor sharing `base`'s storage with another shape (same element count, no copy). Not an
  // op: autograd and a static function's trace do not see it (F::reshape is the view they follow).
  static Tensor view_of(const Tensor& base, const Shape& shape);

  bool defined() const { return static_cast<bool>(impl_); }
  // Every accessor below throws Error on an undefined tensor.
  const Shape& shape() const { return checked().shape; }
  int rank() const { return checked().shape.rank(); }
  // Size of `axis` (negative counts from the end); throws Error when out of range.
  int64_t size(int axis) const { return checked().shape.at(axis, "Tensor::size"); }
  int64_t numel() const { return checked().shape.numel(); }
  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().storage->device(); }
  size_t nbytes() const { return numel() * itemsize(dtype()); }

  // The data for host reads and writes; T must match dtype() (checked). An active tracer is
  // told (on_host_read with "data"): such access cannot be part of a static schedule.
  template <typename T>
  T* data() const {
    ENCORE_CHECK(dtype_of<T> == dtype(), "Tensor::data: requested ", name(dtype_of<T>),
                 " but the tensor is ", dtype());
    notify_host_access("data");
    return static_cast<T*>(raw_data());
  }
  // The address of the first element, for kernels and tracers (not reported to a tracer).
  void* raw_data() const {
    const TensorImpl& i = checked();
    return static_cast<char*>(i.storage->data()) + i.offset * itemsize(i.dtype);
  }

  // Reads the single element of a one-element tensor (converted to T). A host read: a
  // tracer is told, since the value cannot be part of a static schedule.
  template <typename T>
  T item() const;
  // Copies all elements to the host (converted to T). Also a host read.
  template <typename T>
  std::vector<T> to_vector() const;

  // A copy on `device`, or this tensor when it is already there. The copy is differentiable (as
  // PyTorch's): from a tensor that requires grad, with grad mode on, it is a graph output whose
  // gradient is copied back to this tensor's device, so a cpu leaf moved to a GPU gets its
  // .grad on the cpu (Module::to moves parameters as new leaves instead). With `non_blocking` the
  // copy is only queued on the CUDA side's current stream (the source must stay unchanged until the
  // stream reaches it: pinned host memory, see pin_memory()); otherwise it is finished on return.
  // A non-blocking copy from a CUDA device to the cpu goes into pinned memory: read it after
  // cuda::synchronize().
  // Inside a traced static function this is a host access, like item().
  Tensor to(Device device, bool non_blocking = false) const;
  // A copy of a cpu tensor in page-locked memory, whose copies to a CUDA device can overlap with
  // the device's work. Throws Error without a CUDA device.
  Tensor pin_memory() const;
  // Marks that work queued on `stream` (a cuda::StreamHandle of this tensor's device) uses this
  // tensor's memory, as PyTorch's record_stream: the caching allocator hands the block out again
  // only once that stream has passed the point where the last tensor on it was freed. Needed for
  // a tensor made on one stream and used on another (the allocator orders reuse by the device's
  // current stream). Throws Error for a cpu tensor.
  void record_stream(void* stream) const;
  bool is_pinned() const;

  // Autograd.
  bool requires_grad() const { return checked().requires_grad; }
  // Marks a leaf as needing a gradient; throws for a non-leaf or a non-floating tensor.
  Tensor& set_requires_grad(bool on = true);
  bool is_leaf() const { return !checked().grad_fn; }
  // Inside a trace, the .grad it finds joins the call's signature (runtime/dispatcher.h).
  Tensor grad() const;
  // Sets (or, with an undefined tensor, clears) the gradient. It must match the tensor's shape,
  // dtype and device, be no part of a graph, and not share this tensor's storage.
  void set_grad(const Tensor& g);
  const IntrusivePtr<Node>& grad_fn() const { return checked().grad_fn; }
  // A tensor sharing storage with this one, cut from the graph (a dispatched Alias view).
  Tensor detach() const;
  // Back-propagates from this tensor. Without `grad` the tensor must have one element.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;

  // Version counter of the storage (bumped by in-place ops).
  uint32_t version() const { return checked().storage->version(); }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  bool shares_storage(const Tensor& o) const { return checked().storage == o.checked().storage; }

  TensorImpl* impl() const { return impl_.get(); }
  const IntrusivePtr<TensorImpl>& impl_ptr() const { return impl_; }

  std::string str() const;  // "Tensor[2,3] float32 cpu"

 private:
  const TensorImpl& checked() const {
    if (!impl_) [[unlikely]]
      throw_undefined();
    return *impl_;
  }
  [[noreturn]] static void throw_undefined();
  void notify_host_access(const char* what) const;

  IntrusivePtr<TensorImpl> impl_;
};

// Human-readable values for small tensors (debugging): "Tensor[3] int64 cpu {1, 2, 3}", the first
// max_elements values in row-major order and ", ..." when there are more. Integers print exactly,
// bools as true and false, floating values in the fewest digits that read back as the same value
// of their dtype (0.1 in a float32 tensor prints 0.1). A negative max_elements is an Error.
std::string to_string(const Tensor& t, int max_elements = 64);

}  // namespace encore
