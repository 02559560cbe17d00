// Outer products added into a gradient (schedule/rewrites.cc, fold_accumulations): a weight used
// at several batch-1 steps gets its gradient as a sum of outer products (k = 1); each one after
// the first is added into .grad by one matmul_accumulate step instead of a matmul and an add_.
// Whole steps replay eager's bits in float32 and float64, fold on and off, at one and two
// threads, with zeros and -0.0 among the inputs, and in verify mode; the dump marks each fold.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <regex>
#include <string>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;

namespace {

constexpr int64_t kSteps = 3;

// w [6,5] applied to kSteps rows of xs one at a time (its gradient: outer products with a
// transposed left factor, as a linear's weight gradient at batch 1), and a [4,5] times two
// columns u and v (its gradient: outer products with a transposed right factor).
class OuterNet : public nn::Module {
 public:
  explicit OuterNet(DType dtype)
      : w(randn({6, 5}, dtype)),
        a(randn({4, 5}, dtype)),
        u(randn({5, 1}, dtype)),
        v(randn({5, 1}, dtype)),
        q(randn({4, 1}, dtype)),
        r(randn({1, 6}, dtype)) {
    register_parameter("w", &w);
    register_parameter("a", &a);
  }
  Tensor forward(const Tensor& xs) override {
    Tensor loss = F::add(F::sum(F::mul(F::matmul(a, u), q)), F::sum(F::mul(F::matmul(a, v), q)));
    for (int64_t t = 0; t < kSteps; ++t)
      loss = F::add(loss, F::sum(F::mul(F::linear(F::slice(xs, 0, t, t + 1), w), r)));
    return loss;
  }
  Tensor w, a, u, v, q, r;
};

std::shared_ptr<OuterNet> make_net(DType dtype) {
  manual_seed(8);
  return std::make_shared<OuterNet>(dtype);
}

// Inputs for call i: random values; on odd calls +0 and -0 (random signs) in columns 0, 2, 4.
Tensor inputs(int i, DType dtype) {
  const Tensor xs = randn({kSteps, 5}, dtype);
  if (i % 2 == 0) return xs;
  return F::mul(xs, tensor({0.0, 1.0, -0.0, 1.0, 0.0}, {1, 5}, dtype));
}

// Runs `calls` steps (zero_grad, forward, backward) eagerly and as one static function; losses
// and gradients equal bit for bit after each. Returns the schedule dump.
std::string check_steps(DType dtype, int calls, int verify_every) {
  auto eager = make_net(dtype), twin = make_net(dtype);
  auto step = [](OuterNet& m, const Tensor& xs) {
    m.zero_grad();
    Tensor loss = m(xs);
    loss.backward();
    return loss;
  };
  auto fn = static_graph([&](const Tensor& xs) { return step(*twin, xs); },
                         {.name = "outer", .verify_every = verify_every, .modules = {twin}});
  manual_seed(21);
  for (int i = 0; i < calls; ++i) {
    INFO("call " << i);
    const Tensor xs = inputs(i, dtype);
    CHECK(bit_diff(step(*eager, xs), fn(xs)) == "");
    check_same_parameters(*eager, *twin, cat("call ", i));
  }
  CHECK(fn.stats().traces == 1);
  if (verify_every > 0) CHECK(fn.stats().verifications == calls - 1);
  return fn.schedule_text();
}

}  // namespace

TEST_CASE("outer products added into a gradient are one step each, with eager's bits",
          "[static][fold]") {
  StaticEnabled on;
  for (const DType dtype : {DType::Float32, DType::Float64})
    for (const bool fold : {true, false})
      for (const int threads : {1, 2}) {
        INFO(name(dtype) << ", fold " << fold << ", " << threads << " threads");
        const StaticFoldActivations setting(fold);
        const ThreadCount t(threads);
        const std::string text = check_steps(dtype, 4, 0);
        INFO(text);
        // w: kSteps outer products, a: two; all but the first of each added into .grad.
        CHECK(count_of(text, R"(matmul_accumulate\s+\[)") == (fold ? kSteps - 1 + 1 : 0));
        CHECK(count_of(text, "matmul and add_ in one") == (fold ? kSteps : 0));
      }
}

TEST_CASE("verify mode compares each accumulated gradient with eager's add_", "[static][fold]") {
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  const std::string text = check_steps(DType::Float32, 3, 1);
  CHECK(count_of(text, "matmul and add_ in one") == kSteps);
}
