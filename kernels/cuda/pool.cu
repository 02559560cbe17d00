// 2-D max and average pooling on CUDA: the launches and their registration; the kernels and how
// they work are in pool.cuh.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/pool.cuh"
#include "kernels/pool_geometry.h"

namespace encore::kernels::cuda {
namespace {

void max_pool(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0];
  const PoolGeometry g = pool_geometry(x.shape, y.shape, args.attr<Pool2dAttrs>());
  switch_floating(x.dtype, Op::MaxPool2d, [&]<typename T>(Type<T>) {
    const int64_t n = y.numel();
    if (n == 0) return;
    max_pool_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(x.as<T>(), y.as<T>(), g, n);
    ENCORE_CUDA_LAUNCHED(Op::MaxPool2d);
  });
}

// x and gy in, gx (x's shape) out.
void max_pool_grad(const KernelArgs& args) {
  const BufferView &x = args.in[0], &gy = args.in[1], &gx = args.out[0];
  const PoolGeometry g = pool_geometry(x.shape, gy.shape, args.attr<Pool2dAttrs>());
  switch_floating(x.dtype, Op::MaxPool2dGrad, [&]<typename T>(Type<T>) {
    const int64_t n = gx.numel();
    if (n == 0) return;
    max_pool_grad_kernel<T>
        <<<blocks_for(n), kThreads, 0, stream()>>>(x.as<T>(), gy.as<T>(), gx.as<T>(), g, n);
    ENCORE_CUDA_LAUNCHED(Op::MaxPool2dGrad);
  });
}

void avg_pool(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0];
  const PoolGeometry g = pool_geometry(x.shape, y.shape, args.attr<Pool2dAttrs>());
  switch_floating(x.dtype, Op::AvgPool2d, [&]<typename T>(Type<T>) {
    const int64_t n = y.numel();
    if (n == 0) return;
    avg_pool_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(x.as<T>(), y.as<T>(), g, n);
    ENCORE_CUDA_LAUNCHED(Op::AvgPool2d);
  });
}

// gy in, gx (the input's shape) out.
void avg_pool_grad(const KernelArgs& args) {
  const BufferView &gy = args.in[0], &gx = args.out[0];
  const PoolGeometry g = pool_geometry(gx.shape, gy.shape, args.attr<Pool2dAttrs>());
  switch_floating(gy.dtype, Op::AvgPool2dGrad, [&]<typename T>(Type<T>) {
    const int64_t n = gx.numel();
    if (n == 0) return;
    avg_pool_grad_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(gy.as<T>(), gx.as<T>(), g, n);
    ENCORE_CUDA_LAUNCHED(Op::AvgPool2dGrad);
  });
}

ENCORE_REGISTER_CUDA(Op::MaxPool2d, max_pool);
ENCORE_REGISTER_CUDA(Op::MaxPool2dGrad, max_pool_grad);
ENCORE_REGISTER_CUDA(Op::AvgPool2d, avg_pool);
ENCORE_REGISTER_CUDA(Op::AvgPool2dGrad, avg_pool_grad);

}  // namespace
}  // namespace encore::kernels::cuda
