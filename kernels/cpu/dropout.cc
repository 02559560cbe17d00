// Dropout: x -> y, mask, from counter-based Philox (as kernels/cpu/random.cc).
//
// Element i of a call with RandomAttrs{ratio, -, seed, offset} draws u in [0, 1) in the tensor's
// dtype from philox(seed, offset / 4 + i) (float32: (w0 >> 8) 2^-24; float64: the top 53 bits of
// w0 w1 times 2^-53) and is kept when u >= ratio:
//   mask = kept ? 1 / (1 - ratio) : 0,   y = x * mask.
// A value depends only on (seed, offset, i), so a static replay that reserves its own stream
// gets what eager would from the same generator state, at any thread count.
#include <cstdint>

#include "kernels/cpu/kernel.h"
#include "kernels/random_util.h"
#include "runtime/parallel.h"
#include "runtime/rng.h"

namespace encore::kernels::cpu {
namespace {

void dropout_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0], &mask = args.out[1];
  const RandomAttrs& r = args.attr<RandomAttrs>();
  switch_floating(x.dtype, Op::Dropout, [&]<typename T>(Type<T>) {
    const T* px = x.as<T>();
    T* py = y.as<T>();
    T* pm = mask.as<T>();
    const T ratio = static_cast<T>(r.a);
    const T scale = static_cast<T>(1.0 / (1.0 - r.a));
    const uint64_t seed = r.seed, base = r.offset / 4;
    constexpr int64_t kGrain = int64_t{1} << 14;
    parallel_for(x.numel(), kGrain, [=](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const T m =
            unit<T>(philox(seed, base + static_cast<uint64_t>(i)).v) >= ratio ? scale : T(0);
        pm[i] = m;
        py[i] = px[i] * m;
      }
    });
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::Dropout, DeviceType::CPU, &dropout_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
