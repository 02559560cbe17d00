// Which CUDA products run on encore's small GEMM kernels (runtime/small_gemm.h), from the
// GemmShape every backend and the planner take from a step's shapes (runtime/gemm_shape.h): the
// bounds on size and k of each layout, batches, empty and huge sizes. Host code: checked here on
// every build; the kernels themselves run in tests/nvrtc/ (emulated) and tests/cuda/.
#include <catch2/catch.hpp>

#include <cstdint>
#include <tuple>
#include <utility>

#include "runtime/gemm_shape.h"
#include "runtime/small_gemm.h"

using namespace encore;

TEST_CASE("small CUDA GEMMs: a linear's layout up to k 1024, b read down its columns up to k 512",
          "[small_gemm]") {
  REQUIRE(cuda_small_gemm_enabled());  // ENCORE_CUDA_SMALL_GEMM unset in the tests
  constexpr int64_t kBig = int64_t{1} << 40;
  // At most 2^23 multiply-adds.
  CHECK(cuda_small_gemm(false, true, 8192, 1024, 1, 1) == SmallGemm::kDot);
  CHECK(cuda_small_gemm(false, true, 8193, 1024, 1, 1) == SmallGemm::kNone);
  CHECK(cuda_small_gemm(false, false, 128, 128, 512, 1) == SmallGemm::kSerialK);
  CHECK(cuda_small_gemm(false, false, 129, 128, 512, 1) == SmallGemm::kNone);
  // k per layout.
  CHECK(cuda_small_gemm(false, true, 1, 1, 1024, 1) == SmallGemm::kDot);
  CHECK(cuda_small_gemm(false, true, 1, 1, 1025, 1) == SmallGemm::kNone);
  CHECK(cuda_small_gemm(false, false, 1, 1, 512, 1) == SmallGemm::kSerialK);
  CHECK(cuda_small_gemm(true, false, 1, 1, 512, 1) == SmallGemm::kSerialK);
  CHECK(cuda_small_gemm(true, false, 1, 1, 513, 1) == SmallGemm::kNone);
  CHECK(cuda_small_gemm(true, true, 4, 4, 4, 1) == SmallGemm::kNone);  // neither layout
  // One matrix, every size at least 1, and no overflow on huge ones.
  CHECK(cuda_small_gemm(false, true, 4, 4, 4, 2) == SmallGemm::kNone);
  for (const int64_t zero_at : {0, 1, 2}) {
    const int64_t m = zero_at == 0 ? 0 : 4, n = zero_at == 1 ? 0 : 4, k = zero_at == 2 ? 0 : 4;
    CHECK(cuda_small_gemm(false, true, m, n, k, 1) == SmallGemm::kNone);
  }
  CHECK(cuda_small_gemm(false, true, kBig, kBig, kBig, 1) == SmallGemm::kNone);
  CHECK(cuda_small_gemm(false, false, 1, kBig, 1, 1) == SmallGemm::kNone);
}

TEST_CASE("the planner and the kernels read one GemmShape from a step's shapes", "[small_gemm]") {
  // A linear over [2, 3, 40] rows: 6 x 40 by a [20, 40] weight.
  const GemmShape lin = linear_shape(Shape{2, 3, 40}, Shape{20, 40}, Shape{2, 3, 20});
  CHECK((lin.m == 6 && lin.n == 20 && lin.k == 40 && lin.trans_b && !lin.trans_a));
  CHECK(cuda_small_gemm(lin) == SmallGemm::kDot);
  // A weight gradient: gy^T x, gy [32, 100] read transposed, x [32, 784].
  const GemmShape dw =
      matmul_shape(Shape{32, 100}, Shape{32, 784}, Shape{100, 784}, MatmulAttrs{true, false});
  CHECK((dw.m == 100 && dw.n == 784 && dw.k == 32 && dw.lda == 100 && dw.batches == 1));
  CHECK(cuda_small_gemm(dw) == SmallGemm::kSerialK);
  // Its kernel sums gy's columns too (the bias gradient): where gy has 2 rows and 2 columns or
  // more (CUDA's Sum copies one row, and sums one column as a row), and only gy^T x.
  CHECK(cuda_small_gemm_sums_columns(dw));
  for (const auto& [k, m] : {std::pair<int64_t, int64_t>{1, 100}, {32, 1}, {513, 100}}) {
    INFO("k " << k << ", m " << m);
    CHECK_FALSE(cuda_small_gemm_sums_columns(
        matmul_shape(Shape{k, m}, Shape{k, 784}, Shape{m, 784}, MatmulAttrs{true, false})));
  }
  CHECK_FALSE(cuda_small_gemm_sums_columns(
      matmul_shape(Shape{100, 32}, Shape{32, 784}, Shape{100, 784}, MatmulAttrs{false, false})));
  // Batched: cuBLAS's.
  const GemmShape bmm =
      matmul_shape(Shape{4, 8, 16}, Shape{4, 16, 8}, Shape{4, 8, 8}, MatmulAttrs{false, false});
  CHECK(bmm.batches == 4);
  CHECK(cuda_small_gemm(bmm) == SmallGemm::kNone);
}

TEST_CASE(
    "a weight gradient's small kernel updates its parameters where its warps can count the step",
    "[small_gemm]") {
  // MlpSmall's weight gradients: gy^T x with their biases' column sums.
  for (const auto& [k, m, n] :
       {std::tuple<int64_t, int64_t, int64_t>{32, 100, 784}, {32, 100, 100}, {32, 10, 100}}) {
    INFO("k " << k << ", m " << m << ", n " << n);
    const GemmShape g =
        matmul_shape(Shape{k, m}, Shape{k, n}, Shape{m, n}, MatmulAttrs{true, false});
    CHECK(cuda_small_gemm_updates_parameters(g, true));
    CHECK(cuda_small_gemm_updates_parameters(g, false));
  }
  // Not a weight gradient's layout, or a product cuBLAS runs (MlpLarge's first: 784 x 1000 x
  // 100 multiply-adds), no.
  CHECK_FALSE(cuda_small_gemm_updates_parameters(
      matmul_shape(Shape{100, 1000}, Shape{100, 784}, Shape{1000, 784}, MatmulAttrs{true, false}),
      true));
  CHECK_FALSE(cuda_small_gemm_updates_parameters(
      matmul_shape(Shape{100, 32}, Shape{32, 784}, Shape{100, 784}, MatmulAttrs{false, false}),
      false));
  CHECK_FALSE(cuda_small_gemm_updates_parameters(
      matmul_shape(Shape{513, 8}, Shape{513, 8}, Shape{8, 8}, MatmulAttrs{true, false}), false));
  // Its bias only where the kernel sums gy's columns (k of 1 is a copy).
  const GemmShape one_row =
      matmul_shape(Shape{1, 100}, Shape{1, 784}, Shape{100, 784}, MatmulAttrs{true, false});
  CHECK(cuda_small_gemm_updates_parameters(one_row, false));
  CHECK_FALSE(cuda_small_gemm_updates_parameters(one_row, true));
  // A tall, narrow weight: one block of four warps per row (n <= 128), so 2^18 rows would be 2^20
  // arrivals, past what a step counter keeps.
  const int64_t rows = kMaxStepArrivals / 4;
  CHECK(cuda_small_gemm_updates_parameters(
      matmul_shape(Shape{2, rows - 1}, Shape{2, 8}, Shape{rows - 1, 8}, MatmulAttrs{true, false}),
      true));
  CHECK_FALSE(cuda_small_gemm_updates_parameters(
      matmul_shape(Shape{2, rows}, Shape{2, 8}, Shape{rows, 8}, MatmulAttrs{true, false}), true));
}
