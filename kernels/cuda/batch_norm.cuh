// The kernels of batch normalisation over axis 1 on CUDA and their grids (batch_norm.cu launches
// them; the semantics of kernels/cpu/batch_norm.cc): training forward (batch statistics),
// inference forward (running statistics), the training gradient and the running-statistics
// update.
//
// x [N, C, ...] is seen as [N, C, S]; channel c owns the N runs of S elements at (n C + c) S.
// Per-channel sums run in one block per channel, in double: each thread adds a fixed strided
// subset of the channel in order, then a fixed shuffle/shared-memory tree joins the threads, so
// every run gives the same bits (no atomics). The variance is two-pass (mean first, then squared
// deviations) and biased, as on the CPU. Normalisation (forward) runs over a 2-D grid, channels
// by elements; the gradient's elementwise pass runs in the channel's block, which holds the sums
// in double as the CPU does.
//
// The host compiles this file too, against stand-ins for the CUDA built-ins
// (tests/nvrtc/batch_norm_emulated_test.cc runs the kernels on the host).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/grid.h"
#include "kernels/cuda/reduce_util.cuh"

namespace encore::kernels::cuda {

constexpr int kChannelThreads = 512;  // threads of a per-channel block (a multiple of 32)

struct ChannelLayout {
  int64_t n, c, s;
  __host__ __device__ int64_t count() const { return n * s; }  // elements per channel
};

// Walks the elements k, k + step, k + 2 step, ... (k < n s) of one channel as (batch b, offset
// j) pairs, without a division per step. An empty channel (s = 0) has none.
struct ChannelCursor {
  int64_t b, j, step_b, step_j;

  __host__ __device__ ChannelCursor(int64_t k, int64_t step, const ChannelLayout& l)
      : b(l.s > 0 ? k / l.s : l.n),
        j(l.s > 0 ? k % l.s : 0),
        step_b(l.s > 0 ? step / l.s : 0),
        step_j(l.s > 0 ? step % l.s : 0) {}
  __host__ __device__ bool valid(const ChannelLayout& l) const { return b < l.n; }
  // The element's index in x: (b C + channel) S + j.
  __host__ __device__ int64_t at(const ChannelLayout& l, int64_t channel) const {
    return (b * l.c + channel) * l.s + j;
  }
  __host__ __device__ void next(const ChannelLayout& l) {
    b += step_b;
    j += step_j;
    if (j >= l.s) {
      j -= l.s;
      ++b;
    }
  }
};

// The sum of v over the block (every thread gets it); all threads of the block must call it.
// `sh` holds 32 doubles. The order of additions depends only on kChannelThreads.
__device__ __forceinline__ double block_sum(double v, double* sh) {
  return group_reduce<SumOp, kChannelThreads>(v, sh);
}

// 1/sqrt(var + eps) in the dtype of the statistics, computed in double as the CPU does (IEEE
// division and square root: the same bits).
template <typename T>
__host__ __device__ __forceinline__ T inv_std(T var, double eps) {
  return static_cast<T>(1.0 / sqrt(static_cast<double>(var) + eps));
}

// ---- Per-thread pieces: one thread's share of a channel's sums (elements k, k + step, ...) --

template <typename T>
__host__ __device__ double partial_sum(const T* x, const ChannelLayout& l, int64_t ch, int64_t k,
                                       int64_t step) {
  double sum = 0;
  for (ChannelCursor e(k, step, l); e.valid(l); e.next(l))
    sum += static_cast<double>(x[e.at(l, ch)]);
  return sum;
}

template <typename T>
__host__ __device__ double partial_squares(const T* x, double mean, const ChannelLayout& l,
                                           int64_t ch, int64_t k, int64_t step) {
  double squares = 0;
  for (ChannelCursor e(k, step, l); e.valid(l); e.next(l)) {
    const double d = static_cast<double>(x[e.at(l, ch)]) - mean;
    squares += d * d;
  }
  return squares;
}

// sum gy and sum gy (x - mean), (x - mean) in T as on the CPU.
template <typename T>
__host__ __device__ void partial_grad_sums(const T* x, const T* gy, T m, const ChannelLayout& l,
                                           int64_t ch, int64_t k, int64_t step, double& sum_gy,
                                           double& sum_gy_xc) {
  sum_gy = 0;
  sum_gy_xc = 0;
  for (ChannelCursor e(k, step, l); e.valid(l); e.next(l)) {
    const int64_t i = e.at(l, ch);
    const double gv = static_cast<double>(gy[i]);
    sum_gy += gv;
    sum_gy_xc += gv * static_cast<double>(x[i] - m);
  }
}

// total / count, 0 for an empty channel: the mean from the sum, the biased variance from the
// squared deviations.
__host__ __device__ inline double per_element(double total, int64_t count) {
  return count > 0 ? total / static_cast<double>(count) : 0.0;
}

// y = (x - m) * scale + shift for one channel: scale = gamma invstd, shift = beta (gamma, beta:
// null for 1 and 0).
template <typename T>
struct Normalization {
  T m, scale, shift;
  __host__ __device__ Normalization(const T* mean, const T* var, const T* gamma, const T* beta,
                                    double eps, int64_t ch)
      : m(mean[ch]) {
    const T invstd = inv_std(var[ch], eps);
    scale = gamma != nullptr ? gamma[ch] * invstd : invstd;
    shift = beta != nullptr ? beta[ch] : T(0);
  }
  __host__ __device__ T operator()(T x) const { return (x - m) * scale + shift; }
};

// The gradient of one channel from its sums: with xhat = (x - mean) invstd and M elements,
//   gbeta = sum gy,  ggamma = sum gy xhat,  gx = gamma invstd (gy - gbeta/M - xhat ggamma/M),
// the last as gx = k (gy - a - (x - mean) c), with k, a, c rounded to T as on the CPU.
template <typename T>
struct GradCoefficients {
  T m, k, a, c, ggamma, gbeta;
  __host__ __device__ GradCoefficients(T mean, T invstd, const T* gamma, int64_t ch, double sum_gy,
                                       double sum_gy_xc, int64_t count)
      : m(mean) {
    const double is = static_cast<double>(invstd);
    const double n = static_cast<double>(count > 1 ? count : 1);
    const double g = gamma != nullptr ? static_cast<double>(gamma[ch]) : 1.0;
    ggamma = static_cast<T>(sum_gy_xc * is);
    gbeta = static_cast<T>(sum_gy);
    k = static_cast<T>(g * is);
    a = static_cast<T>(sum_gy / n);
    c = static_cast<T>(sum_gy_xc * is * is / n);
  }
  __host__ __device__ T operator()(T x, T gy) const { return k * (gy - a - (x - m) * c); }
};

// ---- Kernels ----------------------------------------------------------------------------------

// Per channel: mean and biased variance (two passes, in double) into mean_out, var_out.
template <typename T>
__global__ void __launch_bounds__(kChannelThreads)
    stats_kernel(const T* __restrict__ x, T* __restrict__ mean_out, T* __restrict__ var_out,
                 ChannelLayout l) {
  __shared__ double sh[32];
  for (int64_t ch = blockIdx.x; ch < l.c; ch += gridDim.x) {
    const double sum = block_sum(partial_sum(x, l, ch, threadIdx.x, kChannelThreads), sh);
    const double mean = per_element(sum, l.count());
    const double squares =
        block_sum(partial_squares(x, mean, l, ch, threadIdx.x, kChannelThreads), sh);
    if (threadIdx.x == 0) {
      mean_out[ch] = static_cast<T>(mean);
      var_out[ch] = static_cast<T>(per_element(squares, l.count()));
    }
  }
}

// y = (x - mean) * invstd * gamma + beta. Grid: y over channels, x over a channel's elements.
template <typename T>
__global__ void normalize_kernel(const T* __restrict__ x, T* __restrict__ y,
                                 const T* __restrict__ mean, const T* __restrict__ var,
                                 const T* __restrict__ gamma, const T* __restrict__ beta,
                                 double eps, ChannelLayout l) {
  const int64_t start = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t ch = blockIdx.y; ch < l.c; ch += gridDim.y) {
    const Normalization<T> f(mean, var, gamma, beta, eps, ch);
    for (ChannelCursor e(start, step, l); e.valid(l); e.next(l)) {
      const int64_t i = e.at(l, ch);
      y[i] = f(x[i]);
    }
  }
}

// x, batch mean, batch var, gy[, gamma] -> gx, ggamma, gbeta (see GradCoefficients).
template <typename T>
__global__ void __launch_bounds__(kChannelThreads)
    grad_kernel(const T* __restrict__ x, const T* __restrict__ mean, const T* __restrict__ var,
                const T* __restrict__ gy, const T* __restrict__ gamma, T* __restrict__ gx,
                T* __restrict__ ggamma, T* __restrict__ gbeta, double eps, ChannelLayout l) {
  __shared__ double sh[32];
  for (int64_t ch = blockIdx.x; ch < l.c; ch += gridDim.x) {
    const T m = mean[ch];
    double sum_gy, sum_gy_xc;
    partial_grad_sums(x, gy, m, l, ch, threadIdx.x, kChannelThreads, sum_gy, sum_gy_xc);
    sum_gy = block_sum(sum_gy, sh);
    sum_gy_xc = block_sum(sum_gy_xc, sh);
    const GradCoefficients<T> f(m, inv_std(var[ch], eps), gamma, ch, sum_gy, sum_gy_xc, l.count());
    if (threadIdx.x == 0) {
      ggamma[ch] = f.ggamma;
      gbeta[ch] = f.gbeta;
    }
    for (ChannelCursor e(threadIdx.x, kChannelThreads, l); e.valid(l); e.next(l)) {
      const int64_t i = e.at(l, ch);
      gx[i] = f(x[i], gy[i]);
    }
  }
}

// running = (1 - momentum) running + momentum batch (the variance made unbiased), in double.
template <typename T>
__global__ void stats_update_kernel(T* __restrict__ rm, T* __restrict__ rv,
                                    const T* __restrict__ bm, const T* __restrict__ bv,
                                    double momentum, double unbias, int64_t n) {
  for (int64_t ch = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; ch < n;
       ch += int64_t{gridDim.x} * blockDim.x) {
    rm[ch] = static_cast<T>((1 - momentum) * static_cast<double>(rm[ch]) +
                            momentum * static_cast<double>(bm[ch]));
    rv[ch] = static_cast<T>((1 - momentum) * static_cast<double>(rv[ch]) +
                            momentum * static_cast<double>(bv[ch]) * unbias);
  }
}

// Blocks for one block per channel (the kernels loop over the rest).
inline unsigned channel_blocks(int64_t c) {
  return static_cast<unsigned>(c < (int64_t{1} << 20) ? c : (int64_t{1} << 20));
}

// The 2-D grid of normalize_kernel: channels in y, a few thousand blocks in all.
inline dim3 normalize_grid(const ChannelLayout& l) {
  const int64_t gy = l.c < 65535 ? l.c : 65535;
  const int64_t per_channel = (l.count() + kThreads * 4 - 1) / (kThreads * 4);
  const int64_t cap = 4096 / gy > 1 ? 4096 / gy : 1;
  const int64_t gx = per_channel < 1 ? 1 : (per_channel < cap ? per_channel : cap);
  return dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), 1);
}

}  // namespace encore::kernels::cuda
