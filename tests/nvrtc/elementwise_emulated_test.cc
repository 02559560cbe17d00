// The elementwise kernels (kernels/cuda/elementwise.cuh) run on the host (emulated_kernel.h) on
// elementwise.cu's launches, against the CPU kernels of the same ops (dispatched by op): the
// binary ops and comparisons through each of their paths (same shapes in 16-byte packs and with
// a tail, misaligned, one operand a single element on either side, broadcast strides with 32-bit
// and 64-bit indices, add_ into its own input), where, every tensor-scalar op, activation and
// activation gradient, conversions between dtypes, fill_ and arange_. Arithmetic, comparisons,
// where, conversions and fills must give the CPU's bits; the functions the device computes its own
// way (exp, tanh, ...) within a few ulps. The [cuda] tests check the device against the CPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "encore/encore.h"
#include "runtime/dispatcher.h"
#include "runtime/kernel_abi.h"
#include "tests/nvrtc/emulated_kernel.h"

using namespace encore;

namespace {

constexpr const char* kSource = R"cuda(
#include "kernels/cuda/elementwise.cuh"
#include "runtime/kernel_abi.h"
using namespace encore;
using namespace encore::kernels;
using namespace encore::kernels::cuda;

// elementwise.cu's launch_map.
template <typename F, typename R, typename... Ts>
void map(int64_t n, F f, R* out, const Ts*... in) {
  if (n == 0) return;
  with_map_width(n, [&](auto width) {
    constexpr int V = decltype(width)::value;
    emulate_launch(map_blocks<V>(n), kThreads, [&] { map_kernel<V>(f, n, out, in...); });
  }, out, in...);
}
// elementwise.cu's binary_broadcast; `wide`: 64-bit indices even where 32 bits would do.
template <typename T, typename R, typename F>
void binary(const BufferView& a, const BufferView& b, const BufferView& out, F f, bool wide) {
  const T* pa = a.as<T>();
  const T* pb = b.as<T>();
  R* po = out.as<R>();
  const int64_t n = out.numel();
  if (n == 0) return;
  switch (binary_path(n, a.numel(), b.numel())) {
    case BinaryPath::Map: return map(n, f, po, pa, pb);
    case BinaryPath::SecondFixed: return map(n, SecondFixed<F, T>{f, pb}, po, pa);
    case BinaryPath::FirstFixed: return map(n, FirstFixed<F, T>{f, pa}, po, pb);
    case BinaryPath::Strided: break;
  }
  const Strided<2> s = input_strides<2>(broadcast_loop<3>(out.shape, {&a.shape, &b.shape}));
  emulate_launch(blocks_for(n), kThreads, [&] {
    if (wide) binary_strided_kernel<uint64_t>(f, n, s, po, pa, pb);
    else binary_strided_kernel<uint32_t>(f, n, s, po, pa, pb);
  });
}
template <typename T>
void binary_op(Op op, const BufferView& a, const BufferView& b, const BufferView& out, bool wide) {
  switch (op) {
    case Op::Add: return binary<T, T>(a, b, out, BinaryF<Op::Add>{}, wide);
    case Op::Sub: return binary<T, T>(a, b, out, BinaryF<Op::Sub>{}, wide);
    case Op::Mul: return binary<T, T>(a, b, out, BinaryF<Op::Mul>{}, wide);
    case Op::Div: return binary<T, T>(a, b, out, BinaryF<Op::Div>{}, wide);
    case Op::AddInplace: return binary<T, T>(a, b, out, BinaryF<Op::AddInplace>{}, wide);
    case Op::Equal: return binary<T, bool>(a, b, out, BinaryF<Op::Equal>{}, wide);
    case Op::Greater: return binary<T, bool>(a, b, out, BinaryF<Op::Greater>{}, wide);
    default: std::abort();
  }
}
// elementwise.cu's where_kernel.
template <typename T>
void where(const BufferView& c, const BufferView& a, const BufferView& b, const BufferView& out) {
  const int64_t n = out.numel();
  const uint8_t* pc = c.as<uint8_t>();
  if (c.numel() == n && a.numel() == n && b.numel() == n)
    return map(n, WhereF{}, out.as<T>(), pc, a.as<T>(), b.as<T>());
  const Strided<3> s = input_strides<3>(broadcast_loop<4>(out.shape, {&c.shape, &a.shape, &b.shape}));
  emulate_launch(blocks_for(n), kThreads, [&] {
    where_strided_kernel<uint32_t>(n, s, out.as<T>(), pc, a.as<T>(), b.as<T>());
  });
}
// scalar_kernel, unary_kernel and activation_grad_kernel of elementwise.cu (`b`: gy).
template <typename T>
void unary_op(Op op, double s, const BufferView& x, const BufferView& b, const BufferView& y) {
  const int64_t n = x.numel();
  T* py = y.as<T>();
  const T* px = x.as<T>();
  const T* pb = b.as<T>();
  const T st = static_cast<T>(s);
  switch (op) {
    case Op::AddScalar: return map(n, ScalarF<Op::AddScalar, T>{st}, py, px);
    case Op::MulScalar: return map(n, ScalarF<Op::MulScalar, T>{st}, py, px);
    case Op::RsubScalar: return map(n, ScalarF<Op::RsubScalar, T>{st}, py, px);
    case Op::DivScalar: return map(n, ScalarF<Op::DivScalar, T>{st}, py, px);
    case Op::RdivScalar: return map(n, ScalarF<Op::RdivScalar, T>{st}, py, px);
    case Op::PowScalar:
      if (s == 2) return map(n, SquareF{}, py, px);
      return map(n, ScalarF<Op::PowScalar, T>{st}, py, px);
    case Op::Gelu: return map(n, ScalarF<Op::Gelu, T>{st}, py, px);
    case Op::LeakyRelu: return map(n, ScalarF<Op::LeakyRelu, T>{st}, py, px);
    case Op::Neg: return map(n, UnaryF<Op::Neg>{}, py, px);
    case Op::Exp: return map(n, UnaryF<Op::Exp>{}, py, px);
    case Op::Log: return map(n, UnaryF<Op::Log>{}, py, px);
    case Op::Sqrt: return map(n, UnaryF<Op::Sqrt>{}, py, px);
    case Op::Relu: return map(n, UnaryF<Op::Relu>{}, py, px);
    case Op::Sigmoid: return map(n, UnaryF<Op::Sigmoid>{}, py, px);
    case Op::Tanh: return map(n, UnaryF<Op::Tanh>{}, py, px);
    case Op::ReluGrad: return map(n, ActivationGradF<Op::ReluGrad, T>{st}, py, px, pb);
    case Op::LeakyReluGrad: return map(n, ActivationGradF<Op::LeakyReluGrad, T>{st}, py, px, pb);
    case Op::SigmoidGrad: return map(n, ActivationGradF<Op::SigmoidGrad, T>{st}, py, px, pb);
    case Op::GeluGrad: return map(n, ActivationGradF<Op::GeluGrad, T>{st}, py, px, pb);
    case Op::TanhGrad: return map(n, ActivationGradF<Op::TanhGrad, T>{st}, py, px, pb);
    default: std::abort();
  }
}
// elementwise.cu's convert (dtypes differ) and fill_.
template <typename D, typename S>
void convert_as(const BufferView& from, const BufferView& to) {
  map(to.numel(), ConvertF<D, S>{}, to.as<D>(), from.as<S>());
}
template <typename S>
void convert_from(const BufferView& from, const BufferView& to) {
  switch (to.dtype) {
    case DType::Float32: return convert_as<float, S>(from, to);
    case DType::Float64: return convert_as<double, S>(from, to);
    case DType::Int32: return convert_as<int32_t, S>(from, to);
    case DType::Int64: return convert_as<int64_t, S>(from, to);
    case DType::Bool: return convert_as<bool, S>(from, to);
  }
}
extern "C" void convert(const BufferView* from, const BufferView* to) {
  switch (from->dtype) {
    case DType::Float32: return convert_from<float>(*from, *to);
    case DType::Float64: return convert_from<double>(*from, *to);
    case DType::Int32: return convert_from<int32_t>(*from, *to);
    case DType::Int64: return convert_from<int64_t>(*from, *to);
    case DType::Bool: return convert_from<bool>(*from, *to);
  }
}
extern "C" void fill_f32(const BufferView* t, double value) {
  map(t->numel(), ConstantF<float>{convert_value<float>(value)}, t->as<float>());
}
extern "C" void fill_i32(const BufferView* t, double value) {
  map(t->numel(), ConstantF<int32_t>{convert_value<int32_t>(value)}, t->as<int32_t>());
}
// elementwise.cu's arange_, on `blocks` blocks (0: as elementwise.cu launches it).
template <typename T>
void iota_as(const BufferView& t, unsigned blocks) {
  const int64_t n = t.numel();
  if (n == 0) return;
  emulate_launch(blocks != 0 ? blocks : blocks_for(n), kThreads,
                 [&] { iota_kernel<T>(n, t.as<T>()); });
}
extern "C" void arange(const BufferView* t, unsigned blocks) {
  switch (t->dtype) {
    case DType::Float32: return iota_as<float>(*t, blocks);
    case DType::Float64: return iota_as<double>(*t, blocks);
    case DType::Int32: return iota_as<int32_t>(*t, blocks);
    case DType::Int64: return iota_as<int64_t>(*t, blocks);
    case DType::Bool: return iota_as<bool>(*t, blocks);
  }
}
#define ENTRIES(T, suffix)                                                                     \
  extern "C" void binary_##suffix(int op, const BufferView* a, const BufferView* b,             \
                                  const BufferView* out, bool wide) {                           \
    binary_op<T>(static_cast<Op>(op), *a, *b, *out, wide);                                      \
  }                                                                                             \
  extern "C" void where_##suffix(const BufferView* c, const BufferView* a, const BufferView* b, \
                                 const BufferView* out) {                                       \
    where<T>(*c, *a, *b, *out);                                                                 \
  }                                                                                             \
  extern "C" void unary_##suffix(int op, double s, const BufferView* x, const BufferView* b,    \
                                 const BufferView* y) {                                         \
    unary_op<T>(static_cast<Op>(op), s, *x, *b, *y);                                            \
  }
ENTRIES(float, f32)
ENTRIES(double, f64)
)cuda";

const testing::HostObject& elementwise_kernels() {
  static const testing::HostObject object({}, kSource);
  return object;
}

using Binary = void (*)(int, const BufferView*, const BufferView*, const BufferView*, bool);
using Where = void (*)(const BufferView*, const BufferView*, const BufferView*, const BufferView*);
using Unary = void (*)(int, double, const BufferView*, const BufferView*, const BufferView*);
using Convert = void (*)(const BufferView*, const BufferView*);
using Fill = void (*)(const BufferView*, double);
using Arange = void (*)(const BufferView*, unsigned);

template <typename F>
F entry(const std::string& name) {
  return elementwise_kernels().function<F>(name);
}

BufferView view(const Tensor& t) {
  return {t.raw_data(), t.shape(), t.dtype()};
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.nbytes())) == 0;
}

// Values in [lo, hi) of `dtype`, drawn in float32 so both dtypes see the same ones.
Tensor draw(const Shape& shape, DType dtype, double lo, double hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(static_cast<float>(lo), static_cast<float>(hi));
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (double& e : v) e = u(rng);
  return tensor(v, shape, dtype);
}

// The CPU kernel of `op` (dispatched by op) into a tensor of `shape` and `dtype`.
Tensor cpu_op(Op op, std::initializer_list<Tensor> in, const Shape& shape, DType dtype,
              const AttrBlob& attrs = {}) {
  Tensor out = zeros(shape, dtype);
  dispatch(op, in, {out}, attrs);
  return out;
}

template <typename T>
std::string suffix() {
  return testing::typed_name<T>("");
}

// Halves in [-2, 2]: few distinct values, so comparisons see equal elements; none is 0 (a
// divisor).
Tensor halves(const Shape& shape, DType dtype, std::mt19937& rng) {
  std::uniform_int_distribution<int> k(1, 4);
  std::bernoulli_distribution negative(0.5);
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (double& e : v) e = (negative(rng) ? -0.5 : 0.5) * k(rng);
  return tensor(v, shape, dtype);
}

// Every binary op over a, b broadcast to `so`, on every path, against the CPU's bits; add_ into a.
template <typename T>
void check_binary(const Shape& sa, const Shape& sb, const Shape& so, std::mt19937& rng) {
  INFO(sa.str() << " with " << sb.str() << " -> " << so.str() << ", " << sizeof(T) * 8 << "-bit");
  const DType dtype = sizeof(T) == 4 ? DType::Float32 : DType::Float64;
  const Binary binary = entry<Binary>("binary" + suffix<T>());
  const Tensor a = halves(sa, dtype, rng), b = halves(sb, dtype, rng);
  for (const Op op : {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Equal, Op::Greater}) {
    INFO(op_name(op));
    const DType out_dtype = op == Op::Equal || op == Op::Greater ? DType::Bool : dtype;
    const Tensor want = cpu_op(op, {a, b}, so, out_dtype);
    for (const bool wide : {false, true}) {
      const Tensor got = zeros(so, out_dtype);
      const BufferView va = view(a), vb = view(b), vo = view(got);
      binary(static_cast<int>(op), &va, &vb, &vo, wide);
      CHECK(same_bytes(got, want));
    }
  }
  if (sa == so) {  // add_: the output is the first input
    const Tensor t = clone(a), want = clone(a);
    dispatch(Op::AddInplace, {want, b}, {});
    const BufferView vt = view(t), vb = view(b);
    binary(static_cast<int>(Op::AddInplace), &vt, &vb, &vt, false);
    CHECK(same_bytes(t, want));
  }
}

// The map over operands one element past a 16-byte boundary (one element a step) gives the bits
// of the aligned map (16 bytes a step).
template <typename T>
void check_misaligned(int64_t n, std::mt19937& rng) {
  INFO(n << " elements, " << sizeof(T) * 8 << "-bit");
  const DType dtype = sizeof(T) == 4 ? DType::Float32 : DType::Float64;
  const Binary binary = entry<Binary>("binary" + suffix<T>());
  const Tensor a = halves({n + 1}, dtype, rng), b = halves({n + 1}, dtype, rng);
  const Tensor aligned = zeros({n}, dtype), shifted = zeros({n + 1}, dtype);
  const auto at = [&](const Tensor& t, int64_t k) {
    return BufferView{static_cast<T*>(t.raw_data()) + k, Shape{n}, dtype};
  };
  const BufferView a0 = at(a, 0), b0 = at(b, 0), o0 = at(aligned, 0);
  const BufferView a1 = at(a, 1), b1 = at(b, 1), o1 = at(shifted, 1);
  binary(static_cast<int>(Op::Mul), &a1, &b1, &o1, false);
  // The same values, aligned: copy a and b's tails to the front.
  const Tensor ta = zeros({n}, dtype), tb = zeros({n}, dtype);
  std::memcpy(ta.raw_data(), a1.data, n * sizeof(T));
  std::memcpy(tb.raw_data(), b1.data, n * sizeof(T));
  const BufferView va = view(ta), vb = view(tb);
  binary(static_cast<int>(Op::Mul), &va, &vb, &o0, false);
  (void)a0;
  (void)b0;
  CHECK(std::memcmp(o0.data, o1.data, n * sizeof(T)) == 0);
  CHECK(same_bytes(aligned, cpu_op(Op::Mul, {ta, tb}, {n}, dtype)));
}

}  // namespace

TEST_CASE("binary ops and comparisons on every path give the CPU's bits (emulated)",
          "[nvrtc][emulated]") {
  std::mt19937 rng(61);
  struct Shapes {
    Shape a, b, out;
  };
  const Shapes cases[] = {
      {{1024}, {1024}, {1024}},        // 16-byte packs
      {{1001}, {1001}, {1001}},        // packs and a tail
      {{300}, {1}, {300}},             // the second operand one element
      {{1}, {37}, {37}},               // the first
      {{4, 1, 5}, {3, 1}, {4, 3, 5}},  // broadcast strides
      {{2, 3, 40}, {40}, {2, 3, 40}},  // a row over a matrix
      {{3, 1}, {1, 2, 1, 7}, {1, 2, 3, 7}},
  };
  for (const Shapes& c : cases) {
    check_binary<float>(c.a, c.b, c.out, rng);
    check_binary<double>(c.a, c.b, c.out, rng);
  }
  check_misaligned<float>(1003, rng);
  check_misaligned<double>(517, rng);
}

TEST_CASE("where over its paths gives the CPU's bits (emulated)", "[nvrtc][emulated]") {
  std::mt19937 rng(67);
  const Where where = entry<Where>("where_f32");
  std::bernoulli_distribution coin(0.5);
  auto condition = [&](const Shape& s) {
    std::vector<double> v(static_cast<size_t>(s.numel()));
    for (double& e : v) e = coin(rng) ? 1 : 0;
    return tensor(v, s, DType::Bool);
  };
  struct Shapes {
    Shape c, a, b, out;
  };
  const Shapes cases[] = {{{500}, {500}, {500}, {500}},
                          {{4, 1}, {1, 5}, {4, 5}, {4, 5}},
                          {{6, 6}, {2, 6, 6}, {1}, {2, 6, 6}}};
  for (const Shapes& s : cases) {
    INFO(s.out.str());
    const Tensor c = condition(s.c), a = halves(s.a, DType::Float32, rng),
                 b = halves(s.b, DType::Float32, rng);
    const Tensor want = cpu_op(Op::Where, {c, a, b}, s.out, DType::Float32);
    const Tensor got = zeros(s.out, DType::Float32);
    const BufferView vc = view(c), va = view(a), vb = view(b), vo = view(got);
    where(&vc, &va, &vb, &vo);
    CHECK(same_bytes(got, want));
  }
}

TEST_CASE("tensor-scalar ops, activations and their gradients give the CPU's values (emulated)",
          "[nvrtc][emulated]") {
  std::mt19937 rng(71);
  const int64_t n = 1001;
  struct Case {
    Op op;
    double s, lo, hi;
    bool exact;  // the CPU's bits (else within a few ulps)
  };
  const Case cases[] = {
      {Op::AddScalar, 1.5, -3, 3, true},
      {Op::MulScalar, -0.25, -3, 3, true},
      {Op::RsubScalar, 2, -3, 3, true},
      {Op::DivScalar, 3, -3, 3, true},
      {Op::RdivScalar, 2, 0.5, 3, true},
      {Op::PowScalar, 2, -3, 3, true},
      {Op::PowScalar, 3, 0.5, 2, false},
      {Op::Gelu, 0, -3, 3, false},
      {Op::Gelu, kGeluTanh, -3, 3, false},
      {Op::LeakyRelu, 0.1, -3, 3, true},
      {Op::Neg, 0, -3, 3, true},
      {Op::Exp, 0, -3, 3, false},
      {Op::Log, 0, 0.1, 5, false},
      {Op::Sqrt, 0, 0, 5, true},
      {Op::Relu, 0, -3, 3, true},
      {Op::Sigmoid, 0, -5, 5, false},
      {Op::Tanh, 0, -3, 3, false},
      {Op::ReluGrad, 0, -1, 1, true},
      {Op::LeakyReluGrad, 0.1, -2, 2, true},
      {Op::SigmoidGrad, 0, 0.05, 0.95, false},
      {Op::GeluGrad, 0, -3, 3, false},
      {Op::GeluGrad, kGeluTanh, -3, 3, false},
      {Op::TanhGrad, 0, -0.95, 0.95, false},
  };
  for (const DType dtype : {DType::Float32, DType::Float64}) {
    const Unary unary = entry<Unary>(dtype == DType::Float32 ? "unary_f32" : "unary_f64");
    for (const Case& c : cases) {
      INFO(op_name(c.op) << " " << c.s << ", " << (dtype == DType::Float32 ? "float" : "double"));
      const bool grad = op_reads_two(c.op);
      const Tensor x = draw({n}, dtype, c.lo, c.hi, rng), gy = draw({n}, dtype, -2, 2, rng);
      const AttrBlob attrs =
          op_has_scalar_attrs(c.op) ? AttrBlob::of(ScalarAttrs{c.s}) : AttrBlob{};
      const Tensor want =
          grad ? cpu_op(c.op, {x, gy}, {n}, dtype, attrs) : cpu_op(c.op, {x}, {n}, dtype, attrs);
      const Tensor got = zeros({n}, dtype);
      const BufferView vx = view(x), vg = view(gy), vo = view(got);
      unary(static_cast<int>(c.op), c.s, &vx, &vg, &vo);
      if (c.exact) {
        CHECK(same_bytes(got, want));
      } else {
        const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; ++i)
          wrong += dtype == DType::Float32
                       ? !testing::within_ulps<float>(g[i], w[i], std::abs(w[i]), 8)
                       : !testing::within_ulps<double>(g[i], w[i], std::abs(w[i]), 8);
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("conversions between dtypes and fills give the CPU's bits (emulated)",
          "[nvrtc][emulated]") {
  const Convert convert = entry<Convert>("convert");
  // Values every conversion meets: fractions of both signs, NaN, infinities, values past int32.
  const std::vector<double> values = {0.0,
                                      -0.0,
                                      1.5,
                                      -2.5,
                                      3.75,
                                      1e10,
                                      -1e10,
                                      255.0,
                                      7.0,
                                      std::numeric_limits<double>::quiet_NaN(),
                                      std::numeric_limits<double>::infinity(),
                                      -std::numeric_limits<double>::infinity()};
  const DType all[] = {DType::Float32, DType::Float64, DType::Int32, DType::Int64, DType::Bool};
  for (const DType from : all) {
    // (A source of an integer or bool dtype holds its values converted first.)
    const Tensor src = cpu_op(
        Op::Copy, {tensor(values, Shape{static_cast<int64_t>(values.size())}, DType::Float64)},
        {static_cast<int64_t>(values.size())}, from);
    for (const DType to : all) {
      if (to == from) continue;
      INFO(name(from) << " to " << name(to));
      const Tensor want = cpu_op(Op::Copy, {src}, src.shape(), to);
      const Tensor got = zeros(src.shape(), to);
      const BufferView vs = view(src), vo = view(got);
      convert(&vs, &vo);
      CHECK(same_bytes(got, want));
    }
  }
  for (const double value : {2.5, -1e12}) {
    INFO("fill " << value);
    const Tensor f = zeros({300}, DType::Float32), i = zeros({300}, DType::Int32);
    const Tensor wf = zeros({300}, DType::Float32), wi = zeros({300}, DType::Int32);
    dispatch(Op::Fill, {wf}, {}, AttrBlob::of(ScalarAttrs{value}));
    dispatch(Op::Fill, {wi}, {}, AttrBlob::of(ScalarAttrs{value}));
    const BufferView vf = view(f), vi = view(i);
    entry<Fill>("fill_f32")(&vf, value);
    entry<Fill>("fill_i32")(&vi, value);
    CHECK(same_bytes(f, wf));
    CHECK(same_bytes(i, wi));
  }
}

TEST_CASE("arange_ counts as the CPU does in every dtype (emulated)", "[nvrtc][emulated]") {
  const Arange arange = entry<Arange>("arange");
  for (const DType dtype :
       {DType::Float32, DType::Float64, DType::Int32, DType::Int64, DType::Bool})
    for (const int64_t n : {0, 1, 300, 1000})
      for (const unsigned blocks : {0u, 1u}) {  // 1: one block strides over the whole tensor
        INFO(name(dtype) << " n " << n << " blocks " << blocks);
        const Tensor want = empty({n}, dtype), got = full({n}, 3, dtype);
        dispatch(Op::Arange, {want}, {});
        const BufferView v = view(got);
        arange(&v, blocks);
        CHECK(same_bytes(got, want));
      }
  // The CPU's values are the indices.
  CHECK(encore::arange(5, DType::Int64).to_vector<int64_t>() ==
        std::vector<int64_t>{0, 1, 2, 3, 4});
}
