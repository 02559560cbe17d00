// Every routine of functions.h through the op harness (forward against naive references in
// float64 and float32, numerical gradients; the cases are in op_cases.h, which the CUDA tests
// share), plus focused checks of a few semantics.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "encore/functions.h"
#include "op_cases.h"
#include "op_harness.h"
#include "runtime/dispatcher.h"
#include "runtime/parallel.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::optest;
using Catch::Matchers::Contains;

namespace {

Tensor leaf64(std::initializer_list<double> v, const Shape& s) {
  Tensor t = tensor(v, s, DType::Float64);
  t.set_requires_grad();
  return t;
}

Tensor labels_of(std::initializer_list<double> v, DType dt) {
  return tensor(v, {static_cast<int64_t>(v.size())}, dt);
}

}  // namespace

// ---- The harness over every routine ------------------------------------------------------

TEST_CASE("elementwise binary ops with broadcasting", "[ops]") {
  check_ops(binary_cases());
}
TEST_CASE("tensor-scalar ops and pow", "[ops]") {
  check_ops(scalar_cases());
}
TEST_CASE("elementwise unary ops and clone", "[ops]") {
  check_ops(unary_cases());
}
TEST_CASE("matmul and linear", "[ops]") {
  check_ops(linalg_cases());
}
TEST_CASE("sum, mean, max and sum_to", "[ops]") {
  check_ops(reduction_cases());
}
TEST_CASE("float32 sums and means of millions of terms keep their accuracy", "[ops][reduce]") {
  // One running float32 total per lane (or per output) drifted: 0.100596 and 0.104858.
  auto near = [](const Tensor& t, double want) {
    for (const double v : t.to_vector<double>())
      if (!(std::abs(v / want - 1) < 1e-5)) return v;
    return want;
  };
  {
    const Tensor x = full({20000000}, 0.1);
    CHECK(near(F::mean(x), 0.1) == 0.1);
    CHECK(near(F::sum(x), 2e6) == 2e6);
    CHECK(near(F::mean(F::reshape(x, {4, 5000000}), {1}), 0.1) == 0.1);
    CHECK(near(F::global_avg_pool2d(F::reshape(x, {1, 2, 2500, 4000})), 0.1) == 0.1);
  }
  {
    const Tensor x = full({10000000, 2}, 0.1);
    CHECK(near(F::mean(x, {0}), 0.1) == 0.1);
    // Kept axes between reduced ones, and reduced ones between kept ones.
    CHECK(near(F::mean(F::reshape(x, {2, 5000000, 2}), {0, 1}), 0.1) == 0.1);
    CHECK(near(F::mean(F::reshape(x, {5000000, 2, 2}), {0, 2}), 0.1) == 0.1);
    CHECK(near(F::mean(F::reshape(x, {2, 5000000, 2}), {1}), 0.1) == 0.1);
  }
}

TEST_CASE("sum, mean and max over any axes match a float64 reference at any thread count",
          "[ops][reduce]") {
  auto as = [](const Tensor& x, DType d) {
    Tensor out = empty(x.shape(), d);
    copy_(out, x);
    return out;
  };
  const std::vector<std::pair<Shape, std::vector<int>>> cases = {
      {{3, 700, 5}, {0}},         {{3, 700, 5}, {1}},       {{3, 700, 5}, {0, 2}},
      {{3, 700, 5}, {1, 2}},      {{40, 3, 90, 2}, {0, 2}}, {{40, 3, 90, 2}, {1, 3}},
      {{40, 3, 90, 2}, {0, 3}},   {{9000, 37}, {0}},        {{37, 9000}, {0}},
      {{300, 5, 200}, {0, 1, 2}}, {{5, 1, 7}, {0, 1}}};
  for (const auto& [shape, axes] : cases) {
    CAPTURE(shape, axes);
    const Tensor x = rand(shape, DType::Float32, Device::cpu(), -1, 1);
    const std::vector<double> want = F::sum(as(x, DType::Float64), axes).to_vector<double>();
    const std::vector<double> want_max = F::max(as(x, DType::Float64), axes).to_vector<double>();
    auto run = [&](int threads) {
      const int before = num_threads();
      set_num_threads(threads);
      std::vector<Tensor> out = {F::sum(x, axes), F::mean(x, axes), F::max(x, axes)};
      set_num_threads(before);
      return out;
    };
    const std::vector<Tensor> one = run(1), many = run(4);
    for (size_t i = 0; i < one.size(); ++i) CHECK(testing::bit_diff(one[i], many[i]) == "");
    const std::vector<double> sum = one[0].to_vector<double>(), max = one[2].to_vector<double>();
    REQUIRE(sum.size() == want.size());
    const double count = want.empty() ? 0.0 : static_cast<double>(x.numel()) / want.size();
    for (size_t i = 0; i < want.size(); ++i) {
      CHECK(sum[i] == Approx(want[i]).margin(1e-6 * count));
      CHECK(max[i] == want_max[i]);  // float32 values: exact in float64
    }
  }
}

TEST_CASE("reshape, flatten, permute, transpose, broadcast_to, concat, split, slice", "[ops]") {
  check_ops(layout_cases());
}
TEST_CASE("softmax, log_softmax, losses and accuracy", "[ops]") {
  check_ops(softmax_loss_cases());
}
TEST_CASE("where and comparisons", "[ops]") {
  check_ops(selection_cases());
}
TEST_CASE("NaN inputs give PyTorch's values and gradients", "[ops][nan]") {
  check_ops(nan_cases());
}

// ---- Focused checks ----------------------------------------------------------------------

TEST_CASE("float32 softmax rows of millions of elements keep their sums accurate", "[ops]") {
  // One running float sum over 2^21 terms drifts by ~1e-5 of the row's log-sum-exp; summed in
  // blocks (kernels/cpu/softmax_util.h) the error stays within a few ulps of a double sum.
  manual_seed(21);
  const int64_t n = int64_t{1} << 21;
  const Tensor x = rand({1, n}, DType::Float32, Device::cpu(), -4, 4);
  const auto xv = x.to_vector<float>();
  double m = xv[0];
  for (float v : xv) m = std::max(m, static_cast<double>(v));
  double sum = 0;
  for (float v : xv) sum += std::exp(static_cast<double>(v) - m);
  const double lse = m + std::log(sum);
  const auto ls = F::log_softmax(x, -1).to_vector<float>();
  CHECK(std::abs(ls[0] - (xv[0] - lse)) < 2e-6);
  double total = 0;
  for (float v : F::softmax(x, -1).to_vector<float>()) total += v;
  CHECK(std::abs(total - 1) < 1e-5);
  const Tensor label = zeros({1}, DType::Int64);
  CHECK(std::abs(F::softmax_cross_entropy(x, label).item<float>() - (lse - xv[0])) < 2e-6);
}

TEST_CASE("softmax_cross_entropy matches a hand computation", "[ops]") {
  for (DType ldt : {DType::Int32, DType::Int64}) {
    CAPTURE(name(ldt));
    Tensor logits = leaf64({1, 2, 3, 1, 1, 1}, {2, 3});
    // Row 0: logsumexp(1,2,3) - 3; row 1: log 3.
    const double l0 = 0.40760596444438013, l1 = 1.0986122886681098;
    Tensor loss = F::softmax_cross_entropy(logits, labels_of({2, 0}, ldt));
    CHECK(loss.shape() == Shape{});
    CHECK(loss.item<double>() == Approx((l0 + l1) / 2).epsilon(1e-14));
    loss.backward();
    const std::vector<double> p = {0.09003057317038048, 0.2447284710547977, 0.665240955774822};
    const std::vector<double> want = {p[0] / 2,          p[1] / 2, (p[2] - 1) / 2,
                                      (1.0 / 3 - 1) / 2, 1.0 / 6,  1.0 / 6};
    const auto g = logits.grad().to_vector<double>();
    REQUIRE(g.size() == 6);
    for (int i = 0; i < 6; ++i) CHECK(g[i] == Approx(want[i]).margin(1e-14));

    // Row 1 ignored: the mean is over row 0 alone and row 1 gets no gradient.
    Tensor logits2 = leaf64({1, 2, 3, 1, 1, 1}, {2, 3});
    Tensor loss2 = F::softmax_cross_entropy(logits2, labels_of({2, -1}, ldt));
    CHECK(loss2.item<double>() == Approx(l0).epsilon(1e-14));
    loss2.backward();
    const auto g2 = logits2.grad().to_vector<double>();
    const std::vector<double> want2 = {p[0], p[1], p[2] - 1, 0, 0, 0};
    for (int i = 0; i < 6; ++i) CHECK(g2[i] == Approx(want2[i]).margin(1e-14));

    // float32 logits give the same value.
    Tensor logits32 = tensor({1, 2, 3, 1, 1, 1}, {2, 3}, DType::Float32);
    CHECK(F::softmax_cross_entropy(logits32, labels_of({2, 0}, ldt)).item<double>() ==
          Approx((l0 + l1) / 2).epsilon(1e-6));
  }
}

TEST_CASE("accuracy leaves ignored samples out of the count", "[ops]") {
  // argmax per row: 2, 0, 1, 1.
  Tensor logits = tensor({0.1, 0.2, 0.9, 0.8, 0.1, 0.1, 0.0, 0.5, 0.2, 0.3, 0.7, 0.1}, {4, 3});
  CHECK(F::accuracy(logits, labels_of({2, 0, 2, 1}, DType::Int32)).item<double>() == Approx(0.75));
  // Sample 2 (wrong) ignored: 3 of 3.
  CHECK(F::accuracy(logits, labels_of({2, 0, -1, 1}, DType::Int64)).item<double>() == Approx(1.0));
  // Samples 0 and 3 ignored with a custom label: 1 of 2.
  CHECK(F::accuracy(logits, labels_of({7, 0, 0, 7}, DType::Int32), 7).item<double>() ==
        Approx(0.5));
  CHECK_FALSE(F::accuracy(logits, labels_of({2, 0, 2, 1}, DType::Int32)).requires_grad());
}

TEST_CASE("max shares its gradient among tied maxima", "[ops]") {
  for (DType dt : {DType::Float64, DType::Float32}) {
    CAPTURE(name(dt));
    Tensor x = tensor({1, 3, 3}, {3}, dt);
    x.set_requires_grad();
    Tensor m = F::max(x);
    CHECK(m.item<double>() == 3);
    m.backward();
    CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0.5, 0.5});

    Tensor y = tensor({1, 3, 3, 2, 2, 0, 5, 5, 5}, {3, 3}, dt);
    y.set_requires_grad();
    F::max(y, {1}).backward(tensor({1, 2, 3}, {3}, dt));
    const std::vector<double> want = {0, 0.5, 0.5, 1, 1, 0, 1, 1, 1};
    const auto g = y.grad().to_vector<double>();
    for (size_t i = 0; i < want.size(); ++i) CHECK(g[i] == Approx(want[i]).margin(1e-6));
  }
}

TEST_CASE("out-of-range labels raise an Error", "[ops]") {
  Tensor logits = tensor({1, 2, 3, 4, 5, 6}, {2, 3}, DType::Float64);
  for (DType ldt : {DType::Int32, DType::Int64}) {
    CAPTURE(name(ldt));
    for (double bad : {3.0, 100.0, -2.0}) {
      CAPTURE(bad);
      const Tensor labels = labels_of({0, bad}, ldt);
      CHECK_THROWS_AS(F::softmax_cross_entropy(logits, labels), Error);
      // Names the op, the offending label and the valid range.
      CHECK_THROWS_WITH(F::softmax_cross_entropy(logits, labels),
                        Contains("softmax_cross_entropy") &&
                            Contains(absl::StrCat("label ", static_cast<int>(bad))) &&
                            Contains("out of range") && Contains("3"));
    }
    // The ignore label itself is fine even though it is out of range.
    CHECK_NOTHROW(F::softmax_cross_entropy(logits, labels_of({0, -5}, ldt), -5));
  }
}

TEST_CASE("float to integer conversion is NaN-safe and saturates", "[ops]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::initializer_list<double> values = {nan, inf, -inf, 1e20, -1e20, 3.7, -3.7};
  const Shape shape{static_cast<int64_t>(values.size())};
  for (DType from : {DType::Float32, DType::Float64}) {
    CAPTURE(name(from));
    const Tensor src = tensor(values, shape, from);

    using L32 = std::numeric_limits<int32_t>;
    const std::vector<int32_t> want32 = {0, L32::max(), L32::min(), L32::max(), L32::min(), 3, -3};
    Tensor dst32 = zeros(shape, DType::Int32);
    copy_(dst32, src);
    CHECK(dst32.to_vector<int32_t>() == want32);
    Tensor out32 = empty(shape, DType::Int32);
    dispatch(Op::Copy, {src}, {out32});
    CHECK(out32.to_vector<int32_t>() == want32);

    using L64 = std::numeric_limits<int64_t>;
    const std::vector<int64_t> want64 = {0, L64::max(), L64::min(), L64::max(), L64::min(), 3, -3};
    Tensor dst64 = zeros(shape, DType::Int64);
    copy_(dst64, src);
    CHECK(dst64.to_vector<int64_t>() == want64);
    Tensor out64 = empty(shape, DType::Int64);
    dispatch(Op::Copy, {src}, {out64});
    CHECK(out64.to_vector<int64_t>() == want64);
  }
  // Just inside and just outside int32's range.
  const Tensor edge = tensor(
      {2147483647.0, 2147483647.9, 2147483648.0, -2147483648.0, -2147483648.9, -2147483649.0}, {6},
      DType::Float64);
  Tensor edge32 = zeros({6}, DType::Int32);
  copy_(edge32, edge);
  CHECK(edge32.to_vector<int32_t>() == std::vector<int32_t>{2147483647, 2147483647, 2147483647,
                                                            -2147483647 - 1, -2147483647 - 1,
                                                            -2147483647 - 1});

  SECTION("the fill kernel") {  // fill_ refuses such values (errors_test); the kernel converts
    auto fill = [](const Tensor& t, double v) {
      dispatch(Op::Fill, {t}, {}, AttrBlob::of(ScalarAttrs{v}));
    };
    Tensor t = zeros({5}, DType::Int32);
    fill(t, 1e20);
    CHECK(t.to_vector<int32_t>() == std::vector<int32_t>(5, std::numeric_limits<int32_t>::max()));
    fill(t, -inf);
    CHECK(t.to_vector<int32_t>() == std::vector<int32_t>(5, std::numeric_limits<int32_t>::min()));
    fill(t, nan);
    CHECK(t.to_vector<int32_t>() == std::vector<int32_t>(5, 0));
    fill(t, -3.7);
    CHECK(t.to_vector<int32_t>() == std::vector<int32_t>(5, -3));
    Tensor u = zeros({3}, DType::Int64);
    fill(u, 1e20);
    CHECK(u.to_vector<int64_t>() == std::vector<int64_t>(3, std::numeric_limits<int64_t>::max()));
  }
}

TEST_CASE("max over non-empty axes of a tensor with an empty one gives an empty result", "[ops]") {
  // It refused any tensor with a zero-size dimension (torch.amax gives the empty result).
  for (const DType dt : {DType::Float32, DType::Float64}) {
    CAPTURE(name(dt));
    Tensor x = zeros({0, 3}, dt).set_requires_grad();
    const Tensor y = F::max(x, {1});
    CHECK(y.shape() == Shape{0});
    CHECK(F::max(x, {-1}, true).shape() == Shape{0, 1});
    CHECK(F::max(zeros({2, 0, 3}, dt), {0, 2}).shape() == Shape{0});
    F::sum(y).backward();
    CHECK(x.grad().shape() == Shape{0, 3});
  }
}

TEST_CASE("reductions and softmax take axis 0 or -1 of a 0-d tensor, as PyTorch", "[ops]") {
  using ReduceFn = Tensor (*)(const Tensor&, std::vector<int>, bool);
  for (const ReduceFn fn : {ReduceFn(&F::sum), ReduceFn(&F::mean), ReduceFn(&F::max)}) {
    for (const int axis : {0, -1}) {
      for (const bool keepdims : {false, true}) {
        CAPTURE(axis, keepdims);
        Tensor x = full({}, 2.5, DType::Float64).set_requires_grad();
        const Tensor y = fn(x, {axis}, keepdims);
        CHECK(y.shape() == Shape{});
        CHECK(y.item<double>() == 2.5);
        y.backward();
        CHECK(x.grad().item<double>() == 1.0);
      }
    }
  }
  for (const int axis : {0, -1}) {
    CAPTURE(axis);
    Tensor x = full({}, 2.5, DType::Float64).set_requires_grad();
    const Tensor s = F::softmax(x, axis);
    CHECK(s.shape() == Shape{});
    CHECK(s.item<double>() == 1.0);
    const Tensor l = F::log_softmax(x, axis);
    CHECK(l.shape() == Shape{});
    CHECK(l.item<double>() == 0.0);
    (s + l).backward();
    CHECK(x.grad().item<double>() == 0.0);
  }
}

TEST_CASE("max propagates NaN", "[ops]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::Float64, DType::Float32}) {
    CAPTURE(name(dt));
    CHECK(std::isnan(F::max(tensor({1, nan, 3}, {3}, dt)).item<double>()));
    CHECK(std::isnan(F::max(tensor({nan, 1, 3}, {3}, dt)).item<double>()));
    CHECK(std::isnan(F::max(tensor({1, 3, nan}, {3}, dt)).item<double>()));
    CHECK(F::max(tensor({1, 3, 2}, {3}, dt)).item<double>() == 3);

    // Each kernel path (whole tensor, last axis, first axis, inner and outer axes; rows
    // longer than the lanes, with tails), with a NaN at one position after another: the
    // output element it folds into is NaN, the others are unchanged.
    const std::pair<Dims, std::vector<std::vector<int>>> cases[] = {
        {{70}, {{}}},
        {{3, 40}, {{}, {-1}, {0}}},
        {{40, 3}, {{0}, {-1}}},
        {{2, 35, 2}, {{1}, {0, 2}, {0}, {-1}}}};
    for (const auto& [dims, axes_sets] : cases) {
      const Shape shape{std::span<const int64_t>(dims)};
      for (const std::vector<int>& axes : axes_sets) {
        CAPTURE(dims_str(dims), axes);
        Dims kept = dims;
        for (int a : normalized_axes(axes, static_cast<int>(dims.size()))) kept[a] = 1;
        for (int64_t at = 0; at < shape.numel(); at += 3) {
          CAPTURE(at);
          RefTensor x = {dims, std::vector<double>(static_cast<size_t>(shape.numel()))};
          for (size_t i = 0; i < x.v.size(); ++i) x.v[i] = static_cast<double>(i * 37 % 101) - 50;
          x.v[static_cast<size_t>(at)] = nan;
          // The reference's std::max skips the NaN: right for every other output element.
          const RefTensor want = ref_reduce(x, axes, false, Reduction::Max);
          const int64_t nan_at = ref::broadcast_source(ref::unravel(at, dims), kept);
          const std::vector<double> got = F::max(tensor(x.v, shape, dt), axes).to_vector<double>();
          REQUIRE(got.size() == want.v.size());
          for (size_t i = 0; i < got.size(); ++i) {
            if (static_cast<int64_t>(i) == nan_at) {
              CHECK(std::isnan(got[i]));
            } else {
              CHECK(got[i] == want.v[i]);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("the Matmul kernel takes a 2-D operand shared by every batch", "[ops]") {
  // The routine always passes equal ranks; the kernel's documented contract also allows a 2-D
  // a or b with a 3-D other operand, with or without transposes.
  check_matmul_kernel_contract(Device::cpu());
}

TEST_CASE("rand's draws stay in [low, high) where the width is small beside low", "[ops]") {
  // lo + width * u rounds up to high for some u < 1 (1000 to 1001 in float32: about 1 draw in
  // 2^15); they take the value below high.
  manual_seed(0);
  const Tensor x = rand({1 << 20}, DType::Float32, Device::cpu(), 1000, 1001);
  const std::vector<float> v = x.to_vector<float>();
  CHECK(*std::max_element(v.begin(), v.end()) < 1001.0f);
  CHECK(*std::max_element(v.begin(), v.end()) == std::nextafter(1001.0f, 0.0f));
  CHECK(*std::min_element(v.begin(), v.end()) >= 1000.0f);
  // low == high draws low.
  CHECK(rand({3}, DType::Float64, Device::cpu(), 2.5, 2.5).to_vector<double>() ==
        std::vector<double>{2.5, 2.5, 2.5});
  // A width that is not finite in the dtype is refused, as PyTorch refuses it.
  CHECK_THROWS_WITH(rand({4}, DType::Float32, Device::cpu(), -3e38, 3e38),
                    Catch::Contains("uniform_: the range [-3e+38, 3e+38)") &&
                        Catch::Contains("not finite in float32"));
  CHECK_THROWS_WITH(rand({4}, DType::Float64, Device::cpu(), 0, INFINITY),
                    Catch::Contains("not finite in float64"));
  CHECK(
      std::isfinite(rand({1}, DType::Float64, Device::cpu(), -3e38, 3e38).to_vector<double>()[0]));
}
