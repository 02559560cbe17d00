// The softmax family and the losses on CUDA (the semantics of kernels/cpu/softmax.cc and
// loss.cc); the kernels and how they work are in softmax_loss.cuh.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/softmax_loss.cuh"
#include "kernels/cuda/softmax_loss.h"
#include "kernels/cuda/stream_libraries.h"

namespace encore::kernels::cuda {
namespace {

static_assert(sizeof(LossParts) <= kScratchBytes);

template <bool kLog>
void softmax(const KernelArgs& args) {
  constexpr Op kOp = kLog ? Op::LogSoftmax : Op::Softmax;
  const BufferView &x = args.in[0], &y = args.out[0];
  const int axis = args.attr<AxisAttrs>().axis;
  switch_floating(x.dtype, kOp, [&]<typename T>(Type<T>) {
    if (x.numel() == 0) return;
    const AxisSplit l = split_at(x.shape, axis);
    const int64_t lanes = l.outer * l.inner;
    with_group(l, [&](auto group) {
      constexpr int kGroup = decltype(group)::value;
      constexpr int kBlock = kBlockThreads<kGroup>;
      softmax_kernel<kLog, kGroup><<<blocks_for(lanes, kBlock / kGroup), kBlock, 0, stream()>>>(
          x.as<T>(), y.as<T>(), lanes, l.n, l.inner);
      ENCORE_CUDA_LAUNCHED(kOp);
    });
  });
}

template <bool kLog>
void softmax_grad(const KernelArgs& args) {
  constexpr Op kOp = kLog ? Op::LogSoftmaxGrad : Op::SoftmaxGrad;
  const BufferView &y = args.in[0], &gy = args.in[1], &gx = args.out[0];
  const int axis = args.attr<AxisAttrs>().axis;
  switch_floating(y.dtype, kOp, [&]<typename T>(Type<T>) {
    if (y.numel() == 0) return;
    const AxisSplit l = split_at(y.shape, axis);
    const int64_t lanes = l.outer * l.inner;
    with_group(l, [&](auto group) {
      constexpr int kGroup = decltype(group)::value;
      constexpr int kBlock = kBlockThreads<kGroup>;
      softmax_grad_kernel<kLog, kGroup>
          <<<blocks_for(lanes, kBlock / kGroup), kBlock, 0, stream()>>>(
              y.as<T>(), gy.as<T>(), gx.as<T>(), lanes, l.n, l.inner);
      ENCORE_CUDA_LAUNCHED(kOp);
    });
  });
}

// How an out-of-range label is reported: as cross_entropy's targets, or the op's labels.
encore::cuda::DeviceErrorKind label_error_kind(const CrossEntropyAttrs& attrs) {
  return attrs.from_cross_entropy != 0 ? encore::cuda::DeviceErrorKind::Target
                                       : encore::cuda::DeviceErrorKind::Label;
}

void cross_entropy(const KernelArgs& args) {
  constexpr Op kOp = Op::SoftmaxCrossEntropy;
  const BufferView &logits = args.in[0], &labels = args.in[1], &out = args.out[0];
  const int64_t ignore = args.attr<CrossEntropyAttrs>().ignore_label;
  const auto kind = label_error_kind(args.attr<CrossEntropyAttrs>());
  const int64_t rows = logits.shape[0], classes = logits.shape[1];
  switch_floating(logits.dtype, kOp, [&]<typename T>(Type<T>) {
    switch_integral(labels.dtype, kOp, [&]<typename L>(Type<L>) {
      const unsigned blocks = cross_entropy_blocks(rows);
      LossParts* parts = nullptr;
      if (blocks > 1) {
        parts = static_cast<LossParts*>(stream_scratch(kOp));
        ENCORE_CUDA_OK(kOp, cudaMemsetAsync(&parts->done, 0, sizeof(parts->done), stream()));
      }
      cross_entropy_kernel<<<blocks, kCrossEntropyThreads, 0, stream()>>>(
          logits.as<T>(), labels.as<L>(), out.as<T>(), rows, classes, ignore, parts, error_slot(),
          kind);
      ENCORE_CUDA_LAUNCHED(kOp);
    });
  });
}

}  // namespace

void cross_entropy_grad(const KernelArgs& args, Op report) {
  constexpr Op kOp = Op::SoftmaxCrossEntropyGrad;
  const BufferView &logits = args.in[0], &labels = args.in[1], &gy = args.in[2];
  const BufferView& gx = args.out[0];
  const int64_t ignore = args.attr<CrossEntropyAttrs>().ignore_label;
  const auto kind = label_error_kind(args.attr<CrossEntropyAttrs>());
  const int64_t rows = logits.shape[0], classes = logits.shape[1];
  switch_floating(logits.dtype, kOp, [&]<typename T>(Type<T>) {
    switch_integral(labels.dtype, kOp, [&]<typename L>(Type<L>) {
      if (gx.numel() == 0) return;
      launch_dependent<cross_entropy_grad_kernel<T, L>>(
          kOp, cross_entropy_grad_blocks(rows), kThreads, logits.as<T>(), labels.as<L>(),
          gy.as<T>(), gx.as<T>(), rows, classes, ignore, error_slot(), kind, report);
    });
  });
}

namespace {

void cross_entropy_grad_kernel_fn(const KernelArgs& args) {
  cross_entropy_grad(args, Op::SoftmaxCrossEntropyGrad);
}

void mean_squared_error(const KernelArgs& args) {
  constexpr Op kOp = Op::MeanSquaredError;
  const BufferView &a = args.in[0], &b = args.in[1], &out = args.out[0];
  switch_floating(a.dtype, kOp, [&]<typename T>(Type<T>) {
    mean_squared_error_kernel<<<1, kLossThreads, 0, stream()>>>(a.as<T>(), b.as<T>(), out.as<T>(),
                                                                a.numel());
    ENCORE_CUDA_LAUNCHED(kOp);
  });
}

void accuracy(const KernelArgs& args) {
  constexpr Op kOp = Op::Accuracy;
  const BufferView &logits = args.in[0], &labels = args.in[1], &out = args.out[0];
  const int64_t ignore = args.attr<CrossEntropyAttrs>().ignore_label;
  const int64_t rows = logits.shape[0], classes = logits.shape[1];
  switch_floating(logits.dtype, kOp, [&]<typename T>(Type<T>) {
    switch_integral(labels.dtype, kOp, [&]<typename L>(Type<L>) {
      accuracy_kernel<<<1, kLossThreads, 0, stream()>>>(logits.as<T>(), labels.as<L>(), out.as<T>(),
                                                        rows, classes, ignore, error_slot());
      ENCORE_CUDA_LAUNCHED(kOp);
    });
  });
}

ENCORE_REGISTER_CUDA(Op::Softmax, &softmax<false>);
ENCORE_REGISTER_CUDA(Op::LogSoftmax, &softmax<true>);
ENCORE_REGISTER_CUDA(Op::SoftmaxGrad, &softmax_grad<false>);
ENCORE_REGISTER_CUDA(Op::LogSoftmaxGrad, &softmax_grad<true>);
ENCORE_REGISTER_CUDA(Op::SoftmaxCrossEntropy, &cross_entropy);
ENCORE_REGISTER_CUDA(Op::SoftmaxCrossEntropyGrad, &cross_entropy_grad_kernel_fn);
ENCORE_REGISTER_CUDA(Op::MeanSquaredError, &mean_squared_error);
ENCORE_REGISTER_CUDA(Op::Accuracy, &accuracy);

}  // namespace
}  // namespace encore::kernels::cuda
