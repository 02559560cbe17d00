// What the runtime's CUDA files (cuda.cc, cuda_graph.cc, cuda_stubs.cc) share: the Error of a
// build without the backend, and CHECK_CUDA, which turns a failed CUDA call into an Error naming
// what was being done and the call. Internal to the runtime.
#pragma once

#include <string_view>

#include "runtime/error.h"

#ifdef ENCORE_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace encore::cuda::detail {

[[noreturn]] inline void not_built(const char* what) {
  fail(what, ": this build has no CUDA backend (built without nvcc, or with ENCORE_CUDA=OFF)");
}

#ifdef ENCORE_HAS_CUDA
// The runtime's last error is cleared first (a failed call leaves it set too), so that the next
// launch's check does not report it again as its own.
[[noreturn]] inline void fail_call(std::string_view what, const char* call, cudaError_t e) {
  (void)cudaGetLastError();
  fail(what, ": CUDA error in ", call, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}
#endif

}  // namespace encore::cuda::detail

#define CHECK_CUDA(what, call)                            \
  do {                                                    \
    const cudaError_t e_ = (call);                        \
    if (e_ != cudaSuccess) [[unlikely]]                   \
      ::encore::cuda::detail::fail_call(what, #call, e_); \
  } while (0)
