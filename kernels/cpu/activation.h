// The activation a planner-made producer (LinearAct, Conv2dAct, MatmulActGrad; runtime/ops.h)
// applies to what it has just written, while it is still in cache. Each element goes through the
// element function of the activation's own kernel (elementwise.h), so the bits are those of the
// producer's step followed by the activation's step.
#pragma once

#include <cstdint>

#include "kernels/cpu/elementwise.h"
#include "runtime/error.h"

namespace encore::kernels::cpu {

// p[0, n) = act(p[0, n)) for act.op among Relu, LeakyRelu (slope act.scalar), Sigmoid, Tanh,
// Gelu (act.scalar: its form, as Gelu's ScalarAttrs).
template <typename T>
void apply_activation(const ActAttrs& act, T* p, int64_t n) {
  auto each = [&](auto f) {
    for (int64_t i = 0; i < n; ++i) p[i] = f(p[i]);
  };
  switch (act.op) {
    case Op::Relu:
      return each([](T x) { return unary_op<Op::Relu>(x); });
    case Op::LeakyRelu: {
      const T s = static_cast<T>(act.scalar);
      return each([s](T x) { return scalar_op<Op::LeakyRelu>(x, s); });
    }
    case Op::Sigmoid:
      return each([](T x) { return unary_op<Op::Sigmoid>(x); });
    case Op::Tanh:
      return each([](T x) { return unary_op<Op::Tanh>(x); });
    case Op::Gelu:
      return with_gelu_form(static_cast<T>(act.scalar), [&](auto tanh) {
        each([](T x) { return gelu_of<decltype(tanh)::value>(x); });
      });
    default:
      throw Error(cat(op_name(act.op), " is not an activation a producer applies"));
  }
}

// g[0, n) = act_grad(a[0, n), g[0, n)) for act.op among ReluGrad, LeakyReluGrad, SigmoidGrad,
// TanhGrad, GeluGrad: a is what the gradient op reads first (the forward output, or leaky_relu's
// and gelu's input).
template <typename T>
void apply_activation_grad(const ActAttrs& act, const T* a, T* g, int64_t n) {
  const T s = static_cast<T>(act.scalar);
  auto each = [&](auto f) {
    for (int64_t i = 0; i < n; ++i) g[i] = f(a[i], g[i]);
  };
  switch (act.op) {
    case Op::ReluGrad:
      return each([s](T x, T gy) { return activation_grad<Op::ReluGrad>(x, gy, s); });
    case Op::LeakyReluGrad:
      return each([s](T x, T gy) { return activation_grad<Op::LeakyReluGrad>(x, gy, s); });
    case Op::SigmoidGrad:
      return each([s](T x, T gy) { return activation_grad<Op::SigmoidGrad>(x, gy, s); });
    case Op::TanhGrad:
      return each([s](T x, T gy) { return activation_grad<Op::TanhGrad>(x, gy, s); });
    case Op::GeluGrad:
      return with_gelu_form(s, [&](auto tanh) {
        each([](T x, T gy) { return gelu_grad_of<decltype(tanh)::value>(x, gy); });
      });
    default:
      throw Error(cat(op_name(act.op), " is not an activation gradient a producer applies"));
  }
}

}  // namespace encore::kernels::cpu
