// Layer normalisation over the last `cols` elements of each row: x is seen as [R, C].
//   y = (x - mean) rstd gamma + beta,  rstd = 1/sqrt(biased var + eps)
// The forward saves mean and rstd per row; the gradient reads them back, so it differentiates the
// normalisation that ran. The forward is layer_norm_rows (layer_norm_row.h) over each thread's
// rows, the function the fused kernel runs too. Rows are split across threads (each row by one
// thread); gamma's and beta's gradients sum over rows, each column by one thread in row order. Sums
// run in double, in lanes combined in a fixed order: the same bits at any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/kernel.h"
#include "kernels/cpu/layer_norm_row.h"
#include "kernels/cpu/sum_lanes.h"
#include "runtime/parallel.h"

namespace encore::kernels::cpu {
namespace {

// Rows per chunk of a parallel loop over rows of `cols` elements (about 32k elements a chunk).
int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, cols));
}

template <typename T>
struct Affine {
  const T* gamma = nullptr;  // null: 1
  const T* beta = nullptr;   // null: 0
};

template <typename T>
Affine<T> affine_of(const KernelArgs& args, const LayerNormAttrs& a) {
  Affine<T> f;
  size_t next = 1;
  if (a.affine & kLayerNormGamma) f.gamma = args.in[next++].as<T>();
  if (a.affine & kLayerNormBeta) f.beta = args.in[next].as<T>();
  return f;
}

// x[, gamma][, beta] -> y, mean, rstd.
void layer_norm_kernel(const KernelArgs& args) {
  const LayerNormAttrs& a = args.attr<LayerNormAttrs>();
  const int64_t cols = a.cols, rows = args.out[1].numel();
  switch_floating(args.in[0].dtype, Op::LayerNorm, [&]<typename T>(Type<T>) {
    const T* px = args.in[0].as<T>();
    const Affine<T> f = affine_of<T>(args, a);
    T* py = args.out[0].as<T>();
    T* mean_out = args.out[1].as<T>();
    T* rstd_out = args.out[2].as<T>();
    parallel_for(rows, row_grain(cols), [&](int64_t begin, int64_t end) {
      layer_norm_rows(px + begin * cols, f.gamma, f.beta, py + begin * cols, mean_out + begin,
                      rstd_out + begin, end - begin, cols, a.eps);
    });
  });
}

// x, mean, rstd, gy[, gamma] -> gx, ggamma, gbeta. With xhat = (x - mean) rstd, g = gy gamma:
//   gx = rstd (g - mean(g) - xhat mean(g xhat)),  ggamma = sum_rows gy xhat,  gbeta = sum_rows gy.
void layer_norm_grad_kernel(const KernelArgs& args) {
  const int64_t cols = args.attr<LayerNormAttrs>().cols, rows = args.in[1].numel();
  switch_floating(args.in[0].dtype, Op::LayerNormGrad, [&]<typename T>(Type<T>) {
    const T* px = args.in[0].as<T>();
    const T* mean = args.in[1].as<T>();
    const T* rstd = args.in[2].as<T>();
    const T* pgy = args.in[3].as<T>();
    const T* gamma = args.in.size() > 4 ? args.in[4].as<T>() : nullptr;
    T* pgx = args.out[0].as<T>();
    T* ggamma = args.out[1].as<T>();
    T* gbeta = args.out[2].as<T>();
    const double count = static_cast<double>(std::max<int64_t>(cols, 1));
    parallel_for(rows, row_grain(cols), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* x = px + r * cols;
        const T* gy = pgy + r * cols;
        T* gx = pgx + r * cols;
        const T m = mean[r], rs = rstd[r];
        auto g = [&](int64_t i) {
          return static_cast<double>(gamma != nullptr ? gy[i] * gamma[i] : gy[i]);
        };
        const double mean_g = sum_lanes(cols, g) / count;
        const double mean_gh =
            sum_lanes(cols,
                      [&](int64_t i) { return g(i) * static_cast<double>((x[i] - m) * rs); }) /
            count;
        const T a = static_cast<T>(mean_g), c = static_cast<T>(mean_gh);
        for (int64_t i = 0; i < cols; ++i) {
          const T gi = gamma != nullptr ? gy[i] * gamma[i] : gy[i];
          gx[i] = rs * (gi - a - (x[i] - m) * rs * c);
        }
      }
    });
    // Column sums: blocks of kBlock columns, each block's columns summed over all rows in order.
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (cols + kBlock - 1) / kBlock;
    const int64_t grain =
        std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, rows * kBlock));
    parallel_for(blocks, grain, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t c0 = b * kBlock, c1 = std::min(cols, c0 + kBlock);
        double sum_gh[kBlock] = {}, sum_g[kBlock] = {};
        for (int64_t r = 0; r < rows; ++r) {
          const T* x = px + r * cols;
          const T* gy = pgy + r * cols;
          const T m = mean[r], rs = rstd[r];
          for (int64_t i = c0; i < c1; ++i) {
            const double gv = static_cast<double>(gy[i]);
            sum_gh[i - c0] += gv * static_cast<double>((x[i] - m) * rs);
            sum_g[i - c0] += gv;
          }
        }
        for (int64_t i = c0; i < c1; ++i) {
          ggamma[i] = static_cast<T>(sum_gh[i - c0]);
          gbeta[i] = static_cast<T>(sum_g[i - c0]);
        }
      }
    });
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::LayerNorm, DeviceType::CPU, &layer_norm_kernel);
  register_kernel(Op::LayerNormGrad, DeviceType::CPU, &layer_norm_grad_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
