// GEMM through cblas (OpenBLAS) for the CPU kernels: row-major, float and double.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <initializer_list>
#include <limits>

#include "runtime/error.h"
#include "runtime/op_traits.h"

namespace encore::kernels::cpu {

// c[m,n] = op(a) op(b) + beta c, op transposing when its flag is set.
inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}
inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a,
                 int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), 1.0, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// Fails, naming `op`, unless every size fits cblas's integer type.
inline void check_blas_sizes(Op op, std::initializer_list<int64_t> sizes) {
  constexpr int64_t kMax = std::numeric_limits<blasint>::max();
  for (int64_t v : sizes)
    ENCORE_CHECK(v <= kMax, op_name(op), ": dimension ", v, " is too large for cblas (at most ",
                 kMax, ")");
}

}  // namespace encore::kernels::cpu
