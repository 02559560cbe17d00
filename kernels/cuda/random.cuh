// The kernels of UniformInit, NormalInit and Dropout on CUDA (random.cu launches them), from
// counter-based Philox: the numbers of kernels/cpu/random.cc and kernels/cpu/dropout.cc, element i
// from philox(seed, offset / 4 + i) computed by whichever thread owns it.
//
// The CPU build (-march=native, GCC's default contraction) evaluates `lo + width * u` and
// `mean + s * c` as fused multiply-adds, so they are written as fma here. Uniform values and
// dropout masks then match the CPU bit for bit; normal values differ by the last bits of log
// and cos, whose device implementations are not glibc's.
//
// With RandomAttrs::state_ptr set, (seed, offset) are read on the device from that address
// instead of the attributes: a CUDA graph replays the launch with its parameters frozen while the
// static plan writes a fresh pair there before each launch.
//
// The host compiles this file too, against stand-ins for the CUDA built-ins
// (tests/nvrtc/random_emulated_test.cc runs the kernels on the host against the CPU's bits).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "kernels/random_util.h"
#include "runtime/rng.h"

namespace encore::kernels::cuda {

// The seed and the first Philox counter of a call.
struct PhiloxStart {
  uint64_t seed;
  uint64_t base;
};

__device__ inline PhiloxStart load_start(uint64_t seed, uint64_t offset, const uint64_t* state) {
  if (state != nullptr) {
    seed = state[0];
    offset = state[1];
  }
  return {seed, offset / 4};
}

template <typename T>
__device__ T fma_t(T a, T b, T c) {
  if constexpr (sizeof(T) == 4) {
    return fmaf(a, b, c);
  } else {
    return fma(a, b, c);
  }
}

// top: uniform_top<T>(low, high), the largest value a draw may take.
template <typename T>
__global__ void uniform_kernel(T* __restrict__ p, int64_t n, T lo, T width, T top, uint64_t seed,
                               uint64_t offset, const uint64_t* state) {
  const PhiloxStart s = load_start(seed, offset, state);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const Philox4 w = philox(s.seed, s.base + static_cast<uint64_t>(i));
    const T v = fma_t(width, unit<T>(w.v), lo);
    p[i] = v < top ? v : top;
  }
}

template <typename T>
__global__ void normal_kernel(T* __restrict__ p, int64_t n, T mean, T stddev, uint64_t seed,
                              uint64_t offset, const uint64_t* state) {
  constexpr int kSecond = sizeof(T) == 4 ? 1 : 2;  // word of u2
  const T two_pi = static_cast<T>(2 * std::numbers::pi);
  const PhiloxStart s = load_start(seed, offset, state);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const Philox4 w = philox(s.seed, s.base + static_cast<uint64_t>(i));
    const T u1 = unit<T>(w.v) + kUnitStep<T>;  // exact: (0, 1]
    const T u2 = unit<T>(w.v + kSecond);
    T radius, angle;
    if constexpr (sizeof(T) == 4) {
      radius = sqrtf(-2.0f * logf(u1));
      angle = cosf(two_pi * u2);
    } else {
      radius = sqrt(-2.0 * log(u1));
      angle = cos(two_pi * u2);
    }
    p[i] = fma_t(stddev * radius, angle, mean);
  }
}

template <typename T>
__global__ void dropout_kernel(const T* __restrict__ x, T* __restrict__ y, T* __restrict__ mask,
                               int64_t n, T ratio, T scale, uint64_t seed, uint64_t offset,
                               const uint64_t* state) {
  const PhiloxStart s = load_start(seed, offset, state);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const T m =
        unit<T>(philox(s.seed, s.base + static_cast<uint64_t>(i)).v) >= ratio ? scale : T(0);
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

}  // namespace encore::kernels::cuda
