// The op test harness: one place where an op gets its tests, as ggml's test-backend-ops.
//
// An OpCase names its inputs (shape, dtype kind, how their values are drawn, whether they are
// differentiable), builds the output through the public routines, and computes the expected
// output with a reference written as plain C++ loops over doubles. check_op() then runs, on a
// device:
//   1. forward in float64 and float32 against the reference;
//   2. in float64, backward with a random upstream gradient gy against central differences of
//      L = sum(out * gy) for every element of every differentiable input;
//   3. in float32, backward against the float64 analytic gradients (loose tolerance).
// check_op_against_cpu() runs those on another device (cuda:0), then compares that device's
// outputs and gradients with the cpu's from the same inputs (DeviceTolerance).
//
//   OpCase c{"exp [2,3]", {floating({2, 3}, uniform(-2, 2))},
//            [](const Inputs& x) { return F::exp(x[0]); },
//            [](const Refs& x) { return ref::map(x[0], [](double v) { return std::exp(v); }); }};
//   check_op(c);
//
// A case whose inputs hold NaN sets grad_reference: central differences through a NaN are NaN,
// so its analytic gradients are checked against that reference instead.
//
// Floating input values are rounded to float32 when drawn, so both dtypes see the same values.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "encore/functions.h"

namespace encore::optest {

using Dims = std::vector<int64_t>;

// A tensor's values as the reference sees them: row-major doubles.
struct RefTensor {
  Dims shape;
  std::vector<double> v;

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t numel() const { return static_cast<int64_t>(v.size()); }
};
using Refs = std::vector<RefTensor>;
using Inputs = std::vector<Tensor>;

// ---- Index arithmetic for references ----------------------------------------------------

namespace ref {

inline int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

inline Dims unravel(int64_t flat, const Dims& d) {
  Dims idx(d.size());
  for (int i = static_cast<int>(d.size()) - 1; i >= 0; --i) {
    idx[i] = d[i] == 0 ? 0 : flat % d[i];
    flat = d[i] == 0 ? 0 : flat / d[i];
  }
  return idx;
}

inline int64_t ravel(const Dims& idx, const Dims& d) {
  int64_t flat = 0;
  for (size_t i = 0; i < d.size(); ++i) flat = flat * d[i] + idx[i];
  return flat;
}

// The flat index in a tensor of shape `d` of the element that broadcasts to `out_idx`.
inline int64_t broadcast_source(const Dims& out_idx, const Dims& d) {
  const size_t lead = out_idx.size() - d.size();
  int64_t flat = 0;
  for (size_t i = 0; i < d.size(); ++i) flat = flat * d[i] + (d[i] == 1 ? 0 : out_idx[lead + i]);
  return flat;
}

inline Dims broadcast_dims(const Dims& a, const Dims& b) {
  const size_t r = std::max(a.size(), b.size());
  Dims out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i + a.size() >= r ? a[i + a.size() - r] : 1;
    const int64_t db = i + b.size() >= r ? b[i + b.size() - r] : 1;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// max(a, b), NaN when either is (PyTorch's max, where std::max drops a NaN b).
inline double max_nan(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b);
}

inline RefTensor filled(const Dims& shape, double value = 0) {
  return {shape, std::vector<double>(numel(shape), value)};
}

template <typename Fn>
RefTensor map(const RefTensor& x, Fn f) {
  RefTensor y = x;
  for (double& v : y.v) v = f(v);
  return y;
}

// f(a, b) with NumPy broadcasting, by index arithmetic.
template <typename Fn>
RefTensor zip(const RefTensor& a, const RefTensor& b, Fn f) {
  RefTensor y = filled(broadcast_dims(a.shape, b.shape));
  for (int64_t i = 0; i < y.numel(); ++i) {
    const Dims idx = unravel(i, y.shape);
    y.v[i] = f(a.v[broadcast_source(idx, a.shape)], b.v[broadcast_source(idx, b.shape)]);
  }
  return y;
}

}  // namespace ref

// ---- Input specs ------------------------------------------------------------------------

enum class Kind { Floating, Int32, Int64, Bool };  // Floating: the dtype under test

// Draws n values.
using ValueGen = std::function<std::vector<double>(int64_t n, std::mt19937_64& rng)>;

struct InputSpec {
  Dims shape;
  Kind kind = Kind::Floating;
  ValueGen gen;
  bool differentiable = true;
};

inline double draw_uniform(std::mt19937_64& rng, double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng);
}

// U[lo, hi).
inline ValueGen uniform(double lo, double hi) {
  return [=](int64_t n, std::mt19937_64& rng) {
    std::vector<double> v(n);
    for (double& x : v) x = draw_uniform(rng, lo, hi);
    return v;
  };
}

// U[lo, hi) with lo > 0 (log, sqrt, negative powers).
inline ValueGen positive(double lo, double hi) {
  return uniform(lo, hi);
}

// |x| in [lo, hi) with a random sign: away from 0 (divisors, kinks of relu and leaky_relu).
inline ValueGen signed_magnitude(double lo, double hi) {
  return [=](int64_t n, std::mt19937_64& rng) {
    std::vector<double> v(n);
    for (double& x : v) x = (rng() & 1 ? 1 : -1) * draw_uniform(rng, lo, hi);
    return v;
  };
}

// n distinct values in [lo, hi) at least (hi - lo) / (2n) apart (max and argmax without ties).
inline ValueGen distinct(double lo, double hi) {
  return [=](int64_t n, std::mt19937_64& rng) {
    std::vector<double> v(n);
    const double step = (hi - lo) / static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) v[i] = lo + step * (i + draw_uniform(rng, 0.25, 0.75));
    std::shuffle(v.begin(), v.end(), rng);
    return v;
  };
}

// gen's values with NaN at the flat positions `at` (NaN semantics).
inline ValueGen with_nan(ValueGen gen, std::vector<int64_t> at) {
  return [gen = std::move(gen), at = std::move(at)](int64_t n, std::mt19937_64& rng) {
    std::vector<double> v = gen(n, rng);
    for (int64_t i : at) {
      REQUIRE(i < n);
      v[static_cast<size_t>(i)] = std::numeric_limits<double>::quiet_NaN();
    }
    return v;
  };
}

// Integers in [lo, hi] (comparisons with ties).
inline ValueGen integers(int64_t lo, int64_t hi) {
  return [=](int64_t n, std::mt19937_64& rng) {
    std::vector<double> v(n);
    for (double& x : v)
      x = static_cast<double>(std::uniform_int_distribution<int64_t>(lo, hi)(rng));
    return v;
  };
}

// Class labels in [0, classes), with `ignored` of them (never all) set to `ignore_label`.
inline ValueGen labels(int64_t classes, int64_t ignore_label = -1, int64_t ignored = 0) {
  return [=](int64_t n, std::mt19937_64& rng) {
    std::vector<double> v = integers(0, classes - 1)(n, rng);
    std::vector<int64_t> pos(n);
    for (int64_t i = 0; i < n; ++i) pos[i] = i;
    std::shuffle(pos.begin(), pos.end(), rng);
    for (int64_t i = 0; i < std::min(ignored, n - 1); ++i)
      v[pos[i]] = static_cast<double>(ignore_label);
    return v;
  };
}

// Exactly these values.
inline ValueGen fixed(std::vector<double> values) {
  return [=](int64_t n, std::mt19937_64&) {
    REQUIRE(static_cast<int64_t>(values.size()) == n);
    return values;
  };
}

inline InputSpec floating(Dims shape, ValueGen gen = uniform(-1, 1), bool differentiable = true) {
  return {std::move(shape), Kind::Floating, std::move(gen), differentiable};
}
// A floating input that gets no gradient.
inline InputSpec constant(Dims shape, ValueGen gen = uniform(-1, 1)) {
  return floating(std::move(shape), std::move(gen), false);
}
inline InputSpec int_input(Dims shape, Kind kind, ValueGen gen) {
  return {std::move(shape), kind, std::move(gen), false};
}
inline InputSpec bool_input(Dims shape) {
  return {std::move(shape), Kind::Bool, integers(0, 1), false};
}

// ---- Cases ------------------------------------------------------------------------------

// The gradients of a case's inputs (those not differentiable left empty) for upstream gradient gy.
using GradReference = std::function<Refs(const Refs& x, const RefTensor& gy)>;

struct OpCase {
  OpCase(std::string name, std::vector<InputSpec> inputs,
         std::function<Tensor(const Inputs&)> build,
         std::function<RefTensor(const Refs&)> reference,
         std::optional<DType> out_dtype = std::nullopt, double tol_scale = 1)
      : name(std::move(name)),
        inputs(std::move(inputs)),
        build(std::move(build)),
        reference(std::move(reference)),
        out_dtype(out_dtype),
        tol_scale(tol_scale) {}

  std::string name;
  std::vector<InputSpec> inputs;
  std::function<Tensor(const Inputs&)> build;       // through the public routines (F::...)
  std::function<RefTensor(const Refs&)> reference;  // plain loops over the input values
  std::optional<DType> out_dtype;                   // default: the floating dtype under test
  double tol_scale = 1;                             // widens every tolerance of this case
  GradReference grad_reference;                     // when set, replaces central differences
};

struct Tolerance {
  double rtol;
  double atol;
  bool ok(double got, double want) const {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want)) return got == want;
    return std::abs(got - want) <= atol + rtol * std::abs(want);
  }
};

inline Tolerance forward_tolerance(DType dt) {
  return dt == DType::Float64 ? Tolerance{1e-12, 1e-12} : Tolerance{1e-5, 1e-5};
}
inline constexpr double kGradEps = 1e-6;                   // central-difference step
inline constexpr Tolerance kNumericalGradTol{1e-6, 1e-6};  // float64 analytic vs numerical
inline constexpr Tolerance kFloat32GradTol{1e-3, 1e-4};    // float32 vs float64 analytic

// ---- Tensors to and from the device -----------------------------------------------------

inline DType dtype_of_kind(Kind k, DType floating_dtype) {
  switch (k) {
    case Kind::Floating:
      return floating_dtype;
    case Kind::Int32:
      return DType::Int32;
    case Kind::Int64:
      return DType::Int64;
    case Kind::Bool:
      return DType::Bool;
  }
  return floating_dtype;
}

// A tensor on `device` holding r's values. The bytes are written directly on the cpu, so no
// kernel is involved in making inputs; another device gets a copy of the cpu tensor.
inline Tensor make_tensor(const RefTensor& r, DType dtype, Device device) {
  if (device.type != DeviceType::CPU) return make_tensor(r, dtype, Device::cpu()).to(device);
  const Shape shape{std::span<const int64_t>(r.shape)};
  Tensor t = Tensor::empty(shape, dtype, device);
  for (int64_t i = 0; i < r.numel(); ++i) {
    switch (dtype) {
      case DType::Float32:
        t.data<float>()[i] = static_cast<float>(r.v[i]);
        break;
      case DType::Float64:
        t.data<double>()[i] = r.v[i];
        break;
      case DType::Int32:
        t.data<int32_t>()[i] = static_cast<int32_t>(r.v[i]);
        break;
      case DType::Int64:
        t.data<int64_t>()[i] = static_cast<int64_t>(r.v[i]);
        break;
      case DType::Bool:
        t.data<bool>()[i] = r.v[i] != 0;
        break;
    }
  }
  return t;
}

// The values of `t` on the host (to_vector copies a device tensor's values).
inline RefTensor read_back(const Tensor& t) {
  const auto d = t.shape().dims();
  return {Dims(d.begin(), d.end()), t.to_vector<double>()};
}

inline std::string dims_str(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) absl::StrAppend(&s, i ? "," : "", d[i]);
  return s + "]";
}

// How many elements of `got` differ from `want` (-1 when the sizes differ): equal means NaN where
// `want` holds NaN, else the same value with the same sign (-0 differs from +0).
inline int64_t count_unequal(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = std::isnan(want[i])
                          ? std::isnan(got[i])
                          : got[i] == want[i] && std::signbit(got[i]) == std::signbit(want[i]);
    bad += same ? 0 : 1;
  }
  return bad;
}

// Compares `got` with `want` elementwise; reports up to four mismatching elements (flat and
// multi-index) and makes one assertion. `what` says which tensor this is.
inline bool expect_close(const std::string& what, const RefTensor& got, const RefTensor& want,
                         Tolerance tol) {
  INFO(what);
  if (got.shape != want.shape) {
    FAIL_CHECK("shape is " << dims_str(got.shape) << ", expected " << dims_str(want.shape));
    return false;
  }
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (tol.ok(got.v[i], want.v[i])) continue;
    if (bad++ < 4) {
      std::ostringstream m;
      m.precision(17);
      m << "element " << i << " " << dims_str(ref::unravel(i, want.shape)) << ": got " << got.v[i]
        << ", expected " << want.v[i] << " (diff " << got.v[i] - want.v[i] << ")";
      FAIL_CHECK(m.str());
    }
  }
  INFO(bad << " of " << want.numel() << " elements differ beyond rtol " << tol.rtol << ", atol "
           << tol.atol);
  CHECK(bad == 0);
  return bad == 0;
}

// ---- The runner -------------------------------------------------------------------------

inline uint64_t seed_of(const std::string& name) {  // FNV-1a: stable across runs and platforms
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

inline std::string dtype_str(DType dt) {
  return std::string(name(dt));
}

// Draws the values of every input (floating ones rounded to float32).
inline Refs draw_inputs(const OpCase& c) {
  std::mt19937_64 rng(seed_of(c.name));
  Refs xs;
  for (const InputSpec& s : c.inputs) {
    RefTensor r{s.shape, s.gen(ref::numel(s.shape), rng)};
    if (s.kind == Kind::Floating)
      for (double& v : r.v) v = static_cast<double>(static_cast<float>(v));
    xs.push_back(std::move(r));
  }
  return xs;
}

inline Inputs make_inputs(const OpCase& c, const Refs& xs, DType dt, Device device,
                          bool requires_grad) {
  Inputs ts;
  for (size_t i = 0; i < xs.size(); ++i) {
    Tensor t = make_tensor(xs[i], dtype_of_kind(c.inputs[i].kind, dt), device);
    if (requires_grad && c.inputs[i].differentiable) t.set_requires_grad();
    ts.push_back(t);
  }
  return ts;
}

inline bool has_floating_input(const OpCase& c) {
  for (const InputSpec& s : c.inputs)
    if (s.kind == Kind::Floating) return true;
  return false;
}

inline bool has_differentiable_input(const OpCase& c) {
  for (const InputSpec& s : c.inputs)
    if (s.differentiable) return true;
  return false;
}

inline Tolerance scaled(Tolerance t, double s) {
  return {t.rtol * s, t.atol * s};
}

// Forward in `dt` against the reference.
inline void check_forward(const OpCase& c, const Refs& xs, DType dt, Device device) {
  INFO("forward in " << dtype_str(dt) << " on " << device.str());
  Tensor out;
  try {
    NoGradGuard no_grad;
    out = c.build(make_inputs(c, xs, dt, device, false));
  } catch (const std::exception& e) {
    FAIL_CHECK("forward threw: " << e.what());
    return;
  }
  const DType want_dtype = c.out_dtype.value_or(dt);
  CHECK(dtype_str(out.dtype()) == dtype_str(want_dtype));
  CHECK(out.device() == device);
  const Tolerance tol =
      is_floating(want_dtype) ? scaled(forward_tolerance(dt), c.tol_scale) : Tolerance{0, 0};
  expect_close("output", read_back(out), c.reference(xs), tol);
}

// sum(out * gy) in float64 for the input values `xs` (no graph).
inline double weighted_sum(const OpCase& c, const Refs& xs, const RefTensor& gy, Device device) {
  NoGradGuard no_grad;
  const RefTensor out = read_back(c.build(make_inputs(c, xs, DType::Float64, device, false)));
  double l = 0;
  for (int64_t i = 0; i < out.numel(); ++i) l += out.v[i] * gy.v[i];
  return l;
}

// Backward in `dt` with upstream gradient gy; the gradient of each input (empty when the input
// is not differentiable or backward failed).
inline std::optional<Refs> analytic_gradients(const OpCase& c, const Refs& xs, const RefTensor& gy,
                                              DType dt, Device device) {
  INFO("backward in " << dtype_str(dt) << " on " << device.str());
  Inputs ts;
  try {
    ts = make_inputs(c, xs, dt, device, true);
    const Tensor out = c.build(ts);
    if (dims_str(read_back(out).shape) != dims_str(gy.shape)) {
      FAIL_CHECK("output shape " << out.shape().str() << " differs from " << dims_str(gy.shape));
      return std::nullopt;
    }
    out.backward(make_tensor(gy, dt, device));
  } catch (const std::exception& e) {
    FAIL_CHECK("backward threw: " << e.what());
    return std::nullopt;
  }
  for (size_t i = 0; i < xs.size(); ++i) {  // forward and backward leave their inputs alone
    INFO("input " << i << " after backward");
    expect_close("input values", read_back(ts[i]), xs[i], Tolerance{0, 0});
  }
  Refs grads(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    INFO("input " << i);
    const Tensor g = ts[i].grad();
    if (!c.inputs[i].differentiable) {
      CHECK_FALSE(g.defined());
      continue;
    }
    if (!g.defined()) {
      FAIL_CHECK("no gradient reached the input");
      return std::nullopt;
    }
    CHECK(dtype_str(g.dtype()) == dtype_str(dt));
    CHECK(g.device() == device);
    grads[i] = read_back(g);
  }
  return grads;
}

// Central differences of sum(out * gy) with respect to every element of input i.
inline RefTensor numerical_gradient(const OpCase& c, const Refs& xs, size_t i, const RefTensor& gy,
                                    Device device) {
  RefTensor g = ref::filled(xs[i].shape);
  Refs x = xs;
  for (int64_t j = 0; j < xs[i].numel(); ++j) {
    x[i].v[j] = xs[i].v[j] + kGradEps;
    const double up = weighted_sum(c, x, gy, device);
    x[i].v[j] = xs[i].v[j] - kGradEps;
    const double down = weighted_sum(c, x, gy, device);
    x[i].v[j] = xs[i].v[j];
    g.v[j] = (up - down) / (2 * kGradEps);
  }
  return g;
}

// The upstream gradient of a case: random values (rounded to float32) of the output's shape, which
// a float64 forward on `device` gives (empty when it throws).
inline std::optional<RefTensor> upstream_gradient(const OpCase& c, const Refs& xs, Device device) {
  RefTensor gy;
  try {
    NoGradGuard no_grad;
    gy.shape = read_back(c.build(make_inputs(c, xs, DType::Float64, device, false))).shape;
  } catch (const std::exception& e) {
    FAIL_CHECK("forward threw: " << e.what());
    return std::nullopt;
  }
  std::mt19937_64 rng(seed_of(c.name) + 1);
  gy.v = uniform(-1, 1)(ref::numel(gy.shape), rng);
  for (double& v : gy.v) v = static_cast<double>(static_cast<float>(v));
  return gy;
}

inline void check_gradients(const OpCase& c, const Refs& xs, Device device) {
  const std::optional<RefTensor> upstream = upstream_gradient(c, xs, device);
  if (!upstream) return;
  const RefTensor& gy = *upstream;

  const std::optional<Refs> g64 = analytic_gradients(c, xs, gy, DType::Float64, device);
  if (!g64) return;
  const Refs want = c.grad_reference ? c.grad_reference(xs, gy) : Refs{};
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!c.inputs[i].differentiable) continue;
    if (c.grad_reference) {
      expect_close(absl::StrCat("float64 gradient of input ", i, " vs the reference"), (*g64)[i],
                   want[i], scaled(kNumericalGradTol, c.tol_scale));
      continue;
    }
    RefTensor num;
    try {
      num = numerical_gradient(c, xs, i, gy, device);
    } catch (const std::exception& e) {
      FAIL_CHECK("numerical gradient threw: " << e.what());
      return;
    }
    expect_close(absl::StrCat("float64 gradient of input ", i, " vs central differences"),
                 (*g64)[i], num, scaled(kNumericalGradTol, c.tol_scale));
  }
  const std::optional<Refs> g32 = analytic_gradients(c, xs, gy, DType::Float32, device);
  if (!g32) return;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!c.inputs[i].differentiable) continue;
    expect_close(absl::StrCat("float32 gradient of input ", i, " vs float64 gradient"), (*g32)[i],
                 (*g64)[i], scaled(kFloat32GradTol, c.tol_scale));
  }
}

// Runs every check of one case on `device`.
inline void check_op(const OpCase& c, Device device = Device::cpu()) {
  INFO("op case: " << c.name);
  const Refs xs = draw_inputs(c);
  check_forward(c, xs, DType::Float64, device);
  if (has_floating_input(c)) check_forward(c, xs, DType::Float32, device);
  if (has_differentiable_input(c)) check_gradients(c, xs, device);
}

// The devices the cpu tests run every case on. (The CUDA tests run the same cases on cuda:0 with
// check_ops_against_cpu, in their own binary, which is skipped without a GPU.)
inline std::vector<Device> devices_under_test() {
  return {Device::cpu()};
}

inline void check_ops(const std::vector<OpCase>& cases,
                      const std::vector<Device>& devices = devices_under_test()) {
  for (const Device& device : devices)
    for (const OpCase& c : cases) check_op(c, device);
}

// ---- A device against the cpu -----------------------------------------------------------

// How far a device's results may be from the cpu's on the same inputs in the same dtype (another
// summation order, other math libraries). A case's tol_scale widens these too.
struct DeviceTolerance {
  Tolerance forward64{1e-10, 1e-12};
  Tolerance forward32{1e-5, 1e-5};
  Tolerance grad64{1e-10, 1e-11};
  Tolerance grad32{1e-4, 1e-5};
};

// The forward in `dt` on `device` against the cpu's from the same inputs.
inline void check_forward_against_cpu(const OpCase& c, const Refs& xs, DType dt, Device device,
                                      const DeviceTolerance& tol) {
  INFO("forward in " << dtype_str(dt) << " on " << device.str() << " against the cpu");
  Tensor got, want;
  try {
    NoGradGuard no_grad;
    want = c.build(make_inputs(c, xs, dt, Device::cpu(), false));
    got = c.build(make_inputs(c, xs, dt, device, false));
  } catch (const std::exception& e) {
    FAIL_CHECK("forward threw: " << e.what());
    return;
  }
  CHECK(dtype_str(got.dtype()) == dtype_str(want.dtype()));
  CHECK(got.device() == device);
  const Tolerance t = !is_floating(want.dtype()) ? Tolerance{0, 0}
                      : dt == DType::Float64     ? tol.forward64
                                                 : tol.forward32;
  expect_close("output against the cpu's", read_back(got), read_back(want), scaled(t, c.tol_scale));
}

// The gradients of every differentiable input in both dtypes on `device` against the cpu's, with
// the same upstream gradient.
inline void check_gradients_against_cpu(const OpCase& c, const Refs& xs, Device device,
                                        const DeviceTolerance& tol) {
  const std::optional<RefTensor> gy = upstream_gradient(c, xs, Device::cpu());
  if (!gy) return;
  for (DType dt : {DType::Float64, DType::Float32}) {
    const std::optional<Refs> want = analytic_gradients(c, xs, *gy, dt, Device::cpu());
    const std::optional<Refs> got = analytic_gradients(c, xs, *gy, dt, device);
    if (!want || !got) continue;
    const Tolerance t = scaled(dt == DType::Float64 ? tol.grad64 : tol.grad32, c.tol_scale);
    for (size_t i = 0; i < xs.size(); ++i) {
      if (!c.inputs[i].differentiable) continue;
      expect_close(absl::StrCat(dtype_str(dt), " gradient of input ", i, " on ", device.str(),
                                " against the cpu's"),
                   (*got)[i], (*want)[i], t);
    }
  }
}

// The outputs (both dtypes) and gradients of a case on `device` against the cpu's from the same
// inputs. The case's reference is not used.
inline void compare_with_cpu(const OpCase& c, Device device,
                             const DeviceTolerance& tol = DeviceTolerance{}) {
  INFO("op case: " << c.name);
  const Refs xs = draw_inputs(c);
  check_forward_against_cpu(c, xs, DType::Float64, device, tol);
  if (has_floating_input(c)) check_forward_against_cpu(c, xs, DType::Float32, device, tol);
  if (has_differentiable_input(c)) check_gradients_against_cpu(c, xs, device, tol);
}

// Every check of check_op on `device` (against the reference, numerical gradients in float64),
// then compare_with_cpu.
inline void check_op_against_cpu(const OpCase& c, Device device,
                                 const DeviceTolerance& tol = DeviceTolerance{}) {
  check_op(c, device);
  compare_with_cpu(c, device, tol);
}

inline void check_ops_against_cpu(const std::vector<OpCase>& cases, Device device,
                                  const DeviceTolerance& tol = DeviceTolerance{}) {
  for (const OpCase& c : cases) check_op_against_cpu(c, device, tol);
}

}  // namespace encore::optest
