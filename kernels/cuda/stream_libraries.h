// The cuBLAS and cuDNN handles the CUDA kernels call: one set per thread, device and stream,
// each handle bound to its stream once, with a workspace of its own.
//
//   gemm(Op::Matmul, cublas_handle(Op::Matmul), g, a, b, 0.0f, c);
//
// - A call costs no lock and no rebinding: a thread's last stream on each device is one
//   comparison away (a replay runs on one stream), its other streams a short scan.
// - Two streams never share a workspace, so GEMMs or convolutions queued on two streams may run
//   at once; a handle is never used by two threads at once (cuDNN requires it), so each thread
//   has its own, and a thread that ends leaves its libraries to the next thread on the stream.
// - Handles and workspaces are made on a stream's first GEMM or convolution, never during graph
//   capture (Error naming the op): before a capture begins, the capture stream gets the handles
//   the process uses and a cuDNN workspace as large as any asked for (runtime/cuda.h:
//   register_capture_preparer). They live as long as the stream (a captured CUDA graph may name
//   a workspace; the graphs captured on one thread's capture streams run one at a time:
//   runtime/cuda_capture_streams.h): a thread that finds a stream it cached destroyed
//   (runtime/cuda.h: stream_serial) frees that stream's handles and workspaces, once no graph
//   capture is in progress (runtime/cuda.h: after_captures).
// - A scratch of kScratchBytes per stream for our own kernels, made and kept as the workspaces.
// - cuBLAS: pointer mode host, default math (no TF32), the fixed workspace kWorkspaceBytes, so
//   eager calls and graph replays pick the same algorithms and give the same bits. cuBLASLt
//   (blas_lt.cc) has a handle of its own beside it and uses the same workspace (its calls are
//   queued on the same stream).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/op_traits.h"

namespace encore::kernels::cuda {

// The fixed cuBLAS workspace of each stream (what cuBLAS recommends on Hopper).
inline constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct StreamLibraries {
  int device = 0;
  cudaStream_t stream = nullptr;
  uint64_t serial = 0;  // the stream's (runtime/cuda.h), 0 for one the runtime did not make
  cublasHandle_t blas = nullptr;  // bound to `stream` and `blas_workspace`
  void* blas_workspace = nullptr;
  cublasLtHandle_t lt = nullptr;  // made with `blas`; its calls name the stream and workspace
  cudnnHandle_t dnn = nullptr;  // bound to `stream`
  void* dnn_workspace = nullptr;
  size_t dnn_workspace_bytes = 0;
  std::vector<void*> retired;  // outgrown cuDNN workspaces, kept for graphs that name them
  void* scratch = nullptr;     // kScratchBytes (stream_scratch)
};

// This thread's libraries for the current stream of the current device (handles not yet made).
StreamLibraries& stream_libraries(Op op);

// The cuBLAS handle of the current stream, made on first use.
cublasHandle_t cublas_handle(Op op);

// The current stream's libraries with their cuBLAS and cuBLASLt handles made.
StreamLibraries& cublas_libraries(Op op);

// The cuDNN handle of the current stream, made on first use, with a workspace of at least
// `bytes`; a workspace it outgrows is kept, not freed. Error naming `op` when it cannot be had.
StreamLibraries& cudnn_libraries(Op op, size_t bytes);

// The bytes of a stream's scratch.
inline constexpr size_t kScratchBytes = 4096;

// The current stream's scratch: kScratchBytes of device memory (made on first use, never during
// graph capture: a capture stream gets one before its capture), for a kernel whose blocks join
// their results there (softmax_loss.cuh's cross-entropy loss). Kernels on one stream run one
// after another, so each has it alone; what it holds at a launch is undefined (a launch sets what
// it needs first, on the stream), as in a workspace.
void* stream_scratch(Op op);

// Grows the cuDNN workspace of `libs` to at least `bytes` (outside capture only); false when the
// device has no memory for it, even after emptying the caching allocator's cache.
bool reserve_cudnn_workspace(StreamLibraries& libs, size_t bytes);

}  // namespace encore::kernels::cuda
