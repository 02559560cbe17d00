// Elementwise kernels over one tensor (plus a scalar attribute), and the activation gradients.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <type_traits>

#include "kernels/cpu/kernel.h"
#include "kernels/cpu/simd.h"

namespace encore::kernels::cpu {
namespace {

// ---- y = f(x, s), s = ScalarAttrs.value cast to T ----------------------------------------

template <Op kOp, typename T>
inline T scalar_op(T x, T s) {
  if constexpr (kOp == Op::AddScalar) return x + s;
  if constexpr (kOp == Op::MulScalar) return x * s;
  if constexpr (kOp == Op::RsubScalar) return s - x;
  if constexpr (kOp == Op::DivScalar) return x / s;
  if constexpr (kOp == Op::RdivScalar) return s / x;
  if constexpr (kOp == Op::PowScalar) return std::pow(x, s);
  if constexpr (kOp == Op::LeakyRelu) return x > T(0) ? x : s * x;
}

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
    for (int64_t i = 0; i < n; ++i) py[i] = scalar_op<kOp>(px[i], sv);
  });
}

// ---- y = f(x) ----------------------------------------------------------------------------

// tanh in float32 without libm, so that GCC vectorises the loop (glibc's tanhf is scalar).
// Within 1 ulp of the correctly rounded result for every float, with or without FMA
// contraction (checked over all 2^32 inputs; tests/tanh_accuracy_test.cc sweeps a subset).
// For |x| < 0.75 an odd polynomial, x + x^3 P(x^2); above, 1 - 2 / (exp(2|x|) + 1) with
// exp(z) = 2^k exp(r), z = k ln2 + r, |r| <= ln2 / 2. |x| is clamped at 10, past which tanh
// rounds to 1, so 2^k cannot overflow. NaN passes through every step; the sign is x's.
inline float tanh_float(float x) {
  const float a = std::abs(x);

  // Near-minimax fit of (tanh(x) - x) / x^3 in s = x^2 over [0, 0.75^2]; error below 2^-31.
  constexpr float kTanhP[] = {-6.9653303e-4f, 3.0899264e-3f, -8.6847170e-3f, 2.1835781e-2f,
                              -5.3965168e-2f, 1.3333323e-1f, -3.3333333e-1f};
  const float s = a * a;
  float p = kTanhP[0];
  for (size_t i = 1; i < std::size(kTanhP); ++i) p = p * s + kTanhP[i];
  const float small = a + a * s * p;

  // e^z: k = round(z / ln2) by the 1.5 * 2^23 trick, whose low mantissa bits then hold k;
  // ln2 in two parts (the first has 9 significant bits, so k ln2_hi is exact); e^r =
  // 1 + r + r^2 Q(r), Q a near-minimax fit of (e^r - 1 - r) / r^2 (error below 2^-32).
  constexpr float kShift = 0x1.8p23f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kExpQ[] = {1.9890981e-4f, 1.3933641e-3f, 8.3333109e-3f,
                             4.1666465e-2f, 1.6666667e-1f, 0.5f};
  const float z = 2.0f * std::min(a, 10.0f);
  const float k_shifted = z * 1.44269504f + kShift;
  const float k = k_shifted - kShift;
  const float r = (z - k * kLn2Hi) - k * kLn2Lo;
  float q = kExpQ[0];
  for (size_t i = 1; i < std::size(kExpQ); ++i) q = q * r + kExpQ[i];
  const float exp_r = 1.0f + (r + r * r * q);
  const float two_k = std::bit_cast<float>((std::bit_cast<uint32_t>(k_shifted) + 127u) << 23);
  const float large = 1.0f - 2.0f / (exp_r * two_k + 1.0f);

  return std::copysign(a < 0.75f ? small : large, x);
}

template <Op kOp, typename T>
inline T unary_op(T x) {
  if constexpr (kOp == Op::Neg) return -x;
  if constexpr (kOp == Op::Exp) return std::exp(x);
  if constexpr (kOp == Op::Log) return std::log(x);
  if constexpr (kOp == Op::Relu) return x > T(0) ? x : T(0);
  if constexpr (kOp == Op::Sigmoid) {  // exp(-|x|) never overflows
    const T e = std::exp(-std::abs(x));
    const T r = T(1) / (T(1) + e);
    return x >= T(0) ? r : e * r;
  }
  if constexpr (kOp == Op::Tanh) {
    if constexpr (std::is_same_v<T, float>) return tanh_float(x);
    return std::tanh(x);
  }
}

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

// ---- gx = f(a, gy): a is the forward output y, or the input x for LeakyReluGrad ----------

template <Op kOp, typename T>
inline T activation_grad(T a, T gy, T slope) {
  if constexpr (kOp == Op::ReluGrad) return a > T(0) ? gy : T(0);
  if constexpr (kOp == Op::LeakyReluGrad) return a > T(0) ? gy : slope * gy;
  if constexpr (kOp == Op::SigmoidGrad) return gy * a * (T(1) - a);
  if constexpr (kOp == Op::TanhGrad) return gy * (T(1) - a * a);
}

template <Op kOp>
void activation_grad_kernel(const KernelArgs& args) {
  const BufferView &a = args.in[0], &gy = args.in[1], &gx = args.out[0];
  const double slope = kOp == Op::LeakyReluGrad ? args.attr<ScalarAttrs>().value : 0.0;
  switch_floating(a.dtype, kOp, [&]<typename T>(Type<T>) {
    const T* pa = a.as<T>();
    const T* pg = gy.as<T>();
    T* po = gx.as<T>();
    const T s = static_cast<T>(slope);
    for (int64_t i = 0, n = a.numel(); i < n; ++i) po[i] = activation_grad<kOp>(pa[i], pg[i], s);
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
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
