// Trains the 784-100-100-10 perceptron on Fashion-MNIST with Adam and prints one row per epoch.
// The training step (forward, loss, backward, Adam) is a static function: traced on its first
// call, replayed after; --eager (or ENCORE_STATIC=0) runs it op by op instead.
//
//   build/samples/train_mlp --epochs 5
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "encore/encore.h"

using namespace encore;

namespace {

struct Flags {
  std::string data_dir = data::kFashionMnistDir;
  int64_t epochs = 5;
  int64_t batch = 100;
  uint64_t seed = 0;
  bool eager = false;
};

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: train_mlp [--data DIR] [--epochs N] [--batch N] [--seed N] [--eager]\n"
               "Trains a 784-100-100-10 MLP with Adam (lr 1e-3) on Fashion-MNIST.\n"
               "  --data DIR   directory of the IDX files (default %s)\n"
               "  --epochs N   epochs to train (default 5)\n"
               "  --batch N    minibatch size (default 100)\n"
               "  --seed N     seed for initialisation and shuffling (default 0)\n"
               "  --eager      run the training step eagerly instead of as a static graph\n",
               data::kFashionMnistDir);
}

int64_t parse_int(std::string_view flag, const char* text, int64_t min) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < min) {
    std::fprintf(stderr, "train_mlp: %.*s needs an integer >= %lld, got '%s'\n",
                 static_cast<int>(flag.size()), flag.data(), static_cast<long long>(min), text);
    std::exit(2);
  }
  return v;
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(stdout);
      std::exit(0);
    }
    if (a == "--eager") {
      f.eager = true;
      continue;
    }
    if (i + 1 >= argc || (a != "--data" && a != "--epochs" && a != "--batch" && a != "--seed")) {
      std::fprintf(stderr, "train_mlp: unknown flag or missing value: %s\n", argv[i]);
      usage(stderr);
      std::exit(2);
    }
    const char* v = argv[++i];
    if (a == "--data") f.data_dir = v;
    if (a == "--epochs") f.epochs = parse_int(a, v, 1);
    if (a == "--batch") f.batch = parse_int(a, v, 1);
    if (a == "--seed") f.seed = static_cast<uint64_t>(parse_int(a, v, 0));
  }
  return f;
}

// Redraws "epoch e [=====>    ] i/n" on stderr.
void draw_progress(int64_t epoch, int64_t done, int64_t total) {
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done / (total ? total : 1));
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar += '>';
  bar.resize(kWidth, ' ');
  std::fprintf(stderr, "\repoch %lld [%s] %lld/%lld", static_cast<long long>(epoch), bar.c_str(),
               static_cast<long long>(done), static_cast<long long>(total));
  std::fflush(stderr);
}

struct Eval {
  double loss = 0;
  double accuracy = 0;
};

Eval evaluate(nn::Module& model, const data::Dataset& ds) {
  NoGradGuard no_grad;
  model.eval();
  data::BatchIterator it(ds, 1000, /*shuffle=*/false);
  Tensor x, t;
  Eval e;
  while (it.next(x, t)) {
    Tensor logits = model(x);
    const auto b = static_cast<double>(t.size(0));
    e.loss += F::softmax_cross_entropy(logits, t).item<double>() * b;
    e.accuracy += F::accuracy(logits, t).item<double>() * b;
  }
  model.train();
  const auto n = static_cast<double>(ds.size());
  return {e.loss / n, e.accuracy / n};
}

int run(const Flags& flags) {
  if (!data::idx_dataset_available(flags.data_dir)) {
    std::fprintf(stderr,
                 "train_mlp: Fashion-MNIST not found in %s\n"
                 "Install it with:  sudo apt-get install dataset-fashion-mnist\n"
                 "or pass --data DIR with train-images-idx3-ubyte[.gz], "
                 "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz] and "
                 "t10k-labels-idx1-ubyte[.gz].\n",
                 flags.data_dir.c_str());
    return 1;
  }
  const data::Dataset train = data::load_idx_dataset(flags.data_dir, data::Split::Train);
  const data::Dataset test = data::load_idx_dataset(flags.data_dir, data::Split::Test);
  std::printf("Fashion-MNIST from %s: %lld train, %lld test samples\n", flags.data_dir.c_str(),
              static_cast<long long>(train.size()), static_cast<long long>(test.size()));

  manual_seed(flags.seed);
  auto model = nn::mlp(784, 100, 10);
  optim::Adam opt(model->parameters(), {.lr = 1e-3});
  data::BatchIterator batches(train, flags.batch, /*shuffle=*/true, flags.seed);
  if (flags.eager) set_static_enabled(false);
  // The whole step as one static function: later calls replay its schedule.
  auto train_step = static_graph(
      [&](const Tensor& x, const Tensor& t) {
        Tensor loss = F::softmax_cross_entropy((*model)(x), t);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
      },
      {.name = "train_step", .arg_names = {"x", "t"}, .modules = {model}});
  std::printf("model %s, Adam lr 1e-3, batch %lld, step %s\n\n", model->describe().c_str(),
              static_cast<long long>(flags.batch),
              static_enabled() ? "static (traced once, then replayed)" : "eager");

  const bool progress = ::isatty(STDERR_FILENO) == 1;
  const int64_t per_epoch = batches.batches_per_epoch();
  std::printf("%5s | %9s | %10s | %9s | %8s\n", "epoch", "elapsed s", "train loss", "test loss",
              "test acc");
  std::printf("------+-----------+------------+-----------+---------\n");
  std::fflush(stdout);

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (int64_t epoch = 1; epoch <= flags.epochs; ++epoch) {
    double loss_sum = 0;
    int64_t samples = 0, step = 0;
    Tensor x, t;
    while (batches.next(x, t)) {
      Tensor loss = train_step(x, t);
      loss_sum += loss.item<double>() * static_cast<double>(t.size(0));
      samples += t.size(0);
      if (progress && (++step % 10 == 0 || step == per_epoch))
        draw_progress(epoch, step, per_epoch);
    }
    if (progress) std::fprintf(stderr, "\r%*s\r", 60, "");
    const Eval e = evaluate(*model, test);
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("%5lld | %9.2f | %10.4f | %9.4f | %8.4f\n", static_cast<long long>(epoch), elapsed,
                loss_sum / static_cast<double>(samples), e.loss, e.accuracy);
    std::fflush(stdout);
  }

  const StaticStats st = train_step.stats();
  std::printf("\ntrain_step: %lld calls, %lld traced, %lld replayed, %lld eager",
              static_cast<long long>(st.calls), static_cast<long long>(st.traces),
              static_cast<long long>(st.hits), static_cast<long long>(st.eager_calls));
  for (const EntryReport& r : st.cache)
    std::printf("; arena %.1f KiB (lower bound %.1f KiB, naive %.1f KiB) for %s",
                static_cast<double>(r.arena_bytes) / 1024,
                static_cast<double>(r.lower_bound_bytes) / 1024,
                static_cast<double>(r.naive_bytes) / 1024, r.signature.c_str());
  std::printf("\n");
  const AllocatorStats s = allocator_for(Device::cpu()).stats();
  std::printf(
      "\ncpu allocator: peak %.2f MiB, in use %.2f MiB, %lld allocations, %lld from the "
      "system\n",
      static_cast<double>(s.peak_bytes) / (1 << 20),
      static_cast<double>(s.bytes_in_use) / (1 << 20), static_cast<long long>(s.allocation_count),
      static_cast<long long>(s.system_allocations));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  try {
    return run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  }
}
