// Two traces that ran other ops: a size made from the dynamic dimensions may have been 1 at one of
// them (a pooled map of 1x1, whose mean's gradient needs no broadcast), so a third trace tells
// which one was the odd one before the dimensions are blamed; code whose ops really follow the
// size (a loop over it) still stays static, once the third trace agrees with neither.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;

namespace {

// Two unpadded 3x3 convolutions, each pooled by 2, then the mean over the map: at 12x12 the last
// map is 1x1, at 14x14 and beyond 2x2 or larger.
struct SmallCnn {
  Tensor w1 = randn({4, 1, 3, 3}, DType::Float64), w2 = randn({4, 4, 3, 3}, DType::Float64);
  Tensor operator()(const Tensor& x) const {
    Tensor h = F::max_pool2d(F::relu(F::conv2d(x, w1)), 2);
    h = F::max_pool2d(F::relu(F::conv2d(h, w2)), 2);
    return F::sum(F::mean(h, {2, 3}));
  }
};

// The loss and the input's gradient through `sf` and eagerly at each size, bit for bit.
template <typename Sf>
void check_sizes(const SmallCnn& net, Sf& sf, const std::vector<int64_t>& sizes) {
  for (const int64_t s : sizes) {
    INFO("size " << s);
    Tensor a = randn({2, 1, s, s}, DType::Float64), b = a.detach();
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    Tensor la = sf(a), lb = net(b);
    la.backward();
    lb.backward();
    CHECK(bit_diff(la, lb) == "");
    CHECK(bit_diff(a.grad(), b.grad()) == "");
  }
}

}  // namespace

TEST_CASE("a trace where a pooled map is 1x1 does not keep the image size static",
          "[static][dynamic]") {
  manual_seed(3);
  const SmallCnn net;
  // The 1x1 trace first, then second, then replayed before the third trace: either way the next
  // size joins the other, never the 1x1 one.
  for (const std::vector<int64_t>& sizes :
       {std::vector<int64_t>{12, 14, 20, 24, 30}, std::vector<int64_t>{14, 12, 20, 24, 30},
        std::vector<int64_t>{12, 14, 12, 20, 24, 30}}) {
    auto sf = static_graph([&](const Tensor& x) { return net(x); }, {.name = "cnn"});
    check_sizes(net, sf, sizes);
    const StaticStats st = sf.stats();
    CHECK(st.traces == 3);         // 12, 14 and 20
    CHECK(st.sizes_planned == 2);  // 24 and 30
    CHECK(st.static_dims.empty());
    REQUIRE(st.dynamic_history.size() == 1);
    CHECK_THAT(st.dynamic_history[0],
               Catch::Contains(sizes[0] == 14 ? "traces 1 and 3" : "traces 2 and 3"));
    CHECK(st.hits == static_cast<int64_t>(sizes.size()) - 3);  // planned sizes, 12 again
    // 12 again is its own trace's; 13 (a 1x1 map too) cannot join the family, and traces.
    check_sizes(net, sf, {12, 13});
    CHECK(sf.stats().traces == 4);
  }
}

TEST_CASE("ops that follow the size keep it static once a third trace agrees with neither",
          "[static][dynamic]") {
  // A loop over the rows: one op per row, so every two traces ran other ops.
  auto body = [](const Tensor& x) {
    Tensor s = F::slice(x, 0, 0, 1);
    for (int64_t i = 1; i < x.size(0); ++i) s = F::add(s, F::slice(x, 0, i, i + 1));
    return s;
  };
  auto sf = static_graph(body, {.name = "rows loop", .arg_names = {"x"}});
  NoGradGuard no_grad;
  for (const int64_t n : {3, 5, 4, 6}) {
    const Tensor x = randn({n, 2});
    CHECK(bit_diff(sf(x), body(x)) == "");
    CHECK(sf.stats().static_dims.size() == (n == 3 || n == 5 ? 0u : 1u));
  }
  const StaticStats st = sf.stats();
  CHECK(st.traces == 4);
  CHECK(st.dynamic.empty());
  REQUIRE(st.static_dims.size() == 1);
  CHECK_THAT(st.static_dims[0],
             Catch::Contains("argument 0 'x' dim 0 stays static: the forward ran"));
  CHECK_THAT(st.static_dims[0], Catch::Contains("(traces 2 and 3)"));
}

TEST_CASE("a branch on a size is not taken for a size of 1 made from it", "[static][dynamic]") {
  // relu above 4, tanh up to it: 4 and 5 differ, and 6 agrees with 5. A family of 5 and 6 would
  // plan 3 and 2 with relu, so it is refused, and the dimension stays static.
  auto body = [](const Tensor& x) { return x.size(0) > 4 ? F::relu(x) : F::tanh(x); };
  auto sf = static_graph(body, {.name = "threshold", .arg_names = {"x"}});
  NoGradGuard no_grad;
  for (const int64_t n : {4, 5, 6, 3, 2, 7, 9}) {
    INFO("size " << n);
    const Tensor x = randn({n, 2});
    CHECK(bit_diff(sf(x), body(x)) == "");
  }
  const StaticStats st = sf.stats();
  CHECK(st.traces == 7);
  CHECK(st.dynamic.empty());
  REQUIRE(st.static_dims.size() == 1);
  CHECK_THAT(st.static_dims[0],
             Catch::Contains("argument 0 'x' dim 0 stays static: step 0 (forward) is tanh at one "
                             "traced size and relu at another, and a family of traces 2 and 3 "
                             "would plan trace 1's sizes with the ops of the others (traces 1, 2 "
                             "and 3)"));
}

TEST_CASE("a trace of an empty batch divides a mean over another axis by that axis's extent",
          "[static][dynamic]") {
  // At batch 0 a mean's gradient over an axis of 4 once divided by numel(x) / numel(gy) = 0; with
  // a second trace at batch 4 the divisor read as the batch size, and later sizes were wrong.
  StaticEnabled on;
  manual_seed(12);
  Tensor w = randn({4, 3}).set_requires_grad();
  auto body = [&](const Tensor& x) { return F::sum(F::mean(F::linear(x, w), {1})); };
  auto f = static_graph(body, {.name = "empty_batch_mean"});
  for (const int64_t batch : {0, 4, 8, 16, 5}) {
    INFO("batch " << batch);
    const Tensor x = randn({batch, 3});
    w.set_grad(Tensor());
    const Tensor want = body(x);
    want.backward();
    const Tensor want_grad = w.grad();
    w.set_grad(Tensor());
    const Tensor got = f(x);
    got.backward();
    CHECK(bit_diff(got, want) == "");
    CHECK(bit_diff(w.grad(), want_grad) == "");
  }
  CHECK(f.stats().hits >= 2);  // the later sizes are planned, not traced
}
