// encore::dist in one process (a world of one, as without mpirun), the engine hooks data
// parallelism uses, and the collective ops in static schedules: kept though nothing reads their
// result, and replayed as eager runs them. Two ranks: tests/dist/.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "encore/dist.h"
#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/autograd.h"

using namespace encore;
using Catch::Matchers::Contains;

TEST_CASE("a process not started by mpirun is a world of one", "[dist]") {
  dist::init();
  dist::init();  // idempotent
  CHECK(dist::initialized());
  CHECK(dist::rank() == 0);
  CHECK(dist::world_size() == 1);
  Tensor t = full({2, 3}, 1.5);
  dist::all_reduce(t);
  CHECK(t.to_vector<float>() == std::vector<float>(6, 1.5f));
  Tensor i = full({4}, 3.0, DType::Int64);
  dist::all_reduce(i, ReduceOp::Max);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>(4, 3));
  dist::broadcast(t, 0);
  dist::barrier();
  CHECK_THROWS_WITH(dist::broadcast(t, 1), Contains("root 1") && Contains("world of 1"));
  CHECK_THROWS_WITH(dist::set_timeout(0), Contains("set_timeout"));
  const double before = dist::timeout();
  dist::set_timeout(12.5);
  CHECK(dist::timeout() == 12.5);
  dist::set_timeout(before);
  Tensor b = full({2}, 1.0, DType::Bool);
  CHECK_THROWS_WITH(dist::all_reduce(b), Contains("start_all_reduce") && Contains("bool"));
}

TEST_CASE("DataParallel in a world of one leaves training as it is", "[dist]") {
  dist::init();
  auto m = nn::mlp(4, 8, 2);
  dist::DataParallel ddp(*m);
  CHECK(ddp.buckets().empty());
  CHECK(&ddp.module() == m.get());
}

TEST_CASE("post-accumulate gradient hooks see each accumulation, callbacks the end of the pass",
          "[dist][autograd]") {
  Tensor w = full({3}, 2.0).set_requires_grad();
  std::vector<std::string> events;
  const uint64_t id = autograd::add_post_accumulate_grad_hook(w, [&](const Tensor& leaf) {
    CHECK(leaf.is_same(w));
    events.push_back("grad " + std::to_string(leaf.grad().to_vector<float>()[0]));
    CHECK(autograd::current_pass() != 0);
    if (events.size() == 1) autograd::queue_callback([&] { events.push_back("done"); });
  });
  // w is used twice: two accumulations, the hook after each, the callback after the pass.
  F::sum(F::add(F::mul(w, 3.0), F::mul(w, 4.0))).backward();
  CHECK(events == std::vector<std::string>{"grad 3.000000", "grad 7.000000", "done"});
  CHECK(autograd::current_pass() == 0);
  autograd::remove_post_accumulate_grad_hook(w, id);
  events.clear();
  F::sum(w).backward();
  CHECK(events.empty());
  CHECK_THROWS_WITH(autograd::queue_callback([] {}), Contains("no backward pass"));
  Tensor plain = full({2}, 1.0);
  CHECK_THROWS_WITH(autograd::add_post_accumulate_grad_hook(plain, [](const Tensor&) {}),
                    Contains("leaf that requires grad"));
}

TEST_CASE("collective steps stay in a static schedule and replay as eager", "[dist][static]") {
  dist::init();
  // The reduced tensor is never read: the steps must stay (the other ranks make the call).
  auto unused = static_graph(
      [](const Tensor& x) {
        Tensor y = F::mul(x, 2.0);
        dist::all_reduce(y);
        return F::add(x, 1.0);
      },
      {.name = "unused_reduce"});
  // The reduced tensor is the result.
  auto used = static_graph(
      [](const Tensor& x) {
        Tensor y = F::mul(x, 2.0);
        dist::all_reduce(y);
        return F::add(y, 1.0);
      },
      {.name = "used_reduce"});
  for (int call = 0; call < 3; ++call) {
    const Tensor x = full({5}, static_cast<double>(call));
    CHECK(unused(x).to_vector<float>() == std::vector<float>(5, call + 1.0f));
    CHECK(used(x).to_vector<float>() == std::vector<float>(5, 2.0f * call + 1.0f));
  }
  CHECK(unused.stats().hits == 2);
  CHECK(used.stats().hits == 2);
  for (const std::string& text : {unused.schedule_text(), used.schedule_text()}) {
    INFO(text);
    const size_t start = text.find("all_reduce_start"), wait = text.find("all_reduce_wait");
    REQUIRE(start != std::string::npos);
    REQUIRE(wait != std::string::npos);
    CHECK(start < wait);
  }
}

TEST_CASE("a static schedule starts an all-reduce ahead of the steps it does not depend on",
          "[dist][static]") {
  dist::init();
  manual_seed(0);
  const Tensor a = rand({16, 16}), b = rand({16, 16});
  // As the engine orders a backward: the product that does not feed the reduced tensor is
  // recorded before the all-reduce starts.
  const auto fn = [&](const Tensor& x) {
    Tensor reduced = F::matmul(x, a);
    Tensor other = F::matmul(x, b);
    dist::all_reduce(reduced);
    return F::add(reduced, other);
  };
  auto step = static_graph(fn, {.name = "early_start", .verify_every = 2});
  for (int call = 0; call < 4; ++call) {
    const Tensor x = rand({4, 16});
    CHECK(step(x).to_vector<float>() == fn(x).to_vector<float>());
  }
  CHECK(step.stats().hits == 3);
  const std::string text = step.schedule_text();
  INFO(text);
  const size_t first = text.find("matmul"), start = text.find("all_reduce_start");
  REQUIRE(first != std::string::npos);
  REQUIRE(start != std::string::npos);
  const size_t second = text.find("matmul", first + 1), wait = text.find("all_reduce_wait");
  REQUIRE(second != std::string::npos);
  REQUIRE(wait != std::string::npos);
  CHECK(first < start);
  CHECK(start < second);  // the independent product runs while the all-reduce is in flight
  CHECK(second < wait);
}
