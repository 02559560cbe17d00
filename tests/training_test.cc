// End-to-end training of the 784-100-100-10 perceptron, and the allocator after it.
#include <catch2/catch.hpp>

#include "encore/encore.h"

using namespace encore;

namespace {

struct EpochResult {
  double test_accuracy = 0;
  double first_loss = 0;
  double last_loss = 0;
};

EpochResult train_one_epoch(nn::Module& model, const data::Dataset& train,
                            const data::Dataset& test, int64_t batch) {
  optim::Adam opt(model.parameters(), {.lr = 1e-3});
  data::BatchIterator it(train, batch, /*shuffle=*/true, /*seed=*/1);
  EpochResult r;
  Tensor x, t;
  int64_t step = 0;
  while (it.next(x, t)) {
    Tensor loss = F::softmax_cross_entropy(model(x), t);
    opt.zero_grad();
    loss.backward();
    opt.step();
    const double l = loss.item<double>();
    if (step++ == 0) r.first_loss = l;
    r.last_loss = l;
  }
  NoGradGuard no_grad;
  model.eval();
  r.test_accuracy = F::accuracy(model(test.images), test.labels).item<double>();
  model.train();
  return r;
}

}  // namespace

TEST_CASE("the MLP learns a synthetic task with Adam", "[training]") {
  manual_seed(0);
  const auto train = data::synthetic_classification(4000, 784, 10, /*seed=*/1);
  const auto test = data::synthetic_classification(1000, 784, 10, /*seed=*/2);
  auto model = nn::mlp(784, 100, 10);
  const EpochResult r = train_one_epoch(*model, train, test, 50);
  CHECK(r.last_loss < r.first_loss);
  CHECK(r.test_accuracy > 0.9);
}

TEST_CASE("the MLP reaches 80% on Fashion-MNIST within one epoch", "[training][dataset]") {
  if (!data::idx_dataset_available(ENCORE_FASHION_MNIST_DIR)) {
    WARN("Fashion-MNIST not installed at " ENCORE_FASHION_MNIST_DIR
         " (apt-get install dataset-fashion-mnist); covered by the synthetic test only");
    return;
  }
  manual_seed(0);
  const auto train = data::load_idx_dataset(ENCORE_FASHION_MNIST_DIR, data::Split::Train);
  const auto test = data::load_idx_dataset(ENCORE_FASHION_MNIST_DIR, data::Split::Test);
  auto model = nn::mlp(784, 100, 10);
  const EpochResult r = train_one_epoch(*model, train, test, 100);
  INFO("test accuracy " << r.test_accuracy);
  CHECK(r.test_accuracy >= 0.80);
}

TEST_CASE("the allocator returns to its starting point after training", "[training][memory]") {
  Allocator& alloc = allocator_for(Device::cpu());
  const AllocatorStats before = alloc.stats();
  {
    manual_seed(0);
    const auto train = data::synthetic_classification(512, 32, 4, 3);
    auto model = nn::mlp(32, 16, 4);
    optim::Adam adam(model->parameters());
    data::BatchIterator it(train, 64, true, 0);
    Tensor x, t;
    int64_t steps_done = 0;
    AllocatorStats after_first_epoch;
    for (int epoch = 0; epoch < 3; ++epoch) {
      while (it.next(x, t)) {
        Tensor loss = F::softmax_cross_entropy((*model)(x), t);
        adam.zero_grad();
        loss.backward();
        adam.step();
        ++steps_done;
      }
      if (epoch == 0) after_first_epoch = alloc.stats();
    }
    CHECK(steps_done == 24);
    // Steady state: later epochs are served entirely from the cache.
    CHECK(alloc.stats().system_allocations == after_first_epoch.system_allocations);
    CHECK(alloc.stats().bytes_in_use > before.bytes_in_use);
  }
  CHECK(alloc.stats().bytes_in_use == before.bytes_in_use);
  CHECK(alloc.stats().live_blocks == before.live_blocks);
}
