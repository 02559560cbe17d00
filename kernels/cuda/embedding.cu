// Embedding lookup and its weight gradient on CUDA (the semantics of kernels/cpu/embedding.cc);
// the kernels and how they work are in embedding.cuh.
#include <climits>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/embedding.cuh"

namespace encore::kernels::cuda {
namespace {

void embedding(const KernelArgs& args) {
  const BufferView &ids = args.in[0], &weight = args.in[1], &y = args.out[0];
  const int64_t rows = weight.shape[0], dim = weight.shape[1], n = ids.numel();
  if (n * dim == 0) return;
  switch_integral(ids.dtype, Op::Embedding, [&]<typename I>(Type<I>) {
    switch_floating(weight.dtype, Op::Embedding, [&]<typename T>(Type<T>) {
      embedding_kernel<T, I><<<blocks_for(n * dim), kThreads, 0, stream()>>>(
          ids.as<I>(), weight.as<T>(), y.as<T>(), n, rows, dim, error_slot());
      ENCORE_CUDA_LAUNCHED(Op::Embedding);
    });
  });
}

void embedding_grad(const KernelArgs& args) {
  const BufferView &ids = args.in[0], &gy = args.in[1], &gw = args.out[0];
  const int64_t pad = args.attr<EmbeddingAttrs>().padding_idx;
  const int64_t rows = gw.shape[0], dim = gw.shape[1], n = ids.numel();
  if (rows * dim == 0) return;
  // A thread per column, no loop over them: a grid that cannot hold them would leave columns
  // unwritten.
  ENCORE_CHECK((dim + kGradThreads - 1) / kGradThreads <= INT_MAX, op_name(Op::EmbeddingGrad),
               ": rows of ", dim, " elements are more than one launch's blocks hold on CUDA");
  switch_integral(ids.dtype, Op::EmbeddingGrad, [&]<typename I>(Type<I>) {
    switch_floating(gw.dtype, Op::EmbeddingGrad, [&]<typename T>(Type<T>) {
      const EmbeddingGradGrid g = embedding_grad_grid(rows, dim);
      const dim3 grid(g.columns, g.ranges);
      if (n > 0 && g.one_row) {  // a block per row: every element written
        embedding_grad_row_kernel<T, I><<<grid, kGradThreads, 0, stream()>>>(
            ids.as<I>(), gy.as<T>(), gw.as<T>(), n, rows, dim, pad, error_slot());
        ENCORE_CUDA_LAUNCHED(Op::EmbeddingGrad);
        return;
      }
      ENCORE_CUDA_OK(Op::EmbeddingGrad,
                     cudaMemsetAsync(gw.data, 0, rows * dim * sizeof(T), stream()));
      if (n == 0) return;
      embedding_grad_kernel<T, I><<<grid, kGradThreads, 0, stream()>>>(
          ids.as<I>(), gy.as<T>(), gw.as<T>(), n, rows, dim, pad, error_slot());
      ENCORE_CUDA_LAUNCHED(Op::EmbeddingGrad);
    });
  });
}

}  // namespace

ENCORE_REGISTER_CUDA(Op::Embedding, &embedding);
ENCORE_REGISTER_CUDA(Op::EmbeddingGrad, &embedding_grad);

}  // namespace encore::kernels::cuda
