// Batch normalisation over axis 1: training forward (batch statistics), inference forward
// (running statistics), the training gradient, and the running-statistics update.
//
// x [N, C, ...] is seen as [N, C, S] with S the product of the trailing axes; channel c owns the
// N runs of S elements at n*C*S + c*S. Channels are independent, so they are split across
// threads (each channel summed by one thread in a fixed order: bit-identical at any thread
// count). Sums are accumulated in double; the variance is two-pass (mean first, then squared
// deviations), so it stays accurate when the mean is large against the spread.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/kernel.h"
#include "kernels/cpu/sum_lanes.h"
#include "runtime/parallel.h"

namespace encore::kernels::cpu {
namespace {

struct ChannelLayout {
  int64_t n, c, s;
  int64_t count() const { return n * s; }  // elements per channel
  int64_t at(int64_t batch, int64_t channel) const { return (batch * c + channel) * s; }
};

ChannelLayout layout_of(const Shape& x) {
  int64_t s = 1;
  for (int i = 2; i < x.rank(); ++i) s *= x[i];
  return {x[0], x[1], s};
}

// 1/sqrt(var + eps) in the dtype of the statistics; the forward and the gradient both take it
// from here, so the gradient differentiates exactly the normalisation that ran.
template <typename T>
T inv_std(T var, double eps) {
  return static_cast<T>(1.0 / std::sqrt(static_cast<double>(var) + eps));
}

// Runs body(channel) for every channel, in parallel when there is enough work.
template <typename Body>
void for_channels(const ChannelLayout& l, Body&& body) {
  constexpr int64_t kWorkPerThread = int64_t{1} << 15;
  const int64_t grain = std::max<int64_t>(1, kWorkPerThread / std::max<int64_t>(1, l.count()));
  parallel_for(l.c, grain, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) body(ch);
  });
}

// y = (x - mean) * invstd * gamma + beta over one channel (gamma, beta: null for 1 and 0).
template <typename T>
void normalize_channel(const T* x, T* y, const ChannelLayout& l, int64_t ch, T mean, T invstd,
                       const T* gamma, const T* beta) {
  const T scale = gamma != nullptr ? gamma[ch] * invstd : invstd;
  const T shift = beta != nullptr ? beta[ch] : T(0);
  for (int64_t b = 0; b < l.n; ++b) {
    const T* xr = x + l.at(b, ch);
    T* yr = y + l.at(b, ch);
    for (int64_t i = 0; i < l.s; ++i) yr[i] = (xr[i] - mean) * scale + shift;
  }
}

// x[, gamma, beta] -> y, batch mean, biased batch variance.
void batch_norm_kernel(const KernelArgs& args) {
  const BufferView& x = args.in[0];
  const ChannelLayout l = layout_of(x.shape);
  const double eps = args.attr<BatchNormAttrs>().eps;
  switch_floating(x.dtype, Op::BatchNorm, [&]<typename T>(Type<T>) {
    const T* px = x.as<T>();
    const T* gamma = args.in.size() > 1 ? args.in[1].as<T>() : nullptr;
    const T* beta = args.in.size() > 2 ? args.in[2].as<T>() : nullptr;
    T* py = args.out[0].as<T>();
    T* mean_out = args.out[1].as<T>();
    T* var_out = args.out[2].as<T>();
    const double count = static_cast<double>(l.count());
    for_channels(l, [&](int64_t ch) {
      double sum = 0;
      for (int64_t b = 0; b < l.n; ++b) {
        const T* xr = px + l.at(b, ch);
        sum += sum_lanes(l.s, [xr](int64_t i) { return static_cast<double>(xr[i]); });
      }
      const double mean = count > 0 ? sum / count : 0.0;
      double squares = 0;
      for (int64_t b = 0; b < l.n; ++b) {
        const T* xr = px + l.at(b, ch);
        squares += sum_lanes(l.s, [xr, mean](int64_t i) {
          const double d = static_cast<double>(xr[i]) - mean;
          return d * d;
        });
      }
      const T m = static_cast<T>(mean), v = static_cast<T>(count > 0 ? squares / count : 0.0);
      mean_out[ch] = m;
      var_out[ch] = v;
      normalize_channel(px, py, l, ch, m, inv_std(v, eps), gamma, beta);
    });
  });
}

// x, running mean, running var[, gamma, beta] -> y.
void batch_norm_inference_kernel(const KernelArgs& args) {
  const BufferView& x = args.in[0];
  const ChannelLayout l = layout_of(x.shape);
  const double eps = args.attr<BatchNormAttrs>().eps;
  switch_floating(x.dtype, Op::BatchNormInference, [&]<typename T>(Type<T>) {
    const T* px = x.as<T>();
    const T* mean = args.in[1].as<T>();
    const T* var = args.in[2].as<T>();
    const T* gamma = args.in.size() > 3 ? args.in[3].as<T>() : nullptr;
    const T* beta = args.in.size() > 4 ? args.in[4].as<T>() : nullptr;
    T* py = args.out[0].as<T>();
    for_channels(l, [&](int64_t ch) {
      normalize_channel(px, py, l, ch, mean[ch], inv_std(var[ch], eps), gamma, beta);
    });
  });
}

// x, batch mean, batch var, gy[, gamma] -> gx, ggamma, gbeta. With xhat = (x - mean) invstd
// and M elements per channel:
//   gbeta = sum gy,  ggamma = sum gy xhat,  gx = gamma invstd (gy - gbeta/M - xhat ggamma/M).
void batch_norm_grad_kernel(const KernelArgs& args) {
  const BufferView& x = args.in[0];
  const ChannelLayout l = layout_of(x.shape);
  const double eps = args.attr<BatchNormAttrs>().eps;
  switch_floating(x.dtype, Op::BatchNormGrad, [&]<typename T>(Type<T>) {
    const T* px = x.as<T>();
    const T* mean = args.in[1].as<T>();
    const T* var = args.in[2].as<T>();
    const T* pgy = args.in[3].as<T>();
    const T* gamma = args.in.size() > 4 ? args.in[4].as<T>() : nullptr;
    T* pgx = args.out[0].as<T>();
    T* ggamma = args.out[1].as<T>();
    T* gbeta = args.out[2].as<T>();
    const double count = static_cast<double>(std::max<int64_t>(1, l.count()));
    for_channels(l, [&](int64_t ch) {
      const T m = mean[ch];
      const T invstd = inv_std(var[ch], eps);
      double sum_gy = 0, sum_gy_xc = 0;  // sum gy, sum gy (x - mean)
      for (int64_t b = 0; b < l.n; ++b) {
        const T* xr = px + l.at(b, ch);
        const T* gr = pgy + l.at(b, ch);
        constexpr int kLanes = 8;  // both sums in one pass, in lanes as sum_lanes
        double acc_gy[kLanes] = {}, acc_xc[kLanes] = {};
        int64_t i = 0;
        for (; i + kLanes <= l.s; i += kLanes)
          for (int j = 0; j < kLanes; ++j) {
            const double gv = static_cast<double>(gr[i + j]);
            acc_gy[j] += gv;
            acc_xc[j] += gv * static_cast<double>(xr[i + j] - m);
          }
        for (int j = 0; j < kLanes; ++j) {
          sum_gy += acc_gy[j];
          sum_gy_xc += acc_xc[j];
        }
        for (; i < l.s; ++i) {
          sum_gy += static_cast<double>(gr[i]);
          sum_gy_xc += static_cast<double>(gr[i]) * static_cast<double>(xr[i] - m);
        }
      }
      const double is = static_cast<double>(invstd);
      ggamma[ch] = static_cast<T>(sum_gy_xc * is);
      gbeta[ch] = static_cast<T>(sum_gy);
      // gx = k (gy - a - (x - mean) c)
      const double g = gamma != nullptr ? static_cast<double>(gamma[ch]) : 1.0;
      const T k = static_cast<T>(g * is);
      const T a = static_cast<T>(sum_gy / count);
      const T c = static_cast<T>(sum_gy_xc * is * is / count);
      for (int64_t b = 0; b < l.n; ++b) {
        const T* xr = px + l.at(b, ch);
        const T* gr = pgy + l.at(b, ch);
        T* gx = pgx + l.at(b, ch);
        for (int64_t i = 0; i < l.s; ++i) gx[i] = k * (gr[i] - a - (xr[i] - m) * c);
      }
    });
  });
}

// running mean, running var, batch mean, batch var (all [C]): in place,
//   running = (1 - momentum) running + momentum batch, the batch variance made unbiased.
void batch_norm_stats_update_kernel(const KernelArgs& args) {
  const BufferView &rm = args.in[0], &rv = args.in[1];
  const BatchNormAttrs& a = args.attr<BatchNormAttrs>();
  const double unbias =
      a.count > 1 ? static_cast<double>(a.count) / static_cast<double>(a.count - 1) : 1.0;
  switch_floating(rm.dtype, Op::BatchNormStatsUpdate, [&]<typename T>(Type<T>) {
    T* pm = rm.as<T>();
    T* pv = rv.as<T>();
    const T* bm = args.in[2].as<T>();
    const T* bv = args.in[3].as<T>();
    for (int64_t ch = 0, n = rm.numel(); ch < n; ++ch) {
      pm[ch] = static_cast<T>((1 - a.momentum) * static_cast<double>(pm[ch]) +
                              a.momentum * static_cast<double>(bm[ch]));
      pv[ch] = static_cast<T>((1 - a.momentum) * static_cast<double>(pv[ch]) +
                              a.momentum * static_cast<double>(bv[ch]) * unbias);
    }
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::BatchNorm, DeviceType::CPU, &batch_norm_kernel);
  register_kernel(Op::BatchNormInference, DeviceType::CPU, &batch_norm_inference_kernel);
  register_kernel(Op::BatchNormGrad, DeviceType::CPU, &batch_norm_grad_kernel);
  register_kernel(Op::BatchNormStatsUpdate, DeviceType::CPU, &batch_norm_stats_update_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
