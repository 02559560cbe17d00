// UniformInit, NormalInit and Dropout on CUDA: the launches and their registration; the kernels
// and how their numbers match the CPU's are in random.cuh.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/random.cuh"
#include "runtime/rng.h"

namespace encore::kernels::cuda {
namespace {

const uint64_t* state_of(const RandomAttrs& r) {
  return reinterpret_cast<const uint64_t*>(static_cast<uintptr_t>(r.state_ptr));
}

void uniform(const KernelArgs& args) {
  const BufferView& t = args.in[0];
  const RandomAttrs& r = args.attr<RandomAttrs>();
  switch_floating(t.dtype, Op::UniformInit, [&]<typename T>(Type<T>) {
    const int64_t n = t.numel();
    if (n == 0) return;
    const T lo = static_cast<T>(r.a), width = static_cast<T>(r.b) - static_cast<T>(r.a);
    uniform_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        t.as<T>(), n, lo, width, uniform_top<T>(r.a, r.b), r.seed, r.offset, state_of(r));
    ENCORE_CUDA_LAUNCHED(Op::UniformInit);
  });
}

void normal(const KernelArgs& args) {
  const BufferView& t = args.in[0];
  const RandomAttrs& r = args.attr<RandomAttrs>();
  switch_floating(t.dtype, Op::NormalInit, [&]<typename T>(Type<T>) {
    const int64_t n = t.numel();
    if (n == 0) return;
    normal_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        t.as<T>(), n, static_cast<T>(r.a), static_cast<T>(r.b), r.seed, r.offset, state_of(r));
    ENCORE_CUDA_LAUNCHED(Op::NormalInit);
  });
}

void dropout(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0], &mask = args.out[1];
  const RandomAttrs& r = args.attr<RandomAttrs>();
  switch_floating(x.dtype, Op::Dropout, [&]<typename T>(Type<T>) {
    const int64_t n = x.numel();
    if (n == 0) return;
    const T ratio = static_cast<T>(r.a);
    const T scale = static_cast<T>(1.0 / (1.0 - r.a));
    dropout_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        x.as<T>(), y.as<T>(), mask.as<T>(), n, ratio, scale, r.seed, r.offset, state_of(r));
    ENCORE_CUDA_LAUNCHED(Op::Dropout);
  });
}

ENCORE_REGISTER_CUDA(Op::UniformInit, &uniform);
ENCORE_REGISTER_CUDA(Op::NormalInit, &normal);
ENCORE_REGISTER_CUDA(Op::Dropout, &dropout);

}  // namespace
}  // namespace encore::kernels::cuda
