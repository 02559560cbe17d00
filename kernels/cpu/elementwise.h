// The element functions of the elementwise kernels: unary.cc, binary.cc and the fused
// elementwise kernel (fused.cc) compute every element with these, so a fused step gives the
// bits of the steps it replaces.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <type_traits>

#include "runtime/op_traits.h"

namespace encore::kernels::cpu {

template <Op kOp>
struct BinaryOp {
  template <typename T>
  auto operator()(T a, T b) const {
    if constexpr (kOp == Op::Add || kOp == Op::AddInplace) return a + b;
    if constexpr (kOp == Op::Sub) return a - b;
    if constexpr (kOp == Op::Mul) return a * b;
    if constexpr (kOp == Op::Div) return a / b;
    if constexpr (kOp == Op::Equal) return a == b;
    if constexpr (kOp == Op::Greater) return a > b;
  }
};

// ---- tanh and GELU, which the element functions below use ------------------------------

// e^z in float32 for z in [-87, 21] (callers clamp; 2^k must stay a normal float): k = round(z /
// ln2) by the 1.5 * 2^23 trick, whose low mantissa bits then hold k; ln2 in two parts (the first
// has 9 significant bits, so k ln2_hi is exact); e^r = 1 + r + r^2 Q(r), Q a near-minimax fit of
// (e^r - 1 - r) / r^2 (error below 2^-32), times 2^k made from k's bits. No libm, no branch:
// loops over it vectorise.
inline float exp_float(float z) {
  constexpr float kShift = 0x1.8p23f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kExpQ[] = {1.9890981e-4f, 1.3933641e-3f, 8.3333109e-3f,
                             4.1666465e-2f, 1.6666667e-1f, 0.5f};
  const float k_shifted = z * 1.44269504f + kShift;
  const float k = k_shifted - kShift;
  const float r = (z - k * kLn2Hi) - k * kLn2Lo;
  float q = kExpQ[0];
  for (size_t i = 1; i < std::size(kExpQ); ++i) q = q * r + kExpQ[i];
  const float exp_r = 1.0f + (r + r * r * q);
  const float two_k = std::bit_cast<float>((std::bit_cast<uint32_t>(k_shifted) + 127u) << 23);
  return exp_r * two_k;
}

// Bits of `a` where mask is all ones, of `b` where it is zero.
inline float select_bits(uint32_t mask, float a, float b) {
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & mask) |
                              (std::bit_cast<uint32_t>(b) & ~mask));
}

// where's element function: a where the condition's byte is nonzero, else b, chosen by the bits
// (a mask, no branch: loops over it vectorise, and a mask is no pattern a branch predictor learns).
template <typename T>
inline T where_of(uint8_t c, T a, T b) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8);
  using U = std::conditional_t<
      sizeof(T) == 1, uint8_t,
      std::conditional_t<sizeof(T) == 2, uint16_t,
                         std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
  const auto mask = static_cast<U>(U{0} - static_cast<U>(c != 0));
  return std::bit_cast<T>(static_cast<U>((std::bit_cast<U>(a) & mask) |
                                         (std::bit_cast<U>(b) & static_cast<U>(~mask))));
}

// tanh in float32 without libm, so that GCC vectorises the loop (glibc's tanhf is scalar).
// Within 1 ulp of the correctly rounded result for every float, with or without FMA
// contraction (checked over all 2^32 inputs; tests/tanh_accuracy_test.cc sweeps a subset).
// For |x| < 0.75 an odd polynomial, x + x^3 P(x^2); above, 1 - 2 / (exp_float(2|x|) + 1).
// |x| is clamped at 10, past which tanh rounds to 1. NaN passes through; the sign is x's.
inline float tanh_float(float x) {
  const float a = std::abs(x);

  // Near-minimax fit of (tanh(x) - x) / x^3 in s = x^2 over [0, 0.75^2]; error below 2^-31.
  constexpr float kTanhP[] = {-6.9653303e-4f, 3.0899264e-3f, -8.6847170e-3f, 2.1835781e-2f,
                              -5.3965168e-2f, 1.3333323e-1f, -3.3333333e-1f};
  const float s = a * a;
  float p = kTanhP[0];
  for (size_t i = 1; i < std::size(kTanhP); ++i) p = p * s + kTanhP[i];
  const float small = a + a * s * p;

  // |x| clamped at 10 as bit patterns (a >= 0, so they order as the values; a NaN becomes 10
  // and takes the polynomial's NaN below): an integer minimum, which vectorises.
  constexpr uint32_t kTen = std::bit_cast<uint32_t>(10.0f);
  const uint32_t a_bits = std::bit_cast<uint32_t>(a);
  const float z = 2.0f * std::bit_cast<float>(a_bits < kTen ? a_bits : kTen);
  const float large = 1.0f - 2.0f / (exp_float(z) + 1.0f);

  // A select by bit masks, NaN taking `small`: both values are computed, so the loop has no
  // control flow and vectorises (a ?: lets GCC sink the division into a branch).
  const float picked = select_bits(0u - static_cast<uint32_t>(!(a >= 0.75f)), small, large);
  return std::copysign(picked, x);
}

// e^-|x|: in float32 by exp_float (0 past |x| = 87, where it would leave the normal floats; NaN
// stays NaN), so a sigmoid loop vectorises; std::exp in float64.
template <typename T>
inline T exp_neg_abs(T x) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr uint32_t kMax = std::bit_cast<uint32_t>(87.0f);
    const uint32_t a_bits = std::bit_cast<uint32_t>(std::abs(x));
    const float e = exp_float(-std::bit_cast<float>(a_bits < kMax ? a_bits : kMax));
    const float tail = select_bits(0u - static_cast<uint32_t>(a_bits <= kMax), e, 0.0f);
    return select_bits(0u - static_cast<uint32_t>(!(x == x)), x, tail);
  }
  return std::exp(-std::abs(x));
}

// tanh through tanh_float in float32, as the Tanh kernel.
template <typename T>
inline T tanh_of(T x) {
  if constexpr (std::is_same_v<T, float>) return tanh_float(x);
  return std::tanh(x);
}

// GELU as PyTorch computes it: exact, 0.5 x (1 + erf(x / sqrt 2)), or with tanh_approx
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline constexpr double kGeluSqrt1_2 = 0.70710678118654752440;     // 1 / sqrt(2)
inline constexpr double kGeluSqrt2_Pi = 0.79788456080286535588;    // sqrt(2 / pi)
inline constexpr double kGeluInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
inline constexpr double kGeluKappa = 0.044715;

// The form is a template argument: a loop over the tanh form then has no libm call and
// vectorises. Loops over a Gelu or GeluGrad step pick it once with with_gelu_form.
template <bool kTanh, typename T>
inline T gelu_of(T x) {
  if constexpr (kTanh) {
    const T inner = T(kGeluSqrt2_Pi) * (x + T(kGeluKappa) * x * x * x);
    return T(0.5) * x * (T(1) + tanh_of(inner));
  }
  return T(0.5) * x * (T(1) + std::erf(x * T(kGeluSqrt1_2)));
}

// d gelu / dx times gy, PyTorch's GeluBackward formulas.
template <bool kTanh, typename T>
inline T gelu_grad_of(T x, T gy) {
  if constexpr (kTanh) {
    const T x_sq = x * x;
    const T t = tanh_of(T(kGeluSqrt2_Pi) * (x + T(kGeluKappa) * x_sq * x));
    const T left_derivative = T(0.5) * (T(1) + t);
    const T right_derivative = T(0.5) * x * (T(1) - t * t);
    const T inner_derivative = T(kGeluSqrt2_Pi) * (T(1) + T(3 * kGeluKappa) * x_sq);
    return gy * (left_derivative + right_derivative * inner_derivative);
  }
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(kGeluSqrt1_2)));
  const T pdf = T(kGeluInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
  return gy * (cdf + x * pdf);
}

// f(std::true_type) for the tanh form (a Gelu or GeluGrad ScalarAttrs value other than 0), else
// f(std::false_type): a loop inside f sees the form as a constant.
template <typename T, typename F>
inline void with_gelu_form(T form, F f) {
  if (form != T(0))
    f(std::true_type{});
  else
    f(std::false_type{});
}

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

// ---- y = f(x) ----------------------------------------------------------------------------

template <Op kOp, typename T>
inline T unary_op(T x) {
  if constexpr (kOp == Op::Neg) return -x;
  if constexpr (kOp == Op::Exp) return std::exp(x);
  if constexpr (kOp == Op::Log) return std::log(x);
  // x <= 0 rather than x > 0: relu(NaN) is NaN, as in PyTorch.
  if constexpr (kOp == Op::Relu) return x <= T(0) ? T(0) : x;
  if constexpr (kOp == Op::Sigmoid) {  // exp(-|x|) never overflows
    const T e = exp_neg_abs(x);
    const T r = T(1) / (T(1) + e);
    if constexpr (std::is_same_v<T, float>)  // by bits, so that the loop has no branch
      return select_bits(0u - static_cast<uint32_t>(x >= 0.0f), r, e * r);
    return x >= T(0) ? r : e * r;
  }
  if constexpr (kOp == Op::Tanh) {
    if constexpr (std::is_same_v<T, float>) return tanh_float(x);
    return std::tanh(x);
  }
}

// ---- gx = f(a, gy): a is the forward output y, or the input x for LeakyReluGrad, GeluGrad --
// As PyTorch's threshold_backward and leaky_relu_backward: at a NaN, relu's gradient is gy
// (0 only where y <= 0) and leaky_relu's is slope * gy (x > 0 is false).

template <Op kOp, typename T>
inline T activation_grad(T a, T gy, T slope) {
  if constexpr (kOp == Op::ReluGrad) return a <= T(0) ? T(0) : gy;
  if constexpr (kOp == Op::LeakyReluGrad) return a > T(0) ? gy : slope * gy;
  if constexpr (kOp == Op::SigmoidGrad) return gy * a * (T(1) - a);
  if constexpr (kOp == Op::TanhGrad) return gy * (T(1) - a * a);
}

}  // namespace encore::kernels::cpu
