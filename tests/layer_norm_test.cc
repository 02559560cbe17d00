// F::layer_norm, nn::LayerNorm and F::cross_entropy: op-harness cases (op_cases_sequence.h),
// argument errors, the same bits at any thread count, and static replay giving eager's bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "op_cases_sequence.h"
#include "op_harness.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::optest;
using Catch::Matchers::Contains;
using testing::bit_diff;
using testing::StaticEnabled;

TEST_CASE("layer_norm through the op harness", "[ops][layer_norm]") {
  check_ops(layer_norm_cases());
}

TEST_CASE("cross_entropy through the op harness", "[ops][cross_entropy]") {
  check_ops(cross_entropy_cases());
}

TEST_CASE("layer_norm refuses bad arguments, naming them and the shapes", "[errors][layer_norm]") {
  const Tensor x = randn({2, 3, 4});
  const Tensor g = ones({4}), b = zeros({4});
  CHECK_THROWS_WITH(F::layer_norm(x, {3}),
                    Contains("layer_norm: normalized_shape [3] is not the trailing dimensions of "
                             "x [2,3,4]"));
  CHECK_THROWS_WITH(F::layer_norm(x, {2, 3, 4, 1}), Contains("normalized_shape [2,3,4,1]"));
  CHECK_THROWS_WITH(F::layer_norm(x, std::vector<int64_t>{}), Contains("normalized_shape []"));
  CHECK_THROWS_WITH(F::layer_norm(x, {4}, ones({3})),
                    Contains("layer_norm: argument 'gamma' is [3], expected normalized_shape [4] "
                             "(x is [2,3,4])"));
  CHECK_THROWS_WITH(
      F::layer_norm(x, {3, 4}, Tensor(), zeros({4})),
      Contains("layer_norm: argument 'beta' is [4], expected normalized_shape [3,4]"));
  CHECK_THROWS_WITH(F::layer_norm(x, {4}, ones({4}, DType::Float64), b),
                    Contains("layer_norm: argument 'gamma' is float64 [4], x is float32 [2,3,4]"));
  CHECK_THROWS_WITH(F::layer_norm(zeros({2, 4}, DType::Int32), {4}),
                    Contains("layer_norm: argument 'x' must be float32 or float64"));
  CHECK_THROWS_WITH(F::layer_norm(x, {4}, g, b, -1), Contains("layer_norm: eps must be"));
  CHECK_NOTHROW(F::layer_norm(x, {3, 4}));
}

TEST_CASE("layer_norm normalises each row to mean 0 and variance 1", "[ops][layer_norm]") {
  const Tensor x = tensor({1, 2, 3, 4, 10, 10, 10, 10}, {2, 4}, DType::Float64);
  const std::vector<double> y = F::layer_norm(x, {4}, Tensor(), Tensor(), 0).to_vector<double>();
  const double s = 1 / std::sqrt(1.25);  // the biased variance of 1..4 is 1.25
  const std::vector<double> want{-1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s};
  for (int i = 0; i < 4; ++i) CHECK(y[i] == Approx(want[i]).epsilon(1e-14));
  CHECK(std::isnan(y[4]));  // a constant row with eps 0: 0/0, as PyTorch
}

TEST_CASE("layer_norm gives the same bits at any thread count", "[ops][layer_norm]") {
  manual_seed(3);
  const Tensor x0 = randn({300, 257}), g0 = rand({257}), b0 = randn({257}), gy = randn({300, 257});
  auto run = [&](int threads) {
    const testing::ThreadCount scope(threads);
    Tensor x = x0.detach().set_requires_grad(), g = g0.detach().set_requires_grad(),
           b = b0.detach().set_requires_grad();
    const Tensor y = F::layer_norm(x, {257}, g, b);
    F::sum(F::mul(y, gy)).backward();
    return std::vector<Tensor>{y, x.grad(), g.grad(), b.grad()};
  };
  const std::vector<Tensor> one = run(1);
  for (int threads : {2, 4, 1}) {
    const std::vector<Tensor> other = run(threads);
    for (size_t i = 0; i < one.size(); ++i) {
      CAPTURE(threads, i);
      CHECK(bit_diff(one[i], other[i]) == "");
    }
  }
}

TEST_CASE("a static model with layer_norm and cross_entropy replays eager's bits",
          "[static][layer_norm]") {
  StaticEnabled on;
  manual_seed(8);
  auto ln_s = std::make_shared<nn::LayerNorm>(std::vector<int64_t>{6});
  nn::LayerNorm ln_e({6});
  const Tensor proj = randn({5, 6});
  auto body = [&](nn::LayerNorm& ln, const Tensor& x, const Tensor& targets, const Tensor& w) {
    const Tensor logits = F::linear(ln(x), w);  // [B, T, 5]
    return F::cross_entropy(logits, targets, 0);
  };
  auto f = static_graph(
      [&](const Tensor& x, const Tensor& t, const Tensor& w) { return body(*ln_s, x, t, w); },
      {.name = "layer_norm_model", .modules = {ln_s}});
  for (int call = 0; call < 4; ++call) {
    const Tensor x = randn({3, 4, 6});
    Tensor targets = empty({3, 4}, DType::Int64);
    copy_(targets, F::mul(rand({3, 4}, DType::Float64), 5.0));
    Tensor ws = proj.detach().set_requires_grad(), we = proj.detach().set_requires_grad();
    for (nn::LayerNorm* ln : {ln_s.get(), &ln_e}) ln->zero_grad();
    const Tensor ys = f(x, targets, ws);
    ys.backward();
    const Tensor ye = body(ln_e, x, targets, we);
    ye.backward();
    CHECK(bit_diff(ys, ye) == "");
    CHECK(bit_diff(ws.grad(), we.grad()) == "");
    testing::check_same_parameters(*ln_s, ln_e, "call");
  }
  CHECK(f.stats().traces == 1);
}

TEST_CASE("nn::LayerNorm has weight (ones) and bias (zeros) of normalized_shape",
          "[nn][layer_norm]") {
  nn::LayerNorm ln({2, 3});
  const auto params = ln.named_parameters();
  REQUIRE(params.size() == 2);
  CHECK(params[0].first == "weight");
  CHECK(params[1].first == "bias");
  CHECK(ln.weight.shape() == Shape{2, 3});
  CHECK(ln.weight.to_vector<float>() == std::vector<float>(6, 1.0f));
  CHECK(ln.bias.to_vector<float>() == std::vector<float>(6, 0.0f));
  CHECK(ln.describe() == "LayerNorm([2,3], eps 1e-05)");
  CHECK(ln.normalized_shape() == std::vector<int64_t>{2, 3});
  CHECK(ln.eps() == 1e-5);
  const Tensor x = randn({4, 2, 3});
  CHECK(bit_diff(ln(x), F::layer_norm(x, {2, 3}, ln.weight, ln.bias)) == "");
  nn::LayerNorm plain({3}, 1e-6, false);
  CHECK(plain.parameters().empty());
  CHECK(bit_diff(plain(x), F::layer_norm(x, {3}, Tensor(), Tensor(), 1e-6)) == "");
  CHECK_THROWS_WITH(nn::LayerNorm({0}), Contains("LayerNorm: normalized_shape [0]"));
  CHECK_THROWS_WITH(nn::LayerNorm({}), Contains("LayerNorm: normalized_shape must not be empty"));
}

TEST_CASE("cross_entropy is softmax_cross_entropy over the flattened positions",
          "[ops][cross_entropy]") {
  manual_seed(4);
  const Tensor logits = randn({2, 3, 7}, DType::Float64);
  const Tensor targets = tensor({1, -100, 6, 0, -100, 3}, {2, 3}, DType::Int64);
  const Tensor flat =
      F::softmax_cross_entropy(F::reshape(logits, {6, 7}), F::reshape(targets, {6}), -100);
  CHECK(bit_diff(F::cross_entropy(logits, targets), flat) == "");
  // Every position ignored: 0.
  CHECK(F::cross_entropy(logits, full({2, 3}, -100, DType::Int64)).item<double>() == 0);
}

TEST_CASE("cross_entropy refuses bad arguments, naming both shapes", "[errors][cross_entropy]") {
  const Tensor logits = randn({2, 3, 5});
  CHECK_THROWS_WITH(F::cross_entropy(logits, zeros({3, 2}, DType::Int64)),
                    Contains("cross_entropy: targets [3,2] do not match logits [2,3,5] (expected "
                             "targets [2,3], the class axis last)"));
  CHECK_THROWS_WITH(F::cross_entropy(logits, zeros({2, 3})),
                    Contains("cross_entropy: argument 'targets' must be int32 or int64"));
  CHECK_THROWS_WITH(F::cross_entropy(logits, tensor({0, 1, 9, 2, 3, 4}, {2, 3}, DType::Int64)),
                    Contains("cross_entropy: argument 'targets': label 9 at flat index 2 is "
                             "out of range [0, 5)") &&
                        !Contains("softmax_cross_entropy"));
  CHECK_THROWS_WITH(
      F::cross_entropy(logits, tensor({0, 1, 2, 3, 4, -3}, {2, 3}, DType::Int32), -100),
      Contains("cross_entropy: argument 'targets': label -3 at flat index 5"));
  // softmax_cross_entropy itself still names itself.
  CHECK_THROWS_WITH(F::softmax_cross_entropy(F::reshape(logits, {6, 5}),
                                             tensor({0, 1, 9, 2, 3, 4}, {6}, DType::Int64)),
                    Contains("softmax_cross_entropy: label 9 of sample 2"));
}
