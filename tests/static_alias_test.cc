// static_graph with aliased arguments: one tensor passed as two arguments, and views of one
// storage, give eager's results and gradients on the recorded call and on replays; so does a leaf
// the function captures and is also given, and a captured tensor whose requires_grad flips. (The
// randomized programs of static_random_test.cc alias arguments too.)
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;

namespace {

Tensor h(const Tensor& u, const Tensor& v) {
  return F::sum(u * F::tanh(v));
}

Tensor leaf(const Tensor& values) {
  Tensor t = values.detach();
  t.set_requires_grad(true);
  return t;
}

// z.grad after h(z, z).backward() run eagerly.
Tensor eager_grad(const Tensor& values) {
  Tensor z = leaf(values);
  h(z, z).backward();
  return z.grad();
}

// A view of `base`'s storage: `shape` starting `offset` elements in.
Tensor view_of(const Tensor& base, int64_t offset, Shape shape) {
  return Tensor(make_intrusive<TensorImpl>(base.impl()->storage, base.impl()->offset + offset,
                                           std::move(shape), base.dtype()));
}

}  // namespace

TEST_CASE("one tensor passed as two arguments gets eager's gradient on the recorded backward",
          "[static][alias]") {
  manual_seed(21);
  auto fn = static_graph(h, {.name = "h"});
  for (int call = 0; call < 3; ++call) {  // trace (recorded backward), then replays
    INFO("call " << call);
    const Tensor values = randn({5});
    Tensor z = leaf(values);
    const Tensor y = fn(z, z);
    CHECK(bit_diff(y, h(values, values)) == "");
    y.backward();
    CHECK(bit_diff(z.grad(), eager_grad(values)) == "");
  }
  const StaticStats s = fn.stats();
  CHECK(s.traces == 1);
  CHECK(s.hits == 2);
  REQUIRE(s.cache.size() == 1);
  CHECK_THAT(s.cache[0].signature, Catch::Matchers::Contains("same tensor as argument 0"));
}

TEST_CASE(
    "one tensor passed twice after a trace with two tensors retraces and gets eager's "
    "gradient",
    "[static][alias]") {
  manual_seed(22);
  auto fn = static_graph(h, {.name = "h"});
  {
    Tensor u = leaf(randn({5})), v = leaf(randn({5}));
    fn(u, v).backward();
    Tensor u2 = leaf(randn({5})), v2 = leaf(randn({5}));
    fn(u2, v2).backward();  // planned and replayed with distinct tensors
  }
  const Tensor values = randn({5});
  Tensor z = leaf(values);
  fn(z, z).backward();
  CHECK(bit_diff(z.grad(), eager_grad(values)) == "");
  const StaticStats s = fn.stats();
  CHECK(s.traces == 2);
  REQUIRE(s.traces_history.size() == 2);
  CHECK_THAT(s.traces_history[1].reason, Catch::Matchers::Contains("aliasing changed"));
}

TEST_CASE("one non-leaf tensor passed twice sends its producer eager's gradient",
          "[static][alias]") {
  manual_seed(23);
  auto fn = static_graph(h, {.name = "h"});
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    const Tensor values = randn({4});
    Tensor x = leaf(values), xe = leaf(values);
    const Tensor z = x * 3.0, ze = xe * 3.0;
    fn(z, z).backward();
    h(ze, ze).backward();
    CHECK(bit_diff(x.grad(), xe.grad()) == "");
  }
  CHECK(fn.stats().traces == 1);
}

TEST_CASE("overlapping views of one storage as arguments give eager's results and gradients",
          "[static][alias]") {
  // u and v are leaves of their own over one storage, v starting 2 elements into u.
  manual_seed(24);
  auto fn = static_graph(h, {.name = "h"});
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    const Tensor values = randn({8});
    Tensor base = values * 1.0;
    Tensor u = view_of(base, 0, Shape{6}), v = view_of(base, 2, Shape{6});
    u.set_requires_grad(true);
    v.set_requires_grad(true);
    Tensor ebase = values * 1.0;
    Tensor ue = view_of(ebase, 0, Shape{6}), ve = view_of(ebase, 2, Shape{6});
    ue.set_requires_grad(true);
    ve.set_requires_grad(true);
    const Tensor y = fn(u, v), ye = h(ue, ve);
    CHECK(bit_diff(y, ye) == "");
    y.backward();
    ye.backward();
    CHECK(bit_diff(u.grad(), ue.grad()) == "");
    CHECK(bit_diff(v.grad(), ve.grad()) == "");
  }
  const StaticStats s = fn.stats();
  CHECK(s.traces == 1);
  REQUIRE(s.cache.size() == 1);
  CHECK_THAT(s.cache[0].signature,
             Catch::Matchers::Contains("shares storage with argument 0 at byte offset 8"));
}

TEST_CASE("a replay never binds one argument's buffer for another of a different alias pattern",
          "[static][alias]") {
  // One storage at one offset with two shapes, then two storages: each pattern its own entry.
  manual_seed(25);
  auto fn = static_graph([](const Tensor& a, const Tensor& b) { return F::tanh(b) + a; },
                         {.name = "pattern"});
  NoGradGuard no_grad;
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call);
    const Tensor base = randn({12});
    const bool shared = call % 2 == 0;
    const Tensor a = shared ? view_of(base, 0, Shape{1}) : randn({1});
    const Tensor b = view_of(base, 0, Shape{3, 4});
    CHECK(bit_diff(fn(a, b), F::tanh(b) + a) == "");
  }
  CHECK(fn.stats().traces == 2);
}

TEST_CASE("a tensor the function captures and is also given as an argument is never taken for it",
          "[static][alias]") {
  // The trace sees one storage through two tensors: the argument, and the captured tensor (here
  // the same tensor, and a view of it made before the call). A replay would read the next call's
  // argument where the function reads the captured tensor.
  manual_seed(26);
  const Tensor c = randn({2, 3});
  const Tensor c_view = Tensor::view_of(c, Shape{3, 2});
  auto body = [&](const Tensor& x) { return F::tanh(x) * c + F::sum(c_view); };
  SECTION("the captured tensor itself") {
    auto fn = static_graph([&](const Tensor& x) { return F::tanh(x) * c; }, {.name = "captured"});
    NoGradGuard no_grad;
    for (int call = 0; call < 4; ++call) {
      INFO("call " << call);
      const Tensor x = call == 0 ? c : randn({2, 3});
      CHECK(bit_diff(fn(x), F::tanh(x) * c) == "");
    }
    const StaticStats s = fn.stats();
    CHECK(s.traces == 2);
    CHECK(s.hits == 2);
    REQUIRE(!s.traces_history.empty());
    CHECK_THAT(s.traces_history.back().reason,
               Catch::Matchers::Contains("argument 0 [2,3] shares storage with a tensor [2,3] "
                                         "the function uses, which the trace cannot tell from it"));
  }
  SECTION("a view of it made before the call, with gradients") {
    auto fn = static_graph(body, {.name = "captured_view"});
    for (int call = 0; call < 4; ++call) {
      INFO("call " << call);
      Tensor x = (call == 0 ? c : randn({2, 3})).detach();
      x.set_requires_grad(true);
      Tensor xe = x.detach();
      xe.set_requires_grad(true);
      const Tensor y = fn(x), ye = body(xe);
      CHECK(bit_diff(y, ye) == "");
      F::sum(y).backward();
      F::sum(ye).backward();
      CHECK(bit_diff(x.grad(), xe.grad()) == "");
    }
    CHECK(fn.stats().traces == 2);
    CHECK(fn.stats().hits == 2);
  }
}

TEST_CASE("a leaf the function captures and is also given gets both gradients, as eagerly",
          "[static][alias]") {
  // sum(x @ w) at x = w: the argument's path and the captured tensor's both reach w.grad, set by
  // the first and added to by the second, in eager's order (with .grad undefined, and defined).
  StaticEnabled on;
  manual_seed(27);
  const Tensor values = randn({3, 3}, DType::Float64);
  Tensor w = leaf(values), we = leaf(values);
  auto fn = static_graph([&w](const Tensor& x) { return F::sum(F::matmul(x, w)); },
                         {.name = "captured_leaf"});
  int hook_calls = 0, eager_hook_calls = 0;
  autograd::add_post_accumulate_grad_hook(w, [&](const Tensor&) { ++hook_calls; });
  autograd::add_post_accumulate_grad_hook(we, [&](const Tensor&) { ++eager_hook_calls; });
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call);
    if (call == 2) {
      w.set_grad(Tensor());
      we.set_grad(Tensor());
    }
    fn(w).backward();
    F::sum(F::matmul(we, we)).backward();
    CHECK(bit_diff(w.grad(), we.grad()) == "");
    CHECK(hook_calls == eager_hook_calls);  // each delivery runs the leaf's hooks
  }
  CHECK(eager_hook_calls == 8);
  // A module's parameter fed to its own module.
  auto make = [] {
    manual_seed(28);
    return std::make_shared<nn::Linear>(3, 3, nn::LinearOptions{.dtype = DType::Float64});
  };
  auto lin = make(), eager = make();
  auto g = static_graph([&](const Tensor& x) { return F::sum((*lin)(x)); },
                        {.name = "own_weight", .modules = {lin}});
  for (int call = 0; call < 3; ++call) {
    INFO("module call " << call);
    lin->zero_grad();
    eager->zero_grad();
    g(lin->weight).backward();
    F::sum((*eager)(eager->weight)).backward();
    CHECK(bit_diff(lin->weight.grad(), eager->weight.grad()) == "");
    CHECK(bit_diff(lin->bias.grad(), eager->bias.grad()) == "");
  }
}

TEST_CASE("a captured tensor whose requires_grad flips traces again and gets eager's gradient",
          "[static][alias]") {
  StaticEnabled on;
  for (const bool first : {false, true}) {
    INFO("traced with requires_grad " << first);
    Tensor w = tensor({1, 2, 3, 4}, {2, 2}, DType::Float64);
    w.set_requires_grad(first);
    auto fn = static_graph([&w](const Tensor& x) { return F::sum(F::matmul(x, w)); },
                           {.name = "flipped"});
    const Tensor x = leaf(tensor({1, 1, 1, 1}, {2, 2}, DType::Float64));
    fn(x).backward();
    fn(x).backward();  // a replay
    w.set_grad(Tensor());
    w.set_requires_grad(!first);
    fn(x).backward();
    CHECK(w.grad().defined() == !first);
    if (!first) CHECK(w.grad().to_vector<double>() == std::vector<double>{2, 2, 2, 2});
    const StaticStats s = fn.stats();
    CHECK(s.traces == 2);
    REQUIRE(!s.traces_history.empty());
    CHECK_THAT(s.traces_history.back().reason,
               Catch::Matchers::Contains(cat("a captured tensor [2,2] requires_grad changed ",
                                             first ? "true -> false" : "false -> true")));
  }
}

TEST_CASE("a function that turns grad on inside returns results with a graph under no_grad",
          "[static][alias]") {
  // As torch.enable_grad inside a no_grad block: eager's results require grad, and so do the
  // static function's, traced and replayed.
  StaticEnabled on;
  auto body = [](const Tensor& x) {
    const bool before = GradMode::enabled();
    GradMode::set_enabled(true);
    const Tensor r = F::mul(F::tanh(x), 2.0);
    GradMode::set_enabled(before);
    return r;
  };
  auto fn = static_graph(body, {.name = "enable_grad"});
  manual_seed(29);
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    const Tensor values = randn({4});
    Tensor x = leaf(values), xe = leaf(values);
    Tensor y, ye;
    {
      NoGradGuard no_grad;
      y = fn(x);
      ye = body(xe);
    }
    REQUIRE(ye.requires_grad());
    CHECK(y.requires_grad());
    CHECK(bit_diff(y, ye) == "");
    F::sum(y).backward();
    F::sum(ye).backward();
    CHECK(bit_diff(x.grad(), xe.grad()) == "");
  }
  CHECK(fn.stats().traces == 1);
  CHECK(fn.stats().hits == 2);
  // With no backward after its trace, the trace's graph is never completed: the next call
  // traces again, and says why.
  auto unfinished = static_graph(body, {.name = "unfinished"});
  const Tensor x = leaf(randn({4}));
  for (int call = 0; call < 2; ++call) {
    NoGradGuard no_grad;
    (void)unfinished(x);
  }
  CHECK(unfinished.stats().traces == 2);
  CHECK_THAT(unfinished.stats().traces_history.back().reason,
             Catch::Matchers::Contains("the function turns grad mode on inside"));
}
