// convert_value<D>(v): static_cast<D>(v) made total, the one conversion of an element from one
// dtype to another: copy_ and fill_ on every device (kernels/cpu, kernels/cuda) and
// Tensor::item and to_vector on the host, so each gives the values of the others.
//   convert_value<int32_t>(3e9) == INT32_MAX, convert_value<int32_t>(NAN) == 0
#pragma once

#include <cstdint>
#include <type_traits>

#include "runtime/host_device.h"

namespace encore {

// To bool, nonzero is true; from floating to integer, the value truncated toward zero, NaN is 0
// and values beyond D's range saturate to its min or max (static_cast is undefined there);
// anything else as static_cast. Branch-free, so conversion loops still vectorize; no library
// calls, so CUDA device code can use it.
template <typename D, typename S>
ENCORE_HOST_DEVICE constexpr D convert_value(S v) {
  if constexpr (std::is_same_v<D, bool>) {
    return v != S(0);
  } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
    static_assert(std::is_signed_v<D>, "convert_value: the dtypes' integers are signed");
    constexpr S kPastMax = static_cast<S>(uint64_t{1} << (sizeof(D) * 8 - 1));  // 2^(bits-1)
    constexpr S kLow = -kPastMax;                                               // D's min, exact
    // The largest S below kPastMax: half an epsilon of S below it (2^31 - 128 for float to int32).
    constexpr S kHalfEps = std::is_same_v<S, float> ? S(0x1p-24) : S(0x1p-53);
    constexpr S kHigh = kPastMax - kPastMax * kHalfEps;
    constexpr D kMax = static_cast<D>((uint64_t{1} << (sizeof(D) * 8 - 1)) - 1);
    S x = v != v ? S(0) : v;  // NaN
    x = x < kLow ? kLow : x;
    x = x > kHigh ? kHigh : x;
    const D r = static_cast<D>(x);  // x is now in range
    return v >= kPastMax ? kMax : r;
  } else {
    return static_cast<D>(v);
  }
}

}  // namespace encore
