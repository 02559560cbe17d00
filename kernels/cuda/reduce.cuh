// The kernels of the reductions over an axis set on CUDA, sum, mean and max, and their plans
// (reduce.cu launches them; the semantics of kernels/cpu/reduce.cc).
//
// The input's dimensions are simplified first: size-1 dimensions are dropped and neighbours that
// are both reduced or both kept are merged, leaving a "kept" index space (the output, row-major)
// and a "reduced" index space, each a few (size, input stride) groups. Then:
//  - the innermost group is reduced ("rows"): a warp or a block folds each output's elements,
//    which are contiguous at the inside, and joins its threads with a shuffle/shared-memory tree;
//  - the innermost group is kept ("columns"): a block of 32 x split threads takes 32 adjacent
//    outputs (coalesced loads), each of its `split` thread rows folds a fixed interleaved part of
//    the reduced range, and a shared-memory tree joins the parts (column_sum.cuh: the split and
//    the order, which the small GEMM kernel repeats for a bias gradient's sums).
// The association order depends only on the shapes, so every run gives the same bits.
//
// The host compiles this file too, against stand-ins for the CUDA built-ins
// (tests/nvrtc/reduce_emulated_test.cc runs the kernels on the host).
#pragma once

#include <cuda/std/limits>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/element_ops.cuh"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/reduce_util.cuh"
#include "runtime/fused.h"
#include "runtime/shape.h"

namespace encore::kernels::cuda {

// Floating point: -inf and element_ops.cuh's LaneMaxOp (a NaN in either argument gives NaN, as on
// the CPU), as fused kernels fold rows; integers: the lowest value and the larger.
struct MaxOp {
  template <typename T>
  __host__ __device__ static T identity() {
    if constexpr (std::is_floating_point_v<T>) return -::cuda::std::numeric_limits<T>::infinity();
    return ::cuda::std::numeric_limits<T>::lowest();
  }
  template <typename T>
  __device__ static T combine(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return LaneMaxOp::combine(a, b);
    } else {
      return b > a ? b : a;
    }
  }
};

// An index space over some dimensions of the input; group 0 is the innermost.
struct Space {
  int64_t size[Shape::kMaxRank] = {};
  int64_t stride[Shape::kMaxRank] = {};  // in input elements
  int rank = 0;
};

// Input offset of element i (row-major over the space's groups).
__device__ __forceinline__ int64_t offset_of(const Space& s, int64_t i) {
  if (s.rank == 1) return i * s.stride[0];
  int64_t off = 0;
  for (int d = 0; d < s.rank; ++d) {
    const int64_t q = i / s.size[d];
    off += (i - q * s.size[d]) * s.stride[d];
    i = q;
  }
  return off;
}

struct ReducePlan {
  Space kept, reduced;
  bool inner_reduced = false;  // whether the innermost group is reduced (rows) or kept (columns)
};

// Assumes at least one dimension of size > 1 is reduced and every size is > 0.
inline ReducePlan make_reduce_plan(const Shape& shape, uint8_t mask) {
  ReducePlan p;
  int64_t stride = 1;
  int last = -1;  // kind of the group extended last: 1 reduced, 0 kept
  for (int d = shape.rank() - 1; d >= 0; --d) {
    const int64_t size = shape[d];
    if (size == 1) continue;
    const int kind = (mask >> d & 1) != 0 ? 1 : 0;
    Space& s = kind == 1 ? p.reduced : p.kept;
    if (last == -1) p.inner_reduced = kind == 1;
    if (kind == last) {
      s.size[s.rank - 1] *= size;
    } else {
      s.size[s.rank] = size;
      s.stride[s.rank] = stride;
      ++s.rank;
    }
    last = kind;
    stride *= size;
  }
  return p;
}

template <bool kMean, typename T>
__device__ __forceinline__ T finish(T v, int64_t count) {
  if constexpr (kMean) {
    return v / static_cast<T>(count);
  } else {
    (void)count;
    return v;
  }
}

// acc folded with px[offset_of(s, r)] for r = first, first + step, ... below n, in that order. A
// one-group space (the common case: a bias gradient's rows, a row's contiguous elements) loads
// kFoldBatch elements at a time, all in flight before their combines, with no index division
// (none loaded past n); the combines keep their order, so the bits are those of the plain loop.
inline constexpr int kFoldBatch = 16;
template <typename R, typename T>
__device__ __forceinline__ T fold(T acc, const T* __restrict__ px, const Space& s, int64_t first,
                                  int64_t n, int64_t step) {
  if (s.rank == 1) {
    const int64_t stride = s.stride[0];
    for (int64_t r = first; r < n; r += kFoldBatch * step) {
      T v[kFoldBatch];
#pragma unroll
      for (int q = 0; q < kFoldBatch; ++q) {
        const int64_t i = r + q * step;
        v[q] = i < n ? px[i * stride] : R::template identity<T>();
      }
#pragma unroll
      for (int q = 0; q < kFoldBatch; ++q)
        if (r + q * step < n) acc = R::combine(acc, v[q]);
    }
    return acc;
  }
  for (int64_t r = first; r < n; r += step) acc = R::combine(acc, px[offset_of(s, r)]);
  return acc;
}

// Output `row` folds the n elements of the reduced space (innermost stride 1) at its offset.
template <typename R, bool kMean, int kGroup, typename T>
__global__ void __launch_bounds__(kBlockThreads<kGroup>)
    reduce_rows(const T* __restrict__ x, T* __restrict__ y, Space kept, Space reduced, int64_t rows,
                int64_t n) {
  __shared__ T sh[32];
  for_each_group_item<kGroup>(rows, [&](int64_t row, int g) {
    const T* px = x + offset_of(kept, row);
    T acc = fold<R>(R::template identity<T>(), px, reduced, g, n, kGroup);
    acc = group_reduce<R, kGroup>(acc, sh);
    if (g == 0) y[row] = finish<kMean>(acc, n);
  });
}

// Block (width, split), width column_width(outputs): thread (tx, ty) folds reduced elements ty,
// ty + split, ... of output tile * width + tx; a tree over ty joins them (split =
// column_split(n): column_sum_in_order's order).
template <typename R, bool kMean, typename T>
__global__ void __launch_bounds__(32 * kMaxColumnSplit)
    reduce_columns(const T* __restrict__ x, T* __restrict__ y, Space kept, Space reduced,
                   int64_t outputs, int64_t n) {
  __shared__ T sh[kMaxColumnSplit][32];
  const int tx = threadIdx.x, ty = threadIdx.y, width = blockDim.x, split = blockDim.y;
  const int64_t tiles = (outputs + width - 1) / width;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // uniform over the block
    const int64_t o = tile * width + tx;
    T acc = R::template identity<T>();
    if (o < outputs) {
      acc = fold<R>(acc, x + offset_of(kept, o), reduced, ty, n, split);
    }
    sh[ty][tx] = acc;
    __syncthreads();
    for (int s = split / 2; s > 0; s /= 2) {
      if (ty < s) sh[ty][tx] = R::combine(sh[ty][tx], sh[ty + s][tx]);
      __syncthreads();
    }
    if (ty == 0 && o < outputs) y[o] = finish<kMean>(sh[0][tx], n);
    __syncthreads();  // the tile's result is read before the next tile writes sh
  }
}

// The outputs per block of reduce_columns whose columns have `split` thread rows: 32 (a warp's
// 128-byte rows of floats), or where that would leave most of the GPU idle (a bias gradient's
// hundreds of columns over a thousand rows would be a few blocks, each reading the rows alone) 8
// (32-byte rows, a sector of L2), and never a block of fewer than 32 threads.
inline int column_width(int64_t outputs, int split) {
  if (outputs >= 32 * 512) return 32;
  return split >= 4 ? 8 : 32 / split;
}

template <typename T>
__global__ void fill_kernel(T* __restrict__ y, T v, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    y[i] = v;
}

// Calls launch(std::integral_constant<int, kGroup>{}) with the threads that fold each of
// `outputs` rows of `count` elements (the innermost group reduced): a block of 1,024 for a few
// long rows, a block past kMaxCudaReduceRow, else a warp (as fused runs fold rows).
template <typename Launch>
void with_reduce_group(int64_t outputs, int64_t count, Launch&& launch) {
  if (outputs < 64 && count >= 8192) {
    launch(std::integral_constant<int, 1024>{});
  } else if (count > kMaxCudaReduceRow) {
    launch(std::integral_constant<int, kThreads>{});
  } else {
    launch(std::integral_constant<int, 32>{});
  }
}

}  // namespace encore::kernels::cuda
