// static_graph from several threads at once: one static function (or one module's static
// forward) shared by threads that call it concurrently gives each call eager's bits, the cache
// and statistics stay consistent, one signature is traced once, and concurrent first calls,
// evictions and first backwards neither crash nor corrupt. Tagged [threads]: the
// ThreadSanitizer build runs these.
#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/static_models.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;

namespace {

constexpr int kThreads = 4;

// Runs body(thread index) on kThreads threads started together, in grad mode `grad` (grad mode is
// per thread); the first failure message of each thread (body returns "" when all was well, an
// exception counts as a failure).
template <typename Body>
std::vector<std::string> run_threads(Body body, bool grad = false) {
  std::vector<std::string> failures(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      try {
        GradMode::set_enabled(grad);
        failures[t] = body(t);
      } catch (const std::exception& e) {
        failures[t] = cat("threw: ", e.what());
      }
    });
  for (auto& th : threads) th.join();
  return failures;
}

void check_no_failures(const std::vector<std::string>& failures) {
  for (size_t t = 0; t < failures.size(); ++t) {
    INFO("thread " << t);
    CHECK(failures[t] == "");
  }
}

// An inference body with several GEMMs and elementwise steps (a fused run, an arena).
Tensor mlp_body(nn::Module& model, const Tensor& x) {
  return F::tanh(model(x)) * 2.0 + 1.0;
}

void check_stats_add_up(const StaticStats& s) {
  INFO("calls " << s.calls << ", traces " << s.traces << ", hits " << s.hits << ", eager "
                << s.eager_calls);
  CHECK(s.traces + s.hits + s.eager_calls == s.calls);
  CHECK(s.entries <= 8);
}

}  // namespace

TEST_CASE("one warmed-up static function called from several threads gives eager's bits",
          "[static][threads]") {
  manual_seed(11);
  auto model = std::make_shared<MlpNet>(64, 96, 10);
  auto fn = static_graph([&](const Tensor& x) { return mlp_body(*model, x); },
                         {.name = "shared_mlp", .modules = {model}});
  NoGradGuard no_grad;
  std::vector<Tensor> inputs, expected;
  for (int i = 0; i < 16; ++i) {
    inputs.push_back(randn({8, 64}));
    expected.push_back(mlp_body(*model, inputs.back()));
  }
  REQUIRE(bit_diff(fn(inputs[0]), expected[0]) == "");  // traced

  const int calls = 500;
  check_no_failures(run_threads([&](int t) -> std::string {
    for (int k = 0; k < calls; ++k) {
      const int i = (t * 7 + k) % static_cast<int>(inputs.size());
      const Tensor y = fn(inputs[i]);
      if (std::string d = bit_diff(y, expected[i]); !d.empty())
        return cat("call ", k, " input ", i, ": ", d);
    }
    return "";
  }));
  const StaticStats s = fn.stats();
  CHECK(s.traces == 1);
  CHECK(s.hits == kThreads * calls);  // every call after the trace replayed
  CHECK(s.calls == 1 + kThreads * calls);
  check_stats_add_up(s);
  // Each concurrent call had its own arena; at most one per thread was ever made.
  REQUIRE(s.cache.size() == 1);
  CHECK(s.cache[0].arenas >= 1);
  CHECK(s.cache[0].arenas <= kThreads);
}

TEST_CASE("a module's static forward shared by threads gives eager's bits", "[static][threads]") {
  manual_seed(12);
  StaticMlp model(32, 48, 10);
  MlpNet& plain = model;
  NoGradGuard no_grad;
  std::vector<Tensor> inputs, expected;
  {
    SwitchScope<set_static_enabled> off(false);
    for (int i = 0; i < 8; ++i) {
      inputs.push_back(randn({4 + i % 2, 32}));
      expected.push_back(plain(inputs.back()));
    }
  }
  check_no_failures(run_threads([&](int t) -> std::string {
    for (int k = 0; k < 300; ++k) {
      const int i = (t + k) % static_cast<int>(inputs.size());
      if (std::string d = bit_diff(model(inputs[i]), expected[i]); !d.empty())
        return cat("call ", k, " input ", i, ": ", d);
    }
    return "";
  }));
  const StaticStats s = static_stats(model);
  CHECK(s.traces == 2);  // two batch sizes, each traced once
  check_stats_add_up(s);
}

TEST_CASE("concurrent first calls and evictions of one static function stay correct",
          "[static][threads]") {
  manual_seed(13);
  auto model = std::make_shared<MlpNet>(16, 24, 6);
  auto fn = static_graph([&](const Tensor& x) { return mlp_body(*model, x); },
                         {.name = "evicting", .cache_limit = 2, .modules = {model}});
  std::vector<std::string> warnings;
  NoGradGuard no_grad;
  std::vector<Tensor> inputs, expected;
  for (int i = 0; i < 6; ++i) {  // six batch sizes through a cache of two
    inputs.push_back(randn({i + 1, 16}));
    expected.push_back(mlp_body(*model, inputs.back()));
  }
  const LogSink old = set_log_sink([](const std::string&) {});
  const std::vector<std::string> failures = run_threads([&](int t) -> std::string {
    for (int k = 0; k < 200; ++k) {
      const int i = (t * 3 + k * (t + 1)) % static_cast<int>(inputs.size());
      if (std::string d = bit_diff(fn(inputs[i]), expected[i]); !d.empty())
        return cat("call ", k, " input ", i, ": ", d);
    }
    return "";
  });
  set_log_sink(old);
  check_no_failures(failures);
  const StaticStats s = fn.stats();
  check_stats_add_up(s);
  CHECK(s.calls == kThreads * 200);
  CHECK(s.entries <= 2);
  CHECK(s.evictions == s.traces - s.entries);
}

TEST_CASE("threads calling a dynamic function at new sizes at once get eager's bits",
          "[static][threads][dynamic]") {
  manual_seed(15);
  auto model = std::make_shared<MlpNet>(16, 24, 6);
  auto fn = static_graph([&](const Tensor& x) { return mlp_body(*model, x); },
                         {.name = "dynamic_threads", .modules = {model}});
  NoGradGuard no_grad;
  std::vector<Tensor> inputs, expected;
  for (int64_t n = 2; n <= 13; ++n) {  // twelve batch sizes
    inputs.push_back(randn({n, 16}));
    expected.push_back(mlp_body(*model, inputs.back()));
  }
  const LogSink old = set_log_sink([](const std::string&) {});
  const std::vector<std::string> failures = run_threads([&](int t) -> std::string {
    for (int k = 0; k < 120; ++k) {
      const int i = (t * 5 + k * (2 * t + 1)) % static_cast<int>(inputs.size());
      if (std::string d = bit_diff(fn(inputs[i]), expected[i]); !d.empty())
        return cat("call ", k, " batch ", i + 2, ": ", d);
    }
    return "";
  });
  set_log_sink(old);
  check_no_failures(failures);
  const StaticStats s = fn.stats();
  check_stats_add_up(s);
  CHECK(s.calls == kThreads * 120);
  // Concurrent first calls may trace several sizes before one trace completes a family (each
  // size at most once: other threads run it eagerly meanwhile), and a family built meanwhile
  // from other traces replaces the first, whose sizes are planned again from it; one family
  // remains, keeping each size it planned once.
  CHECK(s.dynamic_events >= 1);
  CHECK(s.traces <= 12);
  REQUIRE(s.dynamic.size() == 1);
  CHECK(static_cast<int64_t>(s.dynamic[0].sizes.size()) <= s.sizes_planned);
  CHECK(s.dynamic[0].sizes.size() <= 12);
}

TEST_CASE("stats read while another thread plans a size add up", "[static][threads][dynamic]") {
  auto body = [](const Tensor& x) { return F::tanh(x * 3.0) + x; };
  auto fn = static_graph(body, {.name = "planning_stats"});
  NoGradGuard no_grad;
  fn(rand({2, 64}));
  fn(rand({3, 64}));  // the batch is dynamic from here: every new size is planned
  std::atomic<bool> done{false};
  std::thread caller([&] {
    for (int64_t n = 4; n < 200; ++n) fn(rand({n, 64}));
    done.store(true);
  });
  int64_t snapshots = 0, broken = 0;
  while (!done.load()) {
    const StaticStats s = fn.stats();
    ++snapshots;
    broken += s.calls != s.traces + s.hits + s.eager_calls;
  }
  caller.join();
  INFO(broken << " of " << snapshots << " snapshots");
  CHECK(broken == 0);
  check_stats_add_up(fn.stats());
  CHECK(fn.stats().sizes_planned > 100);
}

TEST_CASE("threads calling one new signature at once trace it once", "[static][threads]") {
  manual_seed(14);
  auto model = std::make_shared<MlpNet>(16, 32, 4);
  std::atomic<int> bodies{0};
  auto fn = static_graph(
      [&](const Tensor& x) {
        bodies.fetch_add(1);
        return mlp_body(*model, x);
      },
      {.name = "first_calls", .modules = {model}});
  NoGradGuard no_grad;
  const Tensor x = randn({5, 16});
  const Tensor want = mlp_body(*model, x);
  check_no_failures(run_threads([&](int) -> std::string {
    for (int k = 0; k < 50; ++k)
      if (std::string d = bit_diff(fn(x), want); !d.empty()) return cat("call ", k, ": ", d);
    return "";
  }));
  const StaticStats s = fn.stats();
  CHECK(s.traces == 1);
  // The others ran the function eagerly while the trace was under way, or replayed after it.
  CHECK(bodies.load() == 1 + s.eager_calls);
  check_stats_add_up(s);
}

TEST_CASE("threads running forward and backward of one static function get eager's gradients",
          "[static][threads]") {
  // Each thread differentiates with respect to its own weights (no shared .grad), through one
  // static function; the first backward (the recorded one) races with other threads' calls.
  manual_seed(15);
  auto fn = static_graph(
      [](const Tensor& x, const Tensor& w) { return F::sum(F::tanh(F::matmul(x, w)) * x.size(1)); },
      {.name = "grads"});
  auto eager_grad = [](const Tensor& x, const Tensor& w0) {
    Tensor w = w0.detach();
    w.set_requires_grad(true);
    F::sum(F::tanh(F::matmul(x, w)) * x.size(1)).backward();
    return w.grad();
  };
  std::vector<Tensor> xs, ws, want;
  for (int t = 0; t < kThreads; ++t) {
    xs.push_back(randn({6, 8}));
    ws.push_back(randn({8, 3}));
    want.push_back(eager_grad(xs.back(), ws.back()));
  }
  check_no_failures(run_threads(
      [&](int t) -> std::string {
        for (int k = 0; k < 100; ++k) {
          Tensor w = ws[t].detach();
          w.set_requires_grad(true);
          fn(xs[t], w).backward();
          if (std::string d = bit_diff(w.grad(), want[t]); !d.empty())
            return cat("call ", k, ": ", d);
        }
        return "";
      },
      /*grad=*/true));
  const StaticStats s = fn.stats();
  CHECK(s.traces == 1);
  check_stats_add_up(s);
}
