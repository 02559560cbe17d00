// What a caller does with a static call's results before its backward: writes one of them, or a
// captured tensor, in place; back-propagates through only some of them; gets one tensor twice,
// or an argument back. A replay must answer as eager does: the same Error, the same bits.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
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

// Twice: calls `f` on a leaf of `values`, writes in place what `write` picks (given the
// result), and checks that the backward raises `message` and delivers no gradient.
template <typename Fn>
void written_before_backward(Fn& f, std::initializer_list<double> values,
                             const std::function<void(const Tensor&)>& write,
                             const std::string& message) {
  for (int call = 0; call < 2; ++call) {
    CAPTURE(call);
    Tensor x = leaf(values);
    Tensor y = f(x);
    {
      NoGradGuard no_grad;
      write(y);
    }
    CHECK_THROWS_WITH(F::sum(y).backward(), Contains(message));
    CHECK_FALSE(x.grad().defined());
  }
}

// Calls a static function of two results beside its eager twin three times, back-propagates
// loss(call, a, b) through each, and checks the gradients agree bit for bit; returns its stats.
StaticStats two_results_twin(const char* name,
                             const std::function<Tensor(int, const Tensor&, const Tensor&)>& loss) {
  StaticEnabled on;
  auto body = [](const Tensor& x) { return std::make_tuple(x * 2.0, x * x); };
  auto f = static_graph(body, {.name = name});
  for (int call = 0; call < 3; ++call) {
    CAPTURE(call);
    Tensor xs = leaf({1.0, 3.0}), xe = leaf({1.0, 3.0});
    auto [a, b] = f(xs);
    auto [ea, eb] = body(xe);
    loss(call, a, b).backward();
    loss(call, ea, eb).backward();
    CHECK(bit_diff(xs.grad(), xe.grad()) == "");
  }
  return f.stats();
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
  written_before_backward(
      f, {0.0, 1.0}, [](const Tensor& y) { add_(y, ones({2})); },
      "backward of a static call: its result [2], which the backward reads, "
      "was modified in place (version 0 -> 1)");
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
  written_before_backward(
      f, {1.0, 1.0}, [&w](const Tensor&) { add_(w, ones({2})); },
      "backward of a static call: a tensor [2] it saved was modified in place");
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().hits == 2);
}

TEST_CASE("a result that gets no gradient is not back-propagated, as eagerly", "[static]") {
  StaticEnabled on;
  // exp(100) is inf: a zero gradient sent back through it would give 0 * inf = NaN; and a
  // gradient of -0 would come back +0 after adding a zero from the other result.
  auto body = [](const Tensor& x) { return std::make_tuple(x * 2.0, F::exp(x)); };
  auto f = static_graph(body, {.name = "partial"});
  for (double scale : {1.0, -0.0}) {
    for (int call = 0; call < 3; ++call) {
      CAPTURE(scale, call);
      Tensor xs = leaf({1.0, 100.0}), xe = leaf({1.0, 100.0});
      auto [a, b] = f(xs);
      auto [ea, eb] = body(xe);
      F::sum(a * scale).backward();
      F::sum(ea * scale).backward();
      CHECK(bit_diff(xs.grad(), xe.grad()) == "");
    }
  }
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().hits == 5);
}

TEST_CASE("a replayed backward takes zeros for a result the first backward got a gradient for",
          "[static]") {
  // The first backward gets both results' gradients, later ones b's alone.
  const StaticStats s =
      two_results_twin("both_then_one", [](int call, const Tensor& a, const Tensor& b) {
        return call == 0 ? F::sum(a + b) : F::sum(b);
      });
  CHECK(s.traces == 1);
}

TEST_CASE("results whose first backward got one gradient tensor take two at later calls",
          "[static]") {
  // First add's backward hands its one gradient to both results; then a gets 3 times b's.
  const StaticStats s =
      two_results_twin("one_gradient_tensor", [](int call, const Tensor& a, const Tensor& b) {
        return call == 0 ? F::sum(a + b) : F::sum(a * 3.0 + b);
      });
  CHECK(s.traces == 1);
}

TEST_CASE("a replayed backward that gets a gradient the first did not is an Error, then traces",
          "[static]") {
  StaticEnabled on;
  auto body = [](const Tensor& x) { return std::make_tuple(x * 2.0, x * x); };
  auto f = static_graph(body, {.name = "one_then_both"});
  {
    Tensor x = leaf({1.0, 3.0});
    auto [a, b] = f(x);
    F::sum(a).backward();  // the first backward gets a's gradient only
  }
  Tensor x = leaf({1.0, 3.0});
  auto [a, b] = f(x);
  CHECK(f.stats().hits == 1);
  CHECK_THROWS_WITH(F::sum(a + b).backward(),
                    Contains("backward of a static call: its result 1 [2] got a gradient, but the "
                             "first backward of its trace got none for it"));
  // The signature traces again, and its new first backward gets both.
  Tensor xs = leaf({1.0, 3.0}), xe = leaf({1.0, 3.0});
  auto [s1, s2] = f(xs);
  auto [e1, e2] = body(xe);
  F::sum(s1 + s2).backward();
  F::sum(e1 + e2).backward();
  CHECK(bit_diff(xs.grad(), xe.grad()) == "");
  CHECK(f.stats().traces == 2);
  REQUIRE(f.stats().traces_history.size() == 2);
  CHECK_THAT(f.stats().traces_history[1].reason,
             Contains("a backward of the previous trace's replays got a gradient for a result"));
}

TEST_CASE("one tensor returned twice, or an argument returned, is that tensor, as eagerly",
          "[static]") {
  StaticEnabled on;
  manual_seed(2);
  auto twice = [](const Tensor& a) {
    Tensor y = a * 1.7;
    return std::make_tuple(y, y);
  };
  auto arg = [](const Tensor& a) { return std::make_tuple(a, a * 1.7); };
  auto f = static_graph(twice, {.name = "twice"});
  auto g = static_graph(arg, {.name = "returns_argument"});
  for (int call = 0; call < 8; ++call) {
    CAPTURE(call);
    Tensor xs = randn({16});
    xs.set_requires_grad(true);
    Tensor xe = clone(xs).detach();
    xe.set_requires_grad(true);
    auto [r1, r2] = f(xs);
    auto [e1, e2] = twice(xe);
    CHECK(r1.is_same(r2));
    // Contributions arrive at y in an order that rounds differently when summed per result.
    (F::sum(r1 * 0.3) + F::sum(r2 * r2)).backward();
    (F::sum(e1 * 0.3) + F::sum(e2 * e2)).backward();
    CHECK(bit_diff(xs.grad(), xe.grad()) == "");

    Tensor ws = randn({16});
    ws.set_requires_grad(true);
    Tensor we = clone(ws).detach();
    we.set_requires_grad(true);
    Tensor as = ws * 1.3, ae = we * 1.3;  // an argument with a producer
    auto [s0, s1] = g(as);
    auto [q0, q1] = arg(ae);
    CHECK(s0.is_same(as));
    (F::sum(s0 * s0) + F::sum(s1 * 0.3) + F::sum(as * 0.7)).backward();
    (F::sum(q0 * q0) + F::sum(q1 * 0.3) + F::sum(ae * 0.7)).backward();
    CHECK(bit_diff(ws.grad(), we.grad()) == "");
  }
  CHECK(f.stats().traces == 1);
  CHECK(g.stats().traces == 1);
  CHECK(f.stats().hits == 7);
  CHECK(g.stats().hits == 7);
}

TEST_CASE("a parameter or a captured leaf the function returns comes back as that tensor",
          "[static]") {
  // As eagerly: the result is the leaf itself, so its .grad is the leaf's (an argument returned
  // comes back as the argument the same way).
  StaticEnabled on;
  manual_seed(43);
  auto lin = std::make_shared<nn::Linear>(3, 2);
  Tensor c = randn({2}).set_requires_grad();
  auto f = static_graph(
      [&](const Tensor& x) { return std::make_tuple(F::sum((*lin)(x)*c), lin->weight, c); },
      {.name = "returns_leaves", .modules = {lin}});
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    lin->zero_grad(true);
    c.set_grad(Tensor());
    auto [loss, w, leaf] = f(randn({4, 3}));
    CHECK(w.is_same(lin->weight));
    CHECK(leaf.is_same(c));
    loss.backward();
    REQUIRE(lin->weight.grad().defined());
    CHECK(w.grad().is_same(lin->weight.grad()));
    CHECK(leaf.grad().is_same(c.grad()));
  }
  CHECK(f.stats().hits == 2);
}

TEST_CASE("a function that returns its argument alone replays it", "[static]") {
  StaticEnabled on;
  auto identity = [](const Tensor& a) { return a; };
  auto f = static_graph(identity, {.name = "identity"});
  for (int call = 0; call < 3; ++call) {
    Tensor x = leaf({1.0, 2.0});
    Tensor y = f(x);
    CHECK(y.is_same(x));
    F::sum(y * 3.0).backward();
    CHECK(bit_diff(x.grad(), full({2}, 3.0)) == "");
  }
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().hits == 2);
}

TEST_CASE("verify mode checks functions that return an argument or one tensor twice", "[static]") {
  StaticEnabled on;
  auto arg = [](const Tensor& x) { return std::make_tuple(x, x * 1.7); };
  auto twice = [](const Tensor& x) {
    Tensor y = x * 1.7;
    return std::make_tuple(y, y, F::exp(x));
  };
  auto f = static_graph(arg, {.name = "verified_argument", .verify_every = 1});
  auto g = static_graph(twice, {.name = "verified_twice", .verify_every = 1});
  for (int call = 0; call < 3; ++call) {
    CAPTURE(call);
    Tensor xs = leaf({1.0, 2.0}), xe = leaf({1.0, 2.0});
    F::sum(std::get<1>(f(xs))).backward();
    F::sum(std::get<1>(arg(xe))).backward();
    CHECK(bit_diff(xs.grad(), xe.grad()) == "");
    Tensor ys = leaf({1.0, 2.0}), ye = leaf({1.0, 2.0});
    auto [a, b, c] = g(ys);
    auto [ea, eb, ec] = twice(ye);
    F::sum(a * 0.5 + b + c).backward();
    F::sum(ea * 0.5 + eb + ec).backward();
    CHECK(bit_diff(ys.grad(), ye.grad()) == "");
  }
  CHECK(f.stats().verifications == 2);
  CHECK(g.stats().verifications == 2);
}

TEST_CASE("traces whose first backwards got gradients for different results form no family",
          "[static][dynamic]") {
  StaticEnabled on;
  auto body = [](const Tensor& x) { return std::make_tuple(x * 2.0, x * x); };
  auto f = static_graph(body, {.name = "masks"});
  // Size 4's first backward gets both results' gradients, size 5's a's alone: no family, and
  // the batch does not stay static for it; sizes 6 and 7, like 5, make one.
  for (int64_t n : {4, 5, 6, 7, 8}) {
    CAPTURE(n);
    Tensor xs = rand({n}), xe = clone(xs);
    xs.set_requires_grad(true);
    xe.set_requires_grad(true);
    auto [a, b] = f(xs);
    auto [ea, eb] = body(xe);
    (n == 4 ? F::sum(a + b) : F::sum(a)).backward();
    (n == 4 ? F::sum(ea + eb) : F::sum(ea)).backward();
    CHECK(bit_diff(xs.grad(), xe.grad()) == "");
  }
  const StaticStats s = f.stats();
  CHECK(s.static_dims.empty());
  CHECK(s.dynamic_events == 1);
  CHECK(s.traces == 3);
}

TEST_CASE("a stale trace takes the families made from it along", "[static][dynamic]") {
  StaticEnabled on;
  auto body = [](const Tensor& x) { return std::make_tuple(x * 2.0, x * x); };
  auto f = static_graph(body, {.name = "stale_family"});
  auto call = [&](int64_t n, bool both) {
    Tensor x = rand({n});
    x.set_requires_grad(true);
    auto [a, b] = f(x);
    (both ? F::sum(a + b) : F::sum(a)).backward();
  };
  call(4, false);
  call(5, false);  // the batch is dynamic from here
  call(4, false);
  CHECK_THROWS_WITH(call(4, true), Contains("got a gradient, but the first backward"));
  // Traced again: no second Error, and the batch becomes dynamic again with the new backward.
  CHECK_NOTHROW(call(4, true));
  for (int64_t n : {6, 7, 8}) CHECK_NOTHROW(call(n, true));
  const StaticStats s = f.stats();
  CHECK(s.static_dims.empty());
  CHECK(s.traces == 4);
}
