// conv2d through the op harness (both CPU algorithms), nn::Conv2d, and argument errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "encore/functions.h"
#include "encore/nn.h"
#include "op_cases_image.h"
#include "op_harness.h"
#include "runtime/parallel.h"

using namespace encore;
using namespace encore::optest;
using Catch::Matchers::Contains;

namespace {

// Runs `body` with im2col + GEMM forced (or not), restoring the setting afterwards.
template <typename Body>
void with_im2col(bool on, Body body) {
  const bool old = F::set_conv_im2col(on);
  body();
  F::set_conv_im2col(old);
}

Tensor leaf(const Shape& s, DType dt = DType::Float32) {
  Tensor t = rand(s, dt);
  t.set_requires_grad();
  return t;
}

}  // namespace

TEST_CASE("conv2d matches a plain-loop reference, gradients included", "[conv]") {
  const std::vector<OpCase> cases = conv_cases();
  SECTION("default algorithm choice") {
    with_im2col(false, [&] { check_ops(cases); });
  }
  SECTION("im2col + GEMM forced") {
    with_im2col(true, [&] { check_ops(cases); });
  }
}

TEST_CASE("conv2d of a known input", "[conv]") {
  // x = 1..9 in a 3x3 image, a 2x2 kernel of ones: each output sums a 2x2 window.
  const Tensor x = tensor({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  const Tensor w = ones({1, 1, 2, 2});
  CHECK(F::conv2d(x, w).to_vector<float>() == std::vector<float>{12, 16, 24, 28});
  CHECK(F::conv2d(x, w, tensor({0.5}, {1}), 2, 1).to_vector<float>() ==
        std::vector<float>{1.5, 5.5, 11.5, 28.5});
  // Cross-correlation, not convolution: the kernel is not flipped.
  const Tensor corner = tensor({1, 0, 0, 0}, {1, 1, 2, 2});
  CHECK(F::conv2d(x, corner).to_vector<float>() == std::vector<float>{1, 2, 4, 5});
}

TEST_CASE("conv2d over an empty batch", "[conv]") {
  for (bool im2col : {false, true}) {
    with_im2col(im2col, [&] {
      Tensor x = leaf({0, 2, 5, 5});
      Tensor w = leaf({3, 2, 3, 3});
      Tensor b = leaf({3});
      const Tensor y = F::conv2d(x, w, b, 1, 1);
      CHECK(y.shape() == Shape{0, 3, 5, 5});
      F::sum(y).backward();
      CHECK(w.grad().shape() == w.shape());
      for (float v : w.grad().to_vector<float>()) CHECK(v == 0.0f);
      for (float v : b.grad().to_vector<float>()) CHECK(v == 0.0f);
      CHECK(x.grad().shape() == x.shape());
    });
  }
}

TEST_CASE("conv2d gives the same bits at any thread count", "[conv]") {
  const int threads = num_threads();
  manual_seed(11);
  const Tensor x0 = rand({8, 8, 28, 28}, DType::Float32, Device::cpu(), -1, 1);
  const Tensor w0 = rand({8, 8, 3, 3}, DType::Float32, Device::cpu(), -1, 1);
  const Tensor gy = rand({8, 8, 28, 28}, DType::Float32, Device::cpu(), -1, 1);
  auto run = [&](int n) {
    set_num_threads(n);
    Tensor x = clone(x0).set_requires_grad();
    Tensor w = clone(w0).set_requires_grad();
    const Tensor y = F::conv2d(x, w, Tensor(), 1, 1);
    y.backward(gy);
    return std::vector<std::vector<float>>{y.to_vector<float>(), x.grad().to_vector<float>(),
                                           w.grad().to_vector<float>()};
  };
  const auto one = run(1);
  const auto four = run(4);
  set_num_threads(threads);
  CHECK(one[0] == four[0]);
  CHECK(one[1] == four[1]);
  CHECK(one[2] == four[2]);
}

TEST_CASE("nn::Conv2d initialises and names its parameters as PyTorch", "[conv][nn]") {
  manual_seed(5);
  nn::Conv2d conv(4, 6, {3, 2}, {.padding = 1, .groups = 2});
  CHECK(conv.weight.shape() == Shape{6, 2, 3, 2});
  CHECK(conv.bias.shape() == Shape{6});
  const double bound = 1.0 / std::sqrt(2.0 * 3 * 2);
  double largest = 0;
  for (float v : conv.weight.to_vector<float>()) {
    CHECK(std::abs(v) <= bound);
    largest = std::max(largest, std::abs(static_cast<double>(v)));
  }
  CHECK(largest > bound / 2);  // drawn over the whole range, not a narrower one
  for (float v : conv.bias.to_vector<float>()) CHECK(std::abs(v) <= bound);
  const auto named = conv.named_parameters();
  REQUIRE(named.size() == 2);
  CHECK(named[0].first == "weight");
  CHECK(named[1].first == "bias");
  CHECK(named[0].second.requires_grad());
  CHECK(conv.forward(zeros({2, 4, 5, 5})).shape() == Shape{2, 6, 5, 6});
  CHECK(conv.describe() == "Conv2d(4 -> 6, kernel 3x2, padding 1x1, groups 2)");

  manual_seed(5);
  nn::Conv2d again(4, 6, {3, 2}, {.padding = 1, .groups = 2});
  CHECK(again.weight.to_vector<float>() == conv.weight.to_vector<float>());  // seeded

  nn::Conv2d plain(3, 8, 5, {.stride = 2, .bias = false, .dtype = DType::Float64});
  CHECK(plain.weight.dtype() == DType::Float64);
  CHECK_FALSE(plain.bias.defined());
  REQUIRE(plain.named_parameters().size() == 1);
  CHECK(plain.describe() == "Conv2d(3 -> 8, kernel 5x5, stride 2x2, no bias)");
  const double plain_bound = 1.0 / std::sqrt(3.0 * 25);
  for (double v : plain.weight.to_vector<double>()) CHECK(std::abs(v) <= plain_bound);

  CHECK_THROWS_WITH(nn::Conv2d(4, 6, 3, {.groups = 4}), Contains("Conv2d") && Contains("groups"));
}

TEST_CASE("conv2d rejects bad arguments, naming the argument and the shapes", "[conv]") {
  const Tensor x = zeros({2, 3, 8, 8});
  const Tensor w = zeros({4, 3, 3, 3});
  auto conv = [](const Tensor& a, const Tensor& b, const Tensor& bias = Tensor(), Size2 stride = 1,
                 Size2 padding = 0, Size2 dilation = 1, int groups = 1) {
    return F::conv2d(a, b, bias, stride, padding, dilation, groups);
  };
  CHECK_THROWS_WITH(conv(zeros({3, 8, 8}), w),
                    Contains("conv2d") && Contains("x must be 4-D") && Contains("[3,8,8]"));
  CHECK_THROWS_WITH(conv(x, zeros({4, 3, 3})),
                    Contains("conv2d") && Contains("weight must be 4-D") && Contains("[4,3,3]"));
  CHECK_THROWS_WITH(conv(x, zeros({4, 2, 3, 3})),
                    Contains("conv2d: channels differ: x is [2,3,8,8] (3 channels), weight is "
                             "[4,2,3,3] (expects 2 x groups 1)"));
  CHECK_THROWS_WITH(conv(zeros({2, 4, 8, 8}), zeros({4, 1, 3, 3}), Tensor(), 1, 0, 1, 2),
                    Contains("conv2d: channels differ") && Contains("groups 2"));
  CHECK_THROWS_WITH(
      conv(zeros({1, 4, 5, 5}), zeros({3, 2, 3, 3}), Tensor(), 1, 0, 1, 2),
      Contains("conv2d") && Contains("[3,2,3,3]") && Contains("not divisible by groups 2"));
  CHECK_THROWS_WITH(conv(x, w, Tensor(), 1, 0, 1, 0),
                    Contains("conv2d") && Contains("groups must be positive"));
  CHECK_THROWS_WITH(conv(x, w, zeros({5})), Contains("conv2d: bias [5]") &&
                                                Contains("weight [4,3,3,3]") &&
                                                Contains("expected [4]"));
  CHECK_THROWS_WITH(conv(x, w, zeros({4, 1})), Contains("conv2d: bias [4,1]"));
  CHECK_THROWS_WITH(conv(x, w, Tensor(), {0, 1}), Contains("conv2d: stride must be positive") &&
                                                      Contains("0x1") && Contains("[2,3,8,8]"));
  CHECK_THROWS_WITH(
      conv(x, w, Tensor(), 1, 0, {1, -1}),
      Contains("conv2d: dilation must be positive") && Contains("1x-1") && Contains("[4,3,3,3]"));
  CHECK_THROWS_WITH(conv(x, w, Tensor(), 1, -1), Contains("conv2d: padding must be non-negative") &&
                                                     Contains("-1x-1") && Contains("[2,3,8,8]"));
  CHECK_THROWS_WITH(conv(zeros({1, 3, 2, 2}), w),
                    Contains("conv2d: the kernel 3x3") &&
                        Contains("larger than the padded input 2x2") && Contains("[1,3,2,2]"));
  CHECK_THROWS_WITH(
      conv(zeros({1, 3, 5, 5}), w, Tensor(), 1, 0, 3),
      Contains("conv2d: the kernel 3x3 (dilation 3x3: 7x7)") && Contains("padded input 5x5"));
  CHECK_THROWS_WITH(conv(x, zeros({4, 3, 3, 3}, DType::Float64)),
                    Contains("conv2d: dtypes differ") && Contains("x is float32 [2,3,8,8]") &&
                        Contains("weight is float64 [4,3,3,3]"));
  CHECK_THROWS_WITH(conv(x, w, zeros({4}, DType::Float64)),
                    Contains("conv2d: dtypes differ") && Contains("bias is float64 [4]"));
  CHECK_THROWS_WITH(conv(zeros({2, 3, 8, 8}, DType::Int32), w),
                    Contains("conv2d") && Contains("'x'") && Contains("int32"));
  CHECK_THROWS_WITH(conv(x, Tensor()), Contains("conv2d") && Contains("'weight'"));
  CHECK_THROWS_WITH(
      conv(zeros({2, 0, 8, 8}), zeros({4, 0, 3, 3})),
      Contains("conv2d: weight [4,0,3,3] has an empty dimension") && Contains("[2,0,8,8]"));
}

TEST_CASE("conv, pooling and batch norm modules refuse bad options when built", "[conv][errors]") {
  auto conv = [](nn::Conv2dOptions o) { return nn::Conv2d(3, 4, 3, o); };
  nn::Conv2dOptions o;
  o.stride = {2, 0};
  CHECK_THROWS_WITH(conv(o), Contains("Conv2d: stride must be positive, got 2x0"));
  o = {};
  o.dilation = 0;
  CHECK_THROWS_WITH(conv(o), Contains("Conv2d: dilation must be positive, got 0x0"));
  o = {};
  o.padding = {0, -1};
  CHECK_THROWS_WITH(conv(o), Contains("Conv2d: padding must be non-negative, got 0x-1"));
  o = {};
  o.dtype = DType::Int32;
  CHECK_THROWS_WITH(conv(o), Contains("Conv2d: dtype must be float32 or float64, it is int32"));

  CHECK_THROWS_WITH(nn::MaxPool2d(0), Contains("MaxPool2d: kernel must be positive, it is 0x0"));
  CHECK_THROWS_WITH(nn::AvgPool2d(2, Size2{1, 0}),
                    Contains("AvgPool2d: stride must be positive, it is 1x0"));
  CHECK_THROWS_WITH(nn::MaxPool2d(2, std::nullopt, 2),
                    Contains("MaxPool2d: padding 2x2 must be between 0 and half the kernel 2x2"));
  CHECK_NOTHROW(nn::AvgPool2d(3, 2, 1));

  nn::BatchNormOptions b;
  b.eps = -1e-5;
  CHECK_THROWS_WITH(nn::BatchNorm2d(4, b), Contains("BatchNorm2d: eps must be finite"));
  b = {};
  b.eps = std::nan("");
  CHECK_THROWS_WITH(nn::BatchNorm2d(4, b), Contains("BatchNorm2d: eps must be finite"));
  b = {};
  b.momentum = 1.5;
  CHECK_THROWS_WITH(nn::BatchNorm2d(4, b),
                    Contains("BatchNorm2d: momentum must be in [0, 1], it is 1.5"));
  b = {};
  b.dtype = DType::Int64;
  CHECK_THROWS_WITH(nn::BatchNorm2d(4, b), Contains("BatchNorm2d: dtype must be float32"));
}
