// Dtype dispatch for kernels (cpu and cuda host code): calls a templated lambda with the C++
// element type.
//
//   switch_floating(x.dtype, Op::Exp, [&]<typename T>(Type<T>) {
//     exp_loop(x.as<T>(), y.as<T>(), x.numel());
//   });
//
// An unsupported dtype throws Error naming the op and the dtypes it accepts (op_name is
// looked up only then).
#pragma once

#include <cstdint>
#include <type_traits>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/op_traits.h"

namespace encore::kernels {

template <typename T>
using Type = std::type_identity<T>;

// Calls f(Type<T>{}) with the T of Ts whose dtype is `dt`; any other dtype fails, naming the op,
// the dtype and then `expected`.
template <typename... Ts, typename F>
void switch_among(DType dt, Op op, const char* expected, F&& f) {
  if (!((dt == dtype_of<Ts> && (f(Type<Ts>{}), true)) || ...))
    fail(op_name(op), ": unsupported dtype ", dt, expected);
}

// float32, float64.
template <typename F>
void switch_floating(DType dt, Op op, F&& f) {
  switch_among<float, double>(dt, op, " (expected float32 or float64)", f);
}

// float32, float64, int32, int64.
template <typename F>
void switch_numeric(DType dt, Op op, F&& f) {
  switch_among<float, double, int32_t, int64_t>(dt, op,
                                                " (expected float32, float64, int32 or int64)", f);
}

// int32, int64 (labels).
template <typename F>
void switch_integral(DType dt, Op op, F&& f) {
  switch_among<int32_t, int64_t>(dt, op, " (expected int32 or int64)", f);
}

// Every dtype.
template <typename F>
void switch_all(DType dt, Op op, F&& f) {
  switch_among<float, double, int32_t, int64_t, bool>(dt, op, "", f);
}

// An unsigned integer type of the dtype's size, for kernels that only move bytes.
template <typename F>
void switch_itemsize(DType dt, Op op, F&& f) {
  switch (itemsize(dt)) {
    case 1:
      return f(Type<uint8_t>{});
    case 4:
      return f(Type<uint32_t>{});
    case 8:
      return f(Type<uint64_t>{});
    default:
      fail(op_name(op), ": unsupported dtype ", dt);
  }
}

}  // namespace encore::kernels
