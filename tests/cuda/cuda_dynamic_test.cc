// Dynamic shapes on cuda:0: the MLP training step with its batch cycling through sizes becomes
// dynamic after two traces, every later size is planned from the recording without tracing, and
// the replays equal eager on the device bit for bit (losses, parameters, gradients). Each planned
// size has its own plan, so with CUDA graphs on it captures and launches graphs of its own;
// with graphs off it replays launch by launch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/cuda.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/static_models.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;

namespace {

// The batch of each step: 32 and 17 trace (the batch becomes dynamic at 17), 5, 64 and 100 are
// planned, the second 17 and 5 replay what the first ones made.
const std::vector<int64_t> kBatches = {32, 17, 5, 64, 17, 5, 100};

// Calls of each batch size in kBatches, by the signature of a planned size ("s0=5").
std::map<std::string, int64_t> calls_per_size() {
  std::map<std::string, int64_t> n;
  for (int64_t b : kBatches) ++n["s0=" + std::to_string(b)];
  return n;
}

std::shared_ptr<nn::Module> seeded_mlp() {
  manual_seed(3);
  auto m = std::make_shared<MlpNet>(784, 64, 10);
  m->to(kCuda);
  return m;
}

}  // namespace

TEST_CASE("MLP training on cuda with a dynamic batch equals eager bit for bit",
          "[cuda][static][dynamic]") {
  with_graphs_on_and_off([](bool graphs) {
    StaticEnabled on;
    const std::shared_ptr<nn::Module> eager_model = seeded_mlp(), traced_model = seeded_mlp();
    AdamStep eager(eager_model), traced(traced_model);
    auto fn = traced.make_static({.name = "mlp_step", .arg_names = {"x", "t"}});

    for (size_t k = 0; k < kBatches.size(); ++k) {
      INFO("step " << k << ", batch " << kBatches[k]);
      const Batch b = mlp_batches(1, kBatches[k], 784, 100 + k, kCuda)[0];
      const Tensor le = eager(b);
      const Tensor ls = fn(b.x, b.t);
      REQUIRE(ls.device() == kCuda);
      REQUIRE(bit_diff(le, ls) == "");
      check_same_parameters(*eager_model, *traced_model, "after the step");
    }

    const StaticStats st = fn.stats();
    CHECK(st.traces == 2);
    CHECK(st.dynamic_events == 1);
    CHECK(st.sizes_planned == 3);
    CHECK(st.eager_calls == 0);
    CHECK(st.hits == static_cast<int64_t>(kBatches.size()) - 2);
    CHECK(st.static_dims.empty());
    REQUIRE(st.dynamic.size() == 1);
    const DynamicReport& family = st.dynamic[0];
    INFO("family " << family.signature);
    CHECK(family.signature.find("x: float32[s0,784] cuda:0, t: int32[s0] cuda:0") !=
          std::string::npos);
    CHECK(family.sizes_planned == 3);

    // The planned sizes 5, 64 and 100, each with a plan (and graphs) of its own: every call of
    // one replayed it (the call that planned it included).
    REQUIRE(family.sizes.size() == 3);
    const std::map<std::string, int64_t> calls = calls_per_size();
    std::vector<std::string> seen;
    for (const EntryReport& e : family.sizes) {
      INFO("size " << e.signature);
      seen.push_back(e.signature);
      REQUIRE(calls.contains(e.signature));
      const int64_t n = calls.at(e.signature);
      CHECK(e.complete);
      CHECK(e.hits == n);
      check_graph_use(e, graphs, n);
    }
    std::sort(seen.begin(), seen.end());
    CHECK(seen == std::vector<std::string>{"s0=100", "s0=5", "s0=64"});
  });
}
