// Fused runs over rows in cpu plans: operands broadcast along the rows (a bias [C] over a batch)
// or across them ([R, 1]), and row ops over the last axis (sum, mean, max, softmax, log_softmax
// and their gradients) inside a run. For every pattern a replay gives eager's bits (result and
// every argument's gradient), in float32 and float64, at one and two threads, verify mode
// passes, and the schedule shows the fused step (fewer steps than the unfused plan).
#include <catch2/catch.hpp>

#include <string>

#include "encore/encore.h"
#include "tests/fusion_patterns.h"
#include "tests/test_util.h"

using namespace encore;
using Catch::Matchers::Contains;
using testing::bit_diff;
using testing::check_pattern;
using testing::count_of;
using testing::Outcome;
using testing::StaticEnabled;
using testing::StaticFusion;

TEST_CASE("a fused run reads a bias broadcast along the rows", "[static][fusion][rows]") {
  // Rows shorter than a block (several rows per block) and longer (pieces of one row).
  for (int64_t c : {int64_t{40}, int64_t{300}}) {
    auto body = [](const Tensor& x, const Tensor& w, const Tensor& b) {
      return F::tanh(F::add(F::mul(x, w), b)) * 0.5;
    };
    const Outcome o = check_pattern<3>("row_bias", body, {Shape{7, c}, Shape{c}, Shape{1, c}});
    INFO(o.text);
    CHECK(o.fused.forward == 1);
    CHECK(o.unfused.forward == 4);
    CHECK_THAT(o.text, Contains(cat("by rows of ", c)));
    CHECK_THAT(o.text, Contains("in 1 (one row)"));
  }
}

TEST_CASE("a fused run reads a value per row broadcast across the row", "[static][fusion][rows]") {
  auto body = [](const Tensor& x, const Tensor& c, const Tensor& s) {
    return F::sigmoid(F::div(F::sub(x, c), F::add(F::mul(s, s), 1.0)));
  };
  // c [R,1], s a one-element scalar; x of rank 3 with c [2,3,1].
  Outcome o = check_pattern<3>("column", body, {Shape{2, 3, 50}, Shape{2, 3, 1}, Shape{1}});
  INFO(o.text);
  CHECK(o.fused.forward < o.unfused.forward);
  CHECK_THAT(o.text, Contains("(one per row)"));
  // A row [C] and a column [R,1] operand in one op.
  auto outer = [](const Tensor& x, const Tensor& r, const Tensor& c) {
    return F::exp(F::mul(F::add(r, c), x));
  };
  // Rows of a block, and rows longer than a block (pieces of one row).
  for (int64_t c : {int64_t{33}, int64_t{300}}) {
    o = check_pattern<3>("row_and_column", outer, {Shape{9, c}, Shape{c}, Shape{9, 1}});
    INFO(o.text);
    CHECK(o.fused.forward == 1);
  }
}

TEST_CASE("an operand broadcast any other way keeps its step apart", "[static][fusion][rows]") {
  // [3,1,8] over [3,4,8] is neither one row nor one value per row.
  auto body = [](const Tensor& x, const Tensor& m, const Tensor& w) {
    return F::tanh(F::add(F::mul(x, w), m));
  };
  const Outcome o =
      check_pattern<3>("other_broadcast", body, {Shape{3, 4, 8}, Shape{3, 1, 8}, Shape{3, 4, 8}});
  INFO(o.text);
  CHECK(o.fused.forward == o.unfused.forward);  // the add cuts the run: nothing to fuse
  CHECK_THAT(o.text, !Contains("by rows"));
}

TEST_CASE("row reductions feed and follow elementwise steps in one run", "[static][fusion][rows]") {
  // x - mean(x) over the last axis, and each reduction with and without keepdims.
  auto centred = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    const Tensor h = F::add(F::mul(x, w), b);
    const Tensor c = F::sub(h, F::mean(h, {-1}, true));
    return F::mul(c, F::sum(F::mul(c, c), {-1}, true));
  };
  Outcome o = check_pattern<3>("centred", centred, {Shape{6, 20}, Shape{20}, Shape{20}});
  INFO(o.text);
  CHECK(o.fused.forward == 1);
  CHECK(o.unfused.forward == 7);
  CHECK(count_of(o.text, R"(= mean\(scratch)") == 1);
  CHECK(count_of(o.text, R"(= sum\(scratch)") >= 1);

  auto max_shift = [](const Tensor& x, const Tensor& s, const Tensor& t) {
    const Tensor m = F::reshape(F::max(F::mul(x, s), {-1}), {4, 3, 1});
    return F::exp(F::sub(F::mul(x, s), m)) + t;
  };
  o = check_pattern<3>("max_shift", max_shift, {Shape{4, 3, 70}, Shape{1}, Shape{4, 3, 70}});
  INFO(o.text);
  CHECK(o.fused.forward < o.unfused.forward);
  CHECK(count_of(o.text, R"(= max\()") == 1);

  // One row: the reduction of the whole tensor.
  o = check_pattern<3>("one_row", centred, {Shape{1, 300}, Shape{300}, Shape{300}});
  INFO(o.text);
  CHECK(o.fused.forward == 1);
}

TEST_CASE("softmax and log_softmax over the last axis join a fused run", "[static][fusion][rows]") {
  auto body = [](const Tensor& x, const Tensor& mask, const Tensor& t) {
    const Tensor p = F::softmax(F::add(F::mul(x, 0.125), mask), -1);
    return F::mul(p, F::log_softmax(F::add(x, t), -1));
  };
  for (int64_t c : {int64_t{16}, int64_t{700}}) {  // rows per block, and one row per block
    const Outcome o = check_pattern<3>("softmax_rows", body, {Shape{5, c}, Shape{c}, Shape{5, c}});
    INFO(o.text);
    CHECK(o.fused.forward == 1);
    CHECK(o.unfused.forward == 6);
    CHECK(o.fused.backward < o.unfused.backward);
    CHECK(count_of(o.text, R"(= softmax_grad\(|= log_softmax_grad\()") >= 1);
  }
}

TEST_CASE("rows longer than a fused program takes keep the row op apart",
          "[static][fusion][rows]") {
  auto body = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    return F::softmax(F::add(F::mul(x, w), b), -1) * 2.0;
  };
  const Outcome o = check_pattern<3>("long_rows", body, {Shape{2, 3000}, Shape{3000}, Shape{1}});
  INFO(o.text);
  CHECK(o.fused.forward == 3);  // mul and add, softmax, mul_scalar
}

TEST_CASE("an attention-like block fuses scale, mask and softmax", "[static][fusion][rows]") {
  // Pre-norm: the input centred per row and scaled by a gain; scores of the normed rows with
  // their projection, scaled, masked per key, softmax; the weighted sum of the rows.
  auto body = [](const Tensor& x, const Tensor& gain, const Tensor& w, const Tensor& key_mask) {
    const Tensor n = F::mul(F::sub(x, F::mean(x, {-1}, true)), gain);
    const Tensor q = F::matmul(n, w);
    const Tensor scores = F::matmul(q, F::transpose(n));
    const Tensor p = F::softmax(F::add(F::mul(scores, 0.25), key_mask), -1);
    return F::matmul(p, n);
  };
  const Outcome o =
      check_pattern<4>("attention", body, {Shape{12, 16}, Shape{16}, Shape{16, 16}, Shape{12}});
  INFO(o.text);
  UNSCOPED_INFO("attention: forward steps " << o.unfused.forward << " -> " << o.fused.forward
                                            << ", backward " << o.unfused.backward << " -> "
                                            << o.fused.backward);
  // mean, sub and mul in one step, mul_scalar, add and softmax in another (the transpose and the
  // products stay).
  CHECK(o.fused.forward == o.unfused.forward - 4);
  CHECK_THAT(o.text, Contains("= softmax(scratch 0)"));
  CHECK(o.fused.backward < o.unfused.backward);
  CHECK(count_of(o.text, R"(fused_elementwise\s+\[fuses)") >= 3);
}

TEST_CASE("an LSTM cell's gates replay eager's bits fused", "[static][fusion][rows]") {
  // gates = linear(x) + linear(h) + bias; slices of the gates; sigmoid, tanh, mul, add.
  auto cell = [](const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& wx,
                 const Tensor& wh, const Tensor& bias) {
    const Tensor gates = F::add(F::add(F::linear(x, wx), F::linear(h, wh)), bias);
    const int64_t hidden = c.shape()[1];
    const Tensor i = F::slice(gates, 1, 0, hidden);
    const Tensor f = F::slice(gates, 1, hidden, 2 * hidden);
    const Tensor g = F::slice(gates, 1, 2 * hidden, 3 * hidden);
    const Tensor o = F::slice(gates, 1, 3 * hidden, 4 * hidden);
    const Tensor c2 = F::add(F::mul(F::sigmoid(f), c), F::mul(F::sigmoid(i), F::tanh(g)));
    return F::mul(F::sigmoid(o), F::tanh(c2));
  };
  const Outcome o = check_pattern<6>(
      "lstm_cell", cell,
      {Shape{4, 10}, Shape{4, 8}, Shape{4, 8}, Shape{32, 10}, Shape{32, 8}, Shape{32}});
  INFO(o.text);
  UNSCOPED_INFO("lstm cell: forward steps " << o.unfused.forward << " -> " << o.fused.forward
                                            << ", backward " << o.unfused.backward << " -> "
                                            << o.fused.backward);
  CHECK(o.fused.forward < o.unfused.forward);
  CHECK_THAT(o.text, Contains("(one row)"));  // the bias over the batch joins the gates' sum
}

TEST_CASE("a value per row dying at its reader keeps its scratch block until read",
          "[static][fusion][rows]") {
  // Without a backward nothing is saved: the max lives in scratch and dies at the sub, whose
  // output must not take its block (it is read per row while the block is written).
  StaticEnabled on;
  const StaticFusion fuse(true);
  for (DType dtype : {DType::Float32, DType::Float64}) {
    INFO(name(dtype));
    auto body = [](const Tensor& x, const Tensor& y) {
      return F::mul(F::tanh(F::sub(x, F::max(x, {-1}, true))), y);
    };
    auto f = static_graph(body, {.name = "column_dies"});
    auto v = static_graph(body, {.name = "column_dies_verified", .verify_every = 1});
    NoGradGuard no_grad;
    for (int call = 0; call < 3; ++call) {
      const Tensor x = rand({6, 40}, dtype, Device::cpu(), -2, 2);
      const Tensor y = rand({6, 40}, dtype, Device::cpu(), -2, 2);
      CHECK(bit_diff(f(x, y), body(x, y)) == "");
      CHECK(bit_diff(v(x, y), body(x, y)) == "");
    }
    const std::string text = f.schedule_text();
    INFO(text);
    CHECK(f.stats().cache[0].forward_steps == 1);
    CHECK_THAT(text, Contains("scratch 0 = max(in 0)"));
    CHECK_THAT(text, Contains("scratch 1 = sub(in 0, scratch 0 (one per row))"));
  }
}
