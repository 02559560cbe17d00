// A loss's gradient and the product reading it as one LossGradMatmul step on the cpu
// (schedule/rewrites.cc; the scenarios: loss_fold_cases.h), at one and two threads.
#include <catch2/catch.hpp>

#include "tests/loss_fold_cases.h"

using namespace encore;
using namespace encore::testing;

TEST_CASE("a loss's gradient and the product reading it run as one step with eager's bits",
          "[static][fold]") {
  for (const int threads : {1, 2}) {
    INFO(threads << " threads");
    const ThreadCount t(threads);
    check_loss_grad_folds(Device::cpu());
  }
}

TEST_CASE("a bad label in a replayed loss gradient fold is the cpu's Error, and replays go on",
          "[static][fold]") {
  check_loss_grad_fold_bad_label(Device::cpu());
}
