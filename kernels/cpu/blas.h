// GEMM through cblas (OpenBLAS) for the CPU kernels: row-major, float and double.
//
// OpenBLAS runs on one thread (ensure_single_threaded_blas); parallel_gemm splits a product into
// parts across parallel_for's threads itself. OpenBLAS's value of an element depends on where
// the element falls in its register tiles, so a product split differently differs in the last
// bits: the parts are a function of the shapes and num_threads() only, and a static schedule
// that runs them on its lanes (runtime/parallel.h) gets the eager bits.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <type_traits>

#include "runtime/comm_progress.h"
#include "runtime/error.h"
#include "runtime/op_traits.h"
#include "runtime/parallel.h"

namespace encore::kernels::cpu {

// Zeroes c[m,n] (rows ldc apart) for a product with beta 0, which then adds into it: OpenBLAS's
// own beta-0 pass is a slow loop (a quarter of a 100x784x32 product on Zen 4), and 0 + x is its
// x bit for bit, as it computes it.
template <typename T>
void zero_for_product(int64_t m, int64_t n, T* c, int64_t ldc) {
  if (ldc == n) {
    std::memset(c, 0, static_cast<size_t>(m * n) * sizeof(T));
    return;
  }
  for (int64_t r = 0; r < m; ++r) std::memset(c + r * ldc, 0, static_cast<size_t>(n) * sizeof(T));
}

// cblas's GEMM of T, row-major, alpha 1.
inline void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}
inline void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a,
                      int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                      int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), 1.0, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// Products up to this many multiply-adds with a side (m, n or k) of at most kSmallGemmSide run in
// small_gemm: OpenBLAS packs its operands into panels first, which costs more than the product
// itself at these sizes (an LSTM step at batch 1). So do all outer products (k = 1, a weight
// gradient at batch 1), whatever their size: each element is one multiplication, which the
// planner's MatmulAccumulate (kernels/cpu/matmul.cc) repeats.
inline constexpr int64_t kSmallGemmMacs = 1 << 16;
inline constexpr int64_t kSmallGemmSide = 8;

inline bool small_product(int64_t m, int64_t n, int64_t k) {
  return k == 1 || (m * n * k <= kSmallGemmMacs && std::min({m, n, k}) <= kSmallGemmSide);
}

// 32 bytes of T as one GCC vector (a ymm register with AVX; two xmm without), read and
// written unaligned.
template <typename T>
struct Vec32 {
  typedef T type __attribute__((vector_size(32)));
  static constexpr int kLanes = 32 / sizeof(T);
};

// c[i, 0:kVecs*lanes] of small_gemm's first form in registers: the first term written (or c's
// values when accumulating), then every p added in order; stored once. Element by element the
// operations and their order are the plain loop's, only the partial sums no longer pass through
// memory between two p.
template <int kVecs, typename T, typename At>
inline void small_gemm_row_block(At at, int64_t i, int64_t k, const T* b, int64_t ldb, T* ci,
                                 bool accumulate) {
  using V = typename Vec32<T>::type;
  constexpr int kL = Vec32<T>::kLanes;
  V acc[kVecs];
  int64_t p = 0;
  if (accumulate || k == 0) {
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v) {
      if (accumulate)
        std::memcpy(&acc[v], ci + v * kL, sizeof(V));
      else
        acc[v] = V{};
    }
  } else {
    const T s = at(i, 0);
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v) {
      V bv;
      std::memcpy(&bv, b + v * kL, sizeof(V));
      acc[v] = s * bv;
    }
    p = 1;
  }
  for (; p < k; ++p) {
    const T s = at(i, p);
    const T* bp = b + p * ldb;
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v) {
      V bv;
      std::memcpy(&bv, bp + v * kL, sizeof(V));
      acc[v] += s * bv;
    }
  }
#pragma GCC unroll 16
  for (int v = 0; v < kVecs; ++v) std::memcpy(ci + v * kL, &acc[v], sizeof(V));
}

// c[r] (+)= the dot products of a contiguous row `a` of k with rows r < kRows of b (ldb apart),
// each over 8 running sums (p % 8, in order of p) added in a fixed tree: small_gemm's second
// form, kRows rows of b at a time so that their sums advance together.
template <int kRows, typename T>
inline void small_dots(const T* a, int64_t k, const T* b, int64_t ldb, T* c, bool accumulate) {
  typedef T V __attribute__((vector_size(8 * sizeof(T))));
  V acc[kRows];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) acc[r] = V{};
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    V av;
    std::memcpy(&av, a + p, sizeof(V));
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      V bv;
      std::memcpy(&bv, b + r * ldb + p, sizeof(V));
      acc[r] += av * bv;
    }
  }
  for (int l = 0; p < k; ++p, ++l)
    for (int r = 0; r < kRows; ++r) acc[r][l] += a[p] * b[r * ldb + p];
  if constexpr (std::is_same_v<T, float> && kRows == 8) {
    // The eight trees at once, the same additions with the same operands in the same order:
    // pairs (x0 + x1), (x2 + x3), ..., then their pairs, then the two halves.
    // (No helper function: a vector passed or returned by value changes the ABI without AVX.)
    typedef int I __attribute__((vector_size(32)));
    const I first = {0, 2, 8, 10, 4, 6, 12, 14}, second = {1, 3, 9, 11, 5, 7, 13, 15};
    const V h01 =
        __builtin_shuffle(acc[0], acc[1], first) + __builtin_shuffle(acc[0], acc[1], second);
    const V h23 =
        __builtin_shuffle(acc[2], acc[3], first) + __builtin_shuffle(acc[2], acc[3], second);
    const V h45 =
        __builtin_shuffle(acc[4], acc[5], first) + __builtin_shuffle(acc[4], acc[5], second);
    const V h67 =
        __builtin_shuffle(acc[6], acc[7], first) + __builtin_shuffle(acc[6], acc[7], second);
    const V q0 = __builtin_shuffle(h01, h23, first) + __builtin_shuffle(h01, h23, second);
    const V q1 = __builtin_shuffle(h45, h67, first) + __builtin_shuffle(h45, h67, second);
    const V sums = __builtin_shuffle(q0, q1, I{0, 1, 2, 3, 8, 9, 10, 11}) +
                   __builtin_shuffle(q0, q1, I{4, 5, 6, 7, 12, 13, 14, 15});
    for (int r = 0; r < kRows; ++r) c[r] = accumulate ? c[r] + sums[r] : sums[r];
    return;
  }
  for (int r = 0; r < kRows; ++r) {
    const V& x = acc[r];
    const T sum = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
    c[r] = accumulate ? c[r] + sum : sum;
  }
}

// c[m,n] = op(a) op(b) (+ c when `accumulate`) with plain loops in a fixed order (the same bits on
// every call): a row of b times an element of a into a row of c when b is not transposed (the
// first written, the others added; 8 vectors of c at a time held in registers); otherwise each
// element a dot product over 8 running sums, added in a fixed tree.
template <typename T>
void small_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a,
                int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate) {
  auto at = [&](int64_t i, int64_t p) { return trans_a ? a[p * lda + i] : a[i * lda + p]; };
  if (!trans_b) {
    constexpr int64_t kL = Vec32<T>::kLanes, kWide = 8 * kL;
    for (int64_t i = 0; i < m; ++i) {
      T* ci = c + i * ldc;
      int64_t j = 0;
      for (; j + kWide <= n; j += kWide)
        small_gemm_row_block<8>(at, i, k, b + j, ldb, ci + j, accumulate);
      for (; j + kL <= n; j += kL)
        small_gemm_row_block<1>(at, i, k, b + j, ldb, ci + j, accumulate);
      for (; j < n; ++j) {  // the last columns, one at a time, in the same order
        T acc = accumulate ? ci[j] : k == 0 ? T(0) : at(i, 0) * b[j];
        for (int64_t p = accumulate || k == 0 ? 0 : 1; p < k; ++p) acc += at(i, p) * b[p * ldb + j];
        ci[j] = acc;
      }
    }
    return;
  }
  // Rows of b whose dot products advance together: eight for float (their sums then reduced
  // together), four for double.
  constexpr int kLanes = 8, kDotRows = std::is_same_v<T, float> ? 8 : 4;
  // A row of op(a) read with stride `step` (1 unless a is transposed).
  auto dot_rows = [&](const T* ai, int64_t step) {
    int64_t j = 0;
    if (step == 1) {
      for (; j + kDotRows <= n; j += kDotRows, c += kDotRows)
        small_dots<kDotRows>(ai, k, b + j * ldb, ldb, c, accumulate);
    }
    for (; j < n; ++j, ++c) {
      if (step == 1) {
        small_dots<1>(ai, k, b + j * ldb, ldb, c, accumulate);
        continue;
      }
      const T* bj = b + j * ldb;
      T acc[kLanes] = {};
      int64_t p = 0;
      for (; p + kLanes <= k; p += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] += ai[(p + l) * step] * bj[p + l];
      for (int l = 0; p < k; ++p, ++l) acc[l] += ai[p * step] * bj[p];
      const T sum =
          ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      *c = accumulate ? *c + sum : sum;
    }
  };
  for (int64_t i = 0; i < m; ++i, c += ldc - n)
    dot_rows(trans_a ? a + i : a + i * lda, trans_a ? lda : 1);
}

// c[m,n] = op(a) op(b) + beta c, op transposing when its flag is set.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if ((beta == 0 || beta == 1) && small_product(m, n, k)) {
    small_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, /*accumulate=*/beta == 1);
    return;
  }
  if (beta == 0) {
    zero_for_product(m, n, c, ldc);
    beta = 1;
  }
  blas_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

// Sets OpenBLAS to one thread, once (its threads would compete with parallel_for's, and its
// results would depend on its own thread count). Called by the kernels that use it at start-up.
inline void ensure_single_threaded_blas() {
  [[maybe_unused]] static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
}

// The least work (flops) parallel_gemm gives a part; products below it run whole.
inline constexpr double kGemmPartFlops = 1 << 20;
// Products of more flops run in slices of about this many (0.5 ms on one core), one after the
// other, with a communication progress poll between two (runtime/comm_progress.h: an all-reduce
// started before the product advances during it, not only after it). The slices are a function
// of the shapes only, so the bits do not depend on whether anything is in flight.
inline constexpr double kGemmSliceFlops = 1 << 25;

// What parallel_gemm does after each part by default: nothing.
struct NoAfterPart {
  void operator()(int64_t, int64_t, int64_t, int64_t) const {}
};

// gemm() split into parts across parallel_for's threads: the longer side of c in whole blocks
// of kBlock rows or columns, at least about kPartFlops each (within each slice, above).
// after_part(r0, r1, c0, c1) runs on the part's thread once it has written rows [r0, r1) and
// columns [c0, c1) of c (a producer's activation, kernels/cpu/activation.h, while the part is in
// cache).
template <typename T, typename AfterPart = NoAfterPart>
void parallel_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a,
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc,
                   AfterPart after_part = {}) {
  constexpr int64_t kBlock = 16;
  constexpr double kPartFlops = kGemmPartFlops;
  const bool by_rows = m > n;
  const int64_t side = by_rows ? m : n, other = by_rows ? n : m;
  const int64_t blocks = (side + kBlock - 1) / kBlock;
  const double block_flops = 2.0 * static_cast<double>(kBlock * other) * static_cast<double>(k);
  const int64_t grain =
      std::max<int64_t>(1, static_cast<int64_t>(kPartFlops / std::max(block_flops, 1.0)));
  const int64_t slices = std::clamp<int64_t>(
      static_cast<int64_t>(block_flops * static_cast<double>(blocks) / kGemmSliceFlops), 1, blocks);
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t first = blocks * s / slices, last = blocks * (s + 1) / slices;
    parallel_for(last - first, grain, [=](int64_t b0, int64_t b1) {
      const int64_t lo = (first + b0) * kBlock, hi = std::min(side, (first + b1) * kBlock);
      if (by_rows) {
        gemm(trans_a, trans_b, hi - lo, n, k, trans_a ? a + lo : a + lo * lda, lda, b, ldb, beta,
             c + lo * ldc, ldc);
        after_part(lo, hi, int64_t{0}, n);
      } else {
        gemm(trans_a, trans_b, m, hi - lo, k, a, lda, trans_b ? b + lo * ldb : b + lo, ldb, beta,
             c + lo, ldc);
        after_part(int64_t{0}, m, lo, hi);
      }
    });
    if (s + 1 < slices) comm_progress::poll();
  }
}

// Fails, naming `op`, unless every size fits cblas's integer type.
inline void check_blas_sizes(Op op, std::initializer_list<int64_t> sizes) {
  constexpr int64_t kMax = std::numeric_limits<blasint>::max();
  for (int64_t v : sizes)
    ENCORE_CHECK(v <= kMax, op_name(op), ": dimension ", v, " is too large for cblas (at most ",
                 kMax, ")");
}

}  // namespace encore::kernels::cpu
