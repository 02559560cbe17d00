// Losses and metrics: softmax cross entropy (and its gradient), mean squared error, accuracy.
// Scalar results are accumulated in double.
#include <cstdint>

#include "kernels/cpu/kernel.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/softmax_util.h"
#include "runtime/value_checks.h"

namespace encore::kernels::cpu {
namespace {

// Mean over non-ignored samples of logsumexp(row) - row[label]; 0 when all are ignored.
void cross_entropy_kernel(const KernelArgs& args) {
  const BufferView &logits = args.in[0], &labels = args.in[1], &out = args.out[0];
  const CrossEntropyAttrs& attrs = args.attr<CrossEntropyAttrs>();
  const int64_t rows = logits.shape[0], classes = logits.shape[1];
  switch_floating(logits.dtype, Op::SoftmaxCrossEntropy, [&]<typename T>(Type<T>) {
    switch_integral(labels.dtype, Op::SoftmaxCrossEntropy, [&]<typename L>(Type<L>) {
      const T* x = logits.as<T>();
      const L* y = labels.as<L>();
      double total = 0;
      int64_t count = 0;
      for (int64_t i = 0; i < rows; ++i) {
        if (!label_counted(y[i], i, classes, attrs, Op::SoftmaxCrossEntropy)) continue;
        const T* row = x + i * classes;
        total += static_cast<double>(log_sum_exp(row, classes, kUnitStride) - row[y[i]]);
        ++count;
      }
      *out.as<T>() = count == 0 ? T(0) : static_cast<T>(total / count);
    });
  });
}

}  // namespace

// gx = (softmax(row) - onehot(label)) * gy / count on non-ignored rows, 0 on ignored rows; a bad
// label is `report`'s Error, raised before anything is written.
void cross_entropy_grad(const KernelArgs& args, Op report) {
  const BufferView &logits = args.in[0], &labels = args.in[1], &gy = args.in[2];
  const BufferView& gx = args.out[0];
  const CrossEntropyAttrs& attrs = args.attr<CrossEntropyAttrs>();
  const int64_t ignore = attrs.ignore_label;
  const int64_t rows = logits.shape[0], classes = logits.shape[1];
  constexpr Op kOp = Op::SoftmaxCrossEntropyGrad;
  switch_floating(logits.dtype, kOp, [&]<typename T>(Type<T>) {
    switch_integral(labels.dtype, kOp, [&]<typename L>(Type<L>) {
      const T* x = logits.as<T>();
      const L* y = labels.as<L>();
      T* g = gx.as<T>();
      int64_t count = 0;
      for (int64_t i = 0; i < rows; ++i) count += label_counted(y[i], i, classes, attrs, report);
      const T scale = count == 0 ? T(0) : *gy.as<T>() / static_cast<T>(count);
      for (int64_t i = 0; i < rows; ++i) {
        const T* row = x + i * classes;
        T* grow = g + i * classes;
        if (static_cast<int64_t>(y[i]) == ignore) {
          for (int64_t j = 0; j < classes; ++j) grow[j] = T(0);
          continue;
        }
        const T m = lane_max(row, classes, kUnitStride);
        const T sum = sum_exp<true>(row, grow, classes, kUnitStride, m);
        const T f = scale / sum;
        for (int64_t j = 0; j < classes; ++j) grow[j] *= f;
        grow[y[i]] -= scale;
      }
    });
  });
}

namespace {

void cross_entropy_grad_kernel(const KernelArgs& args) {
  cross_entropy_grad(args, Op::SoftmaxCrossEntropyGrad);
}

// mean((a - b)^2) over all elements.
void mean_squared_error_kernel(const KernelArgs& args) {
  const BufferView &a = args.in[0], &b = args.in[1], &out = args.out[0];
  switch_floating(a.dtype, Op::MeanSquaredError, [&]<typename T>(Type<T>) {
    const T* pa = a.as<T>();
    const T* pb = b.as<T>();
    const int64_t n = a.numel();
    constexpr int kLanes = 8;
    double acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        const double d = static_cast<double>(pa[i + j]) - static_cast<double>(pb[i + j]);
        acc[j] += d * d;
      }
    }
    for (; i < n; ++i) {
      const double d = static_cast<double>(pa[i]) - static_cast<double>(pb[i]);
      acc[0] += d * d;
    }
    double sum = 0;
    for (double v : acc) sum += v;
    *out.as<T>() = static_cast<T>(sum / static_cast<double>(n));
  });
}

// Fraction of non-ignored samples whose first maximum (a row's first NaN when it holds one, as
// torch.argmax) is at the label; 0 when none. A label outside [0, C) is an Error, as in
// softmax_cross_entropy.
void accuracy_kernel(const KernelArgs& args) {
  const BufferView &logits = args.in[0], &labels = args.in[1], &out = args.out[0];
  const CrossEntropyAttrs& attrs = args.attr<CrossEntropyAttrs>();
  const int64_t rows = logits.shape[0], classes = logits.shape[1];
  switch_floating(logits.dtype, Op::Accuracy, [&]<typename T>(Type<T>) {
    switch_integral(labels.dtype, Op::Accuracy, [&]<typename L>(Type<L>) {
      const T* x = logits.as<T>();
      const L* y = labels.as<L>();
      int64_t count = 0, correct = 0;
      for (int64_t i = 0; i < rows; ++i) {
        if (!label_counted(y[i], i, classes, attrs, Op::Accuracy)) continue;
        ++count;
        const T* row = x + i * classes;
        int64_t arg = 0;
        for (int64_t j = 1; j < classes && row[arg] == row[arg]; ++j)
          if (row[j] > row[arg] || row[j] != row[j]) arg = j;
        correct += arg == static_cast<int64_t>(y[i]);
      }
      *out.as<T>() = count == 0 ? T(0) : static_cast<T>(static_cast<double>(correct) / count);
    });
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::SoftmaxCrossEntropy, DeviceType::CPU, &cross_entropy_kernel);
  register_kernel(Op::SoftmaxCrossEntropyGrad, DeviceType::CPU, &cross_entropy_grad_kernel);
  register_kernel(Op::MeanSquaredError, DeviceType::CPU, &mean_squared_error_kernel);
  register_kernel(Op::Accuracy, DeviceType::CPU, &accuracy_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
