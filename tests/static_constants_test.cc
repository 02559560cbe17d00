// Constant folding (Plan::fold_constants, set_static_fold_constants_enabled): the steps a static
// function runs on values it makes itself (a causal mask from arange, a scaled range) are not
// replayed; their results are bound to their trace values. Replays equal eager bit for bit, values
// and gradients, with the switch on and off; a constant the function then writes in place, or
// returns, keeps its steps (replays that read a bound value there would drift from eager); the
// dump counts the folded steps; a masked model trains the same; a mask made at a dynamic size is
// made at every planned size.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

// Causal attention scores: x [T, T] with the keys after each query masked out, the mask made from
// arange inside the function (a conversion, two reshapes and a comparison: constants).
Tensor masked_scores(const Tensor& x) {
  const int64_t t = x.shape()[0];
  const Tensor rows = F::reshape(arange(t), {t, 1}), cols = F::reshape(arange(t), {1, t});
  return F::softmax(F::masked_fill(x, F::greater(cols, rows), -INFINITY), -1);
}

// The forward steps of the function's only cache entry, as its dump counts them.
int forward_steps(const std::string& schedule) {
  const std::string::size_type at = schedule.find("forward: ");
  REQUIRE(at != std::string::npos);
  return std::stoi(schedule.substr(at + 9));
}

}  // namespace

TEST_CASE("steps computing constants are folded, and replays equal eager, gradients included",
          "[static][constants]") {
  StaticEnabled on;
  const bool fold = GENERATE(true, false);
  INFO("folding " << (fold ? "on" : "off"));
  StaticFoldConstants folding(fold);
  auto f = static_graph([](const Tensor& x) { return masked_scores(x); }, {.name = "masked"});
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call);
    manual_seed(20 + static_cast<uint64_t>(call));
    Tensor xs = randn({6, 6}), xe = clone(xs);
    xs.set_requires_grad();
    xe.set_requires_grad();
    const Tensor g = randn({6, 6});
    const Tensor ys = f(xs), ye = masked_scores(xe);
    CHECK(bit_diff(ys, ye) == "");
    F::sum(F::mul(ys, g)).backward();
    F::sum(F::mul(ye, g)).backward();
    CHECK(bit_diff(xs.grad(), xe.grad()) == "");
  }
  const StaticStats s = f.stats();
  CHECK(s.traces == 1);
  CHECK(s.hits == 3);
  const std::string text = f.schedule_text();
  INFO(text);
  if (fold) {
    CHECK_THAT(text, Contains("steps computing constants folded"));
  } else {
    CHECK_THAT(text, !Contains("computing constants folded"));
  }
}

TEST_CASE("folding constants leaves fewer replayed steps", "[static][constants]") {
  StaticEnabled on;
  std::string with, without;
  for (const bool fold : {true, false}) {
    StaticFoldConstants folding(fold);
    auto f = static_graph([](const Tensor& x) { return masked_scores(x); }, {.name = "masked"});
    NoGradGuard no_grad;
    for (int call = 0; call < 2; ++call) (void)f(randn({5, 5}));
    (fold ? with : without) = f.schedule_text();
  }
  INFO(with << "\n" << without);
  // The two aranges and the comparison are folded (the -inf fill too, where
  // masked_fill makes one).
  CHECK(forward_steps(with) <= forward_steps(without) - 3);
}

TEST_CASE("a constant the function writes in place, or returns, keeps its steps",
          "[static][constants]") {
  StaticEnabled on;
  // c is made from arange, then x is added into it in place: it is no constant after that, and a
  // replay that bound its trace value would add into the same tensor at every call.
  auto body = [](const Tensor& x) {
    const Tensor c = F::mul(arange(4), 2.0);
    add_(c, x);
    const Tensor kept = F::mul(arange(4), 3.0);  // returned: the caller may write it
    return std::pair{F::mul(c, c), kept};
  };
  auto f = static_graph(body, {.name = "written"});
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call);
    const Tensor x = tensor({1.0 * call, 2, 3, 4}, {4});
    const auto [ys, ks] = f(x);
    const auto [ye, ke] = body(x);
    CHECK(bit_diff(ys, ye) == "");
    CHECK(bit_diff(ks, ke) == "");
    fill_(ks, -1);  // the caller's to write: the next call returns the values again
  }
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().hits == 3);
}

TEST_CASE("a tensor filled from host values, then written in place, starts each call from them",
          "[static][constants]") {
  StaticEnabled on;
  // c is made with empty() and filled through data(): no op made its values, so a replay copies
  // them in before the add, instead of adding into the tensor the trace filled at every call.
  // `read_first` reads c before the write: the read must see the host values too.
  for (const bool read_first : {false, true}) {
    INFO("read first " << read_first);
    auto body = [read_first](const Tensor& x) {
      Tensor c = empty({3});
      float* p = c.data<float>();
      p[0] = 5;
      p[1] = 6;
      p[2] = 7;
      const Tensor before = read_first ? F::mul(c, 2.0) : zeros({3});
      add_(c, x);
      return F::add(F::mul(c, 1.0), before);
    };
    auto f = static_graph(body, {.name = "host_filled"});
    for (int call = 0; call < 4; ++call) {
      INFO("call " << call);
      const Tensor x = tensor({1.0 * call, 2, 3}, {3});
      CHECK(bit_diff(f(x), body(x)) == "");
    }
    CHECK(f.stats().traces == 1);
    CHECK(f.stats().hits == 3);
  }
}

TEST_CASE("a causally masked model trains by a static step as eagerly, constants folded",
          "[static][constants]") {
  StaticEnabled on;
  StaticFoldConstants folding(true);
  auto make = [] {
    manual_seed(9);
    return std::make_shared<nn::Linear>(8, 8);
  };
  auto eager_model = make(), static_model = make();
  optim::SGD eager_opt(eager_model->parameters(), {.lr = 0.1}),
      static_opt(static_model->parameters(), {.lr = 0.1});
  auto step = [](nn::Linear& m, optim::SGD& opt, const Tensor& x) {
    const Tensor loss = F::sum(F::mul(masked_scores(m(x)), x));
    opt.zero_grad();
    loss.backward();
    opt.step();
    return loss;
  };
  auto f = static_graph([&](const Tensor& x) { return step(*static_model, static_opt, x); },
                        {.name = "masked_step", .modules = {static_model}});
  for (int call = 0; call < 5; ++call) {
    INFO("step " << call);
    manual_seed(40 + static_cast<uint64_t>(call));
    const Tensor x = randn({8, 8});
    CHECK(bit_diff(f(x), step(*eager_model, eager_opt, x)) == "");
    CHECK(bit_diff(static_model->weight, eager_model->weight) == "");
    CHECK(bit_diff(static_model->bias, eager_model->bias) == "");
  }
  CHECK(f.stats().traces == 1);
  CHECK_THAT(f.schedule_text(), Contains("steps computing constants folded"));
}

TEST_CASE("constants made at several sizes replay each size's values", "[static][constants]") {
  // The mask's shape follows x's: every size gets its own constants (traced, or planned from the
  // dynamic family arange's step lets the size join, which folds none), never another size's.
  StaticEnabled on;
  const bool fold = GENERATE(true, false);
  INFO("folding " << (fold ? "on" : "off"));
  StaticFoldConstants folding(fold);
  auto f = static_graph([](const Tensor& x) { return masked_scores(x); }, {.name = "sizes"});
  for (const int64_t t : {4, 6, 5, 7, 4, 6, 9, 5, 3}) {
    INFO("size " << t);
    manual_seed(static_cast<uint64_t>(t));
    Tensor xs = randn({t, t}), xe = clone(xs);
    xs.set_requires_grad();
    xe.set_requires_grad();
    const Tensor ys = f(xs), ye = masked_scores(xe);
    CHECK(bit_diff(ys, ye) == "");
    F::sum(F::mul(ys, xs)).backward();
    F::sum(F::mul(ye, xe)).backward();
    CHECK(bit_diff(xs.grad(), xe.grad()) == "");
  }
  const StaticStats st = f.stats();
  CHECK(st.traces == 2);
  CHECK(st.static_dims.empty());
  REQUIRE(st.dynamic.size() == 1);
  CHECK(st.dynamic[0].sizes_planned == 4);  // 5, 7, 9 and 3
  CHECK(st.dynamic[0].hits == 5);           // and 5 again
}

TEST_CASE("a constant filled from host values that depend on a size keeps it static",
          "[static][constants]") {
  // tensor() copies values the function computed on the host: the trace holds them, not how
  // they follow from the size, so each size traces; why names the buffer and its first reader.
  StaticEnabled on;
  auto body = [](const Tensor& x) {
    const int64_t t = x.size(0);
    return F::mul(x, tensor(std::vector<double>(static_cast<size_t>(t), 1.0 / t), {t}));
  };
  auto f = static_graph(body, {.name = "host_values"});
  NoGradGuard no_grad;
  for (const int64_t t : {4, 6, 5, 4}) {
    INFO("size " << t);
    const Tensor x = randn({t});
    CHECK(bit_diff(f(x), body(x)) == "");
  }
  CHECK(f.stats().traces == 3);
  REQUIRE(!f.stats().static_dims.empty());
  CHECK_THAT(f.stats().static_dims[0],
             Contains("(first read by step 0 (forward) copy_) is a tensor made in the call"));
}

TEST_CASE("a constant the function returns as it made it stays the function's to replay",
          "[static][constants]") {
  // zeros({3}) is returned as made (its result gets a copy); the caller then writes the tensor
  // the trace returned. A replay binding that tensor would hand back the caller's writes.
  StaticEnabled on;
  auto body = [](const Tensor& x) { return std::pair{F::mul(x, 2.0), zeros({3})}; };
  auto f = static_graph(body, {.name = "returned_zeros"});
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call);
    const Tensor x = tensor({1.0, 2, 3.0 + call}, {3});
    const auto [ys, zs] = f(x);
    const auto [ye, ze] = body(x);
    CHECK(bit_diff(ys, ye) == "");
    CHECK(bit_diff(zs, ze) == "");
    fill_(zs, 7);
  }
  CHECK(f.stats().hits == 3);
}

TEST_CASE("two forwards through folded constants before one backward give eager's gradients",
          "[static][constants]") {
  // masked_fill's backward fills a constant too; a folded buffer is nothing a replay writes, so
  // the second forward does not mark what the first one's backward reads as modified.
  StaticEnabled on;
  auto f = static_graph([](const Tensor& x) { return masked_scores(x); }, {.name = "two"});
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    manual_seed(60 + static_cast<uint64_t>(round));
    Tensor a = randn({5, 5}), b = randn({5, 5});
    Tensor ae = clone(a), be = clone(b);
    for (Tensor* t : {&a, &b, &ae, &be}) t->set_requires_grad();
    F::sum(F::mul(F::add(f(a), f(b)), F::add(a, b))).backward();
    F::sum(F::mul(F::add(masked_scores(ae), masked_scores(be)), F::add(ae, be))).backward();
    CHECK(bit_diff(a.grad(), ae.grad()) == "");
    CHECK(bit_diff(b.grad(), be.grad()) == "");
  }
  CHECK(f.stats().hits >= 4);
}
