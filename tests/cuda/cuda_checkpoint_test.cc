// Checkpoints on cuda:0: N training steps, save, load into a fresh model and optimizer on the
// device, M more steps equal N + M steps straight, bit for bit, eagerly and as a static step
// (with CUDA graphs on and off). The tensors are copied through the host on save and load.
#include <catch2/catch.hpp>

#include "tests/checkpoint_resume.h"
#include "tests/cuda/cuda_test_util.h"

using namespace encore;
using namespace encore::testing;

TEST_CASE("cuda checkpoint: an MLP with dropout and Adam resumes bit for bit",
          "[cuda][checkpoint]") {
  const bool as_static = GENERATE(false, true);
  INFO((as_static ? "static step" : "eager step"));
  with_graphs_on_and_off(
      [&](bool) {
        KeepGenerators keep;
        check_resume(mlp_with_dropout, adam, 16, as_static, kCuda);
      },
      /*replays=*/as_static);
}

TEST_CASE("cuda checkpoint: SeedCnn with Adam resumes bit for bit", "[cuda][checkpoint]") {
  const bool as_static = GENERATE(false, true);
  INFO((as_static ? "static step" : "eager step"));
  with_graphs_on_and_off(
      [&](bool) {
        KeepGenerators keep;
        check_resume([] { return std::make_shared<models::SeedCnn>(2); }, adam, 784, as_static,
                     kCuda);
      },
      /*replays=*/as_static);
}
