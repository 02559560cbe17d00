// The element functions of the elementwise CUDA kernels: one per fusable op (runtime/op_traits.h,
// kFusable), and the device math functions every CUDA kernel file uses; and the row functions of
// the kernels that run a warp per row (the fold ops and their warp tree, which the reductions use
// too, and each element's part of softmax and layer_norm). The unfused kernels (elementwise.cu,
// softmax_loss.cu, layer_norm.cu, reduce.cu) and the fused kernels NVRTC compiles at plan time
// (fused_source.cc embeds this file's text) call the same functions, so a fused step gives the
// bits of the steps it stands for.
//
// What fused kernels repeat is compiled without floating-point contraction (nvcc -fmad=false for
// elementwise.cu, softmax_loss.cu and layer_norm.cu; reduce.cu's folds only add and compare;
// --fmad=false for NVRTC): a fused kernel computes `mul` then `add` in registers, and a contracted
// fma there would round once where the unfused steps round twice.
//
// NVRTC compiles this file as text with nothing else on its include path: it includes nothing and
// uses only the compiler's built-in types, intrinsics and the CUDA math functions.
#pragma once

namespace encore::kernels::cuda {

// The device's math functions by element type.
__device__ __forceinline__ float dev_exp(float x) {
  return ::expf(x);
}
__device__ __forceinline__ double dev_exp(double x) {
  return ::exp(x);
}
__device__ __forceinline__ float dev_log(float x) {
  return ::logf(x);
}
__device__ __forceinline__ double dev_log(double x) {
  return ::log(x);
}
__device__ __forceinline__ float dev_sqrt(float x) {
  return ::sqrtf(x);
}
__device__ __forceinline__ double dev_sqrt(double x) {
  return ::sqrt(x);
}
__device__ __forceinline__ float dev_tanh(float x) {
  return ::tanhf(x);
}
__device__ __forceinline__ double dev_tanh(double x) {
  return ::tanh(x);
}
__device__ __forceinline__ float dev_erf(float x) {
  return ::erff(x);
}
__device__ __forceinline__ double dev_erf(double x) {
  return ::erf(x);
}
__device__ __forceinline__ float dev_abs(float x) {
  return ::fabsf(x);
}
__device__ __forceinline__ double dev_abs(double x) {
  return ::fabs(x);
}
__device__ __forceinline__ float dev_pow(float x, float y) {
  return ::powf(x, y);
}
__device__ __forceinline__ double dev_pow(double x, double y) {
  return ::pow(x, y);
}
// a * b + c rounded once, whatever the file's contraction.
__device__ __forceinline__ float fma_of(float a, float b, float c) {
  return ::fmaf(a, b, c);
}
__device__ __forceinline__ double fma_of(double a, double b, double c) {
  return ::fma(a, b, c);
}

// The element functions, as kernels/cpu/elementwise.h computes them. Scalar ops read their
// ScalarAttrs value cast to T; gradients read the forward's output (or input, for leaky_relu_grad
// and gelu_grad) and the output gradient, and the slope or form where the op has one.
namespace el {

template <typename T>
__device__ __forceinline__ T add(T a, T b) {
  return a + b;
}
template <typename T>
__device__ __forceinline__ T sub(T a, T b) {
  return a - b;
}
template <typename T>
__device__ __forceinline__ T mul(T a, T b) {
  return a * b;
}
template <typename T>
__device__ __forceinline__ T div(T a, T b) {
  return a / b;
}

template <typename T>
__device__ __forceinline__ T add_scalar(T x, T s) {
  return x + s;
}
template <typename T>
__device__ __forceinline__ T mul_scalar(T x, T s) {
  return x * s;
}
template <typename T>
__device__ __forceinline__ T rsub_scalar(T x, T s) {
  return s - x;
}
template <typename T>
__device__ __forceinline__ T div_scalar(T x, T s) {
  return x / s;
}
template <typename T>
__device__ __forceinline__ T rdiv_scalar(T x, T s) {
  return s / x;
}
// pow_scalar with an exponent of exactly 2 (the double ScalarAttrs value, as the CPU decides) is
// square: x * x, exactly rounded, where pow's error bound is wider.
template <typename T>
__device__ __forceinline__ T pow_scalar(T x, T s) {
  return dev_pow(x, s);
}
template <typename T>
__device__ __forceinline__ T square(T x) {
  return x * x;
}
template <typename T>
__device__ __forceinline__ T leaky_relu(T x, T slope) {
  return x > T(0) ? x : slope * x;
}

// GELU and its gradient as PyTorch computes them: exact through erf (form 0), or the tanh
// approximation (any other form).
constexpr double kGeluSqrt1_2 = 0.70710678118654752440;     // 1 / sqrt(2)
constexpr double kGeluSqrt2_Pi = 0.79788456080286535588;    // sqrt(2 / pi)
constexpr double kGeluInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kGeluKappa = 0.044715;

template <typename T>
__device__ __forceinline__ T gelu(T x, T form) {
  if (form != T(0)) {
    const T inner = T(kGeluSqrt2_Pi) * (x + T(kGeluKappa) * x * x * x);
    return T(0.5) * x * (T(1) + dev_tanh(inner));
  }
  return T(0.5) * x * (T(1) + dev_erf(x * T(kGeluSqrt1_2)));
}

template <typename T>
__device__ __forceinline__ T neg(T x) {
  return -x;
}
template <typename T>
__device__ __forceinline__ T exp(T x) {
  return dev_exp(x);
}
template <typename T>
__device__ __forceinline__ T log(T x) {
  return dev_log(x);
}
template <typename T>
__device__ __forceinline__ T sqrt(T x) {
  return dev_sqrt(x);
}
// x <= 0 rather than x > 0: relu(NaN) is NaN.
template <typename T>
__device__ __forceinline__ T relu(T x) {
  return x <= T(0) ? T(0) : x;
}
// exp(-|x|) never overflows.
template <typename T>
__device__ __forceinline__ T sigmoid(T x) {
  const T e = dev_exp(-dev_abs(x));
  const T r = T(1) / (T(1) + e);
  return x >= T(0) ? r : e * r;
}
template <typename T>
__device__ __forceinline__ T tanh(T x) {
  return dev_tanh(x);
}

// As PyTorch's threshold_backward and leaky_relu_backward: at a NaN, relu's gradient is gy (0
// only where y <= 0) and leaky_relu's is slope * gy (x > 0 is false).
template <typename T>
__device__ __forceinline__ T relu_grad(T y, T gy, T) {
  return y <= T(0) ? T(0) : gy;
}
template <typename T>
__device__ __forceinline__ T leaky_relu_grad(T x, T gy, T slope) {
  return x > T(0) ? gy : slope * gy;
}
template <typename T>
__device__ __forceinline__ T sigmoid_grad(T y, T gy, T) {
  return gy * y * (T(1) - y);
}
template <typename T>
__device__ __forceinline__ T tanh_grad(T y, T gy, T) {
  return gy * (T(1) - y * y);
}
template <typename T>
__device__ __forceinline__ T gelu_grad(T x, T gy, T form) {
  if (form != T(0)) {
    const T x_sq = x * x;
    const T t = dev_tanh(T(kGeluSqrt2_Pi) * (x + T(kGeluKappa) * x_sq * x));
    const T left_derivative = T(0.5) * (T(1) + t);
    const T right_derivative = T(0.5) * x * (T(1) - t * t);
    const T inner_derivative = T(kGeluSqrt2_Pi) * (T(1) + T(3 * kGeluKappa) * x_sq);
    return gy * (left_derivative + right_derivative * inner_derivative);
  }
  const T cdf = T(0.5) * (T(1) + dev_erf(x * T(kGeluSqrt1_2)));
  const T pdf = T(kGeluInvSqrt2Pi) * dev_exp(T(-0.5) * x * x);
  return gy * (cdf + x * pdf);
}

// where: the condition's byte, nonzero for true.
template <typename T>
__device__ __forceinline__ T where(unsigned char c, T a, T b) {
  return c ? a : b;
}

}  // namespace el

// ---- Row functions: folds over a row, a warp per row --------------------------------------

// -infinity's bits, as the integer __int_as_float and __longlong_as_double take (a member of a
// template, so that host compilers, which lack those intrinsics, never resolve the calls below).
template <typename T>
struct InfinityBits;
template <>
struct InfinityBits<float> {
  static constexpr int kMinus = static_cast<int>(0xff800000u);
};
template <>
struct InfinityBits<double> {
  static constexpr long long kMinus = static_cast<long long>(0xfff0000000000000ull);
};
template <typename T>
__device__ __forceinline__ T minus_infinity() {
  if constexpr (sizeof(T) == sizeof(float)) {
    return __int_as_float(InfinityBits<T>::kMinus);
  } else {
    return __longlong_as_double(InfinityBits<T>::kMinus);
  }
}

// A fold op R has `template <typename T> static T identity()` and `static T combine(T, T)`.
struct SumOp {
  template <typename T>
  __host__ __device__ static T identity() {
    return T(0);
  }
  template <typename T>
  __device__ static T combine(T a, T b) {
    return a + b;
  }
};

// The CPU's lane_max: NaN when the lane holds one (in any order of combination).
struct LaneMaxOp {
  template <typename T>
  __device__ static T identity() {
    return minus_infinity<T>();
  }
  template <typename T>
  __device__ static T combine(T a, T b) {
    return b > a || b != b ? b : a;
  }
};

// Every lane of a full warp gets the fold of the 32 lanes' values (lane 0's, broadcast): a fixed
// tree, so every run gives the same bits.
template <typename R, typename T>
__device__ __forceinline__ T warp_reduce(T v) {
  for (int o = 16; o > 0; o /= 2) v = R::combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  return __shfl_sync(0xffffffffu, v, 0);
}

// Each element's part of a row op, given what its folds gave: softmax_kernel and
// softmax_grad_kernel (softmax_loss.cuh), layer_norm_kernel (layer_norm.cuh), and the row ops of a
// fused kernel. A thread folds its elements g, g + group, ... in that order.
namespace rowop {

// softmax: sum of exp(x - max), then exp(x - max) / sum as exp(x - max) * (1 / sum).
template <typename T>
__device__ __forceinline__ T softmax_term(T x, T max) {
  return dev_exp(x - max);
}
template <typename T>
__device__ __forceinline__ T softmax_value(T x, T max, T inv_sum) {
  return dev_exp(x - max) * inv_sum;
}
// log_softmax: x - max - log(sum).
template <typename T>
__device__ __forceinline__ T log_softmax_value(T x, T max, T log_sum) {
  return x - max - log_sum;
}
// Their gradients from y and gy: a fold of gy * y (softmax) or gy (log_softmax), then per element
// y (gy - dot) or gy - exp(y) dot.
template <bool kLog, typename T>
__device__ __forceinline__ T softmax_grad_term(T y, T gy) {
  if constexpr (kLog) {
    return gy;
  } else {
    return gy * y;
  }
}
template <bool kLog, typename T>
__device__ __forceinline__ T softmax_grad_value(T y, T gy, T dot) {
  if constexpr (kLog) {
    return gy - dev_exp(y) * dot;
  } else {
    return y * (gy - dot);
  }
}
// layer_norm: folds in double of x and of (x - mean)^2 (biased, two-pass), rstd = 1 / sqrt(var +
// eps); y = (x - mean) rstd, times gamma where there is one, plus beta (0 where there is none).
template <typename T>
__device__ __forceinline__ double layer_norm_square(T x, double mean) {
  const double d = static_cast<double>(x) - mean;
  return d * d;
}
__device__ __forceinline__ double layer_norm_rstd(double var, double eps) {
  return 1.0 / dev_sqrt(var + eps);
}
template <typename T>
__device__ __forceinline__ T layer_norm_value(T x, T mean, T rstd, bool has_gamma, T gamma,
                                              T beta) {
  const T h = (x - mean) * rstd;
  return (has_gamma ? h * gamma : h) + beta;
}

}  // namespace rowop
}  // namespace encore::kernels::cuda
