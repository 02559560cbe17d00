// Group folds shared by the reduction kernels (reduce.cuh, softmax_loss.cuh, layer_norm.cuh,
// batch_norm.cu), over element_ops.cuh's fold ops and warp tree (which fused kernels share): the
// tree of a fold is fixed by the group size alone, so every run gives the same bits.
// Host-compilable (the emulated kernel tests, tests/nvrtc/).
#pragma once

#include <cstdint>

#include "kernels/cuda/element_ops.cuh"  // SumOp, warp_reduce
#include "kernels/cuda/grid.h"

namespace encore::kernels::cuda {

// Threads of a block that runs groups of kGroup threads.
template <int kGroup>
inline constexpr int kBlockThreads = kGroup > kThreads ? kGroup : kThreads;

// In a kernel of kBlockThreads<kGroup> threads per block: calls body(item, g) for every item <
// items that falls to this thread's group (the block's groups take consecutive items, then the
// grid strides), g the thread's index in its group. Uniform over each group.
template <int kGroup, typename Body>
__device__ __forceinline__ void for_each_group_item(int64_t items, Body&& body) {
  constexpr int kPerBlock = kBlockThreads<kGroup> / kGroup;
  const int g = threadIdx.x % kGroup;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kPerBlock;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kPerBlock + threadIdx.x / kGroup;
       item < items; item += step)
    body(item, g);
}

// The fold of one value per thread over a group of kGroup consecutive threads (1, a warp, or the
// whole block), returned to every thread of the group. `sh` holds 32 values; with a whole-block
// group every thread of the block must call this.
template <typename R, int kGroup, typename T>
__device__ __forceinline__ T group_reduce(T v, T* sh) {
  if constexpr (kGroup == 1) {
    (void)sh;
    return v;
  } else if constexpr (kGroup == 32) {
    (void)sh;
    return warp_reduce<R>(v);
  } else {
    static_assert(kGroup % 32 == 0 && kGroup <= 1024);
    v = warp_reduce<R>(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < kGroup / 32 ? sh[lane] : R::template identity<T>();
    v = warp_reduce<R>(v);
    __syncthreads();  // sh is free again for the next call
    return v;
  }
}

}  // namespace encore::kernels::cuda
