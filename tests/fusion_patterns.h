// The check every fused-pattern test runs (static_fusion_rows_test.cc,
// static_fusion_layer_norm_test.cc): a function of N arguments eagerly and as three static
// functions (fused, fused with verify mode, unfused), in float32 and float64 at one and two
// threads, every replay's result and argument gradients against eager's bit for bit; and the
// step counts and schedule of the fused and unfused plans.
#pragma once

#include <catch2/catch.hpp>

#include <array>
#include <iterator>
#include <regex>
#include <string>
#include <tuple>
#include <utility>

#include "encore/encore.h"
#include "tests/test_util.h"

namespace encore::testing {

// Every fusable op once, in a chain whose values stay finite and positive where log, sqrt and
// pow need it. `c` has one element (a broadcast operand), `w` the shape of x.
inline Tensor every_fusable_op(const Tensor& x, const Tensor& w, const Tensor& c) {
  Tensor y = F::sigmoid(x);         // (0, 1)
  y = F::add(F::mul(y, 2.0), 0.5);  // (0.5, 2.5)
  y = F::sqrt(y) + F::log(y);       // tensor + tensor
  y = F::exp(F::mul(y, 0.25));      // positive
  y = F::pow(y, 2.0) - F::pow(y, 1.5);
  y = F::div(y, w) * c;           // broadcast c
  y = F::sub(c, F::div(y, 3.0));  // c - y: the broadcast operand first
  y = F::tanh(F::leaky_relu(y, 0.1)) + F::relu(F::neg(y));
  y = F::gelu(y) - F::gelu(y, "tanh");
  y = F::div(1.0, F::add(F::mul(y, y), 1.0)) - F::sub(1.0, y);
  return y;
}

// Key j > query i, as causal attention masks its [T, T] scores: a bool [T, T] on like's device.
inline Tensor causal_mask(int64_t t, const Tensor& like) {
  const Tensor rows = F::reshape(arange(t, like.dtype(), like.device()), {t, 1});
  const Tensor cols = F::reshape(arange(t, like.dtype(), like.device()), {1, t});
  return F::greater(cols, rows);
}

template <size_t N>
using Args = std::array<Tensor, N>;

// The result and the gradient of every argument for the loss sum(y * y).
template <size_t N, typename Fn>
std::pair<Tensor, Args<N>> run_once(Fn& fn, const Args<N>& args) {
  Args<N> leaves;
  for (size_t i = 0; i < N; ++i) leaves[i] = args[i].detach().set_requires_grad();
  Tensor y = std::apply(fn, leaves);
  F::sum(F::mul(y, y)).backward();
  Args<N> grads;
  for (size_t i = 0; i < N; ++i) grads[i] = leaves[i].grad();
  return {y, grads};
}

struct Steps {
  int forward = 0, backward = 0;
};

struct Outcome {
  Steps fused, unfused;
  std::string text;  // the fused plan's schedule (float32, one thread)
};

// Runs `body` over arguments of `shapes` eagerly and as three static functions (fused, fused with
// verify mode, unfused) in float32 and float64 at one and two threads, checking every replay's
// bits against eager's.
template <size_t N, typename Fn>
Outcome check_pattern(const std::string& name, Fn body, const std::array<Shape, N>& shapes) {
  StaticEnabled on;
  Outcome out;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (int threads : {1, 2}) {
      INFO(name << " in " << encore::name(dtype) << " at " << threads << " threads");
      ThreadCount tc(threads);
      manual_seed(7);
      auto f = static_graph(body, {.name = name});
      auto v = static_graph(body, {.name = name + "_verified", .verify_every = 1});
      auto g = static_graph(body, {.name = name + "_unfused"});
      for (int call = 0; call < 3; ++call) {
        Args<N> args;
        for (size_t i = 0; i < N; ++i) args[i] = rand(shapes[i], dtype, Device::cpu(), -2, 2);
        const auto want = run_once<N>(body, args);
        for (auto* fn : {&f, &v, &g}) {
          const StaticFusion fuse(fn != &g);  // read when the first call traces
          const auto got = run_once<N>(*fn, args);
          CHECK(bit_diff(got.first, want.first) == "");
          for (size_t i = 0; i < N; ++i) CHECK(bit_diff(got.second[i], want.second[i]) == "");
        }
      }
      REQUIRE(f.stats().traces == 1);
      CHECK(v.stats().verifications >= 2);
      const EntryReport a = f.stats().cache[0];
      const EntryReport b = g.stats().cache[0];
      if (dtype == DType::Float32 && threads == 1) {
        out.fused = {a.forward_steps, a.backward_steps};
        out.unfused = {b.forward_steps, b.backward_steps};
        out.text = f.schedule_text();
      }
    }
  }
  return out;
}

}  // namespace encore::testing
