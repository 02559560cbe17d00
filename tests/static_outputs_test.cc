// What a caller does with a static call's results before its backward: writes one of them, or a
// captured tensor, in place; back-propagates through only some of them; gets one tensor twice,
// or an argument back. A replay must answer as eager does: the same Error, the same bits.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

Tensor leaf(std::initializer_list<double> values) {
  Tensor t = tensor(values, {static_cast<int64_t>(values.size())});
  t.set_requires_grad(true);
  return t;
}

}  // namespace

TEST_CASE("a result written in place before the backward is an Error at every call", "[static]") {
  StaticEnabled on;
  auto body = [](const Tensor& x) { return F::exp(x); };  // exp's backward reads its result
  auto f = static_graph(body, {.name = "saved_result"});
  auto clean_call = [&f] {
    Tensor x = leaf({0.0, 1.0});
    F::sum(f(x)).backward();
    CHECK(bit_diff(x.grad(), F::exp(tensor({0.0, 1.0}, {2}))) == "");
  };
  clean_call();  // traces, and records the backward
  for (int call = 1; call < 3; ++call) {
    CAPTURE(call);
    Tensor x = leaf({0.0, 1.0});
    Tensor y = f(x);
    {
      NoGradGuard no_grad;
      add_(y, ones({2}));
    }
    CHECK_THROWS_WITH(F::sum(y).backward(),
                      Contains("backward of a static call: its result [2], which the backward "
                               "reads, was modified in place (version 0 -> 1)"));
    CHECK_FALSE(x.grad().defined());
  }
  clean_call();
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().hits == 3);
}

TEST_CASE("a captured tensor written in place before the backward is an Error at every call",
          "[static]") {
  StaticEnabled on;
  Tensor w = tensor({2.0, 3.0}, {2});
  auto body = [&w](const Tensor& x) { return x * w; };  // mul's backward reads w
  auto f = static_graph(body, {.name = "saved_captured"});
  Tensor x0 = leaf({1.0, 1.0});
  F::sum(f(x0)).backward();  // traces, and records the backward
  for (int call = 1; call < 3; ++call) {
    CAPTURE(call);
    Tensor x = leaf({1.0, 1.0});
    Tensor y = f(x);
    {
      NoGradGuard no_grad;
      add_(w, ones({2}));
    }
    CHECK_THROWS_WITH(F::sum(y).backward(),
                      Contains("backward of a static call: a tensor [2] it saved was modified in "
                               "place"));
    CHECK_FALSE(x.grad().defined());
  }
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().hits == 2);
}
