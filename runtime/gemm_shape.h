// The GEMMs of Matmul and Linear, as every backend computes them: row-major matrices, sizes and
// row lengths as for cblas with CblasRowMajor, one definition for kernels/cpu/matmul.cc,
// kernels/cuda/blas.cu and the planner (which asks runtime/small_gemm.h which CUDA products run
// on encore's own kernels).
#pragma once

#include <algorithm>
#include <cstdint>

#include "runtime/kernel_abi.h"

namespace encore {

// c = op(a) op(b) + beta c, `batches` times (a, b and c advanced by their strides in elements
// each time; a stride of 0 shares one matrix across the batch). op transposes when its flag is
// set; m, n, k are the sizes of c [m, n] and the inner dimension, lda, ldb, ldc the row lengths
// of the stored matrices.
struct GemmShape {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  int64_t batches = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};

// Matmul: c [M,N] or [B,M,N] = op(a) op(b); a and b are 2-D (shared by every batch) or 3-D. The
// routine passes operands of equal rank (it flattens [B,M,K] x [K,N] into one 2-D GEMM itself).
inline GemmShape matmul_shape(const Shape& a, const Shape& b, const Shape& c,
                              const MatmulAttrs& attrs) {
  GemmShape g;
  g.trans_a = attrs.trans_a;
  g.trans_b = attrs.trans_b;
  g.m = c.at(-2);
  g.n = c.at(-1);
  g.k = attrs.trans_a ? a.at(-2) : a.at(-1);
  g.lda = std::max<int64_t>(attrs.trans_a ? g.m : g.k, 1);
  g.ldb = std::max<int64_t>(attrs.trans_b ? g.k : g.n, 1);
  g.ldc = std::max<int64_t>(g.n, 1);
  g.batches = c.rank() == 3 ? c[0] : 1;
  g.stride_a = a.rank() == 3 ? g.m * g.k : 0;
  g.stride_b = b.rank() == 3 ? g.k * g.n : 0;
  g.stride_c = g.m * g.n;
  return g;
}
inline GemmShape matmul_shape(const KernelArgs& args) {
  return matmul_shape(args.in[0].shape, args.in[1].shape, args.out[0].shape,
                      args.attr<MatmulAttrs>());
}

// Linear: y [R,out] = x [R,in] w^T (+ bias), R = x.numel() / in; one GEMM.
inline GemmShape linear_shape(const Shape& x, const Shape& w, const Shape& y) {
  GemmShape g;
  g.trans_b = true;
  g.n = w[0];
  g.k = w[1];
  g.m = g.k == 0 ? y.numel() / std::max<int64_t>(g.n, 1) : x.numel() / g.k;
  g.lda = std::max<int64_t>(g.k, 1);
  g.ldb = std::max<int64_t>(g.k, 1);
  g.ldc = std::max<int64_t>(g.n, 1);
  return g;
}
inline GemmShape linear_shape(const KernelArgs& args) {
  return linear_shape(args.in[0].shape, args.in[1].shape, args.out[0].shape);
}

}  // namespace encore
