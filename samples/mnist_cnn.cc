// The seed CNN of Chainer's static-subgraph example (three 3x3 convolutions with 8 channels,
// ReLU, 2x2 max pooling, a linear layer; SGD, batch 32) on Fashion-MNIST. --static marks its
// forward static with one line (StaticSeedCnn below), as the reference's @static_graph does;
// --compare trains one epoch each way from the same seed and prints a summary.
//
//   build/samples/mnist_cnn --epochs 2 --static
//   build/samples/mnist_cnn --compare
//   build/samples/mnist_cnn --static --limit 3200 --profile cnn.json --schedule cnn.txt
//
// --profile writes a Chrome trace (ui.perfetto.dev) and prints the per-op table of the run;
// --schedule writes the static forward's schedules as text and as Graphviz DOT (PATH.dot).
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <string>

#include "encore/encore.h"
#include "samples/common.h"

using namespace encore;
using samples::Clock;

namespace {

// The whole difference between the eager and the static model: one line.
struct StaticSeedCnn : models::SeedCnn {
  ENCORE_STATIC_GRAPH({.name = "seed_cnn", .arg_names = {"x"}});
};

struct Flags {
  std::string data = data::kFashionMnistDir;
  std::string profile, schedule, device = "cpu";
  int64_t epochs = 1, batch = 32, seed = 0, limit = 0;
  bool static_forward = false, compare = false;
};

struct RunResult {
  double seconds = 0;       // training time of the last epoch (no evaluation)
  samples::Eval test;       // after the last epoch
  int64_t traces = 0;       // static: traces of the forward (train and eval signatures)
  int64_t arena_bytes = 0;  // static: arena of the training entry
  int64_t step_peak = 0;    // allocator peak over one training step, above what was in use
};

// Bytes the allocator's peak rose above what was in use before one call of `step`.
template <typename Step>
int64_t step_peak_bytes(Device device, Step&& step) {
  Allocator& a = allocator_for(device);
  a.reset_peak();
  const int64_t before = a.stats().bytes_in_use;
  step();
  return a.stats().peak_bytes - before;
}

RunResult train(const Flags& f, bool static_forward, const data::Dataset& train_set,
                const data::Dataset& test_set, bool verbose) {
  manual_seed(static_cast<uint64_t>(f.seed));
  std::shared_ptr<models::SeedCnn> model =
      static_forward ? std::make_shared<StaticSeedCnn>() : std::make_shared<models::SeedCnn>();
  const Device device = Device::parse(f.device);
  model->to(device);  // before the optimizer takes the parameters
  optim::SGD opt(model->parameters(), {.lr = 0.01});
  data::BatchIterator batches(train_set, f.batch, /*shuffle=*/true, static_cast<uint64_t>(f.seed));
  batches.set_device(device);
  auto step = [&](const Tensor& x, const Tensor& t) {
    Tensor loss = F::softmax_cross_entropy((*model)(x), t);
    model->zero_grad();
    loss.backward();
    opt.step();
    return loss;
  };
  if (verbose) {
    std::printf("model %s on %s, SGD lr 0.01, batch %lld, forward %s\n\n",
                model->describe().c_str(), device.str().c_str(), static_cast<long long>(f.batch),
                static_forward ? "static (ENCORE_STATIC_GRAPH)" : "eager");
    samples::print_table_header();
  }
  RunResult r;
  const samples::Progress progress(batches.batches_per_epoch());
  const auto start = Clock::now();
  for (int64_t epoch = 1; epoch <= f.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    double loss_sum = 0;
    int64_t seen = 0, i = 0;
    Tensor x, t;
    while (batches.next(x, t)) {
      Tensor loss;
      // Step 3 (traced at step 1, replayed from step 2 when static) is measured.
      if (++i == 3)
        r.step_peak = step_peak_bytes(device, [&] { loss = step(x, t); });
      else
        loss = step(x, t);
      loss_sum += loss.item<double>() * static_cast<double>(t.size(0));
      seen += t.size(0);
      progress.update(epoch, i);
    }
    progress.clear();
    r.seconds = samples::seconds_since(epoch_start);
    r.test = samples::evaluate(*model, test_set);
    if (verbose)
      samples::print_table_row(epoch, samples::seconds_since(start),
                               loss_sum / static_cast<double>(seen), r.test);
  }
  if (static_forward) {
    const StaticStats st = static_stats(*model);
    r.traces = st.traces;
    for (const EntryReport& e : st.cache)
      if (e.signature.find("train") != std::string::npos) r.arena_bytes = e.arena_bytes;
    if (verbose) {
      std::printf(
          "\nseed_cnn: %lld calls, %lld traces (retraces after the first: %lld), %lld "
          "replays\n",
          static_cast<long long>(st.calls), static_cast<long long>(st.traces),
          static_cast<long long>(st.traces > 0 ? st.traces - 1 : 0),
          static_cast<long long>(st.hits));
      samples::print_entries(st);
    }
  }
  if (verbose)
    std::printf("training step: allocator peak %s above the bytes in use before it\n",
                samples::kib(r.step_peak).c_str());
  if (static_forward && !f.schedule.empty()) {
    std::ofstream(f.schedule) << static_schedule_text(*model);
    std::ofstream(f.schedule + ".dot") << static_schedule_dot(*model);
    std::printf("schedules written to %s and %s.dot\n", f.schedule.c_str(), f.schedule.c_str());
  }
  return r;
}

void compare(const Flags& f, const data::Dataset& train_set, const data::Dataset& test_set) {
  Flags one = f;
  one.epochs = 1;
  std::printf("seed CNN, one epoch eager, then one epoch with its forward static, same seed\n");
  std::printf("eager ...\n");
  std::fflush(stdout);
  const RunResult e = train(one, false, train_set, test_set, false);
  std::printf("static ...\n\n");
  std::fflush(stdout);
  const RunResult s = train(one, true, train_set, test_set, false);
  std::printf("%-7s | %11s | %9s | %8s | %17s\n", "forward", "s per epoch", "test loss", "test acc",
              "memory per step");
  std::printf("--------+-------------+-----------+----------+------------------\n");
  std::printf("%-7s | %11.2f | %9.4f | %8.4f | peak %12s\n", "eager", e.seconds, e.test.loss,
              e.test.accuracy, samples::kib(e.step_peak).c_str());
  std::printf("%-7s | %11.2f | %9.4f | %8.4f | arena %11s\n", "static", s.seconds, s.test.loss,
              s.test.accuracy, samples::kib(s.arena_bytes).c_str());
  std::printf(
      "\nspeedup %.2fx (eager time / static time); traces %lld (one train, one eval "
      "signature; retraces after the first: %lld); static step peak %s\n",
      e.seconds / s.seconds, static_cast<long long>(s.traces),
      static_cast<long long>(s.traces > 0 ? s.traces - 1 : 0), samples::kib(s.step_peak).c_str());
  std::printf("results %s\n", e.test.loss == s.test.loss && e.test.accuracy == s.test.accuracy
                                  ? "identical (bit for bit)"
                                  : "DIFFER");
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  samples::Cli cli("mnist_cnn",
                   "Trains Chainer's seed CNN (3 x conv3x3 8ch, relu, maxpool 2, linear) with SGD "
                   "on Fashion-MNIST.");
  cli.text("data", &f.data, "directory of the IDX files");
  cli.integer("epochs", &f.epochs, 1, "epochs to train");
  cli.integer("batch", &f.batch, 1, "minibatch size");
  cli.integer("seed", &f.seed, 0, "seed for initialisation and shuffling");
  cli.integer("limit", &f.limit, 0, "use only the first N samples of each split (0: all)");
  cli.flag("static", &f.static_forward, "mark the model's forward static (ENCORE_STATIC_GRAPH)");
  cli.flag("compare", &f.compare,
           "train one epoch eager and one static from the same seed and compare");
  cli.text("profile", &f.profile, "profile the run: Chrome trace to this file, op table printed");
  cli.text("schedule", &f.schedule, "with --static: write the schedules here (text) and .dot");
  cli.text("device", &f.device, "cpu, or cuda / cuda:N to train on a GPU");
  cli.parse(argc, argv);
  try {
    const auto [train_set, test_set] = samples::load_or_exit("mnist_cnn", f.data, f.limit);
    if (!f.profile.empty()) profiler::start();
    if (f.compare)
      compare(f, train_set, test_set);
    else
      train(f, f.static_forward, train_set, test_set, true);
    if (!f.profile.empty()) {
      const profiler::Profile p = profiler::stop();
      std::printf("\nprofile (trace written to %s):\n%s", f.profile.c_str(), p.table(15).c_str());
      p.write_chrome_trace(f.profile);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mnist_cnn: %s\n", e.what());
    return 1;
  }
}
