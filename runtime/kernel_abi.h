// The kernel ABI: what a kernel (kernels/cpu, kernels/cuda) sees of a call, and how it registers.
// No Tensor, autograd or tracer here, so a kernel file compiles against buffers and attributes
// only and a replay can call the same function on other buffers.
//
//   void exp_kernel(const KernelArgs& args) {
//     const BufferView &x = args.in[0], &y = args.out[0];
//     ...  // read x.as<T>(), write y.as<T>(); args.attr<ScalarAttrs>() for attributes
//   }
//   register_kernel(Op::Exp, DeviceType::CPU, &exp_kernel);
#pragma once

#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/op_traits.h"
#include "runtime/shape.h"

namespace encore {

// Attributes of one call, stored by value (a trivially copyable struct from ops.h), with the tag
// of the struct written. The dispatcher checks the tag against the op's attribute type
// (op_attr_type, runtime/op_traits.h) on every eager call; a read as another struct asserts in
// a debug build and costs nothing in a release one.
struct alignas(8) AttrBlob {
  // 64 bytes in all with the tag (a replay's step array keeps one blob per step).
  static constexpr size_t kCapacity = 64 - sizeof(AttrType);
  unsigned char bytes[kCapacity] = {};
  AttrType type = AttrType::None;  // not part of `bytes`, which schedules compare

  AttrBlob() = default;
  template <typename T>
  static AttrBlob of(const T& attrs) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kCapacity);
    AttrBlob b;
    std::memcpy(b.bytes, &attrs, sizeof(T));
    b.type = attr_type_of<T>;
    return b;
  }
  template <typename T>
  bool holds() const {
    return type == attr_type_of<T>;
  }
  template <typename T>
  const T& as() const {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kCapacity);
    assert(holds<T>() && "attributes read as another struct than the one written");
    return *reinterpret_cast<const T*>(bytes);
  }
};
static_assert(sizeof(AttrBlob) == 64);

// A raw buffer as a kernel sees it.
struct BufferView {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::Float32;

  int64_t numel() const { return shape.numel(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

struct KernelArgs {
  std::span<const BufferView> in;
  std::span<const BufferView> out;
  const AttrBlob& attrs;
  // A slot of the call site (a static plan's step: the same shapes and attributes on every call,
  // an optimizer update's hyper-parameters aside, which a replay reads at each call)
  // in which a kernel keeps what it resolved on the first call (the cuDNN plan of a
  // convolution), so a replay looks nothing up; null for an eager call. What a kernel stores
  // there must live as long as the process.
  std::atomic<void*>* state = nullptr;
  // CUDA, a static plan's graph whose optimizer's attributes change between launches: the device
  // address of a copy of them (SgdAttrs, or AdamAttrs for AdamUpdate and WeightGradAdam) that the
  // plan writes before each launch, and the update kernels read instead of theirs; null
  // elsewhere. `attrs` holds the call's values too.
  const void* device_attrs = nullptr;
  template <typename T>
  const T& attr() const {
    return attrs.template as<T>();
  }
};

using KernelFn = void (*)(const KernelArgs&);

// Registers the kernel of `op` on a device type (kernels do this at static-initialisation time).
void register_kernel(Op op, DeviceType device, KernelFn fn);
// The kernel of (op, device); throws Error naming both when there is none.
KernelFn lookup_kernel(Op op, DeviceType device);

}  // namespace encore
