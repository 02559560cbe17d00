// The GEMMs of Matmul and Linear, as every backend computes them: row-major matrices, sizes and
// row lengths as for cblas with CblasRowMajor, one definition for cpu/matmul.cc and
// cuda/blas.cu.
#pragma once

#include <algorithm>
#include <cstdint>

#include "runtime/kernel_abi.h"

namespace encore::kernels {

// c = op(a) op(b) + beta c, `batches` times (a, b and c advanced by their strides in elements
// each time; a stride of 0 shares one matrix across the batch). op transposes when its flag is
// set; m, n, k are the sizes of c [m, n] and the inner dimension, lda, ldb, ldc the row lengths
// of the stored matrices.
struct GemmShape {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  int64_t batches = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};

// Matmul: out [M,N] or [B,M,N] = op(a) op(b); a and b are 2-D (shared by every batch) or 3-D. The
// routine passes operands of equal rank (it flattens [B,M,K] x [K,N] into one 2-D GEMM itself).
inline GemmShape matmul_shape(const KernelArgs& args) {
  const BufferView &a = args.in[0], &b = args.in[1], &c = args.out[0];
  const MatmulAttrs& attrs = args.attr<MatmulAttrs>();
  GemmShape g;
  g.trans_a = attrs.trans_a;
  g.trans_b = attrs.trans_b;
  g.m = c.shape.at(-2);
  g.n = c.shape.at(-1);
  g.k = attrs.trans_a ? a.shape.at(-2) : a.shape.at(-1);
  g.lda = std::max<int64_t>(attrs.trans_a ? g.m : g.k, 1);
  g.ldb = std::max<int64_t>(attrs.trans_b ? g.k : g.n, 1);
  g.ldc = std::max<int64_t>(g.n, 1);
  g.batches = c.shape.rank() == 3 ? c.shape[0] : 1;
  g.stride_a = a.shape.rank() == 3 ? g.m * g.k : 0;
  g.stride_b = b.shape.rank() == 3 ? g.k * g.n : 0;
  g.stride_c = g.m * g.n;
  return g;
}

// Linear: y [R,out] = x [R,in] w^T (+ bias), R = x.numel() / in; one GEMM.
inline GemmShape linear_shape(const KernelArgs& args) {
  const BufferView &x = args.in[0], &w = args.in[1], &y = args.out[0];
  GemmShape g;
  g.trans_b = true;
  g.n = w.shape[0];
  g.k = w.shape[1];
  g.m = g.k == 0 ? y.numel() / std::max<int64_t>(g.n, 1) : x.numel() / g.k;
  g.lda = std::max<int64_t>(g.k, 1);
  g.ldb = std::max<int64_t>(g.k, 1);
  g.ldc = std::max<int64_t>(g.n, 1);
  return g;
}

}  // namespace encore::kernels
