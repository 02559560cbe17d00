// Optimizer updates, in place and fused: one elementwise kernel per parameter, the formulas of
// kernels/cpu/optim.cc. Adam's step counter stays on the device: a one-thread kernel increments it
// and the update reads it there, so a step never waits for the host and a captured graph counts
// on every replay.
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace encore::kernels::cuda {
namespace {

// p -= lr * (g + wd * p) (p -= lr * g without weight decay).
template <typename T>
__global__ void sgd_kernel(T* __restrict__ p, const T* __restrict__ g, int64_t n, T lr, T wd,
                           bool decay) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    if (decay) {
      p[i] -= lr * (g[i] + wd * p[i]);
    } else {
      p[i] -= lr * g[i];
    }
  }
}

// v = momentum * v - lr * (g + wd * p); p += v.
template <typename T>
__global__ void momentum_sgd_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ v,
                                    int64_t n, T lr, T mu, T wd) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const T vi = mu * v[i] - lr * (g[i] + wd * p[i]);
    v[i] = vi;
    p[i] += vi;
  }
}

__global__ void increment_kernel(int64_t* t) {
  *t += 1;
}

struct AdamScalars {
  double lr, beta1, beta2;
};

// Adam / AdamW with the CPU's formula; t was incremented by increment_kernel before this launch.
// The bias corrections depend on t only: one thread per block computes them (in double, as the
// CPU) and shares them through shared memory.
template <typename T>
__global__ void adam_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                            T* __restrict__ v, const int64_t* __restrict__ t, int64_t n,
                            AdamScalars s, T b1, T b2, T c1, T c2, T eps, T decay, T wd) {
  __shared__ T shared_step_size, shared_inv_sqrt_bc2;
  if (threadIdx.x == 0) {
    const double steps = static_cast<double>(*t);
    const double bc1 = 1 - pow(s.beta1, steps);
    const double bc2 = 1 - pow(s.beta2, steps);
    shared_step_size = static_cast<T>(s.lr / bc1);
    shared_inv_sqrt_bc2 = static_cast<T>(1 / sqrt(bc2));
  }
  __syncthreads();
  const T step_size = shared_step_size, inv_sqrt_bc2 = shared_inv_sqrt_bc2;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const T pi = p[i];
    const T gi = g[i] + wd * pi;
    const T mi = b1 * m[i] + c1 * gi;
    const T vi = b2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi * decay - step_size * mi / (dev_sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

void sgd(const KernelArgs& args) {
  const BufferView &p = args.in[0], &g = args.in[1];
  const SgdAttrs& a = args.attr<SgdAttrs>();
  switch_floating(p.dtype, Op::SgdUpdate, [&]<typename T>(Type<T>) {
    const int64_t n = p.numel();
    if (n == 0) return;
    sgd_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        p.as<T>(), g.as<T>(), n, static_cast<T>(a.lr), static_cast<T>(a.weight_decay),
        a.weight_decay != 0);
    ENCORE_CUDA_LAUNCHED(Op::SgdUpdate);
  });
}

void momentum_sgd(const KernelArgs& args) {
  const BufferView &p = args.in[0], &g = args.in[1], &v = args.in[2];
  const SgdAttrs& a = args.attr<SgdAttrs>();
  switch_floating(p.dtype, Op::MomentumSgdUpdate, [&]<typename T>(Type<T>) {
    const int64_t n = p.numel();
    if (n == 0) return;
    momentum_sgd_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        p.as<T>(), g.as<T>(), v.as<T>(), n, static_cast<T>(a.lr), static_cast<T>(a.momentum),
        static_cast<T>(a.weight_decay));
    ENCORE_CUDA_LAUNCHED(Op::MomentumSgdUpdate);
  });
}

// in: p, g, m, v, t (int64 step, incremented first, also when p is empty, as on the CPU).
void adam(const KernelArgs& args) {
  const BufferView &p = args.in[0], &g = args.in[1], &m = args.in[2], &v = args.in[3];
  const BufferView& t = args.in[4];
  const AdamAttrs& a = args.attr<AdamAttrs>();
  ENCORE_CHECK(t.dtype == DType::Int64 && t.numel() == 1, op_name(Op::AdamUpdate),
               ": the step counter must be one int64, it is ", t.dtype, " ", t.shape);
  switch_floating(p.dtype, Op::AdamUpdate, [&]<typename T>(Type<T>) {
    increment_kernel<<<1, 1, 0, stream()>>>(t.as<int64_t>());
    ENCORE_CUDA_LAUNCHED(Op::AdamUpdate);
    const int64_t n = p.numel();
    if (n == 0) return;
    // Decoupled: p *= 1 - lr*wd and g is used as is; coupled: g' = g + wd*p.
    const T decay = static_cast<T>(a.decoupled ? 1 - a.lr * a.weight_decay : 1);
    const T wd = static_cast<T>(a.decoupled ? 0 : a.weight_decay);
    adam_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        p.as<T>(), g.as<T>(), m.as<T>(), v.as<T>(), t.as<int64_t>(), n,
        AdamScalars{a.lr, a.beta1, a.beta2}, static_cast<T>(a.beta1), static_cast<T>(a.beta2),
        static_cast<T>(1 - a.beta1), static_cast<T>(1 - a.beta2), static_cast<T>(a.eps), decay, wd);
    ENCORE_CUDA_LAUNCHED(Op::AdamUpdate);
  });
}

ENCORE_REGISTER_CUDA(Op::SgdUpdate, &sgd);
ENCORE_REGISTER_CUDA(Op::MomentumSgdUpdate, &momentum_sgd);
ENCORE_REGISTER_CUDA(Op::AdamUpdate, &adam);

}  // namespace
}  // namespace encore::kernels::cuda
