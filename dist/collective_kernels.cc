// The kernels of the collective ops (runtime/ops.h: AllReduceStart, AllReduceWait). They live
// beside the world rather than in kernels/, which may not see the communication backends. Like
// every kernel they work on buffers: a replay calls them on its arena with nothing looked up or
// allocated. The start writes its request slot into the handle (host memory); on a CUDA device
// the handle is only the dependency that keeps the wait after its start.
#include <cstring>

#include "dist/world.h"
#include "runtime/cuda.h"
#include "runtime/dispatcher.h"
#include "runtime/error.h"

namespace encore::dist {
namespace {

void check_comm(const CollectiveAttrs& a, Op op) {
  ENCORE_CHECK(a.comm == 0, op_name(op), ": communicator ", a.comm,
               " does not exist (0, every process of the job, is the only one)");
}

// The device the kernel runs on: the dispatcher (and a replay) makes a CUDA call's device current.
template <DeviceType kDevice>
Device this_device() {
  if constexpr (kDevice == DeviceType::CUDA) return Device::cuda(cuda::current_device());
  return Device::cpu();
}

template <DeviceType kDevice>
void all_reduce_start_kernel(const KernelArgs& args) {
  const CollectiveAttrs& a = args.attr<CollectiveAttrs>();
  check_comm(a, Op::AllReduceStart);
  // Earlier requests advance too: a start is the one MPI call between a backward's kernels.
  progress();
  const int64_t slot = start_all_reduce(args.in[0], this_device<kDevice>(), a.reduce);
  if constexpr (kDevice == DeviceType::CPU) std::memcpy(args.out[0].data, &slot, sizeof slot);
}

// x *= scale, as mul_scalar computes it (x * static_cast<T>(scale)).
template <typename T>
void scale_in_place(const BufferView& x, double scale) {
  T* p = x.as<T>();
  const T s = static_cast<T>(scale);
  for (int64_t i = 0, n = x.numel(); i < n; ++i) p[i] *= s;
}

template <DeviceType kDevice>
void all_reduce_wait_kernel(const KernelArgs& args) {
  const CollectiveAttrs& a = args.attr<CollectiveAttrs>();
  check_comm(a, Op::AllReduceWait);
  const BufferView& buffer = args.in[0];
  ENCORE_CHECK(a.scale == 1 || (kDevice == DeviceType::CPU &&
                                (buffer.dtype == DType::Float32 || buffer.dtype == DType::Float64)),
               "all_reduce_wait: a scale of ", a.scale, " applies to float32 and float64 cpu ",
               "buffers; this one is ", buffer.shape, " ", buffer.dtype,
               kDevice == DeviceType::CUDA ? " on cuda" : "");
  int64_t slot = -1;
  if constexpr (kDevice == DeviceType::CPU) std::memcpy(&slot, args.in[1].data, sizeof slot);
  wait_all_reduce(slot, buffer, this_device<kDevice>());
  if (a.scale == 1) return;
  if (buffer.dtype == DType::Float32)
    scale_in_place<float>(buffer, a.scale);
  else
    scale_in_place<double>(buffer, a.scale);
}

const bool registered = [] {
  register_kernel(Op::AllReduceStart, DeviceType::CPU, &all_reduce_start_kernel<DeviceType::CPU>);
  register_kernel(Op::AllReduceWait, DeviceType::CPU, &all_reduce_wait_kernel<DeviceType::CPU>);
#ifdef ENCORE_HAS_CUDA
  register_kernel(Op::AllReduceStart, DeviceType::CUDA, &all_reduce_start_kernel<DeviceType::CUDA>);
  register_kernel(Op::AllReduceWait, DeviceType::CUDA, &all_reduce_wait_kernel<DeviceType::CUDA>);
#endif
  return true;
}();

}  // namespace
}  // namespace encore::dist
