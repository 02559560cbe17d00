// Optimizer updates on CUDA (the formulas of kernels/cpu/optim.cc); the kernels, their launch
// tables and how they work are in optim.cuh.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optim.cuh"

namespace encore::kernels::cuda {
namespace {

void sgd(const KernelArgs& args) {
  const SgdAttrs& a = args.attr<SgdAttrs>();
  switch_floating(args.in[0].dtype, Op::SgdUpdate, [&]<typename T>(Type<T>) {
    for_each_launch<Op::SgdUpdate>(
        args.in, [&](const TensorTable<2>& tab, const Counters&, unsigned blocks) {
          if (blocks == 0) return;
          launch_dependent<sgd_kernel<T>>(Op::SgdUpdate, blocks, kThreads, tab,
                                          static_cast<T>(a.lr), static_cast<T>(a.weight_decay),
                                          a.weight_decay != 0);
        });
  });
}

void momentum_sgd(const KernelArgs& args) {
  const SgdAttrs& a = args.attr<SgdAttrs>();
  switch_floating(args.in[0].dtype, Op::MomentumSgdUpdate, [&]<typename T>(Type<T>) {
    for_each_launch<Op::MomentumSgdUpdate>(args.in, [&](const TensorTable<3>& tab, const Counters&,
                                                        unsigned blocks) {
      if (blocks == 0) return;
      launch_dependent<momentum_sgd_kernel<T>>(Op::MomentumSgdUpdate, blocks, kThreads, tab,
                                               static_cast<T>(a.lr), static_cast<T>(a.momentum),
                                               static_cast<T>(a.weight_decay));
    });
  });
}

// Per parameter in: p, g, m, v, t (int64 step, counted also when p is empty, as on the CPU: every
// parameter has a block, so a launch has blocks).
void adam(const KernelArgs& args) {
  const AdamAttrs& a = args.attr<AdamAttrs>();
  switch_floating(args.in[0].dtype, Op::AdamUpdate, [&]<typename T>(Type<T>) {
    const AdamStep<T> step = adam_step<T>(a);
    for_each_launch<Op::AdamUpdate>(
        args.in, [&](const TensorTable<4>& tab, const Counters& c, unsigned blocks) {
          launch_dependent<adam_kernel<T>>(Op::AdamUpdate, blocks, kThreads, tab, c, step,
                                           error_slot());
        });
  });
}

ENCORE_REGISTER_CUDA(Op::SgdUpdate, &sgd);
ENCORE_REGISTER_CUDA(Op::MomentumSgdUpdate, &momentum_sgd);
ENCORE_REGISTER_CUDA(Op::AdamUpdate, &adam);

}  // namespace
}  // namespace encore::kernels::cuda
