// The float32 tanh kernel (our own polynomial and exp, not libm; kernels/cpu/unary.cc) against
// double-precision std::tanh rounded to float, over a dense sweep of floats and the special
// values. An exhaustive sweep of every float in [0, 10] finds at most 1 ulp; this one asserts 2.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "encore/encore.h"

using namespace encore;

namespace {

// tanh of each value through the dispatched Float32 kernel.
std::vector<float> kernel_tanh(const std::vector<float>& xs) {
  Tensor x = Tensor::empty({static_cast<int64_t>(xs.size())}, DType::Float32);
  std::copy(xs.begin(), xs.end(), x.data<float>());
  return F::tanh(x).to_vector<float>();
}

// How many floats apart a and b are (+0 and -0 count as one).
int64_t ulp_distance(float a, float b) {
  auto ordered = [](float f) -> int64_t {
    const int32_t i = std::bit_cast<int32_t>(f);
    return i < 0 ? int64_t{std::numeric_limits<int32_t>::min()} - i : i;
  };
  return std::abs(ordered(a) - ordered(b));
}

}  // namespace

TEST_CASE("float32 tanh is within 2 ulp of the correctly rounded result", "[ops][tanh]") {
  // Every 251st float in [0, 10] (past 9.01 tanh rounds to 1), every float within 2^17 of the
  // switch between the kernel's two formulas at 0.75, and their negatives.
  const uint32_t ten = std::bit_cast<uint32_t>(10.0f), switch_at = std::bit_cast<uint32_t>(0.75f);
  std::vector<float> positive;
  for (uint32_t u = 0; u <= ten; u += 251) positive.push_back(std::bit_cast<float>(u));
  for (uint32_t u = switch_at - (1u << 17); u <= switch_at + (1u << 17); ++u)
    positive.push_back(std::bit_cast<float>(u));

  int64_t max_ulp = 0;
  float worst = 0;
  constexpr size_t kChunk = size_t{1} << 19;  // a few MB per tensor
  for (size_t begin = 0; begin < positive.size(); begin += kChunk) {
    const size_t end = std::min(positive.size(), begin + kChunk);
    std::vector<float> xs(positive.begin() + begin, positive.begin() + end);
    for (size_t i = begin; i < end; ++i) xs.push_back(-positive[i]);
    const std::vector<float> ys = kernel_tanh(xs);
    for (size_t i = 0; i < xs.size(); ++i) {
      const int64_t d = ulp_distance(ys[i], static_cast<float>(std::tanh(double{xs[i]})));
      if (d > max_ulp) {
        max_ulp = d;
        worst = xs[i];
      }
    }
  }
  INFO("worst at x = " << worst);
  CHECK(max_ulp <= 2);
}

TEST_CASE("float32 tanh of special values", "[ops][tanh]") {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kMax = std::numeric_limits<float>::max();
  constexpr float kTiny = std::numeric_limits<float>::denorm_min();
  const std::vector<float> xs = {
      0.0f,  -0.0f,  kInf,   -kInf,  kMax,    -kMax,
      1e30f, -1e30f, 88.8f,  -88.8f, 10.0f,   -10.0f,
      9.5f,  kTiny,  -kTiny, 1e-20f, -1e-20f, std::numeric_limits<float>::quiet_NaN()};
  const std::vector<float> ys = kernel_tanh(xs);
  for (size_t i = 0; i + 1 < xs.size(); ++i) {
    INFO("x = " << xs[i] << ", tanh(x) = " << ys[i]);
    CHECK(ys[i] == static_cast<float>(std::tanh(double{xs[i]})));
    CHECK(std::signbit(ys[i]) == std::signbit(xs[i]));
  }
  CHECK(ys[0] == 0.0f);
  CHECK(ys[2] == 1.0f);
  CHECK(ys[3] == -1.0f);
  CHECK(std::isnan(ys.back()));
}
