// cuBLAS for the CUDA kernels: row-major GEMM on a handle of the current stream
// (stream_libraries.h).
//
//   gemm(Op::Matmul, cublas_handle(Op::Matmul), g, a, b, 0.0f, c);
#pragma once

#include <cublas_v2.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/stream_libraries.h"
#include "runtime/dtype.h"
#include "runtime/gemm_shape.h"
#include "runtime/op_traits.h"

namespace encore::kernels::cuda {

// Throws Error naming the op, the cuBLAS call and cuBLAS's status.
[[noreturn]] void fail_cublas(Op op, const char* call, cublasStatus_t status);

void gemm(Op op, cublasHandle_t h, const GemmShape& g, const float* a, const float* b, float beta,
          float* c);
void gemm(Op op, cublasHandle_t h, const GemmShape& g, const double* a, const double* b,
          double beta, double* c);

// Linear's y [m, n] = x [m, k] w^T + bias as one cuBLASLt call, the bias added by the GEMM's
// epilogue (blas_lt.cc); `slot` is the step's KernelArgs::state (null when eager). False, with
// nothing done, where cuBLASLt has no algorithm for it (or ENCORE_CUDA_LT=0): the caller fills y
// with the bias and adds a GEMM. `g` is linear_shape's, with k > 0.
bool linear_bias_lt(Op op, const GemmShape& g, DType dtype, const void* x, const void* w,
                    const void* bias, void* y, std::atomic<void*>* slot);

// The cuBLASLt plans linear_bias_lt made in this process (one per device, dtype, shape and
// alignment): those with an algorithm, and those cuBLASLt had none for (their linears take the
// general path), with the last one's shape and why cuBLASLt had none.
struct LtPlanCounts {
  int64_t usable = 0, unsupported = 0;
  std::string last_unsupported;
};
LtPlanCounts lt_plan_counts();

}  // namespace encore::kernels::cuda

#define ENCORE_CUBLAS_OK(op, call)                                  \
  do {                                                              \
    const cublasStatus_t encore_s_ = (call);                        \
    if (encore_s_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]            \
      ::encore::kernels::cuda::fail_cublas((op), #call, encore_s_); \
  } while (0)
