// The op harness's cases for convolution, pooling and batch normalisation: plain-loop
// references and case lists, shared by the cpu tests (conv_test.cc, pool_norm_test.cc) and the
// CUDA tests (cuda/cuda_ops_test.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "encore/functions.h"
#include "op_harness.h"

namespace encore::optest {

// ---- Convolution ----------------------------------------------------------------------------

struct ConvSpec {
  Dims x, w;
  bool bias = false;
  Size2 stride = 1, padding = 0, dilation = 1;
  int groups = 1;
};

// y[n][o][r][c] = b[o] + sum_{s,i,j} w[o][s][i][j] x[n][g cg + s][r sh - ph + i dh][c sw - pw + j
// dw]
inline RefTensor ref_conv2d(const RefTensor& x, const RefTensor& w, const RefTensor* b,
                            const ConvSpec& p) {
  const int64_t n = x.shape[0], h = x.shape[2], wd = x.shape[3];
  const int64_t o = w.shape[0], cg = w.shape[1], kh = w.shape[2], kw = w.shape[3];
  const int64_t og = o / p.groups, c = x.shape[1];
  const int64_t ho = (h + 2 * p.padding.h - p.dilation.h * (kh - 1) - 1) / p.stride.h + 1;
  const int64_t wo = (wd + 2 * p.padding.w - p.dilation.w * (kw - 1) - 1) / p.stride.w + 1;
  RefTensor y = ref::filled({n, o, ho, wo});
  for (int64_t in = 0; in < n; ++in)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t r = 0; r < ho; ++r)
        for (int64_t col = 0; col < wo; ++col) {
          double acc = b != nullptr ? b->v[oc] : 0.0;
          for (int64_t s = 0; s < cg; ++s)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t ih = r * p.stride.h - p.padding.h + i * p.dilation.h;
                const int64_t iw = col * p.stride.w - p.padding.w + j * p.dilation.w;
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                const int64_t ic = oc / og * cg + s;
                acc += w.v[((oc * cg + s) * kh + i) * kw + j] *
                       x.v[((in * c + ic) * h + ih) * wd + iw];
              }
          y.v[((in * o + oc) * ho + r) * wo + col] = acc;
        }
  return y;
}

inline OpCase conv_case(const ConvSpec& p) {
  std::string name =
      absl::StrCat("conv2d x ", dims_str(p.x), " w ", dims_str(p.w), p.bias ? " bias" : "",
                   " stride ", p.stride.str(), " padding ", p.padding.str(), " dilation ",
                   p.dilation.str(), " groups ", p.groups);
  std::vector<InputSpec> inputs = {floating(p.x), floating(p.w)};
  if (p.bias) inputs.push_back(floating({p.w[0]}));
  return {name, inputs,
          [p](const Inputs& x) {
            return F::conv2d(x[0], x[1], p.bias ? x[2] : Tensor(), p.stride, p.padding, p.dilation,
                             p.groups);
          },
          [p](const Refs& x) { return ref_conv2d(x[0], x[1], p.bias ? &x[2] : nullptr, p); }};
}

inline std::vector<ConvSpec> conv_specs() {
  return {
      // 3x3, padding 1, with and without bias.
      {{2, 3, 5, 6}, {4, 3, 3, 3}, true, 1, 1},
      {{2, 3, 5, 6}, {4, 3, 3, 3}, false, 1, 1},
      // Stride 2; non-square kernel, stride and padding.
      {{2, 2, 7, 6}, {3, 2, 3, 3}, false, 2, 1},
      {{1, 2, 6, 9}, {3, 2, 2, 4}, true, {2, 1}, {1, 2}},
      // Dilation, square and not, with stride.
      {{2, 2, 7, 8}, {2, 2, 3, 3}, true, 1, 2, 2},
      {{1, 2, 7, 6}, {3, 2, 3, 2}, false, 1, {1, 0}, {2, 1}},
      {{2, 4, 9, 8}, {4, 2, 3, 2}, true, {2, 3}, {1, 2}, {2, 1}, 2},
      // Groups; depthwise; depthwise with a channel multiplier.
      {{2, 4, 5, 5}, {6, 2, 3, 3}, true, 1, 1, 1, 2},
      {{2, 3, 6, 5}, {3, 1, 3, 3}, false, 1, 1, 1, 3},
      {{1, 2, 5, 5}, {4, 1, 3, 3}, true, 1, 0, 1, 2},
      // 1x1: unpadded stride 1 (the input is its own im2col), strided, padded.
      {{2, 5, 4, 3}, {3, 5, 1, 1}, true},
      {{2, 3, 5, 5}, {2, 3, 1, 1}, false, 2},
      {{1, 2, 3, 4}, {3, 2, 1, 1}, true, 1, 1},
      // The kernel covers the whole input (1x1 output); padding beyond the kernel's reach
      // (the input gradient crops); a 1-pixel-high input.
      {{2, 2, 3, 3}, {4, 2, 3, 3}, true},
      {{1, 2, 4, 4}, {2, 2, 2, 2}, false, 1, 2},
      {{2, 2, 1, 7}, {3, 2, 1, 3}, true, 1, {0, 1}},
      // Wider than one register tile; output channels not a multiple of 8; taps not a multiple
      // of 3.
      {{2, 3, 5, 40}, {9, 3, 3, 3}, true, 1, 1},
      {{1, 4, 6, 7}, {7, 4, 2, 2}, true, 1, 1},
      {{1, 13, 4, 4}, {11, 13, 1, 1}, false, 1, 0},
  };
}

// Every spec of conv_specs() as a case.
inline std::vector<OpCase> conv_cases() {
  std::vector<OpCase> cases;
  for (const ConvSpec& p : conv_specs()) cases.push_back(conv_case(p));
  return cases;
}

// ---- Pooling and batch normalisation --------------------------------------------------------

struct PoolSpec {
  int kh, kw, sh, sw, ph, pw;
  bool include_pad = true;
};

// Max pooling with ties, zeros of both signs and NaN, checked outside the harness
// (pool_norm_test.cc against the first maximum of each window, cuda_ops_test.cc against the cpu):
// windows tiling 2x2 (their own loops), overlapping, padded, clipped; rows wide (several vector
// chunks) and narrow (fewer outputs than a vector).
inline std::vector<PoolSpec> tie_pool_specs() {
  return {{2, 2, 2, 2, 0, 0}, {3, 3, 2, 2, 1, 1}, {2, 2, 1, 1, 0, 0},
          {2, 2, 2, 2, 1, 1}, {3, 2, 1, 2, 1, 0}, {3, 3, 3, 3, 0, 0}};
}
inline std::vector<Dims> tie_pool_shapes() {
  return {{2, 3, 7, 9}, {1, 2, 6, 40}, {3, 2, 3, 5}, {2, 2, 8, 10}};
}
// n inputs for them: mostly ties, some NaN.
inline std::vector<double> tie_pool_values(int64_t n, std::mt19937& rng) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double pool[] = {-1, -0.0, 0, 0, 1, 1, 2, -2, nan};
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = pool[rng() % 9 == 0 ? 8 : rng() % 8];
  return v;
}

// The index in x [N,C,H,W] of the first maximum of each window in row-major order: the first NaN
// when the window holds one, else the first element equal to the largest (-0 equals +0).
// Padding is never chosen.
inline std::vector<int64_t> ref_first_max(const std::vector<double>& x, const Dims& shape,
                                          const PoolSpec& p) {
  const int64_t planes = shape[0] * shape[1], h = shape[2], w = shape[3];
  const int64_t ho = (h + 2 * p.ph - p.kh) / p.sh + 1, wo = (w + 2 * p.pw - p.kw) / p.sw + 1;
  std::vector<int64_t> at;
  for (int64_t b = 0; b < planes; ++b)
    for (int64_t i = 0; i < ho; ++i)
      for (int64_t j = 0; j < wo; ++j) {
        int64_t best = -1;
        for (int64_t di = 0; di < p.kh; ++di)
          for (int64_t dj = 0; dj < p.kw; ++dj) {
            const int64_t r = i * p.sh - p.ph + di, q = j * p.sw - p.pw + dj;
            if (r < 0 || r >= h || q < 0 || q >= w) continue;
            const int64_t k = (b * h + r) * w + q;
            const bool nan_best = best >= 0 && std::isnan(x[best]);
            if (best < 0 || (!nan_best && (std::isnan(x[k]) || x[k] > x[best]))) best = k;
          }
        at.push_back(best);
      }
  return at;
}

// Max or average pooling of x [N,C,H,W] by direct loops over each window.
inline RefTensor ref_pool(const RefTensor& x, const PoolSpec& p, bool is_max) {
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3];
  const int64_t ho = (h + 2 * p.ph - p.kh) / p.sh + 1, wo = (w + 2 * p.pw - p.kw) / p.sw + 1;
  RefTensor y = ref::filled({n, c, ho, wo});
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < ho; ++i)
        for (int64_t j = 0; j < wo; ++j) {
          double best = -std::numeric_limits<double>::infinity(), sum = 0;
          int64_t inside = 0;
          for (int64_t di = 0; di < p.kh; ++di)
            for (int64_t dj = 0; dj < p.kw; ++dj) {
              const int64_t r = i * p.sh - p.ph + di, q = j * p.sw - p.pw + dj;
              if (r < 0 || r >= h || q < 0 || q >= w) continue;
              const double v = x.v[ref::ravel({b, ch, r, q}, x.shape)];
              best = ref::max_nan(best, v);
              sum += v;
              ++inside;
            }
          const double divisor = p.include_pad ? p.kh * p.kw : static_cast<double>(inside);
          y.v[ref::ravel({b, ch, i, j}, y.shape)] = is_max ? best : sum / divisor;
        }
  return y;
}

// Batch statistics of channel c of x [N,C,...]: mean and biased variance.
inline std::pair<double, double> ref_channel_stats(const RefTensor& x, int64_t c) {
  const int64_t channels = x.shape[1];
  int64_t s = 1;
  for (int i = 2; i < x.rank(); ++i) s *= x.shape[i];
  double sum = 0, squares = 0;
  const double count = static_cast<double>(x.numel() / channels);
  for (int64_t i = 0; i < x.numel(); ++i)
    if ((i / s) % channels == c) sum += x.v[i];
  const double mean = sum / count;
  for (int64_t i = 0; i < x.numel(); ++i)
    if ((i / s) % channels == c) squares += (x.v[i] - mean) * (x.v[i] - mean);
  return {mean, squares / count};
}

// (x - mean) / sqrt(var + eps) * gamma + beta per channel; mean and var from `stats(c)`.
template <typename Stats>
inline RefTensor ref_normalize(const RefTensor& x, Stats stats, const RefTensor* gamma,
                               const RefTensor* beta, double eps) {
  const int64_t channels = x.shape[1];
  int64_t s = 1;
  for (int i = 2; i < x.rank(); ++i) s *= x.shape[i];
  RefTensor y = x;
  for (int64_t c = 0; c < channels; ++c) {
    const auto [mean, var] = stats(c);
    for (int64_t i = 0; i < x.numel(); ++i)
      if ((i / s) % channels == c) {
        const double xhat = (x.v[i] - mean) / std::sqrt(var + eps);
        y.v[i] = xhat * (gamma ? gamma->v[c] : 1.0) + (beta ? beta->v[c] : 0.0);
      }
  }
  return y;
}

inline RefTensor ref_batch_norm_train(const RefTensor& x, const RefTensor* gamma,
                                      const RefTensor* beta, double eps = 1e-5) {
  return ref_normalize(
      x, [&](int64_t c) { return ref_channel_stats(x, c); }, gamma, beta, eps);
}

inline RefTensor ref_batch_norm_eval(const RefTensor& x, const RefTensor& mean,
                                     const RefTensor& var, const RefTensor* gamma,
                                     const RefTensor* beta, double eps = 1e-5) {
  return ref_normalize(
      x, [&](int64_t c) { return std::make_pair(mean.v[c], var.v[c]); }, gamma, beta, eps);
}

inline OpCase max_case(Dims shape, Size2 k, std::optional<Size2> s, Size2 p, ValueGen gen) {
  const PoolSpec spec{k.h, k.w, s.value_or(k).h, s.value_or(k).w, p.h, p.w};
  return {absl::StrCat("max_pool2d ", dims_str(shape), " k", k.h, "x", k.w, " s", spec.sh, "x",
                       spec.sw, " p", p.h, "x", p.w),
          {floating(shape, std::move(gen))},
          [=](const Inputs& x) { return F::max_pool2d(x[0], k, s, p); },
          [=](const Refs& x) { return ref_pool(x[0], spec, true); }};
}

inline OpCase avg_case(Dims shape, Size2 k, std::optional<Size2> s, Size2 p, bool include_pad) {
  const PoolSpec spec{k.h, k.w, s.value_or(k).h, s.value_or(k).w, p.h, p.w, include_pad};
  return {absl::StrCat("avg_pool2d ", dims_str(shape), " k", k.h, "x", k.w, " s", spec.sh, "x",
                       spec.sw, " p", p.h, "x", p.w, include_pad ? "" : " exclude_pad"),
          {floating(shape)},
          [=](const Inputs& x) { return F::avg_pool2d(x[0], k, s, p, include_pad); },
          [=](const Refs& x) { return ref_pool(x[0], spec, false); }};
}

// max_pool2d over windows that tile, overlap, pad and clip.
inline std::vector<OpCase> max_pool_cases() {
  return {
      // Floor output size: 7x9 pooled by 2 is 3x4 (the last row and column are dropped).
      max_case({2, 3, 7, 9}, 2, std::nullopt, 0, distinct(-1, 1)),
      // Padding never wins: every value is negative, so a padded zero would be the maximum.
      max_case({2, 2, 7, 9}, 3, Size2(2), 1, distinct(-2, -1)),
      // Non-square kernel, stride and padding; windows overlap in height.
      max_case({1, 2, 5, 7}, Size2(3, 2), Size2(1, 2), Size2(1, 0), distinct(-1, 1)),
      // Overlapping windows: one element can be the maximum of several windows.
      max_case({2, 2, 6, 6}, 3, Size2(1), 0, distinct(-1, 1)),
      // Rows of several vector chunks (the last one overlapping) and of fewer outputs than one.
      max_case({1, 2, 5, 41}, 2, std::nullopt, 0, distinct(-1, 1)),
      max_case({3, 2, 5, 5}, 2, std::nullopt, 0, distinct(-1, 1)),
      // The stride divides the width: all the rows of a block of planes in one loop.
      max_case({2, 3, 8, 10}, 3, Size2(2), 1, distinct(-1, 1)),
  };
}

// max_pool2d over inputs holding NaN (PyTorch's semantics): a window holding one gives NaN and
// sends its gradient to its first NaN. Windows that tile 2x2, pad and clip, overlap (7 and 8
// share windows), and rows of several vector chunks.
inline std::vector<OpCase> max_pool_nan_cases() {
  auto nan_case = [](Dims shape, Size2 k, std::optional<Size2> s, Size2 p,
                     std::vector<int64_t> at) {
    const PoolSpec spec{k.h, k.w, s.value_or(k).h, s.value_or(k).w, p.h, p.w};
    OpCase c = max_case(shape, k, s, p, with_nan(distinct(-1, 1), at));
    std::string where;
    for (int64_t i : at) absl::StrAppend(&where, where.empty() ? "" : ",", i);
    absl::StrAppend(&c.name, " NaN at {", where, "}");
    c.grad_reference = [shape, spec](const Refs& x, const RefTensor& gy) {
      RefTensor gx = ref::filled(x[0].shape);
      const std::vector<int64_t> from = ref_first_max(x[0].v, shape, spec);
      for (size_t o = 0; o < from.size(); ++o) gx.v[from[o]] += gy.v[o];
      return Refs{gx};
    };
    return c;
  };
  return {
      nan_case({2, 3, 7, 9}, 2, std::nullopt, 0, {0, 10, 100, 300}),
      nan_case({2, 2, 7, 9}, 3, Size2(2), 1, {8, 60, 200}),
      nan_case({2, 2, 6, 6}, 3, Size2(1), 0, {7, 8, 50}),
      nan_case({1, 2, 5, 41}, 2, std::nullopt, 0, {3, 45, 300}),
  };
}

// avg_pool2d, with and without count_include_pad.
inline std::vector<OpCase> avg_pool_cases() {
  return {
      avg_case({2, 3, 7, 9}, 2, std::nullopt, 0, true),
      avg_case({2, 2, 7, 9}, 3, Size2(2), 1, true),
      avg_case({2, 2, 7, 9}, 3, Size2(2), 1, false),
      avg_case({1, 2, 5, 7}, Size2(3, 2), Size2(1, 2), Size2(1, 1), false),
      avg_case({1, 2, 5, 7}, Size2(3, 2), Size2(1, 2), Size2(1, 1), true),
      avg_case({2, 2, 6, 6}, 3, Size2(1), 0, true),
      avg_case({1, 2, 5, 41}, 2, std::nullopt, 0, true),
      avg_case({3, 2, 5, 5}, 2, std::nullopt, 0, false),
      avg_case({2, 3, 8, 10}, 3, Size2(1), 1, false),
      avg_case({2, 3, 8, 10}, 3, Size2(2), 1, true),
      avg_case({2, 2, 9, 8}, Size2(3, 2), Size2(3, 2), 0, true),
  };
}

// Global average pooling.
inline OpCase global_avg_pool_case() {
  return {"global_avg_pool2d [2,3,4,5]",
          {floating({2, 3, 4, 5})},
          [](const Inputs& x) { return F::global_avg_pool2d(x[0]); },
          [](const Refs& x) {
            RefTensor y = ref::filled({2, 3});
            for (int64_t i = 0; i < x[0].numel(); ++i) y.v[i / 20] += x[0].v[i] / 20;
            return y;
          }};
}

// batch_norm in training mode (batch statistics), affine or not.
inline std::vector<OpCase> batch_norm_train_cases() {
  return {
      {"batch_norm train [3,4,3,5] affine",
       {floating({3, 4, 3, 5}, uniform(-2, 3)), floating({4}, uniform(0.5, 2)), floating({4})},
       [](const Inputs& x) { return F::batch_norm(x[0], {}, {}, x[1], x[2], true); },
       [](const Refs& x) { return ref_batch_norm_train(x[0], &x[1], &x[2]); }},
      {"batch_norm train [2,3,4,4]",
       {floating({2, 3, 4, 4}, uniform(-1, 2))},
       [](const Inputs& x) { return F::batch_norm(x[0], {}, {}, {}, {}, true); },
       [](const Refs& x) { return ref_batch_norm_train(x[0], nullptr, nullptr); }},
      {"batch_norm train [8,5] affine",
       {floating({8, 5}), floating({5}, uniform(0.5, 2)), floating({5})},
       [](const Inputs& x) { return F::batch_norm(x[0], {}, {}, x[1], x[2], true, 0.1, 1e-3); },
       [](const Refs& x) { return ref_batch_norm_train(x[0], &x[1], &x[2], 1e-3); }},
      {"batch_norm train [6,4]",
       {floating({6, 4}, uniform(-3, 1))},
       [](const Inputs& x) { return F::batch_norm(x[0], {}, {}, {}, {}, true); },
       [](const Refs& x) { return ref_batch_norm_train(x[0], nullptr, nullptr); }},
  };
}

// batch_norm in eval mode (running statistics as constant inputs).
inline std::vector<OpCase> batch_norm_eval_cases() {
  return {
      {"batch_norm eval [2,3,4,4] affine",
       {floating({2, 3, 4, 4}), constant({3}, uniform(-0.5, 0.5)), constant({3}, positive(0.5, 2)),
        floating({3}, uniform(0.5, 2)), floating({3})},
       [](const Inputs& x) { return F::batch_norm(x[0], x[1], x[2], x[3], x[4], false); },
       [](const Refs& x) { return ref_batch_norm_eval(x[0], x[1], x[2], &x[3], &x[4]); }},
      {"batch_norm eval [5,3]",
       {floating({5, 3}), constant({3}, uniform(-0.5, 0.5)), constant({3}, positive(0.5, 2))},
       [](const Inputs& x) { return F::batch_norm(x[0], x[1], x[2], {}, {}, false); },
       [](const Refs& x) { return ref_batch_norm_eval(x[0], x[1], x[2], nullptr, nullptr); }},
  };
}

}  // namespace encore::optest
