// The elementwise CUDA kernels and their element functions (elementwise.cu launches them), the
// same semantics as kernels/cpu/binary.cc, unary.cc and convert.cc:
// broadcasting binary ops and comparisons, where, add_, tensor-scalar ops, activations and their
// gradients, fill_, arange_, copy and copy_ (with dtype conversion). Each op computes its elements
// with its element function (element_ops.cuh), as the fused kernels of CUDA plans do;
// elementwise.cu is compiled with -fmad=false, as they are (and the emulated tests with
// -ffp-contract=off).
//
// Same-shape operands (and a broadcast single element) run through one grid-stride map that
// moves 16 bytes per operand and step when every pointer is aligned for it. Other broadcasts
// compute each input's offset from the output index over the dimensions left after
// broadcast_loop has dropped size-1 dimensions and merged contiguous ones, in 32-bit
// arithmetic when every operand has fewer than 2^32 elements. An output may be the very buffer
// of an input of its shape (add_, in-place replay): every thread reads its elements before it
// writes them, and no pointer is __restrict__.
//
// The host compiles this file too, against stand-ins for the CUDA built-ins
// (tests/nvrtc/elementwise_emulated_test.cc runs the kernels on the host against the CPU's ops).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/element_ops.cuh"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/strided_loop.h"
#include "runtime/convert.h"
#include "runtime/ops.h"

namespace encore::kernels::cuda {

// ---- Same-shape map: out[i] = f(in[i]...) -------------------------------------------------

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

// Calls launch(std::integral_constant<int, V>{}) with map_kernel's elements per operand and
// step over n elements: 16 bytes' worth when there are that many and every pointer is aligned
// for it, else 1.
template <typename Launch, typename R, typename... Ts>
void with_map_width(int64_t n, Launch&& launch, R* out, const Ts*... in) {
  constexpr int V = static_cast<int>(16 / std::max({sizeof(R), sizeof(Ts)...}));
  if (V > 1 && n >= V && aligned_for<R, V>(out) && (aligned_for<Ts, V>(in) && ...)) {
    launch(std::integral_constant<int, V>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
}

// Blocks of map_kernel<V> over n elements.
template <int V>
unsigned map_blocks(int64_t n) {
  return blocks_for((n + V - 1) / V);
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

// How a broadcasting binary op runs: out = f(a, b) element by element (all of out's size), with
// one operand a single element read on the device, or through the broadcast strides.
enum class BinaryPath { Map, SecondFixed, FirstFixed, Strided };
inline BinaryPath binary_path(int64_t n, int64_t na, int64_t nb) {
  // A broadcast operand with as many elements as the output has the output's layout.
  if (na == n && nb == n) return BinaryPath::Map;
  if (na == n && nb == 1) return BinaryPath::SecondFixed;
  if (na == 1 && nb == n) return BinaryPath::FirstFixed;
  return BinaryPath::Strided;
}

// ---- Element functions of the ops ----------------------------------------------------------

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

// A nonzero condition byte selects a (bool is stored as 0 or 1).
struct WhereF {
  template <typename T>
  __device__ T operator()(uint8_t c, T a, T b) const {
    return el::where(c, a, b);
  }
};

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

template <typename D, typename S>
struct ConvertF {
  __device__ D operator()(S v) const { return convert_value<D>(v); }
};

template <typename T>
struct ConstantF {
  T value;
  __device__ T operator()() const { return value; }
};

// arange_: out[i] = i for i < n, converted from the double i (as the cpu's kernel).
template <typename T>
__global__ void iota_kernel(int64_t n, T* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = convert_value<T>(static_cast<double>(i));
}

}  // namespace encore::kernels::cuda
