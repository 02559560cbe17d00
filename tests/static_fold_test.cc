// Fewer passes over activations (schedule/rewrites.cc, set_static_fold_activations_enabled): a
// linear or conv2d and the activation after it become one step, an activation's gradient is
// applied by the product computing the gradient it reads, and max_pool2d(relu(x)) runs as
// relu(max_pool2d(x)). Whole training steps (an MLP with Adam, CNNs with SGD) replay eager's bits
// in float32 and float64, the switch on and off, at one and two threads, in verify mode and with
// red zones; the dump marks each rewrite; the pooling swap keeps eager's bits for negative values,
// zeros, -0.0, NaN and ties (values and gradients); a pre-activation read elsewhere stays apart.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "api/src/routine.h"
#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/static_models.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

// Whether the dump shows any step of the rewrites ("fill_ and add_ in one" is the early-updates
// pass's).
bool shows_rewrites(const std::string& text) {
  for (const char* mark : {"linear_act", "conv2d_act", "matmul_act_grad", "before relu",
                           "after max_pool2d", "before max_pool2d_grad", "after relu_grad"})
    if (text.find(mark) != std::string::npos) return true;
  return count_of(text, R"((linear|conv2d|matmul) and [a-z_]+ in one)") > 0;
}

// The seed CNN's layers (three 3x3 convolutions, relu, 2x2 max pooling, a linear layer) over
// 12x12 images, in any dtype.
class PoolCnn : public nn::Module {
 public:
  explicit PoolCnn(DType dtype) {
    const nn::Conv2dOptions same{.padding = 1, .dtype = dtype};
    c1 = register_module("c1", std::make_shared<nn::Conv2d>(1, 4, 3, same));
    c2 = register_module("c2", std::make_shared<nn::Conv2d>(4, 4, 3, same));
    c3 = register_module("c3", std::make_shared<nn::Conv2d>(4, 4, 3, same));
    l1 = register_module(
        "l1", std::make_shared<nn::Linear>(4 * 6 * 6, 10, nn::LinearOptions{.dtype = dtype}));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = F::max_pool2d(F::relu((*c3)((*c2)((*c1)(x)))), 2);
    return (*l1)(F::flatten(h, 1));
  }
  std::shared_ptr<nn::Conv2d> c1, c2, c3;
  std::shared_ptr<nn::Linear> l1;
};

// Every activation a producer takes: conv (3x3, the shifted path) -> relu, conv (stride 2,
// im2col) -> tanh, linear -> sigmoid, linear -> leaky_relu (its gradient reads its input, so a
// training step keeps that pair apart), linear.
class ActNet : public nn::Module {
 public:
  explicit ActNet(DType dtype) {
    c1 = register_module("c1", std::make_shared<nn::Conv2d>(
                                   1, 3, 3, nn::Conv2dOptions{.padding = 1, .dtype = dtype}));
    c2 = register_module("c2", std::make_shared<nn::Conv2d>(
                                   3, 4, 3, nn::Conv2dOptions{.stride = 2, .dtype = dtype}));
    const nn::LinearOptions o{.dtype = dtype};
    l1 = register_module("l1", std::make_shared<nn::Linear>(4 * 5 * 5, 12, o));
    l2 = register_module("l2", std::make_shared<nn::Linear>(12, 12, o));
    l3 = register_module("l3", std::make_shared<nn::Linear>(12, 10, o));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = F::tanh((*c2)(F::relu((*c1)(x))));
    h = F::sigmoid((*l1)(F::flatten(h, 1)));
    return (*l3)(F::leaky_relu((*l2)(h), 0.1));
  }
  std::shared_ptr<nn::Conv2d> c1, c2;
  std::shared_ptr<nn::Linear> l1, l2, l3;
};

// A linear over [batch, 4, 6] (its gradients through views: gy read as [batch * 4, 8]), then one
// whose bias is frozen (no sum to fold), then one whose weight is frozen (no product).
class BiasNet : public nn::Module {
 public:
  explicit BiasNet(DType dtype) {
    const nn::LinearOptions o{.dtype = dtype};
    l1 = register_module("l1", std::make_shared<nn::Linear>(6, 8, o));
    l2 = register_module("l2", std::make_shared<nn::Linear>(32, 12, o));
    l3 = register_module("l3", std::make_shared<nn::Linear>(12, 10, o));
    l2->bias.set_requires_grad(false);
    l3->weight.set_requires_grad(false);
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = F::tanh((*l1)(F::reshape(x, {x.size(0), 4, 6})));
    return (*l3)(F::tanh((*l2)(F::flatten(h, 1))));
  }
  std::shared_ptr<nn::Linear> l1, l2, l3;
};

std::vector<Batch> image_batches(int count, int64_t batch, int64_t side, DType dtype,
                                 uint64_t seed) {
  manual_seed(seed);
  std::vector<Batch> out;
  for (int i = 0; i < count; ++i)
    out.push_back(
        {randn({batch, 1, side, side}, dtype), cyclic_labels(batch, 3 + i, 10, Device::cpu())});
  return out;
}

std::vector<Tensor> as_list(const Tensor& t) {
  return {t};
}
std::vector<Tensor> as_list(std::vector<Tensor> ts) {
  return ts;
}

auto adam = [](nn::Module& m) { return optim::Adam(m.parameters(), {.lr = 1e-2}); };
auto sgd = [](nn::Module& m) { return optim::SGD(m.parameters(), {.lr = 0.05}); };

template <typename Make>
std::string check_model(Make make, const std::vector<Batch>& batches, auto make_opt,
                        StaticOptions options = {.name = "fold_step"}) {
  return check_whole_steps(seeded(5, Device::cpu(), make), seeded(5, Device::cpu(), make), batches,
                           make_opt, std::move(options))
      .schedule;
}

}  // namespace

TEST_CASE("an MLP's Adam steps replay eager's bits with activations folded", "[static][fold]") {
  StaticEnabled on;
  const StaticRedzones no_redzones(false);
  for (const DType dtype : {DType::Float32, DType::Float64})
    for (const bool fold : {true, false})
      for (const int threads : {1, 2}) {
        INFO(name(dtype) << ", fold " << fold << ", " << threads << " threads");
        const StaticFoldActivations setting(fold);
        const ThreadCount t(threads);
        auto make = [dtype] { return nn::mlp(24, 16, 10, {.dtype = dtype}); };
        const std::string text = check_model(make, feature_batches(4, 8, 24, dtype, 3), adam);
        INFO(text);
        // Two hidden layers: two linears with their relu, two gradient products with relu_grad,
        // the first of them with the loss's gradient before it.
        CHECK(count_of(text, R"(linear_act\s+\[linear and relu in one: recorded as steps)") ==
              (fold ? 2 : 0));
        CHECK(count_of(text, R"(matmul_act_grad\s+\[matmul and relu_grad in one)") ==
              (fold ? 1 : 0));
        CHECK(count_of(text, R"(loss_grad_matmul\s+\[matmul and relu_grad in one: recorded as )"
                             R"(steps \d+ and (\d+); softmax_cross_entropy_grad and )"
                             R"(matmul_act_grad in one: recorded as steps \d+ and \1)") ==
              (fold ? 1 : 0));
        CHECK(count_of(text, R"(\d+  softmax_cross_entropy_grad\b)") == (fold ? 0 : 1));
        // Three linears: each one's weight and bias gradients in one step.
        CHECK(count_of(text, R"(weight_bias_grad\s+\[matmul and sum in one: recorded as steps)") ==
              (fold ? 3 : 0));
        CHECK(count_of(text, R"(\d+  sum\b)") == (fold ? 0 : 3));
        CHECK(shows_rewrites(text) == fold);
        CHECK(count_of(text, R"(\d+  relu\b)") == (fold ? 0 : 2));
      }
}

TEST_CASE("a linear's bias gradient joins its weight gradient's step with eager's bits",
          "[static][fold]") {
  StaticEnabled on;
  for (const DType dtype : {DType::Float32, DType::Float64})
    for (const int64_t batch : {1, 8}) {
      INFO(name(dtype) << ", batch " << batch);
      const StaticOptions verified{.name = "bias_fold", .verify_every = 1};
      // Only the first linear has both gradients (a gy of batch * 4 rows, as a 3-D view).
      const std::string text =
          check_model([dtype] { return std::make_shared<BiasNet>(dtype); },
                      feature_batches(3, batch, 24, dtype, 12), adam, verified);
      INFO(text);
      CHECK(count_of(text, R"(weight_bias_grad\s+\[matmul and sum in one: recorded as steps)") ==
            1);
      CHECK(count_of(text, R"(\d+  sum\b)") == 1);  // the frozen weight's linear
      // Batch 1: gy^T x over k = 1, its sum a copy of gy's row.
      const std::string mlp = check_model([dtype] { return nn::mlp(24, 16, 10, {.dtype = dtype}); },
                                          feature_batches(3, batch, 24, dtype, 13), sgd, verified);
      CHECK(count_of(mlp, "matmul and sum in one") == 3);
    }
}

TEST_CASE("a bias gradient stays apart from its weight gradient where gy changes between them",
          "[static][fold]") {
  // gy^T x then sum(gy, 0), as linear's backward computes them (detail::matmul_t), in a function
  // of its own: folded, unless gy is updated in place between the two (add_), where the sum must
  // see the new values.
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  NoGradGuard no_grad;
  for (const bool between : {false, true}) {
    INFO("add_ between: " << between);
    auto body = [between](const Tensor& gy, const Tensor& x) {
      const Tensor g = F::mul(gy, 2.0);  // a temporary of the call
      const Tensor w = detail::matmul_t(g, x, true, false);
      if (between) add_(g, gy);
      return std::vector<Tensor>{w, F::sum(g, {0})};
    };
    auto f = static_graph(body, {.name = "weight_bias"});
    for (int call = 0; call < 3; ++call) {
      manual_seed(20 + call);
      const Tensor gy = randn({9, 6}), x = randn({9, 7});
      const std::vector<Tensor> want = body(gy, x), got = f(gy, x);
      for (size_t i = 0; i < want.size(); ++i) CHECK(bit_diff(got[i], want[i]) == "");
    }
    INFO(f.schedule_text());
    CHECK(count_of(f.schedule_text(), "matmul and sum in one") == (between ? 0 : 1));
  }
}

TEST_CASE("the seed CNN's SGD steps replay eager's bits with max pooling before the relu",
          "[static][fold]") {
  StaticEnabled on;
  const StaticRedzones no_redzones(false);
  for (const bool fold : {true, false})
    for (const int threads : {1, 2}) {
      INFO("fold " << fold << ", " << threads << " threads");
      const StaticFoldActivations setting(fold);
      const ThreadCount t(threads);
      auto make = [] { return std::make_shared<models::SeedCnn>(4); };
      const std::string text = check_model(make, image_batches(3, 8, 28, DType::Float32, 8), sgd);
      INFO(text);
      CHECK(count_of(text, R"(max_pool2d\s+\[max_pool2d before relu: recorded as steps)") == fold);
      CHECK(count_of(text, R"(relu\s+\[[^\]]*relu after max_pool2d: writes what step \d+ did)") ==
            fold);
      CHECK(count_of(text, R"(max_pool2d_grad\s+\[max_pool2d_grad after relu_grad)") == fold);
      // The masked gradient (a relu_grad the swap placed) comes from the linear's input product,
      // which computes the loss's gradient too.
      CHECK(count_of(text,
                     R"(loss_grad_matmul\s+\[relu_grad before max_pool2d_grad: recorded as )"
                     R"(steps \d+ and \d+; matmul and relu_grad in one: recorded as step )"
                     R"(\d+; softmax_cross_entropy_grad and matmul_act_grad in one)") == fold);
      CHECK(shows_rewrites(text) == fold);
    }
}

TEST_CASE("CNNs in float32 and float64 replay eager's bits with every rewrite", "[static][fold]") {
  StaticEnabled on;
  const StaticRedzones no_redzones(false);
  for (const DType dtype : {DType::Float32, DType::Float64})
    for (const bool fold : {true, false}) {
      INFO(name(dtype) << ", fold " << fold);
      const StaticFoldActivations setting(fold);
      const std::string pool = check_model([dtype] { return std::make_shared<PoolCnn>(dtype); },
                                           image_batches(3, 6, 12, dtype, 4), sgd);
      INFO(pool);
      CHECK(count_of(pool, "max_pool2d before relu") == fold);
      const std::string acts = check_model([dtype] { return std::make_shared<ActNet>(dtype); },
                                           image_batches(3, 6, 12, dtype, 5), adam);
      INFO(acts);
      CHECK(count_of(acts, R"(conv2d_act\s+\[conv2d and relu in one)") == fold);
      CHECK(count_of(acts, R"(conv2d_act\s+\[conv2d and tanh in one)") == fold);
      CHECK(count_of(acts, R"(linear_act\s+\[linear and sigmoid in one)") == fold);
      CHECK(count_of(acts, R"(matmul_act_grad\s+\[matmul and sigmoid_grad in one)") == fold);
      // leaky_relu's gradient reads its input: the linear before it stays a linear.
      CHECK(count_of(acts, R"(\d+  leaky_relu\b)") == 1);
      CHECK(count_of(acts, "and leaky_relu in one") == 0);
      CHECK(shows_rewrites(acts) == fold);
    }
}

TEST_CASE("verify mode and red zones pass over folded plans", "[static][fold]") {
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  for (const bool redzones : {false, true}) {
    INFO("red zones " << redzones);
    const StaticRedzones setting(redzones);
    const StaticOptions verified{.name = "verified_fold", .verify_every = redzones ? 0 : 1};
    auto mlp = [] { return nn::mlp(24, 16, 10); };
    CHECK_THAT(check_model(mlp, feature_batches(3, 8, 24, DType::Float32, 6), adam, verified),
               Contains("linear and relu in one") && Contains("matmul and sum in one") &&
                   Contains("softmax_cross_entropy_grad and matmul_act_grad in one"));
    CHECK_THAT(check_model([] { return std::make_shared<PoolCnn>(DType::Float64); },
                           image_batches(3, 4, 12, DType::Float64, 7), sgd, verified),
               Contains("max_pool2d before relu"));
    const std::string acts =
        check_model([] { return std::make_shared<ActNet>(DType::Float32); },
                    image_batches(3, 4, 12, DType::Float32, 9), adam, verified);
    CHECK_THAT(acts, Contains("conv2d and tanh in one"));
    if (redzones) CHECK_THAT(acts, Contains("red zones: 64 guard bytes"));
  }
}

TEST_CASE("a leaky_relu without a backward folds into its linear", "[static][fold]") {
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  manual_seed(2);
  const Tensor w = randn({5, 7}), b = randn({5});
  auto body = [&](const Tensor& x) { return F::leaky_relu(F::linear(x, w, b), 0.2); };
  auto f = static_graph(body, {.name = "leaky"});
  NoGradGuard no_grad;
  for (int call = 0; call < 3; ++call) {
    const Tensor x = randn({4, 7});
    CHECK(bit_diff(f(x), body(x)) == "");
  }
  CHECK_THAT(f.schedule_text(), Contains("linear and leaky_relu in one"));
}

TEST_CASE("a pre-activation read elsewhere keeps its producer and activation apart",
          "[static][fold]") {
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  manual_seed(3);
  const Tensor w = randn({6, 4}).set_requires_grad();
  const Tensor w2 = randn({3, 4}).set_requires_grad();
  // Returned: the linear's output leaves the call. Read by another op: the sum.
  auto returned = [&](const Tensor& x) {
    const Tensor h = F::linear(x, w);
    return std::vector<Tensor>{h, F::relu(h)};
  };
  auto reread = [&](const Tensor& x) {
    const Tensor h = F::linear(x, w);
    return F::relu(h) + F::mul(h, 2.0);
  };
  // The pooled relu's output is read by another op as well: no swap.
  auto pooled = [&](const Tensor& x) {
    const Tensor r = F::relu(F::neg(F::reshape(x, {1, 2, 2, 6})));
    return F::sum(F::max_pool2d(r, 2)) + F::sum(r);
  };
  auto f = static_graph(returned, {.name = "returned"});
  auto g = static_graph(reread, {.name = "reread"});
  auto p = static_graph(pooled, {.name = "pooled"});
  // Each call's outputs and the gradients a backward through them gives, static against eager.
  auto check = [](auto& fn, auto& body, const Tensor& x) {
    const Tensor xs = x.detach().set_requires_grad(), xe = x.detach().set_requires_grad();
    const std::vector<Tensor> got = as_list(fn(xs)), want = as_list(body(xe));
    REQUIRE(got.size() == want.size());
    Tensor ls = F::sum(got[0]), le = F::sum(want[0]);
    for (size_t k = 0; k < got.size(); ++k) {
      CHECK(bit_diff(got[k], want[k]) == "");
      if (k > 0) {
        ls = ls + F::sum(got[k]);
        le = le + F::sum(want[k]);
      }
    }
    ls.backward();
    le.backward();
    CHECK(bit_diff(xs.grad(), xe.grad()) == "");
  };
  for (int call = 0; call < 3; ++call) {
    check(f, returned, randn({2, 4}));
    check(g, reread, randn({2, 4}));
    check(p, pooled, randn({2, 12}));
  }
  for (const std::string& text : {f.schedule_text(), g.schedule_text(), p.schedule_text()}) {
    INFO(text);
    CHECK_FALSE(shows_rewrites(text));
  }
  CHECK(count_of(f.schedule_text(), R"(\d+  linear\b)") == 1);
  CHECK(count_of(g.schedule_text(), R"(\d+  linear\b)") == 1);
  CHECK(count_of(p.schedule_text(), R"(\d+  max_pool2d\s)") == 1);
}

namespace {

// Values that make every case of the pooling swap: windows all negative, all zero (+0 and -0
// mixed, ties), with a NaN (one or two, of different payloads), positive maxima tied with each
// other or with zeros, infinities.
std::vector<double> edge_values(int64_t n) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> pattern = {-1.5, -2.0, -0.5, -3.0, 0.0,  -0.0, 0.0,  -0.0, -0.0, 0.0,
                                       -1.0, 0.0,  2.0,  2.0,  -1.0, 2.0,  nan,  1.0,  -1.0, 3.0,
                                       -nan, 5.0,  nan,  -2.0, inf,  -inf, 1.0,  inf,  -inf, -inf,
                                       -0.0, -inf, 0.5,  0.5,  0.5,  0.5,  -0.0, 0.25, 0.0,  0.25};
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = pattern[i % pattern.size()];
  return v;
}

}  // namespace

TEST_CASE("max pooling before a relu keeps eager's bits for zeros, -0.0, NaN and ties",
          "[static][fold]") {
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  struct Window {
    int kernel, stride, padding;
  };
  // 2x2 (its own loops, and a last row and column in no window at side 9), 3x3 overlapping
  // windows with padding (the general path).
  for (const DType dtype : {DType::Float32, DType::Float64})
    for (const Window win : {Window{2, 2, 0}, Window{3, 1, 1}})
      for (const int64_t side : {int64_t{8}, int64_t{9}}) {
        INFO(name(dtype) << ", kernel " << win.kernel << " stride " << win.stride << ", side "
                         << side);
        const Shape shape{2, 3, side, side};
        // neg() makes the relu's input a value of the call, as a producer would; it is exact.
        auto body = [&](const Tensor& x) {
          return F::neg(F::max_pool2d(F::relu(F::neg(x)), win.kernel, win.stride, win.padding));
        };
        auto f = static_graph(body, {.name = "pool_relu"});
        std::vector<double> xs = edge_values(shape.numel());
        for (double& v : xs) v = -v;
        for (int call = 0; call < 3; ++call) {
          const Tensor x = tensor(xs, shape, dtype).set_requires_grad();
          const Tensor xe = tensor(xs, shape, dtype).set_requires_grad();
          const Tensor y = f(x), ye = body(xe);
          CHECK(bit_diff(y, ye) == "");
          // The incoming gradient holds -0.0, NaN and both signs too.
          const std::vector<double> gs = edge_values(y.numel() + call);
          const Tensor gy = tensor(std::span<const double>(gs).subspan(call), y.shape(), dtype);
          y.backward(gy);
          ye.backward(gy);
          CHECK(bit_diff(x.grad(), xe.grad()) == "");
        }
        const std::string text = f.schedule_text();
        INFO(text);
        CHECK_THAT(text, Contains("max_pool2d before relu"));
        CHECK_THAT(text, Contains("max_pool2d_grad after relu_grad"));
      }
}

TEST_CASE("the fold switch is read when a signature is traced", "[static][fold]") {
  StaticEnabled on;
  const bool before = static_fold_activations_enabled();
  manual_seed(4);
  const Tensor w = randn({5, 7});
  auto body = [&](const Tensor& x) { return F::relu(F::linear(x, w)); };
  auto f = static_graph(body, {.name = "switch"});
  {
    const StaticFoldActivations off(false);
    CHECK_FALSE(static_fold_activations_enabled());
    f(randn({2, 7}));  // traced with the switch off
  }
  {
    const StaticFoldActivations on_again(true);
    f(randn({2, 7}));  // a replay of that plan
    CHECK_FALSE(shows_rewrites(f.schedule_text()));
    f(randn({3, 7}));  // a new signature, traced with the switch on
    CHECK(shows_rewrites(f.schedule_text()));
  }
  CHECK(static_fold_activations_enabled() == before);
}

TEST_CASE("gelu's gradient is applied by the product computing its incoming gradient",
          "[static][fold]") {
  StaticEnabled on;
  const StaticRedzones no_redzones(false);
  for (const DType dtype : {DType::Float32, DType::Float64})
    for (const bool fold : {true, false})
      for (const int threads : {1, 2}) {
        INFO(name(dtype) << ", fold " << fold << ", " << threads << " threads");
        const StaticFoldActivations setting(fold);
        const ThreadCount t(threads);
        auto make = [dtype] { return std::make_shared<GeluMlp>(dtype); };
        const std::string text = check_model(make, feature_batches(4, 8, 24, dtype, 11), adam);
        INFO(text);
        CHECK(count_of(text,
                       R"((matmul_act_grad|loss_grad_matmul)\s+\[matmul and gelu_grad in one)") ==
              (fold ? 2 : 0));
        CHECK(count_of(text,
                       R"(loss_grad_matmul\s+\[matmul and gelu_grad in one: recorded as )"
                       R"(steps \d+ and \d+; softmax_cross_entropy_grad and matmul_act_grad)") ==
              (fold ? 1 : 0));
        CHECK(count_of(text, "and gelu in one") == 0);  // gelu_grad reads the pre-activation
        CHECK(shows_rewrites(text) == fold);
      }
  // Verify mode compares the folded gradients with eager's gelu_grad.
  const StaticFoldActivations fold(true);
  const std::string verified = check_model([] { return std::make_shared<GeluMlp>(DType::Float32); },
                                           feature_batches(3, 8, 24, DType::Float32, 12), adam,
                                           {.name = "verified_gelu", .verify_every = 1});
  CHECK_THAT(verified, Contains("matmul and gelu_grad in one"));
}

TEST_CASE("a linear and its gelu fold into one step without a backward", "[static][fold]") {
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  for (const DType dtype : {DType::Float32, DType::Float64})
    for (const char* form : {"none", "tanh"}) {
      INFO(name(dtype) << ", gelu " << form);
      manual_seed(4);
      const Tensor w = randn({40, 7}, dtype), b = randn({40}, dtype);
      auto body = [&](const Tensor& x) { return F::gelu(F::linear(x, w, b), form); };
      auto f = static_graph(body, {.name = "gelu_linear"});
      auto v = static_graph(body, {.name = "gelu_linear_verified", .verify_every = 1});
      NoGradGuard no_grad;
      for (int call = 0; call < 3; ++call) {
        const Tensor x = randn({33, 7}, dtype) * 3.0;  // both tails of gelu
        CHECK(bit_diff(f(x), body(x)) == "");
        CHECK(bit_diff(v(x), body(x)) == "");
      }
      const std::string text = f.schedule_text();
      INFO(text);
      CHECK_THAT(text, Contains("linear and gelu in one"));
      CHECK(f.stats().cache[0].forward_steps == 1);
      CHECK(v.stats().verifications == 2);
    }
}
