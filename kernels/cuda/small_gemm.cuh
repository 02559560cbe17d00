// The kernels of the small GEMMs (runtime/small_gemm.h says which products run here;
// small_gemm.cu launches them): c [m, n] = op(a) op(b) over k, row-major, in one kernel whose
// order of operations depends on the shape alone, each output finished by a GemmFinish (a
// linear's bias, an activation, an activation gradient) before it is stored.
//
// - kDot (a [m, k], b stored [n, k]: a linear's forward): a warp computes a kDotTile x kDotTile
//   tile of c. Lane l multiplies and adds the products of k = l, l + 32, ... in that order (the
//   warp's loads are 32 adjacent elements of a row), then the lanes' sums meet in a shuffle
//   butterfly (xor 16, 8, 4, 2, 1), after which every lane holds the same sum; lane i*4 + j
//   stores output (i, j) of the tile.
// - kSerialK (b stored [k, n], a [m, k] or stored [k, m]: a product's backward): a thread
//   computes kSerialRows outputs of one column of c (one, when c is small), multiplying and adding
//   over k = 0, 1, ... in order; a block's threads take adjacent columns (coalesced loads of b;
//   a's element is the same for the whole warp). With a stored [k, m] it can also sum a's columns
//   (a linear's bias gradient beside its weight gradient): blocks after the product's take a
//   column of a per thread (coalesced loads) and add it up in the order of CUDA's column sum
//   (column_sum.cuh), beside the product's blocks.
//
// Each multiply-add is one fused multiply-add (fma_of); the file is compiled without contraction
// (nvcc -fmad=false), so everything else rounds as the unfused kernels do, and an activation
// applied here gives the bits of the elementwise kernel applying it to the stored product.
//
// The host compiles this file too, against stand-ins for the CUDA built-ins (the tests run the
// kernels on the host: tests/nvrtc/small_gemm_emulated_test.cc); it includes element_ops.cuh and
// column_sum.cuh and runtime/ops.h only.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/element_ops.cuh"
#include "runtime/ops.h"

namespace encore::kernels::cuda {

inline constexpr int kDotTile = 4;   // kDot: a warp's tile of c is kDotTile x kDotTile
inline constexpr int kDotWarps = 4;  // kDot: warps per block (few: a small c has few tiles)
// kSerialK: a thread computes kSerialRows outputs down a column, or one where c has fewer than
// kSerialFewOutputs outputs (more threads, each waiting on fewer loads); a block's threads take
// up to kSerialThreads adjacent columns, a multiple of 32.
inline constexpr int kSerialRows = 4;
inline constexpr int64_t kSerialFewOutputs = 16384;
inline constexpr int kSerialThreads = 128;

// The grid of the kDot (dot) or kSerialK kernel for c [m, n]: `blocks` blocks of `threads`, and
// for kSerialK the outputs per thread; with `sums` (kSerialK), the blocks summing a's m columns
// follow the product's. How the work is cut changes no output's order of operations.
struct GemmLaunch {
  unsigned blocks, threads;
  int rows;
};
inline GemmLaunch small_gemm_launch(bool dot, int64_t m, int64_t n, bool sums = false) {
  if (dot) {
    const int64_t tiles = (m + kDotTile - 1) / kDotTile * ((n + kDotTile - 1) / kDotTile);
    return {static_cast<unsigned>((tiles + kDotWarps - 1) / kDotWarps), kDotWarps * 32, 1};
  }
  const int rows = m * n < kSerialFewOutputs ? 1 : kSerialRows;
  const int64_t threads = std::min<int64_t>(kSerialThreads, (n + 31) / 32 * 32);
  const int64_t blocks = (m + rows - 1) / rows * ((n + threads - 1) / threads) +
                         (sums ? (m + threads - 1) / threads : 0);
  return {static_cast<unsigned>(blocks), static_cast<unsigned>(threads), rows};
}

// How each output v of the product is finished before it is stored at c[at] (row r, column j):
// v + bias[j] where there is a bias (a linear's), then, when `act` is an activation, act(v);
// when it is an activation gradient, act(act_in[at], v) (MatmulActGrad: act_in is what the
// gradient reads, its forward's output or input, laid out as c). `scalar` is leaky_relu's slope or
// gelu's form. Op::Matmul: nothing more. `sums` (kSerialK with a stored [k, m] only): where
// a's column sums go, sums[r] = a[0, r] + ... + a[k - 1, r] (sum(a, 0), as reduce.cuh adds it).
template <typename T>
struct GemmFinish {
  const T* bias = nullptr;
  const T* act_in = nullptr;
  Op act = Op::Matmul;
  T scalar = 0;
  T* sums = nullptr;
};

template <typename T>
__device__ __forceinline__ T fma_of(T a, T b, T c);
template <>
__device__ __forceinline__ float fma_of(float a, float b, float c) {
  return ::fmaf(a, b, c);
}
template <>
__device__ __forceinline__ double fma_of(double a, double b, double c) {
  return ::fma(a, b, c);
}

template <typename T>
__device__ __forceinline__ T finish(const GemmFinish<T>& f, T v, int64_t at, int64_t j) {
  if (f.bias != nullptr) v = el::add(v, f.bias[j]);
  switch (f.act) {
    case Op::Relu:
      return el::relu(v);
    case Op::LeakyRelu:
      return el::leaky_relu(v, f.scalar);
    case Op::Sigmoid:
      return el::sigmoid(v);
    case Op::Tanh:
      return el::tanh(v);
    case Op::Gelu:
      return el::gelu(v, f.scalar);
    case Op::ReluGrad:
      return el::relu_grad(f.act_in[at], v, f.scalar);
    case Op::LeakyReluGrad:
      return el::leaky_relu_grad(f.act_in[at], v, f.scalar);
    case Op::SigmoidGrad:
      return el::sigmoid_grad(f.act_in[at], v, f.scalar);
    case Op::TanhGrad:
      return el::tanh_grad(f.act_in[at], v, f.scalar);
    case Op::GeluGrad:
      return el::gelu_grad(f.act_in[at], v, f.scalar);
    default:
      return v;
  }
}

__device__ __forceinline__ int64_t clamp_index(int64_t i, int64_t size) {
  return i < size ? i : size - 1;
}

// kDot, launched as small_gemm_launch says: warp w of block b computes tile b * kDotWarps + w of
// the ceil(m / kDotTile) x ceil(n / kDotTile) tiles, row by row. A tile past c's edge reads c's
// last row or column in its place and stores nothing there.
template <typename T>
__global__ void __launch_bounds__(kDotWarps * 32)
    gemm_dot_kernel(int64_t m, int64_t n, int64_t k, const T* __restrict__ a, int64_t lda,
                    const T* __restrict__ b, int64_t ldb, T* __restrict__ c, int64_t ldc,
                    GemmFinish<T> f) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t tiles_n = (n + kDotTile - 1) / kDotTile;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * kDotWarps + threadIdx.x / 32;
  if (tile >= tiles_n * ((m + kDotTile - 1) / kDotTile)) return;  // the whole warp
  const int64_t r0 = tile / tiles_n * kDotTile, j0 = tile % tiles_n * kDotTile;
  const T* ar[kDotTile];
  const T* br[kDotTile];
#pragma unroll
  for (int i = 0; i < kDotTile; ++i) {
    ar[i] = a + clamp_index(r0 + i, m) * lda;
    br[i] = b + clamp_index(j0 + i, n) * ldb;
  }
  T acc[kDotTile][kDotTile] = {};
#pragma unroll(sizeof(T) == 4 ? 4 : 2)  // loads in flight
  for (int64_t p = lane; p < k; p += 32) {
    T av[kDotTile], bv[kDotTile];
#pragma unroll
    for (int i = 0; i < kDotTile; ++i) {
      av[i] = ar[i][p];
      bv[i] = br[i][p];
    }
#pragma unroll
    for (int i = 0; i < kDotTile; ++i)
#pragma unroll
      for (int j = 0; j < kDotTile; ++j) acc[i][j] = fma_of(av[i], bv[j], acc[i][j]);
  }
#pragma unroll
  for (int i = 0; i < kDotTile; ++i)
#pragma unroll
    for (int j = 0; j < kDotTile; ++j)
#pragma unroll
      for (int o = 16; o > 0; o /= 2)
        acc[i][j] = el::add(acc[i][j], __shfl_xor_sync(0xffffffffu, acc[i][j], o));
#pragma unroll
  for (int i = 0; i < kDotTile; ++i)
#pragma unroll
    for (int j = 0; j < kDotTile; ++j)
      if (lane == i * kDotTile + j && r0 + i < m && j0 + j < n) {
        const int64_t at = (r0 + i) * ldc + j0 + j;
        c[at] = finish(f, acc[i][j], at, j0 + j);
      }
}

// kSerialK, launched as small_gemm_launch says: block b computes kRows rows from
// b / col_blocks * kRows on, in the blockDim.x columns from b % col_blocks * blockDim.x on. a's
// element (row r, p) is a[r * lda + p], or a[p * lda + r] when trans_a (a stored [k, m]). A
// thread past c's edge reads c's last row or column in its place and stores nothing there. With
// f.sums (trans_a), the blocks after those store a's column sums, thread r of them column r.
template <typename T, int kRows>
__global__ void __launch_bounds__(kSerialThreads)
    gemm_serial_k_kernel(int64_t m, int64_t n, int64_t k, bool trans_a, const T* __restrict__ a,
                         int64_t lda, const T* __restrict__ b, int64_t ldb, T* __restrict__ c,
                         int64_t ldc, GemmFinish<T> f) {
  const int64_t width = blockDim.x, col_blocks = (n + width - 1) / width;
  const int64_t product_blocks = (m + kRows - 1) / kRows * col_blocks;
  if (static_cast<int64_t>(blockIdx.x) >= product_blocks) {  // a's column sums (f.sums set)
    const int64_t r = (blockIdx.x - product_blocks) * width + threadIdx.x;
    if (r < m) f.sums[r] = column_sum_in_order(a + r, lda, k);
    return;
  }
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / col_blocks * kRows;
  const int64_t j = static_cast<int64_t>(blockIdx.x) % col_blocks * width + threadIdx.x;
  const int64_t jb = clamp_index(j, n);
  const int64_t step = trans_a ? lda : 1;  // from a's element (r, p) to (r, p + 1)
  const T* ar[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) ar[i] = a + clamp_index(r0 + i, m) * (trans_a ? 1 : lda);
  T acc[kRows] = {};
#pragma unroll 8  // loads in flight
  for (int64_t p = 0; p < k; ++p) {
    const T bv = b[p * ldb + jb];
#pragma unroll
    for (int i = 0; i < kRows; ++i) acc[i] = fma_of(ar[i][p * step], bv, acc[i]);
  }
  if (j >= n) return;
#pragma unroll
  for (int i = 0; i < kRows; ++i)
    if (r0 + i < m) {
      const int64_t at = (r0 + i) * ldc + j;
      c[at] = finish(f, acc[i], at, j);
    }
}

}  // namespace encore::kernels::cuda
