// copy_(dst, f(...)) as one step (Plan::fold_copies): the elementwise step (or fused run) writes
// the copy's destination itself. Replays equal eager bit for bit, verify mode compares the folded
// step with eager's, an argument written so is the caller's tensor, and the fold stays off where
// the result is read elsewhere or a step runs between the two.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "encore/encore.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

TEST_CASE("copy_ of an elementwise result becomes the step writing it, replayed as eager",
          "[static][fold_copies]") {
  // An average kept in an argument, updated in place (a fused run over several blocks: two
  // scales, their sum and a bias row), and a captured tensor scaled in place (one mul); verified
  // at every replay, at one thread and at two (two lanes).
  const bool fuse = GENERATE(true, false);
  const int threads = GENERATE(1, 2);
  INFO("fusion " << (fuse ? "on" : "off") << ", " << threads << " threads");
  const StaticFusion fusion(fuse);
  const ThreadCount count(threads);
  StaticEnabled on;
  manual_seed(7);
  const Tensor w_eager = randn({37, 19}), w_static = clone(w_eager);
  auto body = [](const Tensor& w, const Tensor& avg, const Tensor& x, const Tensor& bias) {
    copy_(avg, F::add(F::add(F::mul(avg, 0.9), F::mul(x, 0.1)), bias));
    copy_(w, F::mul(w, F::mean(x)));
    return F::sum(F::mul(avg, w));
  };
  auto step =
      static_graph([&](const Tensor& avg, const Tensor& x,
                       const Tensor& bias) { return body(w_static, avg, x, bias); },
                   {.name = "averages", .verify_every = 1, .arg_names = {"avg", "x", "bias"}});
  const Tensor avg_eager = zeros({37, 19}), avg_static = zeros({37, 19});
  const Tensor bias = F::mul(randn({19}), 0.01);
  for (int i = 0; i < 4; ++i) {
    INFO("call " << i);
    const Tensor x = F::mul(randn({37, 19}), 0.2);
    CHECK(bit_diff(body(w_eager, avg_eager, x, bias), step(avg_static, x, bias)) == "");
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
    CHECK_THAT(text, Contains("fuses 4 steps"));
  } else {
    CHECK_THAT(text, !Contains("writes what copy_ wrote"));
    CHECK(count_of(text, R"(\d  copy_ )") == 2);
  }
}

TEST_CASE("copy_ stays a step where its source is read elsewhere or a step comes between",
          "[static][fold_copies]") {
  StaticEnabled on;
  manual_seed(8);
  auto body = [](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& x) {
    const Tensor twice = F::mul(a, 2.0);
    copy_(a, twice);  // its source is also a result
    const Tensor scaled = F::mul(b, 3.0);
    const Tensor total = F::sum(x);  // between the product and its copy (x has another size)
    copy_(b, scaled);
    const Tensor five = F::mul(c, 5.0);
    copy_(c, five);  // its source is read again below
    return std::tuple{twice, total, F::sum(F::mul(five, c))};
  };
  auto step = static_graph(body, {.name = "kept_copies", .arg_names = {"a", "b", "c", "x"}});
  const Tensor a_eager = randn({4}), b_eager = randn({4}), c_eager = randn({4});
  const Tensor a_static = clone(a_eager), b_static = clone(b_eager), c_static = clone(c_eager);
  for (int i = 0; i < 3; ++i) {
    INFO("call " << i);
    const Tensor x = randn({2, 3});
    const auto [twice_e, total_e, five_e] = body(a_eager, b_eager, c_eager, x);
    const auto [twice_s, total_s, five_s] = step(a_static, b_static, c_static, x);
    CHECK(bit_diff(twice_e, twice_s) == "");
    CHECK(bit_diff(total_e, total_s) == "");
    CHECK(bit_diff(five_e, five_s) == "");
    for (const auto& [e, s] :
         {std::pair{a_eager, a_static}, {b_eager, b_static}, {c_eager, c_static}})
      CHECK(bit_diff(e, s) == "");
  }
  check_one_trace_then_replays(step.stats(), 3);
  const std::string text = step.schedule_text();
  INFO(text);
  CHECK_THAT(text, !Contains("writes what copy_ wrote"));
  CHECK(count_of(text, R"(\d  copy_ )") == 3);
  // The sum sits between b's product and its copy in the plan too.
  const size_t copy_a = text.find("  copy_ ");
  const size_t copy_b = text.find("  copy_ ", copy_a + 1);
  const size_t sum = text.find("  sum ", copy_a);
  CHECK(sum < copy_b);
  CHECK(text.find("  mul_scalar", copy_a) < sum);
}
