// Pooling, batch normalisation and dropout: op-harness cases (op_cases_image.h: forward against
// plain-loop references in float64 and float32, numerical gradients in float64), running statistics
// against a hand computation, dropout's statistics and determinism, modules, and errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "encore/functions.h"
#include "encore/nn.h"
#include "op_cases_image.h"
#include "op_harness.h"
#include "runtime/dispatcher.h"
#include "runtime/parallel.h"
#include "runtime/rng.h"

using namespace encore;
using namespace encore::optest;
using Catch::Matchers::Contains;

namespace {

// Restores the cpu generator's state when the test ends (other tests seed it themselves).
class GeneratorState {
 public:
  GeneratorState() : saved_(gen().state()) {}
  ~GeneratorState() { gen().set_state(saved_); }
  static Generator& gen() { return default_generator(Device::cpu()); }

 private:
  Generator::Stream saved_;
};

int64_t count_zeros(const Tensor& t) {
  int64_t n = 0;
  for (double v : t.to_vector<double>()) n += v == 0 ? 1 : 0;
  return n;
}

}  // namespace

// ---- Pooling ------------------------------------------------------------------------------

TEST_CASE("max_pool2d against a reference, with gradients", "[pool_norm]") {
  check_ops(max_pool_cases());
}

TEST_CASE("max_pool2d over NaN gives PyTorch's values and gradients", "[pool_norm][nan]") {
  check_ops(max_pool_nan_cases());
}

TEST_CASE("max_pool2d sends the gradient to the first maximum of a window", "[pool_norm]") {
  // One 2x2 window holding 5 twice: row-major order makes (0,1) the first.
  Tensor x = tensor({1, 5, 5, 2}, {1, 1, 2, 2}, DType::Float64).set_requires_grad();
  Tensor y = F::max_pool2d(x, 2);
  CHECK(y.to_vector<double>() == std::vector<double>{5});
  y.backward(full({1, 1, 1, 1}, 3.0, DType::Float64));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 3, 0, 0});
}

TEST_CASE(
    "max_pool2d with ties, zeros of both signs and NaN: value and gradient of the first maximum",
    "[pool_norm]") {
  const std::vector<PoolSpec> specs = tie_pool_specs();
  const std::vector<Dims> shapes = tie_pool_shapes();
  std::mt19937 rng(11);
  for (const DType dtype : {DType::Float32, DType::Float64})
    for (const PoolSpec& p : specs)
      for (const Dims& shape : shapes) {
        INFO(name(dtype) << " " << dims_str(shape) << " k" << p.kh << "x" << p.kw << " s" << p.sh
                         << "x" << p.sw << " p" << p.ph << "x" << p.pw);
        const int64_t n = ref::numel(shape);
        const std::vector<double> xv = tie_pool_values(n, rng);
        const std::vector<int64_t> at = ref_first_max(xv, shape, p);
        std::vector<double> gyv(at.size()), want_gx(n, 0.0);
        for (size_t k = 0; k < at.size(); ++k) {
          gyv[k] = static_cast<double>(rng() % 7) - 3;  // integers: sums exact in any order
          want_gx[at[k]] += gyv[k];
        }
        Tensor x = tensor(xv, Shape(shape), dtype).set_requires_grad();
        Tensor y = F::max_pool2d(x, Size2(p.kh, p.kw), Size2(p.sh, p.sw), Size2(p.ph, p.pw));
        REQUIRE(y.numel() == static_cast<int64_t>(at.size()));
        y.backward(tensor(gyv, y.shape(), dtype));
        std::vector<double> want_y(at.size());
        for (size_t k = 0; k < at.size(); ++k) want_y[k] = xv[at[k]];
        CHECK(count_unequal(y.to_vector<double>(), want_y) == 0);
        CHECK(x.grad().to_vector<double>() == want_gx);
      }
}

TEST_CASE("avg_pool2d against a reference, with gradients", "[pool_norm]") {
  check_ops(avg_pool_cases());
}

TEST_CASE("global_avg_pool2d against a reference, with gradients", "[pool_norm]") {
  check_op(global_avg_pool_case());
}

// ---- Batch normalisation -------------------------------------------------------------------

TEST_CASE("batch_norm in training against a reference, with gradients", "[pool_norm]") {
  check_ops(batch_norm_train_cases());
}

TEST_CASE("batch_norm in eval mode against a reference, with gradients", "[pool_norm]") {
  check_ops(batch_norm_eval_cases());
}

TEST_CASE("batch_norm is accurate when the mean is large against the spread", "[pool_norm]") {
  // Values big +- 1 alternating by row: a one-pass E[x^2] - E[x]^2 loses the variance entirely
  // (in double at 1e8, in float at 1e4); two passes keep it.
  for (auto [dt, big] : {std::pair{DType::Float64, 1e8}, std::pair{DType::Float32, 1e4}}) {
    INFO(name(dt));
    std::vector<double> v;
    for (int i = 0; i < 64; ++i) v.push_back(big + ((i / 2) % 2 ? 1.0 : -1.0));
    const Tensor x = tensor(v, {32, 2}, dt);
    const auto y = F::batch_norm(x, {}, {}, {}, {}, true, 0.1, 0).to_vector<double>();
    for (int i = 0; i < 64; ++i) CHECK(y[i] == Approx((i / 2) % 2 ? 1.0 : -1.0).epsilon(1e-6));
  }
}

TEST_CASE("batch_norm updates the running statistics as a hand computation", "[pool_norm]") {
  SECTION("a small example by hand") {
    // Channel 0 holds {1, 2, 3, 6}: mean 3, biased variance 14/4, unbiased 14/3. Channel 1
    // holds {0, 0, 2, 2}: mean 1, biased variance 1, unbiased 4/3.
    const Tensor x = tensor({1, 2, 0, 0, 3, 6, 2, 2}, {2, 2, 1, 2}, DType::Float64);
    Tensor rm = tensor({0, 10}, {2}, DType::Float64);
    Tensor rv = tensor({1, 2}, {2}, DType::Float64);
    const uint32_t version = rm.version();
    F::batch_norm(x, rm, rv, {}, {}, true, 0.25);
    CHECK(rm.version() != version);
    const auto m = rm.to_vector<double>(), var = rv.to_vector<double>();
    CHECK(m[0] == Approx(0.75 * 0 + 0.25 * 3).epsilon(1e-14));
    CHECK(m[1] == Approx(0.75 * 10 + 0.25 * 1).epsilon(1e-14));
    CHECK(var[0] == Approx(0.75 * 1 + 0.25 * 14.0 / 3).epsilon(1e-14));
    CHECK(var[1] == Approx(0.75 * 2 + 0.25 * 4.0 / 3).epsilon(1e-14));

    // Eval mode normalises with them and leaves them alone.
    const Tensor y = F::batch_norm(x, rm, rv, {}, {}, false, 0.25);
    CHECK(rm.to_vector<double>() == m);
    CHECK(rv.to_vector<double>() == var);
    CHECK(y.to_vector<double>()[0] == Approx((1 - m[0]) / std::sqrt(var[0] + 1e-5)));
  }
  SECTION("a random example, both dtypes, momentum 0.3") {
    for (DType dt : {DType::Float64, DType::Float32}) {
      INFO(name(dt));
      const Tensor x = rand({4, 3, 2, 5}, dt, Device::cpu(), -2, 3);
      const Tensor rm0 = rand({3}, dt), rv0 = rand({3}, dt, Device::cpu(), 0.5, 2);
      Tensor rm = clone(rm0), rv = clone(rv0);
      F::batch_norm(x, rm, rv, ones({3}, dt), zeros({3}, dt), true, 0.3);
      const RefTensor xr = read_back(x);
      const double tol = dt == DType::Float64 ? 1e-13 : 1e-6;
      for (int64_t c = 0; c < 3; ++c) {
        const auto [mean, var] = ref_channel_stats(xr, c);
        const double count = 40;
        CHECK(rm.to_vector<double>()[c] ==
              Approx(0.7 * rm0.to_vector<double>()[c] + 0.3 * mean).epsilon(tol).margin(tol));
        CHECK(rv.to_vector<double>()[c] ==
              Approx(0.7 * rv0.to_vector<double>()[c] + 0.3 * var * count / (count - 1))
                  .epsilon(tol)
                  .margin(tol));
      }
    }
  }
}

TEST_CASE("batch statistics and dropout masks are outputs that need no gradient", "[pool_norm]") {
  Tensor x = tensor({0, 5, -3, 2, 1, 4, 4, -2, 7, -1, 3, 0}, {4, 3}, DType::Float64);
  x.set_requires_grad();
  Tensor y = Tensor::empty({4, 3}, DType::Float64), mean = Tensor::empty({3}, DType::Float64),
         var = Tensor::empty({3}, DType::Float64);
  dispatch(Op::BatchNorm, {x}, {y, mean, var}, AttrBlob::of(BatchNormAttrs{}));
  CHECK(y.requires_grad());
  CHECK_FALSE(mean.requires_grad());
  CHECK_FALSE(var.requires_grad());
  F::sum(F::mul(y, y)).backward();  // the missing statistics gradients are zeros
  REQUIRE(x.grad().defined());
  // sum(y^2) = N per channel whatever x is (up to eps), so its gradient is nearly 0.
  for (double g : x.grad().to_vector<double>()) CHECK(std::abs(g) < 1e-3);

  Tensor z = Tensor::empty({4, 3}, DType::Float64), mask = Tensor::empty({4, 3}, DType::Float64);
  dispatch(Op::Dropout, {x}, {z, mask}, AttrBlob::of(RandomAttrs{0.5, 0, 1, 0}));
  CHECK(z.requires_grad());
  CHECK_FALSE(mask.requires_grad());
}

TEST_CASE("BatchNorm2d registers gamma and beta, keeps running statistics, follows train/eval",
          "[pool_norm]") {
  auto bn = std::make_shared<nn::BatchNorm2d>(3, nn::BatchNormOptions{.momentum = 0.5});
  const auto params = bn->named_parameters();
  REQUIRE(params.size() == 2);
  CHECK(params[0].first == "gamma");
  CHECK(params[1].first == "beta");
  CHECK(bn->gamma.to_vector<float>() == std::vector<float>{1, 1, 1});
  CHECK(bn->beta.to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(bn->running_mean.to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(bn->running_var.to_vector<float>() == std::vector<float>{1, 1, 1});
  CHECK_FALSE(bn->running_mean.requires_grad());
  CHECK(bn->describe() == "BatchNorm2d(3, eps 1e-05, momentum 0.5)");

  const Tensor x = rand({4, 3, 2, 2}, DType::Float32, Device::cpu(), 1, 3);
  const Tensor y_train = (*bn)(x);
  for (float m : bn->running_mean.to_vector<float>()) CHECK(m > 0.5f);  // half the batch mean
  F::sum(y_train).backward();
  CHECK(bn->gamma.grad().defined());
  CHECK(bn->beta.grad().defined());

  bn->eval();
  const std::vector<float> before = bn->running_mean.to_vector<float>();
  const Tensor y_eval = (*bn)(x);
  CHECK(bn->running_mean.to_vector<float>() == before);
  // Eval normalises with the running statistics, so it differs from the training output.
  CHECK(y_eval.to_vector<float>() != y_train.to_vector<float>());

  auto plain = std::make_shared<nn::BatchNorm2d>(2, nn::BatchNormOptions{.affine = false});
  CHECK(plain->parameters().empty());
  CHECK_FALSE(plain->gamma.defined());
  CHECK(plain->describe() == "BatchNorm2d(2, eps 1e-05, momentum 0.1, no affine)");
  CHECK((*plain)(rand({2, 2, 3, 3})).shape() == Shape{2, 2, 3, 3});
}

// ---- Dropout ------------------------------------------------------------------------------

TEST_CASE("dropout zeroes about ratio of the elements and scales the others", "[pool_norm]") {
  GeneratorState keep;
  for (DType dt : {DType::Float32, DType::Float64}) {
    for (double ratio : {0.1, 0.5, 0.8}) {
      INFO(name(dt) << " ratio " << ratio);
      const int64_t n = 100000;
      const Tensor y = F::dropout(ones({n}, dt), ratio);
      const double dropped = static_cast<double>(count_zeros(y)) / n;
      CHECK(std::abs(dropped - ratio) < 0.01);  // the standard deviation is below 0.0016
      const double scale =
          dt == DType::Float32 ? static_cast<float>(1 / (1 - ratio)) : 1 / (1 - ratio);
      int64_t wrong = 0;
      for (double v : y.to_vector<double>()) wrong += v == 0 || v == scale ? 0 : 1;
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("dropout's gradient is the mask", "[pool_norm]") {
  GeneratorState keep;
  for (DType dt : {DType::Float32, DType::Float64}) {
    INFO(name(dt));
    // |x| >= 0.5, so y / x recovers the mask exactly.
    Tensor x = F::add(rand({1000}, dt, Device::cpu(), 0, 1), 0.5).detach().set_requires_grad();
    const Tensor y = F::dropout(x, 0.5);
    const Tensor gy = rand({1000}, dt);
    y.backward(gy);
    const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
    const auto gv = gy.to_vector<double>(), gx = x.grad().to_vector<double>();
    int64_t wrong = 0, kept = 0;
    for (size_t i = 0; i < xv.size(); ++i) {
      const double mask = yv[i] == 0 ? 0.0 : 2.0;
      kept += yv[i] != 0;
      wrong += gx[i] == gv[i] * mask ? 0 : 1;
    }
    CHECK(wrong == 0);
    CHECK(kept > 400);
    CHECK(kept < 600);
  }
}

TEST_CASE("dropout in eval mode or with ratio 0 is the identity", "[pool_norm]") {
  const Tensor x = rand({3, 4});
  CHECK(F::dropout(x, 0.5, false).is_same(x));
  CHECK(F::dropout(x, 0.0, true).is_same(x));
  nn::Dropout d(0.3);
  CHECK(d.describe() == "Dropout(0.3)");
  d.eval();
  CHECK(d(x).is_same(x));
  d.train();
  CHECK_FALSE(d(x).is_same(x));
}

TEST_CASE("dropout with ratio 1 zeroes everything, keeps NaN and draws nothing", "[pool_norm]") {
  // PyTorch's p = 1: x * 0, a gradient of zeros, the generator untouched.
  GeneratorState keep;
  Generator& gen = GeneratorState::gen();
  gen.manual_seed(7);
  const Tensor fresh = rand({8});
  gen.manual_seed(7);
  Tensor x = tensor({1, -2, std::nan(""), 4}, {4}).set_requires_grad();
  nn::Dropout d(1.0);
  const Tensor y = d(x);
  const auto yv = y.to_vector<float>();
  CHECK(yv[0] == 0);
  CHECK(yv[1] == 0);
  CHECK(std::isnan(yv[2]));
  CHECK(yv[3] == 0);
  F::sum(y).backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{0, 0, 0, 0});
  CHECK(rand({8}).to_vector<float>() == fresh.to_vector<float>());
}

TEST_CASE("dropout masks follow the generator: same seed same mask, new call new mask",
          "[pool_norm]") {
  GeneratorState keep;
  const Tensor x = ones({4096}, DType::Float64);
  Generator& gen = GeneratorState::gen();
  gen.manual_seed(1234);
  const auto first = F::dropout(x, 0.5).to_vector<double>();
  const auto second = F::dropout(x, 0.5).to_vector<double>();
  CHECK(first != second);
  gen.manual_seed(1234);
  CHECK(F::dropout(x, 0.5).to_vector<double>() == first);
  CHECK(F::dropout(x, 0.5).to_vector<double>() == second);
  gen.manual_seed(99);
  CHECK(F::dropout(x, 0.5).to_vector<double>() != first);
}

TEST_CASE("a dropout kernel call depends only on seed, offset and index", "[pool_norm]") {
  // The static replay calls the kernel on other buffers with a stream it reserved itself.
  GeneratorState keep;
  Generator& gen = GeneratorState::gen();
  gen.set_state(77, 4000);
  for (DType dt : {DType::Float32, DType::Float64}) {
    INFO(name(dt));
    const Tensor x = rand({1000}, dt, Device::cpu(), -1, 1);
    const uint64_t seed = gen.seed(), offset = gen.offset();
    const Tensor eager = F::dropout(x, 0.4);
    CHECK(gen.offset() == offset + random_count(1000));
    // The kernel on raw buffers with the stream eager reserved: the same bits.
    for (int64_t n : {int64_t{1000}, int64_t{17}}) {
      Tensor y = Tensor::empty({n}, dt), mask = Tensor::empty({n}, dt);
      const BufferView views[] = {
          {x.raw_data(), {n}, dt}, {y.raw_data(), {n}, dt}, {mask.raw_data(), {n}, dt}};
      const AttrBlob attrs = AttrBlob::of(RandomAttrs{0.4, 0, seed, offset});
      lookup_kernel(Op::Dropout, DeviceType::CPU)(
          KernelArgs{std::span(views, 1), std::span(views + 1, 2), attrs});
      const auto e = eager.to_vector<double>();
      CHECK(y.to_vector<double>() == std::vector<double>(e.begin(), e.begin() + n));
    }
  }
}

TEST_CASE("pooling, batch_norm and dropout give the same bits at any thread count", "[pool_norm]") {
  // Large enough that every kernel splits its work with 4 threads.
  GeneratorState keep;
  const Tensor x0 = rand({8, 16, 20, 20}, DType::Float32, Device::cpu(), -1, 1);
  const Tensor xb0 = rand({4, 256, 8, 8}, DType::Float32, Device::cpu(), -1, 1);
  const Tensor gamma0 = rand({256}, DType::Float32, Device::cpu(), 0.5, 2);
  // Everything the ops give, forward and backward, on one thread count.
  auto run = [&](int threads) {
    const int before = num_threads();
    set_num_threads(threads);
    GeneratorState::gen().set_state(5, 0);
    Tensor x = clone(x0).set_requires_grad();
    Tensor xb = clone(xb0).set_requires_grad();
    Tensor gamma = clone(gamma0).set_requires_grad();
    Tensor beta = zeros({256}).set_requires_grad();
    Tensor rm = zeros({256}), rv = ones({256});
    std::vector<Tensor> outs = {
        F::max_pool2d(x, 3, 2, 1), F::avg_pool2d(x, 3, 1, 1, false),
        F::max_pool2d(x, 2),       F::avg_pool2d(x, 2),
        F::dropout(x, 0.3),        F::batch_norm(xb, rm, rv, gamma, beta, true)};
    Tensor loss;
    for (const Tensor& o : outs) {
      const Tensor s = F::sum(F::mul(o, o));
      loss = loss.defined() ? F::add(loss, s) : s;
    }
    loss.backward();
    outs.insert(outs.end(), {x.grad(), xb.grad(), gamma.grad(), beta.grad(), rm, rv});
    set_num_threads(before);
    return outs;
  };
  const std::vector<Tensor> one = run(1), many = run(4);
  REQUIRE(one.size() == many.size());
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("result " << i);
    CHECK(one[i].to_vector<float>() == many[i].to_vector<float>());
  }
}

// ---- Errors -------------------------------------------------------------------------------

TEST_CASE("pooling, batch_norm and dropout reject bad arguments naming op, argument and shapes",
          "[pool_norm]") {
  const Tensor x4 = rand({2, 3, 4, 4});
  CHECK_THROWS_WITH(F::max_pool2d(rand({2, 3, 4}), 2),
                    Contains("max_pool2d") && Contains("4-D") && Contains("[2,3,4]"));
  CHECK_THROWS_WITH(F::avg_pool2d(x4, 3, 1, 2), Contains("avg_pool2d") && Contains("padding 2x2") &&
                                                    Contains("3x3") && Contains("[2,3,4,4]"));
  CHECK_THROWS_WITH(F::max_pool2d(x4, 5), Contains("max_pool2d") &&
                                              Contains("kernel 5x5 is larger") &&
                                              Contains("[2,3,4,4]"));
  CHECK_THROWS_WITH(F::max_pool2d(x4, Size2(2, 0)),
                    Contains("max_pool2d") && Contains("kernel") && Contains("2x0"));
  CHECK_THROWS_WITH(F::avg_pool2d(x4, 2, Size2(0)), Contains("avg_pool2d") && Contains("stride"));
  CHECK_THROWS_WITH(F::max_pool2d(rand({1, 1, 0, 4}), 1),
                    Contains("max_pool2d") && Contains("[1,1,0,4]"));
  CHECK_THROWS_WITH(F::max_pool2d(full({2, 2, 2, 2}, 1, DType::Int32), 2),
                    Contains("max_pool2d") && Contains("'x'") && Contains("int32"));
  CHECK_THROWS_WITH(F::global_avg_pool2d(rand({2, 3})),
                    Contains("global_avg_pool2d") && Contains("[2,3]"));
  // An average over no elements (NaN) is refused, as max_pool2d refuses them.
  for (const Shape& empty : {Shape{2, 3, 0, 0}, Shape{2, 3, 0, 4}, Shape{2, 3, 4, 0}})
    CHECK_THROWS_WITH(
        F::global_avg_pool2d(rand(empty)),
        Contains("global_avg_pool2d: x " + empty.str() + " has no elements in height or width"));
  CHECK(F::global_avg_pool2d(rand({0, 3, 2, 2})).numel() == 0);

  CHECK_THROWS_WITH(F::batch_norm(rand({2, 3, 4}), {}, {}, {}, {}, true),
                    Contains("batch_norm") && Contains("[2,3,4]"));
  CHECK_THROWS_WITH(F::batch_norm(rand({2, 0}), {}, {}, {}, {}, true),
                    Contains("batch_norm: x [2,0] has no channels"));
  CHECK_THROWS_WITH(F::batch_norm(x4, {}, {}, rand({4}), rand({4}), true),
                    Contains("batch_norm") && Contains("gamma is [4]") && Contains("3 channels") &&
                        Contains("[2,3,4,4]"));
  CHECK_THROWS_WITH(
      F::batch_norm(x4, rand({2}), rand({3}), {}, {}, false),
      Contains("batch_norm") && Contains("running_mean is [2]") && Contains("[2,3,4,4]"));
  CHECK_THROWS_WITH(F::batch_norm(x4, {}, {}, rand({3}, DType::Float64), rand({3}), true),
                    Contains("batch_norm") && Contains("gamma") && Contains("float64"));
  CHECK_THROWS_WITH(F::batch_norm(x4, {}, {}, rand({3}), {}, true),
                    Contains("batch_norm") && Contains("gamma and beta"));
  CHECK_THROWS_WITH(F::batch_norm(x4, rand({3}), {}, {}, {}, true),
                    Contains("batch_norm") && Contains("running_mean and running_var"));
  CHECK_THROWS_WITH(F::batch_norm(x4, {}, {}, {}, {}, false),
                    Contains("batch_norm") && Contains("eval") && Contains("running_mean"));
  CHECK_THROWS_WITH(F::batch_norm(rand({1, 3}), {}, {}, {}, {}, true),
                    Contains("batch_norm") && Contains("more than one value") && Contains("[1,3]"));
  auto bn = std::make_shared<nn::BatchNorm2d>(4);
  CHECK_THROWS_WITH((*bn)(x4),
                    Contains("batch_norm") && Contains("gamma is [4]") && Contains("3 channels"));

  CHECK_THROWS_WITH(F::dropout(x4, 1.5), Contains("dropout") && Contains("ratio") &&
                                             Contains("[0, 1]") && Contains("[2,3,4,4]"));
  CHECK_THROWS_WITH(F::dropout(x4, -0.1), Contains("dropout") && Contains("ratio"));
  CHECK_THROWS_WITH(F::dropout(x4, std::nan(""), false), Contains("dropout") && Contains("ratio"));
  CHECK_THROWS_WITH(nn::Dropout(1.5), Contains("Dropout") && Contains("ratio"));
}

TEST_CASE("pooling refuses a padding whose double does not fit an int", "[pool_norm]") {
  // Twice the padding was computed in int and wrapped (INT_MAX: -2), passing the check.
  const Tensor x = randn({1, 1, 8, 8});
  constexpr int kMax = std::numeric_limits<int>::max();
  for (const Size2 padding : {Size2(kMax), Size2(0, kMax), Size2(kMax / 2 + 1, 0)}) {
    INFO("padding " << padding.str());
    const std::string expected =
        "padding " + padding.str() + " must be between 0 and half the kernel 2x2";
    CHECK_THROWS_WITH(F::max_pool2d(x, 2, std::nullopt, padding),
                      Contains("max_pool2d: " + expected + " (x is [1,1,8,8])"));
    CHECK_THROWS_WITH(F::avg_pool2d(x, 2, std::nullopt, padding),
                      Contains("avg_pool2d: " + expected + " (x is [1,1,8,8])"));
    CHECK_THROWS_WITH(nn::MaxPool2d(2, std::nullopt, padding), Contains("MaxPool2d: " + expected));
    CHECK_THROWS_WITH(nn::AvgPool2d(2, std::nullopt, padding), Contains("AvgPool2d: " + expected));
  }
}

TEST_CASE("pooling modules describe themselves", "[pool_norm]") {
  CHECK(nn::MaxPool2d(2).describe() == "MaxPool2d(kernel 2x2, stride 2x2, padding 0x0)");
  CHECK(nn::AvgPool2d(Size2(3, 2), Size2(1), Size2(1, 0)).describe() ==
        "AvgPool2d(kernel 3x2, stride 1x1, padding 1x0)");
  nn::MaxPool2d pool(2);
  CHECK(pool(rand({1, 2, 5, 4})).shape() == Shape{1, 2, 2, 2});
  nn::GlobalAvgPool2d gap;
  CHECK(gap(rand({2, 3, 4, 4})).shape() == Shape{2, 3});
}
