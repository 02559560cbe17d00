// Uniform numbers from Philox words, shared by the random kernels of every device (cpu/random.cc,
// cpu/dropout.cc, cuda/random.cu), so every op that draws turns the same words into the same
// values on every device.
#pragma once

#include <cmath>
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

// The largest value a uniform draw in [low, high) takes in T: lo + width * u rounds up to high
// where the width is small beside low (from 1000 to 1001 in float32, 148 of 2^22 draws were
// 1001), so the kernels of every device clamp to the value below high; low where they are equal.
template <typename T>
T uniform_top(double low, double high) {
  const T lo = static_cast<T>(low), hi = static_cast<T>(high);
  return hi > lo ? std::nextafter(hi, lo) : lo;
}

}  // namespace encore::kernels
