// The op harness's cases for every routine of functions.h except convolution, pooling and
// normalisation (op_cases_image.h): naive references over doubles and the case lists, shared by
// the cpu tests (ops_test.cc) and the CUDA tests (cuda/cuda_ops_test.cc), which run the same cases.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "encore/functions.h"
#include "op_harness.h"
#include "runtime/dispatcher.h"

namespace encore::optest {

// ---- References: naive loops over doubles -----------------------------------------------

inline std::vector<int> normalized_axes(std::vector<int> axes, int rank) {
  if (axes.empty())
    for (int i = 0; i < rank; ++i) axes.push_back(i);
  for (int& a : axes) a = a < 0 ? a + rank : a;
  return axes;
}

enum class Reduction { Sum, Mean, Max };

inline RefTensor ref_reduce(const RefTensor& x, std::vector<int> axes_in, bool keepdims,
                            Reduction kind) {
  const std::vector<int> axes = normalized_axes(std::move(axes_in), x.rank());
  Dims kept = x.shape, out_shape;
  int64_t count = 1;
  for (int a : axes) {
    count *= x.shape[a];
    kept[a] = 1;
  }
  for (int i = 0; i < x.rank(); ++i) {
    const bool reduced = std::find(axes.begin(), axes.end(), i) != axes.end();
    if (!reduced || keepdims) out_shape.push_back(reduced ? 1 : x.shape[i]);
  }
  const double init = kind == Reduction::Max ? -std::numeric_limits<double>::infinity() : 0.0;
  RefTensor y = ref::filled(kept, init);
  for (int64_t i = 0; i < x.numel(); ++i) {
    double& acc = y.v[ref::broadcast_source(ref::unravel(i, x.shape), kept)];
    acc = kind == Reduction::Max ? ref::max_nan(acc, x.v[i]) : acc + x.v[i];
  }
  if (kind == Reduction::Mean)
    for (double& v : y.v) v /= static_cast<double>(count);
  y.shape = out_shape;
  return y;
}

// [M,K] or [B,M,K] times [K,N] or [B,K,N] (a 2-D operand is shared by every batch).
inline RefTensor ref_matmul(const RefTensor& a, const RefTensor& b) {
  const int64_t batch = a.rank() == 3 ? a.shape[0] : (b.rank() == 3 ? b.shape[0] : 1);
  const int64_t m = a.shape[a.rank() - 2], k = a.shape[a.rank() - 1], n = b.shape[b.rank() - 1];
  Dims shape = {m, n};
  if (a.rank() == 3 || b.rank() == 3) shape.insert(shape.begin(), batch);
  RefTensor y = ref::filled(shape);
  for (int64_t p = 0; p < batch; ++p) {
    const double* pa = a.v.data() + (a.rank() == 3 ? p * m * k : 0);
    const double* pb = b.v.data() + (b.rank() == 3 ? p * k * n : 0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q) s += pa[i * k + q] * pb[q * n + j];
        y.v[p * m * n + i * n + j] = s;
      }
  }
  return y;
}

inline RefTensor ref_linear(const RefTensor& x, const RefTensor& w, const RefTensor* bias) {
  const int64_t out = w.shape[0], in = w.shape[1], rows = x.numel() / in;
  Dims shape = x.shape;
  shape.back() = out;
  RefTensor y = ref::filled(shape);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = bias ? bias->v[o] : 0.0;
      for (int64_t q = 0; q < in; ++q) s += x.v[r * in + q] * w.v[o * in + q];
      y.v[r * out + o] = s;
    }
  return y;
}

inline RefTensor ref_sum_to(const RefTensor& x, const Dims& shape) {
  RefTensor y = ref::filled(shape);
  for (int64_t i = 0; i < x.numel(); ++i)
    y.v[ref::broadcast_source(ref::unravel(i, x.shape), shape)] += x.v[i];
  return y;
}

inline RefTensor ref_broadcast_to(const RefTensor& x, const Dims& shape) {
  RefTensor y = ref::filled(shape);
  for (int64_t i = 0; i < y.numel(); ++i)
    y.v[i] = x.v[ref::broadcast_source(ref::unravel(i, shape), x.shape)];
  return y;
}

inline RefTensor ref_reshape(const RefTensor& x, const Dims& shape) {
  return {shape, x.v};
}

inline RefTensor ref_permute(const RefTensor& x, const std::vector<int>& perm_in) {
  const std::vector<int> perm = normalized_axes(perm_in, x.rank());
  Dims shape(x.rank());
  for (int i = 0; i < x.rank(); ++i) shape[i] = x.shape[perm[i]];
  RefTensor y = ref::filled(shape);
  for (int64_t i = 0; i < y.numel(); ++i) {
    const Dims out = ref::unravel(i, shape);
    Dims in(x.rank());
    for (int d = 0; d < x.rank(); ++d) in[perm[d]] = out[d];
    y.v[i] = x.v[ref::ravel(in, x.shape)];
  }
  return y;
}

inline RefTensor ref_concat(const Refs& xs, int axis) {
  Dims shape = xs[0].shape;
  if (axis < 0) axis += xs[0].rank();
  shape[axis] = 0;
  for (const RefTensor& x : xs) shape[axis] += x.shape[axis];
  RefTensor y = ref::filled(shape);
  for (int64_t i = 0; i < y.numel(); ++i) {
    Dims idx = ref::unravel(i, shape);
    size_t k = 0;
    while (idx[axis] >= xs[k].shape[axis]) idx[axis] -= xs[k++].shape[axis];
    y.v[i] = xs[k].v[ref::ravel(idx, xs[k].shape)];
  }
  return y;
}

inline RefTensor ref_slice(const RefTensor& x, int axis, int64_t start, int64_t stop,
                           int64_t step) {
  if (axis < 0) axis += x.rank();
  const int64_t n = x.shape[axis];
  if (start < 0) start += n;
  if (stop < 0) stop += n;
  start = std::min(std::max<int64_t>(start, 0), n);
  stop = std::min(std::max<int64_t>(stop, 0), n);
  Dims shape = x.shape;
  shape[axis] = 0;
  for (int64_t k = start; k < stop; k += step) ++shape[axis];
  RefTensor y = ref::filled(shape);
  for (int64_t i = 0; i < y.numel(); ++i) {
    Dims idx = ref::unravel(i, shape);
    idx[axis] = start + idx[axis] * step;
    y.v[i] = x.v[ref::ravel(idx, x.shape)];
  }
  return y;
}

// Softmax (or log-softmax) along `axis`, one line of elements at a time.
inline RefTensor ref_softmax(const RefTensor& x, int axis, bool log) {
  if (axis < 0) axis += x.rank();
  int64_t inner = 1;
  for (int d = axis + 1; d < x.rank(); ++d) inner *= x.shape[d];
  const int64_t n = x.shape[axis], outer = x.numel() / (n * inner);
  RefTensor y = x;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t in = 0; in < inner; ++in) {
      auto at = [&](int64_t k) { return o * n * inner + k * inner + in; };
      double mx = -std::numeric_limits<double>::infinity(), s = 0;
      for (int64_t k = 0; k < n; ++k) mx = ref::max_nan(mx, x.v[at(k)]);
      for (int64_t k = 0; k < n; ++k) s += std::exp(x.v[at(k)] - mx);
      for (int64_t k = 0; k < n; ++k)
        y.v[at(k)] = log ? x.v[at(k)] - mx - std::log(s) : std::exp(x.v[at(k)] - mx) / s;
    }
  return y;
}

inline RefTensor ref_cross_entropy(const RefTensor& logits, const RefTensor& labels,
                                   int64_t ignore) {
  const RefTensor logp = ref_softmax(logits, 1, true);
  const int64_t c = logits.shape[1];
  double total = 0, count = 0;
  for (int64_t i = 0; i < labels.numel(); ++i) {
    const auto t = static_cast<int64_t>(labels.v[i]);
    if (t == ignore) continue;
    total -= logp.v[i * c + t];
    count += 1;
  }
  return {{}, {total / count}};
}

inline RefTensor ref_accuracy(const RefTensor& logits, const RefTensor& labels, int64_t ignore) {
  const int64_t c = logits.shape[1];
  double hits = 0, count = 0;
  for (int64_t i = 0; i < labels.numel(); ++i) {
    const auto t = static_cast<int64_t>(labels.v[i]);
    if (t == ignore) continue;
    int64_t best = 0;  // the first maximum, or the first NaN (as torch.argmax)
    for (int64_t k = 1; k < c && !std::isnan(logits.v[i * c + best]); ++k)
      if (std::isnan(logits.v[i * c + k]) || logits.v[i * c + k] > logits.v[i * c + best]) best = k;
    hits += best == t ? 1 : 0;
    count += 1;
  }
  return {{}, {hits / count}};
}

// ---- Gradient references (for NaN inputs, where central differences are NaN) -------------

// max's gradient as torch.amax's: (gy / ties) * (x == max), ties the number of elements equal to
// their slice's maximum; over a slice whose maximum is NaN, (gy / 0) * 0 = NaN.
inline RefTensor ref_max_grad(const RefTensor& x, const std::vector<int>& axes,
                              const RefTensor& gy) {
  const RefTensor m = ref_reduce(x, axes, true, Reduction::Max);
  RefTensor ties = ref::filled(m.shape);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t s = ref::broadcast_source(ref::unravel(i, x.shape), m.shape);
    ties.v[s] += x.v[i] == m.v[s] ? 1 : 0;
  }
  RefTensor gx = ref::filled(x.shape);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t s = ref::broadcast_source(ref::unravel(i, x.shape), m.shape);
    gx.v[i] = gy.v[s] / ties.v[s] * (x.v[i] == m.v[s] ? 1.0 : 0.0);
  }
  return gx;
}

// softmax: gx = y * (gy - sum(gy * y)); log_softmax: gx = gy - exp(y) * sum(gy), along `axis`.
inline RefTensor ref_softmax_grad(const RefTensor& x, int axis, bool log, const RefTensor& gy) {
  const RefTensor y = ref_softmax(x, axis, log);
  if (axis < 0) axis += x.rank();
  int64_t inner = 1;
  for (int d = axis + 1; d < x.rank(); ++d) inner *= x.shape[d];
  const int64_t n = x.shape[axis], outer = x.numel() / (n * inner);
  RefTensor gx = ref::filled(x.shape);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t in = 0; in < inner; ++in) {
      auto at = [&](int64_t k) { return o * n * inner + k * inner + in; };
      double dot = 0;
      for (int64_t k = 0; k < n; ++k) dot += log ? gy.v[at(k)] : gy.v[at(k)] * y.v[at(k)];
      for (int64_t k = 0; k < n; ++k)
        gx.v[at(k)] =
            log ? gy.v[at(k)] - std::exp(y.v[at(k)]) * dot : y.v[at(k)] * (gy.v[at(k)] - dot);
    }
  return gx;
}

// (softmax(row) - onehot(label)) * gy / count on counted rows, 0 on ignored ones.
inline RefTensor ref_cross_entropy_grad(const RefTensor& logits, const RefTensor& labels,
                                        int64_t ignore, const RefTensor& gy) {
  const RefTensor p = ref_softmax(logits, 1, false);
  const int64_t c = logits.shape[1];
  double count = 0;
  for (double t : labels.v) count += static_cast<int64_t>(t) == ignore ? 0 : 1;
  RefTensor gx = ref::filled(logits.shape);
  for (int64_t i = 0; i < labels.numel(); ++i) {
    const auto t = static_cast<int64_t>(labels.v[i]);
    if (t == ignore) continue;
    for (int64_t k = 0; k < c; ++k)
      gx.v[i * c + k] = (p.v[i * c + k] - (k == t ? 1 : 0)) * gy.v[0] / count;
  }
  return gx;
}

inline RefTensor ref_where(const RefTensor& cond, const RefTensor& a, const RefTensor& b) {
  RefTensor y = ref::filled(ref::broadcast_dims(ref::broadcast_dims(cond.shape, a.shape), b.shape));
  for (int64_t i = 0; i < y.numel(); ++i) {
    const Dims idx = ref::unravel(i, y.shape);
    y.v[i] = cond.v[ref::broadcast_source(idx, cond.shape)] != 0
                 ? a.v[ref::broadcast_source(idx, a.shape)]
                 : b.v[ref::broadcast_source(idx, b.shape)];
  }
  return y;
}

inline double ref_sigmoid(double v) {
  return 1 / (1 + std::exp(-v));
}

// torch.nn.functional.gelu, approximate "none" and "tanh".
inline double ref_gelu(double v) {
  return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
}
inline double ref_gelu_tanh(double v) {
  return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
}

// ---- Case builders ----------------------------------------------------------------------

using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);

inline OpCase binary_case(const std::string& op, BinaryFn fn,
                          std::function<double(double, double)> f, Dims a, Dims b, ValueGen gen_b) {
  return {absl::StrCat(op, " ", dims_str(a), " x ", dims_str(b)),
          {floating(a, uniform(-2, 2)), floating(b, std::move(gen_b))},
          [fn](const Inputs& x) { return fn(x[0], x[1]); },
          [f](const Refs& x) { return ref::zip(x[0], x[1], f); }};
}

inline OpCase unary_case(const std::string& name, std::function<Tensor(const Tensor&)> fn,
                         std::function<double(double)> f, ValueGen gen, Dims shape = {3, 4}) {
  return {absl::StrCat(name, " ", dims_str(shape)),
          {floating(shape, std::move(gen))},
          [fn](const Inputs& x) { return fn(x[0]); },
          [f](const Refs& x) { return ref::map(x[0], f); }};
}

inline OpCase reduce_case(const std::string& op, Reduction kind, Dims shape, std::vector<int> axes,
                          bool keepdims) {
  std::string axes_str;
  for (int a : axes) absl::StrAppend(&axes_str, axes_str.empty() ? "" : ",", a);
  auto fn = kind == Reduction::Sum ? &F::sum : kind == Reduction::Mean ? &F::mean : &F::max;
  return {absl::StrCat(op, " ", dims_str(shape), " axes {", axes_str, "} keepdims ",
                       keepdims ? "true" : "false"),
          {floating(shape, kind == Reduction::Max ? distinct(-3, 3) : uniform(-2, 2))},
          [=](const Inputs& x) { return fn(x[0], axes, keepdims); },
          [=](const Refs& x) { return ref_reduce(x[0], axes, keepdims, kind); }};
}

inline std::vector<OpCase> binary_cases() {
  struct BinaryOp {
    const char* name;
    BinaryFn fn;
    double (*f)(double, double);
  };
  const BinaryOp ops[] = {{"add", &F::add, [](double a, double b) { return a + b; }},
                          {"sub", &F::sub, [](double a, double b) { return a - b; }},
                          {"mul", &F::mul, [](double a, double b) { return a * b; }},
                          {"div", &F::div, [](double a, double b) { return a / b; }}};
  const std::pair<Dims, Dims> shapes[] = {
      {{2, 3}, {2, 3}}, {{2, 3}, {3}},   {{2, 1, 3}, {4, 1}}, {{2, 3}, {}},     {{}, {2, 3}},
      {{}, {}},         {{4, 37}, {37}}, {{37, 1}, {1, 5}},   {{3, 1}, {3, 4}}, {{0, 3}, {3}}};
  std::vector<OpCase> cases;
  for (const BinaryOp& op : ops)
    for (const auto& [a, b] : shapes) {
      ValueGen gen_b = std::string(op.name) == "div" ? signed_magnitude(0.5, 2) : uniform(-2, 2);
      cases.push_back(binary_case(op.name, op.fn, op.f, a, b, gen_b));
    }
  cases.push_back({"mul(x, x) (one leaf in both slots)",
                   {floating({2, 3})},
                   [](const Inputs& x) { return F::mul(x[0], x[0]); },
                   [](const Refs& x) { return ref::map(x[0], [](double v) { return v * v; }); }});
  // Operators and a leaf used three times (gradients from every use add up).
  cases.push_back({"a * a + a / b - b (operators, a used three times)",
                   {floating({2, 3}), floating({3}, signed_magnitude(0.5, 2))},
                   [](const Inputs& x) { return x[0] * x[0] + x[0] / x[1] - x[1]; },
                   [](const Refs& x) {
                     return ref::zip(x[0], x[1],
                                     [](double a, double b) { return a * a + a / b - b; });
                   }});
  return cases;
}

inline std::vector<OpCase> scalar_cases() {
  const ValueGen any = uniform(-2, 2);
  const ValueGen nonzero = signed_magnitude(0.5, 2);
  const ValueGen pos = positive(0.5, 2);
  using T = const Tensor&;
  return {
      unary_case(
          "add(x, 1.5)", [](T x) { return F::add(x, 1.5); }, [](double v) { return v + 1.5; }, any),
      unary_case(
          "sub(x, 0.75)", [](T x) { return F::sub(x, 0.75); }, [](double v) { return v - 0.75; },
          any),
      unary_case(
          "sub(2, x)", [](T x) { return F::sub(2.0, x); }, [](double v) { return 2 - v; }, any),
      unary_case(
          "mul(x, -2.5)", [](T x) { return F::mul(x, -2.5); }, [](double v) { return v * -2.5; },
          any),
      unary_case(
          "div(x, 4)", [](T x) { return F::div(x, 4.0); }, [](double v) { return v / 4; }, any),
      unary_case(
          "div(3, x)", [](T x) { return F::div(3.0, x); }, [](double v) { return 3 / v; }, nonzero),
      unary_case(
          "3 - x * 2 + 1 / x (operators)", [](T x) { return 3.0 - x * 2.0 + 1.0 / x; },
          [](double v) { return 3 - v * 2 + 1 / v; }, nonzero),
      unary_case(
          "pow(x, 2)", [](T x) { return F::pow(x, 2); }, [](double v) { return v * v; }, any),
      unary_case(
          "pow(x, 3)", [](T x) { return F::pow(x, 3); }, [](double v) { return v * v * v; }, any),
      unary_case(
          "pow(x, 0.5)", [](T x) { return F::pow(x, 0.5); }, [](double v) { return std::sqrt(v); },
          pos),
      unary_case(
          "pow(x, -1.5)", [](T x) { return F::pow(x, -1.5); },
          [](double v) { return 1 / (v * std::sqrt(v)); }, pos),
  };
}

inline std::vector<OpCase> unary_cases() {
  const ValueGen any = uniform(-2, 2);
  const ValueGen pos = positive(0.1, 3);
  const ValueGen away = signed_magnitude(0.01, 2);  // no point within 1e-2 of the kink at 0
  auto exp = [](double v) { return std::exp(v); };
  auto sqrt = [](double v) { return std::sqrt(v); };
  auto tanh = [](double v) { return std::tanh(v); };
  auto relu = [](double v) { return v > 0 ? v : 0; };
  auto leaky = [](double v) { return v > 0 ? v : 0.01 * v; };
  auto identity = [](double v) { return v; };
  return {
      unary_case(
          "neg", F::neg, [](double v) { return -v; }, any),
      unary_case(
          "neg (operator)", [](const Tensor& x) { return -x; }, [](double v) { return -v; }, any,
          {5}),
      unary_case("exp", F::exp, exp, any),
      unary_case(
          "log", F::log, [](double v) { return std::log(v); }, pos),
      unary_case("sqrt", F::sqrt, sqrt, pos),
      unary_case("relu", F::relu, relu, away, {2, 3, 4}),
      unary_case("leaky_relu", [](const Tensor& x) { return F::leaky_relu(x); }, leaky, away,
                 {2, 3, 4}),
      unary_case(
          "leaky_relu(slope 0.2)", [](const Tensor& x) { return F::leaky_relu(x, 0.2); },
          [](double v) { return v > 0 ? v : 0.2 * v; }, away),
      unary_case("sigmoid", F::sigmoid, ref_sigmoid, uniform(-4, 4), {2, 3, 4}),
      unary_case("tanh", F::tanh, tanh, uniform(-3, 3)),
      unary_case("gelu", [](const Tensor& x) { return F::gelu(x); }, ref_gelu, uniform(-4, 4),
                 {2, 3, 4}),
      unary_case("gelu(approximate tanh)", [](const Tensor& x) { return F::gelu(x, "tanh"); },
                 ref_gelu_tanh, uniform(-4, 4), {2, 3, 4}),
      unary_case("gelu, wide range", [](const Tensor& x) { return F::gelu(x); }, ref_gelu,
                 uniform(-12, 12), {5, 13}),
      unary_case("gelu(approximate tanh), wide range",
                 [](const Tensor& x) { return F::gelu(x, "tanh"); }, ref_gelu_tanh,
                 uniform(-12, 12), {5, 13}),
      unary_case("exp [] (0-d)", F::exp, exp, any, {}),
      unary_case("clone", [](const Tensor& x) { return clone(x); }, identity, any, {2, 3}),
      // Longer than a SIMD vector, with a tail.
      unary_case("exp", F::exp, exp, any, {5, 13}),
      unary_case("sqrt", F::sqrt, sqrt, pos, {5, 13}),
      unary_case("relu", F::relu, relu, away, {5, 13}),
      unary_case(
          "pow(x, 2)", [](const Tensor& x) { return F::pow(x, 2); }, [](double v) { return v * v; },
          any, {5, 13}),
      // Far into the tails (no overflow in exp).
      unary_case("sigmoid, wide range", F::sigmoid, ref_sigmoid, uniform(-40, 40), {4, 5}),
      unary_case("tanh, wide range", F::tanh, tanh, uniform(-20, 20), {4, 5}),
  };
}

inline std::vector<OpCase> linalg_cases() {
  std::vector<OpCase> cases;
  const std::pair<Dims, Dims> matmul_shapes[] = {
      {{3, 4}, {4, 5}}, {{2, 3, 4}, {2, 4, 5}}, {{2, 3, 4}, {4, 5}}, {{3, 4}, {2, 4, 5}},
      {{1, 6}, {6, 1}}, {{9, 17}, {17, 10}},    {{2, 0}, {0, 3}},    {{2, 3, 0}, {2, 0, 4}}};
  for (const auto& [a, b] : matmul_shapes)
    cases.push_back({absl::StrCat("matmul ", dims_str(a), " x ", dims_str(b)),
                     {floating(a), floating(b)},
                     [](const Inputs& x) { return F::matmul(x[0], x[1]); },
                     [](const Refs& x) { return ref_matmul(x[0], x[1]); }});
  for (const Dims& xs : {Dims{4, 5}, Dims{2, 3, 5}, Dims{5}, Dims{2, 1, 2, 5}}) {
    cases.push_back({absl::StrCat("linear x ", dims_str(xs), " W [3,5]"),
                     {floating(xs), floating({3, 5})},
                     [](const Inputs& x) { return F::linear(x[0], x[1]); },
                     [](const Refs& x) { return ref_linear(x[0], x[1], nullptr); }});
    cases.push_back({absl::StrCat("linear x ", dims_str(xs), " W [3,5] b [3]"),
                     {floating(xs), floating({3, 5}), floating({3})},
                     [](const Inputs& x) { return F::linear(x[0], x[1], x[2]); },
                     [](const Refs& x) { return ref_linear(x[0], x[1], &x[2]); }});
  }
  cases.push_back({"linear with a constant weight",
                   {floating({4, 5}), constant({3, 5}), floating({3})},
                   [](const Inputs& x) { return F::linear(x[0], x[1], x[2]); },
                   [](const Refs& x) { return ref_linear(x[0], x[1], &x[2]); }});
  return cases;
}

inline std::vector<OpCase> reduction_cases() {
  std::vector<OpCase> cases;
  const std::pair<std::vector<int>, bool> axes_sets[] = {
      {{}, false},    {{}, true},    {{1}, false},     {{1}, true},       {{0, 2}, false},
      {{0, 2}, true}, {{-1}, false}, {{-3, -1}, true}, {{2, 0, 1}, false}};
  const std::pair<const char*, Reduction> kinds[] = {
      {"sum", Reduction::Sum}, {"mean", Reduction::Mean}, {"max", Reduction::Max}};
  for (const auto& [name, kind] : kinds) {
    for (const auto& [axes, keep] : axes_sets)
      cases.push_back(reduce_case(name, kind, {2, 3, 4}, axes, keep));
    cases.push_back(reduce_case(name, kind, {5}, {0}, false));
    cases.push_back(reduce_case(name, kind, {4, 1, 3}, {1}, false));
  }
  for (const auto& [name, kind] : kinds) {  // rows longer than the kernels' lanes
    cases.push_back(reduce_case(name, kind, {3, 40}, {-1}, false));
    cases.push_back(reduce_case(name, kind, {40, 3}, {0}, true));
    cases.push_back(reduce_case(name, kind, {70}, {}, false));
    cases.push_back(reduce_case(name, kind, {2, 35, 2}, {0, 2}, false));
  }
  cases.push_back(reduce_case("sum", Reduction::Sum, {}, {}, false));
  cases.push_back(reduce_case("sum", Reduction::Sum, {0, 3}, {0}, false));
  cases.push_back(reduce_case("sum", Reduction::Sum, {0, 3}, {}, false));
  for (const Dims& to : {Dims{3, 4}, Dims{2, 1, 4}, Dims{3, 1}, Dims{1}, Dims{}, Dims{2, 3, 4}})
    cases.push_back(
        {absl::StrCat("sum_to [2,3,4] -> ", dims_str(to)),
         {floating({2, 3, 4})},
         [to](const Inputs& x) { return F::sum_to(x[0], Shape(std::span<const int64_t>(to))); },
         [to](const Refs& x) { return ref_sum_to(x[0], to); }});
  return cases;
}

inline std::vector<OpCase> layout_cases() {
  std::vector<OpCase> cases;
  const std::pair<Dims, Dims> reshapes[] = {// (argument, resulting shape)
                                            {{4, 6}, {4, 6}},
                                            {{-1, 4}, {6, 4}},
                                            {{2, -1, 2, 2}, {2, 3, 2, 2}},
                                            {{24}, {24}},
                                            {{2, 3, 4}, {2, 3, 4}}};
  for (const auto& [arg, result] : reshapes)
    cases.push_back(
        {absl::StrCat("reshape [2,3,4] -> ", dims_str(arg)),
         {floating({2, 3, 4})},
         [arg](const Inputs& x) { return F::reshape(x[0], std::span<const int64_t>(arg)); },
         [result](const Refs& x) { return ref_reshape(x[0], result); }});
  cases.push_back({"reshape [1,1] -> [] (0-d)",
                   {floating({1, 1})},
                   [](const Inputs& x) { return F::reshape(x[0], std::span<const int64_t>()); },
                   [](const Refs& x) { return ref_reshape(x[0], {}); }});
  cases.push_back({"flatten [] (0-d) -> [1]",
                   {floating({})},
                   [](const Inputs& x) { return F::flatten(x[0]); },
                   [](const Refs& x) { return ref_reshape(x[0], {1}); }});
  cases.push_back(
      {"reshape (initializer list) then exp",
       {floating({2, 3})},
       [](const Inputs& x) {
         return F::exp(F::reshape(x[0], {3, 2}));
       },
       [](const Refs& x) {
         return ref::map(ref_reshape(x[0], {3, 2}), [](double v) { return std::exp(v); });
       }});
  const std::tuple<int, int, Dims> flattens[] = {
      {0, -1, {24}}, {1, 2, {2, 12}}, {0, 1, {6, 4}}, {-2, -1, {2, 12}}, {1, 1, {2, 3, 4}}};
  for (const auto& [s, e, result] : flattens)
    cases.push_back({absl::StrCat("flatten [2,3,4] ", s, "..", e),
                     {floating({2, 3, 4})},
                     [s, e](const Inputs& x) { return F::flatten(x[0], s, e); },
                     [result](const Refs& x) { return ref_reshape(x[0], result); }});
  for (const std::vector<int>& perm :
       {std::vector<int>{2, 0, 1}, {1, 2, 0}, {0, 2, 1}, {-1, -3, -2}, {0, 1, 2}}) {
    std::string p;
    for (int a : perm) absl::StrAppend(&p, p.empty() ? "" : ",", a);
    cases.push_back(
        {absl::StrCat("permute [2,3,4] {", p, "}"),
         {floating({2, 3, 4})},
         [perm](const Inputs& x) { return F::permute(x[0], std::span<const int>(perm)); },
         [perm](const Refs& x) { return ref_permute(x[0], perm); }});
  }
  cases.push_back({"permute (initializer list) [3,4]",
                   {floating({3, 4})},
                   [](const Inputs& x) {
                     return F::permute(x[0], {1, 0});
                   },
                   [](const Refs& x) {
                     return ref_permute(x[0], {1, 0});
                   }});
  cases.push_back({"transpose [2,3,4] default",
                   {floating({2, 3, 4})},
                   [](const Inputs& x) { return F::transpose(x[0]); },
                   [](const Refs& x) {
                     return ref_permute(x[0], {0, 2, 1});
                   }});
  cases.push_back({"transpose [2,3,4] 0,2",
                   {floating({2, 3, 4})},
                   [](const Inputs& x) { return F::transpose(x[0], 0, 2); },
                   [](const Refs& x) {
                     return ref_permute(x[0], {2, 1, 0});
                   }});
  // Tiled transposes: both of the last two dimensions >= 8, and past one 64-wide block.
  cases.push_back({"transpose [9,10]",
                   {floating({9, 10})},
                   [](const Inputs& x) { return F::transpose(x[0]); },
                   [](const Refs& x) {
                     return ref_permute(x[0], {1, 0});
                   }});
  cases.push_back({"transpose [70,9]",
                   {floating({70, 9})},
                   [](const Inputs& x) { return F::transpose(x[0]); },
                   [](const Refs& x) {
                     return ref_permute(x[0], {1, 0});
                   }});
  cases.push_back({"permute [2,9,8] {0,2,1}",
                   {floating({2, 9, 8})},
                   [](const Inputs& x) {
                     return F::permute(x[0], {0, 2, 1});
                   },
                   [](const Refs& x) {
                     return ref_permute(x[0], {0, 2, 1});
                   }});
  cases.push_back({"permute [8,2,9] {2,1,0}",
                   {floating({8, 2, 9})},
                   [](const Inputs& x) {
                     return F::permute(x[0], {2, 1, 0});
                   },
                   [](const Refs& x) {
                     return ref_permute(x[0], {2, 1, 0});
                   }});
  cases.push_back({"transpose [3,5]",
                   {floating({3, 5})},
                   [](const Inputs& x) { return F::transpose(x[0]); },
                   [](const Refs& x) {
                     return ref_permute(x[0], {1, 0});
                   }});
  const std::pair<Dims, Dims> broadcasts[] = {
      {{3}, {2, 3}}, {{2, 1, 4}, {2, 3, 4}}, {{}, {2, 2}}, {{3, 1}, {2, 3, 4}}, {{2, 3}, {2, 3}}};
  for (const auto& [from, to] : broadcasts)
    cases.push_back({absl::StrCat("broadcast_to ", dims_str(from), " -> ", dims_str(to)),
                     {floating(from)},
                     [to](const Inputs& x) {
                       return F::broadcast_to(x[0], Shape(std::span<const int64_t>(to)));
                     },
                     [to](const Refs& x) { return ref_broadcast_to(x[0], to); }});
  const std::tuple<std::vector<Dims>, int> concats[] = {{{{2, 3}, {1, 3}, {3, 3}}, 0},
                                                        {{{2, 3}, {2, 1}, {2, 2}}, 1},
                                                        {{{2, 2, 3}, {2, 1, 3}, {2, 3, 3}}, 1},
                                                        {{{2, 2}, {2, 3}, {2, 1}}, -1},
                                                        {{{2, 3}, {2, 0}, {2, 1}}, 1},
                                                        {{{0, 3}, {2, 3}}, 0},
                                                        {{{2, 3}}, 1}};
  for (const auto& [shapes, axis] : concats) {
    std::string name = absl::StrCat("concat axis ", axis, ":");
    std::vector<InputSpec> specs;
    for (const Dims& s : shapes) {
      absl::StrAppend(&name, " ", dims_str(s));
      specs.push_back(floating(s));
    }
    cases.push_back(
        {name, specs,
         [axis](const Inputs& x) { return F::concat(std::span<const Tensor>(x), axis); },
         [axis](const Refs& x) { return ref_concat(x, axis); }});
  }
  cases.push_back({"concat (initializer list), middle input constant",
                   {floating({2, 3}), constant({2, 3}), floating({1, 3})},
                   [](const Inputs& x) {
                     return F::concat({x[0], x[1], x[2]}, 0);
                   },
                   [](const Refs& x) { return ref_concat(x, 0); }});
  // split: the parts scaled by 1, 2, 3, ... and joined in reverse order, the last part left out
  // when `drop_last` (its gradient is zeros); more than 8 parts take a tree of split ops.
  const std::tuple<Dims, int, std::vector<int64_t>, bool> splits[] = {
      {{2, 8}, 1, {2, 2, 2, 2}, false}, {{5, 3}, 0, {1, 0, 4}, true},
      {{2, 3, 4}, 1, {1, 2}, false},    {{2, 20}, -1, std::vector<int64_t>(20, 1), true},
      {{3, 2}, 0, {3}, false}};
  for (const auto& [shape, axis, sizes, drop_last] : splits) {
    const int ax = axis < 0 ? axis + static_cast<int>(shape.size()) : axis;
    const auto used = static_cast<int64_t>(sizes.size()) - (drop_last ? 1 : 0);
    cases.push_back(
        {absl::StrCat("split ", dims_str(shape), " axis ", axis, " into ", sizes.size(),
                      drop_last ? " (last unused)" : ""),
         {floating(shape)},
         [=](const Inputs& x) {
           const std::vector<Tensor> parts = F::split(x[0], sizes, axis);
           std::vector<Tensor> picked;
           for (int64_t k = used - 1; k >= 0; --k)
             picked.push_back(F::mul(parts[static_cast<size_t>(k)], static_cast<double>(k + 1)));
           return F::concat(picked, axis);
         },
         [=](const Refs& x) {
           Refs picked;
           std::vector<int64_t> start(sizes.size(), 0);
           for (size_t k = 1; k < sizes.size(); ++k) start[k] = start[k - 1] + sizes[k - 1];
           for (int64_t k = used - 1; k >= 0; --k) {
             const auto i = static_cast<size_t>(k);
             RefTensor p = ref_slice(x[0], ax, start[i], start[i] + sizes[i], 1);
             for (double& v : p.v) v *= static_cast<double>(k + 1);
             picked.push_back(p);
           }
           return ref_concat(picked, ax);
         }});
  }
  const std::tuple<Dims, int, int64_t, int64_t, int64_t> slices[] = {
      {{5, 4}, 0, 1, 4, 1},     {{5, 4}, 1, 0, 4, 2},    {{5, 4}, 0, -3, 5, 1},
      {{5, 4}, -1, -3, 100, 2}, {{2, 5, 3}, 1, 1, 5, 2}, {{6}, 0, -100, -1, 2},
      {{5, 4}, 0, 3, 2, 1},     {{5, 4}, 0, 10, 20, 1},  {{5, 4}, 1, 0, 4, 5}};
  for (const auto& [shape, axis, start, stop, step] : slices)
    cases.push_back(
        {absl::StrCat("slice ", dims_str(shape), " axis ", axis, " ", start, ":", stop, ":", step),
         {floating(shape)},
         [=](const Inputs& x) { return F::slice(x[0], axis, start, stop, step); },
         [=](const Refs& x) { return ref_slice(x[0], axis, start, stop, step); }});
  return cases;
}

inline std::vector<OpCase> softmax_loss_cases() {
  std::vector<OpCase> cases;
  const std::pair<Dims, int> softmaxes[] = {{{3, 5}, -1}, {{3, 5}, 0},  {{2, 3, 4}, 1},
                                            {{4}, 0},     {{3, 1}, -1}, {{2, 40}, -1}};
  for (const auto& [shape, axis] : softmaxes) {
    const std::string where = absl::StrCat(" ", dims_str(shape), " axis ", axis);
    cases.push_back({absl::StrCat("softmax", where),
                     {floating(shape, uniform(-3, 3))},
                     [axis](const Inputs& x) { return F::softmax(x[0], axis); },
                     [axis](const Refs& x) { return ref_softmax(x[0], axis, false); }});
    cases.push_back({absl::StrCat("log_softmax", where),
                     {floating(shape, uniform(-3, 3))},
                     [axis](const Inputs& x) { return F::log_softmax(x[0], axis); },
                     [axis](const Refs& x) { return ref_softmax(x[0], axis, true); }});
  }
  // Large logits: exp would overflow without subtracting the maximum.
  cases.push_back({"softmax [4,6] large logits",
                   {floating({4, 6}, uniform(-100, 100))},
                   [](const Inputs& x) { return F::softmax(x[0]); },
                   [](const Refs& x) { return ref_softmax(x[0], 1, false); }});
  cases.push_back({"log_softmax [4,6] axis 0 large logits",
                   {floating({4, 6}, uniform(-100, 100))},
                   [](const Inputs& x) { return F::log_softmax(x[0], 0); },
                   [](const Refs& x) { return ref_softmax(x[0], 0, true); }});
  cases.push_back({"softmax_cross_entropy [5,3] large logits",
                   {floating({5, 3}, uniform(-80, 80)), int_input({5}, Kind::Int64, labels(3))},
                   [](const Inputs& x) { return F::softmax_cross_entropy(x[0], x[1]); },
                   [](const Refs& x) { return ref_cross_entropy(x[0], x[1], -1); }});
  const std::tuple<Kind, int64_t, int64_t> ce[] = {// label dtype, ignore label, ignored count
                                                   {Kind::Int32, -1, 2},
                                                   {Kind::Int64, -1, 2},
                                                   {Kind::Int32, -1, 0},
                                                   {Kind::Int64, -100, 3}};
  for (const auto& [kind, ignore, ignored] : ce) {
    const std::string labels_str = absl::StrCat(kind == Kind::Int32 ? "int32" : "int64",
                                                " labels, ignore ", ignore, " x", ignored);
    cases.push_back(
        {absl::StrCat("softmax_cross_entropy [6,4] ", labels_str),
         {floating({6, 4}, uniform(-3, 3)), int_input({6}, kind, labels(4, ignore, ignored))},
         [ignore](const Inputs& x) { return F::softmax_cross_entropy(x[0], x[1], ignore); },
         [ignore](const Refs& x) { return ref_cross_entropy(x[0], x[1], ignore); }});
    cases.push_back(
        {absl::StrCat("accuracy [6,4] ", labels_str),
         {constant({6, 4}, distinct(-3, 3)), int_input({6}, kind, labels(4, ignore, ignored))},
         [ignore](const Inputs& x) { return F::accuracy(x[0], x[1], ignore); },
         [ignore](const Refs& x) { return ref_accuracy(x[0], x[1], ignore); }});
  }
  auto mse = [](const Refs& x) {
    double s = 0;
    for (int64_t i = 0; i < x[0].numel(); ++i)
      s += (x[0].v[i] - x[1].v[i]) * (x[0].v[i] - x[1].v[i]);
    return RefTensor{{}, {s / static_cast<double>(x[0].numel())}};
  };
  cases.push_back({"mean_squared_error [3,4]",
                   {floating({3, 4}), floating({3, 4})},
                   [](const Inputs& x) { return F::mean_squared_error(x[0], x[1]); },
                   mse});
  cases.push_back({"mean_squared_error [2,3,2] constant target",
                   {floating({2, 3, 2}), constant({2, 3, 2})},
                   [](const Inputs& x) { return F::mean_squared_error(x[0], x[1]); },
                   mse});
  return cases;
}

inline std::vector<OpCase> selection_cases() {
  std::vector<OpCase> cases;
  const std::tuple<Dims, Dims, Dims> wheres[] = {
      {{2, 3}, {2, 3}, {2, 3}}, {{3}, {2, 3}, {}}, {{2, 1}, {3}, {2, 3}}, {{2, 3}, {}, {}}};
  for (const auto& [c, a, b] : wheres)
    cases.push_back(
        {absl::StrCat("where cond ", dims_str(c), " a ", dims_str(a), " b ", dims_str(b)),
         {bool_input(c), floating(a), floating(b)},
         [](const Inputs& x) { return F::where(x[0], x[1], x[2]); },
         [](const Refs& x) { return ref_where(x[0], x[1], x[2]); }});
  const std::pair<Dims, Dims> cmp_shapes[] = {{{2, 3}, {2, 3}}, {{2, 3}, {3}}, {{4, 1}, {1, 3}}};
  for (const auto& [a, b] : cmp_shapes) {
    for (Kind kind : {Kind::Floating, Kind::Int32, Kind::Int64}) {
      const std::string suffix = absl::StrCat(" ", dims_str(a), " x ", dims_str(b),
                                              kind == Kind::Floating ? ""
                                              : kind == Kind::Int32  ? " int32"
                                                                     : " int64");
      const std::vector<InputSpec> in = {{a, kind, integers(-1, 1), false},
                                         {b, kind, integers(-1, 1), false}};
      cases.push_back(
          {absl::StrCat("equal", suffix), in, [](const Inputs& x) { return F::equal(x[0], x[1]); },
           [](const Refs& x) {
             return ref::zip(x[0], x[1], [](double p, double q) { return p == q ? 1.0 : 0.0; });
           },
           DType::Bool});
      cases.push_back({absl::StrCat("greater", suffix), in,
                       [](const Inputs& x) { return F::greater(x[0], x[1]); },
                       [](const Refs& x) {
                         return ref::zip(x[0], x[1],
                                         [](double p, double q) { return p > q ? 1.0 : 0.0; });
                       },
                       DType::Bool});
    }
  }
  return cases;
}

// NaN inputs, with PyTorch's semantics: relu, leaky_relu, max and the softmax family give NaN
// wherever a NaN reaches (its whole row for softmax and log_softmax, the loss for
// cross-entropy). relu's gradient passes gy through a NaN (threshold_backward gives 0 only where
// y <= 0); leaky_relu's is slope * gy there (x > 0 is false); max's is torch.amax's, NaN over a
// slice whose maximum is NaN; accuracy's argmax is a row's first NaN (torch.argmax).
inline std::vector<OpCase> nan_cases() {
  std::vector<OpCase> cases;
  auto nan_str = [](const std::vector<int64_t>& at) {
    std::string s;
    for (int64_t i : at) absl::StrAppend(&s, s.empty() ? "" : ",", i);
    return absl::StrCat(" NaN at {", s, "}");
  };
  // f(x) elementwise, with gradient gy * df(x).
  auto elementwise = [&](const std::string& name, std::function<Tensor(const Tensor&)> fn,
                         std::function<double(double)> f, std::function<double(double)> df,
                         Dims shape, std::vector<int64_t> at) {
    OpCase c = unary_case(name, std::move(fn), std::move(f),
                          with_nan(signed_magnitude(0.01, 2), at), std::move(shape));
    c.name += nan_str(at);
    c.grad_reference = [df](const Refs& x, const RefTensor& gy) {
      RefTensor gx = x[0];
      for (int64_t i = 0; i < gx.numel(); ++i) gx.v[i] = gy.v[i] * df(x[0].v[i]);
      return Refs{gx};
    };
    return c;
  };
  auto relu = [](double v) { return std::isnan(v) ? v : v > 0 ? v : 0; };
  auto relu_grad = [relu](double v) { return relu(v) <= 0 ? 0.0 : 1.0; };
  for (const auto& [shape, at] :
       {std::pair<Dims, std::vector<int64_t>>{{5, 13}, {0, 7, 20, 64}}, {{3, 4}, {5}}}) {
    cases.push_back(elementwise("relu", F::relu, relu, relu_grad, shape, at));
    cases.push_back(elementwise(
        "leaky_relu", [](const Tensor& x) { return F::leaky_relu(x); },
        [](double v) { return v > 0 ? v : 0.01 * v; }, [](double v) { return v > 0 ? 1 : 0.01; },
        shape, at));
  }
  // These propagate NaN through their arithmetic (float32 tanh is encore's own).
  auto tanh_grad = [](double v) { return 1 - std::tanh(v) * std::tanh(v); };
  auto sigmoid_grad = [](double v) { return ref_sigmoid(v) * (1 - ref_sigmoid(v)); };
  auto exp = [](double v) { return std::exp(v); };
  cases.push_back(elementwise("tanh", F::tanh, [](double v) { return std::tanh(v); }, tanh_grad,
                              {5, 13}, {2, 40}));
  cases.push_back(elementwise("sigmoid", F::sigmoid, ref_sigmoid, sigmoid_grad, {5, 13}, {2, 40}));
  cases.push_back(elementwise("exp", F::exp, exp, exp, {3, 4}, {1}));
  cases.push_back(elementwise(
      "leaky_relu(slope 0.2)", [](const Tensor& x) { return F::leaky_relu(x, 0.2); },
      [](double v) { return v > 0 ? v : 0.2 * v; }, [](double v) { return v > 0 ? 1 : 0.2; },
      {2, 9}, {3, 17}));

  const std::tuple<Dims, std::vector<int>, bool, std::vector<int64_t>> maxes[] = {
      {{3, 40}, {-1}, false, {45, 119}},    // rows 1 and 2 (their last element), not row 0
      {{40, 3}, {0}, true, {0, 61}},        // columns 0 (its first element) and 1
      {{70}, {}, false, {33}},              //
      {{2, 3, 4}, {0, 2}, false, {5, 17}},  // slot 1 twice
      {{2, 3, 4}, {}, true, {23}}};
  for (const auto& [shape, axes, keep, at] : maxes) {
    OpCase c = reduce_case("max", Reduction::Max, shape, axes, keep);
    c.name += nan_str(at);
    c.inputs[0].gen = with_nan(distinct(-3, 3), at);
    c.grad_reference = [axes](const Refs& x, const RefTensor& gy) {
      return Refs{ref_max_grad(x[0], axes, gy)};
    };
    cases.push_back(std::move(c));
  }

  const std::tuple<Dims, int, std::vector<int64_t>> softmaxes[] = {
      {{3, 5}, -1, {7}},    // the middle of row 1
      {{3, 5}, 0, {0}},     // the first element of lane 0
      {{2, 40}, -1, {55}},  // a row longer than a vector
      {{2, 3, 4}, 1, {13}}};
  for (const auto& [shape, axis, at] : softmaxes) {
    for (bool log : {false, true}) {
      OpCase c{absl::StrCat(log ? "log_softmax " : "softmax ", dims_str(shape), " axis ", axis,
                            nan_str(at)),
               {floating(shape, with_nan(uniform(-3, 3), at))},
               [axis, log](const Inputs& x) {
                 return log ? F::log_softmax(x[0], axis) : F::softmax(x[0], axis);
               },
               [axis, log](const Refs& x) { return ref_softmax(x[0], axis, log); }};
      c.grad_reference = [axis, log](const Refs& x, const RefTensor& gy) {
        return Refs{ref_softmax_grad(x[0], axis, log, gy)};
      };
      cases.push_back(std::move(c));
    }
  }

  // Row 1 holds a NaN, and row 3 at its label; row 2 is ignored.
  const std::vector<int64_t> ce_at = {7, 15};
  OpCase ce{absl::StrCat("softmax_cross_entropy [4,5]", nan_str(ce_at)),
            {floating({4, 5}, with_nan(uniform(-3, 3), ce_at)),
             int_input({4}, Kind::Int64, fixed({1, 3, -1, 0}))},
            [](const Inputs& x) { return F::softmax_cross_entropy(x[0], x[1]); },
            [](const Refs& x) { return ref_cross_entropy(x[0], x[1], -1); }};
  ce.grad_reference = [](const Refs& x, const RefTensor& gy) {
    return Refs{ref_cross_entropy_grad(x[0], x[1], -1, gy), {}};
  };
  cases.push_back(std::move(ce));
  // A NaN in the ignored row only: the loss is finite. (Forward only: PyTorch's gradient of
  // that row is NaN, log_softmax's backward 0 - exp(NaN) * 0, where ours is 0.)
  const std::vector<int64_t> ce_clean_at = {12};
  OpCase ce_ignored{absl::StrCat("softmax_cross_entropy [4,5] ignored row", nan_str(ce_clean_at)),
                    {constant({4, 5}, with_nan(uniform(-3, 3), ce_clean_at)),
                     int_input({4}, Kind::Int32, fixed({4, 0, -1, 2}))},
                    [](const Inputs& x) { return F::softmax_cross_entropy(x[0], x[1]); },
                    [](const Refs& x) { return ref_cross_entropy(x[0], x[1], -1); }};
  cases.push_back(std::move(ce_ignored));

  // Each row's argmax is its first NaN: rows 0, 1 and 2 hit their labels only so.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  cases.push_back({"accuracy [4,3] NaN rows",
                   {constant({4, 3}, fixed({1, nan, 3, nan, 5, nan, 2, 1, nan, 0.5, 0.2, 0.1})),
                    int_input({4}, Kind::Int64, fixed({1, 0, 2, 0}))},
                   [](const Inputs& x) { return F::accuracy(x[0], x[1]); },
                   [](const Refs& x) { return ref_accuracy(x[0], x[1], -1); }});
  return cases;
}

// The Matmul kernel's contract beyond what the routine passes (equal ranks): a 2-D operand
// shared by every batch of a 3-D other, with and without transposes, on `device`.
inline void check_matmul_kernel_contract(Device device) {
  auto kernel = [device](const Tensor& a, const Tensor& b, bool ta, bool tb, const Shape& out) {
    Tensor c = empty(out, a.dtype(), device);
    dispatch(Op::Matmul, {a.to(device), b.to(device)}, {c}, AttrBlob::of(MatmulAttrs{ta, tb}));
    return c.to_vector<double>();
  };
  auto close = [](const std::vector<double>& got, const Tensor& want) {
    const std::vector<double> w = want.to_vector<double>();
    REQUIRE(got.size() == w.size());
    for (size_t i = 0; i < w.size(); ++i) CHECK(got[i] == Approx(w[i]).margin(1e-12));
  };
  const Tensor a3 = randn({2, 3, 4}, DType::Float64), b2 = randn({4, 5}, DType::Float64);
  const Tensor a2 = randn({3, 4}, DType::Float64), b3 = randn({2, 4, 5}, DType::Float64);
  const Tensor b3b = randn({2, 4, 5}, DType::Float64);
  close(kernel(a3, b2, false, false, {2, 3, 5}), F::matmul(a3, b2));
  close(kernel(a2, b3, false, false, {2, 3, 5}), F::matmul(a2, b3));
  close(kernel(a3, b3b, false, false, {2, 3, 5}), F::matmul(a3, b3b));
  const Tensor a3t = F::permute(a3, {0, 2, 1}), b2t = F::transpose(b2);  // [2,4,3], [5,4]
  close(kernel(a3t, b2, true, false, {2, 3, 5}), F::matmul(a3, b2));
  close(kernel(a3, b2t, false, true, {2, 3, 5}), F::matmul(a3, b2));
  close(kernel(a3t, b2t, true, true, {2, 3, 5}), F::matmul(a3, b2));
  close(kernel(F::transpose(a2), b3, true, false, {2, 3, 5}), F::matmul(a2, b3));
  close(kernel(a3t, F::permute(b3b, {0, 2, 1}), true, true, {2, 3, 5}), F::matmul(a3, b3b));
  close(kernel(F::transpose(a2), F::transpose(b2), true, true, {3, 5}), F::matmul(a2, b2));
}

}  // namespace encore::optest
