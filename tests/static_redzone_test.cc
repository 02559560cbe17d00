// Arena red zones (set_static_redzones_enabled, ENCORE_STATIC_REDZONE=1, verify mode): replays
// with guard bytes after every arena block give eager's bits, the schedule dump shows the guards,
// and a kernel writing past the end of its output is caught after its step with an Error naming
// the step and the buffer.
#include <catch2/catch.hpp>

#include <regex>
#include <string>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/dispatcher.h"
#include "runtime/env.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

using namespace encore;
using Catch::Matchers::Contains;
using testing::StaticEnabled;

namespace {

using RedZones = testing::SwitchScope<set_static_redzones_enabled>;

// A matmul kernel that, while `overrun` is set, writes one byte past the end of its output after
// computing it: inside the arena, where red zones see it and AddressSanitizer cannot. It is set
// only around replays with red zones, whose guard takes the byte.
KernelFn g_matmul = nullptr;
bool g_overrun = false;

void overrunning_matmul(const KernelArgs& a) {
  g_matmul(a);
  if (!g_overrun) return;
  const BufferView& out = a.out[0];
  static_cast<unsigned char*>(out.data)[out.numel() * static_cast<int64_t>(itemsize(out.dtype))] =
      0;
}

// Puts overrunning_matmul in place of the cpu matmul kernel for a scope.
struct OverrunningMatmul {
  OverrunningMatmul() {
    g_matmul = lookup_kernel(Op::Matmul, DeviceType::CPU);
    register_kernel(Op::Matmul, DeviceType::CPU, &overrunning_matmul);
  }
  ~OverrunningMatmul() {
    register_kernel(Op::Matmul, DeviceType::CPU, g_matmul);
    g_overrun = false;
  }
};

int64_t arena_of(const StaticStats& s) {
  REQUIRE(s.cache.size() == 1);
  return s.cache[0].arena_bytes;
}

}  // namespace

TEST_CASE("red zones give eager's bits and show in the schedule", "[static][redzone]") {
  int64_t arena_off = 0, arena_on = 0;
  {
    const RedZones off(false);
    arena_off = arena_of(testing::check_mlp_function_form(Device::cpu()).stats);
  }
  {
    const RedZones on(true);
    const testing::StaticRun run = testing::check_mlp_function_form(Device::cpu());
    arena_on = arena_of(run.stats);
    INFO(run.schedule);
    CHECK_THAT(run.schedule, Contains("red zones: 64 guard bytes after each arena block"));
    CHECK(
        std::regex_search(run.schedule, std::regex(R"(arena \[\d+,\d+\), red zone \[\d+,\d+\))")));
    // A forward and a backward through the module's subgraph node, replayed.
    const StaticStats s = testing::check_mlp_module_form(Device::cpu());
    CHECK(s.cache[0].arena_bytes > 0);
  }
  CHECK(arena_on > arena_off);
}

TEST_CASE("the red-zone switch starts as ENCORE_STATIC_REDZONE says", "[static][redzone]") {
  const bool on = encore::env::flag("ENCORE_STATIC_REDZONE", false);
  CHECK(static_redzones_enabled() == on);
  const RedZones flipped(!on);
  CHECK(static_redzones_enabled() == !on);
}

TEST_CASE("verify mode puts red zones in its plans", "[static][redzone]") {
  StaticEnabled on_static;
  const RedZones off(false);
  auto body = [](const Tensor& x, const Tensor& w) { return F::relu(F::matmul(x, w)) * 2.0; };
  auto verified = static_graph(body, {.name = "verified", .verify_every = 1});
  auto plain = static_graph(body, {.name = "plain"});
  const Tensor x = rand({4, 8}, DType::Float32, Device::cpu(), -1, 1);
  const Tensor w = rand({8, 6}, DType::Float32, Device::cpu(), -1, 1);
  for (int call = 0; call < 3; ++call) CHECK(testing::bit_diff(verified(x, w), plain(x, w)) == "");
  CHECK_THAT(verified.schedule_text(), Contains("red zones"));
  CHECK_THAT(plain.schedule_text(), !Contains("red zones"));
}

TEST_CASE("a step writing past its output is caught by its red zone", "[static][redzone]") {
  StaticEnabled on_static;
  const RedZones on(true);
  const OverrunningMatmul bad;
  auto f =
      static_graph([](const Tensor& x, const Tensor& w) { return F::relu(F::matmul(x, w)) * 2.0; },
                   {.name = "overrun", .arg_names = {"x", "w"}});
  const Tensor x = rand({4, 8}, DType::Float32, Device::cpu(), -1, 1);
  const Tensor w = rand({8, 6}, DType::Float32, Device::cpu(), -1, 1);
  const Tensor expected = f(x, w);  // the trace runs eagerly: no overrun outside the arena
  const std::string text = f.schedule_text();
  INFO(text);
  // The matmul's output: a 4x6 float32 block of the arena, 96 bytes, its guard right after.
  std::smatch m;
  REQUIRE(std::regex_search(
      text, m,
      std::regex(
          R"(matmul[^\n]*\n(?:[^\n]*in [^\n]*\n)*\s+out 0\s+(b\d+)\s+float32\[4,6\]\s+arena)")));
  const std::string buffer = m[1];

  g_overrun = true;
  const std::string error = testing::error_of([&] { f(x, w); });
  g_overrun = false;
  CHECK_THAT(error, Contains("red zone: forward step 0 (matmul) wrote past the end of buffer " +
                             buffer + " (arena ["));
  CHECK_THAT(error, Contains("holds 0x00"));
  // The guard is filled again: the next replay without the overrun passes and computes as before.
  CHECK(testing::bit_diff(f(x, w), expected) == "");
  CHECK(f.stats().traces == 1);
}
