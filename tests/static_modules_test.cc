// The watched modules' structure: a layer added to a watched module after its trace (a
// Sequential grown by add()) makes the entries traced before it stale, so the next call traces
// again and says why, in the module form and the function form; a module made elsewhere in the
// process changes nothing for them. A function that reads the train/eval mode of a module it does
// not watch (a Dropout, a BatchNorm2d) warns that the mode is baked into its replays.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

struct StaticSequential : nn::Sequential {
  ENCORE_STATIC_GRAPH({.name = "grown"});
};

// A forward that branches on a member flag (PyTorch's forward(x, return_logits=True)).
struct Head : nn::Module {
  Head() : lin(register_module("lin", std::make_shared<nn::Linear>(4, 3))) {}
  Tensor forward(const Tensor& x) override {
    const Tensor logits = (*lin)(x);
    return logits_only ? logits : F::softmax(logits, -1);
  }
  bool logits_only = true;
  std::shared_ptr<nn::Linear> lin;
  ENCORE_STATIC_GRAPH({.name = "head"});
};

// A Linear(4, 4) made from `seed` in each.
void start(nn::Sequential& a, nn::Sequential& b, uint64_t seed) {
  for (nn::Sequential* s : {&a, &b}) {
    manual_seed(seed);
    s->add(std::make_shared<nn::Linear>(4, 4));
  }
}

// Adds the same layers, made from the same seed, to both.
void grow(nn::Sequential& a, nn::Sequential& b) {
  for (nn::Sequential* s : {&a, &b}) {
    manual_seed(41);
    s->add(std::make_shared<nn::ReLU>());
    s->add(std::make_shared<nn::Linear>(4, 2));
  }
}

}  // namespace

TEST_CASE("a layer added to a watched module after its trace traces again", "[static][modules]") {
  StaticEnabled on;
  NoGradGuard no_grad;
  nn::Sequential eager;
  StaticSequential traced;
  start(eager, traced, 40);
  const Tensor x = randn({3, 4});
  for (int call = 0; call < 3; ++call) CHECK(bit_diff(traced(x), eager(x)) == "");
  // Modules made elsewhere change the process's structure count, not these modules.
  auto unrelated = nn::mlp(3, 5, 2);
  CHECK(bit_diff(traced(x), eager(x)) == "");
  CHECK(static_stats(traced).traces == 1);
  grow(eager, traced);
  for (int call = 0; call < 2; ++call) {
    INFO("call " << call << " after the layers were added");
    const Tensor y = traced(x);
    CHECK(y.shape() == Shape({3, 2}));
    CHECK(bit_diff(y, eager(x)) == "");
  }
  const StaticStats st = static_stats(traced);
  CHECK(st.traces == 2);
  REQUIRE(st.traces_history.size() == 2);
  CHECK_THAT(st.traces_history[1].reason,
             Contains("the watched modules changed since the previous trace"));
}

TEST_CASE("a layer without parameters added after the trace traces again", "[static][modules]") {
  StaticEnabled on;
  NoGradGuard no_grad;
  nn::Sequential eager;
  StaticSequential traced;
  start(eager, traced, 44);
  const Tensor x = randn({3, 4});
  for (int call = 0; call < 2; ++call) CHECK(bit_diff(traced(x), eager(x)) == "");
  eager.add(std::make_shared<nn::ReLU>());
  traced.add(std::make_shared<nn::ReLU>());
  CHECK(bit_diff(traced(x), eager(x)) == "");
  CHECK(static_stats(traced).traces == 2);
}

TEST_CASE("a whole training step over a grown model trains as eagerly", "[static][modules]") {
  StaticEnabled on;
  auto make = [] {
    manual_seed(42);
    auto s = std::make_shared<nn::Sequential>();
    s->add(std::make_shared<nn::Linear>(4, 4));
    return s;
  };
  auto eager = make(), traced = make();
  auto step = [](nn::Sequential& m, const Tensor& x) {
    Tensor loss = F::sum(F::mul(m(x), m(x)));
    m.zero_grad();
    loss.backward();
    NoGradGuard no_grad;
    for (Tensor p : m.parameters()) add_(p, F::mul(p.grad(), -0.1));
    return loss;
  };
  auto fn = static_graph([&](const Tensor& x) { return step(*traced, x); },
                         {.name = "grown_step", .modules = {traced}});
  for (int call = 0; call < 6; ++call) {
    INFO("step " << call);
    if (call == 3) grow(*eager, *traced);
    manual_seed(43 + static_cast<uint64_t>(call));
    const Tensor x = randn({3, 4});
    CHECK(bit_diff(fn(x), step(*eager, x)) == "");
    check_same_parameters(*eager, *traced, "after the step");
  }
  CHECK(fn.stats().traces == 2);
}

TEST_CASE("a module's static forward takes a StaticKey for what it reads on the host", "[static]") {
  StaticEnabled on;
  NoGradGuard no_grad;
  manual_seed(5);
  Head head;
  const Tensor x = randn({2, 4});
  auto key = [&head] { return StaticKey{head.logits_only ? "logits" : "probs"}; };
  auto eager = [&head, &x] {
    StaticEnabled off(false);
    return head.forward(x);
  };
  for (int c = 0; c < 4; ++c) {
    head.logits_only = c % 2 == 0;
    INFO("call " << c);
    CHECK(bit_diff(head(key(), x), eager()) == "");
  }
  const StaticStats s = static_stats(head);
  CHECK(s.traces == 2);
  CHECK(s.hits == 2);
  REQUIRE(s.traces_history.size() == 2);
  CHECK(s.traces_history[1].reason == "key changed 'logits' -> 'probs'");
}

TEST_CASE("a function reading the mode of a module it does not watch warns once", "[static]") {
  StaticEnabled on;
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(4, 4));
  model->add(std::make_shared<nn::Dropout>(0.5));
  const Tensor x = rand({2, 4});
  NoGradGuard no_grad;
  auto unwatched =
      static_graph([&](const Tensor& t) { return model->forward(t); }, {.name = "unwatched"});
  unwatched(x);
  unwatched(rand({3, 4}));  // a second trace: still one warning
  const StaticStats u = unwatched.stats();
  INFO(joined(u.warnings));
  CHECK(u.traces == 2);
  CHECK(std::count_if(u.warnings.begin(), u.warnings.end(), [](const std::string& w) {
          return w.find("the train/eval mode of Dropout") != std::string::npos &&
                 w.find("not among the modules it watches") != std::string::npos;
        }) == 1);
  // Watched, it says nothing, and eval() is a new signature.
  auto watched = static_graph([&](const Tensor& t) { return model->forward(t); },
                              {.name = "watched", .modules = {model}});
  watched(x);
  model->eval();
  watched(x);
  const StaticStats w = watched.stats();
  CHECK(w.traces == 2);
  CHECK_FALSE(any_contains(w.warnings, "train/eval mode"));
}
