// Dynamic shapes: a dimension that changes between two traces becomes dynamic, and every later
// size is planned from the trace without running the function; replays at those sizes equal
// eager bit for bit (forward, gradients, parameters). Code that computes something from a size
// that the trace cannot follow keeps the dimension static, with the step and op named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>

#include "encore/encore.h"
#include "encore/models.h"
#include "encore/static_graph.h"
#include "tests/sequence_training.h"
#include "tests/static_models.h"
#include "tests/test_util.h"

namespace encore::testing {
namespace {

// Trains an eager and a static copy of a model (two calls of `make`, from one seed) on the
// batches `batch_of(k)` gives for k = 0, 1, ..., checking the loss, every parameter and gradient
// bit for bit after every step. Returns the static function's statistics.
template <typename Make, typename Batches>
StaticStats train_both(Make make, int steps, Batches batch_of, StaticOptions options = {}) {
  StaticEnabled on;
  auto eager = make();
  auto traced = make();
  optim::Adam opt_e(eager->parameters(), {.lr = 1e-3}), opt_s(traced->parameters(), {.lr = 1e-3});
  auto step = [](nn::Module& m, optim::Optimizer& opt, const Tensor& x, const Tensor& t) {
    opt.zero_grad();
    Tensor loss = F::cross_entropy(m(x), t);
    loss.backward();
    opt.step();
    return loss;
  };
  options.modules = {traced};
  auto fn = static_graph(
      [&](const Tensor& x, const Tensor& t) { return step(*traced, opt_s, x, t); }, options);
  for (int k = 0; k < steps; ++k) {
    auto [x, t] = batch_of(k);
    INFO("step " << k << ", x " << x.shape().str());
    const Tensor le = step(*eager, opt_e, x, t);
    const Tensor ls = fn(x, t);
    REQUIRE(bit_diff(le, ls) == "");
    check_same_parameters(*eager, *traced, "after the step");
  }
  return fn.stats();
}

// Sizes in [lo, hi], `n` of them, from a seed.
std::vector<int64_t> random_sizes(int n, int64_t lo, int64_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> d(lo, hi);
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(d(rng));
  return out;
}

// int32 labels (i * 7) % 10.
Tensor labels_of(int64_t n) {
  Tensor t = Tensor::empty({n}, DType::Int32);
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 7) % 10);
  return t;
}

int64_t distinct(const std::vector<int64_t>& v) {
  return static_cast<int64_t>(std::set<int64_t>(v.begin(), v.end()).size());
}

std::pair<Tensor, Tensor> classification_batch(int64_t batch, int64_t features, uint64_t seed) {
  const auto ds = data::synthetic_classification(batch, features, 10, seed);
  return {ds.images, ds.labels};
}

TEST_CASE("dynamic: the MLP step's batch becomes dynamic after two traces", "[static][dynamic]") {
  const std::vector<int64_t> sizes = {32, 17, 1, 64, 17, 100, 33, 7, 32, 128};
  const StaticStats st = train_both(
      [] {
        manual_seed(3);
        return nn::mlp(784, 100, 10);
      },
      static_cast<int>(sizes.size()),
      [&](int k) { return classification_batch(sizes[k], 784, static_cast<uint64_t>(k)); },
      {.name = "mlp_step", .arg_names = {"x", "t"}});
  CHECK(st.traces == 2);
  CHECK(st.dynamic_events == 1);
  CHECK(st.sizes_planned == distinct(sizes) - 2);
  CHECK(st.static_dims.empty());
  REQUIRE(st.dynamic.size() == 1);
  CHECK(st.dynamic[0].signature.find("x: float32[s0,784], t: int32[s0]") != std::string::npos);
  CHECK(st.dynamic[0].traces == std::vector<int64_t>{1, 2});
  CHECK(st.dynamic[0].sizes.size() == static_cast<size_t>(distinct(sizes) - 2));
  for (const EntryReport& r : st.dynamic[0].sizes) {
    CHECK(r.arena_bytes > 0);
    CHECK(r.arena_bytes >= r.lower_bound_bytes);
  }
}

// The models of encore/models.h with a varying batch (20 random sizes): one dynamic family from
// the first two traces, every other size planned without tracing.
TEST_CASE("dynamic: SeedCnn with 20 random batch sizes", "[static][dynamic]") {
  const std::vector<int64_t> sizes = random_sizes(20, 1, 24, 11);
  const StaticStats st = train_both(
      [] {
        manual_seed(5);
        return std::make_shared<models::SeedCnn>(4);
      },
      20, [&](int k) { return classification_batch(sizes[k], 784, static_cast<uint64_t>(k)); });
  CHECK(st.traces == 2);
  CHECK(st.dynamic_events == 1);
  CHECK(st.sizes_planned == distinct(sizes) - 2);
  CHECK(st.static_dims.empty());
}

TEST_CASE("dynamic: VggSmall with random batch, height and width", "[static][dynamic]") {
  const std::vector<int64_t> batch = random_sizes(20, 1, 4, 21), h = random_sizes(20, 8, 20, 22),
                             w = random_sizes(20, 8, 20, 23);
  const StaticStats st = train_both(
      [] {
        manual_seed(5);
        return std::make_shared<models::VggSmall>(3, std::vector<int64_t>{4, 8}, 10);
      },
      20,
      [&](int k) {
        manual_seed(static_cast<uint64_t>(100 + k));
        return std::pair{randn({batch[k], 3, h[k], w[k]}), labels_of(batch[k])};
      });
  // Each new combination of sizes a trace explains: a dimension that changes joins the family
  // (a pooled size equal at two traces may ask for one more).
  CHECK(st.traces <= 4);
  CHECK(st.dynamic_events >= 1);
  CHECK(st.static_dims.empty());
  REQUIRE(!st.dynamic.empty());
  CHECK(st.dynamic[0].signature.find("float32[s0,3,s1,s2]") != std::string::npos);
}

TEST_CASE("dynamic: CharLstm and TinyGpt with 20 random batch sizes", "[static][dynamic]") {
  const std::vector<int64_t> sizes = random_sizes(20, 1, 6, 31);
  auto tokens = [&](int k) { return sequence_tokens(sizes[k], 5, static_cast<uint64_t>(k)); };
  SECTION("CharLstm") {
    const StaticStats st = train_both(
        [] { return seeded_on<models::CharLstm>(Device::cpu(), kSequenceVocab, 8, 12); }, 20,
        tokens);
    CHECK(st.traces == 2);
    CHECK(st.sizes_planned == distinct(sizes) - 2);
    CHECK(st.static_dims.empty());
  }
  SECTION("TinyGpt") {
    const StaticStats st = train_both(
        [] { return seeded_on<models::TinyGpt>(Device::cpu(), kSequenceVocab, 8, 16, 2, 1); },
        20, tokens);
    CHECK(st.traces == 2);
    CHECK(st.sizes_planned == distinct(sizes) - 2);
    CHECK(st.static_dims.empty());
  }
}

}  // namespace
}  // namespace encore::testing
