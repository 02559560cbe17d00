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
  const std::vector<int64_t> sizes = {32, 17, 2, 64, 17, 100, 33, 7, 32, 128};
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

// Size 1 may take other ops (a broadcast needs none): a family traced at other sizes traces it
// once more, then serves it.
TEST_CASE("dynamic: a batch of 1 is traced once, then served", "[static][dynamic]") {
  const std::vector<int64_t> sizes = {32, 17, 1, 5, 1, 9};
  const StaticStats st = train_both(
      [] {
        manual_seed(3);
        return nn::mlp(20, 16, 10);
      },
      static_cast<int>(sizes.size()),
      [&](int k) { return classification_batch(sizes[k], 20, static_cast<uint64_t>(k)); },
      {.name = "mlp_step", .arg_names = {"x", "t"}});
  CHECK(st.traces == 3);
  CHECK(st.dynamic_events == 2);  // from traces 1 and 2, then with trace 3 at size 1
  CHECK(st.sizes_planned == 2);   // 5 and 9; the second 1 replays trace 3
  REQUIRE(st.dynamic.size() == 1);
  CHECK(st.dynamic[0].traces == std::vector<int64_t>{1, 2, 3});
}

// The models of encore/models.h with a varying batch (20 random sizes): one dynamic family from
// the first two traces, every other size planned without tracing.
TEST_CASE("dynamic: SeedCnn with 20 random batch sizes", "[static][dynamic]") {
  const std::vector<int64_t> sizes = random_sizes(20, 2, 24, 11);
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
  const std::vector<int64_t> batch = random_sizes(20, 2, 4, 21), h = random_sizes(20, 8, 20, 22),
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
  // Two traces, and one more wherever the traces so far did not tell two sizes apart (a pooled
  // size equal at both).
  CHECK(st.traces <= 4);
  CHECK(st.dynamic_events >= 1);
  CHECK(st.static_dims.empty());
  REQUIRE(!st.dynamic.empty());
  CHECK(st.dynamic[0].signature.find("float32[s0,3,s1,s2]") != std::string::npos);
}

TEST_CASE("dynamic: CharLstm and TinyGpt with 20 random batch sizes", "[static][dynamic]") {
  const std::vector<int64_t> sizes = random_sizes(20, 2, 7, 31);
  auto tokens = [&](int k) { return sequence_tokens(sizes[k], 5, static_cast<uint64_t>(k)); };
  SECTION("CharLstm") {
    const StaticStats st =
        train_both([] { return seeded_on<models::CharLstm>(Device::cpu(), kSequenceVocab, 8, 12); },
                   20, tokens);
    CHECK(st.traces == 2);
    CHECK(st.sizes_planned == distinct(sizes) - 2);
    CHECK(st.static_dims.empty());
  }
  SECTION("TinyGpt") {
    const StaticStats st = train_both(
        [] { return seeded_on<models::TinyGpt>(Device::cpu(), kSequenceVocab, 8, 16, 2, 1); }, 20,
        tokens);
    CHECK(st.traces == 2);
    CHECK(st.sizes_planned == distinct(sizes) - 2);
    CHECK(st.static_dims.empty());
  }
}

// ---- Code that depends on a size through the host ---------------------------------------------

// Calls `body` statically and eagerly at each size of x [n, 4]: equal results every time.
template <typename Body>
StaticStats check_planted(Body body, std::initializer_list<int64_t> sizes) {
  StaticEnabled on;
  LogCapture log;
  auto fn = static_graph(body, {.name = "planted", .arg_names = {"x"}});
  NoGradGuard no_grad;
  for (int64_t n : sizes) {
    manual_seed(static_cast<uint64_t>(n));
    const Tensor x = randn({n, 4});
    INFO("x " << x.shape().str());
    CHECK(bit_diff(fn(x), body(x)) == "");
  }
  return fn.stats();
}

TEST_CASE("dynamic: code that branches on a size keeps it static, naming the step",
          "[static][dynamic]") {
  const StaticStats st =
      check_planted([](const Tensor& x) { return x.size(0) % 2 == 0 ? F::relu(x) : F::tanh(x); },
                    {4, 5, 6, 7, 4});
  CHECK(st.traces == 4);  // every size its own signature
  CHECK(st.dynamic.empty());
  REQUIRE(st.static_dims.size() == 1);
  // 4 and 5 differ, 6 differs from 5 (the larger, which a size of 1 made from it would not be).
  CHECK(st.static_dims[0] ==
        "argument 0 'x' dim 0 stays static: step 0 (forward) is tanh at one traced size and relu "
        "at another (traces 2 and 3)");
}

TEST_CASE("dynamic: a scalar computed from a size the trace cannot follow keeps it static",
          "[static][dynamic]") {
  const StaticStats st = check_planted(
      [](const Tensor& x) { return x * static_cast<double>(x.size(0) * x.size(0)); }, {4, 5, 6, 4});
  CHECK(st.traces == 3);
  CHECK(st.dynamic.empty());
  REQUIRE(st.static_dims.size() == 1);
  CHECK_THAT(st.static_dims[0], Catch::Contains("step 0 (forward) mul_scalar: its scalar is 16, "
                                                "25 at the traced sizes"));
}

TEST_CASE("dynamic: a shape computed from a size the trace cannot follow keeps it static",
          "[static][dynamic]") {
  // [n, 4] as [2, 2n]: 2n is no size of the trace.
  const StaticStats st = check_planted(
      [](const Tensor& x) {
        return F::relu(F::reshape(x, {2, -1}));
      },
      {4, 6, 8});
  CHECK(st.traces == 3);
  CHECK(st.dynamic.empty());
  REQUIRE(st.static_dims.size() == 1);
  CHECK_THAT(st.static_dims[0], Catch::Contains("step 0 (forward) relu: input 0 dim 1 is 8, 12"));
}

TEST_CASE("dynamic: a size the trace can follow is dynamic (1 / n, reshape(x, {n, -1}))",
          "[static][dynamic]") {
  const StaticStats st = check_planted(
      [](const Tensor& x) {
        const Tensor y = F::reshape(x, {x.size(0), 2, -1}) * (1.0 / static_cast<double>(x.size(0)));
        return F::sum(y, {1});
      },
      {4, 6, 8, 3, 11});
  CHECK(st.traces == 2);
  CHECK(st.sizes_planned == 3);
  CHECK(st.static_dims.empty());
}

TEST_CASE("dynamic: a dimension that cannot be dynamic does not keep one beside it static",
          "[static][dynamic]") {
  StaticEnabled on;
  NoGradGuard no_grad;
  // The position term is a constant filled on the host from the length: the length cannot be
  // dynamic, the batch can. The first two traces differ in both.
  auto body = [](const Tensor& x) {
    const int64_t t = x.size(1);
    std::vector<double> positions(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) positions[static_cast<size_t>(i)] = static_cast<double>(i) / t;
    return x + tensor(positions, {1, t});
  };
  std::vector<std::string> lines;
  const LogSink old = set_log_sink([&lines](const std::string& l) { lines.push_back(l); });
  auto f = static_graph(body, {.name = "positions"});
  for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{
           {2, 5}, {3, 7}, {4, 5}, {6, 5}, {8, 5}, {9, 5}, {5, 7}, {7, 7}}) {
    CAPTURE(b, t);
    const Tensor x = rand({b, t});
    CHECK(bit_diff(f(x), body(x)) == "");
  }
  set_log_sink(old);
  const StaticStats s = f.stats();
  INFO(joined(lines));
  // [2,5], [3,7], then [4,5] against [2,5] (the batch alone), and [5,7] against [3,7].
  CHECK(s.traces == 4);
  CHECK(s.sizes_planned == 4);
  CHECK(s.dynamic_events == 2);
  CHECK(s.static_dims.empty());
  CHECK(any_contains(lines, "argument 0 dims 0 and 1 cannot all be dynamic"));
}

TEST_CASE("dynamic: a size two traces cannot tell apart is guarded, not guessed",
          "[static][dynamic]") {
  // [2, 2, h, h] pooled to h / 2 plus a literal [1, 1, 4, 4]: valid at h = 8 and 9 only. Both
  // traces see 4; the family takes the literal's 4 and guards it against the pooled size, so at
  // h = 10 the call traces (and the function fails as it does eagerly) instead of replaying.
  StaticEnabled on;
  NoGradGuard no_grad;
  auto body = [](const Tensor& x) { return F::max_pool2d(x, 2) + zeros({1, 1, 4, 4}); };
  auto fn = static_graph(body, {.name = "guarded", .arg_names = {"x"}});
  for (int64_t h : {8, 9, 9, 8}) {
    const Tensor x = randn({2, 2, h, h});
    CHECK(bit_diff(fn(x), body(x)) == "");
  }
  StaticStats st = fn.stats();
  CHECK(st.traces == 2);
  REQUIRE(st.dynamic.size() == 1);
  const std::string eager_error = error_of([&] { body(randn({2, 2, 10, 10})); });
  REQUIRE(!eager_error.empty());
  CHECK(error_of([&] { fn(randn({2, 2, 10, 10})); }) == eager_error);
  st = fn.stats();
  CHECK(st.traces == 3);  // traced, not planned
  CHECK(st.sizes_planned == 0);
  const Tensor x9 = randn({2, 2, 9, 9});
  CHECK(bit_diff(fn(x9), body(x9)) == "");
  CHECK(fn.stats().traces == 3);
}

// ---- Policies, eviction, statistics ------------------------------------------------------------

Tensor scaled_softmax(const Tensor& x) {
  return F::softmax(x * 0.5, -1);
}

TEST_CASE("dynamic: explicit dimensions, off, and the process-wide switch", "[static][dynamic]") {
  StaticEnabled on;
  NoGradGuard no_grad;
  auto calls = [](auto& fn, std::initializer_list<Shape> shapes) {
    for (const Shape& s : shapes) {
      const Tensor x = randn(s);
      CHECK(bit_diff(fn(x), scaled_softmax(x)) == "");
    }
    return fn.stats();
  };
  SECTION("explicit: the named dimension becomes dynamic, no other") {
    auto fn = static_graph(
        scaled_softmax,
        {.name = "explicit", .dynamic = DynamicShapes::Explicit, .dynamic_dims = {{0, 0}}});
    StaticStats st = calls(fn, {{3, 5}, {4, 5}, {6, 5}, {7, 5}});
    CHECK(st.traces == 2);
    CHECK(st.sizes_planned == 2);
    st = calls(fn, {{3, 6}, {3, 7}, {3, 8}});  // dim 1 is not named: each size traces
    CHECK(st.traces == 5);
    CHECK(st.dynamic_events == 1);
  }
  SECTION("off: every size traces") {
    auto fn = static_graph(scaled_softmax, {.name = "off", .dynamic = DynamicShapes::Off});
    const StaticStats st = calls(fn, {{3, 5}, {4, 5}, {6, 5}, {7, 5}});
    CHECK(st.traces == 4);
    CHECK(st.dynamic_events == 0);
  }
  SECTION("set_static_dynamic_enabled(false): every size traces") {
    SwitchScope<set_static_dynamic_enabled> off(false);
    auto fn = static_graph(scaled_softmax, {.name = "switched_off"});
    const StaticStats st = calls(fn, {{3, 5}, {4, 5}, {6, 5}});
    CHECK(st.traces == 3);
    CHECK(st.dynamic.empty());
  }
  SECTION("bad options name the function and the dimension") {
    CHECK_THAT(error_of([] {
                 static_graph(scaled_softmax, {.name = "f", .dynamic_dims = {{0, 0}}});
               }),
               Catch::Contains("f: dynamic_dims names 1 dimension; they need dynamic = "
                               "DynamicShapes::Explicit"));
    auto fn =
        static_graph(scaled_softmax,
                     {.name = "g", .dynamic = DynamicShapes::Explicit, .dynamic_dims = {{0, 2}}});
    CHECK_THAT(error_of([&] {
                 fn(randn({3, 5}));
               }),
               Catch::Contains("g: dynamic_dims names dim 2 of argument 0, which the call does "
                               "not have (1 argument, that one [3,5])"));
    CHECK_THAT(error_of([] { static_graph(scaled_softmax, {.name = ""}); }),
               Catch::Contains("static_graph: name must not be empty"));
    auto named = static_graph(scaled_softmax, {.name = "h", .arg_names = {"x", "y"}});
    CHECK_THAT(error_of([&] {
                 named(randn({3, 5}));
               }),
               Catch::Contains("h: arg_names has 2 names, but the call has 1 argument"));
  }
}

TEST_CASE("dynamic: planned sizes are evicted beyond size_limit and planned again",
          "[static][dynamic]") {
  const std::vector<int64_t> sizes = {10, 11, 3, 4, 5, 3, 4, 5, 10};
  const StaticStats st = train_both(
      [] {
        manual_seed(4);
        return nn::mlp(12, 8, 10);
      },
      static_cast<int>(sizes.size()),
      [&](int k) { return classification_batch(sizes[k], 12, static_cast<uint64_t>(k)); },
      {.name = "evicting", .size_limit = 2});
  CHECK(st.traces == 2);
  CHECK(st.sizes_planned == 6);  // 3, 4, 5 twice: each evicted before its next call
  REQUIRE(st.dynamic.size() == 1);
  CHECK(st.dynamic[0].evictions == 4);
  // Once, when as many sizes went as the family keeps.
  REQUIRE(st.warnings.size() == 1);
  CHECK_THAT(st.warnings[0],
             Catch::Matchers::StartsWith("evicting: dynamic family 2 has evicted 2 planned sizes "
                                         "(size_limit 2); a size that recurs after it went is "
                                         "planned again"));
  REQUIRE(st.dynamic[0].sizes.size() == 2);
  CHECK(st.dynamic[0].sizes[0].signature == "s0=5");
  CHECK(st.dynamic[0].sizes[1].signature == "s0=4");
  for (const EntryReport& r : st.dynamic[0].sizes) {
    CHECK(r.complete);
    CHECK(r.arena_bytes >= r.lower_bound_bytes);
    CHECK(r.lower_bound_bytes > 0);
    CHECK(r.arenas == 1);
  }
  // The arena of a larger batch is larger.
  CHECK(st.dynamic[0].sizes[0].arena_bytes > st.dynamic[0].sizes[1].arena_bytes);
}

TEST_CASE("dynamic: replays at planned sizes reach a steady state", "[static][dynamic][memory]") {
  StaticEnabled on;
  Allocator& alloc = allocator_for(Device::cpu());
  manual_seed(9);
  auto model = nn::mlp(30, 16, 10);
  optim::Adam opt(model->parameters());
  auto step = static_graph(
      [&](const Tensor& x, const Tensor& t) {
        opt.zero_grad();
        Tensor loss = F::cross_entropy((*model)(x), t);
        loss.backward();
        opt.step();
        return loss;
      },
      {.name = "steady_dynamic", .modules = {model}});
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int64_t n : {8, 9, 3, 12}) batches.push_back(classification_batch(n, 30, 1));
  for (int round = 0; round < 3; ++round)  // trace twice, plan 3 and 12, warm the caches
    for (const auto& [x, t] : batches) step(x, t);
  const AllocatorStats s0 = alloc.stats();
  for (int round = 0; round < 10; ++round)
    for (const auto& [x, t] : batches) step(x, t);
  const AllocatorStats s1 = alloc.stats();
  const StaticStats st = step.stats();
  CHECK(st.traces == 2);
  CHECK(st.sizes_planned == 2);
  CHECK(st.hits == 13 * 4 - 2);  // every call but the two traces (a planned size replays)
  CHECK(s1.system_allocations == s0.system_allocations);
  CHECK(s1.bytes_in_use == s0.bytes_in_use);
}

TEST_CASE("dynamic: verify mode checks replays at planned sizes against eager",
          "[static][dynamic]") {
  const std::vector<int64_t> sizes = {8, 9, 3, 12, 3};
  const StaticStats st = train_both(
      [] {
        manual_seed(6);
        return std::make_shared<models::SeedCnn>(2);
      },
      static_cast<int>(sizes.size()),
      [&](int k) { return classification_batch(sizes[k], 784, static_cast<uint64_t>(k)); },
      {.name = "verified", .verify_every = 1});
  CHECK(st.traces == 2);
  CHECK(st.sizes_planned == 2);
  CHECK(st.verifications == 3);
}

TEST_CASE("dynamic: verify mode's cadence counts the family's replays, whatever their sizes",
          "[static][dynamic]") {
  StaticEnabled on;
  auto body = [](const Tensor& x) { return F::tanh(x) * 2.0; };
  auto f = static_graph(body, {.name = "cadence", .verify_every = 2});
  // Two traces, then eight sizes each seen once: every second replay is verified.
  for (int64_t n : {2, 3, 4, 5, 6, 7, 8, 9, 10, 11}) {
    const Tensor x = rand({n, 3});
    CHECK(bit_diff(f(x), body(x)) == "");
  }
  const StaticStats s = f.stats();
  CHECK(s.traces == 2);
  CHECK(s.hits == 8);
  CHECK(s.verifications == 4);
}

TEST_CASE("dynamic: an op whose inputs broadcast is not planned where another input is larger",
          "[static][dynamic]") {
  StaticEnabled on;
  NoGradGuard no_grad;
  // At every trace x's rows are at least y's, so the results' rows were x's; then y's are more.
  const std::vector<std::pair<int64_t, int64_t>> rows = {{3, 3}, {5, 5}, {1, 1}, {6, 1}, {1, 6}};
  auto check = [&rows](const char* name, auto body, int64_t inner_x, int64_t inner_y) {
    INFO(name);
    auto f = static_graph(body, {.name = name});
    for (auto [a, b] : rows) {
      CAPTURE(a, b);
      const Tensor x = rand({a, 2, inner_x}), y = rand({b, inner_y, 2});
      CHECK(bit_diff(f(x, y), body(x, y)) == "");
    }
    CHECK(f.stats().traces == 5);
  };
  check(
      "greater", [](const Tensor& x, const Tensor& y) { return F::greater(x, y); }, 2, 2);
  check(
      "equal", [](const Tensor& x, const Tensor& y) { return F::equal(x, y * 0.0); }, 2, 2);
  check(
      "where",
      [](const Tensor& x, const Tensor& y) { return F::where(F::greater(y, y * 0.5), x, y); }, 2,
      2);
  check(
      "batched matmul", [](const Tensor& x, const Tensor& y) { return F::matmul(x, y); }, 3, 3);
}

TEST_CASE("dynamic: operands whose sizes agreed only at the traces are not planned apart",
          "[static][dynamic]") {
  StaticEnabled on;
  NoGradGuard no_grad;
  const LogSink old = set_log_sink([](const std::string&) {});
  // Logits of 2 B rows against N labels: N = 2 B at both traces, yet two symbols.
  auto loss = [](const Tensor& z, const Tensor& y) {
    return F::softmax_cross_entropy(F::reshape(z, {-1, 3}), y);
  };
  auto f = static_graph(loss, {.name = "flattened_labels"});
  auto labels = [](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>(i % 3);
    return tensor(v, {n}, DType::Int32);
  };
  for (int64_t b : {4, 8}) {
    const Tensor z = rand({b, 6}), y = labels(2 * b);
    CHECK(bit_diff(f(z, y), loss(z, y)) == "");
  }
  for (int64_t n : {12, 8}) {
    CAPTURE(n);  // 10 rows: eager refuses both
    const Tensor z = rand({5, 6}), y = labels(n);
    const std::string eager = error_of([&] { loss(z, y); });
    REQUIRE_FALSE(eager.empty());
    CHECK(error_of([&] { f(z, y); }) == eager);
  }
  // Two branches of one image, pooled and convolved, agree in size at even sizes only.
  const Tensor w = full({1, 1, 3, 3}, 0.1);
  auto branches = [&w](const Tensor& x) {
    return F::concat({F::max_pool2d(x, 2), F::conv2d(x, w, Tensor(), 2, 1)}, 1);
  };
  auto g = static_graph(branches, {.name = "two_branches"});
  for (int64_t h : {32, 64}) {
    const Tensor x = rand({1, 1, h, h});
    CHECK(bit_diff(g(x), branches(x)) == "");
  }
  const Tensor odd = rand({1, 1, 33, 33});
  const std::string eager = error_of([&] { branches(odd); });
  REQUIRE_FALSE(eager.empty());
  CHECK(error_of([&] { g(odd); }) == eager);
  set_log_sink(old);
}

// Traces `fn` at each of `traced` (replays equal eager), then checks that at `bad` the static
// call raises eager's Error: sizes that only agreed at the traces are not planned apart.
template <size_t N, typename Fn>
void refused_as_eagerly(const char* name, Fn fn, const std::vector<std::array<Tensor, N>>& traced,
                        const std::array<Tensor, N>& bad) {
  INFO(name);
  auto f = static_graph(fn, {.name = name});
  for (const auto& a : traced) CHECK(bit_diff(std::apply(f, a), std::apply(fn, a)) == "");
  const std::string eager = error_of([&] { std::apply(fn, bad); });
  REQUIRE_FALSE(eager.empty());
  CHECK(error_of([&] { std::apply(f, bad); }) == eager);
}

TEST_CASE("dynamic: sizes an op needs equal are not planned apart", "[static][dynamic]") {
  StaticEnabled on;
  NoGradGuard no_grad;
  const LogSink old = set_log_sink([](const std::string&) {});
  auto r = [](Shape s) { return randn(s, DType::Float64); };
  using T3 = std::array<Tensor, 3>;
  using T4 = std::array<Tensor, 4>;
  refused_as_eagerly<3>(
      "conv_channels",
      [](const Tensor& a, const Tensor& b, const Tensor& w) {
        return F::conv2d(F::concat({a, b}, 1), w);
      },
      {T3{r({1, 2, 5, 5}), r({1, 2, 5, 5}), r({3, 4, 3, 3})},
       T3{r({1, 3, 5, 5}), r({1, 2, 5, 5}), r({3, 5, 3, 3})}},
      T3{r({1, 4, 5, 5}), r({1, 2, 5, 5}), r({3, 7, 3, 3})});
  refused_as_eagerly<3>(
      "grouped_conv_channels",
      [](const Tensor& a, const Tensor& b, const Tensor& w) {
        return F::conv2d(F::concat({a, b}, 1), w, Tensor(), 1, 0, 1, 2);
      },
      {T3{r({1, 2, 5, 5}), r({1, 2, 5, 5}), r({2, 2, 3, 3})},
       T3{r({1, 4, 5, 5}), r({1, 2, 5, 5}), r({2, 3, 3, 3})}},
      T3{r({1, 2, 5, 5}), r({1, 2, 5, 5}), r({2, 5, 3, 3})});
  refused_as_eagerly<1>(
      "empty_pool_input",
      [](const Tensor& x) { return F::max_pool2d(F::slice(x, 2, 8, x.size(2)), 2, 2, 1); },
      {std::array<Tensor, 1>{r({1, 1, 12, 12})}, std::array<Tensor, 1>{r({1, 1, 14, 12})}},
      std::array<Tensor, 1>{r({1, 1, 8, 12})});
  refused_as_eagerly<3>(
      "linear_bias",
      [](const Tensor& x, const Tensor& w, const Tensor& b) {
        return F::linear(x, w, F::concat({b, b}, 0));
      },
      {T3{r({2, 3}), r({4, 3}), r({2})}, T3{r({2, 3}), r({6, 3}), r({3})}},
      T3{r({2, 3}), r({9, 3}), r({4})});
  refused_as_eagerly<1>(
      "kernel_larger", [](const Tensor& x) { return F::max_pool2d(x, 3, Size2(1)); },
      {std::array<Tensor, 1>{r({1, 1, 5, 5})}, std::array<Tensor, 1>{r({1, 1, 6, 6})}},
      std::array<Tensor, 1>{r({1, 1, 2, 2})});
  refused_as_eagerly<2>(
      "batch_norm_gamma",
      [](const Tensor& x, const Tensor& g) {
        const Tensor gg = F::concat({g, g}, 0);
        return F::batch_norm(x, Tensor(), Tensor(), gg, gg, true, 0.1, 1e-5);
      },
      {std::array<Tensor, 2>{r({3, 4, 2, 2}), r({2})},
       std::array<Tensor, 2>{r({3, 6, 2, 2}), r({3})}},
      std::array<Tensor, 2>{r({3, 8, 2, 2}), r({5})});
  refused_as_eagerly<4>(
      "mse_shapes",
      [](const Tensor& x1, const Tensor& x2, const Tensor& u, const Tensor& v) {
        return F::mean_squared_error(F::concat({x1, x2}, 1), F::concat({u, v}, 0));
      },
      {T4{r({5, 4}), r({5, 5}), r({2, 9}), r({3, 9})},
       T4{r({7, 5}), r({7, 6}), r({3, 11}), r({4, 11})}},
      T4{r({4, 2}), r({4, 4}), r({2, 4}), r({4, 4})});
  refused_as_eagerly<4>(
      "layer_norm_gamma",
      [](const Tensor& x1, const Tensor& x2, const Tensor& u, const Tensor& v) {
        const Tensor x = F::concat({x1, x2}, 2), g = F::concat({u, v}, 0);
        return F::layer_norm(x, {x.size(1), x.size(2)}, g, g);
      },
      {T4{r({2, 5, 4}), r({2, 5, 5}), r({2, 9}), r({3, 9})},
       T4{r({2, 7, 5}), r({2, 7, 6}), r({3, 11}), r({4, 11})}},
      T4{r({2, 4, 2}), r({2, 4, 4}), r({2, 4}), r({4, 4})});
  set_log_sink(old);
}

TEST_CASE("dynamic: a static forward (module form) with its backward outside",
          "[static][dynamic]") {
  StaticEnabled on;
  manual_seed(8);
  auto eager = std::make_shared<MlpNet>(6, 8, 3);
  manual_seed(8);
  auto traced = std::make_shared<StaticMlp>(6, 8, 3);
  for (int64_t n : {5, 7, 2, 9, 7, 4}) {
    manual_seed(static_cast<uint64_t>(n));
    const Tensor x = randn({n, 6});
    INFO("batch " << n);
    eager->zero_grad();
    traced->zero_grad();
    const Tensor ye = (*eager)(x), ys = (*traced)(x);
    REQUIRE(bit_diff(ye, ys) == "");
    F::sum(ye * ye).backward();
    F::sum(ys * ys).backward();
    check_same_parameters(*eager, *traced, "after backward");
  }
  const StaticStats st = static_stats(*traced);
  CHECK(st.traces == 2);
  CHECK(st.sizes_planned == 3);
  CHECK(st.hits == 4);
}

TEST_CASE("dynamic: the report, the table and the schedule dump show the family",
          "[static][dynamic]") {
  StaticEnabled on;
  NoGradGuard no_grad;
  auto fn = static_graph(scaled_softmax, {.name = "shown", .arg_names = {"x"}});
  for (int64_t n : {3, 4, 6, 9}) fn(randn({n, 5}));
  const std::string text = fn.schedule_text();
  CHECK_THAT(text, Catch::Contains("dynamic family 2 (traces 1 2): x: float32[s0,5]; grad off"));
  CHECK_THAT(text, Catch::Contains("argument 0 'x' dim 0 = s0"));
  CHECK_THAT(text, Catch::Contains("size s0=9 (1 call): x: float32[9,5]; grad off"));
  CHECK_THAT(text, Catch::Contains("size s0=6 (1 call)"));
  const std::string dot = fn.schedule_dot();
  CHECK_THAT(dot, Catch::Contains("subgraph cluster_d2 {"));
  CHECK_THAT(dot, Catch::Contains("dynamic family 2: x: float32[s0,5]; grad off"));
  CHECK_THAT(dot, Catch::Contains("subgraph cluster_d2_0 {"));
  CHECK_THAT(dot, Catch::Contains("size s0=9"));
  const StaticStats st = fn.stats();
  REQUIRE(st.dynamic_history.size() == 1);
  CHECK_THAT(st.dynamic_history[0], Catch::Contains("shown: argument 0 'x' dim 0 became dynamic"));
  CHECK_THAT(static_graph_report_table(),
             Catch::Contains("dynamic 2: x: float32[s0,5]; grad off; 2 sizes planned"));
}

TEST_CASE("a size where a batch norm inside sees one value per channel traces, with eager's Error",
          "[static][dynamic]") {
  // Pooling halves H and W: at 2x2 images batch norm gets one value per channel, which the
  // routine refuses; a planned size would have normalised it to zeros and moved the statistics.
  StaticEnabled on;
  Tensor rm = zeros({2}), rv = ones({2});
  auto body = [&](const Tensor& x) {
    return F::batch_norm(F::max_pool2d(x, {2, 2}), rm, rv, Tensor(), Tensor(), /*training=*/true);
  };
  auto f = static_graph(body, {.name = "bn_after_pool"});
  NoGradGuard no_grad;
  manual_seed(61);
  for (const int hw : {4, 6, 8}) f(randn({1, 2, hw, hw}));
  CHECK(f.stats().sizes_planned >= 1);
  const Tensor mean = clone(rm), var = clone(rv);
  CHECK_THROWS_WITH(f(randn({1, 2, 2, 2})),
                    Catch::Contains("batch_norm: training needs more than one value per channel"));
  CHECK(bit_diff(rm, mean) == "");
  CHECK(bit_diff(rv, var) == "");
}

}  // namespace
}  // namespace encore::testing
