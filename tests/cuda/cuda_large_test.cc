// Tensors of more than 2^31 elements on CUDA, forward and backward, giving the values smaller ones
// give: a product with a size past int runs on cuBLAS's 64-bit entry points (blas.cu), and a
// convolution whose x has more elements than cuDNN's descriptors count runs as calls over parts
// of its batch (conv.cc). Each case holds up to about 40 GiB of device memory, so the cases are
// hidden from a plain run (the tag [.]) and run where they are named ("[large]":
// scripts/gpu/on-device.sh does); where the device has no room for them they fail with the
// allocator's out-of-memory error. Each case empties the allocator's cache when it ends.
#include <catch2/catch.hpp>

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "runtime/allocator.h"
#include "tests/cuda/cuda_test_util.h"

namespace encore::testing {
namespace {

constexpr int64_t kRows = int64_t{INT_MAX} + 34;  // [kRows, 1]: m past cuBLAS's int

// The element of x at `index` (one per dimension).
float at(const Tensor& x, std::initializer_list<int64_t> index) {
  Tensor v = x;
  int axis = 0;
  for (int64_t i : index) {
    v = F::slice(v, axis, i, i + 1);
    ++axis;
  }
  return v.item<float>();
}

// A float32 tensor of `shape` on cuda:0, zeros but `values` at flat indices (made on the host:
// slice is a copy, so a fill of a slice would not reach the tensor).
Tensor sparse(const Shape& shape, std::initializer_list<std::pair<int64_t, float>> values) {
  Tensor host = zeros(shape, DType::Float32);
  for (const auto& [i, v] : values) host.data<float>()[i] = v;
  return host.to(kCuda);
}

// The largest and the smallest value of x.
std::pair<float, float> extremes(const Tensor& x) {
  return {F::max(x).item<float>(), -F::max(F::neg(x)).item<float>()};
}

// The device memory the case held goes back when it ends, for the next case.
struct EmptiesCache {
  ~EmptiesCache() { allocator_for(kCuda).empty_cache(); }
};

// a [kRows, 1]: zeros but -2 in the first row, 1 in the middle one and 5 in the last.
Tensor sparse_column() {
  return sparse({kRows, 1}, {{0, -2.0f}, {kRows / 2, 1.0f}, {kRows - 1, 5.0f}});
}

TEST_CASE("a matmul of more than 2^31 rows runs on cuda, forward and backward",
          "[cuda][ops][matmul][large][.]") {
  const EmptiesCache empties;
  Tensor a = sparse_column();
  a.set_requires_grad();
  // w needs no gradient: its own (a^T gc, one output over 2^31 terms) is not what this tests.
  const Tensor w = full({1, 1}, 3, DType::Float32, kCuda);
  Tensor c = F::matmul(a, w);
  CHECK(c.shape() == Shape{kRows, 1});
  CHECK(at(c, {0, 0}) == -6);
  CHECK(at(c, {1, 0}) == 0);
  CHECK(at(c, {kRows / 2, 0}) == 3);
  CHECK(at(c, {kRows - 2, 0}) == 0);
  CHECK(at(c, {kRows - 1, 0}) == 15);
  CHECK(extremes(c) == std::pair<float, float>{15, -6});

  // grad a = gc w^T: m past int again; every row 3 * 7.
  c.backward(full({kRows, 1}, 7, DType::Float32, kCuda));
  c = Tensor();
  const Tensor ga = a.grad();
  REQUIRE(ga.defined());
  CHECK(at(ga, {0, 0}) == 21);
  CHECK(at(ga, {kRows - 1, 0}) == 21);
  CHECK(extremes(ga) == std::pair<float, float>{21, 21});
}

TEST_CASE("a linear with a bias over more than 2^31 rows runs on cuda",
          "[cuda][ops][linear][large][.]") {
  const EmptiesCache empties;
  const Tensor x = sparse_column();
  const Tensor w = full({1, 1}, 3, DType::Float32, kCuda),
               b = full({1}, 0.5, DType::Float32, kCuda);
  const Tensor y = F::linear(x, w, b);  // 3 x + 0.5
  CHECK(y.shape() == Shape{kRows, 1});
  CHECK(at(y, {0, 0}) == -5.5f);
  CHECK(at(y, {kRows / 2, 0}) == 3.5f);
  CHECK(at(y, {kRows - 1, 0}) == 15.5f);
  CHECK(extremes(y) == std::pair<float, float>{15.5f, -5.5f});
}

TEST_CASE("a convolution of more than 2^31 input elements runs on cuda, forward and backward",
          "[cuda][ops][conv][large][.]") {
  const EmptiesCache empties;
  // x [17, 8, 4096, 4096] (2.28e9 elements, 2^27 a sample: cuDNN takes 2 samples a call, the
  // last one alone): zeros but 1 at (0, 2, 5, 7) and -2 at (16, 7, 4095, 4095).
  constexpr int64_t kN = 17, kC = 8, kH = 4096, kW = 4096;
  static_assert(kN * kC * kH * kW > INT_MAX);
  constexpr int64_t kSample = kC * kH * kW;
  Tensor x = sparse({kN, kC, kH, kW}, {{(2 * kH + 5) * kW + 7, 1.0f}, {kN * kSample - 1, -2.0f}});
  x.set_requires_grad();
  // A 1x1 convolution to one channel: y = sum over c of (c + 1) x[c], plus 0.5.
  Tensor w = tensor({1, 2, 3, 4, 5, 6, 7, 8}, {1, kC, 1, 1}).to(kCuda).set_requires_grad();
  const Tensor b = tensor({0.5}, {1}).to(kCuda);
  Tensor y = F::conv2d(x, w, b);
  CHECK(y.shape() == Shape{kN, 1, kH, kW});
  CHECK(at(y, {0, 0, 5, 7}) == 3.5f);
  CHECK(at(y, {kN - 1, 0, kH - 1, kW - 1}) == -15.5f);
  CHECK(at(y, {1, 0, 0, 0}) == 0.5f);
  CHECK(extremes(y) == std::pair<float, float>{3.5f, -15.5f});

  // gx = 7 (c + 1) everywhere; gw = 7 times the sum of x's channel: 7 at c 2, -14 at c 7.
  y.backward(full({kN, 1, kH, kW}, 7, DType::Float32, kCuda));
  y = Tensor();
  const Tensor gx = x.grad(), gw = w.grad();
  REQUIRE(gx.defined());
  REQUIRE(gw.defined());
  CHECK(at(gx, {0, 0, 0, 0}) == 7);
  CHECK(at(gx, {kN - 1, 7, kH - 1, kW - 1}) == 56);
  CHECK(extremes(gx) == std::pair<float, float>{56, 7});
  CHECK(gw.to_vector<float>() == std::vector<float>{0, 0, 7, 0, 0, 0, 0, -14});
}

}  // namespace
}  // namespace encore::testing
