// Which GEMMs CUDA runs on encore's own kernels (kernels/cuda/small_gemm.cu) rather than cuBLAS:
// products so small that cuBLAS's kernels wait on latency (a few thousand outputs; it splits their
// k over several blocks and adds the parts in a second kernel). Ours are one kernel with a fixed
// order of operations, and can finish each output with a bias and an activation or an activation
// gradient, so on CUDA the planner folds a Linear and the activation after it into one LinearAct
// step, and a Matmul and the activation gradient after it into one MatmulActGrad step, where this
// holds (schedule/rewrites.cc): eager calls run the same kernels for the same products, so the
// folded steps give eager's bits. A weight gradient's kernel can also sum its gy's columns, the
// bias gradient, in the order of CUDA's Sum (cuda_small_gemm_sums_columns below: WeightBiasGrad).
// The kernels and the planner ask this one function, of the GemmShape both take from the step's
// shapes (runtime/gemm_shape.h).
//
// A product c [m, n] = op(a) op(b) over k is small when it is one matrix (no batch),
// m n k <= kMaxSmallGemmMacs, and either b is stored [n, k] and a [m, k] (a linear's forward: each
// output a dot product of two contiguous rows) with k <= kMaxSmallGemmDotK, or b is stored [k, n]
// with k <= kMaxSmallGemmSerialK (each thread walks k for its outputs): past these lengths a few
// warps would walk a long k alone. ENCORE_CUDA_SMALL_GEMM=0 sends every product to cuBLAS (and
// folds nothing), to compare the two.
#pragma once

#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/env.h"
#include "runtime/gemm_shape.h"

namespace encore {

inline constexpr int64_t kMaxSmallGemmMacs = int64_t{1} << 23;
inline constexpr int64_t kMaxSmallGemmDotK = 1024;
inline constexpr int64_t kMaxSmallGemmSerialK = 512;

// ENCORE_CUDA_SMALL_GEMM, read once (on by default).
inline bool cuda_small_gemm_enabled() {
  static const bool on = env::flag("ENCORE_CUDA_SMALL_GEMM", true);
  return on;
}

// The two layouts the small kernels run: each output a dot product of two rows (kDot), or each
// thread walking k down b's columns (kSerialK); kNone where cuBLAS runs the product.
enum class SmallGemm : uint8_t { kNone, kDot, kSerialK };

// The small kernel for c [m, n] = op(a) op(b) over k, `batches` matrices, on CUDA.
inline SmallGemm cuda_small_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                 int64_t batches) {
  if (batches != 1 || m < 1 || n < 1 || k < 1 || !cuda_small_gemm_enabled())
    return SmallGemm::kNone;
  if (m > kMaxSmallGemmMacs || n > kMaxSmallGemmMacs / m || k > kMaxSmallGemmMacs / (m * n))
    return SmallGemm::kNone;
  if (!trans_a && trans_b && k <= kMaxSmallGemmDotK) return SmallGemm::kDot;
  if (!trans_b && k <= kMaxSmallGemmSerialK) return SmallGemm::kSerialK;
  return SmallGemm::kNone;
}
inline SmallGemm cuda_small_gemm(const GemmShape& g) {
  return cuda_small_gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.batches);
}

// Whether the kernel of c = a^T b (a stored [k, m]: a linear's weight gradient gy^T x) also
// stores sum(a, 0) (its bias gradient) with the bits CUDA's Sum gives: a kSerialK product where
// that Sum folds columns (k and m of at least 2: a sum over one row is a copy, and the sum of one
// column runs as a row). The planner folds such a pair into one WeightBiasGrad step.
inline bool cuda_small_gemm_sums_columns(const GemmShape& g) {
  return g.trans_a && g.m >= 2 && g.k >= 2 && cuda_small_gemm(g) == SmallGemm::kSerialK;
}

// What a kSerialK kernel that computes its a as a loss's gradient stages (kernels/cuda/
// loss_grad_gemm.cuh checks these against its own): blocks of kSmallGemmBlock threads, at most
// kLossGradRows rows of g each, in at most kSmallGemmSharedBytes of dynamic shared memory.
inline constexpr int64_t kSmallGemmBlock = 128, kLossGradRows = 4,
                         kSmallGemmSharedBytes = int64_t{64} * 1024;

// The most warps a kernel may count an Adam step with, one arrival each: the 20 bits of arrivals
// a step counter keeps (kernels/cuda/step_counter.cuh).
inline constexpr int64_t kMaxStepArrivals = int64_t{1} << 20;

// Whether the kSerialK kernel of a weight gradient c = a^T b (a stored [k, m], c contiguous)
// updates the parameter c is the gradient of by Adam, right after computing each element, and with
// `bias` the bias from a's column sums too (cuda_small_gemm_sums_columns): where each of its warps
// can count the parameter's step (fewer than kMaxStepArrivals of them, however many rows a thread
// takes). The planner folds the product and the updates into one WeightGradAdam step.
inline bool cuda_small_gemm_updates_parameters(const GemmShape& g, bool bias) {
  if (!g.trans_a || g.trans_b || g.ldc != g.n ||
      (bias ? !cuda_small_gemm_sums_columns(g) : cuda_small_gemm(g) != SmallGemm::kSerialK))
    return false;
  const int64_t blocks = g.m * ((g.n + kSmallGemmBlock - 1) / kSmallGemmBlock);
  return blocks < kMaxStepArrivals / (kSmallGemmBlock / 32);
}

// The elements of shared memory a block of that kernel uses for k classes and `rows` rows of g:
// two 16-byte vectors of `vec` elements where its threads join their label counts (four int64),
// b's k rows of kSmallGemmBlock columns and the rows of g; where it computes the logits too
// (hidden > 0, the linear's inner length), w's k rows and the block's rows of x, each of `hidden`
// rounded up to a vector, the rows of logits and the bias. All of its shared memory is dynamic, so
// that it may take all of kSmallGemmSharedBytes wherever a GPU gives a block that much.
constexpr int64_t loss_grad_shared_elements(int64_t k, int64_t rows, int64_t hidden, int64_t vec) {
  const int64_t width = (hidden + vec - 1) / vec * vec;
  return 2 * vec + k * kSmallGemmBlock + rows * k +
         (hidden > 0 ? (k + rows) * width + rows * k + k : 0);
}

// The longest k (a loss's classes) whose a that kernel computes itself as rows of the
// cross-entropy gradient rather than reading them: all of k staged at once beside b's rows.
inline constexpr int64_t kMaxLossGradClasses32 = 124, kMaxLossGradClasses64 = 62;
static_assert(loss_grad_shared_elements(kMaxLossGradClasses32, kLossGradRows, 0, 4) * 4 <=
                  kSmallGemmSharedBytes &&
              loss_grad_shared_elements(kMaxLossGradClasses32 + 1, kLossGradRows, 0, 4) * 4 >
                  kSmallGemmSharedBytes);
static_assert(loss_grad_shared_elements(kMaxLossGradClasses64, kLossGradRows, 0, 2) * 8 <=
                  kSmallGemmSharedBytes &&
              loss_grad_shared_elements(kMaxLossGradClasses64 + 1, kLossGradRows, 0, 2) * 8 >
                  kSmallGemmSharedBytes);

// Whether the kernel of c = g b, with g [m, k] (not transposed) the cross-entropy gradient of
// logits [m, k] (a linear's input gradient right after the loss), computes g's rows itself, with
// the gradient kernel's bits, and stores them beside c: a kSerialK product of float32 or float64
// whose k fits one chunk. The planner folds such a pair into one LossGradMatmul step.
inline bool cuda_small_gemm_computes_loss_grad(const GemmShape& g, DType dtype) {
  const int64_t most = dtype == DType::Float32   ? kMaxLossGradClasses32
                       : dtype == DType::Float64 ? kMaxLossGradClasses64
                                                 : 0;
  return !g.trans_a && g.k <= most && cuda_small_gemm(g) == SmallGemm::kSerialK;
}

// The linear whose logits a loss-gradient kernel for `product` computes: x [product.m, hidden]
// times w stored [product.k, hidden], transposed.
inline GemmShape loss_logits_linear(const GemmShape& product, int64_t hidden) {
  return {.trans_b = true,
          .m = product.m,
          .n = product.k,
          .k = hidden,
          .lda = hidden,
          .ldb = hidden,
          .ldc = product.k};
}

// Whether that kernel also computes the logits, x w^T + bias of the linear before the loss (its
// GemmShape `linear`: x [m, hidden], w stored [k, hidden]), with the bits of the kDot kernel that
// runs the linear eagerly, and stores them beside: where it computes the gradient, the linear runs
// on the kDot kernel, and w and the block's rows of x fit in its shared memory beside the rest. The
// planner then folds the Linear into the LossGradMatmul step too.
inline bool cuda_small_gemm_computes_logits(const GemmShape& product, const GemmShape& linear,
                                            DType dtype) {
  const int64_t size = dtype == DType::Float64 ? 8 : 4;
  return cuda_small_gemm_computes_loss_grad(product, dtype) &&
         cuda_small_gemm(linear) == SmallGemm::kDot && linear.m == product.m &&
         linear.n == product.k &&
         loss_grad_shared_elements(product.k, kLossGradRows, linear.k, 16 / size) * size <=
             kSmallGemmSharedBytes;
}

}  // namespace encore
