// The op harness's cases for the ops of sequence models (embedding, layer_norm, cross_entropy;
// attention's in op_cases_attention.h): plain-loop references and case lists, shared by the cpu
// tests (embedding_test.cc, layer_norm_test.cc) and the CUDA tests (cuda/cuda_ops_test.cc).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "encore/functions.h"
#include "op_harness.h"

namespace encore::optest {

// y[..., :] = weight[ids[...], :].
inline RefTensor ref_embedding(const RefTensor& ids, const RefTensor& weight) {
  const int64_t dim = weight.shape[1];
  RefTensor y{ids.shape, {}};
  y.shape.push_back(dim);
  y.v.reserve(static_cast<size_t>(ids.numel() * dim));
  for (double id : ids.v)
    for (int64_t d = 0; d < dim; ++d) y.v.push_back(weight.v[static_cast<int64_t>(id) * dim + d]);
  return y;
}

// The gradient of weight: gy rows summed into their ids' rows, the padding row left 0.
inline RefTensor ref_embedding_grad(const RefTensor& ids, const RefTensor& weight,
                                    const RefTensor& gy, int64_t padding_idx) {
  const int64_t dim = weight.shape[1];
  RefTensor gw = ref::filled(weight.shape);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t v = static_cast<int64_t>(ids.v[i]);
    if (v == padding_idx) continue;
    for (int64_t d = 0; d < dim; ++d) gw.v[v * dim + d] += gy.v[i * dim + d];
  }
  return gw;
}

inline std::vector<OpCase> embedding_cases() {
  std::vector<OpCase> cases;
  // ids shape, vocabulary, dim, padding_idx, ids dtype. Repeated ids exercise the scatter-add.
  const std::tuple<Dims, int64_t, int64_t, int64_t, Kind> specs[] = {
      {{5}, 7, 3, -1, Kind::Int64},   {{2, 3}, 4, 5, -1, Kind::Int64},
      {{2, 3}, 4, 5, 2, Kind::Int32}, {{3, 2, 2}, 3, 2, 0, Kind::Int64},
      {{}, 6, 4, -1, Kind::Int32},    {{4, 9}, 5, 17, 4, Kind::Int32},
      {{0}, 3, 2, -1, Kind::Int64},   {{40, 3}, 11, 33, -1, Kind::Int64},
  };
  for (const auto& [shape, num, dim, pad, kind] : specs) {
    const int64_t p = pad;
    OpCase c{absl::StrCat("embedding ids ", dims_str(shape), kind == Kind::Int32 ? " int32" : "",
                          " weight [", num, ",", dim, "] padding_idx ", pad),
             {int_input(shape, kind, integers(0, num - 1)), floating({num, dim})},
             [p](const Inputs& x) {
               return F::embedding(x[0], x[1], p < 0 ? std::nullopt : std::optional<int64_t>(p));
             },
             [](const Refs& x) { return ref_embedding(x[0], x[1]); }};
    // Central differences check the weight's gradient, but where a padding row gets none
    // (which they would not see): there the reference does.
    if (p >= 0)
      c.grad_reference = [p](const Refs& x, const RefTensor& gy) {
        return Refs{RefTensor{}, ref_embedding_grad(x[0], x[1], gy, p)};
      };
    cases.push_back(std::move(c));
  }
  return cases;
}

// layer_norm over the last `cols` elements of each row; gamma and beta (empty: 1 and 0).
inline RefTensor ref_layer_norm(const RefTensor& x, int64_t cols, const RefTensor* gamma,
                                const RefTensor* beta, double eps) {
  RefTensor y = x;
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < cols; ++i) mean += x.v[r * cols + i];
    mean /= static_cast<double>(cols);
    for (int64_t i = 0; i < cols; ++i) {
      const double d = x.v[r * cols + i] - mean;
      var += d * d;
    }
    var /= static_cast<double>(cols);
    const double rstd = 1 / std::sqrt(var + eps);
    for (int64_t i = 0; i < cols; ++i) {
      double h = (x.v[r * cols + i] - mean) * rstd;
      if (gamma != nullptr) h *= gamma->v[i];
      if (beta != nullptr) h += beta->v[i];
      y.v[r * cols + i] = h;
    }
  }
  return y;
}

inline std::vector<OpCase> layer_norm_cases() {
  std::vector<OpCase> cases;
  struct Spec {
    Dims x, normalized;
    bool gamma, beta;
    double eps;
  };
  const Spec specs[] = {
      {{4, 6}, {6}, true, true, 1e-5},
      {{2, 3, 5}, {5}, true, false, 1e-5},
      {{2, 3, 4}, {3, 4}, false, true, 1e-5},
      {{3, 7}, {7}, false, false, 1e-5},
      {{5}, {5}, true, true, 0.1},
      {{0, 4}, {4}, true, true, 1e-5},
      {{3, 130}, {130}, true, true, 1e-5},
      {{2, 1100}, {1100}, true, false, 1e-5},  // past 1024: a block per row on CUDA
      {{70, 9}, {9}, true, true, 1e-3},
      {{2, 2, 3}, {2, 2, 3}, true, true, 1e-5},
  };
  for (const Spec& sp : specs) {
    const int64_t cols = ref::numel(sp.normalized);
    std::vector<InputSpec> in{floating(sp.x, uniform(-2, 2))};
    if (sp.gamma) in.push_back(floating(sp.normalized, uniform(0.5, 1.5)));
    if (sp.beta) in.push_back(floating(sp.normalized));
    const Spec s = sp;
    cases.push_back(
        {absl::StrCat("layer_norm x ", dims_str(sp.x), " over ", dims_str(sp.normalized),
                      sp.gamma ? " gamma" : "", sp.beta ? " beta" : "", " eps ", sp.eps),
         std::move(in),
         [s](const Inputs& x) {
           const Tensor g = s.gamma ? x[1] : Tensor();
           const Tensor b = s.beta ? x[s.gamma ? 2 : 1] : Tensor();
           return F::layer_norm(x[0], s.normalized, g, b, s.eps);
         },
         [s, cols](const Refs& x) {
           return ref_layer_norm(x[0], cols, s.gamma ? &x[1] : nullptr,
                                 s.beta ? &x[s.gamma ? 2 : 1] : nullptr, s.eps);
         }});
  }
  return cases;
}

// Mean over targets not equal to `ignore` of logsumexp(row) - row[target]; 0 when none counts.
inline RefTensor ref_cross_entropy_last_axis(const RefTensor& logits, const RefTensor& targets,
                                             int64_t ignore) {
  const int64_t classes = logits.shape.back();
  double total = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) {
    const auto t = static_cast<int64_t>(targets.v[i]);
    if (t == ignore) continue;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < classes; ++j) m = std::max(m, logits.v[i * classes + j]);
    for (int64_t j = 0; j < classes; ++j) s += std::exp(logits.v[i * classes + j] - m);
    total += m + std::log(s) - logits.v[i * classes + t];
    ++count;
  }
  return {{}, {count == 0 ? 0.0 : total / static_cast<double>(count)}};
}

inline std::vector<OpCase> cross_entropy_cases() {
  std::vector<OpCase> cases;
  // logits shape, ignore_index, ignored positions, targets dtype.
  const std::tuple<Dims, int64_t, int64_t, Kind> specs[] = {
      {{3, 4, 5}, -100, 0, Kind::Int64}, {{3, 4, 5}, -100, 5, Kind::Int64},
      {{2, 6, 7}, 0, 3, Kind::Int32},    {{4, 3}, -1, 1, Kind::Int32},
      {{2, 2, 3, 4}, 2, 4, Kind::Int64}, {{6}, -100, 0, Kind::Int64},
  };
  for (const auto& [shape, ignore, ignored, kind] : specs) {
    const int64_t classes = shape.back(), ig = ignore;
    const Dims targets(shape.begin(), shape.end() - 1);
    cases.push_back(
        {absl::StrCat("cross_entropy logits ", dims_str(shape), " ignore_index ", ignore, " (",
                      ignored, " ignored)", kind == Kind::Int32 ? " int32" : ""),
         {floating(shape, uniform(-3, 3)),
          int_input(targets, kind, labels(classes, ignore, ignored))},
         [ig](const Inputs& x) { return F::cross_entropy(x[0], x[1], ig); },
         [ig](const Refs& x) { return ref_cross_entropy_last_axis(x[0], x[1], ig); }});
  }
  return cases;
}

}  // namespace encore::optest
