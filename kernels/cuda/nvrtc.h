// NVRTC, the CUDA toolkit's runtime compiler, loaded when first used: $ENCORE_NVRTC, else
// libnvrtc.so.13 or libnvrtc.so on the loader's path, else beside the cuBLAS the process loaded,
// else /usr/local/cuda/lib64. A process that never fuses a CUDA plan needs no NVRTC, and one that
// cannot load it runs its CUDA plans unfused, as one of another CUDA release than the build's
// (its compiler and math library could round otherwise). Compiling needs no GPU.
#pragma once

#include <string>

#include "runtime/error.h"

namespace encore::kernels::cuda {

// "" when NVRTC is loaded, else why it cannot be.
const std::string& nvrtc_unavailable();

// What nvrtc_compile throws when NVRTC rejects the source itself (its log says why): compiling it
// again would fail again, where another Error (NVRTC out of memory) may not.
class NvrtcRejected : public Error {
 public:
  using Error::Error;
};

// The cubin of a fused kernel's source (fused_source.h) for compute capability `arch` (90: sm_90),
// with element_ops.cuh as its one header. Compiled as the unfused kernels are: no contraction into
// fma, IEEE division and square root, denormals kept. NvrtcRejected with NVRTC's log when the
// source does not compile; Error when NVRTC fails otherwise.
std::string nvrtc_compile(const std::string& source, int arch);

}  // namespace encore::kernels::cuda
