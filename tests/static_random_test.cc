// A randomized differential test of static_graph. A generator builds a random program from the
// op set of functions.h (broadcasting binary ops, scalar forms, unary ops, matmul and linear,
// reductions, layout ops, softmax and losses, conv2d with stride, padding, dilation, groups and
// an optional bias, max_pool2d, avg_pool2d with and without count_include_pad,
// global_avg_pool2d, batch_norm in training and eval mode, dropout in training (and eval) mode)
// as a list of steps, a deterministic function of its seed; a lambda interprets the list. Its
// arguments are float32 or float64 tensors (some requiring grad; some programs start from 4-D
// NCHW images) and perhaps int labels; some programs also capture "parameters" (linear and
// conv weights, biases, batch-norm gamma and beta) and batch-norm running statistics made
// outside the lambda. Each program is wrapped in static_graph, traced on inputs A (forward and
// backward), then replayed on inputs B and C (parameters and running statistics perhaps
// overwritten in place, parameter gradients kept, cleared or zeroed in between), and, when it
// has a dropout, replayed once more on C's inputs (D). Every call is compared with the same
// program run eagerly on the same inputs: outputs and every argument and parameter gradient bit
// for bit, the running statistics after every call (batch_norm updates them in place), the CPU
// generator's state (each eager reference call starts from the state the static call started
// from, and both must end in the same state: a replay reserves as many numbers as eager, and
// a dropout draws on every call), requires_grad and storage sharing of outputs with leaves,
// earlier outputs and gradients unchanged by later calls, outputs of a dropout differing
// between C and D (fresh masks), and one trace with replays in stats().
//
// A failure prints the program's seed and listing. To run that program alone:
//   ENCORE_RANDOM_SEED=<seed> ENCORE_RANDOM_PROGRAMS=1 encore_tests "[random]"
// ENCORE_RANDOM_SEED sets the first program's seed (program i has seed + i),
// ENCORE_RANDOM_PROGRAMS the number of programs; ENCORE_RANDOM_COVERAGE=1 prints how many
// programs had each op. A run of 2000 programs or more also checks that every op was made.
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
#include "runtime/autograd.h"
#include "runtime/rng.h"

using namespace encore;

namespace {

using Dims = std::vector<int64_t>;

constexpr uint64_t kDefaultSeed = 20240601;
constexpr int kDefaultPrograms = 5000;
constexpr int64_t kMaxNumel = 1024;  // per value, so that a program stays cheap
constexpr int kMaxFloatArgs = 3;
constexpr int kMaxParams = 5;
constexpr int kMaxStates = 2;            // pairs of batch-norm running statistics
constexpr int64_t kMaxConvWork = 20000;  // multiply-adds of one conv2d forward

// The composite forms keep values finite: div_sigmoid is a / (1.5 + sigmoid(b)), div_exp is
// a / exp(tanh(b)), rdiv_scalar is s / (1 + x*x), exp_tanh is exp(tanh(x)), and log_sq, sqrt_sq
// and pow_sq apply log, sqrt and pow to 1 + x*x.
// clang-format off
enum class OpKind {
  Add, Sub, Mul, DivSigmoid, DivExp, AddScalar, SubScalar, RsubScalar, MulScalar, DivScalar,
  RdivScalar, Neg, ExpTanh, LogSq, SqrtSq, PowSq, Relu, LeakyRelu, Sigmoid, Tanh, Matmul, Linear,
  Sum, Mean, Max, Reshape, Flatten, Transpose, Permute, BroadcastTo, Concat, Slice, Softmax,
  LogSoftmax, Mse, CrossEntropy, Conv2d, MaxPool2d, AvgPool2d, GlobalAvgPool2d, BatchNorm, Dropout
};
// clang-format on

struct OpInfo {
  const char* name;
  int weight;   // how often the generator draws it
  bool scalar;  // Step::scalar is an operand, an exponent or a slope
};

// By OpKind.
constexpr OpInfo kOps[] = {{"add", 4, false},        {"sub", 3, false},
                           {"mul", 4, false},        {"div_sigmoid", 2, false},
                           {"div_exp", 2, false},    {"add_scalar", 1, true},
                           {"sub_scalar", 1, true},  {"rsub_scalar", 1, true},
                           {"mul_scalar", 1, true},  {"div_scalar", 1, true},
                           {"rdiv_scalar", 1, true}, {"neg", 1, false},
                           {"exp_tanh", 1, false},   {"log_sq", 1, false},
                           {"sqrt_sq", 1, false},    {"pow_sq", 1, true},
                           {"relu", 2, false},       {"leaky_relu", 1, true},
                           {"sigmoid", 1, false},    {"tanh", 2, false},
                           {"matmul", 3, false},     {"linear", 3, false},
                           {"sum", 3, false},        {"mean", 2, false},
                           {"max", 2, false},        {"reshape", 2, false},
                           {"flatten", 1, false},    {"transpose", 2, false},
                           {"permute", 1, false},    {"broadcast_to", 2, false},
                           {"concat", 2, false},     {"slice", 2, false},
                           {"softmax", 1, false},    {"log_softmax", 1, false},
                           {"mse", 1, false},        {"cross_entropy", 1, false},
                           {"conv2d", 4, false},     {"max_pool2d", 2, false},
                           {"avg_pool2d", 2, false}, {"global_avg_pool2d", 1, false},
                           {"batch_norm", 3, false}, {"dropout", 3, false}};

const OpInfo& info(OpKind k) {
  return kOps[static_cast<int>(k)];
}

std::string dims_str(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) absl::StrAppend(&s, i ? "," : "", d[i]);
  return s + "]";
}

int64_t numel_of(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

int rank_of(const Dims& d) {
  return static_cast<int>(d.size());
}

// The NumPy broadcast of a and b, or false when they do not broadcast.
bool broadcast_dims(const Dims& a, const Dims& b, Dims& out) {
  const size_t r = std::max(a.size(), b.size());
  out.assign(r, 1);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i + a.size() >= r ? a[i + a.size() - r] : 1;
    const int64_t db = i + b.size() >= r ? b[i + b.size() - r] : 1;
    if (da != db && da != 1 && db != 1) return false;
    out[i] = da == 1 ? db : da;
  }
  return true;
}

// ---- Programs ---------------------------------------------------------------------------

struct Value {
  Dims shape;
  bool requires_grad = false;  // depends on a leaf that requires a gradient
  double bound = 1;            // a rough bound on |element|, to keep values finite
  int leaf = -1;               // index into Program::leaves, or -1 for a step's result
  bool labels = false;         // the int labels argument of cross_entropy
};

struct Leaf {
  int value = 0;
  bool param = false;  // captured by the lambda (bound by reference), not an argument
  int index = 0;       // position among the arguments or among the parameters
  DType label_dtype = DType::Int64;
  int64_t classes = 0;        // labels: values in [0, classes)
  bool ignores_some = false;  // labels: some are -1 (ignored)
};

// The ints of the image ops:
//   conv2d: stride h, w, padding h, w, dilation h, w, groups; flag: has a bias (in[2])
//   max_pool2d, avg_pool2d: kernel h, w, stride h, w, padding h, w (, avg: count_include_pad);
//     flag: the stride is given (else it defaults to the kernel)
//   batch_norm: running statistics (index into Program::states, or -1), training, affine
//     (gamma in[1], beta in[2]); scalar: momentum, scalar2: eps
//   dropout: scalar: ratio; flag: training
struct Step {
  OpKind op;
  int out = 0;
  std::vector<int> in;
  std::vector<int64_t> ints;  // axes, shape, perm, (start, end), (axis, start, stop, step)
  double scalar = 0;          // scalar operand, exponent, slope, momentum or ratio
  bool flag = false;          // keepdims; linear: has a bias (in[2])
  double scalar2 = 0;         // batch_norm: eps
};

enum class GradState { Kept, Cleared, Zeroed };  // parameter .grad between calls

struct Program {
  uint64_t seed = 0;
  DType dtype = DType::Float32;
  std::vector<Value> values;
  std::vector<Leaf> leaves;
  int num_args = 0;
  int num_params = 0;
  std::vector<int64_t> states;  // the channels of each pair of running statistics
  std::vector<Step> steps;
  std::vector<int> outputs;
  bool random = false;         // has a training dropout with a ratio in (0, 1): every call draws
  bool scalar_loss = false;    // backward from sum of sum(output), else random output gradients
  bool update_params = false;  // parameters get new values (in place) between calls
  bool preset_grads = false;   // leaves needing a gradient have a .grad before the first call
  GradState param_grads = GradState::Kept;

  std::string listing() const;
};

bool image_op(OpKind k) {
  return static_cast<int>(k) >= static_cast<int>(OpKind::Conv2d);
}

// The attributes of an image op (conv2d to dropout) as the listing shows them.
std::string image_attrs(const Step& st) {
  const std::vector<int64_t>& i = st.ints;
  switch (st.op) {
    case OpKind::Conv2d:
      return absl::StrCat(" stride ", i[0], "x", i[1], " padding ", i[2], "x", i[3], " dilation ",
                          i[4], "x", i[5], " groups ", i[6], st.flag ? " (bias)" : "");
    case OpKind::MaxPool2d:
    case OpKind::AvgPool2d:
      return absl::StrCat(" kernel ", i[0], "x", i[1], " stride ", i[2], "x", i[3],
                          st.flag ? "" : " (default)", " padding ", i[4], "x", i[5],
                          st.op == OpKind::MaxPool2d ? ""
                          : i[6]                     ? " count_include_pad"
                                                     : " not count_include_pad");
    case OpKind::BatchNorm:
      return absl::StrCat(i[1] ? " training" : " eval",
                          i[0] >= 0 ? absl::StrCat(" state", i[0]) : " no running stats",
                          i[2] ? " (gamma, beta)" : "", " momentum ", st.scalar, " eps ",
                          st.scalar2);
    case OpKind::Dropout:
      return absl::StrCat(" ratio ", st.scalar, st.flag ? " training" : " eval");
    default:
      return "";
  }
}

std::string Program::listing() const {
  std::ostringstream s;
  s.precision(17);
  s << "program seed " << seed << ": " << name(dtype) << ", " << num_args << " argument(s), "
    << num_params << " parameter(s), " << states.size() << " running-statistics pair(s), "
    << steps.size() << " step(s)\n";
  for (const Leaf& l : leaves) {
    const Value& v = values[l.value];
    s << "  %" << l.value << " = " << (l.param ? "param" : "arg") << l.index << " ";
    if (v.labels)
      s << name(l.label_dtype) << dims_str(v.shape) << " labels in [0," << l.classes << ")"
        << (l.ignores_some ? " some -1 (ignored)" : "");
    else
      s << name(dtype) << dims_str(v.shape) << (v.requires_grad ? " requires_grad" : "");
    s << "\n";
  }
  for (size_t i = 0; i < states.size(); ++i)
    s << "  state" << i << " = running mean and var " << name(dtype) << "[" << states[i] << "]\n";
  for (const Step& st : steps) {
    s << "  %" << st.out << " = " << info(st.op).name;
    for (int i : st.in) s << " %" << i;
    if (image_op(st.op)) {
      s << image_attrs(st);
    } else if (!st.ints.empty()) {
      s << " {";
      for (size_t i = 0; i < st.ints.size(); ++i) s << (i ? "," : "") << st.ints[i];
      s << "}";
    }
    if (info(st.op).scalar) s << " scalar " << st.scalar;
    if (st.flag && !image_op(st.op))
      s << (st.op == OpKind::Linear      ? " (bias)"
            : st.op == OpKind::Transpose ? " (default dims)"
                                         : " keepdims");
    s << " -> " << dims_str(values[st.out].shape) << (values[st.out].requires_grad ? " rg" : "")
      << "\n";
  }
  s << "  outputs";
  for (int o : outputs) s << " %" << o;
  s << "; backward " << (scalar_loss ? "from sum of sum(output)" : "with random output gradients");
  if (num_params > 0)
    s << "; between calls parameter grads "
      << (param_grads == GradState::Kept      ? "kept"
          : param_grads == GradState::Cleared ? "cleared"
                                              : "zeroed in place")
      << (update_params ? ", values updated in place" : "");
  if (!states.empty() && update_params)
    s << "; between calls running statistics overwritten in place";
  if (random) s << "; a dropout draws on every call (call D replays C's inputs)";
  if (preset_grads) s << "; arguments (at every call) and parameters start with a .grad";
  return s.str();
}

// ---- The generator ----------------------------------------------------------------------

class ProgramGenerator {
 public:
  explicit ProgramGenerator(uint64_t seed) : rng_(seed) { p_.seed = seed; }

  Program build() {
    p_.dtype = chance(0.5) ? DType::Float32 : DType::Float64;
    // An image program starts from an NCHW argument (the others are variants of it).
    const bool image = chance(0.35);
    Dims base;
    if (image) base = image_dims();
    for (int64_t i = 0, r = between(1, 4); !image && i < r; ++i) base.push_back(between(1, 6));
    for (int64_t i = 0, n = between(1, kMaxFloatArgs); i < n; ++i)
      new_leaf(image && i == 0 ? base : variant(base), false, chance(0.6));
    if (chance(0.4)) new_leaf(variant(base), true, chance(0.85));
    std::vector<int> grad_leaves;
    for (const Leaf& l : p_.leaves)
      if (p_.values[l.value].requires_grad) grad_leaves.push_back(l.value);
    if (grad_leaves.empty()) {
      p_.values[p_.leaves[0].value].requires_grad = true;
      grad_leaves.push_back(p_.leaves[0].value);
    }

    // The first step reads a leaf that needs a gradient, so some result does.
    const int first = grad_leaves[between(0, static_cast<int64_t>(grad_leaves.size()) - 1)];
    while (!try_emit(random_op(), first)) {
    }
    const int64_t target = between(4, 18);
    while (static_cast<int64_t>(p_.steps.size()) < target) try_emit(random_op(), -1);

    int out0 = -1;
    for (int v = static_cast<int>(p_.values.size()) - 1; v >= 0 && out0 < 0; --v)
      if (p_.values[v].leaf < 0 && p_.values[v].requires_grad) out0 = v;
    p_.outputs.push_back(out0);
    if (chance(0.4)) {
      std::vector<int> others;
      for (const Step& s : p_.steps)
        if (s.out != out0) others.push_back(s.out);
      if (!others.empty()) {
        p_.outputs.push_back(others[between(0, static_cast<int64_t>(others.size()) - 1)]);
        if (chance(0.5)) std::swap(p_.outputs[0], p_.outputs[1]);
      }
    }
    // A dropout that draws makes every call random; its result is often an output too, so that
    // fresh masks show in what the caller gets.
    std::vector<int> drops;
    for (const Step& s : p_.steps)
      if (s.op == OpKind::Dropout && s.flag && s.scalar > 0) drops.push_back(s.out);
    p_.random = !drops.empty();
    if (!drops.empty() && chance(0.5)) {
      const int d = drops[between(0, static_cast<int64_t>(drops.size()) - 1)];
      if (std::find(p_.outputs.begin(), p_.outputs.end(), d) == p_.outputs.end())
        p_.outputs.push_back(d);
    }
    p_.scalar_loss = chance(0.3);
    p_.update_params = chance(0.5);
    p_.preset_grads = chance(0.2);
    p_.param_grads = static_cast<GradState>(between(0, 2));
    return std::move(p_);
  }

 private:
  int64_t between(int64_t lo, int64_t hi) {  // uniform in [lo, hi]
    return lo + static_cast<int64_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool chance(double p) { return static_cast<double>(rng_() >> 11) * 0x1.0p-53 < p; }

  OpKind random_op() {
    int total = 0;
    for (const OpInfo& o : kOps) total += o.weight;
    int64_t r = between(0, total - 1);
    for (int k = 0;; r -= kOps[k++].weight)
      if (r < kOps[k].weight) return static_cast<OpKind>(k);
  }

  const Value& val(int v) const { return p_.values[v]; }
  Dims shape(int v) const { return p_.values[v].shape; }
  int rank(int v) const { return rank_of(p_.values[v].shape); }

  // A small [N,C,H,W].
  Dims image_dims() { return {between(1, 3), between(1, 4), between(3, 8), between(3, 8)}; }

  // The base shape with some leading dimensions dropped and some set to 1.
  Dims variant(const Dims& base) {
    const int64_t drop = chance(0.3) ? between(0, static_cast<int64_t>(base.size()) - 1) : 0;
    Dims d(base.begin() + drop, base.end());
    for (int64_t& x : d)
      if (chance(0.2)) x = 1;
    return d;
  }

  int add_value(Dims shape, bool requires_grad, double bound) {
    p_.values.push_back({std::move(shape), requires_grad, bound});
    return static_cast<int>(p_.values.size()) - 1;
  }

  bool can_add_leaf(bool param) const {
    return param ? p_.num_params < kMaxParams : p_.num_args < kMaxFloatArgs;
  }

  int new_leaf(Dims shape, bool param, bool requires_grad) {
    const int v = add_value(std::move(shape), requires_grad, param ? 1 : 2);
    Leaf l;
    l.value = v;
    l.param = param;
    l.index = param ? p_.num_params++ : p_.num_args++;
    p_.values[v].leaf = static_cast<int>(p_.leaves.size());
    p_.leaves.push_back(l);
    return v;
  }

  // A new leaf of `shape`: a parameter when `prefer_param` and one is left, else an argument.
  int new_leaf_of(const Dims& shape, bool prefer_param, double grad_chance) {
    if (numel_of(shape) > kMaxNumel) return -1;
    bool param = prefer_param ? can_add_leaf(true) : !can_add_leaf(false);
    if (!can_add_leaf(param)) return -1;
    return new_leaf(shape, param, chance(grad_chance));
  }

  int emit(OpKind op, std::vector<int> in, Dims out_shape, double bound,
           std::vector<int64_t> ints = {}, double scalar = 0, bool flag = false) {
    bool rg = false;
    for (int v : in) rg = rg || (!val(v).labels && val(v).requires_grad);
    const int out = add_value(std::move(out_shape), rg, bound);
    p_.steps.push_back({op, out, std::move(in), std::move(ints), scalar, flag});
    return out;
  }

  // tanh(v) when v may exceed `limit`, else v.
  int squash(int v, double limit) {
    if (val(v).bound <= limit) return v;
    return emit(OpKind::Tanh, {v}, shape(v), 1);
  }

  // A floating value satisfying `pred`, recent ones preferred; `forced` when given (or -1 when
  // it does not satisfy pred).
  template <typename Pred>
  int pick(Pred pred, int forced = -1) {
    auto ok = [&](int v) { return !val(v).labels && pred(v); };
    if (forced >= 0) return ok(forced) ? forced : -1;
    std::vector<int> c;
    for (int v = 0; v < static_cast<int>(p_.values.size()); ++v)
      if (ok(v)) c.push_back(v);
    if (c.empty()) return -1;
    if (c.size() > 3 && chance(0.6)) return c[c.size() - 1 - between(0, 2)];
    return c[between(0, static_cast<int64_t>(c.size()) - 1)];
  }

  // An axis in [0, rank) as given to a routine: negative half of the time.
  int64_t axis_repr(int64_t axis, int64_t r) { return chance(0.4) ? axis - r : axis; }

  double signed_scalar() {  // +-[0.5, 2] in steps of 0.25
    const double s = static_cast<double>(between(2, 8)) * 0.25;
    return chance(0.5) ? s : -s;
  }

  static double sq_bound(double b) { return 1 + b * b; }

  bool try_emit(OpKind op, int forced) {
    auto any = [](int) { return true; };
    auto ranked = [this](int lo, int hi) {
      return [this, lo, hi](int v) { return rank(v) >= lo && rank(v) <= hi; };
    };
    switch (op) {
      case OpKind::Add:
      case OpKind::Sub:
      case OpKind::Mul:
      case OpKind::DivSigmoid:
      case OpKind::DivExp:
        return binary(op, forced);
      case OpKind::AddScalar:
      case OpKind::SubScalar:
      case OpKind::RsubScalar:
      case OpKind::MulScalar:
      case OpKind::DivScalar:
      case OpKind::RdivScalar: {
        int x = pick(any, forced);
        if (x < 0) return false;
        x = squash(x, 1e3);
        const double s = signed_scalar(), b = val(x).bound;
        const double bound =
            op == OpKind::AddScalar || op == OpKind::SubScalar || op == OpKind::RsubScalar
                ? b + std::abs(s)
            : op == OpKind::MulScalar ? b * std::abs(s)
            : op == OpKind::DivScalar ? b / std::abs(s)
                                      : std::abs(s);
        emit(op, {x}, shape(x), bound, {}, s);
        return true;
      }
      case OpKind::Neg:
      case OpKind::Relu:
      case OpKind::LeakyRelu:
      case OpKind::ExpTanh:
      case OpKind::Sigmoid:
      case OpKind::Tanh:
      case OpKind::LogSq:
      case OpKind::SqrtSq:
      case OpKind::PowSq: {
        int x = pick(any, forced);
        if (x < 0) return false;
        x = squash(x, op == OpKind::PowSq ? 10 : 1e3);
        const double b = val(x).bound;
        double bound = b, scalar = 0;
        if (op == OpKind::LeakyRelu) scalar = chance(0.5) ? 0.01 : 0.2;
        if (op == OpKind::ExpTanh) bound = std::exp(1.0);
        if (op == OpKind::Sigmoid || op == OpKind::Tanh) bound = 1;
        if (op == OpKind::LogSq) bound = std::log(sq_bound(b));
        if (op == OpKind::SqrtSq) bound = std::sqrt(sq_bound(b));
        if (op == OpKind::PowSq) {
          static const double kExponents[] = {0.5, 1.5, 2, 3, -0.5, -1, -1.5};
          scalar = kExponents[between(0, 6)];
          bound = scalar > 0 ? std::pow(sq_bound(b), scalar) : 1;
        }
        emit(op, {x}, shape(x), bound, {}, scalar);
        return true;
      }
      case OpKind::Softmax:
      case OpKind::LogSoftmax: {
        int x = pick(ranked(1, 4), forced);
        if (x < 0) return false;
        x = squash(x, 1e3);
        const int64_t r = rank(x), axis = between(0, r - 1);
        const double bound = op == OpKind::Softmax
                                 ? 1
                                 : 2 * val(x).bound + std::log(static_cast<double>(shape(x)[axis]));
        emit(op, {x}, shape(x), bound, {axis_repr(axis, r)});
        return true;
      }
      case OpKind::Matmul:
        return matmul(forced);
      case OpKind::Linear:
        return linear(forced);
      case OpKind::Sum:
      case OpKind::Mean:
      case OpKind::Max:
        return reduce(op, forced);
      case OpKind::Reshape:
        return reshape(forced);
      case OpKind::Flatten: {
        int x = pick(any, forced);
        if (x < 0) return false;
        const Dims s = shape(x);
        const int64_t r = rank_of(s);
        if (r == 0) {
          emit(op, {x}, {1}, val(x).bound, {0, -1});
          return true;
        }
        const int64_t a = between(0, r - 1), e = between(a, r - 1);
        Dims out(s.begin(), s.begin() + a);
        int64_t merged = 1;
        for (int64_t i = a; i <= e; ++i) merged *= s[i];
        out.push_back(merged);
        out.insert(out.end(), s.begin() + e + 1, s.end());
        emit(op, {x}, out, val(x).bound, {axis_repr(a, r), axis_repr(e, r)});
        return true;
      }
      case OpKind::Transpose: {
        const int x = pick(ranked(2, 4), forced);
        if (x < 0) return false;
        Dims s = shape(x);
        const int64_t r = rank_of(s);
        if (chance(0.2)) {
          std::swap(s[r - 2], s[r - 1]);
          emit(op, {x}, s, val(x).bound, {-2, -1}, 0, true);
          return true;
        }
        const int64_t d0 = between(0, r - 1), d1 = chance(0.1) ? d0 : between(0, r - 1);
        std::swap(s[d0], s[d1]);
        emit(op, {x}, s, val(x).bound, {axis_repr(d0, r), axis_repr(d1, r)});
        return true;
      }
      case OpKind::Permute: {
        const int x = pick(ranked(1, 4), forced);
        if (x < 0) return false;
        const Dims s = shape(x);
        const int64_t r = rank_of(s);
        std::vector<int64_t> perm(r);
        for (int64_t i = 0; i < r; ++i) perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), rng_);
        Dims out(r);
        std::vector<int64_t> repr(r);
        for (int64_t i = 0; i < r; ++i) {
          out[i] = s[perm[i]];
          repr[i] = axis_repr(perm[i], r);
        }
        emit(op, {x}, out, val(x).bound, repr);
        return true;
      }
      case OpKind::BroadcastTo: {
        const int x = pick(any, forced);
        if (x < 0) return false;
        const Dims s = shape(x);
        Dims out;
        for (int64_t i = 0, lead = between(0, 4 - rank_of(s)); i < lead; ++i)
          out.push_back(between(1, 4));
        for (int64_t d : s) out.push_back(d == 1 && chance(0.6) ? between(2, 4) : d);
        if (numel_of(out) > kMaxNumel) return false;
        emit(op, {x}, out, val(x).bound, out);
        return true;
      }
      case OpKind::Concat:
        return concat(forced);
      case OpKind::Slice: {
        const int x = pick(ranked(1, 4), forced);
        if (x < 0) return false;
        Dims s = shape(x);
        const int64_t r = rank_of(s), axis = between(0, r - 1), n = s[axis];
        const int64_t start = between(0, n - 1), stop = between(start + 1, n);
        static const int64_t kSteps[] = {1, 1, 2, 3};
        const int64_t step = kSteps[between(0, 3)];
        s[axis] = (stop - start - 1) / step + 1;
        const int64_t start_repr = chance(0.3) ? start - n : start;
        const int64_t stop_repr =
            stop == n ? (chance(0.3) ? n + between(1, 5) : n) : (chance(0.3) ? stop - n : stop);
        emit(op, {x}, s, val(x).bound, {axis_repr(axis, r), start_repr, stop_repr, step});
        return true;
      }
      case OpKind::Mse: {
        int a = pick(any, forced);
        if (a < 0) return false;
        const Dims s = shape(a);
        int b = pick([&](int v) { return v != a && shape(v) == s; });
        if (b < 0 && chance(0.7)) b = new_leaf_of(s, false, 0.3);
        if (b < 0) b = a;
        if (chance(0.5)) std::swap(a, b);
        a = squash(a, 30);
        b = squash(b, 30);
        const double bound = std::pow(val(a).bound + val(b).bound, 2);
        emit(op, {a, b}, {}, bound);
        return true;
      }
      case OpKind::CrossEntropy:
        return cross_entropy(forced);
      case OpKind::Conv2d:
        return conv2d(forced);
      case OpKind::MaxPool2d:
      case OpKind::AvgPool2d:
        return pool2d(op, forced);
      case OpKind::GlobalAvgPool2d: {
        const int x = image_input(forced);
        if (x < 0) return false;
        emit(op, {x}, {shape(x)[0], shape(x)[1]}, val(x).bound);
        return true;
      }
      case OpKind::BatchNorm:
        return batch_norm(forced);
      case OpKind::Dropout: {
        int x = pick(any, forced);
        if (x < 0) return false;
        x = squash(x, 1e3);
        static const double kRatios[] = {0, 0.1, 0.25, 0.5, 0.5, 0.8};
        const double ratio = kRatios[between(0, 5)];
        const bool training = chance(0.9);
        emit(op, {x}, shape(x), training ? val(x).bound / (1 - ratio) : val(x).bound, {}, ratio,
             training);
        return true;
      }
    }
    return false;
  }

  // A value of rank 4 to read as [N,C,H,W]: `forced` (when it has rank 4), an existing one, or,
  // when there is none, no step is forced and an argument is left, often a new argument.
  int image_input(int forced) {
    const int x = pick([this](int v) { return rank(v) == 4; }, forced);
    if (x >= 0 || forced >= 0 || !can_add_leaf(false) || !chance(0.6)) return x;
    return new_leaf(image_dims(), false, chance(0.6));
  }

  struct Window {
    int64_t stride, padding, dilation, out;
  };

  // Stride, padding (at most 2) and dilation of a conv2d with a kernel of k over n, or nullopt
  // when the kernel does not fit.
  std::optional<Window> conv_window(int64_t n, int64_t k) {
    static const int64_t kStrides[] = {1, 1, 2, 3};
    int64_t dilation = k > 1 && chance(0.3) ? 2 : 1;
    if (dilation * (k - 1) + 1 > n + 4) dilation = 1;
    const int64_t extent = dilation * (k - 1) + 1;
    const int64_t min_pad = std::max<int64_t>(0, (extent - n + 1) / 2);
    if (min_pad > 2) return std::nullopt;
    const int64_t pad = chance(0.5) ? min_pad : between(min_pad, 2);
    const int64_t stride = kStrides[between(0, 3)];
    return Window{stride, pad, dilation, (n + 2 * pad - extent) / stride + 1};
  }

  // conv2d(x [N,C,H,W], w [O,C/groups,kh,kw], bias [O]?): w a new leaf (mostly a parameter) or
  // an existing value that fits, bias an existing value or a new leaf.
  bool conv2d(int forced) {
    int x = image_input(forced);
    if (x < 0) return false;
    const Dims sx = shape(x);
    const int64_t c = sx[1];
    int w = -1;
    Dims sw;
    if (chance(0.15)) {
      w = pick([&](int v) {
        const Dims s = shape(v);
        return v != x && s.size() == 4 && c % s[1] == 0 && s[0] % (c / s[1]) == 0 && s[2] <= 5 &&
               s[3] <= 5;
      });
      if (w >= 0) sw = shape(w);
    }
    if (w < 0) {
      std::vector<int64_t> divisors;
      for (int64_t g = 1; g <= c; ++g)
        if (c % g == 0) divisors.push_back(g);
      const int64_t groups =
          chance(0.35) ? divisors[between(0, static_cast<int64_t>(divisors.size()) - 1)] : 1;
      const int64_t kh = between(1, 3), kw = chance(0.6) ? kh : between(1, 3);
      sw = {groups * between(1, std::max<int64_t>(1, 6 / groups)), c / groups, kh, kw};
    }
    const int64_t groups = c / sw[1], taps = sw[1] * sw[2] * sw[3];
    const std::optional<Window> wh = conv_window(sx[2], sw[2]), ww = conv_window(sx[3], sw[3]);
    if (!wh || !ww) return false;
    const Dims out = {sx[0], sw[0], wh->out, ww->out};
    if (numel_of(out) > kMaxNumel || numel_of(out) * taps > kMaxConvWork) return false;
    if (w < 0) w = new_leaf_of(sw, chance(0.9), 0.85);
    if (w < 0) return false;
    int bias = -1;
    if (chance(0.6)) {
      bias = pick([&](int v) { return shape(v) == Dims{sw[0]}; });
      if (bias < 0 || chance(0.5)) {
        const int leaf = new_leaf_of({sw[0]}, chance(0.85), 0.85);
        if (leaf >= 0) bias = leaf;
      }
    }
    x = squash(x, 3);
    w = squash(w, 3);
    std::vector<int> ins = {x, w};
    double bound = static_cast<double>(taps) * val(x).bound * val(w).bound;
    if (bias >= 0) {
      bias = squash(bias, 1e3);
      ins.push_back(bias);
      bound += val(bias).bound;
    }
    emit(OpKind::Conv2d, ins, out, bound,
         {wh->stride, ww->stride, wh->padding, ww->padding, wh->dilation, ww->dilation, groups}, 0,
         bias >= 0);
    return true;
  }

  // max_pool2d or avg_pool2d with a kernel of 1 to 3 (within x), the stride given or the
  // default, padding at most half the kernel.
  bool pool2d(OpKind op, int forced) {
    const int x = image_input(forced);
    if (x < 0) return false;
    const Dims sx = shape(x);
    const int64_t kh = between(1, std::min<int64_t>(3, sx[2]));
    const int64_t kw = chance(0.5) && kh <= sx[3] ? kh : between(1, std::min<int64_t>(3, sx[3]));
    const bool strided = chance(0.5);
    const int64_t sh = strided ? between(1, 3) : kh;
    const int64_t sw = strided ? (chance(0.5) ? sh : between(1, 3)) : kw;
    const bool padded = chance(0.4);
    const int64_t ph = padded ? between(0, kh / 2) : 0, pw = padded ? between(0, kw / 2) : 0;
    const Dims out = {sx[0], sx[1], (sx[2] + 2 * ph - kh) / sh + 1, (sx[3] + 2 * pw - kw) / sw + 1};
    if (numel_of(out) > kMaxNumel) return false;
    std::vector<int64_t> ints = {kh, kw, sh, sw, ph, pw};
    if (op == OpKind::AvgPool2d) ints.push_back(chance(0.5) ? 1 : 0);
    emit(op, {x}, out, val(x).bound, ints, 0, strided);
    return true;
  }

  // batch_norm(x [N,C] or [N,C,H,W], running statistics?, gamma and beta?), training or eval.
  // The running statistics are a new pair or one already used by another batch_norm (a module
  // applied twice, or eval after training, in one call); eval needs them. Training needs two
  // values per channel at least, and does not update statistics an earlier eval step read (its
  // backward needs them unchanged, as in PyTorch).
  bool batch_norm(int forced) {
    const bool training = chance(0.7);
    int x = pick(
        [&](int v) {
          const Dims s = shape(v);
          return (s.size() == 2 || s.size() == 4) && (!training || numel_of(s) / s[1] >= 2);
        },
        forced);
    if (x < 0 && forced < 0 && can_add_leaf(false) && chance(0.6))
      x = new_leaf(image_dims(), false, chance(0.6));
    if (x < 0) return false;
    const int64_t c = shape(x)[1];
    int state = -1;
    if (!training || chance(0.75)) {
      std::vector<int> fit;
      for (size_t i = 0; i < p_.states.size(); ++i)
        if (p_.states[i] == c && !(training && eval_read_[i])) fit.push_back(static_cast<int>(i));
      const bool room = static_cast<int>(p_.states.size()) < kMaxStates;
      if (!fit.empty() && (!room || chance(0.4))) {
        state = fit[between(0, static_cast<int64_t>(fit.size()) - 1)];
      } else if (room) {
        state = static_cast<int>(p_.states.size());
        p_.states.push_back(c);
        eval_read_.push_back(false);
      }
      if (state < 0 && !training) return false;
    }
    int gamma = -1, beta = -1;
    if (chance(0.6)) {
      const auto channels = [&] {
        int v = chance(0.25) ? pick([&](int u) { return shape(u) == Dims{c}; }) : -1;
        if (v < 0) v = new_leaf_of({c}, chance(0.9), 0.85);
        return v;
      };
      gamma = channels();
      beta = channels();
      if (gamma < 0 || beta < 0) gamma = beta = -1;
    }
    // Training inputs stay within 30, so the running means do too.
    x = squash(x, training ? 30 : 1e3);
    std::vector<int> ins = {x};
    double scale = 1, shift = 0;
    if (gamma >= 0) {
      gamma = squash(gamma, 30);
      beta = squash(beta, 1e3);
      ins.push_back(gamma);
      ins.push_back(beta);
      scale = val(gamma).bound;
      shift = val(beta).bound;
    }
    // Training: |x - mean| / sqrt(var) is at most sqrt(count). Eval: the running variances
    // mostly stay above 0.02 over the calls of a test (momentum at most 0.3), so 1 / sqrt(var)
    // is below 8 (a rough bound, as the others).
    const double count = static_cast<double>(numel_of(shape(x)) / c);
    const double norm = training ? std::sqrt(count) : (val(x).bound + 31) * 8;
    static const double kMomenta[] = {0.1, 0.1, 0.3, 0};
    const double momentum = kMomenta[between(0, 3)], eps = chance(0.7) ? 1e-5 : 1e-3;
    if (state >= 0 && !training) eval_read_[state] = true;
    emit(OpKind::BatchNorm, ins, shape(x), norm * scale + shift,
         {state, training ? 1 : 0, gamma >= 0 ? 1 : 0}, momentum);
    p_.steps.back().scalar2 = eps;
    return true;
  }

  // x (+ - * /) y, y broadcast-compatible with x: an existing value, a new leaf of a variant of
  // x's shape, or a keepdims sum of x.
  bool binary(OpKind op, int forced) {
    int a = pick([](int) { return true; }, forced);
    if (a < 0) return false;
    const Dims sa = shape(a);
    Dims out;
    int b = pick([&](int v) {
      Dims o;
      return v != a && broadcast_dims(sa, shape(v), o) && numel_of(o) <= kMaxNumel;
    });
    if (b < 0 || chance(0.25)) {
      const int64_t what = between(0, 2);
      if (what == 0 && rank_of(sa) > 0) {
        b = new_leaf_of(variant(sa), chance(0.5), 0.6);
      } else if (what == 1 && rank_of(sa) > 0) {
        std::vector<int64_t> axes;
        Dims kept = sa;
        for (int64_t i = 0; i < rank_of(sa); ++i)
          if (chance(0.5)) {
            axes.push_back(i);
            kept[i] = 1;
          }
        if (!axes.empty())
          b = emit(OpKind::Sum, {a}, kept, val(a).bound * numel_of(sa), axes, 0, true);
      }
      if (b < 0) b = a;
    }
    if (chance(0.5)) std::swap(a, b);
    if (op == OpKind::Mul) {
      a = squash(a, 30);
      b = squash(b, 30);
    } else {
      a = squash(a, 1e3);
      b = squash(b, 1e3);
    }
    broadcast_dims(shape(a), shape(b), out);
    const double ba = val(a).bound, bb = val(b).bound;
    const double bound = op == OpKind::Add || op == OpKind::Sub ? ba + bb
                         : op == OpKind::Mul                    ? ba * bb
                         : op == OpKind::DivSigmoid             ? ba / 1.5
                                                                : ba * std::exp(1.0);
    emit(op, {a, b}, out, bound);
    return true;
  }

  // [M,K]x[K,N], [B,M,K]x[B,K,N], [B,M,K]x[K,N]; the right operand an existing value, a new
  // leaf, or the left one transposed.
  bool matmul(int forced) {
    int a = pick([&](int v) { return rank(v) == 2 || rank(v) == 3; }, forced);
    if (a < 0) return false;
    const Dims sa = shape(a);
    const int64_t k = sa.back();
    int b = pick([&](int v) {
      const Dims s = shape(v);
      if (s.size() == 2) return s[0] == k;
      return s.size() == 3 && sa.size() == 3 && s[0] == sa[0] && s[1] == k;
    });
    bool transposed_self = false;
    if (b < 0 || chance(0.3)) {
      const int64_t n = between(1, 6);
      int leaf = -1;
      if (chance(0.6)) {
        Dims s = sa.size() == 3 && chance(0.5) ? Dims{sa[0], k, n} : Dims{k, n};
        leaf = new_leaf_of(s, chance(0.6), 0.8);
      }
      if (leaf >= 0) {
        b = leaf;
      } else if (b < 0) {
        Dims st = sa;
        std::swap(st[st.size() - 2], st[st.size() - 1]);
        b = emit(OpKind::Transpose, {a}, st, val(a).bound, {-2, -1}, 0, true);
        transposed_self = true;
      }
    }
    if (transposed_self && chance(0.5)) std::swap(a, b);  // a^T a instead of a a^T
    const Dims s0 = shape(a), s1 = shape(b);
    Dims out;
    if (s0.size() == 3) out.push_back(s0[0]);
    out.push_back(s0[s0.size() - 2]);
    out.push_back(s1.back());
    if (numel_of(out) > kMaxNumel) return false;
    const double kk = static_cast<double>(s0.back());
    a = squash(a, 3);
    b = squash(b, 3);
    emit(OpKind::Matmul, {a, b}, out, kk * val(a).bound * val(b).bound);
    return true;
  }

  // linear(x, w[out, in], bias[out]?) with w and bias existing values or new leaves.
  bool linear(int forced) {
    int x = pick([&](int v) { return rank(v) >= 1; }, forced);
    if (x < 0) return false;
    const Dims sx = shape(x);
    const int64_t in = sx.back();
    int w = pick([&](int v) { return rank(v) == 2 && shape(v)[1] == in; });
    if (w < 0 || chance(0.5)) {
      const int leaf = new_leaf_of({between(1, 6), in}, chance(0.8), 0.85);
      if (leaf >= 0) w = leaf;
    }
    if (w < 0) return false;
    const int64_t out_features = shape(w)[0];
    Dims out(sx.begin(), sx.end() - 1);
    out.push_back(out_features);
    if (numel_of(out) > kMaxNumel) return false;
    int bias = -1;
    if (chance(0.6)) {
      bias = pick([&](int v) { return shape(v) == Dims{out_features}; });
      if (bias < 0 || chance(0.5)) {
        const int leaf = new_leaf_of({out_features}, chance(0.8), 0.85);
        if (leaf >= 0) bias = leaf;
      }
    }
    x = squash(x, 3);
    w = squash(w, 3);
    std::vector<int> ins = {x, w};
    double bound = static_cast<double>(in) * val(x).bound * val(w).bound;
    if (bias >= 0) {
      bias = squash(bias, 1e3);
      ins.push_back(bias);
      bound += val(bias).bound;
    }
    emit(OpKind::Linear, ins, out, bound, {}, 0, bias >= 0);
    return true;
  }

  bool reduce(OpKind op, int forced) {
    int x = pick([](int) { return true; }, forced);
    if (x < 0) return false;
    if (op == OpKind::Sum) x = squash(x, 1e3);
    const Dims s = shape(x);
    const int64_t r = rank_of(s);
    std::vector<int64_t> axes;
    for (int64_t i = 0; i < r; ++i)
      if (chance(0.5)) axes.push_back(i);
    if (axes.empty() && r > 0 && chance(0.5)) axes.push_back(between(0, r - 1));
    std::shuffle(axes.begin(), axes.end(), rng_);
    const bool keepdims = chance(0.5);
    Dims out;
    int64_t count = 1;
    for (int64_t i = 0; i < r; ++i) {
      const bool reduced = axes.empty() || std::find(axes.begin(), axes.end(), i) != axes.end();
      if (reduced) count *= s[i];
      if (!reduced || keepdims) out.push_back(reduced ? 1 : s[i]);
    }
    for (int64_t& a : axes) a = axis_repr(a, r);
    const double b = val(x).bound;
    emit(op, {x}, out, op == OpKind::Sum ? b * static_cast<double>(count) : b, axes, 0, keepdims);
    return true;
  }

  bool reshape(int forced) {
    const int x = pick([](int) { return true; }, forced);
    if (x < 0) return false;
    int64_t n = numel_of(shape(x));
    const int64_t r = between(1, 4);
    Dims out(r, 1);
    for (int64_t f = 2; n > 1;) {  // each prime factor to a random dimension
      if (n % f == 0) {
        out[between(0, r - 1)] *= f;
        n /= f;
      } else {
        ++f;
      }
    }
    std::vector<int64_t> repr = out;
    if (chance(0.3)) repr[between(0, r - 1)] = -1;
    emit(OpKind::Reshape, {x}, out, val(x).bound, repr);
    return true;
  }

  bool concat(int forced) {
    const int x = pick([&](int v) { return rank(v) >= 1; }, forced);
    if (x < 0) return false;
    const Dims s = shape(x);
    const int64_t r = rank_of(s), axis = between(0, r - 1);
    auto fits = [&](int v) {
      const Dims t = shape(v);
      if (t.size() != s.size()) return false;
      for (int64_t d = 0; d < r; ++d)
        if (d != axis && t[d] != s[d]) return false;
      return true;
    };
    std::vector<int> ins = {x};
    for (int64_t i = 0, more = between(1, 2); i < more; ++i) {
      int y = pick(fits);
      if (y < 0 || chance(0.2)) y = x;
      ins.push_back(y);
    }
    std::shuffle(ins.begin(), ins.end(), rng_);
    Dims out = s;
    out[axis] = 0;
    double bound = 0;
    for (int v : ins) {
      out[axis] += shape(v)[axis];
      bound = std::max(bound, val(v).bound);
    }
    if (numel_of(out) > kMaxNumel) return false;
    emit(OpKind::Concat, ins, out, bound, {axis_repr(axis, r)});
    return true;
  }

  // softmax_cross_entropy(logits [N,C], labels [N]): the labels are one int argument, made on
  // first use; logits of another rank are reshaped to 2-D first.
  bool cross_entropy(int forced) {
    int x = pick([](int) { return true; }, forced);
    if (x < 0) return false;
    const Dims s = shape(x);
    Dims logits = s;
    if (s.size() == 0) logits = {1, 1};
    if (s.size() == 1) logits = {1, s[0]};
    if (s.size() > 2) logits = {numel_of(s) / s.back(), s.back()};
    const Leaf* labels = nullptr;
    for (const Leaf& l : p_.leaves)
      if (val(l.value).labels) labels = &l;
    if (labels != nullptr &&
        (val(labels->value).shape[0] != logits[0] || labels->classes > logits[1]))
      return false;
    int label_value = labels ? labels->value : -1;
    if (label_value < 0) {
      label_value = add_value({logits[0]}, false, 0);
      Leaf l;
      l.value = label_value;
      l.index = p_.num_args++;
      l.label_dtype = chance(0.5) ? DType::Int64 : DType::Int32;
      l.classes = logits[1];
      l.ignores_some = chance(0.3);
      p_.values[label_value].labels = true;
      p_.values[label_value].leaf = static_cast<int>(p_.leaves.size());
      p_.leaves.push_back(l);
    }
    x = squash(x, 1e3);
    if (logits != s) {
      std::vector<int64_t> repr = logits;
      if (chance(0.5)) repr[0] = -1;
      x = emit(OpKind::Reshape, {x}, logits, val(x).bound, repr);
    }
    emit(OpKind::CrossEntropy, {x, label_value}, {},
         2 * val(x).bound + std::log(static_cast<double>(logits[1])));
    return true;
  }

  std::mt19937_64 rng_;
  Program p_;
  std::vector<bool> eval_read_;  // by state: read by an eval batch_norm step
};

// ---- The interpreter --------------------------------------------------------------------

// `states` holds the running mean and variance of pair i at 2i and 2i + 1.
Tensor apply_step(const Step& s, const std::vector<Tensor>& v, const std::vector<Tensor>& states) {
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
    case OpKind::Matmul:
      return F::matmul(in(0), in(1));
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
std::vector<Tensor> run_program(const Program& p, std::span<const Tensor> args,
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

double draw(std::mt19937_64& rng, double lo, double hi) {
  return lo + (hi - lo) * (static_cast<double>(rng() >> 11) * 0x1.0p-53);
}

CallData draw_call(const Program& p, int call) {
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
std::vector<std::vector<double>> draw_states(const Program& p, int call) {
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
void write_as(const Tensor& t, const std::vector<double>& x) {
  T* d = static_cast<T*>(t.raw_data());
  for (size_t i = 0; i < x.size(); ++i) d[i] = static_cast<T>(x[i]);
}

// A tensor holding x, written directly (no op).
Tensor make_tensor(const std::vector<double>& x, const Dims& dims, DType dtype) {
  Tensor t = Tensor::empty(Shape(std::span<const int64_t>(dims)), dtype);
  if (dtype == DType::Float32) write_as<float>(t, x);
  if (dtype == DType::Float64) write_as<double>(t, x);
  if (dtype == DType::Int32) write_as<int32_t>(t, x);
  if (dtype == DType::Int64) write_as<int64_t>(t, x);
  return t;
}

Tensor make_leaf(const Program& p, const Leaf& l, const std::vector<double>& x) {
  const Value& v = p.values[l.value];
  Tensor t = make_tensor(x, v.shape, v.labels ? l.label_dtype : p.dtype);
  if (v.requires_grad) t.set_requires_grad();
  return t;
}

// The arguments of one call, in argument order.
std::vector<Tensor> make_args(const Program& p, const CallData& d) {
  std::vector<Tensor> args(p.num_args);
  for (size_t i = 0; i < p.leaves.size(); ++i)
    if (!p.leaves[i].param) args[p.leaves[i].index] = make_leaf(p, p.leaves[i], d.leaves[i]);
  return args;
}

std::vector<Tensor> make_params(const Program& p, const CallData& d) {
  std::vector<Tensor> params(p.num_params);
  for (size_t i = 0; i < p.leaves.size(); ++i)
    if (p.leaves[i].param) params[p.leaves[i].index] = make_leaf(p, p.leaves[i], d.leaves[i]);
  return params;
}

std::vector<Tensor> make_states(const Program& p, const std::vector<std::vector<double>>& d) {
  std::vector<Tensor> states;
  for (size_t i = 0; i < d.size(); ++i)
    states.push_back(make_tensor(d[i], {p.states[i / 2]}, p.dtype));
  return states;
}

std::string state_name(size_t i) {
  return absl::StrCat("running ", i % 2 ? "var" : "mean", " of state", i / 2);
}

// The CPU generator's position.
struct GenState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  bool operator==(const GenState&) const = default;
  std::string str() const { return absl::StrCat("(seed ", seed, ", offset ", offset, ")"); }
};

GenState gen_state() {
  const Generator::Stream s = default_generator(Device::cpu()).state();
  return {s.seed, s.offset};
}

void set_gen_state(const GenState& s) {
  default_generator(Device::cpu()).set_state(s.seed, s.offset);
}

// A copy of t's bytes (no op, no graph).
Tensor snapshot(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  std::memcpy(c.raw_data(), t.raw_data(), t.nbytes());
  return c;
}

double element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::Float32:
      return static_cast<const float*>(t.raw_data())[i];
    case DType::Float64:
      return static_cast<const double*>(t.raw_data())[i];
    default:
      return 0;
  }
}

// Empty when `got` and `want` are both undefined or have the same dtype, shape and bytes.
std::string difference(const Tensor& got, const Tensor& want) {
  if (got.defined() != want.defined())
    return absl::StrCat("static is ", got.defined() ? got.str() : "undefined", ", eager is ",
                        want.defined() ? want.str() : "undefined");
  if (!got.defined()) return "";
  if (got.dtype() != want.dtype() || !(got.shape() == want.shape()))
    return absl::StrCat("static is ", got.str(), ", eager is ", want.str());
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

void backward(const Program& p, const std::vector<Tensor>& outs, const CallData& d) {
  std::vector<Tensor> roots, grads;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!p.values[p.outputs[i]].requires_grad) continue;
    roots.push_back(outs[i]);
    grads.push_back(make_tensor(d.grads[i], p.values[p.outputs[i]].shape, p.dtype));
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
void with_static(const Program& p, const std::vector<Tensor>& params,
                 const std::vector<Tensor>& states, const std::function<void(StaticRun&)>& body,
                 std::index_sequence<I...>) {
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

void with_static(const Program& p, const std::vector<Tensor>& params,
                 const std::vector<Tensor>& states, const std::function<void(StaticRun&)>& body) {
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

std::vector<FreshMask> fresh_masks(const Program& p, const std::vector<Tensor>& c_values,
                                   const std::vector<Tensor>& d_values) {
  std::vector<FreshMask> found;
  for (size_t i = 0; i < p.outputs.size(); ++i) {
    for (const Step& s : p.steps) {
      if (s.out != p.outputs[i] || s.op != OpKind::Dropout || !s.flag || s.scalar <= 0) continue;
      const Tensor &a = c_values[s.in[0]], &b = d_values[s.in[0]];
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
  }

  std::string str(int64_t programs) const {
    std::string s = absl::StrCat("of ", programs, " programs: ");
    for (size_t k = 0; k < std::size(kOps); ++k)
      absl::StrAppend(&s, kOps[k].name, " ", with_op[k], ", ");
    absl::StrAppend(&s, "a dropout that draws ", drawing, ", running statistics ", with_states,
                    " (shared ", shared_states, "); fresh-mask comparisons ", fresh_mask_checks);
    return s;
  }
};

// Runs one program traced (call 0) and replayed (calls 1, 2 and, when it draws random numbers,
// 3 on the inputs of 2) against eager runs on the same inputs and from the same generator
// state; the problems found go to `check`.
void check_program(const Program& p, Checker& check, Coverage& cover) {
  const CallData init = draw_call(p, 100);
  std::vector<Tensor> sparams = make_params(p, init), eparams = make_params(p, init);
  const std::vector<std::vector<double>> init_states = draw_states(p, 100);
  std::vector<Tensor> sstates = make_states(p, init_states);
  std::vector<Tensor> estates = make_states(p, init_states);
  set_gen_state({p.seed, 0});  // so that a program run alone draws what it drew among others
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
              if (update) copy_(t, make_tensor(upd.leaves[i], p.values[l.value].shape, p.dtype));
              if (p.param_grads == GradState::Cleared) t.set_grad(Tensor());
              if (p.param_grads == GradState::Zeroed && t.grad().defined()) fill_(t.grad(), 0);
            }
          }
          if (update) {
            const std::vector<std::vector<double>> us = draw_states(p, 100 + call);
            for (size_t i = 0; i < us.size(); ++i) {
              NoGradGuard no_grad;
              const Tensor t = make_tensor(us[i], {p.states[i / 2]}, p.dtype);
              copy_(sstates[i], t);
              copy_(estates[i], t);
            }
          }
        }
        sargs.push_back(make_args(p, d));
        eargs.push_back(make_args(p, d));
        if (p.preset_grads) {
          for (size_t i = 0; i < p.leaves.size(); ++i) {
            const Leaf& l = p.leaves[i];
            if (!p.values[l.value].requires_grad || (l.param && call > 0)) continue;
            for (const Tensor& t :
                 l.param ? std::vector<Tensor>{sparams[l.index], eparams[l.index]}
                         : std::vector<Tensor>{sargs.back()[l.index], eargs.back()[l.index]})
              Tensor(t).set_grad(make_tensor(d.presets[i], p.values[l.value].shape, p.dtype));
          }
        }
        // The eager reference starts from the generator state the static call starts from, and
        // both must leave it in the same state.
        const GenState g0 = gen_state();
        phase = "eager forward";
        eouts.push_back(run_program(p, eargs.back(), eparams, estates, true, &evalues[call]));
        const GenState ge = gen_state();
        set_gen_state(g0);
        phase = "static forward";
        souts.push_back(st.call(sargs.back()));
        const GenState gs = gen_state();
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
        const GenState b0 = gen_state();
        phase = "eager backward";
        backward(p, eouts.back(), d);
        const GenState be = gen_state();
        set_gen_state(b0);
        phase = "static backward";
        backward(p, souts.back(), d);
        const GenState bs = gen_state();
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
                         souts[call - 1][i], snaps[call - 1][i]);
          for (int a = 0; a < p.num_args; ++a)
            check.same(absl::StrCat(prev, " grad of arg", a, " after ", c),
                       sargs[call - 1][a].grad(), eargs[call - 1][a].grad());
        }
        if (call == 3) {  // fresh masks: a dropout's output differs from call C's
          for (const FreshMask& f : fresh_masks(p, evalues[2], evalues[3])) {
            ++cover.fresh_mask_checks;
            check.expect(!difference(souts[3][f.output], snaps[2][f.output]).empty(),
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

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  return std::strtoull(s, nullptr, 0);
}

}  // namespace

TEST_CASE("static_graph replays random programs bit for bit as eager runs them",
          "[static][random]") {
  const uint64_t base = env_u64("ENCORE_RANDOM_SEED", kDefaultSeed);
  const auto programs = static_cast<int64_t>(env_u64("ENCORE_RANDOM_PROGRAMS", kDefaultPrograms));
  const GenState saved = gen_state();
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
    check_program(p, check, cover);
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
  set_gen_state(saved);
  if (std::getenv("ENCORE_RANDOM_COVERAGE") != nullptr) WARN(cover.str(programs));
  if (programs >= 2000) {  // the default run makes every op and every kind of check often
    INFO(cover.str(programs));
    for (size_t k = 0; k < std::size(kOps); ++k) CHECK(cover.with_op[k] >= programs / 200);
    CHECK(cover.drawing >= programs / 50);
    CHECK(cover.shared_states >= programs / 500);
    CHECK(cover.fresh_mask_checks >= programs / 200);
  }
}
