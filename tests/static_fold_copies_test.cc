// copy_(dst, f(...)) as one step (Plan::fold_copies): the elementwise step (or fused run) writes
// the copy's destination itself. Replays equal eager bit for bit, verify mode compares the folded
// step with eager's, an argument written so is the caller's tensor, and the fold stays off where
// the result is read elsewhere or a step runs between the two.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "encore/encore.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

TEST_CASE("copy_ of an elementwise result becomes the step writing it, replayed as eager",
          "[static][fold_copies]") {
  // An average kept in an argument, updated in place (a fused run: two scales and their sum),
  // and a parameter-like captured tensor scaled in place (one mul); verified at every replay.
  const bool fuse = GENERATE(true, false);
  INFO("fusion " << (fuse ? "on" : "off"));
  const StaticFusion fusion(fuse);
  StaticEnabled on;
  manual_seed(7);
  const Tensor w_eager = randn({3, 5}), w_static = clone(w_eager);
  auto body = [](const Tensor& w, const Tensor& avg, const Tensor& x) {
    copy_(avg, F::add(F::mul(avg, 0.9), F::mul(x, 0.1)));
    copy_(w, F::mul(w, F::sum(x)));
    return F::sum(F::mul(avg, w));
  };
  auto step =
      static_graph([&](const Tensor& avg, const Tensor& x) { return body(w_static, avg, x); },
                   {.name = "averages", .verify_every = 1, .arg_names = {"avg", "x"}});
  const Tensor avg_eager = zeros({3, 5}), avg_static = zeros({3, 5});
  for (int i = 0; i < 4; ++i) {
    INFO("call " << i);
    const Tensor x = F::mul(randn({3, 5}), 0.2);
    CHECK(bit_diff(body(w_eager, avg_eager, x), step(avg_static, x)) == "");
    CHECK(bit_diff(avg_eager, avg_static) == "");  // the caller's tensor, written in place
    CHECK(bit_diff(w_eager, w_static) == "");
  }
  const StaticStats st = step.stats();
  check_one_trace_then_replays(st, 4);
  CHECK(st.verifications == 3);
  const std::string text = step.schedule_text();
  INFO(text);
  if (fuse) {
    CHECK(count_of(text, "writes what copy_ wrote: recorded as step") == 2);
    CHECK(count_of(text, R"(\d  copy_ )") == 0);
  } else {
    CHECK_THAT(text, !Contains("writes what copy_ wrote"));
    CHECK(count_of(text, R"(\d  copy_ )") == 2);
  }
}

TEST_CASE("copy_ stays a step where its source is read elsewhere or a step comes between",
          "[static][fold_copies]") {
  StaticEnabled on;
  manual_seed(8);
  auto body = [](const Tensor& a, const Tensor& b, const Tensor& x) {
    const Tensor twice = F::mul(a, 2.0);
    copy_(a, twice);  // its source is also the result
    const Tensor scaled = F::mul(b, 3.0);
    const Tensor total = F::sum(x);  // between the product and its copy
    copy_(b, scaled);
    return std::pair{twice, total};
  };
  auto step = static_graph(body, {.name = "kept_copies", .arg_names = {"a", "b", "x"}});
  const Tensor a_eager = randn({4}), b_eager = randn({4});
  const Tensor a_static = clone(a_eager), b_static = clone(b_eager);
  for (int i = 0; i < 3; ++i) {
    INFO("call " << i);
    const Tensor x = randn({4});
    const auto [twice_e, total_e] = body(a_eager, b_eager, x);
    const auto [twice_s, total_s] = step(a_static, b_static, x);
    CHECK(bit_diff(twice_e, twice_s) == "");
    CHECK(bit_diff(total_e, total_s) == "");
    CHECK(bit_diff(a_eager, a_static) == "");
    CHECK(bit_diff(b_eager, b_static) == "");
  }
  check_one_trace_then_replays(step.stats(), 3);
  const std::string text = step.schedule_text();
  INFO(text);
  CHECK_THAT(text, !Contains("writes what copy_ wrote"));
  CHECK(count_of(text, R"(\d  copy_ )") == 2);
}
