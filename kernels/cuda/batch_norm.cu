// Batch normalisation over axis 1 on CUDA: the launches and their registration; the kernels, their
// grids and how they work are in batch_norm.cuh.
#include <cstdint>

#include "kernels/cuda/batch_norm.cuh"
#include "kernels/cuda/common.cuh"

namespace encore::kernels::cuda {
namespace {

ChannelLayout layout_of(const Shape& x) {
  int64_t s = 1;
  for (int i = 2; i < x.rank(); ++i) s *= x[i];
  return {x[0], x[1], s};
}

template <typename T>
void launch_normalize(Op op, const T* x, T* y, const T* mean, const T* var, const T* gamma,
                      const T* beta, double eps, const ChannelLayout& l) {
  if (l.c == 0 || l.count() == 0) return;
  normalize_kernel<T>
      <<<normalize_grid(l), kThreads, 0, stream()>>>(x, y, mean, var, gamma, beta, eps, l);
  ENCORE_CUDA_LAUNCHED(op);
}

// x[, gamma, beta] -> y, batch mean, biased batch variance.
void batch_norm(const KernelArgs& args) {
  const BufferView& x = args.in[0];
  const ChannelLayout l = layout_of(x.shape);
  const double eps = args.attr<BatchNormAttrs>().eps;
  switch_floating(x.dtype, Op::BatchNorm, [&]<typename T>(Type<T>) {
    if (l.c == 0) return;
    const T* gamma = args.in.size() > 1 ? args.in[1].as<T>() : nullptr;
    const T* beta = args.in.size() > 2 ? args.in[2].as<T>() : nullptr;
    T* mean = args.out[1].as<T>();
    T* var = args.out[2].as<T>();
    stats_kernel<T><<<channel_blocks(l.c), kChannelThreads, 0, stream()>>>(x.as<T>(), mean, var, l);
    ENCORE_CUDA_LAUNCHED(Op::BatchNorm);
    launch_normalize<T>(Op::BatchNorm, x.as<T>(), args.out[0].as<T>(), mean, var, gamma, beta, eps,
                        l);
  });
}

// x, running mean, running var[, gamma, beta] -> y.
void batch_norm_inference(const KernelArgs& args) {
  const BufferView& x = args.in[0];
  const ChannelLayout l = layout_of(x.shape);
  const double eps = args.attr<BatchNormAttrs>().eps;
  switch_floating(x.dtype, Op::BatchNormInference, [&]<typename T>(Type<T>) {
    const T* gamma = args.in.size() > 3 ? args.in[3].as<T>() : nullptr;
    const T* beta = args.in.size() > 4 ? args.in[4].as<T>() : nullptr;
    launch_normalize<T>(Op::BatchNormInference, x.as<T>(), args.out[0].as<T>(), args.in[1].as<T>(),
                        args.in[2].as<T>(), gamma, beta, eps, l);
  });
}

// x, batch mean, batch var, gy[, gamma] -> gx, ggamma, gbeta.
void batch_norm_grad(const KernelArgs& args) {
  const BufferView& x = args.in[0];
  const ChannelLayout l = layout_of(x.shape);
  const double eps = args.attr<BatchNormAttrs>().eps;
  switch_floating(x.dtype, Op::BatchNormGrad, [&]<typename T>(Type<T>) {
    if (l.c == 0) return;
    const T* gamma = args.in.size() > 4 ? args.in[4].as<T>() : nullptr;
    grad_kernel<T><<<channel_blocks(l.c), kChannelThreads, 0, stream()>>>(
        x.as<T>(), args.in[1].as<T>(), args.in[2].as<T>(), args.in[3].as<T>(), gamma,
        args.out[0].as<T>(), args.out[1].as<T>(), args.out[2].as<T>(), eps, l);
    ENCORE_CUDA_LAUNCHED(Op::BatchNormGrad);
  });
}

// running mean, running var, batch mean, batch var (all [C]), in place.
void batch_norm_stats_update(const KernelArgs& args) {
  const BufferView &rm = args.in[0], &rv = args.in[1];
  const BatchNormAttrs& a = args.attr<BatchNormAttrs>();
  const double unbias =
      a.count > 1 ? static_cast<double>(a.count) / static_cast<double>(a.count - 1) : 1.0;
  switch_floating(rm.dtype, Op::BatchNormStatsUpdate, [&]<typename T>(Type<T>) {
    const int64_t n = rm.numel();
    if (n == 0) return;
    stats_update_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        rm.as<T>(), rv.as<T>(), args.in[2].as<T>(), args.in[3].as<T>(), a.momentum, unbias, n);
    ENCORE_CUDA_LAUNCHED(Op::BatchNormStatsUpdate);
  });
}

ENCORE_REGISTER_CUDA(Op::BatchNorm, batch_norm);
ENCORE_REGISTER_CUDA(Op::BatchNormInference, batch_norm_inference);
ENCORE_REGISTER_CUDA(Op::BatchNormGrad, batch_norm_grad);
ENCORE_REGISTER_CUDA(Op::BatchNormStatsUpdate, batch_norm_stats_update);

}  // namespace
}  // namespace encore::kernels::cuda
