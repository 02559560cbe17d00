// static_graph on cuda:0: a replay runs the kernels eager runs, so it equals eager bit for bit on
// the same device, whether the schedules replay as CUDA graphs or launch by launch
// (cuda::set_graphs_enabled(false)). The scenarios of the cpu tests (static_scenarios.h) run here
// on cuda:0 with graphs on and off: the MLP with Adam (module and whole-step forms), two forwards
// before one backward, the seed CNN with SGD, a model with batch norm and dropout (running
// statistics and masks), fresh dropout masks, rebinding a replaced parameter, in-place updates of
// arguments and outputs that outlive later calls; this file adds how the replays used CUDA
// graphs. Then the randomized differential test (random_program_check.h).
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/cuda.h"
#include "runtime/small_gemm.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/random_program_check.h"
#include "tests/static_clip_schedule_scenarios.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;

// ---- Replay equals eager -------------------------------------------------------------------

TEST_CASE("MLP training with a static forward (module form) on cuda equals eager bit for bit",
          "[cuda][static]") {
  with_graphs_on_and_off([](bool graphs) {
    const StaticStats s = check_mlp_module_form(kCuda);  // one cache entry
    check_graph_use(s.cache[0], graphs, 19);
  });
}

TEST_CASE("MLP training with the whole step static (function form) on cuda equals eager",
          "[cuda][static]") {
  with_graphs_on_and_off([](bool graphs) {
    const StaticRun run = check_mlp_function_form(kCuda);  // one cache entry
    check_graph_use(run.stats.cache[0], graphs, 19);
    // The schedule dump says how the entry replayed.
    CHECK_THAT(run.schedule, Catch::Matchers::Contains("on cuda:0: "));
    // Every arena block starts on 256 bytes, as the caching allocator aligns eager buffers
    // (cuBLAS and cuDNN may choose other kernels for other alignments).
    const std::regex block(R"(arena \[([0-9]+),)");
    int blocks = 0;
    for (auto it = std::sregex_iterator(run.schedule.begin(), run.schedule.end(), block);
         it != std::sregex_iterator(); ++it, ++blocks) {
      INFO((*it)[0].str());
      CHECK(std::stoll((*it)[1].str()) % 256 == 0);
    }
    CHECK(blocks > 0);
  });
}

namespace {
// For a scope: the streams of the CUDA graphs of signatures traced in it.
class GraphStreams {
 public:
  explicit GraphStreams(int n) : previous_(cuda::set_graph_streams(n)) {}
  ~GraphStreams() { cuda::set_graph_streams(previous_); }
  GraphStreams(const GraphStreams&) = delete;
  GraphStreams& operator=(const GraphStreams&) = delete;

 private:
  int previous_;
};
}  // namespace

TEST_CASE("a training step's CUDA graph runs its lanes on several streams with eager's bits",
          "[cuda][static]") {
  // The layers' weight, bias and input gradients are independent: with lanes on, the graph holds
  // them on 2 or 3 streams (the schedule says which), and the replays still equal eager bit for
  // bit (check_mlp_function_form), as the one-stream graphs with lanes off or one stream do.
  GraphsEnabled use_graphs(true);
  struct Setting {
    bool lanes;
    int streams;
  };
  for (const Setting s : {Setting{true, 2}, Setting{true, 3}, Setting{true, 4}, Setting{false, 2},
                          Setting{true, 1}}) {
    const SwitchScope<set_static_lanes_enabled> lanes(s.lanes);
    const GraphStreams streams_scope(s.streams);
    const int64_t forked = schedule::graph_use_counts().forked;
    const StaticRun run = check_mlp_function_form(kCuda);
    check_graph_use(run.stats.cache[0], /*graphs=*/true, 19);
    // The captured graphs themselves fork where the schedule says its phases are on streams.
    CHECK((schedule::graph_use_counts().forked > forked) == (s.lanes && s.streams > 1));
    INFO("lanes " << s.lanes << ", streams " << s.streams << "\n" << run.schedule);
    // Per phase on several streams: its steps on each stream and the marks between them.
    const std::regex header(R"(([0-9]) streams \(captured so in its CUDA graphs\): ([^\n]*), )"
                            R"(ordered by ([0-9]+) marks?)");
    const std::regex on_stream(R"(([0-9]+) on stream ([0-9]))");
    int phases = 0, on_branches = 0;
    for (auto it = std::sregex_iterator(run.schedule.begin(), run.schedule.end(), header);
         it != std::sregex_iterator(); ++it, ++phases) {
      const int used = std::stoi((*it)[1].str());
      CHECK(used >= 2);
      CHECK(used <= s.streams);
      CHECK(std::stoi((*it)[3].str()) > 0);
      const std::string counts = (*it)[2].str();
      int streams_listed = 0;
      for (auto c = std::sregex_iterator(counts.begin(), counts.end(), on_stream);
           c != std::sregex_iterator(); ++c, ++streams_listed) {
        CHECK(std::stoi((*c)[2].str()) == streams_listed);
        CHECK(std::stoi((*c)[1].str()) > 0);  // every stream used
        if (streams_listed > 0) on_branches += std::stoi((*c)[1].str());
      }
      CHECK(streams_listed == used);
    }
    REQUIRE((phases > 0) == (s.lanes && s.streams > 1));
    CHECK(count_of(run.schedule, R"([\[ ]stream [1-3]\])") == on_branches);
  }
}

TEST_CASE("Adam's hyper-parameters on a schedule on cuda replay eager's steps with one trace",
          "[cuda][static]") {
  // Three sets of values, each for two calls, twice round (the first call traces). With graphs:
  // the first replay captures its values as kernel arguments; the next, with other values,
  // captures the graph whose update kernels read them from the device, which every later call
  // launches after writing its own there. No call replays on the stream. The updates run in the
  // weight gradients' kernels (folded), or in Adam's own.
  const bool graphs = GENERATE(true, false);
  const bool fold = GENERATE(true, false);
  INFO("CUDA graphs " << (graphs ? "on" : "off") << ", updates " << (fold ? "" : "not ")
                      << "folded");
  GraphsEnabled use_graphs(graphs);
  const StaticFoldActivations folds(fold);
  const StaticRun run = check_scheduled_hyper_parameters(kCuda);
  CHECK((count_of(run.schedule, "weight_grad_adam") > 0) == fold);
  REQUIRE(run.stats.cache.size() == 1);
  const EntryReport& e = run.stats.cache[0];
  INFO("entry " << e.signature << ": " << e.graph_text());
  CHECK(e.graph_capture_failures == 0);
  if (graphs) {
    CHECK(e.graph_captures == 2);
    CHECK(e.graph_launches == 11);
    CHECK(e.stream_replays == 0);
  } else {
    CHECK(e.graph_launches == 0);
    CHECK(e.stream_replays == 11);
  }
}

TEST_CASE(
    "SGD's and momentum SGD's options on a schedule on cuda replay eager's steps with one trace",
    "[cuda][static]") {
  // As Adam's: two captures, then every call launches the graph that reads the options from the
  // device.
  const bool graphs = GENERATE(true, false);
  const bool momentum = GENERATE(false, true);
  INFO("CUDA graphs " << (graphs ? "on" : "off") << (momentum ? ", momentum" : ""));
  GraphsEnabled use_graphs(graphs);
  const StaticRun run = check_scheduled_sgd(kCuda, momentum);
  REQUIRE(run.stats.cache.size() == 1);
  const EntryReport& e = run.stats.cache[0];
  INFO("entry " << e.signature << ": " << e.graph_text());
  CHECK(e.graph_capture_failures == 0);
  CHECK(e.graph_captures == (graphs ? 2 : 0));
  CHECK(e.graph_launches == (graphs ? 11 : 0));
  CHECK(e.stream_replays == (graphs ? 0 : 11));
}

TEST_CASE("a cosine schedule over a static training step on cuda replays eager's steps",
          "[cuda][static][lr_scheduler]") {
  // The rate changes at every call: with graphs on, two captures, then every call one launch of
  // the graph whose update kernels read the options from the device.
  with_graphs_on_and_off([](bool graphs) {
    const StaticRun run = check_cosine_schedule_steps(kCuda);
    REQUIRE(run.stats.cache.size() == 1);
    const EntryReport& e = run.stats.cache[0];
    check_graph_use(e, graphs, 11);
    CHECK(e.graph_captures == (graphs ? 2 : 0));
  });
}

TEST_CASE("a static training step that clips its gradients on cuda replays eager's steps",
          "[cuda][static][clip_grad]") {
  with_graphs_on_and_off([](bool graphs) {
    for (const bool by_value : {false, true}) {
      INFO((by_value ? "by value" : "by the 2-norm"));
      const StaticRun run = check_clipped_steps(kCuda, 2, by_value, by_value ? 0.02 : 0.5);
      REQUIRE(run.stats.cache.size() == 1);
      check_graph_use(run.stats.cache[0], graphs, 11);
      CHECK(count_of(run.schedule, "weight_grad_adam") == 0);
      CHECK(count_of(run.schedule, "writes what copy_ wrote") == 6);
    }
  });
}

TEST_CASE("two forwards before one backward on cuda give eager's gradients", "[cuda][static]") {
  with_graphs_on_and_off([](bool) { check_two_forwards_one_backward(kCuda); });
}

TEST_CASE("seed CNN with a static forward trains on cuda bit for bit like eager",
          "[cuda][static][static_conv]") {
  with_graphs_on_and_off([](bool) { check_seed_cnn_training(kCuda); });
}

TEST_CASE("batch norm statistics and dropout masks under a static step on cuda equal eager",
          "[cuda][static][static_conv]") {
  with_graphs_on_and_off([](bool) {
    KeepGenerators keep;
    check_batch_norm_and_dropout_step(kCuda);
  });
}

TEST_CASE("a replayed dropout on cuda draws a fresh mask on every call, as eager does",
          "[cuda][static][static_conv]") {
  with_graphs_on_and_off([](bool) {
    KeepGenerators keep;
    check_fresh_dropout_masks(kCuda);
  });
}

// ---- Bindings, in-place updates and outputs ------------------------------------------------

TEST_CASE("a replaced parameter on cuda is rebound, or retraced when its shape changes",
          "[cuda][static]") {
  with_graphs_on_and_off([](bool) { check_replaced_parameter(kCuda); });
}

TEST_CASE("a static function on cuda that updates its argument in place replays the update",
          "[cuda][static]") {
  with_graphs_on_and_off([](bool) { check_in_place_argument_update(kCuda); });
}

TEST_CASE("outputs and saved activations on cuda outlive later calls", "[cuda][static]") {
  with_graphs_on_and_off([](bool) { check_kept_output_and_activations(kCuda); });
}

TEST_CASE("a failed CUDA-graph capture replays on the stream, and is tried again on new addresses",
          "[cuda][static]") {
  GraphsEnabled use_graphs(true);
  StaticEnabled on;
  manual_seed(3);
  auto lin = std::make_shared<nn::Linear>(4, 3, nn::LinearOptions{.bias = false, .device = kCuda});
  auto f = static_graph([&](const Tensor& x) { return (*lin)(x); },
                        {.name = "retried_capture", .modules = {lin}});
  const Tensor x = rand({2, 4}, DType::Float32, kCuda, -1, 1);
  F::sum(f(x)).backward();  // trace
  schedule::fail_next_graph_captures(1);
  for (int call = 0; call < 2; ++call) {
    // The first replay's forward capture fails; the same addresses are not captured again.
    Tensor y = f(x);
    CHECK(bit_diff(y, (*lin)(x)) == "");
    F::sum(y).backward();
  }
  EntryReport e = f.stats().cache[0];
  INFO(e.graph_text());
  CHECK(e.graph_capture_failures == 1);
  CHECK(e.graph_fallback.empty());
  CHECK_THAT(e.graph_text(),
             Catch::Matchers::Contains("1 failed capture (forward capture failed") &&
                 Catch::Matchers::Contains("on purpose"));
  const int64_t stream_replays = e.stream_replays;
  CHECK(stream_replays >= 2);  // both forwards
  // A replaced weight: new addresses, captured again, and launched from then on.
  Tensor new_w = rand({3, 4}, DType::Float32, kCuda, -1, 1);
  new_w.set_requires_grad();
  lin->weight = new_w;
  for (int call = 0; call < 2; ++call) {
    Tensor y = f(x);
    CHECK(bit_diff(y, (*lin)(x)) == "");
    F::sum(y).backward();
  }
  e = f.stats().cache[0];
  CHECK(e.graph_capture_failures == 1);
  CHECK(e.graph_fallback.empty());
  CHECK(e.graph_launches >= 2);
  CHECK(e.stream_replays == stream_replays);
}

TEST_CASE("a capture that needs a cuBLASLt plan no eager call made is deferred to the next call",
          "[cuda][static]") {
  // The trace runs the linear with its operands at 256 bytes; the replays read x at 4 bytes past
  // that (a view one element into its storage), which no eager call has run: the first such
  // replay's capture is put off, its stream replay makes the plan, and the next call captures.
  // Sizes of this test's own, so no other case has made their plans, and too large for the small
  // GEMM kernels (runtime/small_gemm.h), which cuBLASLt does not run.
  GraphsEnabled use_graphs(true);
  StaticEnabled on;
  manual_seed(5);
  const int64_t m = 259, k = 711, n = 47;
  REQUIRE(cuda_small_gemm(false, true, m, n, k, 1) == SmallGemm::kNone);
  auto lin = std::make_shared<nn::Linear>(k, n, nn::LinearOptions{.device = kCuda});
  auto f = static_graph([&](const Tensor& x) { return (*lin)(x); },
                        {.name = "deferred_capture", .modules = {lin}});
  NoGradGuard no_grad;
  const Tensor storage = rand({m * k + 1}, DType::Float32, kCuda, -1, 1);
  auto view = [&](int64_t offset) {
    return Tensor(make_intrusive<TensorImpl>(
        storage.impl()->storage, storage.impl()->offset + offset, Shape{m, k}, DType::Float32));
  };
  const Tensor aligned = view(0), odd = view(1);
  (void)f(aligned);  // trace
  // Host copies: each output is dropped at once, so the next call reuses its storage (the same
  // addresses, the same graph).
  std::vector<Tensor> replayed;
  for (int call = 0; call < 3; ++call) replayed.push_back(f(odd).to(Device::cpu()));
  EntryReport e = f.stats().cache[0];
  INFO(e.graph_text());
  CHECK(e.graph_deferred_captures == 1);
  CHECK_THAT(e.graph_last_deferral, Catch::Matchers::Contains("no cuBLASLt algorithm chosen yet"));
  CHECK_THAT(e.graph_text(), Catch::Matchers::Contains("1 capture deferred"));
  CHECK(e.graph_capture_failures == 0);
  CHECK(e.graph_fallback.empty());
  CHECK(e.stream_replays == 1);
  CHECK(e.graph_captures == 1);
  CHECK(e.graph_launches == 2);
  // Eager's bits, eager running after the replays (its plan is the one they made).
  const Tensor want = (*lin)(odd).to(Device::cpu());
  for (const Tensor& y : replayed) CHECK(bit_diff(y, want) == "");
}

TEST_CASE("three failed CUDA-graph captures turn graphs off for the plan, which says why",
          "[cuda][static]") {
  GraphsEnabled use_graphs(true);
  StaticEnabled on;
  manual_seed(4);
  auto lin = std::make_shared<nn::Linear>(4, 3, nn::LinearOptions{.bias = false, .device = kCuda});
  auto f = static_graph([&](const Tensor& x) { return (*lin)(x); },
                        {.name = "graphs_off", .modules = {lin}});
  const Tensor x = rand({2, 4}, DType::Float32, kCuda, -1, 1);
  F::sum(f(x)).backward();  // trace
  // Each call binds a new weight (new addresses: a capture is tried) and its capture fails.
  auto call_with_new_weight = [&] {
    Tensor w = rand({3, 4}, DType::Float32, kCuda, -1, 1);
    w.set_requires_grad();
    lin->weight = w;
    Tensor y = f(x);
    CHECK(bit_diff(y, (*lin)(x)) == "");
    F::sum(y).backward();
  };
  schedule::fail_next_graph_captures(3);
  for (int call = 0; call < 3; ++call) call_with_new_weight();
  EntryReport e = f.stats().cache[0];
  INFO(e.graph_text());
  CHECK(e.graph_capture_failures == 3);
  CHECK_THAT(e.graph_fallback, Catch::Matchers::Contains("3 captures failed") &&
                                   Catch::Matchers::Contains("on purpose"));
  CHECK_THAT(e.graph_text(), Catch::Matchers::Contains("graphs off"));
  CHECK_THAT(f.schedule_text(), Catch::Matchers::Contains("graphs off"));
  // From then on the plan replays on the stream, new addresses or not, and tries no capture.
  const int64_t captures = e.graph_captures, launches = e.graph_launches;
  for (int call = 0; call < 2; ++call) call_with_new_weight();
  e = f.stats().cache[0];
  CHECK(e.graph_capture_failures == 3);
  CHECK(e.graph_captures == captures);
  CHECK(e.graph_launches == launches);
  CHECK(e.stream_replays >= 2 * 5);  // forward and backward of every replayed call
}

// ---- The randomized differential test ------------------------------------------------------

// A failure prints each failing program's seed and listing; to run one alone:
//   ENCORE_RANDOM_SEED=<seed> ENCORE_RANDOM_PROGRAMS=1 encore_cuda_tests "[random]"
TEST_CASE("a static function with ops on the cpu and on cuda is refused, or runs eagerly",
          "[cuda][static]") {
  // A schedule and its arena live on one device.
  StaticEnabled on;
  const Tensor a = rand({4}), b = rand({4}).to(kCuda);
  auto body = [](const Tensor& x, const Tensor& y) {
    return std::pair{F::mul(x, 2.0), F::mul(y, 2.0)};
  };
  auto refused = static_graph(body, {.name = "two_devices"});
  CHECK_THAT(error_of([&] { refused(a, b); }),
             Catch::Matchers::Contains("runs ops on cpu and on cuda:0"));
  auto eager = static_graph(body, {.name = "two_devices_eager", .on_unsafe = OnUnsafe::Eager});
  for (int call = 0; call < 3; ++call) {
    const auto [x2, y2] = eager(a, b);
    CHECK(bit_diff(x2, F::mul(a, 2.0)) == "");
    CHECK(bit_diff(y2, F::mul(b, 2.0)) == "");
  }
  const StaticStats st = eager.stats();
  CHECK(st.traces == 1);  // the first call traced (eagerly), the others ran eagerly
  CHECK(st.hits == 0);
  CHECK(st.eager_calls == 2);
}

TEST_CASE("static_graph on cuda replays random programs bit for bit as eager runs them",
          "[cuda][static][random]") {
  GraphsEnabled use_graphs(true);
  const CheckGraphUse use(true);
  random_program::run_random_programs(kCuda, /*default_programs=*/400);
  use.check();
}

TEST_CASE("static_graph on cuda without CUDA graphs replays random programs as eager runs them",
          "[cuda][static][random]") {
  GraphsEnabled use_graphs(false);
  const CheckGraphUse use(false);
  random_program::run_random_programs(kCuda, /*default_programs=*/200);
  use.check();
}
