// Resuming from a checkpoint is exact: N steps, save, load into a fresh model, optimizer and
// generator state, M more steps give the bits of N + M steps without a break, eagerly and with
// the training step as a static function.
#include <catch2/catch.hpp>

#include "checkpoint_resume.h"

using namespace encore;
using namespace encore::testing;

namespace {

std::unique_ptr<optim::Optimizer> momentum(nn::Module& m) {
  return std::make_unique<optim::MomentumSGD>(m.parameters(),
                                              optim::MomentumSGDOptions{.lr = 0.05});
}

}  // namespace

TEST_CASE("checkpoint: an MLP with dropout and Adam resumes bit for bit", "[checkpoint]") {
  const bool as_static = GENERATE(false, true);
  INFO((as_static ? "static step" : "eager step"));
  check_resume(mlp_with_dropout, adam, 16, as_static);
}

TEST_CASE("checkpoint: nn::mlp with MomentumSGD resumes bit for bit", "[checkpoint]") {
  const bool as_static = GENERATE(false, true);
  INFO((as_static ? "static step" : "eager step"));
  check_resume([] { return nn::mlp(16, 12, 10); }, momentum, 16, as_static);
}

TEST_CASE("checkpoint: SeedCnn with Adam resumes bit for bit", "[checkpoint]") {
  const bool as_static = GENERATE(false, true);
  INFO((as_static ? "static step" : "eager step"));
  check_resume([] { return std::make_shared<models::SeedCnn>(2); }, adam, 784, as_static);
}

TEST_CASE("checkpoint: without the generator state, dropout draws other masks", "[checkpoint]") {
  // The control of the dropout test above: the generator's state is what makes it exact.
  const Batches data = batches(2, 8, 16);
  TempPath dir("nogen");
  const std::string path = dir.file("run.safetensors");
  manual_seed(11);
  auto a = mlp_with_dropout();
  auto a_opt = adam(*a);
  train(*a, *a_opt, data, 0, 1, false);
  save(path, *a, a_opt.get());
  train(*a, *a_opt, data, 1, 2, false);
  manual_seed(99);
  auto b = mlp_with_dropout();
  auto b_opt = adam(*b);
  load(path, *b, b_opt.get());
  train(*b, *b_opt, data, 1, 2, false);
  CHECK(Snapshot(*b, nullptr, nullptr).diff(Snapshot(*a, nullptr, nullptr)) != "");
}
