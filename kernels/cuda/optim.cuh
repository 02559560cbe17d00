// The kernels of the optimizer updates on CUDA and their launch tables (optim.cu launches them):
// in place and fused, the formulas of kernels/cpu/optim.cc. A call updates one
// or more parameters (one group of inputs each, op_traits.h) in one launch per kMaxTensors of them:
// each parameter gets its own range of blocks, as PyTorch's multi-tensor apply does, so an
// optimizer step is one kernel per 48 parameters of a dtype instead of one per parameter. Adam's
// step counters stay on the device, counted by the update kernel's blocks themselves
// (step_counter.cuh), so a step never waits for the host and a captured graph counts on every
// replay.
//
// The host compiles this file too, against stand-ins for the CUDA built-ins
// (tests/nvrtc/optim_emulated_test.cc runs the kernels on the host).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "kernels/cuda/adam_element.cuh"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_error.cuh"
#include "kernels/cuda/element_ops.cuh"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/step_counter.cuh"
#include "kernels/update_groups.h"
#include "runtime/kernel_abi.h"
#include "runtime/ops.h"

namespace encore::kernels::cuda {

// Parameters per launch: the table travels as a kernel argument (Adam's, with its counters and
// hyper-parameters, about 2.6 KB of the 4 KB). 48 takes a small transformer's (TinyGpt's 30) in
// one launch.
inline constexpr int kMaxTensors = 48;

// The parameters of one launch: per array (param, grad, and the optimizer's state) a pointer per
// parameter, each one's element count, and the first block of each (the last entry: the grid);
// `first`: the call's index of the launch's first parameter.
template <int kArrays>
struct TensorTable {
  void* ptr[kArrays][kMaxTensors];
  int64_t numel[kMaxTensors];
  unsigned first_block[kMaxTensors + 1];
  int count, first;
};

struct Counters {
  int64_t* t[kMaxTensors];
  int count;
};

// The parameter this block updates, the block's place among that parameter's blocks, and how
// many it has.
struct BlockRange {
  int k;
  int64_t begin, stride, n;
  unsigned blocks;
};

template <int kArrays>
__device__ BlockRange block_range(const TensorTable<kArrays>& tab) {
  int k = 0;
  while (k + 1 < tab.count && blockIdx.x >= tab.first_block[k + 1]) ++k;
  const unsigned blocks = tab.first_block[k + 1] - tab.first_block[k];
  return {k, static_cast<int64_t>(blockIdx.x - tab.first_block[k]) * blockDim.x + threadIdx.x,
          static_cast<int64_t>(blocks) * blockDim.x, tab.numel[k], blocks};
}

template <typename T, int kArrays>
__device__ T* array(const TensorTable<kArrays>& tab, int a, int k) {
  return static_cast<T*>(tab.ptr[a][k]);
}

// Each update kernel computes with its attributes argument, or with those where `live` points
// (a static plan's graph writes them there before each launch: KernelArgs::device_attrs): the
// same code either way.
//
// p -= lr * (g + wd * p) (p -= lr * g without weight decay).
template <typename T>
__global__ void sgd_kernel(TensorTable<2> tab, SgdAttrs attrs, const SgdAttrs* live) {
  dependent_launch_start();
  const SgdAttrs a = live != nullptr ? *live : attrs;
  const T lr = static_cast<T>(a.lr), wd = static_cast<T>(a.weight_decay);
  const bool decay = a.weight_decay != 0;
  const BlockRange r = block_range(tab);
  T* __restrict__ p = array<T>(tab, 0, r.k);
  const T* __restrict__ g = array<T>(tab, 1, r.k);
  for (int64_t i = r.begin; i < r.n; i += r.stride) {
    if (decay) {
      p[i] -= lr * (g[i] + wd * p[i]);
    } else {
      p[i] -= lr * g[i];
    }
  }
}

// v = momentum * v - lr * (g + wd * p); p += v.
template <typename T>
__global__ void momentum_sgd_kernel(TensorTable<3> tab, SgdAttrs attrs, const SgdAttrs* live) {
  dependent_launch_start();
  const SgdAttrs a = live != nullptr ? *live : attrs;
  const T lr = static_cast<T>(a.lr), mu = static_cast<T>(a.momentum),
          wd = static_cast<T>(a.weight_decay);
  const BlockRange r = block_range(tab);
  T* __restrict__ p = array<T>(tab, 0, r.k);
  const T* __restrict__ g = array<T>(tab, 1, r.k);
  T* __restrict__ v = array<T>(tab, 2, r.k);
  for (int64_t i = r.begin; i < r.n; i += r.stride) {
    const T vi = mu * v[i] - lr * (g[i] + wd * p[i]);
    v[i] = vi;
    p[i] += vi;
  }
}

// The largest launch's arguments (adam_kernel's: the table, the counters, the attributes and the
// error slot) within the 4 KB every CUDA version takes.
static_assert(sizeof(TensorTable<4>) + sizeof(Counters) + sizeof(AdamAttrs) +
                  sizeof(const AdamAttrs*) + sizeof(encore::cuda::DeviceErrorSlot) <=
              4096);

// Adam / AdamW with the CPU's formula (adam_element.cuh). The bias corrections depend on the step
// count t only: the first warp of a block counts the step (count_step: t after it, the last block
// storing it) and computes its parameter's corrections, shared through shared memory. Every
// thread loads its first element (a grid usually gives each thread one) before that, so the loads
// are in flight while the step is counted. A count it cannot keep is reported to the host
// (DeviceErrorKind::StepCount).
template <typename T>
__global__ void adam_kernel(TensorTable<4> tab, Counters c, AdamAttrs attrs, const AdamAttrs* live,
                            encore::cuda::DeviceErrorSlot errors) {
  dependent_launch_start();
  const AdamAttrs a = live != nullptr ? *live : attrs;
  const AdamStep<T> s = adam_step<T>(a);
  const BlockRange r = block_range(tab);
  T* __restrict__ p = array<T>(tab, 0, r.k);
  const T* __restrict__ g = array<T>(tab, 1, r.k);
  T* __restrict__ m = array<T>(tab, 2, r.k);
  T* __restrict__ v = array<T>(tab, 3, r.k);
  T p0{}, g0{}, m0{}, v0{};  // the thread's first element's
  if (r.begin < r.n) {
    p0 = p[r.begin];
    g0 = g[r.begin];
    m0 = m[r.begin];
    v0 = v[r.begin];
  }
  __shared__ AdamCorrections<T> shared;
  if (threadIdx.x < 32) {
    const AdamCorrections<T> mine =
        count_adam_step(s, c.t[r.k], r.blocks, errors, Op::AdamUpdate, tab.first + r.k);
    if (threadIdx.x == 0) shared = mine;
  }
  __syncthreads();
  const AdamCorrections<T> corrections = shared;
  if (r.begin < r.n) adam_element(s, corrections, p, m, v, r.begin, p0, g0, m0, v0);
  for (int64_t i = r.begin + r.stride; i < r.n; i += r.stride)
    adam_element(s, corrections, p, m, v, i, p[i], g[i], m[i], v[i]);
}

// Calls launch(table, counters, blocks) for each kMaxTensors parameters of a call of update op
// kOp (kernels/update_groups.h): each group's arrays in the table (the parameter first) and its
// step counter, if any, in the counters. A parameter with no elements gets no blocks, or one
// where it has a step counter, which still counts (count_step) while the block updates nothing.
template <Op kOp, typename Launch>
void for_each_launch(std::span<const BufferView> in, Launch launch) {
  constexpr UpdateGroup kGroup = update_group(kOp);
  check_update_groups(in, kOp);
  for (size_t g0 = 0; g0 < in.size(); g0 += kGroup.size * kMaxTensors) {
    TensorTable<kGroup.arrays> tab{};
    tab.first = static_cast<int>(g0 / kGroup.size);
    Counters counters{};
    unsigned blocks = 0;
    for (size_t g = g0; g < in.size() && tab.count < kMaxTensors; g += kGroup.size) {
      const int k = tab.count++;
      for (int a = 0; a < kGroup.arrays; ++a) tab.ptr[a][k] = in[g + a].data;
      if constexpr (kGroup.counter >= 0)
        counters.t[counters.count++] = in[g + kGroup.counter].as<int64_t>();
      const int64_t n = in[g].numel();
      tab.numel[k] = n;
      tab.first_block[k] = blocks;
      blocks += n > 0 ? blocks_for(n) : kGroup.counter >= 0 ? 1 : 0;
    }
    tab.first_block[tab.count] = blocks;
    launch(tab, counters, blocks);
  }
}

}  // namespace encore::kernels::cuda
