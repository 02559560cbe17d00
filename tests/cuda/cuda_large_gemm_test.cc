// Products with a size past 2^31 on CUDA: they run on cuBLAS's 64-bit entry points (blas.cu)
// and give the values a smaller product gives, forward and backward. The tensors take about
// 40 GiB of device memory, so the case is hidden from a plain run (the tag [.]) and runs where it
// is named ("[large]": scripts/gpu/on-device.sh does); where the device has no room for them it
// fails with the allocator's out-of-memory error.
#include <catch2/catch.hpp>

#include <climits>
#include <cstdint>
#include <utility>

#include "tests/cuda/cuda_test_util.h"

namespace encore::testing {
namespace {

constexpr int64_t kRows = int64_t{INT_MAX} + 34;  // c [kRows, 1]: m past cuBLAS's int

// The value at `row` of x [kRows, 1].
float at(const Tensor& x, int64_t row) {
  return F::slice(x, 0, row, row + 1).item<float>();
}

// The largest and the smallest value of x.
std::pair<float, float> extremes(const Tensor& x) {
  return {F::max(x).item<float>(), -F::max(F::neg(x)).item<float>()};
}

TEST_CASE("a matmul of more than 2^31 rows runs on cuda, forward and backward",
          "[cuda][ops][matmul][large][.]") {
  // a [kRows, 1]: zeros but -2 in the first row, 1 in the middle one and 5 in the last.
  Tensor a = zeros({kRows, 1}, DType::Float32, kCuda);
  fill_(F::slice(a, 0, 0, 1), -2);
  fill_(F::slice(a, 0, kRows / 2, kRows / 2 + 1), 1);
  fill_(F::slice(a, 0, kRows - 1, kRows), 5);
  a.set_requires_grad();
  // w needs no gradient: its own (a^T gc, one output over 2^31 terms) is not what this tests.
  const Tensor w = full({1, 1}, 3, DType::Float32, kCuda);
  Tensor c = F::matmul(a, w);
  CHECK(c.shape() == Shape{kRows, 1});
  CHECK(at(c, 0) == -6);
  CHECK(at(c, 1) == 0);
  CHECK(at(c, kRows / 2) == 3);
  CHECK(at(c, kRows - 2) == 0);
  CHECK(at(c, kRows - 1) == 15);
  CHECK(extremes(c) == std::pair<float, float>{15, -6});

  // grad a = gc w^T: m past int again; every row 3 * 7.
  c.backward(full({kRows, 1}, 7, DType::Float32, kCuda));
  c = Tensor();
  const Tensor ga = a.grad();
  REQUIRE(ga.defined());
  CHECK(at(ga, 0) == 21);
  CHECK(at(ga, kRows - 1) == 21);
  CHECK(extremes(ga) == std::pair<float, float>{21, 21});
}

}  // namespace
}  // namespace encore::testing
