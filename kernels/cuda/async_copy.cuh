// Copies from global to shared memory that do not pass through registers (cp.async, sm_80 and
// later): a thread issues all of its copies, then waits for them (wait_async_copies) before the
// block's barrier, so a block stages a whole chunk of its operands with every copy in flight at
// once, at the register cost of the addresses alone. On an older GPU each copy is a plain load
// and store, done when it returns. Host-compilable: the emulated kernel tests (tests/nvrtc/) make
// a thread's copies when it waits, so a missing wait shows.
#pragma once

#include <cstddef>
#include <cstring>

namespace encore::kernels::cuda {

// Copies kBytes (4, 8 or 16; src and dst aligned to it) from global memory at src to shared
// memory at dst.
template <int kBytes>
__device__ __forceinline__ void copy_async(void* dst, const void* src) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const size_t from = __cvta_generic_to_global(src);
  if constexpr (kBytes == 16) {  // .cg: through L2 alone (the operands are read once per block)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(from) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(to), "l"(from), "n"(kBytes)
                 : "memory");
  }
#elif defined(ENCORE_EMULATED_ASYNC_COPIES)
  emulated_copy_async(dst, src, kBytes);  // lands at the wait (tests/nvrtc/emulated_kernel.h)
#else
  std::memcpy(dst, src, kBytes);
#endif
}

// Waits until this thread's copies are in shared memory (a block's barrier then shows every
// thread's to all).
__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#elif defined(ENCORE_EMULATED_ASYNC_COPIES)
  emulated_wait_async_copies();
#endif
}

}  // namespace encore::kernels::cuda
