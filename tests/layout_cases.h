// A random chain of layout ops (permute, reshape, slice, split, concat), the same at every call
// of one seed: the layout folds' tests (static_layout_folds_test.cc, cuda/cuda_layout_test.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "encore/encore.h"

namespace encore::testing {

// A random chain of layout ops over x, the same ops at every call of one seed: permutes,
// reshapes (dimensions merged or split), slices (with steps), splits whose parts are taken
// apart or concatenated back in another order, and concats of a value with a slice of itself.
inline Tensor layout_chain(const Tensor& x, uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint32_t>(n)); };
  Tensor y = x;
  for (int op = 0; op < 5; ++op) {
    const int rank = y.rank();
    const int axis = static_cast<int>(pick(rank));
    const int64_t size = y.size(axis);
    switch (pick(5)) {
      case 0: {
        std::vector<int> perm(rank);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        y = F::permute(y, perm);
        break;
      }
      case 1: {
        std::vector<int64_t> shape(y.shape().begin(), y.shape().end());
        if (axis + 1 < rank && rank > 2) {  // merge two dimensions
          shape[axis] *= shape[axis + 1];
          shape.erase(shape.begin() + axis + 1);
        } else {  // split one by its smallest factor
          int64_t f = 2;
          while (f < size && size % f != 0) ++f;
          if (f >= size) break;
          shape[axis] = size / f;
          shape.insert(shape.begin() + axis + 1, f);
        }
        y = F::reshape(y, std::span<const int64_t>(shape));
        break;
      }
      case 2: {
        if (size < 2) break;
        const int64_t start = pick(size - 1);
        const int64_t stop = start + 1 + pick(size - start);
        y = F::slice(y, axis, start, stop, 1 + pick(3));
        break;
      }
      case 3: {
        if (size < 2) break;
        const int64_t first = 1 + pick(size - 1);
        std::vector<Tensor> parts = F::split(y, {first, size - first}, axis);
        y = pick(3) == 0 ? parts[pick(2)] : F::concat({parts[1], parts[0]}, axis);
        break;
      }
      default:
        y = F::concat({y, F::slice(y, axis, 0, 1)}, axis);
        break;
    }
  }
  return y;
}

}  // namespace encore::testing
