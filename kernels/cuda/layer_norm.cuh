// The kernels of layer normalisation on CUDA and their grids (layer_norm.cu launches them): x
// seen as [R, C].
//
// A warp per row for rows of up to 1024 elements (shuffles only), else a block per row (a
// grid-stride loop over rows): each thread adds a fixed strided subset of the row in double, a
// fixed shuffle (and shared-memory) tree joins the threads (no atomics, the same bits on every
// run). The variance is two-pass and biased. The gradient of gamma and beta sums over rows: a warp
// of columns per block, 32 threads per column over interleaved rows, joined by a fixed tree (the
// same bits on every run). Over up to kOneLaunchRows rows of up to 1,024 elements the input
// gradient and gamma's and beta's are one launch, whose blocks take one or the other: the same
// values, one launch fewer where the launch is the cost.
//
// The host compiles this file too, against stand-ins for the CUDA built-ins
// (tests/nvrtc/layer_norm_emulated_test.cc runs the kernels on the host).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/element_ops.cuh"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/reduce_util.cuh"
#include "runtime/fused.h"

namespace encore::kernels::cuda {

// Calls launch(std::integral_constant<int, kGroup>{}) with the threads per row: a warp for rows
// of up to kMaxCudaRow (1,024) elements, else a whole block.
template <typename Launch>
void with_row_group(int64_t cols, Launch&& launch) {
  if (cols <= kMaxCudaRow) {  // fused runs too
    launch(std::integral_constant<int, 32>{});
  } else {
    launch(std::integral_constant<int, kThreads>{});
  }
}

// Blocks for `rows` rows of kGroup threads each.
template <int kGroup>
unsigned row_blocks(int64_t rows) {
  return blocks_for(rows, kBlockThreads<kGroup> / kGroup);
}

template <int kGroup, typename T>
__global__ void __launch_bounds__(kBlockThreads<kGroup>)
    layer_norm_kernel(const T* x, const T* gamma, const T* beta, T* y, T* mean_out, T* rstd_out,
                      int64_t rows, int64_t cols, double eps) {
  __shared__ double sh[32];
  const double count = static_cast<double>(cols > 0 ? cols : 1);
  for_each_group_item<kGroup>(rows, [&](int64_t r, int g) {
    const T* xr = x + r * cols;
    double s = 0;
    for (int64_t i = g; i < cols; i += kGroup) s += static_cast<double>(xr[i]);
    const double mean = group_reduce<SumOp, kGroup>(s, sh) / count;
    double q = 0;
    for (int64_t i = g; i < cols; i += kGroup) q += rowop::layer_norm_square(xr[i], mean);
    const double var = group_reduce<SumOp, kGroup>(q, sh) / count;
    const T m = static_cast<T>(mean);
    const T rs = static_cast<T>(rowop::layer_norm_rstd(var, eps));
    if (g == 0) {
      mean_out[r] = m;
      rstd_out[r] = rs;
    }
    T* yr = y + r * cols;
    for (int64_t i = g; i < cols; i += kGroup)
      yr[i] = rowop::layer_norm_value(xr[i], m, rs, gamma != nullptr,
                                      gamma != nullptr ? gamma[i] : T(1),
                                      beta != nullptr ? beta[i] : T(0));
  });
}

// gx = rstd (g - mean(g) - xhat mean(g xhat)), g = gy gamma, xhat = (x - mean) rstd, for row r,
// by thread g of the row's group of kGroup threads.
template <int kGroup, typename T>
__device__ __forceinline__ void grad_x_row(const T* x, const T* mean, const T* rstd, const T* gy,
                                           const T* gamma, T* gx, int64_t cols, int64_t r, int g,
                                           double* sh) {
  const double count = static_cast<double>(cols > 0 ? cols : 1);
  const T* xr = x + r * cols;
  const T* gr = gy + r * cols;
  const T m = mean[r], rs = rstd[r];
  double sg = 0, sgh = 0;
  for (int64_t i = g; i < cols; i += kGroup) {
    const double v = static_cast<double>(gamma != nullptr ? gr[i] * gamma[i] : gr[i]);
    sg += v;
    sgh += v * static_cast<double>((xr[i] - m) * rs);
  }
  const T a = static_cast<T>(group_reduce<SumOp, kGroup>(sg, sh) / count);
  const T c = static_cast<T>(group_reduce<SumOp, kGroup>(sgh, sh) / count);
  T* out = gx + r * cols;
  for (int64_t i = g; i < cols; i += kGroup) {
    const T v = gamma != nullptr ? gr[i] * gamma[i] : gr[i];
    out[i] = rs * (v - a - (xr[i] - m) * rs * c);
  }
}

// Columns of a block of the gamma/beta gradient: 8, a 32-byte sector of each row of floats (a
// warp's 32 columns made a block of few hundred columns over a thousand rows a few blocks, each
// walking every row alone).
inline constexpr int kParamCols = 8;
inline constexpr int kParamLanes = 32;  // threads per column, each over every kParamLanes-th row
inline constexpr int kParamThreads = kParamCols * kParamLanes;
inline constexpr int kParamBatch = 8;  // rows a thread loads at a time, all in flight

// ggamma[c] = sum_r gy xhat, gbeta[c] = sum_r gy over the kParamCols columns from
// `block` * kParamCols, by a block of kParamThreads threads: thread (ty, tx) = (t / kParamCols,
// t % kParamCols) adds rows ty, ty + kParamLanes, ... of column tx in row order (loading
// kParamBatch of them before adding them), then a fixed tree over ty joins the lanes of each
// column.
template <typename T>
__device__ __forceinline__ void grad_params_block(const T* x, const T* mean, const T* rstd,
                                                  const T* gy, T* ggamma, T* gbeta, int64_t rows,
                                                  int64_t cols, int64_t block) {
  __shared__ double sh_gh[kParamLanes][kParamCols + 1];
  __shared__ double sh_g[kParamLanes][kParamCols + 1];
  const int tx = static_cast<int>(threadIdx.x % kParamCols),
            ty = static_cast<int>(threadIdx.x / kParamCols);
  const int64_t c = block * kParamCols + tx;
  double sgh = 0, sg = 0;
  if (c < cols) {
    for (int64_t r0 = ty; r0 < rows; r0 += kParamBatch * kParamLanes) {
      T gv[kParamBatch], xh[kParamBatch];
#pragma unroll
      for (int q = 0; q < kParamBatch; ++q) {
        const int64_t r = r0 + q * kParamLanes;
        gv[q] = r < rows ? gy[r * cols + c] : T(0);
        xh[q] = r < rows ? (x[r * cols + c] - mean[r]) * rstd[r] : T(0);
      }
#pragma unroll
      for (int q = 0; q < kParamBatch; ++q) {
        if (r0 + q * kParamLanes >= rows) break;
        const double g = static_cast<double>(gv[q]);
        sgh += g * static_cast<double>(xh[q]);
        sg += g;
      }
    }
  }
  sh_gh[ty][tx] = sgh;
  sh_g[ty][tx] = sg;
  __syncthreads();
  for (int half = kParamLanes / 2; half > 0; half /= 2) {
    if (ty < half) {
      sh_gh[ty][tx] += sh_gh[ty + half][tx];
      sh_g[ty][tx] += sh_g[ty + half][tx];
    }
    __syncthreads();
  }
  if (ty == 0 && c < cols) {
    ggamma[c] = static_cast<T>(sh_gh[0][tx]);
    gbeta[c] = static_cast<T>(sh_g[0][tx]);
  }
}

// The input gradient, a group of kGroup threads per row; gamma's and beta's in a launch of their
// own.
template <int kGroup, typename T>
__global__ void __launch_bounds__(kBlockThreads<kGroup>)
    layer_norm_grad_x_kernel(const T* x, const T* mean, const T* rstd, const T* gy, const T* gamma,
                             T* gx, int64_t rows, int64_t cols) {
  __shared__ double sh[32];
  for_each_group_item<kGroup>(rows, [&](int64_t r, int g) {
    grad_x_row<kGroup>(x, mean, rstd, gy, gamma, gx, cols, r, g, sh);
  });
}
template <typename T>
__global__ void __launch_bounds__(kParamThreads)
    layer_norm_grad_params_kernel(const T* x, const T* mean, const T* rstd, const T* gy, T* ggamma,
                                  T* gbeta, int64_t rows, int64_t cols) {
  grad_params_block(x, mean, rstd, gy, ggamma, gbeta, rows, cols, blockIdx.x);
}

// Up to this many rows of up to kMaxCudaRow, both gradients are one launch of kParamThreads-thread
// blocks, a warp per row. More rows take the two launches, whose input-gradient blocks of kThreads
// keep more warps per SM.
inline constexpr int64_t kOneLaunchRows = 4096;
inline constexpr int kOneLaunchRowsPerBlock = kParamThreads / 32;  // a warp per row

// The gradient's grid over `rows` rows of `cols`: gamma's and beta's `param_blocks` blocks,
// followed in one launch (layer_norm_grad_kernel) by the input gradient's `x_blocks`, or in a
// launch of their own (layer_norm_grad_params_kernel) after the input gradient's
// (layer_norm_grad_x_kernel, row_blocks).
struct LayerNormGradGrid {
  bool one_launch;
  unsigned param_blocks, x_blocks;
};
inline LayerNormGradGrid layer_norm_grad_grid(int64_t rows, int64_t cols) {
  const bool one = cols <= kMaxCudaRow && rows <= kOneLaunchRows;
  return {one, static_cast<unsigned>((cols + kParamCols - 1) / kParamCols),
          one ? static_cast<unsigned>((rows + kOneLaunchRowsPerBlock - 1) / kOneLaunchRowsPerBlock)
              : 0u};
}

// Both gradients in one launch: the first `param_blocks` blocks take gamma's and beta's,
// kParamCols columns each (first, as they walk every row), the others the input gradient, a warp
// per row (warp w of the b-th of them: rows b * kRowsPerBlock + w, then every x_blocks *
// kRowsPerBlock-th). Each value is computed as by the two kernels above (a row's warp tree, a
// column's lanes and tree), so the bits do not depend on which launch or block computes it.
template <typename T>
__global__ void __launch_bounds__(kParamThreads)
    layer_norm_grad_kernel(const T* x, const T* mean, const T* rstd, const T* gy, const T* gamma,
                           T* gx, T* ggamma, T* gbeta, int64_t rows, int64_t cols,
                           unsigned param_blocks, unsigned x_blocks) {
  constexpr int kRowsPerBlock = kOneLaunchRowsPerBlock;
  if (blockIdx.x < param_blocks) {  // uniform over the block
    grad_params_block(x, mean, rstd, gy, ggamma, gbeta, rows, cols, blockIdx.x);
    return;
  }
  const int64_t b = blockIdx.x - param_blocks,
                step = static_cast<int64_t>(x_blocks) * kRowsPerBlock;
  for (int64_t r = b * kRowsPerBlock + threadIdx.x / 32; r < rows; r += step)
    grad_x_row<32>(x, mean, rstd, gy, gamma, gx, cols, r, static_cast<int>(threadIdx.x % 32),
                   nullptr);
}

}  // namespace encore::kernels::cuda
