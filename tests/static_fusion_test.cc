// Elementwise fusion in cpu plans: runs of adjacent elementwise steps become one
// fused_elementwise step whose replay gives eager's bits (forward and gradients) for every
// fusable op, in float32 and float64, over one element, a partial block and several blocks,
// with broadcast scalar operands, saved activations leaving the run, more live values than
// scratch blocks and more inputs than one step takes; verify mode and the profiler see it.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/profiler.h"
#include "encore/static_graph.h"
#include "tests/fusion_patterns.h"
#include "tests/test_util.h"

using namespace encore;
using Catch::Matchers::Contains;
using testing::bit_diff;
using testing::count_of;
using testing::every_fusable_op;
using testing::StaticEnabled;
using testing::StaticFusion;

namespace {

struct Checked {
  Tensor y, gx, gw;
};

template <typename Fn>
Checked run_once(Fn& fn, const Tensor& x, const Tensor& w) {
  Tensor xg = x.detach().set_requires_grad();
  Tensor wg = w.detach().set_requires_grad();
  Tensor y = fn(xg, wg);
  F::sum(F::mul(y, y)).backward();
  return {y, xg.grad(), wg.grad()};
}

void check_same(const Checked& a, const Checked& b) {
  CHECK(bit_diff(a.y, b.y) == "");
  CHECK(bit_diff(a.gx, b.gx) == "");
  CHECK(bit_diff(a.gw, b.gw) == "");
}

}  // namespace

TEST_CASE("fused elementwise runs replay eager's bits for every fusable op", "[static][fusion]") {
  StaticEnabled on;
  const StaticFusion fused(true);
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}}) {  // one, part of a block, blocks
      INFO(name(dtype) << " over " << n << " elements");
      manual_seed(static_cast<uint64_t>(n));
      const Tensor c = rand({1}, dtype, Device::cpu(), 0.5, 1.5);
      auto body = [&c](const Tensor& x, const Tensor& w) { return every_fusable_op(x, w, c); };
      auto f = static_graph(body, {.name = "every_op", .arg_names = {"x", "w"}});
      for (int call = 0; call < 4; ++call) {  // trace, then replays on fresh values
        const Tensor x = rand({n}, dtype, Device::cpu(), -2, 2);
        const Tensor w = rand({n}, dtype, Device::cpu(), 0.5, 1.5);
        check_same(run_once(f, x, w), run_once(body, x, w));
      }
      REQUIRE(f.stats().traces == 1);
      const std::string text = f.schedule_text();
      INFO(text);
      CHECK(count_of(text, R"(\d+  fused_elementwise\s+\[fuses \d+ steps)") >= 2);  // both phases
      // Nothing of the forward's many ops is left on its own but what cannot fuse (the sum
      // of the loss is outside the function).
      for (const char* op :
           {"  sigmoid", "  tanh ", "  leaky_relu ", "  tanh_grad ", "  gelu ", "  gelu_grad "})
        CHECK(count_of(text, std::string(R"(\n\s+\d+)") + op) == 0);
    }
  }
}

TEST_CASE("fused and unfused plans give the same bits", "[static][fusion]") {
  StaticEnabled on;
  manual_seed(3);
  const Tensor c = rand({1}, DType::Float32, Device::cpu(), 0.5, 1.5);
  auto body = [&c](const Tensor& x, const Tensor& w) { return every_fusable_op(x, w, c); };
  auto f = static_graph(body, {.name = "fused"});
  auto g = static_graph(body, {.name = "unfused"});
  for (int call = 0; call < 3; ++call) {
    const Tensor x = rand({300}, DType::Float32, Device::cpu(), -2, 2);
    const Tensor w = rand({300}, DType::Float32, Device::cpu(), 0.5, 1.5);
    const StaticFusion setting_f(true);  // read when the first call plans
    const Checked a = run_once(f, x, w);
    const StaticFusion setting_g(false);
    check_same(a, run_once(g, x, w));
  }
  CHECK_THAT(f.schedule_text(), Contains("fused_elementwise"));
  CHECK_THAT(g.schedule_text(), !Contains("fused_elementwise"));
  CHECK(f.stats().cache[0].forward_steps < g.stats().cache[0].forward_steps);
}

TEST_CASE("a fused program the backend refuses puts its run's steps back", "[static][fusion]") {
  StaticEnabled on;
  const StaticFusion fused(true);
  manual_seed(5);
  const Tensor c = rand({1}, DType::Float64, Device::cpu(), 0.5, 1.5);
  auto body = [&c](const Tensor& x, const Tensor& w) { return every_fusable_op(x, w, c); };
  auto all = static_graph(body, {.name = "all_fused"});
  auto some = static_graph(body, {.name = "first_refused", .verify_every = 1});
  for (int call = 0; call < 3; ++call) {
    const Tensor x = rand({40}, DType::Float64, Device::cpu(), -2, 2);
    const Tensor w = rand({40}, DType::Float64, Device::cpu(), 0.5, 1.5);
    const Checked want = run_once(body, x, w);
    check_same(run_once(all, x, w), want);
    // The forward's first run (planned first) is refused, as CUDA without NVRTC refuses one: its
    // steps come back in place, in the forward, and replay eager's bits.
    if (call == 0) schedule::refuse_next_fused_programs(1);
    check_same(run_once(some, x, w), want);
  }
  schedule::refuse_next_fused_programs(0);
  REQUIRE(some.stats().traces == 1);
  CHECK(some.stats().verifications >= 2);
  const std::string text = some.schedule_text();
  INFO(text);
  CHECK_THAT(text, Contains("elementwise runs left unfused: refused on purpose"));
  const EntryReport a = all.stats().cache[0], b = some.stats().cache[0];
  CHECK(b.forward_steps > a.forward_steps);     // the refused run's steps, back in the forward
  CHECK(b.backward_steps == a.backward_steps);  // the backward's runs fused as before
  CHECK(count_of(text, R"(fused_elementwise)") >= 1);
}

TEST_CASE("a fused run keeps in the arena only what outlives it", "[static][fusion]") {
  StaticEnabled on;
  const StaticFusion fused(true);
  // tanh's output is saved for the backward, so it leaves the run; the others live in scratch.
  auto f = static_graph(
      [](const Tensor& x) { return F::sum(F::add(F::tanh(F::mul(F::add(x, 1.0), 0.5)), 2.0)); },
      {.name = "saved"});
  const Tensor x = rand({64}).set_requires_grad();
  f(x).backward();
  f(x).backward();
  const std::string text = f.schedule_text();
  INFO(text);
  // The sum (a row op over the tensor's one row) joins the run and writes the result.
  CHECK_THAT(text, Contains("fused_elementwise           [fuses 5 steps, 1 scratch block, by"));
  CHECK_THAT(text, Contains("out 0 = tanh(scratch 0)"));
  CHECK_THAT(text, Contains("scratch 0 = add_scalar(out 0, 2)"));
  CHECK_THAT(text, Contains("out 1 = sum(scratch 0)"));
  // Forward: the fused step alone; the arena holds tanh's output, never the scratch values.
  const StaticStats st = f.stats();
  const EntryReport& r = st.cache[0];
  CHECK(r.forward_steps == 1);
  CHECK(r.arena_bytes <= 3 * 256);
}

TEST_CASE("a fused run with more live values than scratch blocks writes the rest out",
          "[static][fusion]") {
  StaticEnabled on;
  const StaticFusion fused(true);
  // Twelve values of x alive at once, summed at the end: more than FusedProgram::kMaxScratch.
  auto body = [](const Tensor& x, const Tensor& w) {
    std::vector<Tensor> parts;
    for (int k = 1; k <= 12; ++k) parts.push_back(F::mul(x, static_cast<double>(k)) * w);
    Tensor y = parts[0];
    for (size_t k = 1; k < parts.size(); ++k) y = y + parts[k];
    return y;
  };
  auto f = static_graph(body, {.name = "many_live"});
  for (int call = 0; call < 3; ++call) {
    const Tensor x = rand({33}, DType::Float64, Device::cpu(), -1, 1);
    const Tensor w = rand({33}, DType::Float64, Device::cpu(), -1, 1);
    check_same(run_once(f, x, w), run_once(body, x, w));
  }
  const std::string text = f.schedule_text();
  INFO(text);
  CHECK_THAT(text, Contains("8 scratch blocks"));
}

TEST_CASE("a run with more inputs than a fused step takes is split", "[static][fusion]") {
  StaticEnabled on;
  const StaticFusion fused(true);
  std::vector<Tensor> ws;
  for (int k = 0; k < 100; ++k) ws.push_back(rand({5}, DType::Float32, Device::cpu(), -1, 1));
  auto body = [&ws](const Tensor& x) {
    Tensor y = x;
    for (const Tensor& w : ws) y = F::add(y, w);  // 100 steps, each with an input of its own
    return y;
  };
  auto f = static_graph(body, {.name = "many_inputs"});
  for (int call = 0; call < 3; ++call) {
    const Tensor x = rand({5});
    CHECK(bit_diff(f(x), body(x)) == "");
  }
  const StaticStats st = f.stats();
  const EntryReport& r = st.cache[0];
  CHECK(r.forward_steps == 2);  // 64 inputs (x and 63 of w), then the other 37
  CHECK(count_of(f.schedule_text(), R"(fuses (\d+) steps)") == 2);
}

TEST_CASE("verify mode checks the values a fused step writes", "[static][fusion]") {
  StaticEnabled on;
  const StaticFusion fused(true);
  Tensor w = rand({10});
  auto f = static_graph([&w](const Tensor& x) { return F::add(F::tanh(F::mul(x, w)), 1.0); },
                        {.name = "fused_verified", .verify_every = 1});
  const Tensor x = rand({10});
  f(x);
  CHECK_NOTHROW(f(x));
  CHECK(f.stats().verifications == 1);
  CHECK_THAT(f.schedule_text(), Contains("fused_elementwise           [fuses 3 steps"));
  // A new tensor where the trace bound the old one by reference: the ops are the same, the
  // values of the fused step's output (the last add) differ.
  w = rand({10});
  CHECK_THAT(testing::error_of([&] { f(x); }),
             Contains("forward op 2 add_scalar") && Contains("computed different values"));
}

TEST_CASE("the profiler counts a fused step under replay", "[static][fusion][profiler]") {
  StaticEnabled on;
  const StaticFusion fused(true);
  auto f = static_graph([](const Tensor& x) { return F::sum(F::relu(F::mul(x, 3.0))); },
                        {.name = "fused_profiled"});
  const Tensor x = rand({16}).set_requires_grad();
  f(x).backward();
  profiler::start();
  for (int i = 0; i < 3; ++i) f(x).backward();
  const profiler::Profile p = profiler::stop();
  // One fused step in each phase: mul_scalar, relu and the sum (a row op over the one row),
  // then relu_grad and mul_scalar.
  CHECK(p.calls("fused_elementwise", profiler::Mode::Replay) == 6);
  CHECK(p.calls("relu", profiler::Mode::Replay) == 0);
  CHECK(p.calls("sum", profiler::Mode::Replay) == 0);
}

TEST_CASE("verify mode accepts a fused step whose NaNs differ only in sign or payload",
          "[static][fusion]") {
  // x86 returns the first operand of an operation on two NaNs, and the compiler may order the
  // operands of a commutative op differently in the fused loop than in the op's own kernel.
  StaticEnabled on;
  const StaticFusion fused(true);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t n : {int64_t{7}, int64_t{64}, int64_t{300}}) {
    INFO(n << " elements");
    const Tensor a = full({n}, nan), b = full({n}, -nan);
    for (int which = 0; which < 2; ++which) {
      auto f = static_graph(
          [which](const Tensor& x, const Tensor& y) {
            return F::mul(which == 0 ? F::add(x, y) : F::mul(x, y), 1.0);
          },
          {.name = "nan_verified", .verify_every = 1});
      for (int call = 0; call < 3; ++call) {
        Tensor r;
        CHECK_NOTHROW(r = f(a, b));
        for (float v : r.to_vector<float>()) CHECK(std::isnan(v));
      }
      CHECK(f.stats().verifications == 2);
    }
  }
}

TEST_CASE("a fused run propagates NaN through relu and leaky_relu as their own steps do",
          "[static][fusion][nan]") {
  // As in PyTorch: relu(NaN) and leaky_relu(NaN) are NaN, and the gradient reaches a NaN input
  // (relu's passes where y is NaN). Fused, unfused (verify mode) and eager agree, any NaN equal
  // to any NaN, and the NaNs are exactly where x has them.
  StaticEnabled on;
  const StaticFusion fused(true);
  auto same = [](const Tensor& a, const Tensor& b) {
    const std::vector<double> u = a.to_vector<double>(), v = b.to_vector<double>();
    if (u.size() != v.size()) return false;
    for (size_t i = 0; i < u.size(); ++i)
      if (std::isnan(u[i]) ? !std::isnan(v[i]) : std::memcmp(&u[i], &v[i], sizeof u[i]) != 0)
        return false;
    return true;
  };
  auto body = [](const Tensor& x) {
    return F::leaky_relu(F::add(F::tanh(F::relu(F::mul(x, 2.0))), -0.5), 0.1);
  };
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (int64_t n : {int64_t{7}, int64_t{300}}) {
      INFO(name(dtype) << " over " << n << " elements");
      manual_seed(static_cast<uint64_t>(n));
      auto f = static_graph(body, {.name = "nan_activations", .verify_every = 1});
      for (int call = 0; call < 3; ++call) {
        std::vector<double> v = rand({n}, DType::Float64, Device::cpu(), -2, 2).to_vector<double>();
        for (int64_t i = call; i < n; i += 5) v[static_cast<size_t>(i)] = std::nan("");
        const Tensor x = tensor(v, {n}, dtype);
        Tensor xf = x.detach().set_requires_grad(), xe = x.detach().set_requires_grad();
        const Tensor yf = f(xf), ye = body(xe);
        F::sum(F::mul(yf, yf)).backward();
        F::sum(F::mul(ye, ye)).backward();
        CHECK(same(yf, ye));
        CHECK(same(xf.grad(), xe.grad()));
        const std::vector<double> y = yf.to_vector<double>(), g = xf.grad().to_vector<double>();
        for (size_t i = 0; i < v.size(); ++i) {
          CHECK(std::isnan(y[i]) == std::isnan(v[i]));
          CHECK(std::isnan(g[i]) == std::isnan(v[i]));
        }
      }
      CHECK(f.stats().verifications == 2);
      CHECK_THAT(f.schedule_text(), Contains("fused_elementwise"));
    }
  }
}

TEST_CASE("the fusion setting is read when a signature is traced", "[static][fusion]") {
  StaticEnabled on;
  auto f = static_graph([](const Tensor& x) { return F::sum(F::tanh(F::mul(x, 2.0))); },
                        {.name = "setting_at_trace"});
  const Tensor x = rand({6}).set_requires_grad();
  Tensor y;
  {
    const StaticFusion off(false);
    y = f(x);  // traced with fusion off ...
  }
  const StaticFusion fusion_on(true);
  y.backward();  // ... and planned here, at its first backward, with fusion on again
  f(x).backward();
  const std::string text = f.schedule_text();
  INFO(text);
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().hits == 1);
  CHECK_THAT(text, !Contains("fused_elementwise") && Contains("  tanh"));
}
