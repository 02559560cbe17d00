// The cases of the layout folds' tests (static_layout_folds_test.cc, cuda/cuda_layout_test.cc): a
// random chain of layout ops (permute, reshape, slice, split, concat), the same at every call of
// one seed; a concat of eleven transposed parts and a large transpose, one strided copy each; and
// attention's training step, eager against static.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "encore/encore.h"
#include "encore/nn_sequence.h"
#include "encore/static_graph.h"
#include "tests/test_util.h"

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

// Trains two causal MultiheadAttention(width, heads) made from one seed on `device`, one eagerly
// and one as a static step (zero_grad, the mean of its squared output, backward), `calls` times
// on the same random inputs of `shape`, checking that losses, parameters and gradients agree bit
// for bit. Returns the static step's schedule dump and its cache entry's report.
inline std::pair<std::string, EntryReport> check_attention_steps(int64_t width, int64_t heads,
                                                                 const Shape& shape, Device device,
                                                                 int calls) {
  auto make = [&] {
    manual_seed(3);
    return std::make_shared<nn::MultiheadAttention>(
        width, heads, nn::AttentionOptions{.causal = true, .device = device});
  };
  auto eager_model = make(), static_model = make();
  auto step_of = [](std::shared_ptr<nn::MultiheadAttention> m) {
    return [m](const Tensor& x) {
      m->zero_grad();
      Tensor y = (*m)(x);
      Tensor loss = F::mean(F::mul(y, y));
      loss.backward();
      return loss;
    };
  };
  auto eager = step_of(eager_model);
  auto step =
      static_graph(step_of(static_model), {.name = "attention_step", .modules = {static_model}});
  for (int call = 0; call < calls; ++call) {
    const Tensor x = rand(shape, DType::Float32, device, -1, 1);
    CHECK(bit_diff(step(x), eager(x)) == "");
    check_same_parameters(*static_model, *eager_model, cat("call ", call));
  }
  return {step.schedule_text(), step.stats().cache[0]};
}

// body(x) eagerly against the static f(x), each on its own copy of x requiring grad: the same
// bits in the value and in x's gradient of sum(y * y). Returns eager's value and gradient.
struct EagerResult {
  Tensor y, grad;
};
template <typename Body, typename Static>
EagerResult check_value_and_gradient(const Body& body, Static& f, const Tensor& x) {
  Tensor xe = x.detach(), xs = x.detach();
  xe.set_requires_grad();
  xs.set_requires_grad();
  const Tensor ye = body(xe), ys = f(xs);
  REQUIRE(bit_diff(ys, ye) == "");
  F::sum(F::mul(ye, ye)).backward();
  F::sum(F::mul(ys, ys)).backward();
  CHECK(bit_diff(xs.grad(), xe.grad()) == "");
  return {ye, xe.grad()};
}

// x [a, b, 11 * k] cut into 11 parts along its last axis, each transposed to [k, a, b], and the
// parts concatenated back along the first: one strided copy of eleven pieces (on CUDA two launches,
// of up to 8 pieces each).
inline Tensor eleven_parts(const Tensor& x) {
  std::vector<Tensor> parts = F::chunk(x, 11, 2);
  for (Tensor& p : parts) p = F::permute(p, {2, 0, 1});
  return F::concat(std::span<const Tensor>(parts), 0);
}

// A slice of a large x [n, m, 3] transposed: one strided copy through the tiled transpose.
inline Tensor large_transpose(const Tensor& x) {
  return F::permute(F::slice(x, 1, 1, x.shape()[1] - 2), {2, 1, 0});
}

// Both on `device` as static functions, against eager over three calls (values and gradients):
// each is one strided copy, and no concat, permute or slice is left.
inline void check_wide_layouts(Device device) {
  StaticEnabled on;
  const StaticFusion fuse(true);
  const StaticFoldLayouts folds(true);
  struct Case {
    const char* name;
    Tensor (*body)(const Tensor&);
    Shape shape;
  };
  for (const Case& c : {Case{"eleven_parts", &eleven_parts, Shape{3, 5, 44}},
                        Case{"large_transpose", &large_transpose, Shape{67, 130, 3}}}) {
    INFO(c.name);
    auto f = static_graph(c.body, {.name = c.name});
    for (int call = 0; call < 3; ++call)
      check_value_and_gradient(c.body, f, rand(c.shape, DType::Float32, device, -1, 1));
    const std::string text = f.schedule_text();
    INFO(text);
    const std::string forward = text.substr(0, text.find("backward:"));
    CHECK(count_of(forward, "\\n +[0-9]+  strided_copy") == 1);
    CHECK(count_of(forward, "\\n +[0-9]+  (concat|permute|slice|split)\\b") == 0);
  }
}

}  // namespace encore::testing
