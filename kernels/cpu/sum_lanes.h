// A sum over a run of n terms in double, in 8 independent lanes combined in a fixed order:
// vectorisable, with no long chain of dependent additions, and the same bits at any thread count
// (batch_norm.cc, layer_norm.cc).
#pragma once

#include <cstdint>

namespace encore::kernels::cpu {

template <typename F>
double sum_lanes(int64_t n, F&& term) {
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += term(i + j);
  double s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  for (; i < n; ++i) s += term(i);
  return s;
}

}  // namespace encore::kernels::cpu
