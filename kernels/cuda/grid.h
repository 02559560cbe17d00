// Launch geometry shared by the CUDA kernel files and the kernel headers the host compiles too
// (the emulated kernel tests, tests/nvrtc/): plain C++, no CUDA header.
#pragma once

#include <cstdint>

namespace encore::kernels::cuda {

inline constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

}  // namespace encore::kernels::cuda
