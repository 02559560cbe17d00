// cuBLAS for the CUDA kernels: one handle per device, bound to the current stream and to a fixed
// workspace, and row-major GEMM over it.
//
//   CublasLease blas(Op::Matmul);            // the current device's handle, held exclusively
//   gemm(Op::Matmul, blas.handle(), g, a, b, 0.0f, c);
//
// A handle is created on the first GEMM of its device together with its workspace (cudaMalloc,
// kWorkspaceBytes), and neither is ever freed while the process runs: a captured CUDA graph may
// still name the workspace. Every lease binds the handle to stream() and that workspace again
// (cublasSetStream resets the workspace to cuBLAS's own pool, which would allocate during
// capture), with pointer mode host and the default math mode (no TF32), so eager calls and graph
// replays pick the same algorithms and give the same bits.
#pragma once

#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "kernels/gemm_shape.h"
#include "runtime/op_traits.h"

namespace encore::kernels::cuda {

// The fixed cuBLAS workspace of each device (what cuBLAS recommends on Hopper).
inline constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// Throws Error naming the op, the cuBLAS call and cuBLAS's status.
[[noreturn]] void fail_cublas(Op op, const char* call, cublasStatus_t status);

// The current device's cuBLAS handle, bound to stream() and the device's workspace, used by this
// thread alone while the lease lives (a handle's stream is shared state). The first lease of a
// device creates its handle; that must happen outside graph capture (an eager call always comes
// first), or the lease throws Error naming `op`.
class CublasLease {
 public:
  explicit CublasLease(Op op);
  CublasLease(const CublasLease&) = delete;
  CublasLease& operator=(const CublasLease&) = delete;
  cublasHandle_t handle() const { return handle_; }

 private:
  std::unique_lock<std::mutex> lock_;
  cublasHandle_t handle_ = nullptr;
};

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
