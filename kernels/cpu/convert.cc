// Dtype conversion and fills: copy, copy_, fill_, arange_.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/kernel.h"
#include "runtime/convert.h"

namespace encore::kernels::cpu {
namespace {

// to = from converted element by element (convert_value, runtime/convert.h).
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

// t[i] = i, converted from the double i as arange() converted its host values before it was an op.
void arange_kernel(const KernelArgs& args) {
  const BufferView& t = args.in[0];
  switch_all(t.dtype, Op::Arange, [&]<typename T>(Type<T>) {
    T* p = t.as<T>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = convert_value<T>(static_cast<double>(i));
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::Copy, DeviceType::CPU, &copy_kernel);
  register_kernel(Op::CopyInplace, DeviceType::CPU, &copy_inplace_kernel);
  register_kernel(Op::Fill, DeviceType::CPU, &fill_kernel);
  register_kernel(Op::Arange, DeviceType::CPU, &arange_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
