// encore_interleaved: eager against static on one machine whose speed drifts (a shared one). The
// Google Benchmark cases run one after the other, so a change of load between them shows as a
// difference; here the ways take turns every few steps, and each turn is timed, so a drift slows
// all of them alike. Ways: eager; static (every pass on, two lanes at two threads); static with
// one of lanes, activation folds or padded layouts off; static with all of them and the early
// updates off (a plain replay of the recorded steps, fused).
//
//   build/bench/encore_interleaved mlp|mlp_large|cnn [threads=2] [turns=30] [steps per turn=20]
//
// Prints per way the fastest and the median turn (time per step) and the median over eager's.
// mlp and mlp_large are the MlpSmall and MlpLarge steps (Adam), cnn the SeedCnn step (SGD), as
// in encore_bench.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "bench/mlp_step.h"
#include "encore/models.h"

namespace encore::bench {
namespace {

struct Way {
  const char* name;
  std::function<void()> step;
  std::vector<double> us_per_step;  // per turn
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The plan switches a static function is traced with.
struct Passes {
  bool lanes = true, fold = true, padded = true, early = true;
};

// The static function `make()` returns, traced (and warmed up) with the switches `p`.
template <typename Make>
auto traced(Make make, const Tensor& x, const Tensor& t, Passes p) {
  const bool lanes = set_static_lanes_enabled(p.lanes);
  const bool fold = set_static_fold_activations_enabled(p.fold);
  const bool padded = set_static_padded_layouts_enabled(p.padded);
  const bool early = set_static_early_updates_enabled(p.early);
  auto fn = make();
  for (int i = 0; i < 3; ++i) fn(x, t);  // the first call traces (the switches are read there)
  set_static_lanes_enabled(lanes);
  set_static_fold_activations_enabled(fold);
  set_static_padded_layouts_enabled(padded);
  set_static_early_updates_enabled(early);
  return fn;
}

// The ways of one step: `eager(x, t)`, and the static function `make()` returns traced with every
// pass, without one of them, and without any.
template <typename Eager, typename Make>
std::vector<Way> ways_of(Eager eager, Make make, const Tensor& x, const Tensor& t) {
  std::vector<Way> ways = {{"eager", [=]() mutable { eager(x, t); }, {}}};
  const std::pair<const char*, Passes> variants[] = {
      {"static", {}},
      {"static, lanes off", {.lanes = false}},
      {"static, unfolded", {.fold = false}},
      {"static, dense", {.padded = false}},
      {"static, plain", {.lanes = false, .fold = false, .padded = false, .early = false}}};
  for (const auto& [name, passes] : variants) {
    auto fn = traced(make, x, t, passes);
    ways.push_back({name, [=]() mutable { fn(x, t); }, {}});
  }
  return ways;
}

// Runs the ways in turns and prints what each took.
void measure(std::vector<Way>& ways, const std::string& model, int turns, int steps) {
  for (Way& w : ways) w.step();  // warm
  for (int turn = 0; turn < turns; ++turn)
    for (Way& w : ways) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < steps; ++i) w.step();
      const std::chrono::duration<double, std::micro> took =
          std::chrono::steady_clock::now() - start;
      w.us_per_step.push_back(took.count() / steps);
    }
  std::printf("%s, %d thread(s), %d turns of %d steps; us per step\n", model.c_str(), num_threads(),
              turns, steps);
  const double eager = median(ways[0].us_per_step);
  for (const Way& w : ways)
    std::printf("  %-18s fastest %9.1f  median %9.1f  median / eager's %.3f\n", w.name,
                *std::min_element(w.us_per_step.begin(), w.us_per_step.end()),
                median(w.us_per_step), median(w.us_per_step) / eager);
}

int run(const std::string& model, int threads, int turns, int steps) {
  set_num_threads(threads);
  if (model == "mlp" || model == "mlp_large") {
    // One model: each way trains it in turn (the same kernels, shapes and memory).
    const bool large = model == "mlp_large";
    MlpStep mlp(large ? kMlpLargeHidden : kMlpSmallHidden, large ? kMlpLargeBatch : kMlpSmallBatch);
    std::vector<Way> ways = ways_of([&](const Tensor& x, const Tensor& t) { return mlp(x, t); },
                                    [&] { return mlp.make_static(); }, mlp.x(), mlp.labels());
    measure(ways, model, turns, steps);
    return 0;
  }
  if (model == "cnn") {
    manual_seed(0);
    auto cnn = std::make_shared<models::SeedCnn>();
    TrainStep<models::SeedCnn, optim::SGD> step{cnn, optim::SGD(cnn->parameters())};
    auto eager = [&](const Tensor& x, const Tensor& t) { return step(x, t); };
    std::vector<Way> ways = ways_of(
        eager, [&] { return static_graph(eager, {.name = "seed_cnn_step", .modules = {cnn}}); },
        rand({32, 1, 28, 28}), cyclic_labels(32));
    measure(ways, model, turns, steps);
    return 0;
  }
  std::fprintf(stderr, "encore_interleaved: unknown model '%s' (mlp, mlp_large or cnn)\n",
               model.c_str());
  return 2;
}

}  // namespace
}  // namespace encore::bench

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "mlp";
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int turns = argc > 3 ? std::atoi(argv[3]) : 30;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 20;
  if (threads < 1 || turns < 1 || steps < 1) {
    std::fprintf(
        stderr, "usage: encore_interleaved mlp|mlp_large|cnn [threads] [turns] [steps per turn]\n");
    return 2;
  }
  return encore::bench::run(model, threads, turns, steps);
}
