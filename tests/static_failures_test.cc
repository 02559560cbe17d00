// static_graph when things go wrong: a recorded first backward that fails lets the next call
// trace again (a bounded number of times, said in the statistics and the log), a trace that ran a
// one-time set-up is dropped, a trace that throws leaves the cache as it was and the next trace
// says so, a log sink that throws fails no call, every per-function list of diagnostics stays
// bounded however long a retrace storm lasts, and a storm of traces no backward reached says so.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/dispatcher.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

Tensor leaf(const Tensor& values) {
  Tensor t = values.detach();
  t.set_requires_grad(true);
  return t;
}

// x * w saves w for its backward; `spoil` writes w in place before the backward, which then
// fails as it does eagerly.
struct Call {
  Tensor x, w, y;
};
Call forward(auto& fn) {
  Call c{leaf(randn({3})), leaf(randn({3})), Tensor()};
  c.y = fn(c.x, c.w);
  return c;
}
void spoil(const Call& c) {
  NoGradGuard no_grad;
  fill_(c.w, 2.0);
}

}  // namespace

TEST_CASE("a failed recorded backward lets the next call trace again and says so",
          "[static][failures]") {
  manual_seed(31);
  auto fn = static_graph([](const Tensor& x, const Tensor& w) { return F::sum(F::tanh(x * w)); },
                         {.name = "spoiled"});
  LogCapture log;
  {
    Call c = forward(fn);
    spoil(c);
    CHECK_THROWS_WITH(c.y.backward(), Contains("modified in place"));
  }
  StaticStats s = fn.stats();
  CHECK(s.failed_backwards == 1);
  CHECK(any_contains(s.warnings, "first backward through the outputs of trace 1 failed"));
  CHECK(any_contains(log.lines, "the next call with its signature traces again"));

  // The next call traces again; its backward is recorded and later calls replay.
  for (int call = 0; call < 3; ++call) {
    Call c = forward(fn);
    c.y.backward();
    Tensor xe = leaf(c.x), we = leaf(c.w);
    F::sum(F::tanh(xe * we)).backward();
    CHECK(bit_diff(c.x.grad(), xe.grad()) == "");
    CHECK(bit_diff(c.w.grad(), we.grad()) == "");
  }
  s = fn.stats();
  CHECK(s.traces == 2);
  CHECK(s.hits == 2);
  REQUIRE(s.traces_history.size() == 2);
  CHECK_THAT(s.traces_history[1].reason,
             Contains("the first backward of the previous trace failed"));
}

TEST_CASE("a signature whose recorded backward keeps failing runs eagerly after three tries",
          "[static][failures]") {
  manual_seed(32);
  auto fn = static_graph([](const Tensor& x, const Tensor& w) { return F::sum(x * w); },
                         {.name = "always_spoiled"});
  LogCapture log;
  for (int k = 0; k < 3; ++k) {
    Call c = forward(fn);
    spoil(c);
    CHECK_THROWS(c.y.backward());
  }
  StaticStats s = fn.stats();
  CHECK(s.traces == 3);
  CHECK(s.failed_backwards == 3);
  CHECK(any_contains(s.warnings,
                     "3 times in a row for its signature; that signature runs "
                     "eagerly from now on"));
  // Now eager: the backward still fails where eager's does, and works where eager's does.
  {
    Call c = forward(fn);
    spoil(c);
    CHECK_THROWS_WITH(c.y.backward(), Contains("modified in place"));
  }
  {
    Call c = forward(fn);
    c.y.backward();
    CHECK(bit_diff(c.x.grad(), c.w) == "");
  }
  s = fn.stats();
  CHECK(s.traces == 3);
  CHECK(s.eager_calls == 2);
  // clear() gives the signature its tries back.
  fn.clear();
  Call c = forward(fn);
  c.y.backward();
  CHECK(fn.stats().traces == 4);
}

TEST_CASE("per-function diagnostics stay bounded in a retrace storm", "[static][failures]") {
  // 2,000 calls cycling 50 batch sizes through a cache of 8: a trace and an eviction per call
  // (every size a signature of its own: no dynamic shapes).
  manual_seed(33);
  auto fn = static_graph([](const Tensor& x) { return F::relu(x) * 2.0; },
                         {.name = "storm", .cache_limit = 8, .dynamic = DynamicShapes::Off});
  LogCapture log;
  NoGradGuard no_grad;
  std::vector<Tensor> xs;
  for (int b = 1; b <= 50; ++b) xs.push_back(randn({b, 3}));
  for (int call = 0; call < 2000; ++call) fn(xs[call % 50]);
  const StaticStats s = fn.stats();
  CHECK(s.traces == 2000);
  CHECK(s.evictions == 2000 - 8);
  CHECK(s.traces_history.size() == 64);
  CHECK(s.traces_history.front().trace == 1);
  CHECK(s.traces_history.back().trace == 2000);
  CHECK(s.warnings.size() == 64);
  CHECK(s.warnings_dropped >= s.evictions - 64);
  // Every warning reached the log once; the statistics keep the first and the latest 64.
  CHECK(static_cast<int64_t>(log.lines.size()) == 64 + s.warnings_dropped);
  CHECK(s.entries == 8);
}

TEST_CASE("a trace that ran a one-time set-up is dropped, and the next call traces again") {
  int setups = 0;
  const auto body = [&](const Tensor& x) {
    if (setups++ == 0)
      if (Tracer* t = current_tracer()) t->on_unrepeatable("the test's set-up");
    return F::mul(x, 2.0);
  };
  const std::string reason = "the previous trace ran a one-time set-up (the test's set-up)";
  SECTION("a whole call") {
    auto fn = static_graph(body, {.name = "set_up_once"});
    for (int call = 0; call < 4; ++call)
      CHECK(fn(full({3}, 1.0)).to_vector<float>() == std::vector<float>(3, 2.0f));
    const StaticStats s = fn.stats();
    CHECK(s.traces == 2);
    CHECK(s.hits == 2);
    REQUIRE(s.traces_history.size() == 2);
    CHECK(s.traces_history[1].reason == reason);
  }
  SECTION("a forward whose backward comes later") {
    auto fn = static_graph(body, {.name = "set_up_once_forward"});
    for (int call = 0; call < 4; ++call) {
      Tensor x = leaf(full({3}, 1.0));
      F::sum(fn(x)).backward();
      CHECK(x.grad().to_vector<float>() == std::vector<float>(3, 2.0f));
    }
    const StaticStats s = fn.stats();
    CHECK(s.traces == 2);
    CHECK(s.hits == 2);
    REQUIRE(s.traces_history.size() == 2);
    CHECK(s.traces_history[1].reason == reason);
  }
}

TEST_CASE("a trace that throws evicts nothing, and the next trace says it threw",
          "[static][failures]") {
  bool fail = false;
  auto body = [&fail](const Tensor& x) {
    if (fail) throw Error("bad batch");
    return F::mul(x, 2.0);
  };
  auto fn = static_graph(
      body,
      {.name = "throws", .cache_limit = 1, .arg_names = {"x"}, .dynamic = DynamicShapes::Off});
  NoGradGuard no_grad;
  const Tensor good = randn({4, 3}), other = randn({5, 3});
  CHECK(bit_diff(fn(good), body(good)) == "");
  fail = true;
  CHECK_THROWS_WITH(fn(other), "bad batch");
  CHECK_THROWS_WITH(fn(other), "bad batch");
  fail = false;
  CHECK(bit_diff(fn(good), body(good)) == "");  // its entry is still cached
  StaticStats s = fn.stats();
  CHECK(s.traces == 3);
  CHECK(s.hits == 1);
  CHECK(s.evictions == 0);
  CHECK(s.entries == 1);
  fn.clear();
  fail = true;
  CHECK_THROWS_WITH(fn(good), "bad batch");
  fail = false;
  CHECK(bit_diff(fn(other), body(other)) == "");
  s = fn.stats();
  REQUIRE(s.traces_history.size() == 5);
  CHECK(s.traces_history[4].reason ==
        "the previous trace threw; argument 0 'x' dim 0 changed 4 -> 5");
}

TEST_CASE("a function whose traces keep throwing is told so, not told to bucket its sizes",
          "[static][failures]") {
  auto fn = static_graph([](const Tensor& x) { return x * F::sum(x).item<float>(); },
                         {.name = "reads_item"});
  LogCapture log;
  for (int call = 0; call < 10; ++call) CHECK_THROWS(fn(randn({3})));
  const StaticStats s = fn.stats();
  CHECK(s.traces == 10);
  REQUIRE(s.warnings.size() == 1);
  CHECK_THAT(s.warnings[0], Contains("10 of the last 10 calls retraced; its traces keep throwing"));
  CHECK_THAT(s.warnings[0], Contains("each call traces again until one succeeds"));
  CHECK_THAT(s.warnings[0], !Contains("bucket"));
}

TEST_CASE("a log sink that throws fails no call", "[static][failures]") {
  struct Restore {
    LogSink previous;
    ~Restore() {
      set_log_sink(previous);
      set_log_retraces(false);
    }
  } restore{set_log_sink([](const std::string&) { throw Error("sink is full"); })};
  set_log_retraces(true);
  auto fn = static_graph([](const Tensor& x) { return F::mul(x, 3.0); }, {.name = "logged"});
  NoGradGuard no_grad;
  for (const int64_t n : {3, 4, 5}) {
    const Tensor x = randn({n});
    CHECK(bit_diff(fn(x), F::mul(x, 3.0)) == "");
  }
  CHECK(fn.stats().sizes_planned == 1);
}

TEST_CASE("a storm of traces no backward reached says to evaluate under NoGradGuard", "[static]") {
  // Alternate calls under no_grad (an entry of their own) and in grad mode with no backward: each
  // grad-mode call traces again, as its last trace's outputs got no backward. No size changed.
  StaticEnabled on;
  const Tensor w = rand({4, 4}).set_requires_grad();
  auto f = static_graph([&](const Tensor& x) { return F::matmul(x, w); }, {.name = "evaluated"});
  const Tensor x = rand({2, 4});
  for (int i = 0; i < 20; ++i) {
    if (i % 2 == 0) {
      NoGradGuard no_grad;
      f(x);
    } else {
      f(x);
    }
  }
  const StaticStats s = f.stats();
  INFO(joined(s.warnings));
  CHECK(any_contains(s.warnings, "no backward reached"));
  CHECK(any_contains(s.warnings, "call it under NoGradGuard where no backward follows"));
  CHECK_FALSE(any_contains(s.warnings, "pad or bucket"));
}
