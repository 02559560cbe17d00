// The op harness's cases for the ops of sequence models (embedding): plain-loop references and
// case lists, shared by the cpu tests (embedding_test.cc) and the CUDA tests
// (cuda/cuda_ops_test.cc).
#pragma once

#include <cstdint>
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
             [p](const Inputs& x) { return F::embedding(x[0], x[1], p); },
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

}  // namespace encore::optest
