// Reductions over an axis set: sum, mean, max.
//
// One strided loop over the input with the output as a second operand whose strides are 0 on
// reduced axes. After coalescing, each innermost row is either a row reduction (output stride
// 0: reduced with independent lanes, which vectorizes) or an accumulation of an input row into
// an output row (stride 1 both), so sum over the last axis and sum over axis 0 are both tight.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/kernel.h"
#include "kernels/cpu/reduce_row.h"
#include "kernels/strided_loop.h"

namespace encore::kernels::cpu {
namespace {

template <typename R, typename T>
void reduce(const BufferView& x, const BufferView& out, uint8_t mask) {
  const T* px = x.as<T>();
  T* po = out.as<T>();
  const Shape& shape = x.shape;
  int64_t strides[2][kMaxRank];  // 0: out, 1: x
  contiguous_strides(shape, strides[1]);
  int64_t s = 1;
  for (int d = shape.rank() - 1; d >= 0; --d) {
    const bool reduced = (mask >> d & 1) != 0;
    strides[0][d] = reduced ? 0 : s;
    if (!reduced) s *= shape[d];
  }
  std::fill(po, po + out.numel(), R::template init<T>());
  const StridedLoop<2> loop = make_strided_loop<2>(shape.rank(), shape.begin(), strides);
  for_each_row(loop, [&](const int64_t* off, int64_t n, const int64_t* st) {
    T* o = po + off[0];
    const T* in = px + off[1];
    if (st[0] == 0 && st[1] == 1) {
      *o = R::combine(*o, reduce_contiguous<R>(in, n));
    } else if (st[0] == 1 && st[1] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = R::combine(o[i], in[i]);
    } else if (st[0] == 0) {
      T r = *o;
      for (int64_t i = 0; i < n; ++i) r = R::combine(r, in[i * st[1]]);
      *o = r;
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = R::combine(o[i * st[0]], in[i * st[1]]);
    }
  });
}

// Number of input elements folded into each output element.
int64_t reduced_count(const Shape& shape, uint8_t mask) {
  int64_t c = 1;
  for (int d = 0; d < shape.rank(); ++d)
    if (mask >> d & 1) c *= shape[d];
  return c;
}

template <Op kOp, typename R>
void reduce_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &out = args.out[0];
  const uint8_t mask = args.attr<ReduceAttrs>().axes_mask;
  auto run = [&]<typename T>(Type<T>) {
    if (out.numel() == x.numel()) {  // nothing folded (mask 0, or only size-1 axes)
      std::memcpy(out.data, x.data, x.numel() * sizeof(T));
      return;
    }
    const int rank = x.shape.rank();
    if (rank > 0 && mask == 1u << (rank - 1)) {  // the last axis: rows, as the fused kernel
      const int64_t n = x.shape[rank - 1], rows = out.numel();
      const T* px = x.as<T>();
      T* po = out.as<T>();
      for (int64_t r = 0; r < rows; ++r) po[r] = reduce_last_axis_row<R>(px + r * n, n, rows == 1);
    } else if (out.numel() == 1) {  // every axis folded
      *out.as<T>() = reduce_contiguous<R>(x.as<T>(), x.numel());
    } else {
      reduce<R, T>(x, out, mask);
    }
    if constexpr (kOp == Op::Mean) {
      const T count = static_cast<T>(reduced_count(x.shape, mask));
      T* po = out.as<T>();
      for (int64_t i = 0, n = out.numel(); i < n; ++i) po[i] /= count;
    }
  };
  if constexpr (kOp == Op::Mean) {
    switch_floating(x.dtype, kOp, run);
  } else {
    switch_numeric(x.dtype, kOp, run);
  }
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::Sum, DeviceType::CPU, &reduce_kernel<Op::Sum, SumOp>);
  register_kernel(Op::Mean, DeviceType::CPU, &reduce_kernel<Op::Mean, SumOp>);
  register_kernel(Op::Max, DeviceType::CPU, &reduce_kernel<Op::Max, MaxOp>);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
