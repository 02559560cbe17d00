// Row-major GEMM on cuBLAS (blas.h), and Matmul and Linear on them (as
// kernels/cpu/matmul.cc). A linear with a bias is one cuBLASLt call where cuBLASLt has an
// algorithm for it (blas_lt.cc); else y is filled with the bias and a GEMM adds to it.
//
// cuBLAS is column-major. A row-major [r, c] matrix with row length ld is, read column-major, its
// transpose [c, r] with leading dimension ld, so row-major C = op(A) op(B) is column-major
// C^T = op(B)^T op(A)^T: one cuBLAS call with the operands swapped, n and m swapped, and each
// operand keeping its own transpose flag and row length.
#include <algorithm>
#include <array>
#include <climits>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/common.cuh"

namespace encore::kernels::cuda {

void fail_cublas(Op op, const char* call, cublasStatus_t status) {
  fail(op_name(op), ": cuBLAS error in ", call, ": ", cublasGetStatusName(status), " (",
       cublasGetStatusString(status), ")");
}

void check_gemm_sizes(Op op, const GemmShape& g) {
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batches})
    ENCORE_CHECK(v <= INT_MAX, op_name(op), ": dimension ", v, " is too large for cuBLAS (at most ",
                 INT_MAX, ")");
}

namespace {

cublasOperation_t trans(bool t) {
  return t ? CUBLAS_OP_T : CUBLAS_OP_N;
}

// The column-major call for row-major g: (B, A) in that order, sizes (n, m, k).
template <typename T, typename One, typename Batched>
void gemm_impl(Op op, cublasHandle_t h, const GemmShape& g, const T* a, const T* b, T beta, T* c,
               One one, const char* one_name, Batched batched, const char* batched_name) {
  const T alpha = 1;
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int lda = static_cast<int>(g.lda), ldb = static_cast<int>(g.ldb),
            ldc = static_cast<int>(g.ldc);
  const cublasOperation_t op_b = trans(g.trans_b), op_a = trans(g.trans_a);
  if (g.batches == 1) {
    const cublasStatus_t s = one(h, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) fail_cublas(op, one_name, s);
  } else {
    const cublasStatus_t s =
        batched(h, op_b, op_a, n, m, k, &alpha, b, ldb, static_cast<long long>(g.stride_b), a, lda,
                static_cast<long long>(g.stride_a), &beta, c, ldc,
                static_cast<long long>(g.stride_c), static_cast<int>(g.batches));
    if (s != CUBLAS_STATUS_SUCCESS) fail_cublas(op, batched_name, s);
  }
}

}  // namespace

void gemm(Op op, cublasHandle_t h, const GemmShape& g, const float* a, const float* b, float beta,
          float* c) {
  gemm_impl(op, h, g, a, b, beta, c, cublasSgemm, "cublasSgemm", cublasSgemmStridedBatched,
            "cublasSgemmStridedBatched");
}

void gemm(Op op, cublasHandle_t h, const GemmShape& g, const double* a, const double* b,
          double beta, double* c) {
  gemm_impl(op, h, g, a, b, beta, c, cublasDgemm, "cublasDgemm", cublasDgemmStridedBatched,
            "cublasDgemmStridedBatched");
}

namespace {

// y [rows, n] = bias [n] in every row.
template <typename T>
__global__ void fill_rows_kernel(const T* __restrict__ bias, T* __restrict__ y, int64_t n,
                                 int64_t total) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step)
    y[i] = bias[i % n];
}

void matmul_kernel(const KernelArgs& args) {
  const BufferView &a = args.in[0], &b = args.in[1], &c = args.out[0];
  const GemmShape g = matmul_shape(args);
  switch_floating(c.dtype, Op::Matmul, [&]<typename T>(Type<T>) {
    if (c.numel() == 0) return;
    if (g.k == 0) {
      ENCORE_CUDA_OK(
          Op::Matmul,
          cudaMemsetAsync(c.data, 0, static_cast<size_t>(c.numel()) * sizeof(T), stream()));
      return;
    }
    check_gemm_sizes(Op::Matmul, g);
    gemm(Op::Matmul, cublas_handle(Op::Matmul), g, a.as<T>(), b.as<T>(), T(0), c.as<T>());
  });
}

void linear_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &w = args.in[1], &y = args.out[0];
  const BufferView* bias = args.in.size() == 3 ? &args.in[2] : nullptr;
  const GemmShape g = linear_shape(args);
  switch_floating(y.dtype, Op::Linear, [&]<typename T>(Type<T>) {
    T* py = y.as<T>();
    const int64_t total = y.numel();
    if (total == 0) return;
    if (g.k > 0) {
      check_gemm_sizes(Op::Linear, g);
      if (bias != nullptr &&
          linear_bias_lt(Op::Linear, g, y.dtype, x.data, w.data, bias->data, py, args.state))
        return;
    }
    if (bias != nullptr) {
      fill_rows_kernel<T>
          <<<blocks_for(total), kThreads, 0, stream()>>>(bias->as<T>(), py, g.n, total);
      ENCORE_CUDA_LAUNCHED(Op::Linear);
    } else if (g.k == 0) {
      ENCORE_CUDA_OK(Op::Linear,
                     cudaMemsetAsync(py, 0, static_cast<size_t>(total) * sizeof(T), stream()));
    }
    if (g.k == 0) return;
    gemm(Op::Linear, cublas_handle(Op::Linear), g, x.as<T>(), w.as<T>(),
         bias != nullptr ? T(1) : T(0), py);
  });
}

ENCORE_REGISTER_CUDA(Op::Matmul, &matmul_kernel);
ENCORE_REGISTER_CUDA(Op::Linear, &linear_kernel);

}  // namespace
}  // namespace encore::kernels::cuda
