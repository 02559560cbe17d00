// Random programs over the op set of functions.h, for the randomized differential test of
// static_graph (static_random_test.cc on the cpu, cuda/cuda_static_test.cc on cuda:0): a Program
// is a list of steps over values (arguments, captured parameters and batch-norm running statistics,
// step results), a deterministic function of its seed (random_program_gen.h), interpreted and
// checked against eager runs by random_program_check.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "encore/functions.h"

namespace encore::random_program {

using Dims = std::vector<int64_t>;

inline constexpr int64_t kMaxNumel = 1024;  // per value, so that a program stays cheap
inline constexpr int kMaxFloatArgs = 3;
inline constexpr int kMaxParams = 5;
inline constexpr int kMaxStates = 2;            // pairs of batch-norm running statistics
inline constexpr int64_t kMaxConvWork = 20000;  // multiply-adds of one conv2d forward

// The composite forms keep values finite: div_sigmoid is a / (1.5 + sigmoid(b)), div_exp is
// a / exp(tanh(b)), rdiv_scalar is s / (1 + x*x), exp_tanh is exp(tanh(x)), and log_sq, sqrt_sq
// and pow_sq apply log, sqrt and pow to 1 + x*x.
// clang-format off
enum class OpKind {
  Add, Sub, Mul, DivSigmoid, DivExp, AddScalar, SubScalar, RsubScalar, MulScalar, DivScalar,
  RdivScalar, Neg, ExpTanh, LogSq, SqrtSq, PowSq, Relu, LeakyRelu, Sigmoid, Tanh, Gelu, Matmul,
  Linear, Sum, Mean, Max, Reshape, Flatten, Transpose, Permute, BroadcastTo, Concat, Slice,
  Softmax, LogSoftmax, Mse, CrossEntropy, LayerNorm, MaskedFill, Conv2d, MaxPool2d, AvgPool2d,
  GlobalAvgPool2d, BatchNorm, Dropout
};
// clang-format on

struct OpInfo {
  const char* name;
  int weight;   // how often the generator draws it
  bool scalar;  // Step::scalar is an operand, an exponent, a slope or gelu's form (1: tanh)
};

// By OpKind.
// clang-format off
inline constexpr OpInfo kOps[] = {{"add", 4, false},               {"sub", 3, false},
                                  {"mul", 4, false},               {"div_sigmoid", 2, false},
                                  {"div_exp", 2, false},           {"add_scalar", 1, true},
                                  {"sub_scalar", 1, true},         {"rsub_scalar", 1, true},
                                  {"mul_scalar", 1, true},         {"div_scalar", 1, true},
                                  {"rdiv_scalar", 1, true},        {"neg", 1, false},
                                  {"exp_tanh", 1, false},          {"log_sq", 1, false},
                                  {"sqrt_sq", 1, false},           {"pow_sq", 1, true},
                                  {"relu", 2, false},              {"leaky_relu", 1, true},
                                  {"sigmoid", 1, false},           {"tanh", 2, false},
                                  {"gelu", 1, true},               {"matmul", 3, false},
                                  {"linear", 3, false},            {"sum", 3, false},
                                  {"mean", 2, false},              {"max", 2, false},
                                  {"reshape", 2, false},           {"flatten", 1, false},
                                  {"transpose", 2, false},         {"permute", 1, false},
                                  {"broadcast_to", 2, false},      {"concat", 2, false},
                                  {"slice", 2, false},             {"softmax", 1, false},
                                  {"log_softmax", 1, false},       {"mse", 1, false},
                                  {"cross_entropy", 1, false},     {"layer_norm", 2, false},
                                  {"masked_fill", 2, true},        {"conv2d", 4, false},
                                  {"max_pool2d", 2, false},        {"avg_pool2d", 2, false},
                                  {"global_avg_pool2d", 1, false}, {"batch_norm", 3, false},
                                  {"dropout", 3, false}};
// clang-format on

inline const OpInfo& info(OpKind k) {
  return kOps[static_cast<int>(k)];
}

inline std::string dims_str(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) absl::StrAppend(&s, i ? "," : "", d[i]);
  return s + "]";
}

inline int64_t numel_of(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

inline int rank_of(const Dims& d) {
  return static_cast<int>(d.size());
}

// The NumPy broadcast of a and b, or false when they do not broadcast.
inline bool broadcast_dims(const Dims& a, const Dims& b, Dims& out) {
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
// layer_norm: ints: the normalised trailing dims, then a mask (1: gamma, 2: beta, each the next
// input); scalar: eps. masked_fill: x, then a value whose elements > 0 make the mask (broadcast
// to x); scalar: the fill value.
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
  // Aliased arguments, at every call: argument `alias_arg` is the very tensor of argument
  // `alias_of` (alias_same), or a view into one storage with it, starting `alias_shift`
  // elements after it (the two overlap unless the shift passes its end). -1: none.
  int alias_arg = -1;
  int alias_of = -1;
  bool alias_same = false;
  int64_t alias_shift = 0;

  std::string listing() const;
};

inline bool image_op(OpKind k) {
  return static_cast<int>(k) >= static_cast<int>(OpKind::Conv2d);
}

// The attributes of an image op (conv2d to dropout) as the listing shows them.
inline std::string image_attrs(const Step& st) {
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

inline std::string Program::listing() const {
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
  if (alias_arg >= 0)
    s << "; argument " << alias_arg
      << (alias_same ? " is the same tensor as argument " : " shares one storage with argument ")
      << alias_of << (alias_same ? "" : absl::StrCat(", ", alias_shift, " elements after it"));
  return s.str();
}

// ---- The generator ----------------------------------------------------------------------

}  // namespace encore::random_program
