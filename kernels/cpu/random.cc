// Random initialisers: uniform_ and normal_ from counter-based Philox.
//
// Element i of a call with RandomAttrs{a, b, seed, offset} uses the four words of
// philox(seed, offset / 4 + i), so a value depends only on (seed, offset, i) and every backend
// can produce the same stream. From the words w0..w3:
//   float32: u = (w0 >> 8) * 2^-24                               in [0, 1)
//   float64: u = (((w0 << 32) | w1) >> 11) * 2^-53               in [0, 1)
//   uniform: a + (b - a) * u, at most the value below b (uniform_top)
//   normal:  u1 = the float formula + 2^-24 (or 2^-53), in (0, 1], from w0 (w0, w1);
//            u2 = the formula on w1 (w2, w3) in [0, 1);
//            a + b * sqrt(-2 ln u1) * cos(2 pi u2)
// All arithmetic is in the tensor's dtype.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "kernels/cpu/kernel.h"
#include "kernels/random_util.h"
#include "runtime/rng.h"

namespace encore::kernels::cpu {
namespace {

void uniform_kernel(const KernelArgs& args) {
  const BufferView& t = args.in[0];
  const RandomAttrs& r = args.attr<RandomAttrs>();
  switch_floating(t.dtype, Op::UniformInit, [&]<typename T>(Type<T>) {
    T* p = t.as<T>();
    const T lo = static_cast<T>(r.a), width = static_cast<T>(r.b) - static_cast<T>(r.a);
    const T top = uniform_top<T>(r.a, r.b);
    const uint64_t base = r.offset / 4;
    for (int64_t i = 0, n = t.numel(); i < n; ++i) {
      const Philox4 w = philox(r.seed, base + i);
      p[i] = std::min(lo + width * unit<T>(w.v), top);
    }
  });
}

void normal_kernel(const KernelArgs& args) {
  const BufferView& t = args.in[0];
  const RandomAttrs& r = args.attr<RandomAttrs>();
  switch_floating(t.dtype, Op::NormalInit, [&]<typename T>(Type<T>) {
    T* p = t.as<T>();
    const T mean = static_cast<T>(r.a), stddev = static_cast<T>(r.b);
    const T two_pi = static_cast<T>(2 * std::numbers::pi);
    constexpr int kSecond = sizeof(T) == 4 ? 1 : 2;  // word of u2
    const uint64_t base = r.offset / 4;
    for (int64_t i = 0, n = t.numel(); i < n; ++i) {
      const Philox4 w = philox(r.seed, base + i);
      const T u1 = unit<T>(w.v) + kUnitStep<T>;
      const T u2 = unit<T>(w.v + kSecond);
      p[i] = mean + stddev * std::sqrt(T(-2) * std::log(u1)) * std::cos(two_pi * u2);
    }
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::UniformInit, DeviceType::CPU, &uniform_kernel);
  register_kernel(Op::NormalInit, DeviceType::CPU, &normal_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
