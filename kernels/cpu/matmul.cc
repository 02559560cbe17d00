// Matmul and linear through cblas (OpenBLAS), row-major (shapes: kernels/gemm_shape.h).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/kernel.h"
#include "kernels/gemm_shape.h"

namespace encore::kernels::cpu {
namespace {

// The GEMM of `g` on one batch's matrices.
template <typename T>
void run(const GemmShape& g, const T* a, const T* b, T* c, T beta) {
  parallel_gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, a, g.lda, b, g.ldb, beta, c, g.ldc);
}
void check(Op op, const GemmShape& g) {
  check_blas_sizes(op, {g.m, g.n, g.k, g.lda, g.ldb, g.ldc});
}

void matmul_kernel(const KernelArgs& args) {
  const BufferView &a = args.in[0], &b = args.in[1], &c = args.out[0];
  const GemmShape g = matmul_shape(args);
  switch_floating(c.dtype, Op::Matmul, [&]<typename T>(Type<T>) {
    const T* pa = a.as<T>();
    const T* pb = b.as<T>();
    T* pc = c.as<T>();
    if (c.numel() == 0) return;
    if (g.k == 0) {
      std::fill(pc, pc + c.numel(), T(0));
      return;
    }
    check(Op::Matmul, g);
    for (int64_t i = 0; i < g.batches; ++i)
      run(g, pa + i * g.stride_a, pb + i * g.stride_b, pc + i * g.stride_c, T(0));
  });
}

void linear_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &w = args.in[1], &y = args.out[0];
  const BufferView* bias = args.in.size() == 3 ? &args.in[2] : nullptr;
  const GemmShape g = linear_shape(args);
  switch_floating(y.dtype, Op::Linear, [&]<typename T>(Type<T>) {
    T* py = y.as<T>();
    if (y.numel() == 0) return;
    if (bias != nullptr) {
      const T* pb = bias->as<T>();
      for (int64_t r = 0; r < g.m; ++r) std::memcpy(py + r * g.n, pb, g.n * sizeof(T));
    } else if (g.k == 0) {
      std::fill(py, py + y.numel(), T(0));
    }
    if (g.k == 0) return;
    check(Op::Linear, g);
    run(g, x.as<T>(), w.as<T>(), py, bias != nullptr ? T(1) : T(0));
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  ensure_single_threaded_blas();
  register_kernel(Op::Matmul, DeviceType::CPU, &matmul_kernel);
  register_kernel(Op::Linear, DeviceType::CPU, &linear_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
