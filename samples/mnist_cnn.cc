// The seed CNN of Chainer's static-subgraph example (three 3x3 convolutions with 8 channels,
// ReLU, 2x2 max pooling, a linear layer; SGD, batch 32) on Fashion-MNIST. --static marks its
// forward static with one line (StaticSeedCnn below), as the reference's @static_graph does;
// --compare trains one epoch each way from the same seed, side by side (the two models take
// turns, a batch each, and every step is timed), and prints a summary, then profiles a few more
// steps each way and prints the ops that took the most time. --save PATH checkpoints after
// every epoch; --resume PATH goes on from such a checkpoint. --export PATH writes the trained
// model's eval forward as an ONNX model (images [batch, 784] -> logits [batch, 10]).
//
//   build/samples/mnist_cnn --epochs 2 --static
//   build/samples/mnist_cnn --epochs 2 --export model.onnx
//   build/samples/mnist_cnn --compare
//   build/samples/mnist_cnn --static --limit 3200 --profile cnn.json --schedule cnn.txt
//
// --profile writes a Chrome trace (ui.perfetto.dev) and prints the per-op table of the run;
// --schedule writes the static forward's schedules as text and as Graphviz DOT (PATH.dot), with
// --static or --compare (the static model's).
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
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
  std::string profile, schedule, device = "cpu", export_path;
  int64_t epochs = 1, batch = 32, seed = 0, limit = 0, profile_steps = 50;
  bool static_forward = false, compare = false;
  samples::Checkpointing checkpoints;  // --save, --resume (not with --compare)
};

// The trained model as a deployable file: its eval forward (traced here on two blank images, in
// eval mode with grad mode off) as ONNX, the batch left symbolic.
void export_model(nn::Module& model, Device device, const std::string& path) {
  export_onnx(model, path,
              {.example_args = {zeros({2, 784}, DType::Float32, device)},
               .input_names = {"images"},
               .output_names = {"logits"}});
  std::printf("ONNX model (opset %d) written to %s: images [batch, 784] -> logits [batch, 10]\n",
              kOnnxOpset, path.c_str());
}

// Writes `text` to `path`, or throws Error naming the flag, the path and why.
void write_text(const char* flag, const std::string& path, const std::string& text) {
  errno = 0;
  std::ofstream out(path, std::ios::binary);
  if (out) out << text;
  if (out) out.close();
  if (!out)
    throw Error(cat(flag, ": cannot write ", path, ": ",
                    errno != 0 ? std::strerror(errno) : "the stream failed"));
}

// The static forward's schedules, as text at PATH and as Graphviz DOT at PATH.dot.
void write_schedules(const std::string& path, const nn::Module& model) {
  write_text("--schedule", path, static_schedule_text(model));
  write_text("--schedule", path + ".dot", static_schedule_dot(model));
  std::printf("schedules written to %s and %s.dot\n", path.c_str(), path.c_str());
}

struct RunResult {
  double seconds = 0;       // training time of the last epoch (no evaluation; --compare: its steps)
  samples::Eval test;       // after the last epoch
  int64_t traces = 0;       // static: traces of the forward (train and eval signatures)
  int64_t planned = 0;      // static: batch sizes planned from a dynamic family, untraced
  int64_t arena_bytes = 0;  // static: arena of the training entry
  int64_t step_peak = -1;   // allocator peak over step 3, above what was in use (-1: no step 3)
};

// A step's peak, or that an epoch of under 3 steps measured none.
std::string peak_text(int64_t bytes) {
  return bytes >= 0 ? samples::kib(bytes) : std::string("not measured (under 3 steps)");
}

// Bytes the allocator's peak rose above what was in use before one call of `step`.
template <typename Step>
int64_t step_peak_bytes(Device device, Step&& step) {
  Allocator& a = allocator_for(device);
  a.reset_peak();
  const int64_t before = a.stats().bytes_in_use;
  step();
  return a.stats().peak_bytes - before;
}

// Seeds the generator, then builds the model on `device`: both forwards start from the same
// weights.
std::shared_ptr<models::SeedCnn> seeded_model(const Flags& f, bool static_forward, Device device) {
  manual_seed(static_cast<uint64_t>(f.seed));
  std::shared_ptr<models::SeedCnn> model =
      static_forward ? std::make_shared<StaticSeedCnn>() : std::make_shared<models::SeedCnn>();
  model->to(device);  // before the optimizer takes the parameters
  return model;
}

// The model, its optimizer and its batches: what the timed epochs and the profiled steps after
// them share, so that both measure the same training step.
struct Trainer {
  Trainer(const Flags& f, bool is_static, const data::Dataset& train_set)
      : static_forward(is_static),
        device(Device::parse(f.device)),
        model(seeded_model(f, is_static, device)),
        opt(model->parameters(), {.lr = 0.01}),
        batches(train_set, f.batch, /*shuffle=*/true, static_cast<uint64_t>(f.seed)) {
    batches.set_device(device);
  }

  // Forward, loss, backward and the SGD update; returns the loss.
  Tensor step(const Tensor& x, const Tensor& t) {
    Tensor loss = F::softmax_cross_entropy((*model)(x), t);
    model->zero_grad();
    loss.backward();
    opt.step();
    return loss;
  }
  // Step `i` (from 1) of an epoch; step 3 (traced at step 1, replayed from step 2 when static)
  // has its allocator peak measured into `peak`.
  Tensor step(const Tensor& x, const Tensor& t, int64_t i, int64_t& peak) {
    if (i != 3) return step(x, t);
    Tensor loss;
    peak = step_peak_bytes(device, [&] { loss = step(x, t); });
    return loss;
  }

  bool static_forward;
  Device device;
  std::shared_ptr<models::SeedCnn> model;
  optim::SGD opt;
  data::BatchIterator batches;
};

// A static model's traces and training arena, into `r`; returns its stats.
StaticStats static_figures(const Trainer& tr, RunResult& r) {
  const StaticStats st = static_stats(*tr.model);
  r.traces = st.traces;
  r.planned = st.sizes_planned;
  for (const EntryReport& e : st.cache)
    if (e.signature.find("train") != std::string::npos) r.arena_bytes = e.arena_bytes;
  return st;
}

RunResult train(const Flags& f, Trainer& tr, const data::Dataset& test_set, bool verbose) {
  if (verbose) {
    std::printf("model %s on %s, SGD lr 0.01, batch %lld, forward %s\n\n",
                tr.model->describe().c_str(), tr.device.str().c_str(),
                static_cast<long long>(f.batch),
                tr.static_forward ? "static (ENCORE_STATIC_GRAPH)" : "eager");
    samples::print_table_header();
  }
  RunResult r;
  const samples::Progress progress(tr.batches.batches_per_epoch());
  const auto start = Clock::now();
  for (int64_t epoch = 1; epoch <= f.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    double loss_sum = 0;
    int64_t seen = 0, i = 0;
    Tensor x, t;
    while (tr.batches.next(x, t)) {
      const Tensor loss = tr.step(x, t, ++i, r.step_peak);
      loss_sum += loss.item<double>() * static_cast<double>(t.size(0));
      seen += t.size(0);
      progress.update(epoch, i);
    }
    progress.clear();
    r.seconds = samples::seconds_since(epoch_start);
    r.test = samples::evaluate(*tr.model, test_set);
    if (verbose) {
      samples::print_table_row(epoch, samples::seconds_since(start),
                               loss_sum / static_cast<double>(seen), r.test);
      f.checkpoints.save_epoch(*tr.model, tr.opt, tr.device);
    }
  }
  if (tr.static_forward) {
    const StaticStats st = static_figures(tr, r);
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
                peak_text(r.step_peak).c_str());
  if (tr.static_forward && !f.schedule.empty()) write_schedules(f.schedule, *tr.model);
  return r;
}

// Profiles `steps` more training steps. They run after the timed epoch, so the profiler's cost
// per op never reaches the epoch times, and after the static forward has traced, so its rows are
// replays, as in almost every step of an epoch.
profiler::Profile profile_steps(Trainer& tr, int64_t steps) {
  profiler::Scope scope;  // stops the session if a step throws
  Tensor x, t;
  for (int64_t i = 0; i < steps; ++i) {
    // next() is false once, at the end of an epoch; the call after it starts the next epoch.
    if (!tr.batches.next(x, t)) tr.batches.next(x, t);
    tr.step(x, t);
  }
  return scope.stop();
}

// The `rows` ops that took the most time, one line each, under a line of totals.
void print_top_ops(const char* label, const profiler::Profile& p, int rows) {
  std::printf("%s: %.1f ms in %lld op calls (%.1f ms wall)\n", label,
              static_cast<double>(p.total_ns()) / 1e6, static_cast<long long>(p.total_calls()),
              static_cast<double>(p.wall_ns()) / 1e6);
  std::printf("  %7s %10s %7s  %-7s %s\n", "calls", "total ms", "share", "mode", "op");
  const size_t n = std::min(p.ops().size(), static_cast<size_t>(rows));
  for (size_t i = 0; i < n; ++i) {
    const profiler::OpRow& r = p.ops()[i];
    std::printf("  %7lld %10.1f %6.1f%%  %-7s %s\n", static_cast<long long>(r.calls),
                static_cast<double>(r.total_ns) / 1e6, 100.0 * r.share,
                std::string(profiler::mode_name(r.mode)).c_str(), r.op.c_str());
  }
}

// One epoch each way, side by side: the two models take turns, a batch each (which goes first
// alternates), and each step is timed on its own, so a machine whose speed drifts (a shared one)
// slows both alike. Both iterators shuffle with the same seed, so they end together. Then each
// model is evaluated.
std::array<RunResult, 2> train_side_by_side(std::array<Trainer*, 2> tr,
                                            const data::Dataset& test_set) {
  std::array<RunResult, 2> r;
  const samples::Progress progress(tr[0]->batches.batches_per_epoch());
  std::array<Tensor, 2> x, t;
  for (int64_t i = 1; tr[0]->batches.next(x[0], t[0]) && tr[1]->batches.next(x[1], t[1]); ++i) {
    for (int turn = 0; turn < 2; ++turn) {
      const int k = (turn + static_cast<int>(i)) % 2;
      const auto start = Clock::now();
      tr[k]->step(x[k], t[k], i, r[k].step_peak);
      r[k].seconds += samples::seconds_since(start);
    }
    progress.update(1, i);
  }
  progress.clear();
  for (int k = 0; k < 2; ++k) r[k].test = samples::evaluate(*tr[k]->model, test_set);
  static_figures(*tr[1], r[1]);
  return r;
}

void print_summary(const RunResult& e, const RunResult& s) {
  std::printf("%-7s | %11s | %9s | %8s | %17s\n", "forward", "s per epoch", "test loss", "test acc",
              "memory per step");
  std::printf("--------+-------------+-----------+----------+------------------\n");
  std::printf("%-7s | %11.2f | %9.4f | %8.4f | peak %12s\n", "eager", e.seconds, e.test.loss,
              e.test.accuracy, peak_text(e.step_peak).c_str());
  std::printf("%-7s | %11.2f | %9.4f | %8.4f | arena %11s\n", "static", s.seconds, s.test.loss,
              s.test.accuracy, samples::kib(s.arena_bytes).c_str());
  std::printf(
      "\nspeedup %.2fx (eager time / static time); traces %lld (training and evaluation trace "
      "once each; a batch of a second size traces once more and makes the batch dynamic), "
      "sizes planned without tracing %lld; static step peak %s\n",
      e.seconds / s.seconds, static_cast<long long>(s.traces), static_cast<long long>(s.planned),
      peak_text(s.step_peak).c_str());
  std::printf("results %s\n", e.test.loss == s.test.loss && e.test.accuracy == s.test.accuracy
                                  ? "identical (bit for bit)"
                                  : "DIFFER");
}

void compare(const Flags& f, const data::Dataset& train_set, const data::Dataset& test_set) {
  Flags one = f;
  one.epochs = 1;
  // A session already on (--profile, ENCORE_PROFILE) records the whole run: a second one cannot
  // start, and the epoch times already carry the profiler's cost.
  const bool profile = f.profile_steps > 0 && !profiler::enabled();
  std::printf(
      "seed CNN, one epoch eager and one with its forward static, from the same seed, side by "
      "side (a batch each in turn)\n\n");
  std::fflush(stdout);
  Trainer eager(one, false, train_set), static_forward(one, true, train_set);
  const std::array<RunResult, 2> runs = train_side_by_side({&eager, &static_forward}, test_set);
  print_summary(runs[0], runs[1]);
  if (!f.schedule.empty()) write_schedules(f.schedule, *static_forward.model);
  if (!profile) return;
  const profiler::Profile eager_profile = profile_steps(eager, f.profile_steps);
  const profiler::Profile static_profile = profile_steps(static_forward, f.profile_steps);
  std::printf(
      "\nwhere the time went: %lld more training steps each way, profiled after the timed "
      "epochs\n(share: of the time in ops; an eager op's time is its whole dispatch, a replayed "
      "step's its kernel call)\n\n",
      static_cast<long long>(f.profile_steps));
  constexpr int kRows = 6;
  print_top_ops("eager", eager_profile, kRows);
  std::printf("\n");
  print_top_ops("static", static_profile, kRows);
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
           "train one epoch eager and one static from the same seed, side by side, and compare");
  cli.integer("profile-steps", &f.profile_steps, 0,
              "with --compare: steps profiled each way after the timed epochs (0: none)");
  cli.text("profile", &f.profile, "profile the run: Chrome trace to this file, op table printed");
  cli.text("schedule", &f.schedule,
           "with --static or --compare: write the static forward's schedules here (text) and .dot");
  cli.text("device", &f.device, "cpu, or cuda / cuda:N to train on a GPU");
  cli.text("export", &f.export_path,
           "after training, write the model's eval forward here as ONNX (not with --compare)");
  f.checkpoints.add_flags(cli);
  cli.parse(argc, argv);
  try {
    if (f.compare && !f.export_path.empty())
      throw Error("--export writes one model; --compare trains two");
    if (f.compare && f.epochs != 1)
      throw Error("--compare trains one epoch each way: drop --epochs");
    if (!f.compare && cli.given("profile-steps"))
      throw Error("--profile-steps profiles the steps after --compare's epochs: give --compare");
    if (!f.schedule.empty() && !f.static_forward && !f.compare)
      throw Error(
          "--schedule writes the schedules of a static forward: give --static or --compare");
    if (!f.profile.empty() && profiler::enabled())
      throw Error("--profile: the profiler already records (ENCORE_PROFILE is set)");
    const auto [train_set, test_set] = samples::load_or_exit("mnist_cnn", f.data, f.limit);
    if (!f.profile.empty()) profiler::start();
    if (f.compare) {
      if (!f.checkpoints.save_path.empty() || !f.checkpoints.resume_path.empty())
        throw Error("--save and --resume train one model; --compare trains two");
      compare(f, train_set, test_set);
    } else {
      Trainer tr(f, f.static_forward, train_set);
      f.checkpoints.resume(*tr.model, tr.opt, tr.device);
      train(f, tr, test_set, true);
      if (!f.export_path.empty()) export_model(*tr.model, tr.device, f.export_path);
    }
    if (!f.profile.empty()) {
      const profiler::Profile p = profiler::stop();
      p.write_chrome_trace(f.profile);
      std::printf("\nprofile (trace written to %s):\n%s", f.profile.c_str(), p.table(15).c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mnist_cnn: %s\n", e.what());
    return 1;
  }
}
