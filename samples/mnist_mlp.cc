// Chainer's MNIST example: a 784-1000-1000-10 perceptron trained with Adam at batch 100, here on
// Fashion-MNIST (or any IDX set with --data). --static makes the whole training step (forward,
// loss, backward, Adam) one static function: traced on its first call, replayed after.
// --save PATH checkpoints after every epoch; --resume PATH goes on from such a checkpoint.
// --distributed trains data-parallel over the processes mpirun starts: each reads its shard of
// every epoch and the gradients are averaged (dist::DataParallel); every rank prints its
// throughput and its final accuracy, which are the same model's on every rank.
//
//   build/samples/mnist_mlp --epochs 5 --static
//   mpirun -np 2 build/samples/mnist_mlp --distributed --static
//   build/samples/mnist_mlp --epochs 2 --save run.safetensors   # then:
//   build/samples/mnist_mlp --epochs 3 --resume run.safetensors
#include <cstdio>
#include <exception>
#include <string>

#include "encore/dist.h"
#include "encore/encore.h"
#include "samples/common.h"

using namespace encore;

int main(int argc, char** argv) {
  std::string dir = data::kFashionMnistDir, device_name = "cpu";
  int64_t epochs = 5, batch = 100, unit = 1000, seed = 0, limit = 0;
  bool static_step = false, distributed = false;
  samples::Cli cli("mnist_mlp",
                   "Trains Chainer's MNIST MLP (784-unit-unit-10, Adam lr 1e-3) on Fashion-MNIST.");
  cli.text("data", &dir, "directory of the IDX files");
  cli.integer("epochs", &epochs, 1, "epochs to train");
  cli.integer("batch", &batch, 1, "minibatch size");
  cli.integer("unit", &unit, 1, "hidden units per layer");
  cli.integer("seed", &seed, 0, "seed for initialisation and shuffling");
  cli.integer("limit", &limit, 0, "use only the first N samples of each split (0: all)");
  cli.flag("static", &static_step, "run the training step as a static graph");
  cli.flag("distributed", &distributed,
           "train data-parallel over the processes of mpirun (a plain run is one process)");
  cli.text("device", &device_name, "cpu, or cuda / cuda:N to train on a GPU");
  samples::Checkpointing checkpoints;
  checkpoints.add_flags(cli);
  cli.parse(argc, argv);
  try {
    const auto [train_set, test_set] = samples::load_or_exit("mnist_mlp", dir, limit);
    manual_seed(static_cast<uint64_t>(seed));
    auto model = nn::mlp(784, unit, 10);
    const Device device = Device::parse(device_name);
    model->to(device);  // before the optimizer takes the parameters
    optim::Adam opt(model->parameters(), {.lr = 1e-3});
    checkpoints.resume(*model, opt, device);
    data::BatchIterator batches(train_set, batch, /*shuffle=*/true, static_cast<uint64_t>(seed));
    batches.set_device(device);
    if (distributed) dist::init();
    const int rank = distributed ? dist::rank() : 0, ranks = distributed ? dist::world_size() : 1;
    // Rank 0's parameters everywhere, gradients averaged; one seed, so the shards are disjoint.
    std::unique_ptr<dist::DataParallel> ddp;
    if (distributed) {
      ddp = std::make_unique<dist::DataParallel>(*model);
      batches.set_shard(rank, ranks);
    }
    const bool lead = rank == 0;  // prints the table and saves checkpoints
    auto step_fn = [&](const Tensor& x, const Tensor& t) {
      Tensor loss = F::softmax_cross_entropy((*model)(x), t);
      opt.zero_grad();
      loss.backward();
      opt.step();
      return loss;
    };
    auto static_step_fn =
        static_graph(step_fn, {.name = "train_step", .arg_names = {"x", "t"}, .modules = {model}});
    if (lead)
      std::printf("model %s on %s, Adam lr 1e-3, batch %lld%s, step %s\n\n",
                  model->describe().c_str(), device.str().c_str(), static_cast<long long>(batch),
                  distributed ? cat(" per rank, ", ranks, " ranks").c_str() : "",
                  static_step ? "static (traced once, then replayed)" : "eager");

    if (lead) samples::print_table_header();
    const samples::Progress progress(batches.batches_per_epoch());
    const auto start = samples::Clock::now();
    int64_t trained = 0;  // samples this rank trained on
    samples::Eval result;
    for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
      double loss_sum = 0;
      int64_t seen = 0, i = 0;
      Tensor x, t;
      while (batches.next(x, t)) {
        Tensor loss = static_step ? static_step_fn(x, t) : step_fn(x, t);
        loss_sum += loss.item<double>() * static_cast<double>(t.size(0));
        seen += t.size(0);
        if (lead) progress.update(epoch, ++i);
      }
      trained += seen;
      if (lead) progress.clear();
      result = samples::evaluate(*model, test_set);
      if (lead) {
        samples::print_table_row(epoch, samples::seconds_since(start),
                                 loss_sum / static_cast<double>(seen), result);
        checkpoints.save_epoch(*model, opt, device);
      }
    }
    if (distributed) {
      // Every rank's line: the accuracies are one model's, so they agree to the last digit.
      if (lead) std::printf("\n");
      std::fflush(stdout);
      dist::barrier();
      std::printf("rank %d of %d: %.0f samples/s, final test accuracy %.4f\n", rank, ranks,
                  static_cast<double>(trained) / samples::seconds_since(start), result.accuracy);
      std::fflush(stdout);
    }
    if (static_step && lead) {
      const StaticStats st = static_step_fn.stats();
      std::printf("\ntrain_step: %lld calls, %lld traces, %lld replays\n",
                  static_cast<long long>(st.calls), static_cast<long long>(st.traces),
                  static_cast<long long>(st.hits));
      samples::print_entries(st);
    }
    const AllocatorStats s = allocator_for(device).stats();
    if (lead)
      std::printf("%s allocator: peak %.2f MiB, %lld allocations, %lld from the system\n",
                device.str().c_str(), static_cast<double>(s.peak_bytes) / (1 << 20),
                static_cast<long long>(s.allocation_count),
                static_cast<long long>(s.system_allocations));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mnist_mlp: %s\n", e.what());
    return 1;
  }
}
