// Elementwise ops on CUDA: the launches and their registration; the kernels, their element
// functions and how they work are in elementwise.cuh.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/strided_loop.h"
#include "runtime/convert.h"

namespace encore::kernels::cuda {
namespace {

// out[i] = f(in[i]...) for i < n, every operand contiguous with n elements.
template <typename F, typename R, typename... Ts>
void launch_map(Op op, int64_t n, F f, R* out, const Ts*... in) {
  if (n == 0) return;
  with_map_width(
      n,
      [&](auto width) {
        constexpr int V = decltype(width)::value;
        map_kernel<V><<<map_blocks<V>(n), kThreads, 0, stream()>>>(f, n, out, in...);
      },
      out, in...);
  ENCORE_CUDA_LAUNCHED(op);
}

// ---- Binary ops: add, sub, mul, div, equal, greater, add_ ---------------------------------

// out = f(a, b) with a and b broadcast to out's shape. `out` may alias `a` (add_).
template <typename T, typename R, typename F>
void binary_broadcast(Op op, const BufferView& a, const BufferView& b, const BufferView& out, F f) {
  const T* pa = a.as<T>();
  const T* pb = b.as<T>();
  R* po = out.as<R>();
  const int64_t n = out.numel();
  if (n == 0) return;
  switch (binary_path(n, a.numel(), b.numel())) {
    case BinaryPath::Map:
      return launch_map(op, n, f, po, pa, pb);
    case BinaryPath::SecondFixed:
      return launch_map(op, n, SecondFixed<F, T>{f, pb}, po, pa);
    case BinaryPath::FirstFixed:
      return launch_map(op, n, FirstFixed<F, T>{f, pa}, po, pb);
    case BinaryPath::Strided:
      break;
  }
  const Strided<2> s = input_strides<2>(broadcast_loop<3>(out.shape, {&a.shape, &b.shape}));
  with_index_type(n, [&]<typename I>(Type<I>) {
    binary_strided_kernel<I><<<blocks_for(n), kThreads, 0, stream()>>>(f, n, s, po, pa, pb);
    ENCORE_CUDA_LAUNCHED(op);
  });
}

template <Op kOp>
void arithmetic_kernel(const KernelArgs& args) {
  const BufferView &a = args.in[0], &b = args.in[1], &out = args.out[0];
  switch_floating(out.dtype, kOp, [&]<typename T>(Type<T>) {
    binary_broadcast<T, T>(kOp, a, b, out, BinaryF<kOp>{});
  });
}

template <Op kOp>
void compare_kernel(const KernelArgs& args) {
  const BufferView &a = args.in[0], &b = args.in[1], &out = args.out[0];
  switch_numeric(a.dtype, kOp, [&]<typename T>(Type<T>) {
    binary_broadcast<T, bool>(kOp, a, b, out, BinaryF<kOp>{});
  });
}

// t += other, other broadcast to t.
void add_inplace_kernel(const KernelArgs& args) {
  const BufferView &t = args.in[0], &other = args.in[1];
  switch_floating(t.dtype, Op::AddInplace, [&]<typename T>(Type<T>) {
    binary_broadcast<T, T>(Op::AddInplace, t, other, t, BinaryF<Op::AddInplace>{});
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
    if (n == 0) return;
    if (cond.numel() == n && a.numel() == n && b.numel() == n)
      return launch_map(Op::Where, n, WhereF{}, po, pc, pa, pb);
    const Strided<3> s =
        input_strides<3>(broadcast_loop<4>(out.shape, {&cond.shape, &a.shape, &b.shape}));
    with_index_type(n, [&]<typename I>(Type<I>) {
      where_strided_kernel<I><<<blocks_for(n), kThreads, 0, stream()>>>(n, s, po, pc, pa, pb);
      ENCORE_CUDA_LAUNCHED(Op::Where);
    });
  });
}

// ---- Tensor-scalar ops and activations ----------------------------------------------------

template <Op kOp>
void scalar_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0];
  const double s = args.attr<ScalarAttrs>().value;
  switch_floating(x.dtype, kOp, [&]<typename T>(Type<T>) {
    const int64_t n = x.numel();
    if constexpr (kOp == Op::PowScalar) {
      if (s == 2) return launch_map(kOp, n, SquareF{}, y.as<T>(), x.as<T>());
    }
    launch_map(kOp, n, ScalarF<kOp, T>{static_cast<T>(s)}, y.as<T>(), x.as<T>());
  });
}

template <Op kOp>
void unary_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0];
  switch_floating(x.dtype, kOp, [&]<typename T>(Type<T>) {
    launch_map(kOp, x.numel(), UnaryF<kOp>{}, y.as<T>(), x.as<T>());
  });
}

template <Op kOp>
void activation_grad_kernel(const KernelArgs& args) {
  const BufferView &a = args.in[0], &gy = args.in[1], &gx = args.out[0];
  const double slope = op_has_scalar_attrs(kOp) ? args.attr<ScalarAttrs>().value : 0.0;
  switch_floating(a.dtype, kOp, [&]<typename T>(Type<T>) {
    launch_map(kOp, a.numel(), ActivationGradF<kOp, T>{static_cast<T>(slope)}, gx.as<T>(),
               a.as<T>(), gy.as<T>());
  });
}

// ---- Conversion and fills: copy, copy_, fill_ (convert_value: runtime/convert.h) ----------

// to = from converted element by element.
void convert(const BufferView& from, const BufferView& to, Op op) {
  const int64_t n = to.numel();
  if (from.dtype == to.dtype) {
    if (from.data != to.data && n != 0)
      ENCORE_CUDA_OK(op, cudaMemcpyAsync(to.data, from.data, n * itemsize(to.dtype),
                                         cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  switch_all(from.dtype, op, [&]<typename S>(Type<S>) {
    switch_all(to.dtype, op, [&]<typename D>(Type<D>) {
      launch_map(op, n, ConvertF<D, S>{}, to.as<D>(), from.as<S>());
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
    launch_map(Op::Fill, t.numel(), ConstantF<T>{convert_value<T>(value)}, t.as<T>());
  });
}

void arange_kernel(const KernelArgs& args) {
  const BufferView& t = args.in[0];
  switch_all(t.dtype, Op::Arange, [&]<typename T>(Type<T>) {
    if (t.numel() == 0) return;
    iota_kernel<<<blocks_for(t.numel()), kThreads, 0, stream()>>>(t.numel(), t.as<T>());
    ENCORE_CUDA_LAUNCHED(Op::Arange);
  });
}

}  // namespace

ENCORE_REGISTER_CUDA(Op::Add, &arithmetic_kernel<Op::Add>);
ENCORE_REGISTER_CUDA(Op::Sub, &arithmetic_kernel<Op::Sub>);
ENCORE_REGISTER_CUDA(Op::Mul, &arithmetic_kernel<Op::Mul>);
ENCORE_REGISTER_CUDA(Op::Div, &arithmetic_kernel<Op::Div>);
ENCORE_REGISTER_CUDA(Op::Equal, &compare_kernel<Op::Equal>);
ENCORE_REGISTER_CUDA(Op::Greater, &compare_kernel<Op::Greater>);
ENCORE_REGISTER_CUDA(Op::Where, &where_kernel);
ENCORE_REGISTER_CUDA(Op::AddInplace, &add_inplace_kernel);
ENCORE_REGISTER_CUDA(Op::AddScalar, &scalar_kernel<Op::AddScalar>);
ENCORE_REGISTER_CUDA(Op::MulScalar, &scalar_kernel<Op::MulScalar>);
ENCORE_REGISTER_CUDA(Op::RsubScalar, &scalar_kernel<Op::RsubScalar>);
ENCORE_REGISTER_CUDA(Op::DivScalar, &scalar_kernel<Op::DivScalar>);
ENCORE_REGISTER_CUDA(Op::RdivScalar, &scalar_kernel<Op::RdivScalar>);
ENCORE_REGISTER_CUDA(Op::PowScalar, &scalar_kernel<Op::PowScalar>);
ENCORE_REGISTER_CUDA(Op::LeakyRelu, &scalar_kernel<Op::LeakyRelu>);
ENCORE_REGISTER_CUDA(Op::Gelu, &scalar_kernel<Op::Gelu>);
ENCORE_REGISTER_CUDA(Op::Neg, &unary_kernel<Op::Neg>);
ENCORE_REGISTER_CUDA(Op::Exp, &unary_kernel<Op::Exp>);
ENCORE_REGISTER_CUDA(Op::Log, &unary_kernel<Op::Log>);
ENCORE_REGISTER_CUDA(Op::Sqrt, &unary_kernel<Op::Sqrt>);
ENCORE_REGISTER_CUDA(Op::Relu, &unary_kernel<Op::Relu>);
ENCORE_REGISTER_CUDA(Op::Sigmoid, &unary_kernel<Op::Sigmoid>);
ENCORE_REGISTER_CUDA(Op::Tanh, &unary_kernel<Op::Tanh>);
ENCORE_REGISTER_CUDA(Op::ReluGrad, &activation_grad_kernel<Op::ReluGrad>);
ENCORE_REGISTER_CUDA(Op::LeakyReluGrad, &activation_grad_kernel<Op::LeakyReluGrad>);
ENCORE_REGISTER_CUDA(Op::SigmoidGrad, &activation_grad_kernel<Op::SigmoidGrad>);
ENCORE_REGISTER_CUDA(Op::TanhGrad, &activation_grad_kernel<Op::TanhGrad>);
ENCORE_REGISTER_CUDA(Op::GeluGrad, &activation_grad_kernel<Op::GeluGrad>);
ENCORE_REGISTER_CUDA(Op::Fill, &fill_kernel);
ENCORE_REGISTER_CUDA(Op::Arange, &arange_kernel);
ENCORE_REGISTER_CUDA(Op::Copy, &copy_kernel);
ENCORE_REGISTER_CUDA(Op::CopyInplace, &copy_inplace_kernel);

}  // namespace encore::kernels::cuda
