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
          launch_dependent<sgd_kernel<T>>(Op::SgdUpdate, blocks, kThreads, tab, a,
                                          static_cast<const SgdAttrs*>(args.device_attrs));
        });
  });
}

void momentum_sgd(const KernelArgs& args) {
  const SgdAttrs& a = args.attr<SgdAttrs>();
  switch_floating(args.in[0].dtype, Op::MomentumSgdUpdate, [&]<typename T>(Type<T>) {
    for_each_launch<Op::MomentumSgdUpdate>(args.in, [&](const TensorTable<3>& tab, const Counters&,
                                                        unsigned blocks) {
      if (blocks == 0) return;
      launch_dependent<momentum_sgd_kernel<T>>(Op::MomentumSgdUpdate, blocks, kThreads, tab, a,
                                               static_cast<const SgdAttrs*>(args.device_attrs));
    });
  });
}

// Per parameter in: p, g, m, v, t (int64 step, counted also when p is empty, as on the CPU: every
// parameter has a block, so a launch has blocks).
void adam(const KernelArgs& args) {
  const AdamAttrs& a = args.attr<AdamAttrs>();
  switch_floating(args.in[0].dtype, Op::AdamUpdate, [&]<typename T>(Type<T>) {
    for_each_launch<Op::AdamUpdate>(
        args.in, [&](const TensorTable<4>& tab, const Counters& c, unsigned blocks) {
          launch_dependent<adam_kernel<T>>(Op::AdamUpdate, blocks, kThreads, tab, c, a,
                                           static_cast<const AdamAttrs*>(args.device_attrs),
                                           error_slot());
        });
  });
}

ENCORE_REGISTER_CUDA(Op::SgdUpdate, &sgd);
ENCORE_REGISTER_CUDA(Op::MomentumSgdUpdate, &momentum_sgd);
ENCORE_REGISTER_CUDA(Op::AdamUpdate, &adam);

}  // namespace
}  // namespace encore::kernels::cuda
