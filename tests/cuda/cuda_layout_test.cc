// Layout folds on CUDA (schedule/layout_folds.cc): chains of layout steps are strided_copy
// steps, gathers or one launch for a concat's parts written at strides, that replay eager's bits
// with CUDA graphs on and off: random chains over float, double and int64 values (values and
// gradients), a concat of eleven parts (two launches) and a large transpose (the tiled gather),
// and attention's step, whose gradient concat is a copy of three parts.
#include <catch2/catch.hpp>

#include <string>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/layout_cases.h"
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
          check_value_and_gradient(body, f, rand({4, 6, 10}, dtype, kCuda, -1, 1));
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
    const auto [text, entry] = check_attention_steps(32, 4, {3, 7, 32}, kCuda, 4);
    INFO(text);
    CHECK(count_of(text, "split and permute in one") == 1);
    CHECK(count_of(text, "3 copies from one buffer in one step") == 1);
    CHECK(count_of(text, "permute, permute, permute and concat in one") == 1);
    check_graph_use(entry, graphs, 3);
  });
}

TEST_CASE("a concat of eleven parts on cuda (two launches) and a large transpose, bit for bit",
          "[cuda][static][layout]") {
  with_graphs_on_and_off([](bool) { check_wide_layouts(kCuda); });
}
