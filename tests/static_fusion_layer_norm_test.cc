// layer_norm as a row op of cpu plans' fused runs: over the last axis, with its gain and bias
// read as one row each, it joins the elementwise steps around it (a residual add before it, a
// scale, shift or gelu after it) in one step that writes y, and the mean and rstd the gradient
// reads, as the layer_norm kernel does. A replay gives eager's bits (results, gradients) in
// float32 and float64 at one and two threads, verify mode compares each of its outputs, and a
// pre-norm transformer (models::TinyGpt) trains with fewer steps, bit for bit.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "encore/encore.h"
#include "tests/fusion_patterns.h"
#include "tests/sequence_training.h"
#include "tests/test_util.h"

using namespace encore;
using Catch::Matchers::Contains;
using testing::bit_diff;
using testing::check_pattern;
using testing::count_of;
using testing::Outcome;
using testing::StaticEnabled;
using testing::StaticFusion;
using testing::ThreadCount;

namespace {

constexpr const char* kFusedNorm = R"(= layer_norm\()";

}  // namespace

TEST_CASE("layer_norm of a sum is one fused step", "[static][fusion][rows][layer_norm]") {
  // Rows shorter than a block (several rows per block) and longer (one row per block).
  for (int64_t c : {int64_t{40}, int64_t{300}}) {
    auto affine = [c](const Tensor& a, const Tensor& b, const Tensor& g, const Tensor& beta) {
      return F::layer_norm(F::add(a, b), {c}, g, beta);
    };
    Outcome o =
        check_pattern<4>("ln_sum", affine, {Shape{2, 5, c}, Shape{2, 5, c}, Shape{c}, Shape{c}});
    INFO(o.text);
    CHECK(o.fused.forward == 1);
    CHECK(o.unfused.forward == 2);
    CHECK(o.fused.backward == o.unfused.backward);  // layer_norm_grad stays a step of its own
    CHECK(count_of(o.text, kFusedNorm) == 1);
    CHECK_THAT(o.text, Contains("(one row), beta in 3 (one row), eps 1e-05)"));
    CHECK_THAT(o.text, Contains(cat("by rows of ", c)));

    auto plain = [c](const Tensor& a, const Tensor& b) { return F::layer_norm(F::add(a, b), {c}); };
    o = check_pattern<2>("ln_sum_plain", plain, {Shape{7, c}, Shape{7, c}});
    INFO(o.text);
    CHECK(o.fused.forward == 1);
    CHECK(count_of(o.text, kFusedNorm) == 1);
    CHECK_THAT(o.text, !Contains("gamma"));

    // A bias alone: it is the op's second input but the instruction's beta.
    auto shifted = [c](const Tensor& a, const Tensor& b, const Tensor& beta) {
      return F::layer_norm(F::sub(a, b), {c}, Tensor(), beta, 1e-3);
    };
    o = check_pattern<3>("ln_beta", shifted, {Shape{6, c}, Shape{6, c}, Shape{c}});
    INFO(o.text);
    CHECK(o.fused.forward == 1);
    CHECK_THAT(o.text, Contains("= layer_norm(") && Contains(", beta in 2 (one row), eps 0.001)"));
  }
}

TEST_CASE("elementwise steps after a layer_norm join its run",
          "[static][fusion][rows][layer_norm]") {
  auto scale_shift = [](const Tensor& x, const Tensor& g, const Tensor& s, const Tensor& t) {
    return F::add(F::mul(F::layer_norm(x, {24}, g, Tensor()), s), t);
  };
  Outcome o = check_pattern<4>("ln_scale_shift", scale_shift,
                               {Shape{3, 4, 24}, Shape{24}, Shape{24}, Shape{24}});
  INFO(o.text);
  CHECK(o.fused.forward == 1);
  CHECK(o.unfused.forward == 3);
  CHECK(count_of(o.text, kFusedNorm) == 1);

  // add, layer_norm, gelu (both forms) and a residual add: one step.
  for (const char* form : {"none", "tanh"}) {
    auto block = [form](const Tensor& x, const Tensor& h, const Tensor& g, const Tensor& b) {
      const Tensor r = F::add(x, h);
      return F::add(F::gelu(F::layer_norm(r, {64}, g, b), form), r);
    };
    o = check_pattern<4>("ln_gelu", block, {Shape{10, 64}, Shape{10, 64}, Shape{64}, Shape{64}});
    INFO(o.text);
    CHECK(o.fused.forward == 1);
    CHECK(o.unfused.forward == 4);
    CHECK(count_of(o.text, R"(= gelu\()") == 1);
  }
}

TEST_CASE("layer_norm over more than the last axis stays apart",
          "[static][fusion][rows][layer_norm]") {
  // Over [4, 8] of [3, 4, 8]: rows of 32 that the run (by rows of 8) does not have.
  auto wide = [](const Tensor& x, const Tensor& y, const Tensor& g) {
    return F::mul(F::layer_norm(F::add(x, y), {4, 8}, g, Tensor()), 2.0);
  };
  Outcome o = check_pattern<3>("ln_wide", wide, {Shape{3, 4, 8}, Shape{3, 4, 8}, Shape{4, 8}});
  INFO(o.text);
  CHECK(o.fused.forward == o.unfused.forward);
  CHECK(count_of(o.text, kFusedNorm) == 0);
  // Over [1, 8] of [3, 1, 8]: the last axis alone after all.
  auto thin = [](const Tensor& x, const Tensor& y, const Tensor& g) {
    return F::mul(F::layer_norm(F::add(x, y), {1, 8}, g, Tensor()), 2.0);
  };
  o = check_pattern<3>("ln_thin", thin, {Shape{3, 1, 8}, Shape{3, 1, 8}, Shape{1, 8}});
  INFO(o.text);
  CHECK(o.fused.forward == 1);
  CHECK(count_of(o.text, kFusedNorm) == 1);
  // Rows longer than a fused program takes.
  auto long_rows = [](const Tensor& x, const Tensor& y) {
    return F::layer_norm(F::add(x, y), {3000});
  };
  o = check_pattern<2>("ln_long", long_rows, {Shape{2, 3000}, Shape{2, 3000}});
  INFO(o.text);
  CHECK(o.fused.forward == 2);
}

TEST_CASE("a fused layer_norm without a backward keeps y in scratch and writes mean and rstd",
          "[static][fusion][rows][layer_norm]") {
  StaticEnabled on;
  const StaticFusion fuse(true);
  for (DType dtype : {DType::Float32, DType::Float64}) {
    INFO(name(dtype));
    auto body = [](const Tensor& x, const Tensor& y, const Tensor& g) {
      return F::sum(F::layer_norm(F::mul(x, y), {50}, g, Tensor()), {-1});
    };
    auto f = static_graph(body, {.name = "ln_no_grad"});
    auto v = static_graph(body, {.name = "ln_no_grad_verified", .verify_every = 1});
    NoGradGuard no_grad;
    const Tensor g = rand({50}, dtype, Device::cpu(), -2, 2);
    for (int call = 0; call < 3; ++call) {
      const Tensor x = rand({6, 50}, dtype, Device::cpu(), -2, 2);
      const Tensor y = rand({6, 50}, dtype, Device::cpu(), -2, 2);
      CHECK(bit_diff(f(x, y, g), body(x, y, g)) == "");
      CHECK(bit_diff(v(x, y, g), body(x, y, g)) == "");
    }
    CHECK(v.stats().verifications == 2);
    const std::string text = f.schedule_text();
    INFO(text);
    CHECK(f.stats().cache[0].forward_steps == 1);
    // mul, layer_norm, sum: y lives in scratch, mean and rstd (read by nobody) are outputs.
    CHECK_THAT(text, Contains("scratch 1, out 0, out 1 = layer_norm(scratch 0, gamma in 2 (one "
                              "row), eps 1e-05)"));
    CHECK_THAT(text, Contains("out 2 = sum(scratch 1)"));
  }
}

TEST_CASE("verify mode compares each output of a fused layer_norm",
          "[static][fusion][rows][layer_norm]") {
  StaticEnabled on;
  const StaticFusion fused(true);
  Tensor w = rand({4, 30});
  // Without a backward y stays in scratch: only mean and rstd are compared for the layer_norm.
  auto f = static_graph(
      [&w](const Tensor& x) { return F::sum(F::layer_norm(F::mul(x, w), {30}), {-1}); },
      {.name = "ln_verified", .verify_every = 1});
  NoGradGuard no_grad;
  const Tensor x = rand({4, 30});
  f(x);
  CHECK_NOTHROW(f(x));
  CHECK(f.stats().verifications == 1);
  // A new tensor where the trace bound the old one by reference: the ops are the same, the
  // layer_norm's mean (its output 1) differs.
  w = rand({4, 30});
  CHECK_THAT(
      testing::error_of([&] { f(x); }),
      Contains("forward op 1 layer_norm") && Contains("(output 1) computed different values"));
}

TEST_CASE("a TinyGpt training step fuses its layer norms and equals eager bit for bit",
          "[static][fusion][rows][layer_norm][gpt]") {
  // A pre-norm transformer: each block's residual add and the next layer norm are one step.
  StaticEnabled on;
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    ThreadCount tc(threads);
    auto make = [] { return testing::seeded_on<models::TinyGpt>(Device::cpu(), 11, 16, 32, 4, 2); };
    std::shared_ptr<models::TinyGpt> eager = make(), fused = make(), unfused = make();
    optim::AdamW opt_e(eager->parameters()), opt_f(fused->parameters()),
        opt_u(unfused->parameters());
    const auto step = testing::lm_train_step;
    auto f =
        static_graph([&](const Tensor& x, const Tensor& t) { return step(*fused, opt_f, x, t); },
                     {.name = "gpt_fused", .verify_every = 2, .modules = {fused}});
    auto u =
        static_graph([&](const Tensor& x, const Tensor& t) { return step(*unfused, opt_u, x, t); },
                     {.name = "gpt_unfused", .modules = {unfused}});
    for (int i = 0; i < 4; ++i) {
      INFO("step " << i);
      auto [x, t] = testing::sequence_tokens(3, 16, static_cast<uint64_t>(i));
      const Tensor le = step(*eager, opt_e, x, t);
      Tensor lf, lu;
      {
        const StaticFusion fuse(true);
        lf = f(x, t);
      }
      {
        const StaticFusion off(false);
        lu = u(x, t);
      }
      CHECK(bit_diff(le, lf) == "");
      CHECK(bit_diff(le, lu) == "");
      testing::check_same_parameters(*eager, *fused, "after the fused step");
    }
    REQUIRE(f.stats().traces == 1);
    CHECK(f.stats().verifications >= 1);
    const EntryReport a = f.stats().cache[0], b = u.stats().cache[0];
    const std::string text = f.schedule_text();
    INFO(text);
    UNSCOPED_INFO("TinyGpt step: forward steps " << b.forward_steps << " -> " << a.forward_steps);
    // Two blocks: each block's second norm after its attention's residual add, the second
    // block's first norm and the final norm after an MLP's residual add, the first block's
    // first norm after the position embedding's add (a tile [T, C] over [B, T, C]).
    CHECK(count_of(text, kFusedNorm) == 5);
    CHECK(count_of(text, R"(= add\(in \d+, in \d+ \(a tile of \d+\)\))") == 1);
    // Each block's attention: scale, causal mask and softmax, and their gradients.
    CHECK(count_of(text, R"(= where\(in \d+ \(a tile of 256\))") == 4);
    CHECK(a.forward_steps < b.forward_steps);
  }
}
