// The launches of the small GEMMs' kernels (small_gemm.cuh), compiled with -fmad=false.
#include <atomic>
#include <cstdint>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/small_gemm.cuh"
#include "kernels/cuda/small_gemm.h"
#include "runtime/env.h"

namespace encore::kernels::cuda {
namespace {

// Whether finish() (small_gemm.cuh) applies `act`: Op::Matmul (nothing), or an activation or
// activation gradient it has a case for.
bool finishes(Op act) {
  switch (act) {
    case Op::Matmul:
    case Op::Relu:
    case Op::LeakyRelu:
    case Op::Sigmoid:
    case Op::Tanh:
    case Op::Gelu:
    case Op::ReluGrad:
    case Op::LeakyReluGrad:
    case Op::SigmoidGrad:
    case Op::TanhGrad:
    case Op::GeluGrad:
      return true;
    default:
      return false;
  }
}

// Whether the small GEMMs launch as programmatic dependents of the kernel before them on the
// stream (cudaLaunchAttributeProgrammaticStreamSerialization: the launch overlaps that kernel's
// work; dependent_launch_start in small_gemm.cuh waits for it): ENCORE_CUDA_PDL=1 (read once;
// off by default until timed), on devices of compute capability 9.0 and later.
bool programmatic_device(int device) {
  static const bool on = env::flag("ENCORE_CUDA_PDL", false);
  if (!on) return false;
  static std::atomic<int8_t> capable[64] = {};  // 0 unknown, 1 yes, -1 no
  if (device < 0 || device >= 64) return false;
  int8_t known = capable[device].load(std::memory_order_relaxed);
  if (known == 0) {
    int major = 0;
    const cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (e != cudaSuccess) (void)cudaGetLastError();
    known = e == cudaSuccess && major >= 9 ? 1 : -1;
    capable[device].store(known, std::memory_order_relaxed);
  }
  return known > 0;
}

// kKernel<<<l.blocks, l.threads, 0, stream()>>>(args...), as a programmatic dependent where the
// device allows it and kKernel was compiled for sm_90 or later (from PTX of compute_90 or later:
// code for older GPUs does not wait in dependent_launch_start, and must not be launched so).
template <auto kKernel, typename... Args>
void launch(Op op, const GemmLaunch& l, Args&&... args) {
  static const bool waits = [] {
    cudaFuncAttributes a{};
    if (cudaFuncGetAttributes(&a, kKernel) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.ptxVersion >= 90;
  }();
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(l.blocks);
  config.blockDim = dim3(l.threads);
  config.stream = stream();
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (programmatic_device(encore::cuda::current_device()) && waits) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  ENCORE_CUDA_OK(op, cudaLaunchKernelEx(&config, kKernel, std::forward<Args>(args)...));
}

}  // namespace

void small_gemm(Op op, SmallGemm kind, const GemmShape& g, DType dtype, const void* a,
                const void* b, void* c, const void* bias, Op act, double scalar, const void* act_in,
                void* sums) {
  switch_floating(dtype, op, [&]<typename T>(Type<T>) {
    const GemmFinish<T> f{static_cast<const T*>(bias), static_cast<const T*>(act_in), act,
                          static_cast<T>(scalar), static_cast<T*>(sums)};
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* pc = static_cast<T*>(c);
    ENCORE_CHECK(kind != SmallGemm::kNone, op_name(op), ": no small GEMM kernel for [", g.m, ",",
                 g.k, "] x [", g.k, ",", g.n, "]");
    ENCORE_CHECK(finishes(act), op_name(op), ": a small GEMM cannot apply ", op_name(act),
                 " to its outputs");
    ENCORE_CHECK(sums == nullptr || cuda_small_gemm_sums_columns(g), op_name(op),
                 ": a small GEMM cannot sum the columns of a [", g.trans_a ? g.k : g.m, ",",
                 g.trans_a ? g.m : g.k, "]", g.trans_a ? "" : " (not transposed)");
    const bool dot = kind == SmallGemm::kDot;
    const GemmLaunch l = small_gemm_launch(dot, g.m, g.n, sums != nullptr);
    const bool vectors_b = stages_vectors(pb, g.ldb);
    if (dot) {
      launch<gemm_dot_kernel<T>>(op, l, g.m, g.n, g.k, pa, g.lda, stages_vectors(pa, g.lda), pb,
                                 g.ldb, vectors_b, pc, g.ldc, f);
    } else if (l.rows == 1) {
      launch<gemm_serial_k_kernel<T, 1>>(op, l, g.m, g.n, g.k, g.trans_a, pa, g.lda, pb, g.ldb,
                                         vectors_b, pc, g.ldc, f);
    } else {
      launch<gemm_serial_k_kernel<T, kSerialRows>>(op, l, g.m, g.n, g.k, g.trans_a, pa, g.lda, pb,
                                                   g.ldb, vectors_b, pc, g.ldc, f);
    }
    ENCORE_CUDA_LAUNCHED(op);
  });
}

}  // namespace encore::kernels::cuda
