// Softmax and log-softmax along an axis, and their gradients.
//
// A tensor is seen as [outer, n, inner] with n the softmax axis; each (outer, inner) pair is a
// lane of n elements with stride `inner`. Lanes with inner == 1 (the last axis, the common
// case) are compiled separately with a unit stride so their loops vectorize.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/kernel.h"
#include "kernels/cpu/softmax_util.h"
#include "kernels/strided_loop.h"

namespace encore::kernels::cpu {
namespace {

// Calls lane(offset, stride) for every lane, with the stride a compile-time 1 when inner == 1.
template <typename Lane>
void for_each_lane(const AxisSplit& l, Lane&& lane) {
  if (l.inner == 1) {
    for (int64_t o = 0; o < l.outer; ++o) lane(o * l.n, kUnitStride);
    return;
  }
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t c = 0; c < l.inner; ++c) lane(o * l.n * l.inner + c, l.inner);
}

template <bool kLog>
void softmax_kernel(const KernelArgs& args) {
  constexpr Op kOp = kLog ? Op::LogSoftmax : Op::Softmax;
  const BufferView &x = args.in[0], &y = args.out[0];
  const AxisSplit l = split_at(x.shape, args.attr<AxisAttrs>().axis);
  switch_floating(x.dtype, kOp, [&]<typename T>(Type<T>) {
    const T* px = x.as<T>();
    T* py = y.as<T>();
    for_each_lane(l, [&](int64_t off, auto s) { softmax_lane<kLog>(px + off, py + off, l.n, s); });
  });
}

template <bool kLog>
void softmax_grad_kernel(const KernelArgs& args) {
  constexpr Op kOp = kLog ? Op::LogSoftmaxGrad : Op::SoftmaxGrad;
  const BufferView &y = args.in[0], &gy = args.in[1], &gx = args.out[0];
  const AxisSplit l = split_at(y.shape, args.attr<AxisAttrs>().axis);
  switch_floating(y.dtype, kOp, [&]<typename T>(Type<T>) {
    const T* py = y.as<T>();
    const T* pg = gy.as<T>();
    T* px = gx.as<T>();
    for_each_lane(l, [&](int64_t off, auto s) {
      softmax_grad_lane<kLog>(py + off, pg + off, px + off, l.n, s);
    });
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::Softmax, DeviceType::CPU, &softmax_kernel<false>);
  register_kernel(Op::LogSoftmax, DeviceType::CPU, &softmax_kernel<true>);
  register_kernel(Op::SoftmaxGrad, DeviceType::CPU, &softmax_grad_kernel<false>);
  register_kernel(Op::LogSoftmaxGrad, DeviceType::CPU, &softmax_grad_kernel<true>);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
