// Fused elementwise runs of CUDA plans: each run is one kernel NVRTC compiled from the program,
// calling the unfused kernels' element functions, so a replay gives eager's bits (forward and
// gradients) for every fusable op, in float32 and float64, with operands broadcast as one element,
// one row and one value per row, with CUDA graphs on and off; verify mode compares each fused
// output with the eager step it stands for.
#include <catch2/catch.hpp>

#include <array>
#include <limits>
#include <string>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/fused.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/fusion_patterns.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;

namespace {

// For float32 and float64 over one element, one block and many blocks (rows of 48 for the row
// and column broadcasts): check(body, fresh), body every fusable op then a row and a column
// broadcast, fresh() new arguments on cuda:0.
template <typename Check>
void for_each_case(Check&& check) {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const Shape& shape : {Shape{1, 1}, Shape{7, 48}, Shape{4096, 48}}) {
      INFO(name(dtype) << " over " << shape.str());
      manual_seed(static_cast<uint64_t>(shape.numel()));
      const Tensor c = rand({1}, dtype, kCuda, 0.5, 1.5);
      const Tensor row = rand({shape[1]}, dtype, kCuda, -1, 1);
      const Tensor column = rand({shape[0], 1}, dtype, kCuda, -1, 1);
      auto body = [&](const Tensor& x, const Tensor& w) {
        return F::relu(every_fusable_op(x, w, c) * row - column);
      };
      auto fresh = [&] {
        return Args<2>{rand(shape, dtype, kCuda, -2, 2), rand(shape, dtype, kCuda, 0.5, 1.5)};
      };
      check(body, fresh);
    }
  }
}

// Replays of `fn` (traced with fusion on or off) against eager's bits, forward and gradients.
template <typename Body, typename Fresh, typename Fn>
void check_replays(Body& body, Fresh& fresh, Fn& fn, bool fuse) {
  for (int call = 0; call < 3; ++call) {  // trace, then replays on fresh values
    const Args<2> args = fresh();
    const auto want = run_once<2>(body, args);
    const StaticFusion setting(fuse);  // read when the first call traces
    const auto got = run_once<2>(fn, args);
    CHECK(bit_diff(got.first, want.first) == "");
    for (size_t i = 0; i < 2; ++i) CHECK(bit_diff(got.second[i], want.second[i]) == "");
  }
}

// Attention's scale, causal mask and softmax over scores s [B, H, T, T] with a position tile
// [T, T] added: a [T, T] tile of the scores.
Tensor masked_softmax(const Tensor& s, const Tensor& pos) {
  const int64_t t = s.shape()[3];
  const Tensor scaled = F::mul(F::add(s, pos), 0.125);
  return F::softmax(
      F::masked_fill(scaled, causal_mask(t, s), -std::numeric_limits<double>::infinity()), -1);
}

// check(fresh, dtype, t) for float32 and float64 and T of 8 and 64, fresh() new scores
// [2, 3, T, T] and a position tile for masked_softmax.
template <typename Check>
void for_each_scores(Check&& check) {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (int64_t t : {int64_t{8}, int64_t{64}}) {
      INFO(name(dtype) << ", T " << t);
      manual_seed(static_cast<uint64_t>(t));
      auto fresh = [&] {
        return Args<2>{rand({2, 3, t, t}, dtype, kCuda, -2, 2), rand({t, t}, dtype, kCuda, -1, 1)};
      };
      check(fresh, dtype, t);
    }
  }
}

// 2 layer_norm(x + y) over rows of `cols`, with its own gamma and beta.
struct AddNorm {
  Tensor gamma, beta;
  AddNorm(int64_t cols, DType dtype)
      : gamma(rand({cols}, dtype, kCuda, 0.5, 1.5)), beta(rand({cols}, dtype, kCuda, -1, 1)) {}
  Tensor operator()(const Tensor& x, const Tensor& y) const {
    return F::mul(F::layer_norm(F::add(x, y), {gamma.shape()[0]}, gamma, beta), 2.0);
  }
};

// The row lengths of the row-op cases: within a warp's row and past it (kMaxCudaRow).
constexpr int64_t kRowLengths[] = {16, 100, 512, 1024, 1500};

}  // namespace

TEST_CASE("fused runs on cuda are compiled kernels that replay eager's bits for every fusable op",
          "[cuda][static][fusion]") {
  with_graphs_on_and_off([](bool) {
    StaticEnabled on;
    for_each_case([](auto& body, auto& fresh) {
      auto fused = static_graph(body, {.name = "fused"});
      auto unfused = static_graph(body, {.name = "unfused"});
      check_replays(body, fresh, fused, true);
      check_replays(body, fresh, unfused, false);
      REQUIRE(fused.stats().traces == 1);
      const std::string text = fused.schedule_text();
      INFO(text);
      CHECK_THAT(text, !Catch::Contains("left unfused"));
      // Both phases, each fused step a compiled kernel.
      CHECK(count_of(text, R"(fused_elementwise\s+\[fuses \d+ steps into one compiled kernel)") >=
            2);
      CHECK(count_of(text, R"(fused_elementwise\s+\[fuses \d+ steps, )") == 0);
      CHECK_THAT(unfused.schedule_text(), !Catch::Contains("fused_elementwise"));
      const EntryReport a = fused.stats().cache[0], b = unfused.stats().cache[0];
      CHECK(a.forward_steps + a.backward_steps < b.forward_steps + b.backward_steps);
    });
  });
}

// Verify mode replays on the stream (no graph), comparing every fused output with the recorded
// step it stands for.
TEST_CASE("verify mode checks each fused cuda output against the eager step it stands for",
          "[cuda][static][fusion]") {
  StaticEnabled on;
  for_each_case([](auto& body, auto& fresh) {
    auto verified = static_graph(body, {.name = "verified", .verify_every = 1});
    check_replays(body, fresh, verified, true);
    CHECK(verified.stats().verifications >= 2);
    CHECK_THAT(verified.schedule_text(), Catch::Contains("into one compiled kernel"));
  });
}

// where with its bool condition, and operands tiled over leading axes: attention's scale and
// causal mask (a [T, T] tile of the [B, H, T, T] scores) are one kernel, their gradients another;
// a position embedding [T, C] added to [B, T, C]; a condition of the run's shape choosing a value
// of the run and one per row.
TEST_CASE("where and tiled operands fuse into compiled kernels on cuda", "[cuda][static][fusion]") {
  with_graphs_on_and_off([](bool) {
    StaticEnabled on;
    for_each_scores([](auto& fresh, DType dtype, int64_t t) {
      auto fused = static_graph(masked_softmax, {.name = "masked"});
      check_replays(masked_softmax, fresh, fused, true);
      const std::string text = fused.schedule_text();
      INFO(text);
      CHECK_THAT(text, !Catch::Contains("left unfused"));
      CHECK(count_of(text, cat(R"(= where\(in \d+ \(a tile of )", t * t, R"(\), in \d+, )")) == 2);
      CHECK(count_of(text, cat(R"(= add\(in \d+, in \d+ \(a tile of )", t * t, R"(\)\))")) == 1);
      CHECK(count_of(text, R"(fused_elementwise\s+\[fuses \d+ steps into one compiled kernel)") >=
            2);

      auto choose = [](const Tensor& x, const Tensor& c) {
        const Tensor cond = F::greater(x, F::mul(x, 0.5));
        const Tensor y = F::mul(x, 3.0);
        return F::tanh(F::where(cond, y, c));
      };
      auto values = [&] {
        return Args<2>{rand({t, 48}, dtype, kCuda, -2, 2), rand({t, 1}, dtype, kCuda, -1, 1)};
      };
      auto g = static_graph(choose, {.name = "choose"});
      check_replays(choose, values, g, true);
      INFO(g.schedule_text());
      CHECK(count_of(g.schedule_text(),
                     R"(= where\(in \d+, scratch \d+, in \d+ \(one per row\)\))") == 1);
    });
  });
}

// Row ops in fused runs of CUDA plans: softmax, log_softmax, their gradients and layer_norm over
// rows of up to 1,024 elements, sum, mean and max over rows of up to 512, join their neighbours in
// one kernel that runs a warp per row, as their unfused kernels do, so the bits are the unfused
// steps' (forward, gradients, layer_norm's mean and rstd, which its gradient reads); longer rows
// keep the row op apart.
TEST_CASE("row ops join fused runs on cuda, a warp per row", "[cuda][static][fusion]") {
  with_graphs_on_and_off([](bool) {
    StaticEnabled on;
    for (DType dtype : {DType::Float32, DType::Float64}) {
      for (const int64_t c : kRowLengths) {
        INFO(name(dtype) << ", rows of " << c);
        manual_seed(static_cast<uint64_t>(c));
        const AddNorm norm(c, dtype);
        auto softmaxes = [](const Tensor& x, const Tensor& t) {
          return F::mul(F::softmax(F::mul(x, 0.125), -1), F::log_softmax(F::add(x, t), -1));
        };
        // x centred by its row mean, scaled by 2 max(w) over 1 + its row's mean square: the
        // reductions and what reads x and w in one run, the division over [6, 1] apart.
        auto reductions = [](const Tensor& x, const Tensor& w) {
          const Tensor centred = F::sub(x, F::mean(x, {-1}, true));
          const Tensor square = F::mean(F::mul(centred, centred), {-1}, true);
          const Tensor top = F::max(F::mul(w, 2.0), {-1}, true);
          const Tensor scale = F::div(top, F::add(square, 1.0));
          return F::mul(centred, scale);
        };
        auto fresh = [&] {
          return Args<2>{rand({6, c}, dtype, kCuda, -2, 2), rand({6, c}, dtype, kCuda, -2, 2)};
        };
        auto r = static_graph(reductions, {.name = "reductions"});
        check_replays(reductions, fresh, r, true);
        const std::string reduced = r.schedule_text();
        INFO(reduced);
        CHECK(count_of(reduced, R"(= mean\()") == (c <= kMaxCudaReduceRow ? 2 : 0));
        CHECK(count_of(reduced, R"(= max\()") == (c <= kMaxCudaReduceRow ? 1 : 0));
        auto f = static_graph(softmaxes, {.name = "softmaxes"});
        auto g = static_graph(norm, {.name = "norm"});
        check_replays(softmaxes, fresh, f, true);
        check_replays(norm, fresh, g, true);
        const std::string text = f.schedule_text() + g.schedule_text();
        INFO(text);
        CHECK_THAT(text, !Catch::Contains("left unfused"));
        const bool fits = c <= kMaxCudaRow;
        CHECK((count_of(text, R"(= softmax\()") == 1) == fits);
        CHECK((count_of(text, R"(= log_softmax_grad\()") == 1) == fits);
        CHECK((count_of(text, R"(= layer_norm\(out 0, gamma in \d+ \(one row\))") == 1) == fits);
        CHECK(f.stats().cache[0].forward_steps == (fits ? 1 : 5));
      }
    }
  });
}

// Verify mode, which replays on the stream (apart from the graphs' check above), over runs that
// hold where and a tiled operand, and layer_norm as a row op.
TEST_CASE("verify mode checks fused cuda runs holding where, tiled operands and row ops",
          "[cuda][static][fusion]") {
  StaticEnabled on;
  for_each_scores([](auto& fresh, DType, int64_t) {
    auto verified = static_graph(masked_softmax, {.name = "masked_verified", .verify_every = 1});
    check_replays(masked_softmax, fresh, verified, true);
    CHECK(verified.stats().verifications >= 2);
  });
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const int64_t c : kRowLengths) {
      INFO(name(dtype) << ", rows of " << c);
      manual_seed(static_cast<uint64_t>(c));
      const AddNorm norm(c, dtype);
      auto fresh = [&] {
        return Args<2>{rand({6, c}, dtype, kCuda, -2, 2), rand({6, c}, dtype, kCuda, -2, 2)};
      };
      auto verified = static_graph(norm, {.name = "norm_verified", .verify_every = 1});
      check_replays(norm, fresh, verified, true);
      CHECK(verified.stats().verifications >= 2);
    }
  }
}
