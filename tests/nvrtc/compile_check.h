// What the NVRTC tests check of a fused program's source: NVRTC compiles it for sm_90 (no GPU
// needed) into a cubin that holds the kernel's symbol.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "kernels/cuda/fused_source.h"
#include "kernels/cuda/nvrtc.h"
#include "runtime/fused.h"

namespace encore::testing {

inline constexpr int kNvrtcArch = 90;

inline void check_compiles(const FusedProgram& p) {
  const std::string source = kernels::cuda::fused_source(p);
  INFO(source);
  const std::string cubin = kernels::cuda::nvrtc_compile(source, kNvrtcArch);
  CHECK(cubin.size() > 64);
  CHECK(cubin.compare(0, 4,
                      "\x7f"
                      "ELF") == 0);
  CHECK(cubin.find(kernels::cuda::kFusedKernelName) != std::string::npos);
}

}  // namespace encore::testing
