// report_device_error: how a kernel reports bad input it cannot throw for (runtime/cuda.h:
// DeviceErrorSlot). The first report on the device wins, and the host throws it as the cpu
// kernel's Error when it next waits for the device. The kernel still writes its outputs (NaN
// where the input was bad). Host-compilable (the emulated kernel tests, tests/nvrtc/).
#pragma once

#include "runtime/cuda.h"
#include "runtime/ops.h"

namespace encore::kernels::cuda {

__device__ inline void report_device_error(encore::cuda::DeviceErrorSlot slot,
                                           encore::cuda::DeviceErrorKind kind, Op op,
                                           long long value, long long index, long long bound) {
  if (atomicCAS(slot.claim, 0u, 1u) != 0u) return;
  volatile long long* r = slot.record;
  r[1] = value;
  r[2] = index;
  r[3] = bound;
  __threadfence_system();  // the fields before the head that says they are there
  r[0] = (static_cast<long long>(kind) << 32) | (static_cast<long long>(op) + 1);
}

}  // namespace encore::kernels::cuda
