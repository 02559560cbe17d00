// What every CUDA kernel file includes: the kernel contract (runtime/kernel_abi.h), the dtype
// switch, the device math functions (element_ops.cuh), the current stream, the launch geometry
// (grid.h) and error checks.
//
//   void relu(const KernelArgs& a) {
//     switch_floating(a.in[0].dtype, Op::Relu, [&]<typename T>(Type<T>) {
//       const int64_t n = a.in[0].numel();
//       if (n == 0) return;
//       relu_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(a.in[0].as<T>(), a.out[0].as<T>(),
//       n); ENCORE_CUDA_LAUNCHED(Op::Relu);
//     });
//   }
//   ENCORE_REGISTER_CUDA(Op::Relu, relu);
//
// Kernels run on the current stream of the current device (the dispatcher and the static replay
// set both), allocate nothing, never synchronise, and give the same bits on every run (no
// floating-point atomics), so a replay equals the eager run and can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>  // the math functions element_ops.cuh calls (it includes nothing: NVRTC reads it)
#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/cuda/dependent_launch.h"
#include "kernels/cuda/dynamic_shared.cuh"
#include "kernels/cuda/element_ops.cuh"
#include "kernels/cuda/grid.h"
#ifdef __CUDACC__
#include "kernels/cuda/device_error.cuh"
#endif
#include "kernels/dtype_switch.h"
#include "runtime/cuda.h"
#include "runtime/error.h"
#include "runtime/kernel_abi.h"

namespace encore::kernels::cuda {

inline cudaStream_t stream() {
  return static_cast<cudaStream_t>(encore::cuda::current_stream(encore::cuda::current_device()));
}

// Calls fn(Type<uint32_t>) when every index below `max_numel` fits 32 bits (cheaper division in
// index arithmetic), else fn(Type<uint64_t>).
template <typename Fn>
void with_index_type(int64_t max_numel, Fn&& fn) {
  if (max_numel <= int64_t{UINT32_MAX}) {
    fn(Type<uint32_t>{});
  } else {
    fn(Type<uint64_t>{});
  }
}

// The slot where kernels report bad input they cannot throw for (device_error.cuh:
// report_device_error).
inline encore::cuda::DeviceErrorSlot error_slot() {
  return encore::cuda::device_error_slot(encore::cuda::current_device());
}

// Throws Error naming the op, the failed call and CUDA's message. The runtime's last error is
// cleared first: a call that failed (a non-sticky error) also leaves it set, and the next
// launch's check (ENCORE_CUDA_LAUNCHED) would report it again, as that op's.
[[noreturn]] inline void fail_cuda(Op op, const char* call, cudaError_t e) {
  (void)cudaGetLastError();
  fail(op_name(op), ": CUDA error in ", call, ": ", cudaGetErrorName(e), " (",
       cudaGetErrorString(e), ")");
}

}  // namespace encore::kernels::cuda

#define ENCORE_CUDA_OK(op, call)                                  \
  do {                                                            \
    const cudaError_t encore_e_ = (call);                         \
    if (encore_e_ != cudaSuccess) [[unlikely]]                    \
      ::encore::kernels::cuda::fail_cuda((op), #call, encore_e_); \
  } while (0)

// After a <<<...>>> launch: a bad configuration becomes an Error naming the op.
#define ENCORE_CUDA_LAUNCHED(op) ENCORE_CUDA_OK(op, cudaGetLastError())

namespace encore::kernels::cuda {

// Lets kKernel launch with `bytes` of dynamic shared memory on the current device, where that is
// more than the 48 KiB every kernel may have: allows it kMaxDynamicSharedBytes, once per device,
// so any launch of it up to that then runs. An Error naming `op` where `bytes` is more.
template <auto kKernel>
void allow_dynamic_shared(Op op, size_t bytes) {
  constexpr size_t kDefault = 48 * 1024;
  if (bytes <= kDefault) return;
  if (bytes > static_cast<size_t>(kMaxDynamicSharedBytes))
    fail(op_name(op), ": a kernel launch asks for ", bytes,
         " bytes of dynamic shared memory, more than the ", kMaxDynamicSharedBytes,
         " encore allows a block");
  static std::atomic<uint64_t> allowed{0};  // a bit per device, 0 to 63
  const int device = encore::cuda::current_device();
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if ((allowed.load(std::memory_order_acquire) & bit) != 0) [[likely]]
    return;
  ENCORE_CUDA_OK(op, cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          kMaxDynamicSharedBytes));
  allowed.fetch_or(bit, std::memory_order_acq_rel);
}

// kKernel<<<grid, block, shared_bytes, stream()>>>(args...), as a programmatic dependent of the
// kernel before it on the stream where programmatic_device and waits_as_dependent allow it
// (kKernel begins with dependent_launch_start); a failed launch is an Error naming `op`.
template <auto kKernel, typename... Args>
void launch_dependent_shared(Op op, dim3 grid, dim3 block, size_t shared_bytes, Args&&... args) {
  allow_dynamic_shared<kKernel>(op, shared_bytes);
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream();
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (programmatic_device(encore::cuda::current_device())) {  // (false unless asked for)
    static const bool waits = waits_as_dependent(reinterpret_cast<const void*>(kKernel));
    if (waits) {
      config.attrs = &attribute;
      config.numAttrs = 1;
    }
  }
  ENCORE_CUDA_OK(op, cudaLaunchKernelEx(&config, kKernel, std::forward<Args>(args)...));
}

// The same without dynamic shared memory.
template <auto kKernel, typename... Args>
void launch_dependent(Op op, dim3 grid, dim3 block, Args&&... args) {
  launch_dependent_shared<kKernel>(op, grid, block, 0, std::forward<Args>(args)...);
}

}  // namespace encore::kernels::cuda

// Registers a CUDA kernel at static-initialisation time.
#define ENCORE_REGISTER_CUDA(op, fn) ENCORE_REGISTER_CUDA_I(op, fn, __COUNTER__)
#define ENCORE_REGISTER_CUDA_I(op, fn, n) ENCORE_REGISTER_CUDA_II(op, fn, n)
#define ENCORE_REGISTER_CUDA_II(op, fn, n)                             \
  [[maybe_unused]] static const bool encore_cuda_registered_##n = [] { \
    ::encore::register_kernel((op), ::encore::DeviceType::CUDA, (fn)); \
    return true;                                                       \
  }()
