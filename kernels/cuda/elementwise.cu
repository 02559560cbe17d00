// Elementwise CUDA kernels, the same semantics as kernels/cpu/binary.cc, unary.cc and convert.cc:
// broadcasting binary ops and comparisons, where, add_, tensor-scalar ops, activations and their
// gradients, fill_, copy and copy_ (with dtype conversion). Each op computes its elements with
// its element function (element_ops.cuh), as the fused kernels of CUDA plans do; this file is
// compiled with -fmad=false, as they are.
//
// Same-shape operands (and a broadcast single element) run through one grid-stride map that
// moves 16 bytes per operand and step when every pointer is aligned for it. Other broadcasts
// compute each input's offset from the output index over the dimensions left after
// broadcast_loop has dropped size-1 dimensions and merged contiguous ones, in 32-bit
// arithmetic when every operand has fewer than 2^32 elements. An output may be the very buffer
// of an input of its shape (add_, in-place replay): every thread reads its elements before it
// writes them, and no pointer is __restrict__.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/strided_loop.h"
#include "runtime/convert.h"

namespace encore::kernels::cuda {
namespace {

// ---- Same-shape map: out[i] = f(in[i]...) -------------------------------------------------

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// The packs by value: each is one vector load.
template <int V, typename R, typename F, typename... Ps>
__device__ __forceinline__ void apply_pack(Pack<R, V>& o, const F& f, Ps... p) {
#pragma unroll
  for (int j = 0; j < V; ++j) o.v[j] = f(p.v[j]...);
}

// V elements per operand and step (V == 1: plain loop), then the tail of n % V elements.
template <int V, typename F, typename R, typename... Ts>
__global__ void map_kernel(F f, int64_t n, R* out, const Ts*... in) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / V;
  for (int64_t p = first; p < packs; p += stride) {
    Pack<R, V> o;
    apply_pack<V>(o, f, reinterpret_cast<const Pack<Ts, V>*>(in)[p]...);
    reinterpret_cast<Pack<R, V>*>(out)[p] = o;
  }
  for (int64_t i = packs * V + first; i < n; i += stride) out[i] = f(in[i]...);
}

template <typename T, int V>
bool aligned_for(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * V) == 0;
}

// out[i] = f(in[i]...) for i < n, every operand contiguous with n elements.
template <typename F, typename R, typename... Ts>
void launch_map(Op op, int64_t n, F f, R* out, const Ts*... in) {
  if (n == 0) return;
  constexpr int V = static_cast<int>(16 / std::max({sizeof(R), sizeof(Ts)...}));
  if (V > 1 && n >= V && aligned_for<R, V>(out) && (aligned_for<Ts, V>(in) && ...)) {
    map_kernel<V><<<blocks_for((n + V - 1) / V), kThreads, 0, stream()>>>(f, n, out, in...);
  } else {
    map_kernel<1><<<blocks_for(n), kThreads, 0, stream()>>>(f, n, out, in...);
  }
  ENCORE_CUDA_LAUNCHED(op);
}

// ---- Broadcast: input offsets from the output index ---------------------------------------

// The loop dimensions and the element strides of N inputs (0 on broadcast dimensions). The
// output is contiguous over the same dimensions, so its offset is the linear index itself.
template <int N>
struct Strided {
  int rank = 1;
  int64_t dims[kMaxRank] = {1};
  int64_t strides[N][kMaxRank] = {};
};

// Operands 1..N of a loop whose operand 0 is the (contiguous) output.
template <int N>
Strided<N> input_strides(const StridedLoop<N + 1>& loop) {
  Strided<N> s;
  s.rank = loop.rank;
  for (int d = 0; d < loop.rank; ++d) {
    s.dims[d] = loop.dims[d];
    for (int k = 0; k < N; ++k) s.strides[k][d] = loop.strides[k + 1][d];
  }
  return s;
}

// off[k] = offset in input k of the output element with linear index i (I: uint32_t when
// every operand has fewer than 2^32 elements, else uint64_t).
template <typename I, int N>
__device__ __forceinline__ void input_offsets(const Strided<N>& s, I i, I (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = s.rank - 1; d > 0; --d) {
    const I dim = static_cast<I>(s.dims[d]);
    const I q = i / dim;
    const I c = i - q * dim;
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += c * static_cast<I>(s.strides[k][d]);
    i = q;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] += i * static_cast<I>(s.strides[k][0]);
}

template <typename I, typename F, typename R, typename T>
__global__ void binary_strided_kernel(F f, int64_t n, Strided<2> s, R* out, const T* a,
                                      const T* b) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    I off[2];
    input_offsets(s, static_cast<I>(i), off);
    out[i] = f(a[off[0]], b[off[1]]);
  }
}

template <typename I, typename T>
__global__ void where_strided_kernel(int64_t n, Strided<3> s, T* out, const uint8_t* cond,
                                     const T* a, const T* b) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    I off[3];
    input_offsets(s, static_cast<I>(i), off);
    out[i] = el::where(cond[off[0]], a[off[1]], b[off[2]]);
  }
}

// ---- Binary ops: add, sub, mul, div, equal, greater, add_ ---------------------------------

// The element function of each op (element_ops.cuh), which the fused kernels call too.
template <Op kOp>
struct BinaryF {
  template <typename T>
  __device__ auto operator()(T a, T b) const {
    if constexpr (kOp == Op::Add || kOp == Op::AddInplace) {
      return el::add(a, b);
    } else if constexpr (kOp == Op::Sub) {
      return el::sub(a, b);
    } else if constexpr (kOp == Op::Mul) {
      return el::mul(a, b);
    } else if constexpr (kOp == Op::Div) {
      return el::div(a, b);
    } else if constexpr (kOp == Op::Equal) {
      return a == b;
    } else {
      static_assert(kOp == Op::Greater);
      return a > b;
    }
  }
};

// f(a, b[0]): the second operand is a single element, read on the device.
template <typename F, typename T>
struct SecondFixed {
  F f;
  const T* b;
  __device__ auto operator()(T a) const { return f(a, *b); }
};

template <typename F, typename T>
struct FirstFixed {
  F f;
  const T* a;
  __device__ auto operator()(T b) const { return f(*a, b); }
};

// out = f(a, b) with a and b broadcast to out's shape. `out` may alias `a` (add_).
template <typename T, typename R, typename F>
void binary_broadcast(Op op, const BufferView& a, const BufferView& b, const BufferView& out, F f) {
  const T* pa = a.as<T>();
  const T* pb = b.as<T>();
  R* po = out.as<R>();
  const int64_t n = out.numel(), na = a.numel(), nb = b.numel();
  if (n == 0) return;
  // A broadcast operand with as many elements as the output has the output's layout.
  if (na == n && nb == n) return launch_map(op, n, f, po, pa, pb);
  if (na == n && nb == 1) return launch_map(op, n, SecondFixed<F, T>{f, pb}, po, pa);
  if (na == 1 && nb == n) return launch_map(op, n, FirstFixed<F, T>{f, pa}, po, pb);
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

// A nonzero condition byte selects a (bool is stored as 0 or 1).
struct WhereF {
  template <typename T>
  __device__ T operator()(uint8_t c, T a, T b) const {
    return el::where(c, a, b);
  }
};

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

// y = f(x, s), s = ScalarAttrs.value cast to T.
template <Op kOp, typename T>
struct ScalarF {
  T s;
  __device__ T operator()(T x) const {
    if constexpr (kOp == Op::AddScalar) {
      return el::add_scalar(x, s);
    } else if constexpr (kOp == Op::MulScalar) {
      return el::mul_scalar(x, s);
    } else if constexpr (kOp == Op::RsubScalar) {
      return el::rsub_scalar(x, s);
    } else if constexpr (kOp == Op::DivScalar) {
      return el::div_scalar(x, s);
    } else if constexpr (kOp == Op::RdivScalar) {
      return el::rdiv_scalar(x, s);
    } else if constexpr (kOp == Op::PowScalar) {
      return el::pow_scalar(x, s);
    } else if constexpr (kOp == Op::Gelu) {  // s: the form, kGeluTanh or 0
      return el::gelu(x, s);
    } else {
      static_assert(kOp == Op::LeakyRelu);
      return el::leaky_relu(x, s);
    }
  }
};

struct SquareF {
  template <typename T>
  __device__ T operator()(T x) const {
    return el::square(x);
  }
};

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
struct UnaryF {
  template <typename T>
  __device__ T operator()(T x) const {
    if constexpr (kOp == Op::Neg) {
      return el::neg(x);
    } else if constexpr (kOp == Op::Exp) {
      return el::exp(x);
    } else if constexpr (kOp == Op::Log) {
      return el::log(x);
    } else if constexpr (kOp == Op::Sqrt) {
      return el::sqrt(x);
    } else if constexpr (kOp == Op::Relu) {
      return el::relu(x);
    } else if constexpr (kOp == Op::Sigmoid) {
      return el::sigmoid(x);
    } else {
      static_assert(kOp == Op::Tanh);
      return el::tanh(x);
    }
  }
};

template <Op kOp>
void unary_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0];
  switch_floating(x.dtype, kOp, [&]<typename T>(Type<T>) {
    launch_map(kOp, x.numel(), UnaryF<kOp>{}, y.as<T>(), x.as<T>());
  });
}

// gx = f(a, gy): a is the forward output y, or the input x for LeakyReluGrad and GeluGrad
// (whose slope is the form).
template <Op kOp, typename T>
struct ActivationGradF {
  T slope;
  __device__ T operator()(T a, T gy) const {
    if constexpr (kOp == Op::ReluGrad) {
      return el::relu_grad(a, gy, slope);
    } else if constexpr (kOp == Op::LeakyReluGrad) {
      return el::leaky_relu_grad(a, gy, slope);
    } else if constexpr (kOp == Op::SigmoidGrad) {
      return el::sigmoid_grad(a, gy, slope);
    } else if constexpr (kOp == Op::GeluGrad) {
      return el::gelu_grad(a, gy, slope);
    } else {
      static_assert(kOp == Op::TanhGrad);
      return el::tanh_grad(a, gy, slope);
    }
  }
};

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

template <typename D, typename S>
struct ConvertF {
  __device__ D operator()(S v) const { return convert_value<D>(v); }
};

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

template <typename T>
struct ConstantF {
  T value;
  __device__ T operator()() const { return value; }
};

void fill_kernel(const KernelArgs& args) {
  const BufferView& t = args.in[0];
  const double value = args.attr<ScalarAttrs>().value;
  switch_all(t.dtype, Op::Fill, [&]<typename T>(Type<T>) {
    launch_map(Op::Fill, t.numel(), ConstantF<T>{convert_value<T>(value)}, t.as<T>());
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
ENCORE_REGISTER_CUDA(Op::Copy, &copy_kernel);
ENCORE_REGISTER_CUDA(Op::CopyInplace, &copy_inplace_kernel);

}  // namespace encore::kernels::cuda
