// Dtype conversion and fills: copy, copy_, fill_.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/cpu/kernel.h"

namespace encore::kernels::cpu {
namespace {

// static_cast<D>(v), made total: to bool, nonzero is true; from floating to integer, NaN is 0
// and values beyond D's range saturate to its min or max (static_cast is undefined there).
// Branch-free, so conversion loops still vectorize.
template <typename D, typename S>
D convert_value(S v) {
  if constexpr (std::is_same_v<D, bool>) {
    return v != S(0);
  } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
    constexpr S kLow = static_cast<S>(std::numeric_limits<D>::min());  // -2^(bits-1), exact
    constexpr S kPastMax = -kLow;                                      // 2^(bits-1), exact
    // The largest S below kPastMax (2^31 - 128 for float to int32).
    constexpr S kHigh = kPastMax - kPastMax * (std::numeric_limits<S>::epsilon() / 2);
    S x = std::isnan(v) ? S(0) : v;
    x = x < kLow ? kLow : x;
    x = x > kHigh ? kHigh : x;
    const D r = static_cast<D>(x);  // x is now in range
    return v >= kPastMax ? std::numeric_limits<D>::max() : r;
  } else {
    return static_cast<D>(v);
  }
}

// to = from converted element by element (see convert_value).
void convert(const BufferView& from, const BufferView& to, Op op) {
  const int64_t n = to.numel();
  if (from.dtype == to.dtype) {
    if (from.data != to.data) std::memcpy(to.data, from.data, n * itemsize(to.dtype));
    return;
  }
  switch_all(from.dtype, op, [&]<typename S>(Type<S>) {
    switch_all(to.dtype, op, [&]<typename D>(Type<D>) {
      const S* src = from.as<S>();
      D* dst = to.as<D>();
      for (int64_t i = 0; i < n; ++i) dst[i] = convert_value<D>(src[i]);
    });
  });
}

void copy_kernel(const KernelArgs& args) {
  convert(args.in[0], args.out[0], Op::Copy);
}

// dst (in 0) = src (in 1).
void copy_inplace_kernel(const KernelArgs& args) {
  convert(args.in[1], args.in[0], Op::CopyInplace);
}

void fill_kernel(const KernelArgs& args) {
  const BufferView& t = args.in[0];
  const double value = args.attr<ScalarAttrs>().value;
  switch_all(t.dtype, Op::Fill, [&]<typename T>(Type<T>) {
    T* p = t.as<T>();
    std::fill(p, p + t.numel(), convert_value<T>(value));
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::Copy, DeviceType::CPU, &copy_kernel);
  register_kernel(Op::CopyInplace, DeviceType::CPU, &copy_inplace_kernel);
  register_kernel(Op::Fill, DeviceType::CPU, &fill_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
