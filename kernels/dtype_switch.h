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
#include "runtime/ops.h"

namespace encore::kernels {

template <typename T>
using Type = std::type_identity<T>;

// float32, float64.
template <typename F>
void switch_floating(DType dt, Op op, F&& f) {
  switch (dt) {
    case DType::Float32:
      return f(Type<float>{});
    case DType::Float64:
      return f(Type<double>{});
    default:
      fail(op_name(op), ": unsupported dtype ", dt, " (expected float32 or float64)");
  }
}

// float32, float64, int32, int64.
template <typename F>
void switch_numeric(DType dt, Op op, F&& f) {
  switch (dt) {
    case DType::Float32:
      return f(Type<float>{});
    case DType::Float64:
      return f(Type<double>{});
    case DType::Int32:
      return f(Type<int32_t>{});
    case DType::Int64:
      return f(Type<int64_t>{});
    default:
      fail(op_name(op), ": unsupported dtype ", dt, " (expected float32, float64, int32 or int64)");
  }
}

// int32, int64 (labels).
template <typename F>
void switch_integral(DType dt, Op op, F&& f) {
  switch (dt) {
    case DType::Int32:
      return f(Type<int32_t>{});
    case DType::Int64:
      return f(Type<int64_t>{});
    default:
      fail(op_name(op), ": unsupported dtype ", dt, " (expected int32 or int64)");
  }
}

// Every dtype.
template <typename F>
void switch_all(DType dt, Op op, F&& f) {
  switch (dt) {
    case DType::Float32:
      return f(Type<float>{});
    case DType::Float64:
      return f(Type<double>{});
    case DType::Int32:
      return f(Type<int32_t>{});
    case DType::Int64:
      return f(Type<int64_t>{});
    case DType::Bool:
      return f(Type<bool>{});
  }
  fail(op_name(op), ": unsupported dtype ", dt);
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
