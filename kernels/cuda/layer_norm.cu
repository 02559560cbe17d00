// Layer normalisation on CUDA (the semantics of kernels/cpu/layer_norm.cc); the kernels, their
// grids and how they work are in layer_norm.cuh.
#include <climits>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/layer_norm.cuh"

namespace encore::kernels::cuda {
namespace {

void layer_norm(const KernelArgs& args) {
  const LayerNormAttrs& a = args.attr<LayerNormAttrs>();
  const int64_t rows = args.out[1].numel();
  if (rows == 0) return;
  switch_floating(args.in[0].dtype, Op::LayerNorm, [&]<typename T>(Type<T>) {
    const T* gamma = nullptr;
    const T* beta = nullptr;
    size_t next = 1;
    if (a.affine & kLayerNormGamma) gamma = args.in[next++].as<T>();
    if (a.affine & kLayerNormBeta) beta = args.in[next].as<T>();
    with_row_group(a.cols, [&](auto group) {
      constexpr int kGroup = decltype(group)::value;
      layer_norm_kernel<kGroup, T>
          <<<row_blocks<kGroup>(rows), kBlockThreads<kGroup>, 0, stream()>>>(
              args.in[0].as<T>(), gamma, beta, args.out[0].as<T>(), args.out[1].as<T>(),
              args.out[2].as<T>(), rows, a.cols, a.eps);
      ENCORE_CUDA_LAUNCHED(Op::LayerNorm);
    });
  });
}

void layer_norm_grad(const KernelArgs& args) {
  const int64_t cols = args.attr<LayerNormAttrs>().cols, rows = args.in[1].numel();
  if (cols <= 0) return;
  // A block per kParamCols columns of gamma's and beta's gradients, no loop over them: a grid
  // that cannot hold them would leave columns unwritten.
  ENCORE_CHECK((cols + kParamCols - 1) / kParamCols <= INT_MAX, op_name(Op::LayerNormGrad), ": ",
               cols, " columns are more than one launch's blocks hold on CUDA");
  switch_floating(args.in[0].dtype, Op::LayerNormGrad, [&]<typename T>(Type<T>) {
    const T *x = args.in[0].as<T>(), *mean = args.in[1].as<T>(), *rstd = args.in[2].as<T>(),
            *gy = args.in[3].as<T>();
    const T* gamma = args.in.size() > 4 ? args.in[4].as<T>() : nullptr;
    T *gx = args.out[0].as<T>(), *ggamma = args.out[1].as<T>(), *gbeta = args.out[2].as<T>();
    const LayerNormGradGrid grid = layer_norm_grad_grid(rows, cols);
    if (grid.one_launch) {
      layer_norm_grad_kernel<T><<<grid.param_blocks + grid.x_blocks, kParamThreads, 0, stream()>>>(
          x, mean, rstd, gy, gamma, gx, ggamma, gbeta, rows, cols, grid.param_blocks,
          grid.x_blocks);
      ENCORE_CUDA_LAUNCHED(Op::LayerNormGrad);
      return;
    }
    if (rows > 0) {
      with_row_group(cols, [&](auto group) {
        constexpr int kGroup = decltype(group)::value;
        layer_norm_grad_x_kernel<kGroup, T>
            <<<row_blocks<kGroup>(rows), kBlockThreads<kGroup>, 0, stream()>>>(
                x, mean, rstd, gy, gamma, gx, rows, cols);
        ENCORE_CUDA_LAUNCHED(Op::LayerNormGrad);
      });
    }
    layer_norm_grad_params_kernel<T><<<grid.param_blocks, kParamThreads, 0, stream()>>>(
        x, mean, rstd, gy, ggamma, gbeta, rows, cols);
    ENCORE_CUDA_LAUNCHED(Op::LayerNormGrad);
  });
}

}  // namespace

ENCORE_REGISTER_CUDA(Op::LayerNorm, &layer_norm);
ENCORE_REGISTER_CUDA(Op::LayerNormGrad, &layer_norm_grad);

}  // namespace encore::kernels::cuda
