// A block's dynamic shared memory: the bytes its launch asked for beside the kernel's static
// __shared__ arrays, which may pass the 48 KiB those are limited to once the kernel allows it
// (cudaFuncAttributeMaxDynamicSharedMemorySize; common.cuh: allow_dynamic_shared). 16-byte
// aligned. Host-compilable: the emulated kernel tests (tests/nvrtc/emulated_kernel.h) give each
// block a poisoned buffer of the most any GPU allows a block.
#pragma once

namespace encore::kernels::cuda {

// 64 KiB: the most a block may have on every GPU CUDA 13 runs (sm_75 allows 64 KiB, later ones
// 99 to 227).
inline constexpr int kMaxDynamicSharedBytes = 64 * 1024;

__device__ __forceinline__ unsigned char* dynamic_shared() {
#if defined(ENCORE_EMULATED_DYNAMIC_SHARED)
  return emulated_dynamic_shared();
#else
  extern __shared__ __align__(16) unsigned char encore_dynamic_shared[];
  return encore_dynamic_shared;
#endif
}

}  // namespace encore::kernels::cuda
