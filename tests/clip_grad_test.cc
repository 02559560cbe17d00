// Gradient clipping (encore/clip_grad.h): the norm and the scaled gradients for each norm type,
// gradients below the limit untouched, parameters without a gradient, NaN, refused arguments
// (nothing written), clipping by value, and both inside a static training step.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "encore/encore.h"
#include "tests/static_clip_schedule_scenarios.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Two parameters, [2] and [2, 2], whose gradients are g1 and g2 (from one backward).
struct TwoParams {
  Tensor w1 = zeros({2}).set_requires_grad(true);
  Tensor w2 = zeros({2, 2}).set_requires_grad(true);
  TwoParams(std::initializer_list<double> g1, std::initializer_list<double> g2) {
    const Tensor loss = F::add(F::sum(F::mul(w1, tensor(g1, {2}))),  //
                               F::sum(F::mul(w2, tensor(g2, {2, 2}))));
    loss.backward();
  }
  std::vector<Tensor> params() const { return {w1, w2}; }
  std::vector<double> grads() const {
    std::vector<double> out = w1.grad().to_vector<double>();
    for (const double g : w2.grad().to_vector<double>()) out.push_back(g);
    return out;
  }
};

}  // namespace

TEST_CASE("clip_grad_norm_ scales the gradients to the norm asked and returns the total",
          "[optim][clip_grad]") {
  TwoParams p({3, 0}, {0, -4, 0, 0});  // a 2-norm of 5
  const Tensor total = nn::clip_grad_norm_(p.params(), 1.0);
  CHECK(total.shape() == Shape{});
  CHECK(total.dtype() == DType::Float32);
  CHECK(total.item<double>() == 5);
  const std::vector<double> g = p.grads();
  CHECK(g[0] == Approx(3 / 5.000001).epsilon(1e-6));
  CHECK(g[3] == Approx(-4 / 5.000001).epsilon(1e-6));
  CHECK(g[1] == 0);
  CHECK(std::hypot(g[0], g[3]) == Approx(1).epsilon(1e-5));
}

TEST_CASE("clip_grad_norm_ leaves gradients within the limit as they were, bit for bit",
          "[optim][clip_grad]") {
  const double max_norm = GENERATE(5.5, kInf);
  TwoParams p({0.3, -1.7}, {2.5, 0, 1e-3, -0.25});
  const std::vector<double> before = p.grads();
  nn::clip_grad_norm_(p.params(), max_norm);
  CHECK(p.grads() == before);
}

TEST_CASE("clip_grad_norm_ takes the 1-norm, the largest magnitude and any p-norm",
          "[optim][clip_grad]") {
  {
    TwoParams p({3, 0}, {0, -4, 0, 0});
    CHECK(nn::clip_grad_norm_(p.params(), 100, 1).item<double>() == 7);
  }
  {
    TwoParams p({3, 0}, {0, -4, 0, 0});
    CHECK(nn::clip_grad_norm_(p.params(), 100, kInf).item<double>() == 4);
  }
  {
    TwoParams p({3, 0}, {0, -4, 0, 0});
    CHECK(nn::clip_grad_norm_(p.params(), 100, 3).item<double>() ==
          Approx(std::cbrt(91.0)).epsilon(1e-6));
  }
  {
    // Scaled by the largest magnitude: the largest becomes 2.
    TwoParams p({3, 0}, {0, -8, 1, 0});
    nn::clip_grad_norm_(p.params(), 2, kInf);
    const std::vector<double> g = p.grads();
    CHECK(g[3] == Approx(-2).epsilon(1e-6));
    CHECK(g[0] == Approx(0.75).epsilon(1e-6));
  }
}

TEST_CASE("clip_grad_norm_ skips parameters without a gradient and gives 0 for none",
          "[optim][clip_grad]") {
  TwoParams p({3, 0}, {0, -4, 0, 0});
  const Tensor unused = zeros({7}).set_requires_grad(true);
  CHECK(nn::clip_grad_norm_({unused, p.w1}, 10).item<double>() == 3);
  CHECK_FALSE(unused.grad().defined());
  const Tensor none = nn::clip_grad_norm_({unused}, 1.0);
  CHECK(none.item<double>() == 0);
  CHECK(nn::clip_grad_norm_({}, 1.0).item<double>() == 0);
}

TEST_CASE("a NaN gradient makes every gradient NaN, or an Error with error_if_nonfinite",
          "[optim][clip_grad]") {
  {
    TwoParams p({std::nan(""), 1}, {0, 2, 0, 0});
    CHECK(std::isnan(nn::clip_grad_norm_(p.params(), 1.0).item<double>()));
    for (const double g : p.grads()) CHECK(std::isnan(g));
  }
  {
    TwoParams p({std::nan(""), 1}, {0, 2, 0, 0});
    const std::vector<double> before = p.grads();
    CHECK_THROWS_WITH(nn::clip_grad_norm_(p.params(), 1.0, 2, /*error_if_nonfinite=*/true),
                      Contains("clip_grad_norm_: the total norm of order 2 is nan"));
    const std::vector<double> after = p.grads();
    CHECK(std::isnan(after[0]));
    CHECK(std::vector<double>(after.begin() + 1, after.end()) ==
          std::vector<double>(before.begin() + 1, before.end()));
  }
}

TEST_CASE("an infinite total scales the gradients by 0, as PyTorch's", "[optim][clip_grad]") {
  {
    TwoParams p({kInf, 1}, {0, -2, 0, 0});
    CHECK(nn::clip_grad_norm_(p.params(), 1.0).item<double>() == kInf);
    const std::vector<double> g = p.grads();
    CHECK(std::isnan(g[0]));  // inf * 0
    CHECK(g[1] == 0);
    CHECK(g[3] == 0);
  }
  {
    // Finite elements whose squares overflow float32.
    TwoParams p({3e38, 3e38}, {1, 0, 0, 0});
    CHECK(nn::clip_grad_norm_(p.params(), 1.0).item<double>() == kInf);
    for (const double g : p.grads()) CHECK(g == 0);
  }
  {
    TwoParams p({kInf, 1}, {0, -2, 0, 0});
    CHECK_THROWS_WITH(nn::clip_grad_norm_(p.params(), 1.0, 2, /*error_if_nonfinite=*/true),
                      Contains("clip_grad_norm_: the total norm of order 2 is inf"));
    CHECK(p.grads()[1] == 1);
  }
}

TEST_CASE("clip_grad_norm_ clips float64 gradients and counts empty ones as 0",
          "[optim][clip_grad]") {
  const Tensor w = zeros({2}, DType::Float64).set_requires_grad(true);
  const Tensor empty = zeros({0}, DType::Float64).set_requires_grad(true);
  F::add(F::sum(F::mul(w, tensor({3, 4}, {2}, DType::Float64))), F::sum(empty)).backward();
  REQUIRE(empty.grad().numel() == 0);
  const double p = GENERATE(2.0, 1.0, kInf);
  INFO("norm type " << p);
  const Tensor total = nn::clip_grad_norm_({empty, w}, 1.0, p);
  CHECK(total.dtype() == DType::Float64);
  CHECK(total.item<double>() == (p == 2 ? 5 : p == 1 ? 7 : 4));
  const std::vector<double> g = w.grad().to_vector<double>();
  const double scale = 1 / (total.item<double>() + 1e-6);
  CHECK(g[0] == Approx(3 * scale).epsilon(1e-12));
  CHECK(g[1] == Approx(4 * scale).epsilon(1e-12));
  CHECK(nn::clip_grad_norm_({empty}, 1.0, p).item<double>() == 0);
}

TEST_CASE("clip_grad_norm_ and clip_grad_value_ refuse bad arguments and write nothing",
          "[optim][clip_grad][errors]") {
  TwoParams p({3, 0}, {0, -4, 0, 0});
  const std::vector<double> before = p.grads();
  for (const double bad : {0.0, -kInf, std::nan("")})
    CHECK_THROWS_WITH(nn::clip_grad_norm_(p.params(), 1.0, bad),
                      Contains("clip_grad_norm_: norm_type must be positive"));
  CHECK_THROWS_WITH(nn::clip_grad_norm_(p.params(), -1.0),
                    Contains("clip_grad_norm_: max_norm must be non-negative, got -1"));
  CHECK_THROWS_WITH(nn::clip_grad_norm_({p.w1, Tensor()}, 1.0),
                    Contains("clip_grad_norm_: parameter 1 is undefined"));
  const Tensor w64 = zeros({2}, DType::Float64).set_requires_grad(true);
  F::sum(w64).backward();
  CHECK_THROWS_WITH(nn::clip_grad_norm_({p.w1, w64}, 1.0),
                    Contains("clip_grad_norm_: the gradients must share one device and dtype") &&
                        Contains("parameter 1's is Tensor[2] float64 cpu"));
  CHECK_THROWS_WITH(nn::clip_grad_value_({p.w1, w64}, 1.0),
                    Contains("clip_grad_value_: the gradients must share"));
  CHECK_THROWS_WITH(nn::clip_grad_value_(p.params(), -0.5),
                    Contains("clip_grad_value_: clip_value must be non-negative, got -0.5"));
  CHECK(p.grads() == before);
}

TEST_CASE("clip_grad_value_ clamps every gradient element and keeps NaN", "[optim][clip_grad]") {
  TwoParams p({-3, 0.5}, {std::nan(""), 2, -0.25, 1});
  nn::clip_grad_value_(p.params(), 1.0);
  const std::vector<double> g = p.grads();
  CHECK(g[0] == -1);
  CHECK(g[1] == 0.5);
  CHECK(std::isnan(g[2]));
  CHECK(g[3] == 1);
  CHECK(g[4] == -0.25);
  CHECK(g[5] == 1);
}

TEST_CASE("a static training step that clips its gradients replays eager's steps",
          "[static][clip_grad]") {
  // With the linears' Adam updates folded into their gradients' steps (as on CUDA) and not: a
  // clipped gradient is not the product's, so no update may fold.
  const bool fold = GENERATE(false, true);
  INFO("update folds " << (fold ? "on" : "off"));
  const StaticFoldCpuUpdates folds(fold);
  StaticRun run;
  SECTION("by the 2-norm") {
    run = check_clipped_steps(Device::cpu(), 2, false, 0.5);
  }
  SECTION("by the largest magnitude") {
    run = check_clipped_steps(Device::cpu(), kInf, false, 0.1);
  }
  SECTION("by value") {
    run = check_clipped_steps(Device::cpu(), 2, true, 0.02);
  }
  CHECK_THAT(run.schedule, Contains("adam_update") && !Contains("weight_grad_adam"));
  // The scaled (or clamped) values go straight into each .grad: no copy_ step, no temporary.
  CHECK(count_of(run.schedule, "writes what copy_ wrote") == 6);
  CHECK(count_of(run.schedule, R"(\d  copy_ )") == 0);
  if (fold) {
    // The control: the same MLP's step without the clip folds its updates.
    StaticEnabled on;
    const auto mlps = twin_mlps<MlpNet>(Device::cpu(), 5, 20, 16, 2, 8, 15);
    const StaticRun plain = check_whole_steps(mlps.eager, mlps.model, mlps.batches, MakeAdam{});
    CHECK_THAT(plain.schedule, Contains("weight_grad_adam"));
  }
}

TEST_CASE("error_if_nonfinite reads the norm on the host, which a static function refuses",
          "[static][clip_grad]") {
  StaticEnabled on;
  manual_seed(3);
  auto model = nn::mlp(4, 5, 3);
  optim::SGD opt(model->parameters());
  auto step = static_graph(
      [&](const Tensor& x, const Tensor& t) {
        Tensor loss = F::softmax_cross_entropy((*model)(x), t);
        opt.zero_grad();
        loss.backward();
        nn::clip_grad_norm_(model->parameters(), 1.0, 2, /*error_if_nonfinite=*/true);
        opt.step();
        return loss;
      },
      {.name = "checked_clip", .modules = {model}});
  const Tensor x = randn({6, 4});
  const Tensor t = cyclic_labels(6, 1, 3, Device::cpu());
  CHECK_THROWS_WITH(step(x, t), Contains("checked_clip") && Contains("host"));
}
