// Optimizer updates on cuda:0 (tests/optim_foreach.h): foreach, on by default here, runs a call's
// parameters in one launch per 48 (Adam's step counts counted by it) and gives the bits of one
// call per parameter; a static whole step holds one update step and replays eager's bits, as CUDA
// graphs and on the stream. A negative step count is an Error at the next wait.
#include <catch2/catch.hpp>

#include "tests/cuda/cuda_test_util.h"
#include "tests/optim_foreach.h"

using namespace encore;
using namespace encore::testing;

TEST_CASE("foreach optimizer updates on cuda equal one call per parameter bit for bit",
          "[cuda][optim]") {
  check_foreach_equals_loop(kCuda);
  // The default on cuda is foreach: one call for both parameters.
  Tensor p = randn({4}, DType::Float32, kCuda).set_requires_grad();
  Tensor q = randn({300}, DType::Float32, kCuda).set_requires_grad();
  optim::Adam adam({p, q});
  p.set_grad(ones({4}, DType::Float32, kCuda));
  q.set_grad(ones({300}, DType::Float32, kCuda));
  UpdateCounter counter;
  adam.step();
  CHECK(counter.parameters_per_call == std::vector<int>{2});
}

TEST_CASE("a static whole step with a foreach update on cuda replays eager's bits",
          "[cuda][optim][static]") {
  for (const bool fold : {false, true}) {
    INFO("fold " << fold);
    with_graphs_on_and_off([fold](bool graphs) {
      const StaticStats s = check_foreach_whole_step(kCuda, 0, fold);
      check_graph_use(s.cache[0], graphs, 5);
    });
    const StaticStats verified = check_foreach_whole_step(kCuda, /*verify_every=*/1, fold);
    CHECK(verified.verifications == 5);
  }
}

TEST_CASE("a negative Adam step count on cuda is an Error at the next wait", "[cuda][optim]") {
  // Counts in [0, 2^44) are kept by the update's blocks (kernels/cuda/step_counter.cuh); a
  // negative count loaded into the state (or a huge one: 2^60) is reported for its parameter.
  for (const double bad : {-1.0, 1152921504606846976.0}) {
    INFO("count " << bad);
    Tensor p = randn({300}, DType::Float32, kCuda).set_requires_grad();
    Tensor q = randn({70000}, DType::Float32, kCuda).set_requires_grad();
    optim::Adam adam({p, q});
    p.set_grad(ones({300}, DType::Float32, kCuda));
    q.set_grad(ones({70000}, DType::Float32, kCuda));
    adam.step();
    cuda::synchronize();
    for (const optim::StateSlot& s : adam.state_slots())
      if (s.name == "1.t") *s.tensor = full({}, bad, DType::Int64, kCuda);
    adam.step();
    CHECK_THROWS_WITH(cuda::synchronize(),
                      Catch::Matchers::Contains("adam_update") &&
                          Catch::Matchers::Contains("step count of parameter 1 of the call"));
    cuda::synchronize();  // reported once
  }
}
