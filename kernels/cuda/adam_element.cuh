// Adam's update of one element on CUDA, shared by the update kernel (optim.cuh: adam_kernel) and
// the weight gradient's small GEMM kernel that updates its parameter as it computes the gradient
// (weight_adam_gemm.cuh), so the two give the same bits: both files are compiled without
// contraction (nvcc -fmad=false: the corrections' pow is the same code in each), and every
// multiply-add of an element is written as a fused one (fma_of). The formula is the cpu's
// (kernels/cpu/optim.cc), each multiply-add rounded once. Host-compilable, as both kernels.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_error.cuh"
#include "kernels/cuda/element_ops.cuh"
#include "kernels/cuda/step_counter.cuh"
#include "runtime/ops.h"

namespace encore::kernels::cuda {

// Adam's hyper-parameters as the kernels take them: those of the bias corrections in double, as
// the CPU computes them, the others in T. Decoupled (AdamW): p *= 1 - lr*wd and g is used as is;
// coupled: g' = g + wd*p.
template <typename T>
struct AdamStep {
  double lr, beta1, beta2;
  T b1, b2, c1, c2, eps, decay, wd;
};
// Computed by the kernels themselves, from the attributes they are given or from those a static
// plan's captured graph reads at each launch (KernelArgs::device_attrs): one code, compiled
// without contraction, whichever way they came.
template <typename T>
__host__ __device__ AdamStep<T> adam_step(const AdamAttrs& a) {
  return {a.lr,
          a.beta1,
          a.beta2,
          static_cast<T>(a.beta1),
          static_cast<T>(a.beta2),
          static_cast<T>(1 - a.beta1),
          static_cast<T>(1 - a.beta2),
          static_cast<T>(a.eps),
          static_cast<T>(a.decoupled ? 1 - a.lr * a.weight_decay : 1),
          static_cast<T>(a.decoupled ? 0 : a.weight_decay)};
}

// What the bias corrections give the elements of a step `count`: lr / (1 - beta1^count) and
// 1 / sqrt(1 - beta2^count), in double as the CPU computes them, then in T.
template <typename T>
struct AdamCorrections {
  T step_size, inv_sqrt_bc2;
};

// The corrections for `count`, by a warp: its lanes 0 and 1 take the two powers at once; every
// lane returns both.
template <typename T>
__device__ __forceinline__ AdamCorrections<T> adam_corrections(const AdamStep<T>& s,
                                                               int64_t count) {
  const unsigned lane = threadIdx.x % 32;
  const double bc = 1 - pow(lane == 0 ? s.beta1 : s.beta2, static_cast<double>(count));
  const double step_size = __shfl_sync(0xffffffffu, s.lr / bc, 0);
  const double inv_sqrt_bc2 = __shfl_sync(0xffffffffu, 1 / sqrt(bc), 1);
  return {static_cast<T>(step_size), static_cast<T>(inv_sqrt_bc2)};
}

// Element i's update from its gradient gi, with the parameter, m and v it had (pi, mi, vi):
// writes m[i], v[i] and p[i].
template <typename T>
__device__ __forceinline__ void adam_element(const AdamStep<T>& s, const AdamCorrections<T>& c,
                                             T* __restrict__ p, T* __restrict__ m,
                                             T* __restrict__ v, int64_t i, T pi, T gi, T mi, T vi) {
  gi = fma_of(s.wd, pi, gi);
  mi = fma_of(s.b1, mi, s.c1 * gi);
  vi = fma_of(s.b2, vi, s.c2 * gi * gi);
  m[i] = mi;
  v[i] = vi;
  p[i] = fma_of(pi, s.decay, -(c.step_size * mi / fma_of(dev_sqrt(vi), c.inv_sqrt_bc2, s.eps)));
}

// One warp's count of a parameter's step, and the corrections from it: each of `arrivals` warps
// (all the warps of the blocks updating the parameter) counts once (count_step); a count the
// counter cannot keep is reported as `op`'s, parameter `index` of its call.
template <typename T>
__device__ __forceinline__ AdamCorrections<T> count_adam_step(const AdamStep<T>& s,
                                                              int64_t* counter, unsigned arrivals,
                                                              encore::cuda::DeviceErrorSlot errors,
                                                              Op op, int64_t index) {
  int64_t count = 0;
  if (threadIdx.x % 32 == 0) {
    count = count_step(counter, arrivals);
    if (count < 0)
      report_device_error(errors, encore::cuda::DeviceErrorKind::StepCount, op, count, index,
                          int64_t{1} << kArrivalShift);
  }
  return adam_corrections(s, __shfl_sync(0xffffffffu, count, 0));
}

}  // namespace encore::kernels::cuda
