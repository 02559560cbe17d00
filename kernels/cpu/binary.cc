// Broadcasting binary kernels: add, sub, mul, div, equal, greater, where, add_.
#include <cstdint>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/kernel.h"
#include "kernels/strided_loop.h"

namespace encore::kernels::cpu {
namespace {

// o[i] = f(a[i*sa], b[i*sb]), with the common stride patterns as tight loops.
template <typename T, typename R, typename F>
inline void binary_row(const T* a, int64_t sa, const T* b, int64_t sb, R* o, int64_t n, F f) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    const T bv = *b;
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    const T av = *a;
    for (int64_t i = 0; i < n; ++i) o[i] = f(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i * sa], b[i * sb]);
  }
}

// out = f(a, b) with a and b broadcast to out's shape. `out` may alias `a` (add_).
template <typename T, typename R, typename F>
void binary_broadcast(const BufferView& a, const BufferView& b, const BufferView& out, F f) {
  const T* pa = a.as<T>();
  const T* pb = b.as<T>();
  R* po = out.as<R>();
  const int64_t n = out.numel(), na = a.numel(), nb = b.numel();
  // A broadcast operand with as many elements as the output has the output's layout.
  if (na == n && nb == n) return binary_row(pa, 1, pb, 1, po, n, f);
  if (na == n && nb == 1) return binary_row(pa, 1, pb, 0, po, n, f);
  if (na == 1 && nb == n) return binary_row(pa, 0, pb, 1, po, n, f);
  const StridedLoop<3> loop = broadcast_loop<3>(out.shape, {&a.shape, &b.shape});
  // The output is contiguous, so its innermost stride is 1.
  for_each_row(loop, [&](const int64_t* off, int64_t len, const int64_t* s) {
    binary_row(pa + off[1], s[1], pb + off[2], s[2], po + off[0], len, f);
  });
}

template <Op kOp>
void arithmetic_kernel(const KernelArgs& args) {
  const BufferView &a = args.in[0], &b = args.in[1], &out = args.out[0];
  switch_floating(out.dtype, kOp,
                  [&]<typename T>(Type<T>) { binary_broadcast<T, T>(a, b, out, BinaryOp<kOp>{}); });
}

template <Op kOp>
void compare_kernel(const KernelArgs& args) {
  const BufferView &a = args.in[0], &b = args.in[1], &out = args.out[0];
  switch_numeric(a.dtype, kOp, [&]<typename T>(Type<T>) {
    binary_broadcast<T, bool>(a, b, out, BinaryOp<kOp>{});
  });
}

// t += other, other broadcast to t.
void add_inplace_kernel(const KernelArgs& args) {
  const BufferView &t = args.in[0], &other = args.in[1];
  switch_floating(t.dtype, Op::AddInplace, [&]<typename T>(Type<T>) {
    binary_broadcast<T, T>(t, other, t, BinaryOp<Op::AddInplace>{});
  });
}

// out = cond ? a : b, all three broadcast to out.
void where_kernel(const KernelArgs& args) {
  const BufferView &cond = args.in[0], &a = args.in[1], &b = args.in[2], &out = args.out[0];
  switch_all(out.dtype, Op::Where, [&]<typename T>(Type<T>) {
    const uint8_t* pc = cond.as<uint8_t>();
    const T* pa = a.as<T>();
    const T* pb = b.as<T>();
    T* po = out.as<T>();
    const int64_t n = out.numel();
    if (cond.numel() == n && a.numel() == n && b.numel() == n) {
      for (int64_t i = 0; i < n; ++i) po[i] = where_of(pc[i], pa[i], pb[i]);
      return;
    }
    const StridedLoop<4> loop = broadcast_loop<4>(out.shape, {&cond.shape, &a.shape, &b.shape});
    for_each_row(loop, [&](const int64_t* off, int64_t len, const int64_t* s) {
      const uint8_t* c = pc + off[1];
      const T* x = pa + off[2];
      const T* y = pb + off[3];
      T* o = po + off[0];
      for (int64_t i = 0; i < len; ++i) o[i] = where_of(c[i * s[1]], x[i * s[2]], y[i * s[3]]);
    });
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::Add, DeviceType::CPU, &arithmetic_kernel<Op::Add>);
  register_kernel(Op::Sub, DeviceType::CPU, &arithmetic_kernel<Op::Sub>);
  register_kernel(Op::Mul, DeviceType::CPU, &arithmetic_kernel<Op::Mul>);
  register_kernel(Op::Div, DeviceType::CPU, &arithmetic_kernel<Op::Div>);
  register_kernel(Op::Equal, DeviceType::CPU, &compare_kernel<Op::Equal>);
  register_kernel(Op::Greater, DeviceType::CPU, &compare_kernel<Op::Greater>);
  register_kernel(Op::Where, DeviceType::CPU, &where_kernel);
  register_kernel(Op::AddInplace, DeviceType::CPU, &add_inplace_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
