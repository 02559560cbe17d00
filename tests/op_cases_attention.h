// The op harness's cases for attention: matmul over broadcast batch dimensions, masked_fill and
// scaled_dot_product_attention, with plain-loop references. Shared by the cpu tests
// (attention_test.cc) and the CUDA tests (cuda/cuda_ops_test.cc).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "encore/functions.h"
#include "op_harness.h"

namespace encore::optest {

// The batch dimensions of d (all but the last two).
inline Dims batch_of(const Dims& d) {
  return Dims(d.begin(), d.end() - 2);
}

// The flat offset of the matrix of batch `idx` (of the broadcast batch shape) in a tensor of
// shape d.
inline int64_t matrix_offset(const Dims& idx, const Dims& d) {
  const Dims batch = batch_of(d);
  return ref::broadcast_source(idx, batch) * d[d.size() - 2] * d.back();
}

// a [..., M, K] x b [..., K, N], the batch dimensions broadcast.
inline RefTensor ref_batched_matmul(const RefTensor& a, const RefTensor& b) {
  const int64_t m = a.shape[a.shape.size() - 2], k = a.shape.back(), n = b.shape.back();
  const Dims batch = ref::broadcast_dims(batch_of(a.shape), batch_of(b.shape));
  Dims out = batch;
  out.push_back(m);
  out.push_back(n);
  RefTensor y = ref::filled(out);
  for (int64_t p = 0; p < ref::numel(batch); ++p) {
    const Dims idx = ref::unravel(p, batch);
    const double* pa = a.v.data() + matrix_offset(idx, a.shape);
    const double* pb = b.v.data() + matrix_offset(idx, b.shape);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t l = 0; l < k; ++l) s += pa[i * k + l] * pb[l * n + j];
        y.v[(p * m + i) * n + j] = s;
      }
  }
  return y;
}

// The last two axes swapped.
inline RefTensor ref_transpose_last(const RefTensor& x) {
  const int64_t r = x.shape[x.shape.size() - 2], c = x.shape.back();
  RefTensor y = x;
  std::swap(y.shape[y.shape.size() - 2], y.shape.back());
  for (int64_t p = 0; p < (r * c == 0 ? 0 : x.numel() / (r * c)); ++p)
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) y.v[p * r * c + j * r + i] = x.v[p * r * c + i * c + j];
  return y;
}

inline std::vector<OpCase> batched_matmul_cases() {
  std::vector<OpCase> cases;
  const std::pair<Dims, Dims> shapes[] = {
      {{2, 3, 4, 5}, {2, 3, 5, 2}},  // [B,H,T,D] x [B,H,D,T]
      {{2, 3, 4}, {4, 5}},           // [B,T,D] x [D,N]: one GEMM
      {{2, 1, 3, 4}, {3, 4, 2}},     // batch [2,1] x [3] -> [2,3]
      {{3, 4}, {2, 2, 4, 5}},        // a shared by every batch
      {{2, 3, 4}, {1, 1, 4, 5}},     // b's batch all ones
      {{1, 2, 3}, {4, 3, 2}},        // a broadcast over 4
      {{2, 1, 3, 4}, {1, 3, 4, 2}},  // both broadcast
      {{0, 2, 3}, {3, 2}},           // no batches
      {{3, 2, 0}, {3, 0, 4}},        // K = 0
  };
  for (const auto& [sa, sb] : shapes)
    cases.push_back({absl::StrCat("matmul ", dims_str(sa), " x ", dims_str(sb)),
                     {floating(sa), floating(sb)},
                     [](const Inputs& x) { return F::matmul(x[0], x[1]); },
                     [](const Refs& x) { return ref_batched_matmul(x[0], x[1]); }});
  // q k^T through a transposed view.
  cases.push_back(
      {"matmul [2,2,3,4] x transpose([2,2,5,4])",
       {floating({2, 2, 3, 4}), floating({2, 2, 5, 4})},
       [](const Inputs& x) { return F::matmul(x[0], F::transpose(x[1], -2, -1)); },
       [](const Refs& x) { return ref_batched_matmul(x[0], ref_transpose_last(x[1])); }});
  return cases;
}

inline std::vector<OpCase> masked_fill_cases() {
  std::vector<OpCase> cases;
  const std::pair<Dims, Dims> shapes[] = {
      {{3, 4}, {3, 4}}, {{2, 3, 4}, {4}}, {{2, 3, 4}, {2, 1, 4}}, {{5}, {}}, {{1, 2, 3}, {2, 1}}};
  for (const auto& [sx, sm] : shapes) {
    for (double value : {2.5, -7.0}) {
      cases.push_back(
          {absl::StrCat("masked_fill x ", dims_str(sx), " mask ", dims_str(sm), " ", value),
           {floating(sx), bool_input(sm)},
           [value](const Inputs& x) { return F::masked_fill(x[0], x[1], value); },
           [value](const Refs& x) {
             return ref::zip(x[0], x[1],
                             [value](double a, double m) { return m != 0 ? value : a; });
           }});
    }
  }
  // -inf, as attention masks: forward only (central differences through -inf are NaN).
  cases.push_back({"masked_fill x [3,4] mask [3,4] -inf",
                   {constant({3, 4}), bool_input({3, 4})},
                   [](const Inputs& x) { return F::masked_fill(x[0], x[1], -INFINITY); },
                   [](const Refs& x) {
                     return ref::zip(x[0], x[1], [](double a, double m) {
                       return m != 0 ? -std::numeric_limits<double>::infinity() : a;
                     });
                   }});
  return cases;
}

// softmax(q k^T scale + mask) v, batch dimensions broadcast. mask: null, or bool (`bool_mask`,
// true = take part) or additive, broadcast to [..., T, S].
inline RefTensor ref_attention(const RefTensor& q, const RefTensor& k, const RefTensor& v,
                               bool causal, const RefTensor* mask, bool bool_mask,
                               std::optional<double> scale) {
  const int64_t t = q.shape[q.shape.size() - 2], d = q.shape.back();
  const int64_t s = k.shape[k.shape.size() - 2], dv = v.shape.back();
  const double f = scale ? *scale : 1 / std::sqrt(static_cast<double>(d));
  const Dims batch = ref::broadcast_dims(ref::broadcast_dims(batch_of(q.shape), batch_of(k.shape)),
                                         batch_of(v.shape));
  Dims out = batch;
  out.push_back(t);
  out.push_back(dv);
  Dims scores_shape = batch;
  scores_shape.push_back(t);
  scores_shape.push_back(s);
  RefTensor y = ref::filled(out);
  for (int64_t p = 0; p < ref::numel(batch); ++p) {
    const Dims idx = ref::unravel(p, batch);
    const double* pq = q.v.data() + matrix_offset(idx, q.shape);
    const double* pk = k.v.data() + matrix_offset(idx, k.shape);
    const double* pv = v.v.data() + matrix_offset(idx, v.shape);
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> w(s);
      double m = -INFINITY;
      for (int64_t j = 0; j < s; ++j) {
        double x = 0;
        for (int64_t l = 0; l < d; ++l) x += pq[i * d + l] * pk[j * d + l];
        x *= f;
        if (causal && j > i) x = -INFINITY;
        if (mask != nullptr) {
          Dims at = idx;
          at.push_back(i);
          at.push_back(j);
          const double mv = mask->v[ref::broadcast_source(at, mask->shape)];
          x = bool_mask ? (mv != 0 ? x : -INFINITY) : x + mv;
        }
        w[j] = x;
        m = std::max(m, x);
      }
      double sum = 0;
      for (double& x : w) sum += (x = std::exp(x - m));
      for (int64_t c = 0; c < dv; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < s; ++j) acc += w[j] / sum * pv[j * dv + c];
        y.v[(p * t + i) * dv + c] = acc;
      }
    }
  }
  return y;
}

inline std::vector<OpCase> attention_cases() {
  std::vector<OpCase> cases;
  struct Spec {
    Dims q, k, v;
    bool causal;
    std::optional<double> scale;
  };
  const Spec specs[] = {
      {{2, 3, 4}, {2, 5, 4}, {2, 5, 3}, false, std::nullopt},
      {{1, 2, 4, 3}, {1, 2, 4, 3}, {1, 2, 4, 3}, true, std::nullopt},
      {{2, 3, 4}, {2, 5, 4}, {2, 5, 2}, true, std::nullopt},  // T < S: top-left aligned
      {{5, 4}, {3, 4}, {3, 2}, true, 0.5},                    // T > S
      {{2, 2, 3, 4}, {2, 1, 5, 4}, {1, 5, 2}, false, 0.25},   // broadcast batches
  };
  for (const Spec& sp : specs) {
    const Spec c = sp;
    cases.push_back({absl::StrCat("attention q ", dims_str(sp.q), " k ", dims_str(sp.k), " v ",
                                  dims_str(sp.v), sp.causal ? " causal" : "",
                                  sp.scale ? absl::StrCat(" scale ", *sp.scale) : ""),
                     {floating(sp.q), floating(sp.k), floating(sp.v)},
                     [c](const Inputs& x) {
                       return F::scaled_dot_product_attention(x[0], x[1], x[2], c.causal, Tensor(),
                                                              c.scale);
                     },
                     [c](const Refs& x) {
                       return ref_attention(x[0], x[1], x[2], c.causal, nullptr, false, c.scale);
                     }});
  }
  // A bool mask (true = take part; every query keeps key 0) and an additive one.
  std::vector<double> keep(3 * 5);
  for (int64_t i = 0; i < 15; ++i) keep[i] = i % 5 == 0 || (i * 7) % 3 == 1 ? 1 : 0;
  cases.push_back({"attention q [2,3,4] k,v [2,5,4] bool mask [3,5]",
                   {floating({2, 3, 4}),
                    floating({2, 5, 4}),
                    floating({2, 5, 4}),
                    {{3, 5}, Kind::Bool, fixed(keep), false}},
                   [](const Inputs& x) {
                     return F::scaled_dot_product_attention(x[0], x[1], x[2], false, x[3]);
                   },
                   [](const Refs& x) {
                     return ref_attention(x[0], x[1], x[2], false, &x[3], true, std::nullopt);
                   }});
  cases.push_back(
      {"attention q [2,3,4] k,v [2,5,4] causal, additive mask [1,3,5]",
       {floating({2, 3, 4}), floating({2, 5, 4}), floating({2, 5, 4}), floating({1, 3, 5})},
       [](const Inputs& x) {
         return F::scaled_dot_product_attention(x[0], x[1], x[2], true, x[3]);
       },
       [](const Refs& x) {
         return ref_attention(x[0], x[1], x[2], true, &x[3], false, std::nullopt);
       }});
  return cases;
}

}  // namespace encore::optest
