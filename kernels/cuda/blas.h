// cuBLAS for the CUDA kernels: row-major GEMM on a handle of the current stream
// (stream_libraries.h).
//
//   gemm(Op::Matmul, cublas_handle(Op::Matmul), g, a, b, 0.0f, c);
#pragma once

#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream_libraries.h"
#include "kernels/gemm_shape.h"
#include "runtime/op_traits.h"

namespace encore::kernels::cuda {

// Throws Error naming the op, the cuBLAS call and cuBLAS's status.
[[noreturn]] void fail_cublas(Op op, const char* call, cublasStatus_t status);

// Fails, naming `op`, unless every size fits cuBLAS's int.
void check_gemm_sizes(Op op, const GemmShape& g);

void gemm(Op op, cublasHandle_t h, const GemmShape& g, const float* a, const float* b, float beta,
          float* c);
void gemm(Op op, cublasHandle_t h, const GemmShape& g, const double* a, const double* b,
          double beta, double* c);

}  // namespace encore::kernels::cuda

#define ENCORE_CUBLAS_OK(op, call)                                  \
  do {                                                              \
    const cublasStatus_t encore_s_ = (call);                        \
    if (encore_s_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]            \
      ::encore::kernels::cuda::fail_cublas((op), #call, encore_s_); \
  } while (0)
