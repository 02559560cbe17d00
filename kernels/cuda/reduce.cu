// Reductions over an axis set on CUDA: sum, mean, max (the semantics of kernels/cpu/reduce.cc).
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
#include <cuda/std/limits>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce_util.cuh"
#include "runtime/fused.h"

namespace encore::kernels::cuda {
namespace {

constexpr int kMaxRank = Shape::kMaxRank;

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
  int64_t size[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};  // in input elements
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

struct Plan {
  Space kept, reduced;
  bool inner_reduced = false;  // whether the innermost group is reduced (rows) or kept (columns)
};

// Assumes at least one dimension of size > 1 is reduced and every size is > 0.
Plan make_plan(const Shape& shape, uint8_t mask) {
  Plan p;
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
// one-group space (the common case: a bias gradient's rows, a row's contiguous elements) takes
// an unrolled loop with no index division, so that several loads are in flight before their
// combines; the combines keep their order, so the bits are those of the plain loop.
template <typename R, typename T>
__device__ __forceinline__ T fold(T acc, const T* __restrict__ px, const Space& s, int64_t first,
                                  int64_t n, int64_t step) {
  if (s.rank == 1) {
    const int64_t stride = s.stride[0];
#pragma unroll 8
    for (int64_t r = first; r < n; r += step) acc = R::combine(acc, px[r * stride]);
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

// Block (32, split): thread (tx, ty) folds reduced elements ty, ty + split, ... of output
// tile * 32 + tx; a tree over ty joins them (split = column_split(n): column_sum_in_order's
// order).
template <typename R, bool kMean, typename T>
__global__ void __launch_bounds__(32 * kMaxColumnSplit)
    reduce_columns(const T* __restrict__ x, T* __restrict__ y, Space kept, Space reduced,
                   int64_t outputs, int64_t n) {
  __shared__ T sh[kMaxColumnSplit][32];
  const int tx = threadIdx.x, ty = threadIdx.y, split = blockDim.y;
  const int64_t tiles = (outputs + 31) / 32;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // uniform over the block
    const int64_t o = tile * 32 + tx;
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

template <typename T>
__global__ void fill_kernel(T* __restrict__ y, T v, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    y[i] = v;
}

template <typename R, bool kMean, int kGroup, typename T>
void launch_rows(Op op, const T* x, T* y, const Plan& p, int64_t rows, int64_t n) {
  constexpr int kBlock = kBlockThreads<kGroup>;
  reduce_rows<R, kMean, kGroup><<<blocks_for(rows, kBlock / kGroup), kBlock, 0, stream()>>>(
      x, y, p.kept, p.reduced, rows, n);
  ENCORE_CUDA_LAUNCHED(op);
}

template <Op kOp, typename R>
void reduce_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &out = args.out[0];
  const uint8_t mask = args.attr<ReduceAttrs>().axes_mask;
  constexpr bool kMean = kOp == Op::Mean;
  auto run = [&]<typename T>(Type<T>) {
    const int64_t outputs = out.numel();
    if (outputs == x.numel()) {  // nothing folded (mask 0, or only size-1 axes)
      if (outputs > 0)
        ENCORE_CUDA_OK(kOp, cudaMemcpyAsync(out.data, x.data, outputs * sizeof(T),
                                            cudaMemcpyDeviceToDevice, stream()));
      return;
    }
    int64_t count = 1;  // input elements folded into each output
    for (int d = 0; d < x.shape.rank(); ++d)
      if (mask >> d & 1) count *= x.shape[d];
    if (x.numel() == 0) {  // empty folds: the identity (divided by 0 for the mean, as the CPU)
      T v = R::template identity<T>();
      if constexpr (kMean) v = v / static_cast<T>(count);
      fill_kernel<<<blocks_for(outputs), kThreads, 0, stream()>>>(out.as<T>(), v, outputs);
      ENCORE_CUDA_LAUNCHED(kOp);
      return;
    }
    const Plan p = make_plan(x.shape, mask);
    const T* px = x.as<T>();
    T* py = out.as<T>();
    if (p.inner_reduced) {
      if (outputs < 64 && count >= 8192) {
        launch_rows<R, kMean, 1024>(kOp, px, py, p, outputs, count);
      } else if (count > kMaxCudaReduceRow) {  // a warp per row up to it: fused runs too
        launch_rows<R, kMean, kThreads>(kOp, px, py, p, outputs, count);
      } else {
        launch_rows<R, kMean, 32>(kOp, px, py, p, outputs, count);
      }
      return;
    }
    const dim3 block(32, static_cast<unsigned>(column_split(count)));
    reduce_columns<R, kMean><<<blocks_for(outputs, 32), block, 0, stream()>>>(
        px, py, p.kept, p.reduced, outputs, count);
    ENCORE_CUDA_LAUNCHED(kOp);
  };
  if constexpr (kMean) {
    switch_floating(x.dtype, kOp, run);
  } else {
    switch_numeric(x.dtype, kOp, run);
  }
}

ENCORE_REGISTER_CUDA(Op::Sum, (&reduce_kernel<Op::Sum, SumOp>));
ENCORE_REGISTER_CUDA(Op::Mean, (&reduce_kernel<Op::Mean, SumOp>));
ENCORE_REGISTER_CUDA(Op::Max, (&reduce_kernel<Op::Max, MaxOp>));

}  // namespace
}  // namespace encore::kernels::cuda
