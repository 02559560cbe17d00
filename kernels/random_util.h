// Uniform numbers from Philox words, shared by the random kernels of every device (cpu/random.cc,
// cpu/dropout.cc, cuda/random.cu), so every op that draws turns the same words into the same
// values on every device.
#pragma once

#include <cstdint>

#include "runtime/rng.h"  // ENCORE_HOST_DEVICE

namespace encore::kernels {

// Uniform in [0, 1) in T from one word (float: (w[0] >> 8) 2^-24) or two (double: the top 53
// bits of w[0] w[1] times 2^-53).
template <typename T>
ENCORE_HOST_DEVICE T unit(const uint32_t* w) {
  if constexpr (sizeof(T) == 4) {
    return static_cast<T>(w[0] >> 8) * T(0x1p-24);
  } else {
    const uint64_t bits = ((static_cast<uint64_t>(w[0]) << 32) | w[1]) >> 11;
    return static_cast<T>(bits) * T(0x1p-53);
  }
}

// The spacing of unit<T>'s values.
template <typename T>
constexpr T kUnitStep = sizeof(T) == 4 ? T(0x1p-24) : T(0x1p-53);

}  // namespace encore::kernels
