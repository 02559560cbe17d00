// Small products on cuda (runtime/small_gemm.h): encore's own GEMM kernels run them, eagerly and
// replayed, and a CUDA plan folds a linear's activation, a product's activation gradient, a
// linear's bias gradient and a loss's gradient (loss_fold_cases.h) into them. Checked against the
// cpu's values and gradients (eager, every layout), and against eager's bits on cuda (replays, with
// CUDA graphs on and off, in float32 and float64, the fold switch on and off, every activation and
// gradient, 3-D inputs, NaN, verify mode); a product too large for them keeps its steps apart.
// (With ENCORE_CUDA_SMALL_GEMM=0 nothing folds: these cases expect the default.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/small_gemm.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/loss_fold_cases.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"
#include "tests/update_fold_cases.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

// Linear layers with each activation a producer folds, and a product whose gradient reads a
// sigmoid's output: tanh, sigmoid, relu, leaky_relu (its gradient reads its input: in a training
// step it stays apart), then the head.
class ActMlp : public nn::Module {
 public:
  explicit ActMlp(DType dtype) {
    const nn::LinearOptions o{.dtype = dtype};
    l1 = register_module("l1", std::make_shared<nn::Linear>(40, 33, o));
    l2 = register_module("l2", std::make_shared<nn::Linear>(33, 33, o));
    l3 = register_module("l3", std::make_shared<nn::Linear>(33, 20, o));
    l4 = register_module("l4", std::make_shared<nn::Linear>(20, 20, o));
    l5 = register_module("l5", std::make_shared<nn::Linear>(20, 10, o));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = F::sigmoid((*l2)(F::tanh((*l1)(x))));
    return (*l5)(F::leaky_relu((*l4)(F::relu((*l3)(h))), 0.1));
  }
  std::shared_ptr<nn::Linear> l1, l2, l3, l4, l5;
};

// Adam steps of two models made from one seed on cuda, one eagerly and one as a static whole
// step: losses, parameters and gradients equal bit for bit. Returns the schedule dump.
template <typename Make>
std::string check_steps(Make make, const std::vector<Batch>& batches,
                        StaticOptions options = {.name = "small_gemm_step"}) {
  auto adam = [](nn::Module& m) { return optim::Adam(m.parameters(), {.lr = 1e-2}); };
  return check_whole_steps(seeded(5, kCuda, make), seeded(5, kCuda, make), batches, adam,
                           std::move(options))
      .schedule;
}

// The largest |a - b| over the elements, and the largest |b|, of two tensors of one floating dtype
// (host copies).
std::pair<double, double> difference(const Tensor& a, const Tensor& b) {
  const Tensor x = on_host(a), y = on_host(b);
  REQUIRE(x.shape() == y.shape());
  REQUIRE(x.dtype() == y.dtype());
  double diff = 0, size = 0;
  auto at = [](const Tensor& t, int64_t i) {
    return t.dtype() == DType::Float64 ? t.data<double>()[i]
                                       : static_cast<double>(t.data<float>()[i]);
  };
  for (int64_t i = 0; i < x.numel(); ++i) {
    diff = std::max(diff, std::abs(at(x, i) - at(y, i)));
    size = std::max(size, std::abs(at(y, i)));
  }
  return {diff, size};
}

}  // namespace

TEST_CASE("small products on cuda give the cpu's values and gradients, eagerly, at every layout",
          "[cuda][small_gemm]") {
  REQUIRE(cuda_small_gemm_enabled());
  // The products below, on the kernels each is meant to run (the rule is the shape's alone).
  REQUIRE(cuda_small_gemm(false, true, 33, 129, 70, 1) == SmallGemm::kDot);       // x w^T
  REQUIRE(cuda_small_gemm(false, false, 33, 70, 129, 1) == SmallGemm::kSerialK);  // g w
  REQUIRE(cuda_small_gemm(true, false, 129, 70, 33, 1) == SmallGemm::kSerialK);   // g^T x
  REQUIRE(cuda_small_gemm(false, false, 33, 129, 70, 1) == SmallGemm::kSerialK);  // x v
  REQUIRE(cuda_small_gemm(false, true, 33, 70, 129, 1) == SmallGemm::kDot);       // g v^T
  REQUIRE(cuda_small_gemm(true, false, 70, 129, 33, 1) == SmallGemm::kSerialK);   // x^T g
  REQUIRE(cuda_small_gemm(false, true, 300, 300, 700, 1) == SmallGemm::kNone);    // big big^T
  manual_seed(8);
  for (const DType dtype : {DType::Float32, DType::Float64}) {
    const double tol = dtype == DType::Float32 ? 1e-5 : 1e-12;
    // A linear (the dot layout) past the kernels' edges (33 rows, 129 columns) and its gradients:
    // x's (g w, serial k), w's (g^T x, serial k with a transposed), b's; a product with a
    // transposed b (the dot layout again: the gradient of a matmul's left operand); one too large
    // for the small kernels (cuBLAS).
    const Tensor x = randn({33, 70}, dtype), w = randn({129, 70}, dtype), b = randn({129}, dtype);
    const Tensor g = randn({33, 129}, dtype), v = randn({70, 129}, dtype);
    const Tensor big = randn({300, 700}, dtype);
    struct Run {
      Tensor y, gx, gw, gb, gv, big;
    };
    auto run = [&](Device d) {
      // Leaves of their own on d (to() the cpu is the tensor itself).
      auto leaf = [&](const Tensor& t) {
        Tensor l = t.to(d).detach();
        l.set_requires_grad();
        return l;
      };
      const Tensor xd = leaf(x), wd = leaf(w), bd = leaf(b), vd = leaf(v);
      Run r;
      r.y = F::linear(xd, wd, bd);
      (F::sum(r.y * g.to(d)) + F::sum(F::matmul(xd, vd) * g.to(d))).backward();
      r.gx = xd.grad();
      r.gw = wd.grad();
      r.gb = bd.grad();
      r.gv = vd.grad();
      r.big = F::matmul(big.to(d), F::transpose(big.to(d), 0, 1));
      return r;
    };
    const Run want = run(Device::cpu()), got = run(kCuda);
    auto check = [&](const char* what, const Tensor& a, const Tensor& e) {
      INFO(name(dtype) << ": " << what);
      const auto [diff, size] = difference(a, e);
      CHECK(diff <= tol * (1 + size));
    };
    check("x w^T + b", got.y, want.y);
    check("x's gradient", got.gx, want.gx);
    check("w's gradient", got.gw, want.gw);
    check("b's gradient", got.gb, want.gb);
    check("v's gradient", got.gv, want.gv);
    check("big big^T", got.big, want.big);
  }
}

TEST_CASE(
    "a CUDA plan folds activations and their gradients into small products, with eager's "
    "bits",
    "[cuda][static][small_gemm]") {
  StaticEnabled on;
  with_graphs_on_and_off([](bool) {
    for (const DType dtype : {DType::Float32, DType::Float64})
      for (const bool fold : {true, false}) {
        INFO(name(dtype) << ", fold " << fold);
        const StaticFoldActivations setting(fold);
        // The perceptron: two linears with their relu, two input-gradient products with
        // relu_grad, the first of which computes the loss's gradient too.
        const std::string mlp =
            check_steps([dtype] { return nn::mlp(64, 48, 10, {.dtype = dtype}); },
                        feature_batches(4, 16, 64, dtype, 3, kCuda));
        INFO(mlp);
        CHECK(count_of(mlp, R"(linear_act\s+\[linear and relu in one)") == (fold ? 2 : 0));
        CHECK(count_of(mlp, R"(matmul_act_grad\s+\[matmul and relu_grad in one)") ==
              (fold ? 1 : 0));
        CHECK(count_of(mlp, R"(loss_grad_matmul\s+\[matmul and relu_grad in one: recorded as )"
                            R"(steps \d+ and \d+; softmax_cross_entropy_grad and )"
                            R"(matmul_act_grad in one)") == (fold ? 1 : 0));
        CHECK(count_of(mlp, R"(\d+  relu\b)") == (fold ? 0 : 2));
        // Each linear's weight and bias gradients in one step, with their Adam updates.
        CHECK(count_of(mlp, R"(weight_grad_adam\s+\[[^\]]*matmul and sum in one: recorded as )"
                            R"(steps \d+ and \d+; weight_bias_grad and adam_update in one)") ==
              (fold ? 3 : 0));
        CHECK(count_of(mlp, R"(\d+  adam_update\b)") == (fold ? 0 : 1));
        // tanh, sigmoid and relu fold into their linears (leaky_relu's gradient reads its input);
        // the gradients of all four into the products computing their incoming gradients.
        const std::string acts = check_steps([dtype] { return std::make_shared<ActMlp>(dtype); },
                                             feature_batches(4, 8, 40, dtype, 4, kCuda));
        INFO(acts);
        for (const char* a : {"tanh", "sigmoid", "relu"})
          CHECK(count_of(acts, cat("linear and ", a, " in one")) == (fold ? 1 : 0));
        CHECK(count_of(acts, "linear and leaky_relu in one") == 0);
        for (const char* g : {"tanh_grad", "sigmoid_grad", "relu_grad", "leaky_relu_grad"})
          CHECK(count_of(acts, cat("matmul and ", g, " in one")) == (fold ? 1 : 0));
        CHECK(count_of(acts, "matmul and sum in one") == (fold ? 5 : 0));
        // gelu in both forms: its gradient (which reads gelu's input) folds, gelu does not.
        const std::string gelus = check_steps([dtype] { return std::make_shared<GeluMlp>(dtype); },
                                              feature_batches(4, 8, 24, dtype, 5, kCuda));
        INFO(gelus);
        CHECK(count_of(gelus, "matmul and gelu_grad in one") == (fold ? 2 : 0));
        CHECK(count_of(gelus, "and gelu in one") == 0);
      }
  });
}

TEST_CASE("a step over 3-D inputs folds the gradient of a matmul's left operand on cuda",
          "[cuda][static][small_gemm]") {
  // relu(x w1) w2 over x [4, 6, 40]: the product's rows are the 24 of x; relu's gradient comes
  // from g w2^T (the dot layout), and folds into it. Then a linear over the same rows, and its
  // tanh folded into it.
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  with_graphs_on_and_off([](bool) {
    for (const DType dtype : {DType::Float32, DType::Float64}) {
      INFO(name(dtype));
      manual_seed(12);
      const Tensor w1 = randn({40, 30}, dtype).to(kCuda).set_requires_grad();
      const Tensor w2 = randn({30, 20}, dtype).to(kCuda).set_requires_grad();
      const Tensor w3 = randn({10, 20}, dtype).to(kCuda).set_requires_grad();
      const Tensor b3 = randn({10}, dtype).to(kCuda).set_requires_grad();
      auto body = [&](const Tensor& x) {
        const Tensor h = F::matmul(F::relu(F::matmul(x, w1)), w2);
        const Tensor loss = F::sum(F::tanh(F::linear(h, w3, b3)));
        loss.backward();
        return std::vector<Tensor>{loss, w1.grad(), w2.grad(), w3.grad(), b3.grad()};
      };
      auto clear = [&] {
        for (Tensor p : {w1, w2, w3, b3}) p.set_grad(Tensor());
      };
      auto f = static_graph(body, {.name = "rows_3d"});
      for (int call = 0; call < 3; ++call) {
        const Tensor x = randn({4, 6, 40}, dtype).to(kCuda);
        clear();
        const std::vector<Tensor> want = body(x);
        clear();
        const std::vector<Tensor> got = f(x);
        for (size_t i = 0; i < want.size(); ++i) CHECK(bit_diff(got[i], want[i]) == "");
      }
      const std::string text = f.schedule_text();
      INFO(text);
      CHECK_THAT(text, Contains("matmul and relu_grad in one"));
      CHECK_THAT(text, Contains("linear and tanh in one"));
    }
  });
}

// [loss_fold]: 256 static functions, too many for a run under the sanitizers (on-device.sh leaves
// it out of theirs; the bad-label case below runs the same kernels there).
TEST_CASE("a CUDA plan's loss gradient is computed by the product reading it, with eager's bits",
          "[cuda][static][small_gemm][loss_fold]") {
  with_graphs_on_and_off([](bool) { check_loss_grad_folds(kCuda); });
}

TEST_CASE("a bad label in a replayed loss gradient fold on cuda raises the Error at the next wait",
          "[cuda][static][small_gemm]") {
  with_graphs_on_and_off([](bool) { check_loss_grad_fold_bad_label(kCuda); });
}

TEST_CASE("verify mode checks folded small products on cuda against eager's steps",
          "[cuda][static][small_gemm]") {
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  const std::string text = check_steps([] { return std::make_shared<ActMlp>(DType::Float32); },
                                       feature_batches(3, 8, 40, DType::Float32, 6, kCuda),
                                       {.name = "verified_small_gemm", .verify_every = 1});
  CHECK_THAT(text, Contains("linear and tanh in one"));
  CHECK_THAT(text, Contains("matmul and sigmoid_grad in one"));
  CHECK_THAT(text, Contains("matmul and sum in one"));
  CHECK_THAT(text, Contains("softmax_cross_entropy_grad and matmul_act_grad in one"));
  CHECK_THAT(text, Contains("weight_bias_grad and adam_update in one"));
}

// [update_fold]: 64 static functions, left out of the sanitizers' runs as [loss_fold] (the MLP and
// verify-mode cases above run the same kernel there).
TEST_CASE("a CUDA plan's Adam updates run in the kernels of their gradients, with eager's bits",
          "[cuda][static][small_gemm][update_fold]") {
  with_graphs_on_and_off([](bool) { check_update_folds(kCuda); });
}

namespace {

// sum(tanh(x w^T + b)) and its gradients over rows k of x and outputs m: the weight gradient
// gy^T x runs on the small kernel for k <= 512, whose blocks past the product's sum gy's columns
// in the order of CUDA's column sum: split over 1 thread row (k < 32), 2 (32), 4 (64, 100), 8
// (128, 200), 16 (256) and 32 (512) thread rows; one output per thread, or four (130 x 200). A
// sum over one row (k = 1) is a copy, over one column (m = 1) a row reduction, and k = 513 is
// cuBLAS's: those stay apart.
struct BiasCase {
  int64_t k, m, n;
  bool folds;
};
constexpr BiasCase kBiasCases[] = {{2, 5, 7, true},    {31, 33, 20, true},    {32, 10, 100, true},
                                   {64, 2, 3, true},   {100, 130, 200, true}, {128, 17, 20, true},
                                   {200, 6, 40, true}, {256, 9, 5, true},     {512, 12, 9, true},
                                   {1, 16, 24, false}, {40, 1, 24, false},    {513, 8, 8, false}};

// Each case in float32 and float64: a static function's replays (verify mode every second one
// where `verify`) give eager's bits, and its plan folds the bias gradient where the case says.
void check_bias_grad_folds(bool verify) {
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  for (const DType dtype : {DType::Float32, DType::Float64})
    for (const BiasCase& c : kBiasCases) {
      INFO(name(dtype) << ", k " << c.k << ", m " << c.m << ", n " << c.n);
      REQUIRE(
          cuda_small_gemm_sums_columns(GemmShape{
              .trans_a = true, .m = c.m, .n = c.n, .k = c.k, .lda = c.m, .ldb = c.n, .ldc = c.n}) ==
          c.folds);
      manual_seed(14);
      Tensor w = randn({c.m, c.n}, dtype).to(kCuda).set_requires_grad();
      Tensor b = randn({c.m}, dtype).to(kCuda).set_requires_grad();
      auto body = [&](const Tensor& x) {
        const Tensor loss = F::sum(F::tanh(F::linear(x, w, b)));
        loss.backward();
        return std::vector<Tensor>{loss, w.grad(), b.grad()};
      };
      auto f = static_graph(body, {.name = "bias_grad", .verify_every = verify ? 2 : 0});
      for (int call = 0; call < 4; ++call) {
        const Tensor x = randn({c.k, c.n}, dtype).to(kCuda);
        w.set_grad(Tensor());
        b.set_grad(Tensor());
        const std::vector<Tensor> want = body(x);
        w.set_grad(Tensor());
        b.set_grad(Tensor());
        const std::vector<Tensor> got = f(x);
        for (size_t i = 0; i < want.size(); ++i) CHECK(bit_diff(got[i], want[i]) == "");
      }
      CHECK((f.stats().verifications > 0) == verify);
      const std::string text = f.schedule_text();
      INFO(text);
      CHECK(count_of(text, R"(weight_bias_grad\s+\[matmul and sum in one)") == c.folds);
    }
}

}  // namespace

TEST_CASE(
    "a linear's bias gradient is summed by its weight gradient's kernel on cuda, with "
    "eager's bits",
    "[cuda][static][small_gemm]") {
  with_graphs_on_and_off([](bool) { check_bias_grad_folds(false); });
}

// Verify mode replays on the stream, never as a graph: apart from the graphs' check.
TEST_CASE("a linear's folded bias gradient passes verify mode on cuda",
          "[cuda][static][small_gemm]") {
  check_bias_grad_folds(true);
}

TEST_CASE("a folded relu on cuda passes NaN; gelu and leaky_relu fold without a backward",
          "[cuda][static][small_gemm]") {
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  manual_seed(9);
  const Tensor w = randn({40, 7}).to(kCuda), b = randn({40}).to(kCuda);
  auto relu = [&](const Tensor& x) { return F::relu(F::linear(x, w, b)); };
  auto gelu = [&](const Tensor& x) {
    return F::gelu(F::linear(x, w, b), "tanh") + F::gelu(F::linear(x, w, b));
  };
  auto leaky = [&](const Tensor& x) { return F::leaky_relu(F::linear(x, w, b), 0.2); };
  auto f = static_graph(relu, {.name = "relu_linear"});
  auto g = static_graph(gelu, {.name = "gelu_linear"});
  auto l = static_graph(leaky, {.name = "leaky_linear"});
  NoGradGuard no_grad;
  for (int call = 0; call < 3; ++call) {
    Tensor host = randn({33, 7}) * 3.0;
    host.data<float>()[7 * 5 + 2] = std::numeric_limits<float>::quiet_NaN();  // row 5
    const Tensor x = host.to(kCuda);
    const Tensor y = f(x);
    CHECK(bit_diff(y, relu(x)) == "");
    CHECK(bit_diff(g(x), gelu(x)) == "");
    CHECK(bit_diff(l(x), leaky(x)) == "");
    const Tensor row = y.to(Device::cpu());
    for (int64_t j = 0; j < 40; ++j) CHECK(std::isnan(row.data<float>()[5 * 40 + j]));
  }
  CHECK_THAT(f.schedule_text(), Contains("linear and relu in one"));
  CHECK(count_of(g.schedule_text(), "linear and gelu in one") == 2);  // tanh and erf forms
  CHECK_THAT(l.schedule_text(), Contains("linear and leaky_relu in one"));
}

TEST_CASE("a product too large for the small kernels keeps its activation apart on cuda",
          "[cuda][static][small_gemm]") {
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  // 256 x 1024 x 64 = 2^24 multiply-adds: cuBLAS's.
  REQUIRE(cuda_small_gemm(false, true, 256, 1024, 64, 1) == SmallGemm::kNone);
  manual_seed(10);
  const Tensor w = randn({1024, 64}).to(kCuda), b = randn({1024}).to(kCuda);
  auto body = [&](const Tensor& x) { return F::relu(F::linear(x, w, b)); };
  auto f = static_graph(body, {.name = "large_linear"});
  NoGradGuard no_grad;
  for (int call = 0; call < 3; ++call) {
    const Tensor x = randn({256, 64}).to(kCuda);
    CHECK(bit_diff(f(x), body(x)) == "");
  }
  const std::string text = f.schedule_text();
  INFO(text);
  CHECK_THAT(text, !Contains("linear_act"));
  CHECK(count_of(text, R"(\d+  relu\b)") == 1);
}
