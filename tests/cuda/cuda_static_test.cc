// static_graph on cuda:0: a replay runs the kernels eager runs, so it equals eager bit for bit on
// the same device, whether the schedules replay as CUDA graphs or launch by launch
// (cuda::set_graphs_enabled(false)). The MLP with Adam (module and whole-step forms), two forwards
// before one backward, the seed CNN with SGD, a model with batch norm and dropout (running
// statistics and masks), rebinding a replaced parameter, in-place updates of arguments, outputs
// that outlive later calls, and the randomized differential test (random_program_check.h).
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/cuda.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/random_program_check.h"
#include "tests/static_models.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;

namespace {

std::vector<Batch> on_device(std::vector<Batch> batches) {
  for (Batch& b : batches) {
    b.x = b.x.to(kCuda);
    b.t = b.t.to(kCuda);
  }
  return batches;
}

template <typename M>
std::shared_ptr<M> moved(std::shared_ptr<M> m) {
  m->to(kCuda);
  return m;
}

// cuda:0's generator, saved before one run and restored before the other.
struct CudaGenerator {
  Generator::Stream s;
  static CudaGenerator now() { return {default_generator(kCuda).state()}; }
  void restore() const { default_generator(kCuda).set_state(s); }
  bool operator==(const CudaGenerator&) const = default;
};

void check_same_running_stats(const BnNet& a, const BnNet& b, const std::string& when) {
  INFO(when);
  CHECK(host_bit_diff(a.bn->running_mean, b.bn->running_mean) == "");
  CHECK(host_bit_diff(a.bn->running_var, b.bn->running_var) == "");
}

Tensor device_labels(int64_t n, int64_t classes) {
  Tensor t = Tensor::empty({n}, DType::Int32);
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(i * 3 % classes);
  return t.to(kCuda);
}

// How the entry's replays ran: with graphs on, every replayed phase was one graph launch (a
// forward per hit, and a backward when the schedule has one) and nothing fell back; with graphs
// off, none was.
void check_graph_use(const EntryReport& e, bool graphs, int64_t hits) {
  INFO("entry " << e.signature << ": " << e.graph_text());
  if (graphs) {
    CHECK(e.graph_fallback == "");
    CHECK(e.stream_replays == 0);
    CHECK(e.graph_launches >= hits);
    CHECK(e.graph_launches <= 2 * hits);
    CHECK(e.graph_captures >= 1);
    CHECK(e.graph_captures <= e.graph_launches);
  } else {
    CHECK(e.graph_launches == 0);
    CHECK(e.graph_captures == 0);
    CHECK(e.stream_replays >= hits);
  }
}

}  // namespace

// ---- Replay equals eager -------------------------------------------------------------------

TEST_CASE("MLP training with a static forward (module form) on cuda equals eager bit for bit",
          "[cuda][static]") {
  const bool graphs = GENERATE(true, false);
  INFO("CUDA graphs " << (graphs ? "on" : "off"));
  GraphsEnabled use_graphs(graphs);
  StaticEnabled on;
  const auto batches = on_device(mlp_batches(20, 32, 784, 11));
  REQUIRE(batches.size() == 20);
  manual_seed(0);
  auto eager = moved(nn::mlp(784, 100, 10));
  manual_seed(0);
  auto model = moved(std::make_shared<StaticMlp>(784, 100, 10));
  check_same_parameters_on_host(*eager, *model, "after construction");
  AdamStep eager_step(eager), static_step(model);

  for (int step = 0; step < 20; ++step) {
    const Batch& b = batches[step];
    Tensor eager_loss = eager_step(b);
    Tensor static_loss = static_step(b);
    INFO("step " << step);
    CHECK(static_loss.device() == kCuda);
    CHECK(host_bit_diff(eager_loss, static_loss) == "");
    check_same_parameters_on_host(*eager, *model, cat("step ", step));
  }
  const StaticStats s = static_stats(*model);
  CHECK(s.calls == 20);
  CHECK(s.traces == 1);
  CHECK(s.hits == 19);
  CHECK(s.eager_calls == 0);
  REQUIRE(s.cache.size() == 1);
  CHECK(s.cache[0].complete);
  check_graph_use(s.cache[0], graphs, 19);
}

TEST_CASE("MLP training with the whole step static (function form) on cuda equals eager",
          "[cuda][static]") {
  const bool graphs = GENERATE(true, false);
  INFO("CUDA graphs " << (graphs ? "on" : "off"));
  GraphsEnabled use_graphs(graphs);
  StaticEnabled on;
  const auto batches = on_device(mlp_batches(20, 32, 784, 12));
  REQUIRE(batches.size() == 20);
  manual_seed(0);
  auto eager = moved(nn::mlp(784, 100, 10));
  manual_seed(0);
  auto model = moved(nn::mlp(784, 100, 10));
  AdamStep eager_step(eager), model_step(model);
  auto step = model_step.make_static({.name = "cuda_mlp_step", .arg_names = {"x", "t"}});

  for (int i = 0; i < 20; ++i) {
    const Batch& b = batches[i];
    Tensor eager_loss = eager_step(b);
    Tensor static_loss = step(b.x, b.t);
    INFO("step " << i);
    CHECK(host_bit_diff(eager_loss, static_loss) == "");
    check_same_parameters_on_host(*eager, *model, cat("step ", i));
  }
  const StaticStats s = step.stats();
  CHECK(s.calls == 20);
  CHECK(s.traces == 1);
  CHECK(s.hits == 19);
  CHECK(s.eager_calls == 0);
  REQUIRE(s.cache.size() == 1);
  check_graph_use(s.cache[0], graphs, 19);
  // The schedule dump says how the entry replayed.
  CHECK_THAT(step.schedule_text(), Catch::Matchers::Contains("on cuda:0: "));
}

TEST_CASE("two forwards before one backward on cuda give eager's gradients", "[cuda][static]") {
  const bool graphs = GENERATE(true, false);
  INFO("CUDA graphs " << (graphs ? "on" : "off"));
  GraphsEnabled use_graphs(graphs);
  StaticEnabled on;
  const auto batches = on_device(mlp_batches(4, 16, 20, 13));
  REQUIRE(batches.size() == 4);
  manual_seed(1);
  auto eager = moved(nn::mlp(20, 32, 10));
  manual_seed(1);
  auto model = moved(std::make_shared<StaticMlp>(20, 32, 10));

  F::softmax_cross_entropy((*eager)(batches[0].x), batches[0].t).backward();
  F::softmax_cross_entropy((*model)(batches[0].x), batches[0].t).backward();
  check_same_parameters_on_host(*eager, *model, "after the traced call");
  eager->zero_grad();
  model->zero_grad();

  Tensor e1 = F::softmax_cross_entropy((*eager)(batches[1].x), batches[1].t);
  Tensor e2 = F::softmax_cross_entropy((*eager)(batches[2].x), batches[2].t);
  Tensor s1 = F::softmax_cross_entropy((*model)(batches[1].x), batches[1].t);
  Tensor s2 = F::softmax_cross_entropy((*model)(batches[2].x), batches[2].t);
  CHECK(host_bit_diff(e1, s1) == "");
  CHECK(host_bit_diff(e2, s2) == "");
  (e1 + e2).backward();
  (s1 + s2).backward();
  check_same_parameters_on_host(*eager, *model, "after two forwards and one backward");

  F::softmax_cross_entropy((*eager)(batches[3].x), batches[3].t).backward();
  F::softmax_cross_entropy((*model)(batches[3].x), batches[3].t).backward();
  check_same_parameters_on_host(*eager, *model, "after accumulating into existing gradients");

  const StaticStats s = static_stats(*model);
  CHECK(s.traces == 1);
  CHECK(s.hits == 3);
  REQUIRE(s.cache.size() == 1);
  CHECK(s.cache[0].arenas >= 2);
}

TEST_CASE("seed CNN with a static forward trains on cuda bit for bit like eager",
          "[cuda][static][static_conv]") {
  const bool graphs = GENERATE(true, false);
  INFO("CUDA graphs " << (graphs ? "on" : "off"));
  GraphsEnabled use_graphs(graphs);
  StaticEnabled on;
  manual_seed(3);
  auto eager = moved(std::make_shared<models::SeedCnn>());
  manual_seed(3);
  auto stat = moved(std::make_shared<StaticSeedCnn>());
  optim::SGD opt_e(eager->parameters()), opt_s(stat->parameters());
  const Tensor labels = device_labels(4, 10);
  for (int step = 0; step < 8; ++step) {
    const Tensor x = rand({4, 784}).to(kCuda);
    Tensor le = F::softmax_cross_entropy((*eager)(x), labels);
    eager->zero_grad();
    le.backward();
    opt_e.step();
    Tensor ls = F::softmax_cross_entropy((*stat)(x), labels);
    stat->zero_grad();
    ls.backward();
    opt_s.step();
    const std::string when = cat("step ", step);
    INFO(when);
    CHECK(host_bit_diff(le, ls) == "");
    check_same_parameters_on_host(*eager, *stat, when);
  }
  const StaticStats st = static_stats(*stat);
  CHECK(st.traces == 1);
  CHECK(st.hits == 7);
}

TEST_CASE("batch norm statistics and dropout masks under a static step on cuda equal eager",
          "[cuda][static][static_conv]") {
  const bool graphs = GENERATE(true, false);
  INFO("CUDA graphs " << (graphs ? "on" : "off"));
  GraphsEnabled use_graphs(graphs);
  StaticEnabled on;
  KeepGenerators keep;
  manual_seed(5);
  auto eager = moved(std::make_shared<BnNet>());
  manual_seed(5);
  auto stat = moved(std::make_shared<BnNet>());
  optim::Adam opt_e(eager->parameters()), opt_s(stat->parameters());
  auto make_step = [](BnNet& m, optim::Adam& opt) {
    return [&m, &opt](const Tensor& x, const Tensor& t) {
      Tensor loss = F::softmax_cross_entropy(m(x), t);
      m.zero_grad();
      loss.backward();
      opt.step();
      return loss;
    };
  };
  auto eager_step = make_step(*eager, opt_e);
  auto static_step =
      static_graph(make_step(*stat, opt_s), {.name = "cuda_bn_step", .modules = {stat}});
  const Tensor labels = device_labels(6, 3);
  Tensor x;
  std::vector<Tensor> losses;
  for (int step = 0; step < 8; ++step) {
    // Steps 4 to 7 reuse the input of step 3: only fresh dropout masks (and the updated
    // parameters) make their losses differ.
    if (step <= 3) x = randn({6, 2, 5, 5}).to(kCuda);
    const CudaGenerator before = CudaGenerator::now();
    Tensor le = eager_step(x, labels);
    const CudaGenerator after_eager = CudaGenerator::now();
    before.restore();
    Tensor ls = static_step(x, labels);
    const std::string when = cat("step ", step);
    INFO(when);
    CHECK(CudaGenerator::now() == after_eager);  // the replay drew exactly as many numbers
    CHECK_FALSE(after_eager == before);          // and the dropout drew some
    CHECK(host_bit_diff(le, ls) == "");
    check_same_parameters_on_host(*eager, *stat, when);
    check_same_running_stats(*eager, *stat, when);
    losses.push_back(on_host(ls));
  }
  const StaticStats st = static_step.stats();
  CHECK(st.traces == 1);
  CHECK(st.hits == 7);
  CHECK(bit_diff(losses[5], losses[6]) != "");  // fresh masks (and new parameters)
  CHECK(host_bit_diff(stat->bn->running_mean, zeros({4}, DType::Float32, kCuda)) != "");
  CHECK(host_bit_diff(stat->bn->running_var, ones({4}, DType::Float32, kCuda)) != "");
}

TEST_CASE("a replayed dropout on cuda draws a fresh mask on every call, as eager does",
          "[cuda][static][static_conv]") {
  const bool graphs = GENERATE(true, false);
  INFO("CUDA graphs " << (graphs ? "on" : "off"));
  GraphsEnabled use_graphs(graphs);
  StaticEnabled on;
  KeepGenerators keep;
  auto drop = std::make_shared<nn::Dropout>(0.5);
  auto f = static_graph([&](const Tensor& x) { return (*drop)(x); },
                        {.name = "cuda_drop", .modules = {drop}});
  const Tensor x = ones({4096}, DType::Float32, kCuda);
  manual_seed(11);
  std::vector<Tensor> replayed;
  for (int i = 0; i < 5; ++i) replayed.push_back(f(x));  // a trace, then replays
  CHECK(f.stats().hits == 4);
  manual_seed(11);
  for (int i = 0; i < 5; ++i) {
    INFO("call " << i);
    CHECK(host_bit_diff(replayed[i], (*drop)(x)) == "");
    if (i > 0) CHECK(host_bit_diff(replayed[i], replayed[i - 1]) != "");
  }
}

// ---- Bindings, in-place updates and outputs ------------------------------------------------

TEST_CASE("a replaced parameter on cuda is rebound, or retraced when its shape changes",
          "[cuda][static]") {
  const bool graphs = GENERATE(true, false);
  INFO("CUDA graphs " << (graphs ? "on" : "off"));
  GraphsEnabled use_graphs(graphs);
  StaticEnabled on;
  manual_seed(2);
  auto lin = std::make_shared<nn::Linear>(4, 3, nn::LinearOptions{.bias = false, .device = kCuda});
  auto f = static_graph([&](const Tensor& x) { return (*lin)(x); },
                        {.name = "cuda_replaced", .modules = {lin}});
  const Tensor x = rand({2, 4}, DType::Float32, kCuda, -1, 1);

  F::sum(f(x)).backward();  // trace, completed by its backward
  F::sum(f(x)).backward();  // replay
  REQUIRE(f.stats().hits == 1);
  const Tensor old_w = lin->weight;
  const Tensor old_grad = on_host(old_w.grad());

  Tensor new_w = rand({3, 4}, DType::Float32, kCuda, -1, 1);
  new_w.set_requires_grad();
  lin->weight = new_w;
  Tensor out = f(x);
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().hits == 2);
  CHECK(host_bit_diff(out, (*lin)(x)) == "");
  F::sum(out).backward();
  REQUIRE(new_w.grad().defined());
  const Tensor static_grad = on_host(new_w.grad());
  CHECK(bit_diff(on_host(old_w.grad()), old_grad) == "");  // the old weight is no longer written
  new_w.set_grad(Tensor());
  F::sum((*lin)(x)).backward();
  CHECK(bit_diff(static_grad, on_host(new_w.grad())) == "");

  Tensor wide = rand({5, 4}, DType::Float32, kCuda, -1, 1);
  wide.set_requires_grad();
  lin->weight = wide;
  Tensor out5 = f(x);
  CHECK(f.stats().traces == 2);
  CHECK(out5.shape() == Shape{2, 5});
  CHECK(host_bit_diff(out5, (*lin)(x)) == "");
}

TEST_CASE("a static function on cuda that updates its argument in place replays the update",
          "[cuda][static]") {
  const bool graphs = GENERATE(true, false);
  INFO("CUDA graphs " << (graphs ? "on" : "off"));
  GraphsEnabled use_graphs(graphs);
  StaticEnabled on;
  Tensor w = rand({3, 2}).to(kCuda).set_requires_grad();
  auto body = [&](const Tensor& x) {
    add_(x, full_like(x, 1.0));
    return F::sum(F::matmul(x, w));
  };
  auto f = static_graph(body, {.name = "cuda_in_place_arg"});
  for (int i = 0; i < 4; ++i) {
    INFO("call " << i);
    Tensor xs = rand({4, 3}).to(kCuda);
    Tensor xe = clone(xs);
    w.set_grad(Tensor());
    const Tensor ys = f(xs);
    ys.backward();
    const Tensor static_grad = on_host(w.grad());
    w.set_grad(Tensor());
    const Tensor ye = body(xe);
    ye.backward();
    CHECK(host_bit_diff(ys, ye) == "");
    CHECK(bit_diff(static_grad, on_host(w.grad())) == "");
    CHECK(host_bit_diff(xs, xe) == "");  // the caller's tensor holds the update
  }
  CHECK(f.stats().hits == 3);
}

TEST_CASE("outputs and saved activations on cuda outlive later calls", "[cuda][static]") {
  const bool graphs = GENERATE(true, false);
  INFO("CUDA graphs " << (graphs ? "on" : "off"));
  GraphsEnabled use_graphs(graphs);
  StaticEnabled on;
  manual_seed(4);
  auto model = moved(nn::mlp(6, 8, 3));
  auto f = static_graph([&](const Tensor& x) { return (*model)(x); },
                        {.name = "cuda_kept_forward", .modules = {model}});
  F::sum(f(rand({4, 6}).to(kCuda))).backward();  // trace and complete
  model->zero_grad();
  const Tensor x1 = rand({4, 6}, DType::Float32, Device::cpu(), -1, 1).to(kCuda);
  const Tensor kept = f(x1);
  const Tensor kept_then = on_host(kept);
  for (int i = 2; i <= 5; ++i) f(rand({4, 6}, DType::Float32, Device::cpu(), -1, 1).to(kCuda));
  CHECK(f.stats().hits == 5);
  CHECK(bit_diff(on_host(kept), kept_then) == "");
  F::sum(kept).backward();  // the saved activations of call 1 are intact
  std::vector<Tensor> static_grads;
  for (const Tensor& p : model->parameters()) static_grads.push_back(on_host(p.grad()));
  model->zero_grad();
  const Tensor expected = (*model)(x1);
  CHECK(host_bit_diff(kept, expected) == "");
  F::sum(expected).backward();
  const auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(bit_diff(static_grads[i], on_host(params[i].grad())) == "");
  }
}

// ---- The randomized differential test ------------------------------------------------------

// A failure prints each failing program's seed and listing; to run one alone:
//   ENCORE_RANDOM_SEED=<seed> ENCORE_RANDOM_PROGRAMS=1 encore_cuda_tests "[random]"
TEST_CASE("static_graph on cuda replays random programs bit for bit as eager runs them",
          "[cuda][static][random]") {
  GraphsEnabled use_graphs(true);
  random_program::run_random_programs(kCuda, /*default_programs=*/400);
}

TEST_CASE("static_graph on cuda without CUDA graphs replays random programs as eager runs them",
          "[cuda][static][random]") {
  GraphsEnabled use_graphs(false);
  random_program::run_random_programs(kCuda, /*default_programs=*/200);
}
