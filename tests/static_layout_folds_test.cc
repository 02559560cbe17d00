// Layout folds (schedule/layout_folds.cc, set_static_fold_layouts_enabled): a value a layout
// step writes and only layout steps read is not written; its readers read its elements where it
// read them, as one strided_copy.
// Attention's head split (its three copies one step) and the concat of its gradients fold (the
// dump names the steps each copy stands for) and train bit for bit as eager; random chains of
// permute, reshape, slice, split and concat over float, double and int64 values give eager's values
// and gradients, in verify mode too; a chain whose first buffer is written in between, or whose
// view a reader cannot take, keeps its steps.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/layout_cases.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

int steps_of(const std::string& text) {
  return count_of(text, R"(\n +[0-9]+  [a-z_]+)");
}

}  // namespace

TEST_CASE("attention's head split and gradient concat fold into strided copies",
          "[static][fusion][layout]") {
  StaticEnabled on;
  const StaticFusion fuse(true);
  const StaticFoldLayouts folds(true);
  const std::string text = check_attention_steps(16, 2, {2, 5, 16}, Device::cpu(), 3).first;
  INFO(text);
  // q, k and v: the split and each head permute in one, the three copies one step; their
  // gradients' permutes and the concat in one.
  CHECK(count_of(text, "strided_copy +\\[split and permute in one: recorded as steps") == 1);
  CHECK(count_of(text, "3 copies from one buffer in one step") == 1);
  CHECK(count_of(text, "strided_copy +\\[permute, permute, permute and concat in one") == 1);
  CHECK(count_of(text, "\\n +[0-9]+  split\\b") == 0);
  CHECK(count_of(text, "\\n +[0-9]+  concat\\b") == 0);

  // The switch off: the split, the six permutes and the concat are steps of their own, six
  // more (three forward, three backward).
  const StaticFoldLayouts off(false);
  const std::string plain = check_attention_steps(16, 2, {2, 5, 16}, Device::cpu(), 1).first;
  CHECK(count_of(plain, "strided_copy") == 0);
  CHECK(steps_of(plain) == steps_of(text) + 6);
}

TEST_CASE("random layout chains replay eager's values and gradients", "[static][fusion][layout]") {
  StaticEnabled on;
  const StaticFusion fuse(true);
  const StaticFoldLayouts folds(true);
  int copies = 0, folded_steps = 0, side_by_side = 0;
  for (uint32_t seed = 0; seed < 60; ++seed) {
    for (DType dtype : {DType::Float32, DType::Float64, DType::Int64}) {
      INFO("seed " << seed << ", " << name(dtype));
      const bool grad = dtype != DType::Int64;
      auto body = [seed](const Tensor& x) { return layout_chain(x, seed); };
      auto f = static_graph(body, {.name = "chain"});
      auto v = static_graph(body, {.name = "chain_verified", .verify_every = 1});
      for (int call = 0; call < 2; ++call) {
        Tensor x = grad ? rand({4, 6, 10}, dtype, Device::cpu(), -1, 1)
                        : F::reshape(arange(240, dtype), {4, 6, 10});
        if (!grad) {
          CHECK(bit_diff(f(x), body(x)) == "");
          CHECK(bit_diff(v(x), body(x)) == "");
          continue;
        }
        const EagerResult eager = check_value_and_gradient(body, f, x);
        Tensor xv = x.detach();
        xv.set_requires_grad();
        const Tensor yv = v(xv);
        CHECK(bit_diff(yv, eager.y) == "");
        F::sum(F::mul(yv, yv)).backward();
        CHECK(bit_diff(xv.grad(), eager.grad) == "");
      }
      const std::string text = f.schedule_text();
      copies += count_of(text, "strided_copy");
      folded_steps += count_of(text, " in one: recorded as steps");
      side_by_side += count_of(text, "copies from one buffer in one step");
    }
  }
  // Chains of two or more layout steps are common among 180 random programs.
  CHECK(copies > 50);
  CHECK(folded_steps > 50);
  INFO(side_by_side << " steps of copies side by side");
  CHECK(side_by_side > 0);
}

TEST_CASE("a chain whose first buffer is written in between keeps its steps",
          "[static][fusion][layout]") {
  StaticEnabled on;
  const StaticFusion fuse(true);
  const StaticFoldLayouts folds(true);
  NoGradGuard no_grad;
  // b = a^T is read by the second permute after add_ has changed a: read from a, it would see
  // the new values.
  auto body = [](const Tensor& x) {
    const Tensor a = F::mul(x, 2.0);
    const Tensor b = F::permute(a, {1, 0});
    add_(a, ones({1}));
    return F::add(F::permute(b, {1, 0}), a);
  };
  auto f = static_graph(body, {.name = "written_between"});
  for (int call = 0; call < 3; ++call) {
    const Tensor x = rand({3, 5});
    CHECK(bit_diff(f(x), body(x)) == "");
  }
  const std::string text = f.schedule_text();
  INFO(text);
  CHECK(count_of(text, "strided_copy") == 0);
  CHECK(count_of(text, "\\n +[0-9]+  permute\\b") == 2);
}

TEST_CASE("a view a reader cannot take keeps its step", "[static][fusion][layout]") {
  StaticEnabled on;
  const StaticFusion fuse(true);
  const StaticFoldLayouts folds(true);
  NoGradGuard no_grad;
  // [4,6]^T read as 24 values: a slice with step 5 crosses its two dimensions, one of 8 from 8
  // does not.
  auto strided = [](const Tensor& x) {
    return F::slice(F::reshape(F::permute(x, {1, 0}), {24}), 0, 0, 24, 5);
  };
  auto rows = [](const Tensor& x) {
    return F::slice(F::reshape(F::permute(x, {1, 0}), {24}), 0, 8, 16);
  };
  auto f = static_graph(strided, {.name = "strided"});
  auto g = static_graph(rows, {.name = "rows"});
  for (int call = 0; call < 2; ++call) {
    const Tensor x = rand({4, 6});
    CHECK(bit_diff(f(x), strided(x)) == "");
    CHECK(bit_diff(g(x), rows(x)) == "");
  }
  CHECK(count_of(f.schedule_text(), "strided_copy") == 0);
  // Rows 1 and 2 of [4,3] are six contiguous values, which a [3,2] reader splits anew.
  auto regrouped = [](const Tensor& x) {
    return F::permute(F::reshape(F::slice(x, 0, 1, 3), {3, 2}), {1, 0});
  };
  auto h = static_graph(regrouped, {.name = "regrouped"});
  for (int call = 0; call < 2; ++call) {
    const Tensor x = rand({4, 3});
    CHECK(bit_diff(h(x), regrouped(x)) == "");
  }
  CHECK_THAT(h.schedule_text(), Contains("slice and permute in one"));
  CHECK(steps_of(h.schedule_text()) == 1);
  const std::string text = g.schedule_text();
  INFO(text);
  CHECK_THAT(text, Contains("permute and slice in one"));
  CHECK(steps_of(text) == 1);
}

TEST_CASE("layout folds leave empty values alone and never add launches",
          "[static][fusion][layout]") {
  StaticEnabled on;
  const StaticFusion fuse(true);
  const StaticFoldLayouts folds(true);
  NoGradGuard no_grad;
  SECTION("empty values") {
    auto empty_permute = [](const Tensor& x) { return F::permute(x, {1, 0}); };
    auto empty_slice = [](const Tensor& x) { return F::permute(F::slice(x, 0, 2, 2), {1, 0}); };
    auto empty_part = [](const Tensor& x) {
      const std::vector<Tensor> parts = F::split(x, {0, 4}, 0);
      return F::concat({F::permute(parts[0], {1, 0}), F::permute(parts[1], {1, 0})}, 1);
    };
    auto f = static_graph(empty_permute, {.name = "empty_permute"});
    auto g = static_graph(empty_slice, {.name = "empty_slice"});
    auto h = static_graph(empty_part, {.name = "empty_part"});
    for (int call = 0; call < 2; ++call) {
      const Tensor x = rand({4, 3});
      CHECK(bit_diff(f(rand({0, 3})), empty_permute(rand({0, 3}))) == "");
      CHECK(bit_diff(g(x), empty_slice(x)) == "");
      CHECK(bit_diff(h(x), empty_part(x)) == "");
    }
  }
  SECTION("a split whose parts other ops read stays one split") {
    // Folding the permute into the split would make three copies of one split's work.
    auto body = [](const Tensor& x) {
      const std::vector<Tensor> parts = F::split(F::permute(x, {1, 0}), {2, 3, 1}, 1);
      return F::add(F::add(F::sum(parts[0]), F::sum(parts[1])), F::sum(parts[2]));
    };
    auto f = static_graph(body, {.name = "split_read_elsewhere"});
    for (int call = 0; call < 2; ++call) {
      const Tensor x = rand({6, 5});
      CHECK(bit_diff(f(x), body(x)) == "");
    }
    const std::string text = f.schedule_text();
    INFO(text);
    CHECK(count_of(text, "strided_copy") == 0);
    CHECK(count_of(text, "\\n +[0-9]+  split\\b") == 1);
  }
  SECTION("a part nothing reads is not copied") {
    auto body = [](const Tensor& x) {
      const std::vector<Tensor> parts = F::split(F::permute(x, {1, 0}), {2, 4}, 1);
      return F::permute(parts[0], {1, 0});
    };
    auto f = static_graph(body, {.name = "unread_part"});
    for (int call = 0; call < 2; ++call) {
      const Tensor x = rand({6, 5});
      CHECK(bit_diff(f(x), body(x)) == "");
    }
    const std::string text = f.schedule_text();
    INFO(text);
    CHECK_THAT(text, Contains("permute, split and permute in one"));
    CHECK(steps_of(text) == 1);
  }
}

TEST_CASE("a concat of eleven parts and a large transpose are one strided copy each",
          "[static][fusion][layout]") {
  check_wide_layouts(Device::cpu());
}
