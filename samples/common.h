// What the samples share: a small command-line parser with --help, the Fashion-MNIST loader
// with its install hint, a progress bar, evaluation and the per-epoch table.
#pragma once

#include <unistd.h>
#include <cmath>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "encore/encore.h"

namespace encore::samples {

// Flags of the form `--name value` or `--name` (booleans); --help prints the usage and exits.
class Cli {
 public:
  Cli(std::string program, std::string summary)
      : program_(std::move(program)), summary_(std::move(summary)) {}

  void flag(std::string name, bool* target, std::string help) {
    opts_.push_back(
        {std::move(name), std::move(help), "", [target](const char*) { *target = true; }, false});
  }
  void integer(std::string name, int64_t* target, int64_t min, std::string help) {
    const std::string n = name;
    opts_.push_back({std::move(name), std::move(help), std::to_string(*target),
                     [this, n, target, min](const char* v) {
                       char* end = nullptr;
                       errno = 0;
                       const long long x = std::strtoll(v, &end, 10);
                       if (end == v || *end != '\0' || errno == ERANGE || x < min)
                         die("--" + n + " needs an integer >= " + std::to_string(min) + ", got '" +
                             v + "'");
                       *target = x;
                     },
                     true});
  }
  void number(std::string name, double* target, double min, std::string help) {
    const std::string n = name;
    char shown[32];
    std::snprintf(shown, sizeof shown, "%g", *target);
    opts_.push_back({std::move(name), std::move(help), shown,
                     [this, n, target, min](const char* v) {
                       char* end = nullptr;
                       const double x = std::strtod(v, &end);
                       if (end == v || *end != '\0' || !(x >= min) || !std::isfinite(x)) {
                         char least[32];
                         std::snprintf(least, sizeof least, "%g", min);
                         die("--" + n + " needs a finite number >= " + least + ", got '" + v + "'");
                       }
                       *target = x;
                     },
                     true});
  }
  void text(std::string name, std::string* target, std::string help) {
    opts_.push_back({std::move(name), std::move(help), *target,
                     [target](const char* v) { *target = v; }, true});
  }

  void parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      if (a == "--help" || a == "-h") {
        usage(stdout);
        std::exit(0);
      }
      const Opt* o = find(a);
      if (o == nullptr) die("unknown flag: " + std::string(a));
      given_.push_back(o->name);
      if (!o->takes_value) {
        o->set(nullptr);
        continue;
      }
      if (i + 1 >= argc) die("--" + o->name + " needs a value");
      o->set(argv[++i]);
    }
  }

  // Whether the command line named --name, whatever value it gave (the default included).
  bool given(std::string_view name) const {
    return std::find(given_.begin(), given_.end(), name) != given_.end();
  }

  [[noreturn]] void die(const std::string& msg) const {
    std::fprintf(stderr, "%s: %s\n", program_.c_str(), msg.c_str());
    usage(stderr);
    std::exit(2);
  }

 private:
  struct Opt {
    std::string name, help, default_value;
    std::function<void(const char*)> set;
    bool takes_value;
  };
  const Opt* find(std::string_view arg) const {
    if (arg.substr(0, 2) != "--") return nullptr;
    for (const Opt& o : opts_)
      if (arg.substr(2) == o.name) return &o;
    return nullptr;
  }
  void usage(std::FILE* out) const {
    std::fprintf(out, "usage: %s [flags]\n%s\n\nflags:\n", program_.c_str(), summary_.c_str());
    auto lhs = [](const Opt& o) { return "--" + o.name + (o.takes_value ? " V" : ""); };
    int width = 6;  // "--help"
    for (const Opt& o : opts_) width = std::max(width, static_cast<int>(lhs(o).size()));
    for (const Opt& o : opts_) {
      std::fprintf(out, "  %-*s %s%s\n", width, lhs(o).c_str(), o.help.c_str(),
                   o.takes_value ? (" (default " + o.default_value + ")").c_str() : "");
    }
    std::fprintf(out, "  %-*s %s\n", width, "--help", "print this help");
  }

  std::string program_, summary_;
  std::vector<Opt> opts_;
  std::vector<std::string> given_;
};

// Loads both splits of an IDX directory, or explains how to get Fashion-MNIST and exits.
inline std::pair<data::Dataset, data::Dataset> load_or_exit(const std::string& program,
                                                            const std::string& dir,
                                                            int64_t limit = 0) {
  if (!data::idx_dataset_available(dir)) {
    std::fprintf(stderr,
                 "%s: no IDX dataset in %s\n"
                 "Install Fashion-MNIST with:  sudo apt-get install dataset-fashion-mnist\n"
                 "or pass --data DIR with train-images-idx3-ubyte[.gz], "
                 "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz] and "
                 "t10k-labels-idx1-ubyte[.gz].\n",
                 program.c_str(), dir.c_str());
    std::exit(1);
  }
  auto train = data::load_idx_dataset(dir, data::Split::Train, limit);
  auto test = data::load_idx_dataset(dir, data::Split::Test, limit);
  std::printf("dataset %s: %lld train, %lld test samples\n", dir.c_str(),
              static_cast<long long>(train.size()), static_cast<long long>(test.size()));
  return {std::move(train), std::move(test)};
}

// Redraws "epoch e [=====>    ] i/n" (or another label) on stderr when it is a terminal.
class Progress {
 public:
  explicit Progress(int64_t total, std::string label = "epoch")
      : total_(total), label_(std::move(label)), on_(::isatty(STDERR_FILENO) == 1) {}
  void update(int64_t epoch, int64_t done) const {
    if (!on_ || (done % 10 != 0 && done != total_)) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / (total_ ? total_ : 1));
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < kWidth) bar += '>';
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "\r%s %lld [%s] %lld/%lld", label_.c_str(), static_cast<long long>(epoch),
                 bar.c_str(), static_cast<long long>(done), static_cast<long long>(total_));
    std::fflush(stderr);
  }
  void clear() const {
    if (on_) std::fprintf(stderr, "\r%*s\r", 60, "");
  }

 private:
  int64_t total_;
  std::string label_;
  bool on_;
};

struct Eval {
  double loss = 0;
  double accuracy = 0;
};

// Test loss and accuracy of a classifier in eval mode without gradients.
inline Eval evaluate(nn::Module& model, const data::Dataset& ds, int64_t batch = 1000) {
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  data::BatchIterator it(ds, batch, /*shuffle=*/false);
  const std::vector<Tensor> params = model.parameters();
  it.set_device(params.empty() ? Device::cpu() : params[0].device());
  Tensor x, t;
  Eval e;
  while (it.next(x, t)) {
    Tensor logits = model(x);
    const auto b = static_cast<double>(t.size(0));
    e.loss += F::softmax_cross_entropy(logits, t).item<double>() * b;
    e.accuracy += F::accuracy(logits, t).item<double>() * b;
  }
  model.train(was_training);
  const auto n = static_cast<double>(ds.size());
  return {e.loss / n, e.accuracy / n};
}

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

inline void print_table_header() {
  std::printf("%5s | %9s | %10s | %9s | %8s\n", "epoch", "elapsed s", "train loss", "test loss",
              "test acc");
  std::printf("------+-----------+------------+-----------+---------\n");
  std::fflush(stdout);
}

inline void print_table_row(int64_t epoch, double elapsed, double train_loss, const Eval& e) {
  std::printf("%5lld | %9.2f | %10.4f | %9.4f | %8.4f\n", static_cast<long long>(epoch), elapsed,
              train_loss, e.loss, e.accuracy);
  std::fflush(stdout);
}

inline std::string kib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(bytes) / 1024);
  return buf;
}

// One line per cache entry of a static function: its signature and memory plan.
inline void print_entries(const StaticStats& st) {
  for (const EntryReport& e : st.cache) {
    std::printf("  entry %s: arena %s (lower bound %s, naive %s)\n", e.signature.c_str(),
                kib(e.arena_bytes).c_str(), kib(e.lower_bound_bytes).c_str(),
                kib(e.naive_bytes).c_str());
    if (const std::string g = e.graph_text(); !g.empty()) std::printf("    %s\n", g.c_str());
  }
}

// --save PATH and --resume PATH: the model, the optimizer and the device's generator in one
// checkpoint (encore/checkpoint.h), saved after every epoch and loaded before the first. A
// resumed run trains --epochs more epochs; the data order starts again from --seed.
struct Checkpointing {
  std::string save_path, resume_path;

  void add_flags(Cli& cli) {
    cli.text("save", &save_path, "save a checkpoint here after every epoch");
    cli.text("resume", &resume_path, "resume from this checkpoint (model, optimizer, generator)");
  }
  void resume(nn::Module& model, optim::Optimizer& opt, Device device) const {
    if (resume_path.empty()) return;
    load(resume_path, model, &opt, &default_generator(device));
    std::printf("resumed from %s (%lld optimizer steps before)\n", resume_path.c_str(),
                static_cast<long long>(opt.steps()));
  }
  void save_epoch(const nn::Module& model, optim::Optimizer& opt, Device device) const {
    if (!save_path.empty()) save(save_path, model, &opt, &default_generator(device));
  }
};

}  // namespace encore::samples
