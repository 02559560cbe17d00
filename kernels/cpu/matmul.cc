// Matmul and linear through cblas (OpenBLAS), row-major.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/kernel.h"

namespace encore::kernels::cpu {
namespace {

// C[m,n] = alpha op(A) op(B) + beta C, row-major.
struct Gemm {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;

  template <typename T>
  void run(const T* a, const T* b, T* c, T beta) const {
    gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
  }
  void check(Op op) const { check_blas_sizes(op, {m, n, k, lda, ldb, ldc}); }
};

// out [M,N] or [B,M,N] = op(a) op(b); a and b are 2-D (shared by every batch) or 3-D. The
// routine passes operands of equal rank (it flattens [B,M,K] x [K,N] into one 2-D GEMM itself);
// a shared 2-D operand is just a batch step of 0.
void matmul_kernel(const KernelArgs& args) {
  const BufferView &a = args.in[0], &b = args.in[1], &c = args.out[0];
  const MatmulAttrs& attrs = args.attr<MatmulAttrs>();
  Gemm g;
  g.trans_a = attrs.trans_a;
  g.trans_b = attrs.trans_b;
  g.m = c.shape.at(-2);
  g.n = c.shape.at(-1);
  g.k = attrs.trans_a ? a.shape.at(-2) : a.shape.at(-1);
  g.lda = std::max<int64_t>(attrs.trans_a ? g.m : g.k, 1);
  g.ldb = std::max<int64_t>(attrs.trans_b ? g.k : g.n, 1);
  g.ldc = std::max<int64_t>(g.n, 1);
  const int64_t batches = c.shape.rank() == 3 ? c.shape[0] : 1;
  const int64_t a_step = a.shape.rank() == 3 ? g.m * g.k : 0;
  const int64_t b_step = b.shape.rank() == 3 ? g.k * g.n : 0;
  switch_floating(c.dtype, Op::Matmul, [&]<typename T>(Type<T>) {
    const T* pa = a.as<T>();
    const T* pb = b.as<T>();
    T* pc = c.as<T>();
    if (c.numel() == 0) return;
    if (g.k == 0) {
      std::fill(pc, pc + c.numel(), T(0));
      return;
    }
    g.check(Op::Matmul);
    for (int64_t i = 0; i < batches; ++i)
      g.run(pa + i * a_step, pb + i * b_step, pc + i * g.m * g.n, T(0));
  });
}

// y [R,out] = x [R,in] w^T (+ b), R = x.numel() / in.
void linear_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &w = args.in[1], &y = args.out[0];
  const BufferView* bias = args.in.size() == 3 ? &args.in[2] : nullptr;
  Gemm g;
  g.trans_b = true;
  g.n = w.shape[0];
  g.k = w.shape[1];
  g.m = g.k == 0 ? y.numel() / std::max<int64_t>(g.n, 1) : x.numel() / g.k;
  g.lda = std::max<int64_t>(g.k, 1);
  g.ldb = std::max<int64_t>(g.k, 1);
  g.ldc = std::max<int64_t>(g.n, 1);
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
    g.check(Op::Linear);
    g.run(x.as<T>(), w.as<T>(), py, bias != nullptr ? T(1) : T(0));
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::Matmul, DeviceType::CPU, &matmul_kernel);
  register_kernel(Op::Linear, DeviceType::CPU, &linear_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
