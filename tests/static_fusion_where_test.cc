// where in fused runs of cpu plans, and operands tiled over leading axes: attention's scale, causal
// mask and softmax as one step (and their gradients as one), a position embedding [T, C] added to
// [B, T, C], where's condition and values in every layout. For every pattern a replay gives
// eager's bits (result and every argument's gradient), in float32 and float64, at one and two
// threads, verify mode passes, and the schedule shows the fused step.
#include <catch2/catch.hpp>

#include <limits>
#include <string>

#include "encore/encore.h"
#include "tests/fusion_patterns.h"
#include "tests/test_util.h"

using namespace encore;
using Catch::Matchers::Contains;
using testing::causal_mask;
using testing::check_pattern;
using testing::count_of;
using testing::Outcome;

namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

}  // namespace

TEST_CASE("attention's scale, causal mask and softmax are one fused step", "[static][fusion]") {
  // Scores [B, H, T, T] read the [T, T] mask as a tile; rows of a block and pieces of a long row.
  for (int64_t t : {int64_t{8}, int64_t{300}}) {
    auto body = [t](const Tensor& s, const Tensor& v) {
      const Tensor p =
          F::softmax(F::masked_fill(F::mul(s, 0.125), causal_mask(t, s), kMinusInf), -1);
      return F::mul(p, v);
    };
    const Outcome o = check_pattern<2>("causal", body, {Shape{2, 3, t, t}, Shape{2, 3, t, t}});
    INFO(o.text);
    CHECK(o.fused.forward == 1);  // the mask's steps fold into a constant
    CHECK(o.fused.forward < o.unfused.forward);
    CHECK(o.fused.backward < o.unfused.backward);
    CHECK_THAT(o.text, Contains(cat("(a tile of ", t * t, ")")));
    CHECK(count_of(o.text, R"(= where\(in \d+ \(a tile of)") == 2);  // forward and backward
    CHECK(count_of(o.text, R"(= softmax_grad\()") == 1);
  }
}

TEST_CASE("an operand tiled over leading axes joins a fused run", "[static][fusion]") {
  // A position embedding [T, C] (or [1, T, C]) added to [B, T, C].
  for (const Shape& pos : {Shape{5, 6}, Shape{1, 5, 6}}) {
    auto body = [](const Tensor& x, const Tensor& p) { return F::tanh(F::add(x, p)) * 2.0; };
    const Outcome o = check_pattern<2>("position", body, {Shape{4, 5, 6}, pos});
    INFO(o.text);
    CHECK(o.fused.forward == 1);
    CHECK(o.unfused.forward == 3);
    CHECK_THAT(o.text, Contains("in 1 (a tile of 30)"));
  }
  // The tile first: p - x.
  auto first = [](const Tensor& x, const Tensor& p) { return F::exp(F::sub(p, F::mul(x, 0.5))); };
  const Outcome o = check_pattern<2>("tile_first", first, {Shape{3, 2, 70}, Shape{2, 70}});
  INFO(o.text);
  CHECK(o.fused.forward == 1);
  CHECK_THAT(o.text, Contains("(a tile of 140)"));
}

TEST_CASE("where reads its condition and values in every layout", "[static][fusion]") {
  // A condition of x's shape (a comparison step before the run), a value of the run and one per
  // row.
  auto rows = [](const Tensor& x, const Tensor& r, const Tensor& c) {
    const Tensor cond = F::greater(x, r);
    const Tensor y = F::mul(x, r);
    return F::sigmoid(F::where(cond, y, c));
  };
  Outcome o = check_pattern<3>("where_rows", rows, {Shape{20, 40}, Shape{40}, Shape{20, 1}});
  INFO(o.text);
  CHECK(count_of(o.text, R"(= where\(in \d+, scratch \d+, in \d+ \(one per row\)\))") == 1);
  CHECK(o.fused.forward < o.unfused.forward);
  // A tiled condition choosing between a scalar and a value of the run, rows longer than a block.
  auto tiled = [](const Tensor& x, const Tensor& m, const Tensor& s) {
    const Tensor cond = F::greater(m, F::mul(m, 0.5));
    const Tensor total = F::sum(s);
    const Tensor y = F::tanh(F::mul(x, 3.0));
    return F::exp(F::where(cond, total, y));
  };
  o = check_pattern<3>("where_tile", tiled, {Shape{2, 3, 300}, Shape{3, 300}, Shape{4}});
  INFO(o.text);
  CHECK(o.fused.forward < o.unfused.forward);
  CHECK(count_of(o.text, R"(= where\(in \d+ \(a tile of 900\), in \d+, (scratch|out) \d+\))") == 1);
  // A condition broadcast any other way keeps where apart.
  auto other = [](const Tensor& x, const Tensor& m) {
    const Tensor cond = F::greater(m, F::mul(m, 0.5));
    const Tensor y = F::mul(x, 2.0);
    return F::exp(F::where(cond, y, x));
  };
  o = check_pattern<2>("where_other", other, {Shape{3, 4, 8}, Shape{3, 1, 8}});
  INFO(o.text);
  CHECK_THAT(o.text, !Contains("= where("));
}
