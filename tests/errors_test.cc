// Bad arguments raise encore::Error with a message a user can act on: the op, the argument,
// the shapes and dtypes involved, and what was expected.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "encore/functions.h"
#include "encore/nn.h"

using namespace encore;
using Catch::Matchers::Contains;
using Catch::Matchers::Matches;

namespace {

Tensor t32(const Shape& s) {
  return zeros(s, DType::Float32);
}
Tensor t64(const Shape& s) {
  return zeros(s, DType::Float64);
}
Tensor i32(const Shape& s) {
  return zeros(s, DType::Int32);
}
Tensor leaf(const Shape& s, DType dt = DType::Float32) {
  Tensor t = ones(s, dt);
  t.set_requires_grad();
  return t;
}

using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);
struct Binary {
  const char* name;
  BinaryFn fn;
};
const Binary kBinary[] = {{"add", &F::add}, {"sub", &F::sub}, {"mul", &F::mul}, {"div", &F::div}};

}  // namespace

// ---- Shapes and dtypes of binary and broadcasting ops -------------------------------------

TEST_CASE("binary ops name both shapes when they do not broadcast", "[errors]") {
  for (const Binary& op : kBinary) {
    CAPTURE(op.name);
    const std::string name = op.name;
    CHECK_THROWS_AS(op.fn(t32({2, 3}), t32({4})), Error);
    CHECK_THROWS_WITH(op.fn(t32({2, 3}), t32({4})),
                      Contains(name + ": shapes do not broadcast: a is [2,3], b is [4]"));
    CHECK_THROWS_WITH(op.fn(t32({2, 3, 4}), t32({3, 3})),
                      Contains(name + ": shapes do not broadcast: a is [2,3,4], b is [3,3]"));
  }
  CHECK_THROWS_WITH(t32({2, 3}) + t32({2}), Contains("add: shapes do not broadcast"));
  CHECK_THROWS_WITH(F::equal(t32({2, 3}), t32({3, 2})),
                    Contains("equal: shapes do not broadcast: a is [2,3], b is [3,2]"));
  CHECK_THROWS_WITH(F::greater(t32({5}), t32({4})),
                    Contains("greater: shapes do not broadcast: a is [5], b is [4]"));
  const Tensor cond = F::greater(t32({2, 3}), t32({2, 3}));
  CHECK_THROWS_WITH(F::where(cond, t32({3}), t32({2, 4})),
                    Contains("where: shapes do not broadcast") && Contains("[2,4]"));
  CHECK_THROWS_WITH(F::where(cond, t32({4}), t32({2, 3})),
                    Contains("where: shapes do not broadcast: cond is [2,3], a is [4]"));
  CHECK_THROWS_WITH(F::where(cond, t32({2, 3}), t32({4})),
                    Contains("where: shapes do not broadcast: cond and a broadcast together is "
                             "[2,3], b is [4]"));
  CHECK_THROWS_WITH(F::broadcast_to(t32({3}), {4, 1}),
                    Contains("broadcast_to: cannot broadcast [3] to [4,1]"));
  CHECK_THROWS_WITH(F::broadcast_to(t32({2, 3}), {3}),
                    Contains("broadcast_to") && Contains("[2,3]"));
  CHECK_THROWS_WITH(F::mean_squared_error(t32({2, 3}), t32({3, 2})),
                    Contains("mean_squared_error: shapes differ: a is [2,3], b is [3,2]"));
  CHECK_THROWS_WITH(F::sum_to(t32({2, 3}), {4}), Contains("sum_to: cannot sum [2,3] to [4]"));
  CHECK_THROWS_WITH(F::sum_to(t32({3}), {2, 3}),
                    Contains("sum_to: cannot sum [3] to the larger rank of [2,3]"));
  CHECK_THROWS_WITH(add_(t32({2, 3}), t32({4})), Contains("add_") && Contains("[4]"));
  CHECK_THROWS_WITH(add_(t32({3}), t32({2, 3})),
                    Contains("add_: other [2,3] does not broadcast to t [3]"));
  CHECK_THROWS_WITH(copy_(t32({2, 3}), t32({3, 2})),
                    Contains("copy_: shapes differ: dst is [2,3], src is [3,2]"));
}

TEST_CASE("ops name both dtypes when float32 meets float64", "[errors]") {
  for (const Binary& op : kBinary) {
    CAPTURE(op.name);
    CHECK_THROWS_WITH(
        op.fn(t32({2, 3}), t64({2, 3})),
        Contains(std::string(op.name) + ": dtypes differ: a is float32 [2,3], b is float64 [2,3]"));
  }
  CHECK_THROWS_WITH(F::matmul(t32({2, 3}), t64({3, 4})),
                    Contains("matmul: dtypes differ: a is float32 [2,3], b is float64 [3,4]"));
  CHECK_THROWS_WITH(F::linear(t32({2, 3}), t64({4, 3})),
                    Contains("linear: dtypes differ: x is float32 [2,3], weight is float64 [4,3]"));
  CHECK_THROWS_WITH(F::linear(t32({2, 3}), t32({4, 3}), t64({4})),
                    Contains("linear: dtypes differ: x is float32 [2,3], bias is float64 [4]"));
  CHECK_THROWS_WITH(
      F::mean_squared_error(t64({3}), t32({3})),
      Contains("mean_squared_error: dtypes differ: a is float64 [3], b is float32 [3]"));
  CHECK_THROWS_WITH(F::equal(t32({3}), t64({3})), Contains("equal: dtypes differ"));
  CHECK_THROWS_WITH(F::greater(i32({3}), t32({3})),
                    Contains("greater: dtypes differ: a is int32 [3], b is float32 [3]"));
  const Tensor cond = F::greater(t32({3}), t32({3}));
  CHECK_THROWS_WITH(F::where(cond, t32({3}), t64({3})),
                    Contains("where: dtypes differ: a is float32 [3], b is float64 [3]"));
  CHECK_THROWS_WITH(F::concat({t32({2, 3}), t64({2, 3})}),
                    Contains("concat: tensor 1 is float64 but tensor 0 is float32"));
  CHECK_THROWS_WITH(add_(t32({3}), t64({3})), Contains("add_: dtypes differ"));
}

TEST_CASE("gelu refuses an unknown approximation", "[errors]") {
  const Tensor x = t32({2, 3});
  CHECK_THROWS_WITH(
      F::gelu(x, "erf"),
      Contains("gelu: argument 'approximate' must be \"none\" or \"tanh\"") && Contains("\"erf\""));
  CHECK_THROWS_WITH(F::gelu(x, ""), Contains("gelu: argument 'approximate'"));
  CHECK_NOTHROW(F::gelu(x, "tanh"));
}

TEST_CASE("non-floating tensors are refused by floating ops", "[errors]") {
  const Tensor x = i32({2, 3});
  using UnaryFn = Tensor (*)(const Tensor&);
  const std::pair<const char*, UnaryFn> unary[] = {
      {"neg", &F::neg},   {"exp", &F::exp},         {"log", &F::log},  {"sqrt", &F::sqrt},
      {"relu", &F::relu}, {"sigmoid", &F::sigmoid}, {"tanh", &F::tanh}};
  for (const auto& [name, fn] : unary) {
    CAPTURE(name);
    CHECK_THROWS_WITH(fn(x),
                      Contains(std::string(name) +
                               ": argument 'x' must be float32 or float64, it is int32 [2,3]"));
  }
  CHECK_THROWS_WITH(F::leaky_relu(x),
                    Contains("leaky_relu: argument 'x' must be float32 or float64"));
  CHECK_THROWS_WITH(F::gelu(x), Contains("gelu: argument 'x' must be float32 or float64"));
  CHECK_THROWS_WITH(F::pow(x, 2),
                    Contains("pow: argument 'x' must be float32 or float64, it is int32"));
  CHECK_THROWS_WITH(F::mul(x, 2.0), Contains("mul: argument 'x'") && Contains("int32 [2,3]"));
  CHECK_THROWS_WITH(F::add(x, x),
                    Contains("add: argument 'a' must be float32 or float64, it is int32 [2,3]"));
  CHECK_THROWS_WITH(F::div(t32({2, 3}), x),
                    Contains("div: argument 'b' must be float32 or float64, it is int32"));
  CHECK_THROWS_WITH(F::matmul(x, i32({3, 2})),
                    Contains("matmul: argument 'a' must be float32 or float64"));
  CHECK_THROWS_WITH(
      F::linear(t32({2, 3}), i32({4, 3})),
      Contains("linear: argument 'weight' must be float32 or float64, it is int32 [4,3]"));
  CHECK_THROWS_WITH(F::sum(x),
                    Contains("sum: argument 'x' must be float32 or float64, it is int32 [2,3]"));
  CHECK_THROWS_WITH(F::mean(x, {0}), Contains("mean: argument 'x' must be float32 or float64"));
  CHECK_THROWS_WITH(F::max(x), Contains("max: argument 'x' must be float32 or float64"));
  CHECK_THROWS_WITH(F::softmax(x), Contains("softmax: argument 'x' must be float32 or float64"));
  CHECK_THROWS_WITH(F::log_softmax(x),
                    Contains("log_softmax: argument 'x' must be float32 or float64"));
  CHECK_THROWS_WITH(F::mean_squared_error(x, x), Contains("mean_squared_error: argument 'a'"));
  CHECK_THROWS_WITH(F::sum_to(x, {3}), Contains("sum_to: argument 'x' must be float32 or float64"));
  CHECK_THROWS_WITH(F::softmax_cross_entropy(i32({2, 3}), i32({2})),
                    Contains("softmax_cross_entropy: argument 'logits' must be float32 or float64, "
                             "it is int32 [2,3]"));
  const Tensor b = F::greater(t32({3}), t32({3}));
  CHECK_THROWS_WITH(F::where(b, i32({3}), i32({3})),
                    Contains("where: argument 'a' must be float32 or float64"));
  CHECK_THROWS_WITH(F::where(t32({3}), t32({3}), t32({3})),
                    Contains("where: cond must be bool, it is float32 [3]"));
  CHECK_THROWS_WITH(F::equal(b, b), Contains("equal: bool operands are not supported"));
  CHECK_THROWS_WITH(uniform_(x, 0, 1),
                    Contains("uniform_: argument 't' must be float32 or float64"));
}

// ---- Linear algebra ----------------------------------------------------------------------

TEST_CASE("matmul and linear name the mismatching shapes", "[errors]") {
  CHECK_THROWS_AS(F::matmul(t32({32, 784}), t32({100, 10})), Error);
  CHECK_THROWS_WITH(F::matmul(t32({32, 784}), t32({100, 10})),
                    Contains("matmul: inner dimensions differ: a is [32,784], b is [100,10]"));
  CHECK_THROWS_WITH(F::matmul(t32({2, 3, 4}), t32({2, 5, 6})),
                    Contains("matmul: inner dimensions differ: a is [2,3,4], b is [2,5,6]"));
  CHECK_THROWS_WITH(
      F::matmul(t32({2, 3, 4}), t32({3, 4, 5})),
      Contains("matmul: batch dimensions do not broadcast: a is [2,3,4], b is [3,4,5]"));
  CHECK_THROWS_WITH(
      F::matmul(t32({2, 3, 3, 4}), t32({2, 4, 5})),
      Contains("matmul: batch dimensions do not broadcast: a is [2,3,3,4], b is [2,4,5]"));
  CHECK_THROWS_WITH(F::matmul(t32({4}), t32({4, 2})),
                    Contains("matmul: operands must be at least 2-D: a is [4], b is [4,2]"));
  CHECK_THROWS_WITH(F::matmul(t32({1, 2, 3, 4}), t32({5, 2})),
                    Contains("matmul: inner dimensions differ: a is [1,2,3,4], b is [5,2]"));

  CHECK_THROWS_WITH(F::linear(t32({8, 5}), t32({3, 6})),
                    Contains("linear: x [8,5] does not match weight [3,6] (expected x [..., 6])"));
  CHECK_THROWS_WITH(F::linear(t32({8, 6}), t32({6})),
                    Contains("linear: weight must be 2-D [out, in], it is [6]"));
  CHECK_THROWS_WITH(F::linear(t32({8, 6}), t32({3, 6}), t32({4})),
                    Contains("linear: bias [4] does not match weight [3,6] (expected [3])"));
  CHECK_THROWS_WITH(F::linear(t32({8, 6}), t32({3, 6}), t32({1, 3})),
                    Contains("linear: bias [1,3] does not match weight [3,6] (expected [3])"));
}

// ---- Axes --------------------------------------------------------------------------------

TEST_CASE("reductions reject out-of-range and repeated axes", "[errors]") {
  using ReduceFn = Tensor (*)(const Tensor&, std::vector<int>, bool);
  const std::pair<const char*, ReduceFn> reductions[] = {
      {"sum", &F::sum}, {"mean", &F::mean}, {"max", &F::max}};
  const Tensor x = t32({2, 3});
  for (const auto& [name, fn] : reductions) {
    const std::string op = name;
    CAPTURE(op);
    CHECK_THROWS_WITH(fn(x, {2}, false), Contains(op + ": axis 2 is out of range for rank 2"));
    CHECK_THROWS_WITH(fn(x, {-3}, true), Contains(op + ": axis -3 is out of range for rank 2"));
    CHECK_THROWS_WITH(fn(x, {0, 0}, false), Contains(op + ": axis 0 is given twice"));
    CHECK_THROWS_WITH(fn(x, {1, -1}, false), Contains(op + ": axis -1 is given twice"));
    // A 0-d tensor's one axis is 0 or -1, as in PyTorch.
    CHECK_THROWS_WITH(fn(t32({}), {1}, false),
                      Contains(op + ": axis 1 is out of range for a 0-d tensor"));
    CHECK_THROWS_WITH(fn(t32({}), {-2}, false),
                      Contains(op + ": axis -2 is out of range for a 0-d tensor"));
    CHECK_THROWS_WITH(fn(t32({}), {0, -1}, false),
                      Contains(op + ": axis -1 is given twice (x is 0-d)"));
  }
  // max refuses only a reduction over an empty axis, naming it.
  CHECK_THROWS_WITH(F::max(t32({0, 3})),
                    Contains("max: cannot reduce x [0,3] over axis 0, which is empty"));
  CHECK_THROWS_WITH(F::max(t32({3, 0}), {-1}),
                    Contains("max: cannot reduce x [3,0] over axis 1, which is empty"));
}

TEST_CASE("softmax, concat, slice, permute, flatten and transpose reject bad axes", "[errors]") {
  const Tensor x = t32({2, 3});
  CHECK_THROWS_WITH(F::softmax(x, 2), Contains("softmax: axis 2 is out of range for rank 2"));
  CHECK_THROWS_WITH(F::log_softmax(x, -3),
                    Contains("log_softmax: axis -3 is out of range for rank 2"));
  CHECK_THROWS_WITH(F::softmax(t32({}), 1),
                    Contains("softmax: axis 1 is out of range for a 0-d tensor"));
  CHECK_THROWS_WITH(F::log_softmax(t32({}), -2),
                    Contains("log_softmax: axis -2 is out of range for a 0-d tensor"));

  CHECK_THROWS_WITH(F::concat({x, x}, 2), Contains("concat: axis 2 is out of range for rank 2"));
  CHECK_THROWS_WITH(F::concat({x, x}, -3), Contains("concat: axis -3 is out of range for rank 2"));
  CHECK_THROWS_WITH(
      F::concat({x, t32({2, 4})}, 0),
      Contains("concat: tensor 1 [2,4] does not match tensor 0 [2,3] outside axis 0"));
  CHECK_THROWS_WITH(
      F::concat({x, x, t32({2, 3, 1})}, 1),
      Contains("concat: tensor 2 [2,3,1] does not match tensor 0 [2,3] outside axis 1"));
  CHECK_THROWS_WITH(F::concat(std::span<const Tensor>()), Contains("concat: no tensors given"));
  CHECK_THROWS_WITH(F::concat({t32({}), t32({})}),
                    Contains("concat: cannot concatenate 0-d tensors"));

  CHECK_THROWS_WITH(F::slice(x, 2, 0, 1), Contains("slice: axis 2 is out of range for rank 2"));
  CHECK_THROWS_WITH(F::slice(x, -3, 0, 1), Contains("slice: axis -3 is out of range for rank 2"));
  CHECK_THROWS_WITH(F::slice(x, 0, 0, 2, 0), Contains("slice: step must be positive, it is 0"));
  CHECK_THROWS_WITH(F::slice(x, 0, 2, 0, -1), Contains("slice: step must be positive, it is -1"));
  CHECK_THROWS_WITH(F::split(x, {1, 1}, 2), Contains("split: axis 2 is out of range for rank 2"));
  CHECK_THROWS_WITH(F::split(x, {1, 3}, 1),
                    Contains("split: sizes add up to 4 but x [2,3] has 3 along axis 1"));
  CHECK_THROWS_WITH(F::split(x, {4, -1}, 1), Contains("split: sizes must be >= 0, got -1"));
  // Sizes whose sum overflows int64 (it wrapped, to the extent itself here) are refused.
  const int64_t q = int64_t{1} << 62;
  CHECK_THROWS_WITH(F::split(t32({0, 0}), {q, q, q, q}, 1),
                    Contains("split: sizes add up to more than 9223372036854775807 (x [0,0] has 0 "
                             "along axis 1)"));
  const int64_t big = std::numeric_limits<int64_t>::max();
  CHECK_THROWS_WITH(F::split(x, {big, big, 5}, 1), Contains("split: sizes add up to more than"));
  CHECK_THROWS_WITH(F::chunk(x, 2, 1),
                    Contains("chunk: x [2,3] has 3 along axis 1, not a positive multiple of 2"));
  CHECK_THROWS_WITH(F::slice(t32({}), 0, 0, 1), Contains("slice: cannot slice a 0-d tensor"));

  const Tensor y = t32({2, 3, 4});
  CHECK_THROWS_WITH(F::permute(y, {0, 1}), Contains("permute: 2 axes given for [2,3,4]"));
  CHECK_THROWS_WITH(F::permute(y, {0, 1, 2, 3}), Contains("permute: 4 axes given for [2,3,4]"));
  CHECK_THROWS_WITH(F::permute(y, {0, 0, 1}),
                    Contains("permute: axis 0 appears twice for [2,3,4]"));
  CHECK_THROWS_WITH(F::permute(y, {2, -1, 0}),
                    Contains("permute: axis -1 appears twice for [2,3,4]"));
  CHECK_THROWS_WITH(F::permute(y, {0, 3, 1}),
                    Contains("permute: axis 3 is out of range for rank 3"));

  CHECK_THROWS_WITH(F::flatten(y, 3), Contains("flatten: axis 3 is out of range for rank 3"));
  CHECK_THROWS_WITH(F::flatten(y, 0, -4), Contains("flatten: axis -4 is out of range for rank 3"));
  CHECK_THROWS_WITH(F::flatten(y, 2, 1),
                    Contains("flatten: start_dim 2 comes after end_dim 1 for [2,3,4]"));

  CHECK_THROWS_WITH(F::transpose(x, 0, 2),
                    Contains("transpose: axis 2 is out of range for rank 2"));
  CHECK_THROWS_WITH(F::transpose(t32({5})),
                    Contains("transpose: axis -2 is out of range for rank 1"));
}

// ---- Reshape and shapes ------------------------------------------------------------------

TEST_CASE("reshape names the shapes and element counts", "[errors]") {
  const Tensor x = t32({2, 3});
  CHECK_THROWS_WITH(F::reshape(x, {4}),
                    Contains("reshape: cannot reshape [2,3] (6 elements) to [4] (4 elements)"));
  CHECK_THROWS_WITH(
      F::reshape(x, {-1, 4}),
      Contains("reshape: cannot reshape [2,3] (6 elements) with a -1 into 4-element blocks"));
  CHECK_THROWS_WITH(F::reshape(x, {-1, -1}),
                    Contains("reshape: more than one -1 in the new shape of [2,3]"));
  CHECK_THROWS_WITH(F::reshape(x, {-2, -3}), Contains("reshape: invalid dimension -2 for [2,3]"));
  CHECK_THROWS_WITH(F::reshape(x, {1, 1, 1, 1, 1, 1, 1, 2, 3}),
                    Contains("reshape: rank 9 exceeds the maximum of 8"));
}

TEST_CASE("shapes of rank above 8 are refused", "[errors]") {
  CHECK_THROWS_AS(Shape({1, 1, 1, 1, 1, 1, 1, 1, 1}), Error);
  CHECK_THROWS_WITH(Shape({1, 1, 1, 1, 1, 1, 1, 1, 1}),
                    Contains("Shape [1,1,1,1,1,1,1,1,1]: rank 9 exceeds the maximum of 8"));
  CHECK_THROWS_WITH(zeros({1, 2, 1, 2, 1, 2, 1, 2, 1}),
                    Contains("rank 9 exceeds the maximum of 8"));
  CHECK_NOTHROW(zeros({1, 2, 1, 2, 1, 2, 1, 2}));
}

TEST_CASE("a bad size names the sizes, and the op that computed or read them", "[errors]") {
  CHECK_THROWS_WITH(Shape({2, -1}), Contains("Shape [2,-1]: dimension 1 is negative"));
  CHECK_THROWS_WITH(randn({-2, 3}), Contains("Shape [-2,3]: dimension 0 is negative"));
  CHECK_THROWS_WITH(Shape({int64_t{1} << 30, int64_t{1} << 30}),
                    Contains("Shape [1073741824,1073741824]: more than 2^59 elements"));
  // With a zero size, the others' product still counts (their strides), wherever the zero is.
  CHECK_THROWS_WITH(Shape({int64_t{1} << 30, int64_t{1} << 30, 0}),
                    Contains("its nonzero sizes multiply to more than 2^59"));
  CHECK_THROWS_WITH(Shape({0, int64_t{1} << 30, int64_t{1} << 30}),
                    Contains("its nonzero sizes multiply to more than 2^59"));
  CHECK(Shape({int64_t{1} << 20, int64_t{1} << 20, 0}).numel() == 0);
  CHECK(Shape({0, int64_t{1} << 20, int64_t{1} << 20}).numel() == 0);
  Shape s{2, 3};
  CHECK_THROWS_WITH(s.set(0, -4), Contains("Shape [-4,3]: dimension 0 is negative"));
  CHECK_THROWS_WITH(s.set(1, int64_t{1} << 60), Contains("more than 2^59 elements"));
  CHECK(s == Shape({2, 3}));  // left as it was
  CHECK_THROWS_WITH(s.push_back(-1), Contains("Shape [2,3,-1]: dimension 2 is negative"));
  CHECK(s.rank() == 2);
  CHECK_THROWS_WITH(randn({2, 3}).size(5),
                    Contains("Tensor::size: axis 5 is out of range for [2,3]"));
  CHECK_THROWS_WITH(randn({2, 3}).size(-3), Contains("Tensor::size: axis -3"));
  CHECK_THROWS_WITH((*nn::mlp(4, 6, 3))[5],
                    Contains("Sequential: index 5 is out of range for 5 modules"));
  CHECK_THROWS_WITH(nn::LayerNorm(std::vector<int64_t>{4, -2}),
                    Contains("LayerNorm: normalized_shape [4,-2] must have positive dimensions"));
  const Tensor img = randn({1, 2, 5, 5}), w = randn({4, 2, 3, 3});
  CHECK_THROWS_WITH(F::conv2d(img, w, Tensor(), 1, 1 << 30),
                    Contains("conv2d: an output of 2147483651x2147483651 (padding 1073741824"));
  CHECK_THROWS_WITH(F::conv2d(img, w, Tensor(), 1, 1 << 30),
                    Contains("x [1,2,5,5], weight [4,2,3,3]"));
}

// ---- Labels ------------------------------------------------------------------------------

TEST_CASE("losses and accuracy check logits and labels", "[errors]") {
  using LossFn = Tensor (*)(const Tensor&, const Tensor&, int64_t);
  const std::pair<const char*, LossFn> fns[] = {
      {"softmax_cross_entropy", &F::softmax_cross_entropy}, {"accuracy", &F::accuracy}};
  for (const auto& [name, fn] : fns) {
    const std::string op = name;
    CAPTURE(op);
    const Tensor logits = t32({4, 5});
    CHECK_THROWS_WITH(fn(logits, t32({4}), -1),
                      Contains(op + ": labels must be int32 or int64, they are float32 [4]"));
    CHECK_THROWS_WITH(fn(logits, F::greater(t32({4}), t32({4})), -1),
                      Contains(op + ": labels must be int32 or int64, they are bool [4]"));
    CHECK_THROWS_WITH(fn(logits, i32({3}), -1),
                      Contains(op + ": labels [3] do not match logits [4,5] (expected [4])"));
    CHECK_THROWS_WITH(fn(logits, i32({4, 1}), -1),
                      Contains(op + ": labels [4,1] do not match logits [4,5] (expected [4])"));
    CHECK_THROWS_WITH(fn(t32({4}), i32({4}), -1),
                      Contains(op + ": logits must be 2-D [N, C], they are [4]"));
    CHECK_THROWS_WITH(fn(t32({2, 4, 5}), i32({2}), -1),
                      Contains(op + ": logits must be 2-D [N, C], they are [2,4,5]"));
    CHECK_THROWS_WITH(fn(logits, Tensor(), -1),
                      Contains(op + ": argument 'labels' is an undefined tensor"));
    // Labels out of [0, C) are refused by both (the ignore label is not a class).
    for (const DType d : {DType::Int32, DType::Int64}) {
      CHECK_THROWS_WITH(fn(logits, tensor({0, 1, 5, 2}, {4}, d), -1),
                        Contains(op + ": label 5 of sample 2 is out of range [0, 5)"));
      CHECK_THROWS_WITH(fn(logits, tensor({0, -2, 1, 2}, {4}, d), -1),
                        Contains(op + ": label -2 of sample 1 is out of range [0, 5)"));
      CHECK_NOTHROW(fn(logits, tensor({0, 7, 4, 7}, {4}, d), 7));
      CHECK_THROWS_WITH(fn(logits, tensor({0, 7, 4, 7}, {4}, d), -1),
                        Contains(op + ": label 7 of sample 1 is out of range [0, 5)"));
    }
  }
}

// ---- Undefined tensors -------------------------------------------------------------------

TEST_CASE("an undefined tensor argument is named", "[errors]") {
  const Tensor u;
  const Tensor x = t32({2, 3});
  CHECK_THROWS_WITH(F::add(u, x), Contains("add: argument 'a' is an undefined tensor"));
  CHECK_THROWS_WITH(F::mul(x, u), Contains("mul: argument 'b' is an undefined tensor"));
  CHECK_THROWS_WITH(F::mul(u, 2.0), Contains("mul: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(F::exp(u), Contains("exp: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(F::relu(u), Contains("relu: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(F::matmul(x, u), Contains("matmul: argument 'b' is an undefined tensor"));
  CHECK_THROWS_WITH(F::linear(x, u), Contains("linear: argument 'weight' is an undefined tensor"));
  CHECK_THROWS_WITH(F::linear(u, x), Contains("linear: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(F::sum(u), Contains("sum: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(F::max(u, {0}), Contains("max: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(F::reshape(u, {2, 3}),
                    Contains("reshape: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(F::flatten(u), Contains("flatten: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(F::permute(u, {1, 0}),
                    Contains("permute: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(F::transpose(u), Contains("transpose: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(F::broadcast_to(u, {2}),
                    Contains("broadcast_to: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(F::slice(u, 0, 0, 1), Contains("slice: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(F::concat({x, u}), Contains("concat: tensor 1 is undefined"));
  CHECK_THROWS_WITH(F::softmax(u), Contains("softmax: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(F::softmax_cross_entropy(u, i32({2})),
                    Contains("softmax_cross_entropy: argument 'logits' is an undefined tensor"));
  CHECK_THROWS_WITH(F::mean_squared_error(x, u),
                    Contains("mean_squared_error: argument 'b' is an undefined tensor"));
  CHECK_THROWS_WITH(F::where(u, x, x), Contains("where: argument 'cond' is an undefined tensor"));
  CHECK_THROWS_WITH(F::equal(x, u), Contains("equal: argument 'b' is an undefined tensor"));
  CHECK_THROWS_WITH(clone(u), Contains("clone: argument 'x' is an undefined tensor"));
  CHECK_THROWS_WITH(zeros_like(u), Contains("_like: argument 't' is an undefined tensor"));
  CHECK_THROWS_WITH(fill_(u, 1.0), Contains("fill_: argument 't' is an undefined tensor"));
  CHECK_THROWS_WITH(u.backward(), Contains("backward: undefined tensor"));
  CHECK_THROWS_WITH(u.item<float>(), Contains("item: undefined tensor"));
}

// ---- Autograd ----------------------------------------------------------------------------

TEST_CASE("backward needs a gradient for a non-scalar output, of the output's shape", "[errors]") {
  const Tensor x = leaf({2, 3});
  const Tensor y = F::exp(x);
  CHECK_THROWS_AS(y.backward(), Error);
  CHECK_THROWS_WITH(y.backward(),
                    Contains("backward: a gradient can be created implicitly only for a "
                             "one-element output; output 0 is [2,3]; pass an explicit gradient"));
  CHECK_THROWS_WITH(y.backward(ones({3, 2})),
                    Contains("backward: gradient 0 is Tensor[3,2] float32 cpu but output 0 is "
                             "Tensor[2,3] float32 cpu"));
  CHECK_THROWS_WITH(y.backward(ones({2, 3}, DType::Float64)),
                    Contains("backward: gradient 0 is Tensor[2,3] float64 cpu but output 0 is "
                             "Tensor[2,3] float32 cpu"));
  CHECK_THROWS_WITH(F::exp(t32({2})).backward(ones({2})),
                    Contains("backward: output 0 [2] does not require grad"));
  // The failed calls left the graph usable.
  y.backward(ones({2, 3}));
  CHECK(x.grad().defined());
}

TEST_CASE("a second backward through released saved tensors mentions retain_graph", "[errors]") {
  const Tensor a = leaf({2, 3});
  const Tensor b = leaf({2, 3});
  const Tensor loss = F::sum(F::mul(a, b));
  loss.backward();
  CHECK_THROWS_AS(loss.backward(), Error);
  CHECK_THROWS_WITH(loss.backward(),
                    Contains("backward: the saved tensors of mul were released by an earlier "
                             "backward") &&
                        Contains("retain_graph"));

  const Tensor loss2 = F::sum(F::exp(a));
  loss2.backward({}, /*retain_graph=*/true);
  CHECK_NOTHROW(loss2.backward());
  CHECK_THROWS_WITH(loss2.backward(), Contains("exp") && Contains("retain_graph"));
}

TEST_CASE("a saved tensor modified in place before backward is detected", "[errors]") {
  const Tensor a = leaf({2, 3});
  const Tensor b = ones({2, 3});  // does not require grad: in-place updates are allowed
  const Tensor y = F::sum(F::mul(a, b));
  add_(b, ones({2, 3}));
  CHECK_THROWS_AS(y.backward(), Error);
  CHECK_THROWS_WITH(y.backward(),
                    Contains("backward of mul: a tensor [2,3] saved for backward was modified "
                             "in place") &&
                        Matches(".*\\(version [0-9]+ -> [0-9]+\\).*"));
}

TEST_CASE("in-place updates of tensors requiring grad are refused in grad mode", "[errors]") {
  const Tensor a = leaf({2, 3});
  CHECK_THROWS_WITH(add_(a, ones({2, 3})),
                    Contains("add_: in-place update of argument 0 [2,3], which requires grad") &&
                        Contains("NoGradGuard"));
  CHECK_THROWS_WITH(fill_(a, 0.0), Contains("fill_") && Contains("NoGradGuard"));
  NoGradGuard no_grad;
  CHECK_NOTHROW(add_(a, ones({2, 3})));
}

TEST_CASE("set_requires_grad refuses non-floating and non-leaf tensors", "[errors]") {
  Tensor i = i32({3});
  CHECK_THROWS_AS(i.set_requires_grad(), Error);
  CHECK_THROWS_WITH(i.set_requires_grad(),
                    Contains("set_requires_grad: only floating tensors can require a gradient; "
                             "tensor is int32"));
  Tensor l = zeros({3}, DType::Int64);
  CHECK_THROWS_WITH(l.set_requires_grad(), Contains("tensor is int64"));
  CHECK_NOTHROW(i.set_requires_grad(false));
  Tensor y = F::exp(leaf({3}));
  CHECK_THROWS_WITH(y.set_requires_grad(),
                    Contains("set_requires_grad: only a leaf tensor can be marked; this one is "
                             "the output of exp"));
  CHECK_THROWS_WITH(Tensor().set_requires_grad(), Contains("set_requires_grad: undefined tensor"));
  CHECK_THROWS_WITH(leaf({3}).set_grad(ones({4})),
                    Contains("set_grad: gradient is Tensor[4] float32 cpu but the tensor is "
                             "Tensor[3] float32 cpu"));
}

// ---- Host reads and factories ------------------------------------------------------------

TEST_CASE("item needs exactly one element", "[errors]") {
  CHECK_THROWS_AS(t32({2, 3}).item<float>(), Error);
  CHECK_THROWS_WITH(t32({2, 3}).item<float>(),
                    Contains("item: tensor must have one element, it is [2,3]"));
  CHECK_THROWS_WITH(t32({0}).item<double>(),
                    Contains("item: tensor must have one element, it is [0]"));
  CHECK(t32({1, 1}).item<float>() == 0.0f);
}

TEST_CASE("factories and initialisers check their arguments", "[errors]") {
  CHECK_THROWS_WITH(tensor({1, 2, 3, 4, 5}, {2, 3}),
                    Contains("tensor: 5 values do not fill shape [2,3] (6 elements)"));
  CHECK_THROWS_WITH(uniform_(t32({3}), 1, 0), Contains("uniform_: low 1 > high 0"));
  CHECK_THROWS_WITH(normal_(t32({3}), 0, -1),
                    Contains("normal_: std must be finite and non-negative, got -1"));
  for (const double bad : {std::nan(""), std::numeric_limits<double>::infinity()})
    CHECK_THROWS_WITH(normal_(t32({3}), 0, bad),
                      Contains("normal_: std must be finite and non-negative"));
  // full refuses an integer tensor of NaN or infinity (fill_ and copy_ convert them: ops_test).
  for (const DType d : {DType::Int32, DType::Int64}) {
    CAPTURE(d);
    for (const double bad : {std::nan(""), -std::numeric_limits<double>::infinity(),
                             std::numeric_limits<double>::infinity()})
      CHECK_THROWS_WITH(full({2}, bad, d), Contains("full: value") &&
                                               Contains(cat("cannot fill a ", d)) &&
                                               Contains("a NaN or infinity cannot be an integer"));
  }
  CHECK(full({2}, -2147483648.0, DType::Int32).to_vector<double>()[0] == -2147483648.0);
  // A value an integer dtype cannot hold is refused by full, tensor and fill_ (as PyTorch; it was
  // saturated); the fraction of one it can hold is dropped.
  CHECK_THROWS_WITH(full({1}, 3e10, DType::Int32),
                    Contains("full: value 3e+10 cannot fill a int32 tensor: it is out of the "
                             "range [-2147483648, 2147483647]"));
  CHECK_THROWS_WITH(full({1}, 2147483648.0, DType::Int32),
                    Contains("full: value 2147483648 cannot fill a int32 tensor"));
  CHECK_THROWS_WITH(full({1}, -2147483649.0, DType::Int32),
                    Contains("full: value -2147483649 cannot fill a int32 tensor"));
  CHECK_THROWS_WITH(full({1}, -1e30, DType::Int64),
                    Contains("full: value -1e+30 cannot fill a int64 tensor: it is out of the "
                             "range [-9223372036854775808, 9223372036854775807]"));
  CHECK_THROWS_WITH(full({1}, 0x1p63, DType::Int64),
                    Contains("full: value 9223372036854775808 cannot fill a int64 tensor"));
  CHECK(full({1}, 2147483647.9, DType::Int32).item<int64_t>() == 2147483647);
  CHECK(full({1}, -2147483648.9, DType::Int32).item<int64_t>() == -2147483648);
  CHECK(full({1}, -0x1p63, DType::Int64).item<int64_t>() == std::numeric_limits<int64_t>::min());
  CHECK(full({1}, -3.7, DType::Int32).item<int64_t>() == -3);
  CHECK(full({1}, 1e30, DType::Float32).item<double>() == static_cast<double>(1e30f));
  // A finite value beyond float32's range: full and fill_ refuse it (as PyTorch's, which says it
  // "cannot be converted to type float without overflow"; it became an infinity), tensor() makes
  // it an infinity as PyTorch's does, and an infinity asked for is one.
  CHECK_THROWS_WITH(full({1}, 1e300, DType::Float32),
                    Contains("full: value 1e+300 cannot fill a float32 tensor: it is beyond "
                             "float32's largest value"));
  // Just beyond: both numbers to the last digit.
  CHECK_THROWS_WITH(full({1}, 3.4028235e38, DType::Float32),
                    Contains("value 3.4028235e+38 cannot fill a float32 tensor: it is beyond "
                             "float32's largest value 3.4028234663852886e+38"));
  Tensor f = full({2}, 1.5, DType::Float32);
  CHECK_THROWS_WITH(fill_(f, -1e39), Contains("fill_: value -1e+39 cannot fill a float32 tensor"));
  CHECK(f.to_vector<float>() == std::vector<float>{1.5f, 1.5f});  // left unchanged
  CHECK_THROWS_WITH(F::masked_fill(f, full({2}, 1.0, DType::Bool), -1e300),
                    Contains("masked_fill: value -1e+300 cannot fill a float32 tensor"));
  CHECK(F::masked_fill(f, full({2}, 1.0, DType::Bool), -1e30).to_vector<float>()[0] == -1e30f);
  CHECK(std::isinf(tensor({1e300}, {1}, DType::Float32).item<double>()));
  CHECK(std::isinf(
      full({1}, -std::numeric_limits<double>::infinity(), DType::Float32).item<double>()));
  CHECK(full({1}, 1e300, DType::Float64).item<double>() == 1e300);
  CHECK(full({1}, std::numeric_limits<float>::max(), DType::Float32).item<double>() ==
        static_cast<double>(std::numeric_limits<float>::max()));
  CHECK(full({1}, 1e30, DType::Bool).item<int32_t>() == 1);
  CHECK_THROWS_WITH(tensor({1, 4e9}, {2}, DType::Int32),
                    Contains("tensor: value 4e+09 cannot fill a int32 tensor"));
  CHECK_THROWS_WITH(tensor({std::nan("")}, {1}, DType::Int64),
                    Contains("tensor: value nan cannot fill a int64 tensor"));
  CHECK(tensor({4e9}, {1}, DType::Int64).item<int64_t>() == 4000000000);
  Tensor i = i32({2});
  CHECK_THROWS_WITH(fill_(i, 1e20), Contains("fill_: value 1e+20 cannot fill a int32 tensor"));
  CHECK_THROWS_WITH(fill_(i, std::nan("")),
                    Contains("fill_: value nan cannot fill a int32 tensor: a NaN or infinity"));
  CHECK(i.to_vector<int32_t>() == std::vector<int32_t>{0, 0});  // left unchanged
  CHECK(std::isnan(full({2}, std::nan(""), DType::Float32).to_vector<double>()[0]));
  CHECK_NOTHROW(full({2}, std::nan(""), DType::Bool));
  CHECK_THROWS_WITH(rand({3}, DType::Float32, Device::cpu(), 2, 1),
                    Contains("uniform_: low 2 > high 1"));
}
