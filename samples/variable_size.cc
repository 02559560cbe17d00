// The tf.function retracing experiment, scaled to a CPU: a small VGG-style network trained
// (Adam, softmax cross-entropy) on random images whose height and width change every batch.
// The same steps run eagerly, then as one static function. The second size traces once more;
// the two traces agree in everything but sizes, so height and width become dynamic and every
// later size is planned from the trace without running the step's code. With --fixed every
// (height, width) is a signature of its own (DynamicShapes::Off): the static version retraces
// on every new size, as tf.function does, and encore says so.
//
//   build/samples/variable_size --steps 40 --min 32 --max 96
//   build/samples/variable_size --fixed
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "samples/common.h"

using namespace encore;

namespace {

struct Flags {
  int64_t steps = 40, batch = 8, min = 32, max = 96, seed = 0, cache = 8;
  bool fixed = false;
};

// One (height, width) per step, uniform in [min, max], from a fixed seed.
std::vector<std::pair<int64_t, int64_t>> sizes(const Flags& f) {
  std::mt19937_64 rng(static_cast<uint64_t>(f.seed));
  std::uniform_int_distribution<int64_t> d(f.min, f.max);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t i = 0; i < f.steps; ++i) {
    const int64_t h = d(rng);
    out.emplace_back(h, d(rng));
  }
  return out;
}

struct Run {
  double ms_per_step = 0;
  double final_loss = 0;
};

Run run(const Flags& f, bool static_on) {
  manual_seed(static_cast<uint64_t>(f.seed));
  auto model = std::make_shared<models::VggSmall>();
  optim::Adam opt(model->parameters(), {.lr = 1e-3});
  auto step = static_graph(
      [&](const Tensor& x, const Tensor& t) {
        Tensor loss = F::softmax_cross_entropy((*model)(x), t);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
      },
      {.name = "vgg_step",
       .cache_limit = static_cast<int>(f.cache),
       .arg_names = {"x", "t"},
       .modules = {model},
       .dynamic = f.fixed ? DynamicShapes::Off : DynamicShapes::Automatic});
  const bool was = set_static_enabled(static_on);
  Tensor labels = Tensor::empty({f.batch}, DType::Int32);
  for (int64_t i = 0; i < f.batch; ++i) labels.data<int32_t>()[i] = static_cast<int32_t>(i % 10);
  Run r;
  const auto start = samples::Clock::now();
  for (const auto& [h, w] : sizes(f)) {
    Tensor x = randn({f.batch, 3, h, w});
    r.final_loss = step(x, labels).item<double>();
  }
  r.ms_per_step = samples::seconds_since(start) * 1e3 / static_cast<double>(f.steps);
  set_static_enabled(was);
  if (static_on) {
    const StaticStats st = step.stats();
    std::printf(
        "\nvgg_step (static): %lld calls, %lld traces, %lld replays, %lld evictions, "
        "%d entries\n",
        static_cast<long long>(st.calls), static_cast<long long>(st.traces),
        static_cast<long long>(st.hits), static_cast<long long>(st.evictions), st.entries);
    std::printf("latest retraces:\n");
    const size_t n = st.traces_history.size();
    for (size_t i = n > 5 ? n - 5 : 0; i < n; ++i)
      std::printf("  %s\n", st.traces_history[i].message.c_str());
    for (const std::string& d : st.dynamic_history) std::printf("  %s\n", d.c_str());
    for (const DynamicReport& d : st.dynamic) {
      int64_t bytes = 0;
      for (const EntryReport& e : d.sizes) bytes += e.arena_bytes;
      std::printf(
          "dynamic: %s\n  %lld sizes planned without tracing, %zu kept (%lld arena bytes)\n",
          d.signature.c_str(), static_cast<long long>(d.sizes_planned), d.sizes.size(),
          static_cast<long long>(bytes));
    }
    for (const std::string& why : st.static_dims) std::printf("static: %s\n", why.c_str());
    std::printf("warnings (%zu):\n", st.warnings.size());
    for (const std::string& w : st.warnings) std::printf("  %s\n", w.c_str());
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  samples::Cli cli("variable_size",
                   "Trains a small VGG-style net on random images whose size changes every batch, "
                   "eagerly and static, and reports the retracing.");
  cli.integer("steps", &f.steps, 1, "training steps each way");
  cli.integer("batch", &f.batch, 1, "images per batch");
  cli.integer("min", &f.min, 8, "smallest height and width");
  cli.integer("max", &f.max, 8, "largest height and width");
  cli.integer("seed", &f.seed, 0, "seed for the sizes, images and initialisation");
  cli.integer("cache", &f.cache, 1, "cache limit of the static step");
  cli.flag("fixed", &f.fixed, "every size its own signature (no dynamic shapes)");
  cli.parse(argc, argv);
  if (f.max < f.min) cli.die("--max must be >= --min");
  try {
    std::printf(
        "VggSmall, Adam, batch %lld, %lld steps, height and width uniform in [%lld, %lld] "
        "per batch\n",
        static_cast<long long>(f.batch), static_cast<long long>(f.steps),
        static_cast<long long>(f.min), static_cast<long long>(f.max));
    // Warnings print as they happen, in order with the rest.
    set_log_sink([](const std::string& line) { std::printf("  [encore] %s\n", line.c_str()); });
    Flags warm = f;  // warms the allocator's cache and OpenBLAS; not timed
    warm.steps = 2;
    run(warm, false);
    const Run eager = run(f, false);
    const Run stat = run(f, true);
    std::printf("\n%-7s | %11s | %10s\n", "step", "ms per step", "final loss");
    std::printf("--------+-------------+-----------\n");
    std::printf("%-7s | %11.2f | %10.4f\n", "eager", eager.ms_per_step, eager.final_loss);
    std::printf("%-7s | %11.2f | %10.4f\n", "static", stat.ms_per_step, stat.final_loss);
    std::printf("\nstatic / eager time: %.2f\n", stat.ms_per_step / eager.ms_per_step);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "variable_size: %s\n", e.what());
    return 1;
  }
}
