// Reductions over an axis set on CUDA: sum, mean, max (the semantics of kernels/cpu/reduce.cc);
// the kernels, their plans and how they work are in reduce.cuh.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"

namespace encore::kernels::cuda {
namespace {

template <Op kOp, typename R>
void reduce_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &out = args.out[0];
  const uint8_t mask = args.attr<ReduceAttrs>().axes_mask;
  constexpr bool kMean = kOp == Op::Mean;
  auto run = [&]<typename T>(Type<T>) {
    const int64_t outputs = out.numel();
    if (outputs == x.numel()) {  // nothing folded (mask 0, or only size-1 axes)
      if (outputs > 0)
        ENCORE_CUDA_OK(kOp, cudaMemcpyAsync(out.data, x.data, outputs * sizeof(T),
                                            cudaMemcpyDeviceToDevice, stream()));
      return;
    }
    int64_t count = 1;  // input elements folded into each output
    for (int d = 0; d < x.shape.rank(); ++d)
      if (mask >> d & 1) count *= x.shape[d];
    if (x.numel() == 0) {  // empty folds: the identity (divided by 0 for the mean, as the CPU)
      T v = R::template identity<T>();
      if constexpr (kMean) v = v / static_cast<T>(count);
      fill_kernel<<<blocks_for(outputs), kThreads, 0, stream()>>>(out.as<T>(), v, outputs);
      ENCORE_CUDA_LAUNCHED(kOp);
      return;
    }
    const ReducePlan p = make_reduce_plan(x.shape, mask);
    const T* px = x.as<T>();
    T* py = out.as<T>();
    if (p.inner_reduced) {
      with_reduce_group(outputs, count, [&](auto group) {
        constexpr int kGroup = decltype(group)::value;
        constexpr int kBlock = kBlockThreads<kGroup>;
        reduce_rows<R, kMean, kGroup>
            <<<blocks_for(outputs, kBlock / kGroup), kBlock, 0, stream()>>>(
                px, py, p.kept, p.reduced, outputs, count);
        ENCORE_CUDA_LAUNCHED(kOp);
      });
      return;
    }
    const int split = column_split(count), width = column_width(outputs, split);
    const dim3 block(width, static_cast<unsigned>(split));
    reduce_columns<R, kMean><<<blocks_for(outputs, width), block, 0, stream()>>>(
        px, py, p.kept, p.reduced, outputs, count);
    ENCORE_CUDA_LAUNCHED(kOp);
  };
  if constexpr (kMean) {
    switch_floating(x.dtype, kOp, run);
  } else {
    switch_numeric(x.dtype, kOp, run);
  }
}

ENCORE_REGISTER_CUDA(Op::Sum, (&reduce_kernel<Op::Sum, SumOp>));
ENCORE_REGISTER_CUDA(Op::Mean, (&reduce_kernel<Op::Mean, SumOp>));
ENCORE_REGISTER_CUDA(Op::Max, (&reduce_kernel<Op::Max, MaxOp>));

}  // namespace
}  // namespace encore::kernels::cuda
