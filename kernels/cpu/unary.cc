// Elementwise kernels over one tensor (plus a scalar attribute), and the activation gradients.
#include <cstdint>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/kernel.h"
#include "kernels/cpu/simd.h"

namespace encore::kernels::cpu {
namespace {

// ---- y = f(x, s), s = ScalarAttrs.value cast to T ----------------------------------------

template <Op kOp>
void scalar_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0];
  const double s = args.attr<ScalarAttrs>().value;
  switch_floating(x.dtype, kOp, [&]<typename T>(Type<T>) {
    const T* px = x.as<T>();
    T* py = y.as<T>();
    const T sv = static_cast<T>(s);
    const int64_t n = x.numel();
    if (kOp == Op::PowScalar && s == 2) {
      for (int64_t i = 0; i < n; ++i) py[i] = px[i] * px[i];
      return;
    }
    if constexpr (kOp == Op::Gelu) {
      with_gelu_form(sv, [&](auto tanh) {
        for (int64_t i = 0; i < n; ++i) py[i] = gelu_of<decltype(tanh)::value>(px[i]);
      });
    } else {
      for (int64_t i = 0; i < n; ++i) py[i] = scalar_op<kOp>(px[i], sv);
    }
  });
}

// ---- y = f(x) ----------------------------------------------------------------------------

template <Op kOp>
void unary_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0];
  switch_floating(x.dtype, kOp, [&]<typename T>(Type<T>) {
    const T* px = x.as<T>();
    T* py = y.as<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) py[i] = unary_op<kOp>(px[i]);
  });
}

void sqrt_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0];
  switch_floating(x.dtype, Op::Sqrt,
                  [&]<typename T>(Type<T>) { sqrt_array(x.as<T>(), y.as<T>(), x.numel()); });
}

// ---- gx = f(a, gy): a is the forward output y, or the input x for LeakyReluGrad, GeluGrad --

template <Op kOp>
void activation_grad_kernel(const KernelArgs& args) {
  const BufferView &a = args.in[0], &gy = args.in[1], &gx = args.out[0];
  const double slope = op_has_scalar_attrs(kOp) ? args.attr<ScalarAttrs>().value : 0.0;
  switch_floating(a.dtype, kOp, [&]<typename T>(Type<T>) {
    const T* pa = a.as<T>();
    const T* pg = gy.as<T>();
    T* po = gx.as<T>();
    const T s = static_cast<T>(slope);
    const int64_t n = a.numel();
    if constexpr (kOp == Op::GeluGrad) {
      with_gelu_form(s, [&](auto tanh) {
        for (int64_t i = 0; i < n; ++i) po[i] = gelu_grad_of<decltype(tanh)::value>(pa[i], pg[i]);
      });
    } else {
      for (int64_t i = 0; i < n; ++i) po[i] = activation_grad<kOp>(pa[i], pg[i], s);
    }
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  constexpr DeviceType kCpu = DeviceType::CPU;
  register_kernel(Op::AddScalar, kCpu, &scalar_kernel<Op::AddScalar>);
  register_kernel(Op::MulScalar, kCpu, &scalar_kernel<Op::MulScalar>);
  register_kernel(Op::RsubScalar, kCpu, &scalar_kernel<Op::RsubScalar>);
  register_kernel(Op::DivScalar, kCpu, &scalar_kernel<Op::DivScalar>);
  register_kernel(Op::RdivScalar, kCpu, &scalar_kernel<Op::RdivScalar>);
  register_kernel(Op::PowScalar, kCpu, &scalar_kernel<Op::PowScalar>);
  register_kernel(Op::LeakyRelu, kCpu, &scalar_kernel<Op::LeakyRelu>);
  register_kernel(Op::Gelu, kCpu, &scalar_kernel<Op::Gelu>);
  register_kernel(Op::Neg, kCpu, &unary_kernel<Op::Neg>);
  register_kernel(Op::Exp, kCpu, &unary_kernel<Op::Exp>);
  register_kernel(Op::Log, kCpu, &unary_kernel<Op::Log>);
  register_kernel(Op::Sqrt, kCpu, &sqrt_kernel);
  register_kernel(Op::Relu, kCpu, &unary_kernel<Op::Relu>);
  register_kernel(Op::Sigmoid, kCpu, &unary_kernel<Op::Sigmoid>);
  register_kernel(Op::Tanh, kCpu, &unary_kernel<Op::Tanh>);
  register_kernel(Op::ReluGrad, kCpu, &activation_grad_kernel<Op::ReluGrad>);
  register_kernel(Op::LeakyReluGrad, kCpu, &activation_grad_kernel<Op::LeakyReluGrad>);
  register_kernel(Op::SigmoidGrad, kCpu, &activation_grad_kernel<Op::SigmoidGrad>);
  register_kernel(Op::TanhGrad, kCpu, &activation_grad_kernel<Op::TanhGrad>);
  register_kernel(Op::GeluGrad, kCpu, &activation_grad_kernel<Op::GeluGrad>);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
