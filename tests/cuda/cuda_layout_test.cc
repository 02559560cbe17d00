// Layout folds on CUDA (schedule/layout_folds.cc): chains of layout steps are strided_copy
// steps, gathers or one launch for a concat's parts written at strides, that replay eager's bits
// with CUDA graphs on and off: random chains over float, double and int64 values (values and
// gradients), and attention's step, whose gradient concat is a copy of three parts.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "encore/encore.h"
#include "encore/nn_sequence.h"
#include "encore/static_graph.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/layout_chain.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;

TEST_CASE("layout chains on cuda are strided copies that replay eager's bits",
          "[cuda][static][layout]") {
  with_graphs_on_and_off([](bool) {
    StaticEnabled on;
    const StaticFusion fuse(true);
    const StaticFoldLayouts folds(true);
    int copies = 0;
    for (uint32_t seed = 0; seed < 30; ++seed) {
      for (DType dtype : {DType::Float32, DType::Float64, DType::Int64}) {
        INFO("seed " << seed << ", " << name(dtype));
        auto body = [seed](const Tensor& x) { return layout_chain(x, seed); };
        auto f = static_graph(body, {.name = "chain"});
        for (int call = 0; call < 3; ++call) {
          if (dtype == DType::Int64) {
            const Tensor x = F::reshape(arange(240, dtype, kCuda), {4, 6, 10});
            CHECK(bit_diff(f(x), body(x)) == "");
            continue;
          }
          const Tensor x = rand({4, 6, 10}, dtype, kCuda, -1, 1);
          Tensor xe = x.detach(), xs = x.detach();
          xe.set_requires_grad();
          xs.set_requires_grad();
          const Tensor ye = body(xe), ys = f(xs);
          REQUIRE(bit_diff(ys, ye) == "");
          F::sum(F::mul(ye, ye)).backward();
          F::sum(F::mul(ys, ys)).backward();
          CHECK(bit_diff(xs.grad(), xe.grad()) == "");
        }
        copies += count_of(f.schedule_text(), "strided_copy");
      }
    }
    CHECK(copies > 25);
  });
}

TEST_CASE("attention's step on cuda folds its head split and gradient concat, bit for bit",
          "[cuda][static][layout]") {
  with_graphs_on_and_off([](bool graphs) {
    StaticEnabled on;
    const StaticFusion fuse(true);
    const StaticFoldLayouts folds(true);
    auto make = [] {
      manual_seed(3);
      return std::make_shared<nn::MultiheadAttention>(
          32, 4, nn::AttentionOptions{.causal = true, .device = kCuda});
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
    for (int call = 0; call < 4; ++call) {
      const Tensor x = rand({3, 7, 32}, DType::Float32, kCuda, -1, 1);
      CHECK(bit_diff(step(x), eager(x)) == "");
      check_same_parameters(*static_model, *eager_model, cat("call ", call));
    }
    const std::string text = step.schedule_text();
    INFO(text);
    CHECK(count_of(text, "split and permute in one") == 3);
    CHECK(count_of(text, "permute, permute, permute and concat in one") == 1);
    check_graph_use(step.stats().cache[0], graphs, 3);
  });
}
