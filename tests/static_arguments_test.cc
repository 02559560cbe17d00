// Undefined tensor arguments (an optional state left out): a static function passes them on
// undefined, as the eager call does; whether each argument is defined is part of the signature,
// so a call that gives one where the trace had none traces again, and says so.
#include <catch2/catch.hpp>

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

// x scaled by a state when one is given, by 2 when not.
Tensor scaled(const Tensor& x, const Tensor& state) {
  return state.defined() ? F::mul(F::tanh(x), state) : F::mul(F::tanh(x), 2.0);
}

struct StaticLstm : nn::LSTM {
  using LSTM::LSTM;
  ENCORE_STATIC_GRAPH({.name = "lstm", .arg_names = {"x", "h0", "c0"}});
};

}  // namespace

TEST_CASE("an undefined argument reaches the function undefined, and is part of the signature",
          "[static][arguments]") {
  StaticEnabled on;
  auto f = static_graph(scaled, {.name = "scaled", .arg_names = {"x", "state"}});
  manual_seed(31);
  const Tensor state = randn({3});
  // Undefined twice (a trace, a replay), defined twice, undefined again (the first entry).
  const bool given[] = {false, false, true, true, false};
  for (size_t call = 0; call < std::size(given); ++call) {
    INFO("call " << call);
    const Tensor values = randn({3});
    Tensor x = values.detach(), xe = values.detach();
    x.set_requires_grad(true);
    xe.set_requires_grad(true);
    const Tensor s = given[call] ? state : Tensor();
    const Tensor y = f(x, s), ye = scaled(xe, s);
    CHECK(bit_diff(y, ye) == "");
    F::sum(y).backward();
    F::sum(ye).backward();
    CHECK(bit_diff(x.grad(), xe.grad()) == "");
  }
  const StaticStats st = f.stats();
  CHECK(st.traces == 2);
  CHECK(st.hits == 3);
  REQUIRE(st.traces_history.size() == 2);
  CHECK_THAT(st.traces_history[1].reason,
             Contains("argument 1 'state' changed undefined -> float32[3]"));
  CHECK_THAT(f.schedule_text(), Contains("state: undefined"));
}

TEST_CASE("an undefined argument in verify mode, and beside an explicitly dynamic one",
          "[static][arguments]") {
  StaticEnabled on;
  auto f = static_graph(scaled, {.name = "verified",
                                 .verify_every = 1,
                                 .dynamic = DynamicShapes::Explicit,
                                 .dynamic_dims = {{0, 0}, {1, 0}}});
  manual_seed(33);
  for (const int64_t n : {3, 5, 4, 5}) {
    INFO("size " << n);
    const Tensor values = randn({n});
    Tensor x = values.detach(), xe = values.detach();
    x.set_requires_grad(true);
    xe.set_requires_grad(true);
    const Tensor y = f(x, Tensor()), ye = scaled(xe, Tensor());
    CHECK(bit_diff(y, ye) == "");
    F::sum(y).backward();
    F::sum(ye).backward();
    CHECK(bit_diff(x.grad(), xe.grad()) == "");
  }
  CHECK(f.stats().traces == 2);  // 3, then 5: dim 0 of x is dynamic from there
  CHECK(f.stats().verifications == 2);
}

TEST_CASE("an undefined argument with a dynamic size beside it", "[static][arguments]") {
  StaticEnabled on;
  NoGradGuard no_grad;
  auto f = static_graph(scaled, {.name = "sizes"});
  for (const int64_t n : {4, 6, 5, 9}) {
    INFO("size " << n);
    const Tensor x = randn({n});
    CHECK(bit_diff(f(x, Tensor()), scaled(x, Tensor())) == "");
  }
  CHECK(f.stats().traces == 2);
  CHECK(f.stats().sizes_planned == 2);
}

TEST_CASE("a static LSTM takes its state left out as eager does, with the switch on and off",
          "[static][arguments][lstm]") {
  for (const bool enabled : {true, false}) {
    INFO("static " << enabled);
    StaticEnabled on(enabled);
    manual_seed(32);
    nn::LSTM eager(3, 4);
    manual_seed(32);
    StaticLstm traced(3, 4);
    for (int call = 0; call < 3; ++call) {
      INFO("call " << call);
      const Tensor x = randn({5, 2, 3});
      const auto [y, h, c] = traced(x, Tensor(), Tensor());
      const auto [ye, he, ce] = eager(x);
      CHECK(bit_diff(y, ye) == "");
      CHECK(bit_diff(c, ce) == "");
      F::sum(y).backward();
      F::sum(ye).backward();
      CHECK(bit_diff(traced.weight_hh[0].grad(), eager.weight_hh[0].grad()) == "");
    }
    const StaticStats st = static_stats(traced);
    CHECK(st.traces == (enabled ? 1 : 0));
    CHECK(st.eager_calls == (enabled ? 0 : 3));
  }
}
