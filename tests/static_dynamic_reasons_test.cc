// What a retrace says when dynamic families exist: the changes the nearest family does not serve
// (a dimension it keeps static, a dynamic one at 1 that no trace had at 1), not every dimension
// that differs from the most recent entry; and a dimension that cannot be dynamic beside a
// family's is blamed as it would be without one.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

TEST_CASE("a retrace beside a dynamic family names what the family does not serve",
          "[static][dynamic]") {
  auto f = [](const Tensor& x) { return F::sum(F::mul(x, 2.0)); };
  // Only dim 1 may be dynamic: x [3, n].
  auto sf = static_graph(f, {.name = "rows_static",
                             .arg_names = {"x"},
                             .dynamic = DynamicShapes::Explicit,
                             .dynamic_dims = {{0, 1}}});
  NoGradGuard no_grad;
  for (const auto& [b, n] : {std::pair<int64_t, int64_t>{3, 4}, {3, 7}, {3, 9}, {4, 9}, {3, 1}}) {
    const Tensor x = randn({b, n});
    CHECK(bit_diff(sf(x), f(x)) == "");
  }
  const auto s = sf.stats();
  REQUIRE(s.traces_history.size() == 4);  // 3x4, 3x7, 4x9 and 3x1; 3x9 planned
  // 4x9 against the family [3, s0]: dim 0 only (against the latest entry, 3x7, dim 1 too).
  CHECK(s.traces_history[2].reason == "argument 0 'x' dim 0 changed 3 -> 4");
  // 3x1: the family's dim at 1, which no trace had.
  CHECK(s.traces_history[3].reason ==
        "argument 0 'x' dim 1 is 1, which dynamic family 2 serves only where a trace had it at 1");
}

TEST_CASE("without a family, or where it explains nothing more, a retrace names every change",
          "[static][dynamic]") {
  auto f = [](const Tensor& x) { return F::sum(F::mul(x, 2.0)); };
  auto sf = static_graph(f, {.name = "plain", .arg_names = {"x"}, .dynamic = DynamicShapes::Off});
  NoGradGuard no_grad;
  (void)sf(randn({3, 4}));
  (void)sf(randn({5, 6}));
  const auto s = sf.stats();
  REQUIRE(s.traces_history.size() == 2);
  CHECK_THAT(s.traces_history[1].reason, Contains("argument 0 'x' dim 0 changed 3 -> 5"));
  CHECK_THAT(s.traces_history[1].reason, Contains("argument 0 'x' dim 1 changed 4 -> 6"));
}

TEST_CASE("a dimension that cannot be dynamic beside a family's is said to stay static",
          "[static][dynamic]") {
  // x[:, :T - 2] (a stop computed on the host): the batch becomes dynamic at 4 and 6; then T
  // changes, which no size of the traces explains: dim 1 stays static, and says so.
  auto f = [](const Tensor& x) { return F::mul(F::slice(x, 1, 0, x.size(1) - 2), 3.0); };
  auto sf = static_graph(f, {.name = "x[:, :T-2]", .arg_names = {"x"}});
  NoGradGuard no_grad;
  for (const auto& [b, t] : {std::pair<int64_t, int64_t>{4, 8}, {6, 8}, {4, 11}, {4, 13}}) {
    const Tensor x = randn({b, t});
    CHECK(bit_diff(sf(x), f(x)) == "");
  }
  const auto s = sf.stats();
  REQUIRE(s.static_dims.size() == 1);
  CHECK_THAT(s.static_dims[0], Contains("argument 0 'x' dim 1 stays static"));
  CHECK_THAT(s.static_dims[0], Contains("slice's stop"));
}
