// Which launches may be programmatic dependents (dependent_launch.h).
#include "kernels/cuda/dependent_launch.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "runtime/env.h"

namespace encore::kernels::cuda {

bool programmatic_device(int device) {
  static const bool on = env::flag("ENCORE_CUDA_PDL", false);
  if (!on) return false;
  static std::atomic<int8_t> capable[64] = {};  // 0 unknown, 1 yes, -1 no
  if (device < 0 || device >= 64) return false;
  int8_t known = capable[device].load(std::memory_order_relaxed);
  if (known == 0) {
    int major = 0;
    const cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (e != cudaSuccess) (void)cudaGetLastError();
    known = e == cudaSuccess && major >= 9 ? 1 : -1;
    capable[device].store(known, std::memory_order_relaxed);
  }
  return known > 0;
}

bool waits_as_dependent(const void* kernel) {
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.ptxVersion >= 90;
}

}  // namespace encore::kernels::cuda
