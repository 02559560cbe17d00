// Tensors of more than 2^31 elements on CUDA, forward and backward, giving the values smaller ones
// give: a product with a size past int runs on cuBLAS's 64-bit entry points (blas.cu), and a
// convolution whose x has more elements than cuDNN's descriptors count runs as calls over parts
// of its batch (conv.cc). The tensors take up to about 40 GiB of device memory, so the cases are
// hidden from a plain run (the tag [.]) and runs where it
// is named ("[large]": scripts/gpu/on-device.sh does); where the device has no room for them it
// fails with the allocator's out-of-memory error.
#include <catch2/catch.hpp>

#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "tests/cuda/cuda_test_util.h"

namespace encore::testing {
namespace {

constexpr int64_t kRows = int64_t{INT_MAX} + 34;  // c [kRows, 1]: m past cuBLAS's int

// The value at `row` of x [kRows, 1].
float at(const Tensor& x, int64_t row) {
  return F::slice(x, 0, row, row + 1).item<float>();
}

// The element of x [N,C,H,W] at (n, c, h, w), a view.
Tensor element(const Tensor& x, int64_t n, int64_t c, int64_t h, int64_t w) {
  return F::slice(F::slice(F::slice(F::slice(x, 0, n, n + 1), 1, c, c + 1), 2, h, h + 1), 3, w,
                  w + 1);
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

TEST_CASE("a convolution of more than 2^31 input elements runs on cuda, forward and backward",
          "[cuda][ops][conv][large][.]") {
  // x [3, 8, 8192, 11000] (2.16e9 elements; cuDNN takes 2 samples a call, then the last one):
  // zeros but 1 at (0, 2, 5, 7) and -2 at (2, 7, 8191, 10999).
  constexpr int64_t kN = 3, kC = 8, kH = 8192, kW = 11000;
  static_assert(kN * kC * kH * kW > INT_MAX && 2 * kC * kH * kW <= INT_MAX);
  Tensor x = zeros({kN, kC, kH, kW}, DType::Float32, kCuda);
  fill_(element(x, 0, 2, 5, 7), 1);
  fill_(element(x, 2, 7, kH - 1, kW - 1), -2);
  x.set_requires_grad();
  // A 1x1 convolution to one channel: y = sum over c of (c + 1) x[c], plus 0.5.
  Tensor w = tensor({1, 2, 3, 4, 5, 6, 7, 8}, {1, kC, 1, 1}).to(kCuda).set_requires_grad();
  const Tensor b = tensor({0.5}, {1}).to(kCuda);
  Tensor y = F::conv2d(x, w, b);
  CHECK(y.shape() == Shape{kN, 1, kH, kW});
  CHECK(element(y, 0, 0, 5, 7).item<float>() == 3.5f);
  CHECK(element(y, 2, 0, kH - 1, kW - 1).item<float>() == -15.5f);
  CHECK(element(y, 1, 0, 0, 0).item<float>() == 0.5f);
  CHECK(extremes(y) == std::pair<float, float>{3.5f, -15.5f});

  // gx = 7 (c + 1) everywhere; gw = 7 times the sum of x's channel: 7 at c 2, -14 at c 7.
  y.backward(full({kN, 1, kH, kW}, 7, DType::Float32, kCuda));
  y = Tensor();
  const Tensor gx = x.grad(), gw = w.grad();
  REQUIRE(gx.defined());
  REQUIRE(gw.defined());
  CHECK(element(gx, 0, 0, 0, 0).item<float>() == 7);
  CHECK(element(gx, 2, 7, kH - 1, kW - 1).item<float>() == 56);
  CHECK(extremes(gx) == std::pair<float, float>{56, 7});
  CHECK(gw.to_vector<float>() == std::vector<float>{0, 0, 7, 0, 0, 0, 0, -14});
}

}  // namespace
}  // namespace encore::testing
