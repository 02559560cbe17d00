// Runs random programs (random_program.h) under static_graph on a device and checks every call
// against the same program run eagerly on the same inputs; see run_random_programs().
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "encore/functions.h"
#include "encore/static_graph.h"
#include "random_program.h"
#include "random_program_gen.h"
#include "runtime/autograd.h"
#include "runtime/cuda.h"
#include "runtime/rng.h"

namespace encore::random_program {

inline constexpr uint64_t kDefaultSeed = 20240601;

// ---- The interpreter --------------------------------------------------------------------

// `states` holds the running mean and variance of pair i at 2i and 2i + 1.
inline Tensor apply_step(const Step& s, const std::vector<Tensor>& v,
                         const std::vector<Tensor>& states) {
  const auto in = [&](size_t i) -> const Tensor& { return v[s.in[i]]; };
  const auto axes = [&] { return std::vector<int>(s.ints.begin(), s.ints.end()); };
  const auto ax = [&](size_t i) { return static_cast<int>(s.ints[i]); };
  switch (s.op) {
    case OpKind::Add:
      return F::add(in(0), in(1));
    case OpKind::Sub:
      return F::sub(in(0), in(1));
    case OpKind::Mul:
      return F::mul(in(0), in(1));
    case OpKind::DivSigmoid:
      return F::div(in(0), F::add(F::sigmoid(in(1)), 1.5));
    case OpKind::DivExp:
      return F::div(in(0), F::exp(F::tanh(in(1))));
    case OpKind::AddScalar:
      return F::add(in(0), s.scalar);
    case OpKind::SubScalar:
      return F::sub(in(0), s.scalar);
    case OpKind::RsubScalar:
      return F::sub(s.scalar, in(0));
    case OpKind::MulScalar:
      return F::mul(in(0), s.scalar);
    case OpKind::DivScalar:
      return F::div(in(0), s.scalar);
    case OpKind::RdivScalar:
      return F::div(s.scalar, F::add(F::mul(in(0), in(0)), 1.0));
    case OpKind::Neg:
      return F::neg(in(0));
    case OpKind::ExpTanh:
      return F::exp(F::tanh(in(0)));
    case OpKind::LogSq:
      return F::log(F::add(F::mul(in(0), in(0)), 1.0));
    case OpKind::SqrtSq:
      return F::sqrt(F::add(F::mul(in(0), in(0)), 1.0));
    case OpKind::PowSq:
      return F::pow(F::add(F::mul(in(0), in(0)), 1.0), s.scalar);
    case OpKind::Relu:
      return F::relu(in(0));
    case OpKind::LeakyRelu:
      return s.scalar == 0.01 ? F::leaky_relu(in(0)) : F::leaky_relu(in(0), s.scalar);
    case OpKind::Sigmoid:
      return F::sigmoid(in(0));
    case OpKind::Tanh:
      return F::tanh(in(0));
    case OpKind::Gelu:
      return s.scalar == 0 ? F::gelu(in(0)) : F::gelu(in(0), "tanh");
    case OpKind::Matmul:
      return F::matmul(in(0), in(1));
    case OpKind::LayerNorm: {
      const int k = static_cast<int>(ax(0)), affine = static_cast<int>(ax(1));
      const Shape& sx = in(0).shape();
      std::vector<int64_t> normalized(sx.dims().end() - k, sx.dims().end());
      const Tensor gamma = affine & 1 ? in(1) : Tensor();
      const Tensor beta = affine & 2 ? in(affine & 1 ? 2 : 1) : Tensor();
      return F::layer_norm(in(0), normalized, gamma, beta, s.scalar);
    }
    case OpKind::MaskedFill:
      return F::masked_fill(in(0), F::greater(in(1), zeros({}, in(1).dtype(), in(1).device())),
                            s.scalar);
    case OpKind::Linear:
      return s.flag ? F::linear(in(0), in(1), in(2)) : F::linear(in(0), in(1));
    case OpKind::Sum:
      return F::sum(in(0), axes(), s.flag);
    case OpKind::Mean:
      return F::mean(in(0), axes(), s.flag);
    case OpKind::Max:
      return F::max(in(0), axes(), s.flag);
    case OpKind::Reshape:
      return F::reshape(in(0), std::span<const int64_t>(s.ints));
    case OpKind::Flatten:
      return F::flatten(in(0), ax(0), ax(1));
    case OpKind::Transpose:
      return s.flag ? F::transpose(in(0)) : F::transpose(in(0), ax(0), ax(1));
    case OpKind::Permute: {
      const std::vector<int> perm = axes();
      return F::permute(in(0), std::span<const int>(perm));
    }
    case OpKind::BroadcastTo:
      return F::broadcast_to(in(0), Shape(std::span<const int64_t>(s.ints)));
    case OpKind::Concat: {
      std::vector<Tensor> xs;
      for (int id : s.in) xs.push_back(v[id]);
      return F::concat(std::span<const Tensor>(xs), ax(0));
    }
    case OpKind::Slice:
      return F::slice(in(0), ax(0), s.ints[1], s.ints[2], s.ints[3]);
    case OpKind::Softmax:
      return F::softmax(in(0), ax(0));
    case OpKind::LogSoftmax:
      return F::log_softmax(in(0), ax(0));
    case OpKind::Mse:
      return F::mean_squared_error(in(0), in(1));
    case OpKind::CrossEntropy:
      return F::softmax_cross_entropy(in(0), in(1));
    case OpKind::Conv2d: {
      const Size2 stride(ax(0), ax(1)), padding(ax(2), ax(3)), dilation(ax(4), ax(5));
      if (!s.flag && ax(6) == 1 && stride == Size2(1) && padding == Size2(0) &&
          dilation == Size2(1))
        return F::conv2d(in(0), in(1));
      return F::conv2d(in(0), in(1), s.flag ? in(2) : Tensor(), stride, padding, dilation, ax(6));
    }
    case OpKind::MaxPool2d:
    case OpKind::AvgPool2d: {
      const Size2 kernel(ax(0), ax(1)), padding(ax(4), ax(5));
      std::optional<Size2> stride;
      if (s.flag) stride = Size2(ax(2), ax(3));
      if (s.op == OpKind::MaxPool2d)
        return !s.flag && padding == Size2(0) ? F::max_pool2d(in(0), kernel)
                                              : F::max_pool2d(in(0), kernel, stride, padding);
      if (!s.flag && padding == Size2(0) && ax(6) == 1) return F::avg_pool2d(in(0), kernel);
      return F::avg_pool2d(in(0), kernel, stride, padding, ax(6) == 1);
    }
    case OpKind::GlobalAvgPool2d:
      return F::global_avg_pool2d(in(0));
    case OpKind::BatchNorm: {
      const int state = ax(0);
      const Tensor none;
      const Tensor& mean = state >= 0 ? states[2 * state] : none;
      const Tensor& var = state >= 0 ? states[2 * state + 1] : none;
      return ax(2) ? F::batch_norm(in(0), mean, var, in(1), in(2), ax(1) == 1, s.scalar, s.scalar2)
                   : F::batch_norm(in(0), mean, var, none, none, ax(1) == 1, s.scalar, s.scalar2);
    }
    case OpKind::Dropout:
      return F::dropout(in(0), s.scalar, s.flag);
  }
  throw std::logic_error("unknown op");
}

// Runs the program on `args` with the captured `params` and running statistics `states`; with
// `check_shapes`, throws when a result's shape is not the one the generator planned (a
// generator bug). `values`, when given, receives every value of the program.
inline std::vector<Tensor> run_program(const Program& p, std::span<const Tensor> args,
                                       const std::vector<Tensor>& params,
                                       const std::vector<Tensor>& states, bool check_shapes,
                                       std::vector<Tensor>* values = nullptr) {
  std::vector<Tensor> v(p.values.size());
  for (const Leaf& l : p.leaves) v[l.value] = l.param ? params[l.index] : args[l.index];
  for (const Step& s : p.steps) {
    v[s.out] = apply_step(s, v, states);
    if (check_shapes &&
        !(v[s.out].shape() == Shape(std::span<const int64_t>(p.values[s.out].shape))))
      throw std::logic_error(absl::StrCat("generator: step %", s.out, " gave ",
                                          v[s.out].shape().str(), ", planned ",
                                          dims_str(p.values[s.out].shape)));
  }
  std::vector<Tensor> out;
  for (int o : p.outputs) out.push_back(v[o]);
  if (values != nullptr) *values = std::move(v);
  return out;
}

// ---- Inputs and comparison --------------------------------------------------------------

// The values of every leaf and output gradient of one call, drawn from (seed, call).
struct CallData {
  std::vector<std::vector<double>> leaves;   // by leaf
  std::vector<std::vector<double>> grads;    // by output
  std::vector<std::vector<double>> presets;  // by leaf: a .grad it has before the call
};

inline double draw(std::mt19937_64& rng, double lo, double hi) {
  return lo + (hi - lo) * (static_cast<double>(rng() >> 11) * 0x1.0p-53);
}

inline CallData draw_call(const Program& p, int call) {
  std::mt19937_64 rng(p.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(call) + 1);
  CallData d;
  for (const Leaf& l : p.leaves) {
    const Value& v = p.values[l.value];
    std::vector<double> x(numel_of(v.shape));
    if (v.labels) {
      for (double& e : x) e = static_cast<double>(rng() % static_cast<uint64_t>(l.classes));
      if (l.ignores_some)
        for (size_t i = 1; i < x.size(); ++i)  // element 0 is never ignored
          if (rng() % 3 == 0) x[i] = -1;
    } else {
      for (double& e : x) e = l.param ? draw(rng, -1, 1) : draw(rng, -2, 2);
    }
    std::vector<double> g(x.size());
    for (double& e : g) e = draw(rng, -1, 1);
    d.leaves.push_back(std::move(x));
    d.presets.push_back(std::move(g));
  }
  for (int o : p.outputs) {
    std::vector<double> g(numel_of(p.values[o].shape));
    for (double& e : g) e = draw(rng, -1, 1);
    d.grads.push_back(std::move(g));
  }
  return d;
}

// The running statistics of every pair (means in [-1, 1], variances in [0.5, 1.5]), by
// tensor: the mean of pair i at 2i, its variance at 2i + 1.
inline std::vector<std::vector<double>> draw_states(const Program& p, int call) {
  std::mt19937_64 rng(p.seed * 0xC2B2AE3D27D4EB4Full + static_cast<uint64_t>(call) + 7);
  std::vector<std::vector<double>> d;
  for (int64_t c : p.states) {
    std::vector<double> mean(c), var(c);
    for (double& e : mean) e = draw(rng, -1, 1);
    for (double& e : var) e = draw(rng, 0.5, 1.5);
    d.push_back(std::move(mean));
    d.push_back(std::move(var));
  }
  return d;
}

template <typename T>
inline void write_as(const Tensor& t, const std::vector<double>& x) {
  T* d = static_cast<T*>(t.raw_data());
  for (size_t i = 0; i < x.size(); ++i) d[i] = static_cast<T>(x[i]);
}

// A tensor on `device` holding x, written directly on the cpu (no op) and copied to another device.
inline Tensor make_tensor(const std::vector<double>& x, const Dims& dims, DType dtype,
                          Device device) {
  if (device.type != DeviceType::CPU) return make_tensor(x, dims, dtype, Device::cpu()).to(device);
  Tensor t = Tensor::empty(Shape(std::span<const int64_t>(dims)), dtype);
  if (dtype == DType::Float32) write_as<float>(t, x);
  if (dtype == DType::Float64) write_as<double>(t, x);
  if (dtype == DType::Int32) write_as<int32_t>(t, x);
  if (dtype == DType::Int64) write_as<int64_t>(t, x);
  return t;
}

inline Tensor make_leaf(const Program& p, const Leaf& l, const std::vector<double>& x,
                        Device device) {
  const Value& v = p.values[l.value];
  Tensor t = make_tensor(x, v.shape, v.labels ? l.label_dtype : p.dtype, device);
  if (v.requires_grad) t.set_requires_grad();
  return t;
}

// Makes argument alias_arg the tensor of argument alias_of, or puts both into one storage as
// views alias_shift elements apart (alias_of's values win where they overlap).
inline void alias_args(const Program& p, std::vector<Tensor>& args) {
  if (p.alias_same) {
    args[p.alias_arg] = args[p.alias_of];
    return;
  }
  const Tensor a = args[p.alias_of], b = args[p.alias_arg];
  const int64_t shift = p.alias_shift;
  const Device device = a.device();
  const size_t item = itemsize(a.dtype());
  Tensor base = Tensor::empty(Shape{std::max(a.numel(), shift + b.numel())}, a.dtype(), device);
  char* at = static_cast<char*>(base.raw_data());
  cuda::copy_bytes(at + shift * item, device, b.raw_data(), device, b.nbytes());
  cuda::copy_bytes(at, device, a.raw_data(), device, a.nbytes());
  auto view = [&base](const Tensor& like, int64_t offset) {
    Tensor v(make_intrusive<TensorImpl>(base.impl()->storage, offset, like.shape(), like.dtype()));
    if (like.requires_grad()) v.set_requires_grad();
    return v;
  };
  args[p.alias_of] = view(a, 0);
  args[p.alias_arg] = view(b, shift);
}

// The arguments of one call, in argument order.
inline std::vector<Tensor> make_args(const Program& p, const CallData& d, Device device) {
  std::vector<Tensor> args(p.num_args);
  for (size_t i = 0; i < p.leaves.size(); ++i)
    if (!p.leaves[i].param)
      args[p.leaves[i].index] = make_leaf(p, p.leaves[i], d.leaves[i], device);
  if (p.alias_arg >= 0) alias_args(p, args);
  return args;
}

inline std::vector<Tensor> make_params(const Program& p, const CallData& d, Device device) {
  std::vector<Tensor> params(p.num_params);
  for (size_t i = 0; i < p.leaves.size(); ++i)
    if (p.leaves[i].param)
      params[p.leaves[i].index] = make_leaf(p, p.leaves[i], d.leaves[i], device);
  return params;
}

inline std::vector<Tensor> make_states(const Program& p, const std::vector<std::vector<double>>& d,
                                       Device device) {
  std::vector<Tensor> states;
  for (size_t i = 0; i < d.size(); ++i)
    states.push_back(make_tensor(d[i], {p.states[i / 2]}, p.dtype, device));
  return states;
}

inline std::string state_name(size_t i) {
  return absl::StrCat("running ", i % 2 ? "var" : "mean", " of state", i / 2);
}

// The position of a device's generator (dropout draws from the generator of its tensor's device).
struct GenState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  bool operator==(const GenState&) const = default;
  std::string str() const { return absl::StrCat("(seed ", seed, ", offset ", offset, ")"); }
};

inline GenState gen_state(Device device) {
  const Generator::Stream s = default_generator(device).state();
  return {s.seed, s.offset};
}

inline void set_gen_state(Device device, const GenState& s) {
  default_generator(device).set_state(s.seed, s.offset);
}

// A copy of t's bytes on the cpu (no op, no graph): t's own storage for a cpu tensor.
inline Tensor host(const Tensor& t) {
  if (!t.defined() || t.device().type == DeviceType::CPU) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  if (t.nbytes() > 0)
    cuda::copy_bytes(h.raw_data(), Device::cpu(), t.raw_data(), t.device(), t.nbytes());
  return h;
}

// A copy of t's bytes on the cpu in storage of its own (no op, no graph).
inline Tensor snapshot(const Tensor& t) {
  if (t.device().type != DeviceType::CPU) return host(t);
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  std::memcpy(c.raw_data(), t.raw_data(), t.nbytes());
  return c;
}

inline double element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::Float32:
      return static_cast<const float*>(t.raw_data())[i];
    case DType::Float64:
      return static_cast<const double*>(t.raw_data())[i];
    default:
      return 0;
  }
}

// Empty when `got` and `want` are both undefined or have the same device, dtype, shape and bytes.
inline std::string difference(const Tensor& got, const Tensor& want) {
  if (got.defined() != want.defined())
    return absl::StrCat("static is ", got.defined() ? got.str() : "undefined", ", eager is ",
                        want.defined() ? want.str() : "undefined");
  if (!got.defined()) return "";
  if (got.dtype() != want.dtype() || !(got.shape() == want.shape()) ||
      got.device() != want.device())
    return absl::StrCat("static is ", got.str(), ", eager is ", want.str());
  if (got.device().type != DeviceType::CPU) return difference(host(got), host(want));
  if (std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()) == 0) return "";
  const size_t item = itemsize(got.dtype());
  int64_t first = -1, count = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(static_cast<const char*>(got.raw_data()) + i * item,
                    static_cast<const char*>(want.raw_data()) + i * item, item) == 0)
      continue;
    if (first < 0) first = i;
    ++count;
  }
  std::ostringstream m;
  m.precision(17);
  m << count << " of " << got.numel() << " elements of " << got.shape().str()
    << " differ; first: element " << first << ", static " << element(got, first) << ", eager "
    << element(want, first);
  return m.str();
}

class Checker {
 public:
  void same(const std::string& what, const Tensor& got, const Tensor& want) {
    const std::string d = difference(got, want);
    if (!d.empty()) problems_.push_back(absl::StrCat(what, ": ", d));
  }
  void expect(bool ok, const std::string& what) {
    if (!ok) problems_.push_back(what);
  }
  bool ok() const { return problems_.empty(); }
  std::string text() const {
    std::string s;
    for (size_t i = 0; i < problems_.size() && i < 12; ++i) absl::StrAppend(&s, problems_[i], "\n");
    if (problems_.size() > 12) absl::StrAppend(&s, "... ", problems_.size() - 12, " more\n");
    return s;
  }

 private:
  std::vector<std::string> problems_;
};

inline void backward(const Program& p, const std::vector<Tensor>& outs, const CallData& d,
                     Device device) {
  std::vector<Tensor> roots, grads;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!p.values[p.outputs[i]].requires_grad) continue;
    roots.push_back(outs[i]);
    grads.push_back(make_tensor(d.grads[i], p.values[p.outputs[i]].shape, p.dtype, device));
  }
  if (p.scalar_loss) {
    Tensor loss;
    for (const Tensor& r : roots) loss = loss.defined() ? F::add(loss, F::sum(r)) : F::sum(r);
    loss.backward();
  } else {
    autograd::backward(roots, grads, false);
  }
}

template <size_t>
using TensorArg = Tensor;

// The static side of a program, for any argument count.
struct StaticRun {
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> call;
  std::function<StaticStats()> stats;
};

template <size_t... I>
inline void with_static(const Program& p, const std::vector<Tensor>& params,
                        const std::vector<Tensor>& states,
                        const std::function<void(StaticRun&)>& body, std::index_sequence<I...>) {
  StaticOptions options;
  options.name = absl::StrCat("random_", p.seed);
  auto fn = encore::static_graph(
      [&p, &params, &states](const TensorArg<I>&... a) {
        const Tensor args[] = {a...};
        return run_program(p, args, params, states, false);
      },
      options);
  StaticRun run{[&fn](const std::vector<Tensor>& a) { return fn(a[I]...); },
                [&fn] { return fn.stats(); }};
  body(run);
}

inline void with_static(const Program& p, const std::vector<Tensor>& params,
                        const std::vector<Tensor>& states,
                        const std::function<void(StaticRun&)>& body) {
  switch (p.num_args) {
    case 1:
      return with_static(p, params, states, body, std::make_index_sequence<1>());
    case 2:
      return with_static(p, params, states, body, std::make_index_sequence<2>());
    case 3:
      return with_static(p, params, states, body, std::make_index_sequence<3>());
    case 4:
      return with_static(p, params, states, body, std::make_index_sequence<4>());
    default:
      throw std::logic_error("unexpected argument count");
  }
}

// With call C's and D's eager values: the outputs of dropouts whose masks must differ between C
// and D (a chance below 1e-9 that fresh masks agree on every element that is non-zero in both
// inputs). Each as (output index, ratio, elements counted).
struct FreshMask {
  size_t output;
  double ratio;
  int64_t elements;
};

inline std::vector<FreshMask> fresh_masks(const Program& p, const std::vector<Tensor>& c_values,
                                          const std::vector<Tensor>& d_values) {
  std::vector<FreshMask> found;
  for (size_t i = 0; i < p.outputs.size(); ++i) {
    for (const Step& s : p.steps) {
      if (s.out != p.outputs[i] || s.op != OpKind::Dropout || !s.flag || s.scalar <= 0) continue;
      const Tensor a = host(c_values[s.in[0]]), b = host(d_values[s.in[0]]);
      int64_t n = 0;
      for (int64_t e = 0; e < a.numel(); ++e) n += element(a, e) != 0 && element(b, e) != 0;
      const double agree = s.scalar * s.scalar + (1 - s.scalar) * (1 - s.scalar);
      if (std::pow(agree, static_cast<double>(n)) < 1e-9) found.push_back({i, s.scalar, n});
    }
  }
  return found;
}

// What the programs exercised, so that a generator that stops making an op fails.
struct Coverage {
  int64_t with_op[std::size(kOps)] = {};  // programs with a step of each OpKind
  int64_t drawing = 0;                    // programs with a dropout that draws
  int64_t with_states = 0;                // programs with running statistics
  int64_t shared_states = 0;              // ... read by two batch_norm steps or more
  int64_t fresh_mask_checks = 0;          // dropout outputs compared between calls C and D
  int64_t same_tensor_args = 0;           // one tensor passed as two arguments
  int64_t overlapping_args = 0;           // two arguments overlapping in one storage
  int64_t aliased_grad_args = 0;          // ... either, with both requiring a gradient

  void add(const Program& p) {
    bool seen[std::size(kOps)] = {};
    std::vector<int> uses(p.states.size());
    for (const Step& s : p.steps) {
      seen[static_cast<int>(s.op)] = true;
      if (s.op == OpKind::BatchNorm && s.ints[0] >= 0) ++uses[s.ints[0]];
    }
    for (size_t k = 0; k < std::size(kOps); ++k) with_op[k] += seen[k];
    drawing += p.random;
    with_states += !p.states.empty();
    shared_states += std::any_of(uses.begin(), uses.end(), [](int u) { return u > 1; });
    if (p.alias_arg >= 0) {
      const Value* v[2] = {};
      for (const Leaf& l : p.leaves)
        if (!l.param && (l.index == p.alias_arg || l.index == p.alias_of))
          v[l.index == p.alias_arg] = &p.values[l.value];
      same_tensor_args += p.alias_same;
      overlapping_args += !p.alias_same && p.alias_shift < numel_of(v[0]->shape);
      aliased_grad_args += v[0]->requires_grad && v[1]->requires_grad;
    }
  }

  std::string str(int64_t programs) const {
    std::string s = absl::StrCat("of ", programs, " programs: ");
    for (size_t k = 0; k < std::size(kOps); ++k)
      absl::StrAppend(&s, kOps[k].name, " ", with_op[k], ", ");
    absl::StrAppend(&s, "a dropout that draws ", drawing, ", running statistics ", with_states,
                    " (shared ", shared_states, "); fresh-mask comparisons ", fresh_mask_checks,
                    "; arguments passed as one tensor ", same_tensor_args, ", overlapping ",
                    overlapping_args, ", aliased and both requiring grad ", aliased_grad_args);
    return s;
  }
};

// Runs one program on `device` traced (call 0) and replayed (calls 1, 2 and, when it draws random
// numbers, 3 on the inputs of 2) against eager runs on the same device, on the same inputs and
// from the same generator state; the problems found go to `check`.
inline void check_program(const Program& p, Checker& check, Coverage& cover, Device device) {
  const CallData init = draw_call(p, 100);
  std::vector<Tensor> sparams = make_params(p, init, device);
  std::vector<Tensor> eparams = make_params(p, init, device);
  const std::vector<std::vector<double>> init_states = draw_states(p, 100);
  std::vector<Tensor> sstates = make_states(p, init_states, device);
  std::vector<Tensor> estates = make_states(p, init_states, device);
  // So that a program run alone draws what it drew among others.
  set_gen_state(device, {p.seed, 0});
  const int calls = p.random ? 4 : 3;
  const char* phase = "setup";
  try {
    with_static(p, sparams, sstates, [&](StaticRun& st) {
      std::vector<std::vector<Tensor>> souts, eouts, sargs, eargs, snaps, evalues(calls);
      for (int call = 0; call < calls; ++call) {
        static const char* const kCalls[] = {"call A (trace)", "call B", "call C",
                                             "call D (C's inputs again)"};
        const std::string c = kCalls[call];
        const CallData d = draw_call(p, call == 3 ? 2 : call);
        if (call > 0) {
          phase = "between calls";
          const bool update = p.update_params && call < 3;  // D sees what C saw
          const CallData upd = draw_call(p, 100 + call);
          for (size_t i = 0; i < p.leaves.size(); ++i) {
            const Leaf& l = p.leaves[i];
            if (!l.param) continue;
            for (std::vector<Tensor>* ps : {&sparams, &eparams}) {
              Tensor t = (*ps)[l.index];
              NoGradGuard no_grad;
              if (update)
                copy_(t, make_tensor(upd.leaves[i], p.values[l.value].shape, p.dtype, device));
              if (p.param_grads == GradState::Cleared) t.set_grad(Tensor());
              if (p.param_grads == GradState::Zeroed && t.grad().defined()) fill_(t.grad(), 0);
            }
          }
          if (update) {
            const std::vector<std::vector<double>> us = draw_states(p, 100 + call);
            for (size_t i = 0; i < us.size(); ++i) {
              NoGradGuard no_grad;
              const Tensor t = make_tensor(us[i], {p.states[i / 2]}, p.dtype, device);
              copy_(sstates[i], t);
              copy_(estates[i], t);
            }
          }
        }
        sargs.push_back(make_args(p, d, device));
        eargs.push_back(make_args(p, d, device));
        if (p.preset_grads) {
          for (size_t i = 0; i < p.leaves.size(); ++i) {
            const Leaf& l = p.leaves[i];
            if (!p.values[l.value].requires_grad || (l.param && call > 0)) continue;
            for (const Tensor& t :
                 l.param ? std::vector<Tensor>{sparams[l.index], eparams[l.index]}
                         : std::vector<Tensor>{sargs.back()[l.index], eargs.back()[l.index]})
              Tensor(t).set_grad(
                  make_tensor(d.presets[i], p.values[l.value].shape, p.dtype, device));
          }
        }
        // The eager reference starts from the generator state the static call starts from, and
        // both must leave it in the same state.
        const GenState g0 = gen_state(device);
        phase = "eager forward";
        eouts.push_back(run_program(p, eargs.back(), eparams, estates, true, &evalues[call]));
        const GenState ge = gen_state(device);
        set_gen_state(device, g0);
        phase = "static forward";
        souts.push_back(st.call(sargs.back()));
        const GenState gs = gen_state(device);
        check.expect(gs == ge,
                     absl::StrCat(c, ": the forward leaves the generator at ", gs.str(),
                                  ", eager at ", ge.str(), " (both from ", g0.str(), ")"));
        check.expect(
            !p.random || !(gs == g0),
            absl::StrCat(c, ": a dropout drew no numbers (generator still at ", g0.str(), ")"));
        check.expect(souts.back().size() == eouts.back().size(),
                     absl::StrCat(c, ": ", souts.back().size(), " outputs, eager gives ",
                                  eouts.back().size()));
        if (!check.ok()) return;
        for (size_t i = 0; i < eouts.back().size(); ++i) {
          const Tensor& so = souts.back()[i];
          const Tensor& eo = eouts.back()[i];
          check.same(absl::StrCat(c, " output ", i), so, eo);
          check.expect(so.requires_grad() == eo.requires_grad(),
                       absl::StrCat(c, " output ", i, ": requires_grad ",
                                    so.requires_grad() ? "true" : "false", ", eager ",
                                    eo.requires_grad() ? "true" : "false"));
          // An output that is a leaf or a view of one in eager (reshape, flatten, an identity
          // transpose, dropout in eval mode) must be one on replay too, or a later in-place
          // update tells them apart.
          for (size_t l = 0; l < p.leaves.size(); ++l) {
            const Leaf& leaf = p.leaves[l];
            const bool es =
                eo.shares_storage(leaf.param ? eparams[leaf.index] : eargs.back()[leaf.index]);
            const bool ss =
                so.shares_storage(leaf.param ? sparams[leaf.index] : sargs.back()[leaf.index]);
            check.expect(es == ss,
                         absl::StrCat(c, " output ", i, ": ", es ? "eager" : "static",
                                      " shares storage with ", leaf.param ? "param" : "arg",
                                      leaf.index, ", ", es ? "static" : "eager", " does not"));
          }
        }
        for (size_t i = 0; i < sstates.size(); ++i)
          check.same(absl::StrCat(c, " ", state_name(i), " after the forward"), sstates[i],
                     estates[i]);
        // The static outputs as they are now, except those sharing a leaf's storage (a later
        // in-place update of the leaf changes them).
        snaps.emplace_back();
        for (const Tensor& so : souts.back()) {
          bool leaf_view = false;
          for (const Tensor& t : sargs.back()) leaf_view = leaf_view || so.shares_storage(t);
          for (const Tensor& t : sparams) leaf_view = leaf_view || so.shares_storage(t);
          snaps.back().push_back(leaf_view ? Tensor() : snapshot(so));
        }
        const GenState b0 = gen_state(device);
        phase = "eager backward";
        backward(p, eouts.back(), d, device);
        const GenState be = gen_state(device);
        set_gen_state(device, b0);
        phase = "static backward";
        backward(p, souts.back(), d, device);
        const GenState bs = gen_state(device);
        phase = "comparing";
        check.expect(bs == be, absl::StrCat(c, ": the backward leaves the generator at ", bs.str(),
                                            ", eager at ", be.str()));
        for (int a = 0; a < p.num_args; ++a)
          check.same(absl::StrCat(c, " grad of arg", a), sargs.back()[a].grad(),
                     eargs.back()[a].grad());
        for (int q = 0; q < p.num_params; ++q)
          check.same(absl::StrCat(c, " grad of param", q), sparams[q].grad(), eparams[q].grad());
        for (size_t i = 0; i < sstates.size(); ++i)
          check.same(absl::StrCat(c, " ", state_name(i), " after the backward"), sstates[i],
                     estates[i]);
        if (call > 0) {  // what the previous call handed out is unchanged
          const std::string prev = call == 1 ? "call A" : call == 2 ? "call B" : "call C";
          for (size_t i = 0; i < snaps[call - 1].size(); ++i)
            if (snaps[call - 1][i].defined())
              check.same(absl::StrCat(prev, " output ", i, " after ", c, " (vs itself then)"),
                         snapshot(souts[call - 1][i]), snaps[call - 1][i]);
          for (int a = 0; a < p.num_args; ++a)
            check.same(absl::StrCat(prev, " grad of arg", a, " after ", c),
                       sargs[call - 1][a].grad(), eargs[call - 1][a].grad());
        }
        if (call == 3) {  // fresh masks: a dropout's output differs from call C's
          for (const FreshMask& f : fresh_masks(p, evalues[2], evalues[3])) {
            ++cover.fresh_mask_checks;
            check.expect(!difference(snapshot(souts[3][f.output]), snaps[2][f.output]).empty(),
                         absl::StrCat(c, " output ", f.output, " (dropout, ratio ", f.ratio, ", ",
                                      f.elements, " elements non-zero in both inputs) equals ",
                                      "call C's: the replay drew the same mask"));
          }
        }
        if (!check.ok()) return;
      }
      const StaticStats stats = st.stats();
      check.expect(
          !static_enabled() || (stats.traces == 1 && stats.hits >= 1),
          absl::StrCat("stats: ", stats.calls, " calls, ", stats.traces, " traces, ", stats.hits,
                       " hits, ", stats.eager_calls, " eager calls; expected 1 trace and replays"));
    });
  } catch (const std::exception& e) {
    check.expect(false, absl::StrCat("threw during ", phase, ": ", e.what()));
  }
}

inline uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  return std::strtoull(s, nullptr, 0);
}

// Runs ENCORE_RANDOM_PROGRAMS (default `default_programs`) programs on `device` from seed
// ENCORE_RANDOM_SEED (default kDefaultSeed; program i has seed + i) through check_program. A
// failure prints the seeds of the failing programs, the first three programs' listings and the
// smallest failing program. ENCORE_RANDOM_COVERAGE=1 prints how many programs had each op; a run
// of 2000 programs or more also checks that every op was made.
inline void run_random_programs(Device device, int64_t default_programs) {
  const uint64_t base = env_u64("ENCORE_RANDOM_SEED", kDefaultSeed);
  const auto programs = static_cast<int64_t>(
      env_u64("ENCORE_RANDOM_PROGRAMS", static_cast<uint64_t>(default_programs)));
  const GenState saved = gen_state(device);
  Coverage cover;
  int64_t failures = 0;
  std::vector<uint64_t> failing_seeds;
  std::string smallest;  // the failing program with the fewest steps
  size_t smallest_steps = SIZE_MAX;
  for (int64_t i = 0; i < programs; ++i) {
    const uint64_t seed = base + static_cast<uint64_t>(i);
    const Program p = ProgramGenerator(seed).build();
    Checker check;
    cover.add(p);
    check_program(p, check, cover, device);
    if (check.ok()) continue;
    ++failures;
    if (failing_seeds.size() < 50) failing_seeds.push_back(seed);
    if (p.steps.size() < smallest_steps) {
      smallest_steps = p.steps.size();
      smallest = absl::StrCat(p.listing(), "\n", check.text());
    }
    if (failures <= 3) {
      INFO(p.listing());
      INFO("replay it alone: ENCORE_RANDOM_SEED=" << seed << " ENCORE_RANDOM_PROGRAMS=1");
      FAIL_CHECK(check.text());
    }
  }
  std::string seeds;
  for (uint64_t s : failing_seeds) absl::StrAppend(&seeds, seeds.empty() ? "" : " ", s);
  INFO(failures << " of " << programs << " programs failed; seeds: " << seeds);
  INFO("the smallest failing program:\n" << smallest);
  CHECK(failures == 0);
  set_gen_state(device, saved);
  if (std::getenv("ENCORE_RANDOM_COVERAGE") != nullptr) WARN(cover.str(programs));
  if (programs >= 2000) {  // the default run makes every op and every kind of check often
    INFO(cover.str(programs));
    for (size_t k = 0; k < std::size(kOps); ++k) CHECK(cover.with_op[k] >= programs / 200);
    CHECK(cover.drawing >= programs / 50);
    CHECK(cover.shared_states >= programs / 500);
    CHECK(cover.fresh_mask_checks >= programs / 200);
    CHECK(cover.same_tensor_args >= programs / 100);
    CHECK(cover.overlapping_args >= programs / 100);
    CHECK(cover.aliased_grad_args >= programs / 100);
  }
}

}  // namespace encore::random_program
