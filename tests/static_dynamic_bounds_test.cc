// Shape-polymorphic replay at sizes the traces did not show: slice bounds that Python's clamping
// gave (or would give at the new size), scalars computed from a size, and parameters whose sizes
// a traced size happens to equal. Every call must give eager's bits; a size the traces cannot
// speak for is traced, never planned wrong.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;

namespace {

// Calls `fn` eagerly and through `sf` at each size (rows of a [n, 2] float64 input) and checks
// the bits; returns the sizes planned from a family.
template <typename Fn, typename Sf>
int64_t check_sizes(Fn&& fn, Sf& sf, std::initializer_list<int64_t> sizes) {
  NoGradGuard no_grad;
  for (int64_t n : sizes) {
    INFO("size " << n);
    const Tensor x = F::reshape(arange(n * 2, DType::Float64), {n, 2});
    CHECK(bit_diff(sf(x), fn(x)) == "");
  }
  return sf.stats().sizes_planned;
}

// The same for a loss of x [n, m], with x's gradient, through `sf` and eagerly.
template <typename Fn, typename Sf>
void check_grad_at(Fn&& loss, Sf& sf, int64_t n, int64_t m) {
  INFO("size " << n << "x" << m);
  Tensor a = F::reshape(arange(n * m, DType::Float64), {n, m}).detach();
  Tensor b = a.detach();
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor la = sf(a), lb = loss(b);
  la.backward();
  lb.backward();
  CHECK(bit_diff(la, lb) == "");
  CHECK(bit_diff(a.grad(), b.grad()) == "");
}

// check_grad_at for x [n, 2] at each n.
template <typename Fn, typename Sf>
void check_grads(Fn&& loss, Sf& sf, std::initializer_list<int64_t> sizes) {
  for (int64_t n : sizes) check_grad_at(loss, sf, n, 2);
}

// x's dimension 0 named dynamic: such a family plans any size, so the slice rules below are
// checked beyond the traced sizes too (an automatic family whose slice bound was asked alike at
// every trace plans only between them: "a bound asked alike ...").
StaticOptions rows_named(const char* name, int verify_every = 0) {
  StaticOptions o;
  o.name = name;
  o.verify_every = verify_every;
  o.dynamic = DynamicShapes::Explicit;
  o.dynamic_dims = {{0, 0}};
  return o;
}

}  // namespace

TEST_CASE("a slice bound within the dimension at every trace is planned only where it stays so",
          "[static][dynamic]") {
  auto rows_1_to_3 = [](const Tensor& x) { return F::slice(x, 0, 1, 3); };
  auto sf = static_graph(rows_1_to_3, rows_named("x[1:3]"));
  CHECK(check_sizes(rows_1_to_3, sf, {4, 6, 8}) == 1);  // 8: planned
  check_sizes(rows_1_to_3, sf, {2});                    // 2: stop 3 would pass 2 rows, traced
  CHECK(sf.stats().sizes_planned == 1);
  // The trace at 2 keeps its own schedule; the family still serves the sizes its guards allow,
  // and no dimension is said to stay static.
  CHECK(check_sizes(rows_1_to_3, sf, {10, 5, 2, 3}) == 4);
  const auto st = sf.stats();
  CHECK(st.traces == 3);
  CHECK(st.static_dims.empty());
  CHECK(st.warnings.empty());
}

TEST_CASE("slice bounds counted from the end are planned at every size that keeps them so",
          "[static][dynamic]") {
  // x[-4:]: start s0 - 4 while 4 <= s0, then clamped to 0.
  auto last_4 = [](const Tensor& x) { return F::slice(x, 0, -4, int64_t{1} << 40); };
  auto sf = static_graph(last_4, rows_named("x[-4:]"));
  CHECK(check_sizes(last_4, sf, {8, 10, 12, 4, 9, 30}) == 4);
  check_sizes(last_4, sf, {3});  // 3 rows: start -4 clamps to 0, traced
  CHECK(sf.stats().traces == 3);
  CHECK(sf.stats().static_dims.empty());
  // x[1:-2], and x[-3:-1] clamped to 0 and 0 at every trace: [0:0] planned while s0 <= 1.
  auto inner = [](const Tensor& x) { return F::slice(x, 0, 1, -2); };
  auto sf2 = static_graph(inner, rows_named("x[1:-2]"));
  CHECK(check_sizes(inner, sf2, {5, 7, 3, 40, 6}) == 3);
  CHECK(sf2.stats().traces == 2);
  auto empty = [](const Tensor& x) { return F::slice(x, 0, -8, -7); };
  auto sf3 = static_graph(empty, rows_named("x[-8:-7]"));
  CHECK(check_sizes(empty, sf3, {3, 5, 6, 7, 2}) == 3);
  CHECK(sf3.stats().traces == 2);
}

TEST_CASE("a slice bound clamped at some traces and not at others blames no dimension",
          "[static][dynamic]") {
  // x[-4:] at 3 rows (start clamped to 0) and at 8 (start 4): no family from the two, and no
  // dimension blamed; 10 joins 8, and 12 and 16 are planned.
  auto last_4 = [](const Tensor& x) { return F::slice(x, 0, -4, int64_t{1} << 40); };
  auto sf = static_graph(last_4, rows_named("x[-4:]"));
  CHECK(check_sizes(last_4, sf, {3, 8, 10, 12, 16}) == 2);
  CHECK(sf.stats().traces == 3);
  CHECK(sf.stats().static_dims.empty());
  CHECK(sf.stats().warnings.empty());
  // A family of the clamped sizes first (2 and 3): 6 cannot join it, and 8 makes a family with
  // 6 that serves the larger sizes (and 4) beside it.
  auto sf2 = static_graph(last_4, rows_named("x[-4:], small first"));
  CHECK(check_sizes(last_4, sf2, {2, 3, 6, 8, 12, 20, 4, 9, 2, 3}) == 4);
  CHECK(sf2.stats().traces == 4);
  CHECK(sf2.stats().dynamic.size() == 2);
  CHECK(sf2.stats().static_dims.empty());
  CHECK(sf2.stats().warnings.empty());
  // The large sizes first: a family of 8 and 12, one of 2 and 3 beside it; 10 and 20 stay the
  // first family's.
  auto sf3 = static_graph(last_4, rows_named("x[-4:], large first"));
  CHECK(check_sizes(last_4, sf3, {8, 12, 2, 3, 10, 20, 1, 2, 16}) == 3);
  CHECK(sf3.stats().traces == 5);
  CHECK(sf3.stats().dynamic.size() == 2);
}

TEST_CASE("a slice of a dimension of one size is planned whatever its bounds",
          "[static][dynamic]") {
  // x[:, 2:-1] of [n, 2]: empty (the stop, 1, clamped up to the start, 2) at every n.
  auto empty_cols = [](const Tensor& x) { return F::slice(x, 1, 2, -1); };
  auto sf = static_graph(empty_cols, {.name = "x[:, 2:-1]"});
  CHECK(check_sizes(empty_cols, sf, {4, 6, 9, 3}) == 2);
  CHECK(sf.stats().static_dims.empty());
  auto last_col = [](const Tensor& x) { return F::slice(x, 1, -1, 5); };
  auto sf2 = static_graph(last_col, {.name = "x[:, -1:5]"});
  CHECK(check_sizes(last_col, sf2, {4, 6, 9, 3}) == 2);
}

TEST_CASE("a bound asked as a size on a dimension of one size follows that size",
          "[static][dynamic]") {
  // x[:, :T] with x [B, 10] and T = y.size(0): the traces left in the family's window all have
  // T = 4, where T is still a dynamic size; the stop is T (guarded), not the constant 4.
  auto fn = [](const Tensor& x, const Tensor& y, const Tensor& z, const Tensor& w,
               const Tensor& v) {
    return F::add(F::sum(F::slice(x, 1, 0, y.size(0))),
                  F::add(F::add(F::sum(y), F::sum(z)), F::add(F::sum(w), F::sum(v))));
  };
  auto sf = static_graph(fn, {.name = "x[:, :T]"});
  NoGradGuard no_grad;
  struct Sizes {
    int64_t b, t, c, d, e;
  };
  for (const Sizes& p :
       {Sizes{2, 3, 5, 5, 5}, Sizes{3, 4, 5, 5, 5}, Sizes{3, 4, 6, 5, 5}, Sizes{3, 4, 6, 7, 5},
        Sizes{3, 4, 6, 7, 8}, Sizes{3, 7, 6, 7, 8}, Sizes{3, 9, 6, 7, 8}}) {
    INFO("T " << p.t);
    const Tensor x = F::reshape(arange(p.b * 10, DType::Float64), {p.b, 10});
    const Tensor y = arange(p.t, DType::Float64), z = arange(p.c, DType::Float64),
                 w = arange(p.d, DType::Float64), v = arange(p.e, DType::Float64);
    CHECK(bit_diff(sf(x, y, z, w, v), fn(x, y, z, w, v)) == "");
  }
}

TEST_CASE("a bound no size explains keeps the dimension static, named as such",
          "[static][dynamic]") {
  // x[n / 2:]: as asked at every trace, but no size of the trace is n / 2.
  auto half = [](const Tensor& x) { return F::slice(x, 0, x.size(0) / 2, x.size(0)); };
  auto sf = static_graph(half, {.name = "x[n/2:]"});
  check_sizes(half, sf, {4, 6, 8, 10});
  const auto st = sf.stats();
  CHECK(st.sizes_planned == 0);
  REQUIRE(st.static_dims.size() == 1);
  CHECK_THAT(st.static_dims[0], Catch::Matchers::Contains("which no size of the trace explains"));
}

TEST_CASE("verify mode passes at sizes planned from slices whose bounds are sizes",
          "[static][dynamic][verify]") {
  // Bounds asked as sizes (x[1:n], a concat's gradient slices [0:n] and [n:2n]) are planned at
  // each size; verify compares what each slice does with eager's.
  auto head = [](const Tensor& x) { return F::slice(x, 0, 1, x.size(0)); };
  auto sf = static_graph(head, rows_named("x[1:n]", 1));
  CHECK(check_sizes(head, sf, {4, 6, 8, 11}) == 2);
  auto loss = [](const Tensor& x) { return F::sum(F::concat({x, F::mul(x, 2.0)}, 0)); };
  auto sf2 = static_graph(loss, {.name = "sum(concat)", .verify_every = 1});
  check_grads(loss, sf2, {4, 6, 8, 11});
  CHECK(sf2.stats().sizes_planned == 2);
}

TEST_CASE("a slice bound clamped at every trace is planned only where it stays clamped",
          "[static][dynamic]") {
  auto first_5 = [](const Tensor& x) { return F::slice(x, 0, 0, 5); };
  auto sf = static_graph(first_5, {.name = "x[:5]"});
  CHECK(check_sizes(first_5, sf, {2, 3, 4}) == 1);  // 4: planned, still clamped
  check_sizes(first_5, sf, {8});                    // 8: 5 rows, not 8: traced
  NoGradGuard no_grad;
  CHECK(sf(F::reshape(arange(16, DType::Float64), {8, 2})).size(0) == 5);
  // To the end: the family serves every size but 3, whose one row no trace had.
  auto from_2 = [](const Tensor& x) { return F::slice(x, 0, 2, int64_t{1} << 40); };
  auto sf2 = static_graph(from_2, rows_named("x[2:]"));
  CHECK(check_sizes(from_2, sf2, {4, 6, 9, 30, 3, 5}) == 3);
  CHECK(sf2.stats().traces == 3);
}

TEST_CASE("a slice's backward at an untraced size writes within its gradient",
          "[static][dynamic]") {
  SwitchScope<set_static_redzones_enabled> redzones(true);
  auto loss = [](const Tensor& x) { return F::sum(F::mul(F::slice(x, 0, 1, 3), x.size(1))); };
  auto sf = static_graph(loss, {.name = "slice_grad"});
  check_grads(loss, sf, {4, 6, 2, 8});
  // Bounds from the end: the gradient of the last rows but one.
  auto tail = [](const Tensor& x) { return F::sum(F::mul(F::slice(x, 0, -3, -1), 2.0)); };
  auto sf2 = static_graph(tail, rows_named("sum(x[-3:-1])"));
  check_grads(tail, sf2, {6, 9, 4, 12});
  CHECK(sf2.stats().traces == 2);
  CHECK(sf2.stats().sizes_planned == 2);
}

TEST_CASE("a size that is 1 at no trace is traced where it would be 1, not planned",
          "[static][dynamic][verify]") {
  // y = x[::4, ::4] is [2, 2] at 6x5 and [3, 2] at 9x6, [1, 1] at 3x3: there eager's backward of
  // sum(y * y) needs no broadcast, so 3x3 traces (verify passes at every size).
  auto loss = [](const Tensor& x) {
    const Tensor y = F::slice(F::slice(x, 0, 0, int64_t{1} << 40, 4), 1, 0, int64_t{1} << 40, 4);
    return F::sum(F::mul(y, y));
  };
  auto sf = static_graph(loss, {.name = "sum(x[::4, ::4]^2)", .verify_every = 1});
  for (const auto& [n, m] : {std::pair<int64_t, int64_t>{6, 5}, {9, 6}, {3, 3}, {12, 12}, {7, 7}})
    check_grad_at(loss, sf, n, m);
  CHECK(sf.stats().traces == 3);         // 6x5, 9x6 and 3x3
  CHECK(sf.stats().sizes_planned == 2);  // 12x12 and 7x7
}

TEST_CASE("a scalar k / size is planned only when every way of computing it rounds alike",
          "[static][dynamic]") {
  // 0.3 * (1 / n) and 0.3 / n differ in the last bit at n = 7: the dimension stays static.
  auto scaled = [](const Tensor& x) {
    return F::mul(x, 0.3 * (1.0 / static_cast<double>(x.size(0))));
  };
  auto sf = static_graph(scaled, {.name = "scaled"});
  CHECK(check_sizes(scaled, sf, {4, 6, 7, 13}) == 0);
  // 1 / n (a mean's gradient) and 2 / n: planned.
  auto mean_like = [](const Tensor& x) { return F::mul(x, 2.0 / static_cast<double>(x.size(0))); };
  auto sf2 = static_graph(mean_like, {.name = "mean_like"});
  CHECK(check_sizes(mean_like, sf2, {4, 6, 7, 13}) == 2);
}

TEST_CASE("a parameter size that a traced size happens to equal does not keep a dimension static",
          "[static][dynamic]") {
  // Images of 32 and 33 both pool to 16, the channel count of the second convolution.
  manual_seed(1);
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(3, 16, 3, nn::Conv2dOptions{.padding = 1}),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
      std::make_shared<nn::Conv2d>(16, 16, 3, nn::Conv2dOptions{.padding = 1}),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::GlobalAvgPool2d>(),
      std::make_shared<nn::Linear>(16, 10)});
  net->eval();
  auto infer =
      static_graph([&](const Tensor& x) { return (*net)(x); }, {.name = "infer", .modules = {net}});
  NoGradGuard no_grad;
  for (int64_t s : {32, 33, 40, 48, 20}) {
    INFO("size " << s);
    const Tensor x = randn({2, 3, s, s});
    CHECK(bit_diff(infer(x), (*net)(x)) == "");
  }
  CHECK(infer.stats().traces == 2);
  CHECK(infer.stats().sizes_planned == 3);
}

TEST_CASE("a bound asked alike on a dynamic dimension is planned only between the traced sizes",
          "[static][dynamic]") {
  // x[:n / 4] at 8 and 11 rows: a stop of 2 at both, as a constant would be. Between them it is 2
  // (9 and 10 planned); at 12 it is 3, which a family planning beyond would miss: 12 and 16 trace,
  // and each keeps a schedule of its own (their stops, 3 and 4, follow no size), while the family
  // still serves 8 to 11.
  auto quarter = [](const Tensor& x) { return F::slice(x, 0, 0, x.size(0) / 4); };
  auto sf = static_graph(quarter, {.name = "x[:n/4]"});
  CHECK(check_sizes(quarter, sf, {8, 11, 9, 10}) == 2);
  CHECK(sf.stats().dynamic.at(0).ranges ==
        std::vector<std::string>{
            "step 0 (forward) slice's stop, 2 at every traced size, keeps s0 within 8 to 11"});
  CHECK(check_sizes(quarter, sf, {12, 16}) == 2);
  auto st = sf.stats();
  CHECK(st.traces == 4);  // 8, 11, 12 and 16
  REQUIRE(st.traces_history.size() == 4);
  CHECK(st.traces_history[2].reason ==
        "no schedule at s0=12: step 0 (forward) slice's stop, 2 at every traced size, may be "
        "computed from the size it slices, which would be 12 here and was 8 to 11 at the traced "
        "sizes (planned from dynamic family 2)");
  CHECK(st.static_dims.empty());
  REQUIRE(st.dynamic.size() == 1);
  CHECK(check_sizes(quarter, sf, {10, 12, 16}) == 2);
  CHECK(sf.stats().hits == 5);

  // x[0:1], the first row, at 4 and 6: 5 is planned; 12 and 2 trace and extend the family,
  // which then plans 10 and 3.
  auto first = [](const Tensor& x) { return F::slice(x, 0, 0, 1); };
  auto sf2 = static_graph(first, {.name = "x[0:1]"});
  CHECK(check_sizes(first, sf2, {4, 6, 5}) == 1);
  CHECK(check_sizes(first, sf2, {12, 10, 2, 3}) == 3);
  st = sf2.stats();
  CHECK(st.traces == 4);
  CHECK(st.static_dims.empty());
  CHECK(st.warnings.empty());
  REQUIRE(st.dynamic.size() == 1);
  CHECK(st.dynamic[0].ranges ==
        std::vector<std::string>{
            "step 0 (forward) slice's stop, 1 at every traced size, keeps s0 within 2 to 12"});
  REQUIRE(st.dynamic_history.size() == 3);
  CHECK_THAT(st.dynamic_history[0],
             Catch::Matchers::EndsWith("; within traced sizes: step 0 (forward) slice's stop, 1 at "
                                       "every traced size, keeps s0 within 4 to 6"));
  CHECK_THAT(st.dynamic_history[1],
             Catch::Matchers::Contains("trace 3 extends dynamic family 2 (traces 1, 2 and 3 agree "
                                       "in everything but sizes)"));
}

TEST_CASE("a family keeps its smallest and largest traced sizes as its window moves",
          "[static][dynamic]") {
  // x[0:1] at 10 to 14, each beyond the last: the family is built from four traces, and the one
  // that goes is 11, not 10, the smallest. With the entry of 10 evicted (cache_limit 4), 10 is
  // still planned.
  auto first = [](const Tensor& x) { return F::slice(x, 0, 0, 1); };
  auto sf = static_graph(first, {.name = "x[0:1]", .cache_limit = 4});
  CHECK(check_sizes(first, sf, {10, 11, 12, 13, 14}) == 0);
  CHECK(check_sizes(first, sf, {10}) == 1);
  const auto st = sf.stats();
  CHECK(st.traces == 5);
  REQUIRE(st.dynamic.size() == 1);
  CHECK(st.dynamic[0].traces == std::vector<int64_t>{1, 3, 4, 5});
}

TEST_CASE("a dimension named dynamic is planned beyond the traced sizes", "[static][dynamic]") {
  auto first = [](const Tensor& x) { return F::slice(x, 0, 0, 1); };
  auto sf = static_graph(first, rows_named("x[0:1], named"));
  CHECK(check_sizes(first, sf, {4, 6, 12, 2, 30}) == 3);
  CHECK(sf.stats().traces == 2);
  CHECK(sf.stats().dynamic.at(0).ranges.empty());
}

TEST_CASE("a range limits only the size its slice slices", "[static][dynamic]") {
  NoGradGuard no_grad;
  auto at = [](int64_t n, int64_t m) { return F::reshape(arange(n * m, DType::Float64), {n, m}); };
  // x[0:1] of x [n, m] at 4x3 and 6x5: n stays within 4 to 6, m is planned at any size.
  auto first = [](const Tensor& x) { return F::slice(x, 0, 0, 1); };
  auto sf = static_graph(first, {.name = "x[0:1]"});
  for (const auto& [n, m] : {std::pair<int64_t, int64_t>{4, 3}, {6, 5}, {5, 9}, {4, 40}, {12, 3}}) {
    INFO(n << "x" << m);
    CHECK(bit_diff(sf(at(n, m)), first(at(n, m))) == "");
  }
  CHECK(sf.stats().traces == 3);
  CHECK(sf.stats().sizes_planned == 2);
}

TEST_CASE("the backward's slices do not limit a family to its traced sizes", "[static][dynamic]") {
  // concat's gradient slices x's part at [1:n + 1]: a start of 1 at every size, which the
  // concat's shapes give, not the function's arithmetic.
  auto loss = [](const Tensor& x) {
    return F::sum(F::mul(F::concat({ones({1, 2}, DType::Float64), x}, 0), 3.0));
  };
  auto sf = static_graph(loss, {.name = "sum(concat(row, x))"});
  check_grads(loss, sf, {4, 8, 12, 2});
  CHECK(sf.stats().traces == 2);
  CHECK(sf.stats().sizes_planned == 2);
}

TEST_CASE("verify mode failing at a size planned from a family drops the family",
          "[static][dynamic][verify]") {
  // x[:n / 4] with its dimension named: 12 is planned with the stop of 8 and 11 (2), where
  // eager's is 3. Verify says so, and the family goes: the next call at 12 traces.
  auto quarter = [](const Tensor& x) { return F::slice(x, 0, 0, x.size(0) / 4); };
  auto sf = static_graph(quarter, rows_named("x[:n/4], verified", 1));
  check_sizes(quarter, sf, {8, 11});
  NoGradGuard no_grad;
  const Tensor x = F::reshape(arange(24, DType::Float64), {12, 2});
  CHECK_THROWS_WITH(sf(x), Catch::Matchers::Contains("the function is not static") &&
                               Catch::Matchers::EndsWith(" (at a size planned from dynamic family "
                                                         "2, which goes: the next call traces)"));
  CHECK(bit_diff(sf(x), quarter(x)) == "");
  const auto st = sf.stats();
  CHECK(st.traces == 3);
  CHECK(st.dynamic.empty());
  REQUIRE(st.traces_history.size() == 3);
  CHECK_THAT(st.traces_history[2].reason,
             Catch::Matchers::StartsWith("verify mode found a size planned from a dynamic family"));
}

TEST_CASE("a length growing by one traces each new length once, and says how to plan it instead",
          "[static][dynamic]") {
  // x[-1:], the last row, at 2, 3, ..., 12: each size is beyond the family's traced ones. The
  // traces the family holds leave the cache (cache_limit 8) without a word; the storm warning
  // names the bound and the way to plan every size.
  auto last = [](const Tensor& x) { return F::slice(x, 0, -1, int64_t{1} << 40); };
  auto sf = static_graph(last, {.name = "x[-1:]"});
  CHECK(check_sizes(last, sf, {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}) == 0);
  CHECK(check_sizes(last, sf, {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}) == 3);  // 2, 3 and 4
  const auto st = sf.stats();
  CHECK(st.traces == 11);
  CHECK(st.evictions == 3);
  REQUIRE(st.warnings.size() == 1);
  CHECK_THAT(st.warnings[0],
             Catch::Matchers::Contains("10 of the last 10 calls retraced; argument 0 dim 0 keeps "
                                       "changing (recent values 4, 5, 6, 7, 8, 9, 10, 11). It is "
                                       "dynamic (family 9), but the family could not plan these "
                                       "sizes (latest: no schedule at s0=11") &&
                 Catch::Matchers::EndsWith(
                     "; dynamic family 9 plans only sizes between its traced ones (step 0 "
                     "(forward) slice's start, -1 at every traced size, may be computed from the "
                     "size): DynamicShapes::Explicit naming its dimensions plans any size"));
}

TEST_CASE(
    "a bound that was the whole size at every trace is planned only at sizes a step of "
    "the traced ones apart",
    "[static][dynamic]") {
  // x[:n - n % 4], traced at 8 and 16: the stop is n at both, as x[:n] would be. 13 is not a
  // multiple of 8 from 8, and traces (its stop is 12); 12 traces and joins the family, whose
  // step becomes 4; 20 and 24 are beyond, and trace.
  auto crop = [](const Tensor& x) { return F::slice(x, 0, 0, x.size(0) - x.size(0) % 4); };
  auto sf = static_graph(crop, {.name = "x[:n - n%4]"});
  CHECK(check_sizes(crop, sf, {8, 16}) == 0);
  CHECK(sf.stats().dynamic.at(0).ranges ==
        std::vector<std::string>{"step 0 (forward) slice's stop, the whole size it slices at every "
                                 "traced size, keeps s0 within 8 to 16 in steps of 8"});
  CHECK(check_sizes(crop, sf, {13, 12, 10, 15, 20, 24, 11, 14}) == 0);
  CHECK(sf.stats().traces == 10);
  // x[:n] itself: traces at sizes off the step join the family, which then plans every size
  // between its traced ones.
  auto whole = [](const Tensor& x) { return F::slice(x, 0, 0, x.size(0)); };
  auto sf2 = static_graph(whole, {.name = "x[:n]"});
  CHECK(check_sizes(whole, sf2, {4, 6, 5, 10, 7, 8, 9}) == 3);
  CHECK(sf2.stats().traces == 4);
  CHECK(sf2.stats().dynamic.at(0).ranges ==
        std::vector<std::string>{"step 0 (forward) slice's stop, the whole size it slices at every "
                                 "traced size, keeps s0 within 4 to 10 in steps of 1"});
}

TEST_CASE("a verified whole step that fails leaves the parameters and gradients as it found them",
          "[static][dynamic][verify]") {
  // A training step whose batch is x[:n / 4], its dimension named: 12 is planned with the rows
  // of 9 and 11 (2), where eager's are 3. The replay updates the weights before verify compares;
  // the failed call puts them, and their gradients, back.
  manual_seed(5);
  auto lin = std::make_shared<nn::Linear>(2, 3);
  optim::SGD sgd(lin->parameters(), {.lr = 0.1});
  auto step = [&](const Tensor& x) {
    const Tensor loss = F::sum((*lin)(F::slice(x, 0, 0, x.size(0) / 4)));
    loss.backward();
    sgd.step();
    return loss.detach();
  };
  StaticOptions o = rows_named("step, verified", 1);
  o.modules = {lin};
  auto sf = static_graph(step, o);
  auto at = [](int64_t n) { return F::reshape(arange(n * 2, DType::Float32), {n, 2}); };
  for (int64_t n : {8, 9, 11}) sf(at(n));  // 8 traces with no .grad yet: 9 and 11 the family
  const Tensor w = clone(lin->weight), b = clone(lin->bias);
  const Tensor gw = clone(lin->weight.grad()), gb = clone(lin->bias.grad());
  const int64_t steps = sgd.steps();
  CHECK_THROWS_WITH(sf(at(12)), Catch::Matchers::Contains("which goes: the next call traces"));
  CHECK(sgd.steps() == steps);
  CHECK(bit_diff(lin->weight, w) == "");
  CHECK(bit_diff(lin->bias, b) == "");
  CHECK(bit_diff(lin->weight.grad(), gw) == "");
  CHECK(bit_diff(lin->bias.grad(), gb) == "");
}

TEST_CASE("a stop of 0 at every trace is planned only between the traced sizes",
          "[static][dynamic]") {
  // x[:n / 8] at 5 and 7 rows: empty at both. 6 is planned (empty); at 64 the stop is 8, and 64
  // traces.
  auto eighth = [](const Tensor& x) { return F::slice(x, 0, 0, x.size(0) / 8); };
  auto sf = static_graph(eighth, {.name = "x[:n/8]"});
  CHECK(check_sizes(eighth, sf, {5, 7, 6, 64}) == 1);
  CHECK(sf.stats().traces == 3);
}
