// What a replay must see of the state around a static training step: whether .grad exists when
// the step zero-fills it, arguments that require grad or share storage with the tensors the step
// updates, and the optimizer's hyper-parameters (changed between calls, by a checkpoint, inside
// the function) or the optimizer itself (replaced). Each runs beside an eager twin of the same
// program and must equal it bit for bit at every call.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "encore/checkpoint.h"
#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

Tensor leaf(std::initializer_list<double> values, Shape shape) {
  Tensor t = tensor(values, std::move(shape));
  t.set_requires_grad(true);
  return t;
}

std::string last_reason(const StaticStats& s) {
  return s.traces_history.empty() ? std::string() : s.traces_history.back().reason;
}

// A model, its optimizer and a whole training step over them; `is_static` makes the step static.
// One whole training step: the model's loss, zero_grad, backward, the optimizer's step.
Tensor train_step(nn::Module& model, optim::Optimizer& opt, const Tensor& x, const Tensor& t) {
  Tensor loss = F::softmax_cross_entropy(model(x), t);
  opt.zero_grad();
  loss.backward();
  opt.step();
  return loss;
}

template <typename Opt, typename Options>
struct Run {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<Opt> opt;
  std::function<Tensor(const Tensor&, const Tensor&)> step;
  std::function<StaticStats()> stats;  // the static step's

  Run(bool is_static, Options options) {
    manual_seed(11);
    model = nn::mlp(5, 6, 3);
    opt = std::make_unique<Opt>(model->parameters(), options);
    auto body = [this](const Tensor& x, const Tensor& t) { return train_step(*model, *opt, x, t); };
    if (is_static) {
      auto f = static_graph(body, {.name = "step", .modules = {model}});
      step = f;
      stats = [f] { return f.stats(); };
    } else {
      step = body;
    }
  }
};

}  // namespace

TEST_CASE("a step that zero-fills .grad traces again once the first .grad exists", "[static]") {
  // zero_grad(false) leaves an undefined .grad alone and fills a defined one: the trace of the
  // first step, made while .grad did not exist, must not stand for the later ones.
  Tensor held[2];
  int64_t traces = 0;
  std::string reason;
  std::vector<Tensor> grads[2], weights[2];
  for (int st = 0; st < 2; ++st) {
    Tensor w = leaf({1, 2, 3}, {3});
    optim::SGD opt({w}, {.lr = 0.1});
    auto body = [&](const Tensor& x) {
      Tensor loss = F::sum(x * w);
      opt.zero_grad(/*set_to_none=*/false);
      loss.backward();
      opt.step();
      return loss;
    };
    auto step = static_graph(body, {.name = "step"});
    std::function<Tensor(const Tensor&)> call = body;
    if (st == 1) call = [&step](const Tensor& x) { return step(x); };
    const Tensor x = tensor({-0.0, 1, 2}, {3});  // 0 + -0 is +0: a filled .grad is not a new one
    call(x);
    held[st] = w.grad();
    for (int i = 0; i < 4; ++i) {
      call(x);
      grads[st].push_back(clone(w.grad()));
      weights[st].push_back(clone(w));
    }
    CHECK(held[st].shares_storage(w.grad()));
    if (st == 1) {
      traces = step.stats().traces;
      reason = last_reason(step.stats());
    }
  }
  for (size_t i = 0; i < grads[0].size(); ++i) {
    INFO("call " << i + 2);
    CHECK(bit_diff(grads[1][i], grads[0][i]) == "");
    CHECK(bit_diff(weights[1][i], weights[0][i]) == "");
  }
  CHECK_FALSE(std::signbit(grads[1][0].to_vector<float>()[0]));
  CHECK(traces == 2);
  CHECK_THAT(reason, Contains("gradient of captured tensor [3] changed undefined -> defined"));
}

TEST_CASE("a whole step whose argument requires grad is an Error naming the argument", "[static]") {
  Tensor w = leaf({1, 2, 3}, {3});
  optim::SGD opt({w}, {.lr = 0.1});
  auto step = static_graph(
      [&](const Tensor& x, const Tensor& p) {
        Tensor loss = F::sum(x * p * w);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
      },
      {.name = "step"});
  const Tensor x = tensor({1, 1, 1}, {3});
  const std::string message = error_of([&] { step(x, w); });
  CHECK_THAT(message, Contains("step: the traced function runs a backward, and its argument 1 "
                               "[3] requires grad"));
  CHECK(bit_diff(w, tensor({1, 2, 3}, {3})) == "");
  // Detached, it is an input like any other.
  CHECK(error_of([&] { step(x, w.detach()); }).empty());
}

TEST_CASE("an argument sharing storage with a tensor the step updates is never replayed",
          "[static]") {
  // The step reads argument p after updating a; eagerly a call that passes a's storage as p reads
  // the updated values. The schedule keeps a and p apart (its early updates and lanes move the
  // update ahead of the read), so such a call traces, and later calls that do not share replay.
  std::vector<Tensor> b_after[2];
  StaticStats stats;
  for (int st = 0; st < 2; ++st) {
    Tensor a = leaf({1, 2, 3, 4}, {2, 2});
    Tensor b = leaf({1, -1, 2, 0}, {2, 2});
    const Tensor x = tensor({1, 1, 1, 1}, {2, 2});
    optim::SGD opt({a, b}, {.lr = 0.5});
    auto body = [&](const Tensor& p) {
      Tensor loss = F::sum(F::matmul(x, a)) + F::sum(F::matmul(b, p));
      opt.zero_grad();
      loss.backward();
      opt.step();
      return loss;
    };
    auto step = static_graph(body, {.name = "step"});
    std::function<Tensor(const Tensor&)> call = body;
    if (st == 1) call = [&step](const Tensor& p) { return step(p); };
    const Tensor apart = tensor({0, 1, 0, 1}, {2, 2});
    for (int i = 0; i < 7; ++i) {
      call(i == 2 || i == 3 || i == 5 ? a.detach() : apart);
      b_after[st].push_back(clone(b));
    }
    if (st == 1) stats = step.stats();
  }
  for (size_t i = 0; i < b_after[0].size(); ++i) {
    INFO("call " << i + 1);
    CHECK(bit_diff(b_after[1][i], b_after[0][i]) == "");
  }
  std::string reasons;
  for (const RetraceEvent& e : stats.traces_history) reasons += e.reason + "\n";
  INFO(reasons);
  CHECK(stats.hits >= 2);  // the calls that do not share still replay
  bool said = false;
  for (const RetraceEvent& e : stats.traces_history)
    said = said || e.reason.find("argument 0 [2,2] shares storage with") != std::string::npos;
  CHECK(said);
}

TEST_CASE("hyper-parameters changed at every call are read by the replays, with no new trace",
          "[static]") {
  // A schedule between calls (warm-up, decay, a one-cycle momentum): each optimizer's update
  // steps take its hyper-parameters as they are at the call.
  manual_seed(3);
  const Tensor x = randn({4, 5});
  const Tensor t = tensor({0, 1, 2, 0}, {4}, DType::Int32);
  auto run = [&](auto& eager, auto& stat, auto schedule) {
    for (int i = 0; i < 6; ++i) {
      schedule(*eager.opt, i);
      schedule(*stat.opt, i);
      INFO("call " << i + 1);
      CHECK(bit_diff(stat.step(x, t), eager.step(x, t)) == "");
      check_same_parameters(*stat.model, *eager.model, "after the call");
    }
    const StaticStats st = stat.stats();
    CHECK(st.traces == 1);
    CHECK(st.hits == 5);
    CHECK(stat.opt->steps() == 6);
  };
  SECTION("SGD, its learning rate and weight decay") {
    Run<optim::SGD, optim::SGDOptions> eager(false, {.lr = 0.1}), stat(true, {.lr = 0.1});
    run(eager, stat, [](optim::SGD& o, int i) {
      o.options.lr = 0.1 * (i + 1) / 6;
      o.options.weight_decay = 0.01 * i;
    });
  }
  SECTION("MomentumSGD, its learning rate and momentum") {
    Run<optim::MomentumSGD, optim::MomentumSGDOptions> eager(false, {.lr = 0.1}),
        stat(true, {.lr = 0.1});
    run(eager, stat, [](optim::MomentumSGD& o, int i) {
      o.options.lr = 0.2 / (i + 1);
      o.options.momentum = 0.95 - 0.05 * i;
    });
  }
}

TEST_CASE("Adam's hyper-parameters on a schedule replay eager's steps with one trace", "[static]") {
  const StaticRun run = check_scheduled_hyper_parameters(Device::cpu());
  CHECK_THAT(run.schedule,
             Contains("adam_update") && Contains("hyper-parameters read at each call"));
}

TEST_CASE("SGD's and momentum SGD's options on a schedule replay eager's steps with one trace",
          "[static]") {
  const bool momentum = GENERATE(false, true);
  INFO((momentum ? "momentum SGD" : "SGD"));
  const StaticRun run = check_scheduled_sgd(Device::cpu(), momentum);
  CHECK_THAT(run.schedule, Contains(momentum ? "momentum_sgd_update" : "sgd_update") &&
                               Contains("hyper-parameters read at each call"));
}

TEST_CASE("a hyper-parameter step() refuses, set between calls, raises step()'s Error",
          "[static]") {
  // The replay does not run step(), which checks its options: the call traces again, and the
  // traced step() raises. A valid value after it replays the first trace again.
  manual_seed(11);
  auto model = nn::mlp(5, 6, 3);
  optim::Adam opt(model->parameters(), {.lr = 0.01});
  auto step =
      static_graph([&](const Tensor& x, const Tensor& t) { return train_step(*model, opt, x, t); },
                   {.name = "step", .modules = {model}});
  const Tensor x = randn({4, 5});
  const Tensor t = tensor({0, 1, 2, 0}, {4}, DType::Int32);
  step(x, t);
  step(x, t);
  opt.options.beta1 = 1.5;
  CHECK_THAT(error_of([&] { step(x, t); }), Contains("beta1"));
  CHECK(last_reason(step.stats()) ==
        "Adam: beta1 must be in [0, 1), got 1.5; the function threw it");
  opt.options.beta1 = 0.8;
  const int64_t traces = step.stats().traces;
  step(x, t);
  CHECK(step.stats().traces == traces);
  CHECK(step.stats().hits == 2);
}

TEST_CASE("a dynamic batch and a scheduled learning rate replay together as eager runs them",
          "[static][dynamic]") {
  Run<optim::Adam, optim::AdamOptions> eager(false, {.lr = 0.01}), stat(true, {.lr = 0.01});
  manual_seed(5);
  const int64_t batches[] = {4, 6, 5, 7, 4, 6};
  int i = 0;
  for (int64_t n : batches) {
    const Tensor x = randn({n, 5});
    std::vector<double> labels;
    for (int64_t k = 0; k < n; ++k) labels.push_back(static_cast<double>(k % 3));
    const Tensor t = tensor(labels, {n}, DType::Int32);
    eager.opt->options.lr = stat.opt->options.lr = 0.01 * (++i);
    INFO("call " << i << ", batch " << n);
    CHECK(bit_diff(stat.step(x, t), eager.step(x, t)) == "");
    check_same_parameters(*stat.model, *eager.model, "after the call");
  }
  const StaticStats st = stat.stats();
  CHECK(st.traces == 2);
  CHECK(st.dynamic_events == 1);
}

TEST_CASE("a checkpoint loaded into a traced step's optimizer resumes bit for bit", "[static]") {
  const std::string path =
      (std::filesystem::temp_directory_path() / "encore_static_user_state.safetensors").string();
  manual_seed(7);
  const Tensor x = randn({4, 5});
  const Tensor t = tensor({0, 1, 2, 0}, {4}, DType::Int32);
  // The uninterrupted run, static, saved after three steps.
  Run<optim::Adam, optim::AdamOptions> a(true, {.lr = 0.05});
  for (int i = 0; i < 3; ++i) a.step(x, t);
  save(path, *a.model, a.opt.get());
  std::vector<Tensor> reference;
  for (int i = 0; i < 3; ++i) reference.push_back(a.step(x, t));
  // Another model and optimizer, with another learning rate, traced before the load.
  Run<optim::Adam, optim::AdamOptions> b(true, {.lr = 1e-3});
  b.step(x, t);
  b.step(x, t);
  load(path, *b.model, b.opt.get());
  CHECK(b.opt->options.lr == 0.05);
  for (int i = 0; i < 3; ++i) {
    INFO("step " << i + 1 << " after the load");
    CHECK(bit_diff(b.step(x, t), reference[i]) == "");
  }
  check_same_parameters(*b.model, *a.model, "the end");
  std::filesystem::remove(path);
}

TEST_CASE("an optimizer replaced by assignment is the one the replays use", "[static]") {
  Run<optim::MomentumSGD, optim::MomentumSGDOptions> eager(false, {.lr = 0.1}),
      stat(true, {.lr = 0.1});
  manual_seed(3);
  const Tensor x = randn({4, 5});
  const Tensor t = tensor({0, 1, 2, 0}, {4}, DType::Int32);
  for (int i = 0; i < 5; ++i) {
    if (i == 2) {  // new velocity tensors, at zero
      *eager.opt = optim::MomentumSGD(eager.model->parameters(), {.lr = 0.1});
      *stat.opt = optim::MomentumSGD(stat.model->parameters(), {.lr = 0.1});
    }
    INFO("call " << i + 1);
    CHECK(bit_diff(stat.step(x, t), eager.step(x, t)) == "");
    check_same_parameters(*stat.model, *eager.model, "after the call");
  }
}

TEST_CASE("a learning rate the step itself changes is never baked into a replay", "[static]") {
  // A schedule inside the function: host code a replay cannot run, so every call traces.
  std::vector<Tensor> losses[2];
  for (int st = 0; st < 2; ++st) {
    manual_seed(11);
    auto model = nn::mlp(5, 6, 3);
    optim::SGD opt(model->parameters(), {.lr = 0.1});
    auto body = [&](const Tensor& x, const Tensor& t) {
      Tensor loss = train_step(*model, opt, x, t);
      opt.options.lr *= 0.5;
      return loss;
    };
    auto step = static_graph(body, {.name = "step", .modules = {model}});
    manual_seed(3);
    const Tensor x = randn({4, 5});
    const Tensor t = tensor({0, 1, 2, 0}, {4}, DType::Int32);
    for (int i = 0; i < 4; ++i) losses[st].push_back(st == 1 ? step(x, t) : body(x, t));
    if (st == 1) {
      CHECK(step.stats().hits == 0);
      CHECK_THAT(last_reason(step.stats()), Contains("SGD lr"));
    }
  }
  for (size_t i = 0; i < losses[0].size(); ++i) CHECK(bit_diff(losses[1][i], losses[0][i]) == "");
}

TEST_CASE("a submodule switched to eval, or another mix of modes, is a new signature", "[static]") {
  // Freezing batch norm for fine-tuning: the model stays in train mode, its norm does not.
  manual_seed(5);
  auto bn = std::make_shared<nn::BatchNorm2d>(4);
  auto drop = std::make_shared<nn::Dropout>(0.5);
  auto model = std::make_shared<nn::Sequential>(
      std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::Linear>(3, 4), bn, drop});
  auto f = static_graph([&](const Tensor& x) { return (*model)(x); },
                        {.name = "forward", .modules = {model}});
  NoGradGuard no_grad;
  const Tensor x = randn({6, 3});
  auto check = [&](const char* when) {
    INFO(when);
    const Tensor mean_before = clone(bn->running_mean);
    manual_seed(9);
    const Tensor ys = f(x);
    const Tensor mean_static = clone(bn->running_mean);
    copy_(bn->running_mean, mean_before);
    manual_seed(9);
    const Tensor ye = (*model)(x);
    CHECK(bit_diff(ys, ye) == "");
    CHECK(bit_diff(mean_static, bn->running_mean) == "");
  };
  f(x);
  f(x);
  bn->eval();  // the norm only
  check("norm in eval, the rest in train");
  bn->train();
  drop->eval();  // the dropout only: another mix
  check("dropout in eval, the rest in train");
  const StaticStats s = f.stats();
  CHECK(s.traces == 3);
  // The reasons name the modules whose mode differs from the rest.
  REQUIRE(s.traces_history.size() == 3);
  CHECK(s.traces_history[1].reason == "mode changed train -> train but 1 (BatchNorm2d) in eval");
  CHECK(s.traces_history[2].reason ==
        "mode changed train but 1 (BatchNorm2d) in eval -> train but 2 (Dropout) in eval");
  model->eval();
  drop->train();
  f(x);
  CHECK_THAT(f.stats().traces_history.back().reason, Contains("-> eval but 2 (Dropout) in train"));
}

TEST_CASE("a buffer replaced by another tensor is the one the replays update", "[static]") {
  auto bn = std::make_shared<nn::BatchNorm2d>(2);
  auto f =
      static_graph([&](const Tensor& x) { return (*bn)(x); }, {.name = "norm", .modules = {bn}});
  NoGradGuard no_grad;
  const Tensor x = tensor({1, 2, 3, 5}, {2, 2});
  f(x);
  f(x);
  bn->running_mean = zeros({2});  // statistics reset by assignment
  const Tensor fresh = bn->running_mean;
  f(x);
  CHECK(fresh.is_same(bn->running_mean));
  CHECK(bit_diff(fresh, tensor({0.2, 0.35}, {2})) == "");
}

TEST_CASE("weights tied when traced and untied later trace again; tied later they replay",
          "[static]") {
  // Tied weights are one tensor in two slots: the trace reads both layers' weight through one
  // buffer, so untying them must not replay (layer a would read layer b's new weight).
  manual_seed(41);
  auto a = std::make_shared<nn::Linear>(4, 4), b = std::make_shared<nn::Linear>(4, 4);
  b->weight = a->weight;
  auto seq = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{a, b});
  auto body = [&](const Tensor& x) { return F::sum(F::tanh((*seq)(x))); };
  auto f = static_graph(body, {.name = "tied", .modules = {seq}});
  const Tensor x = randn({3, 4});
  auto check_call = [&](const char* what) {
    INFO(what);
    seq->zero_grad(true);
    const Tensor ls = f(x);
    ls.backward();
    const Tensor ga = a->weight.grad(), gb = b->weight.grad();
    seq->zero_grad(true);
    const Tensor le = body(x);
    le.backward();
    CHECK(bit_diff(ls, le) == "");
    CHECK(bit_diff(ga, a->weight.grad()) == "");
    CHECK(bit_diff(gb, b->weight.grad()) == "");
  };
  check_call("traced tied");
  check_call("replayed tied");
  CHECK(f.stats().hits == 1);
  b->weight = randn({4, 4}).set_requires_grad();
  check_call("untied");
  CHECK(f.stats().traces == 2);
  CHECK_THAT(last_reason(f.stats()),
             Contains("parameters '0.weight' and '1.weight' were one tensor when traced (tied)"));
  check_call("untied, replayed");
  b->weight = a->weight;  // tied again: two slots reading one tensor replay as traced untied
  check_call("tied again");
  check_call("tied again, replayed");
}

TEST_CASE("a parameter computed outside the function (not a leaf) is never replayed", "[static]") {
  // A reparametrised weight (weight = v * s, recomputed before each call): a replay would send
  // the gradient through the traced call's v * s. As a captured non-leaf, it is unsafe.
  manual_seed(42);
  auto lin = std::make_shared<nn::Linear>(3, 2);
  Tensor v = randn({2, 3}).set_requires_grad();
  const Tensor x = randn({4, 3});
  auto body = [&](const Tensor& in) { return F::sum(F::tanh((*lin)(in))); };
  SECTION("an Error by default") {
    auto f = static_graph(body, {.name = "reparam", .modules = {lin}});
    lin->weight = v * 2.0;
    CHECK_THROWS_WITH(f(x), Contains("uses parameter 'weight' [2,3], which requires grad and was "
                                     "computed outside it (it is not a leaf)"));
  }
  SECTION("eager calls with OnUnsafe::Eager") {
    auto f =
        static_graph(body, {.name = "reparam", .on_unsafe = OnUnsafe::Eager, .modules = {lin}});
    for (int c = 0; c < 3; ++c) {
      INFO("call " << c);
      v.set_grad(Tensor());
      lin->weight = v * (2.0 + c);
      const Tensor ls = f(x);
      ls.backward();
      const Tensor gv = v.grad();
      v.set_grad(Tensor());
      lin->weight = v * (2.0 + c);
      const Tensor le = body(x);
      le.backward();
      CHECK(bit_diff(ls, le) == "");
      CHECK(bit_diff(gv, v.grad()) == "");
    }
    CHECK(f.stats().hits == 0);
  }
}

// A module option that forward() passes to an op as an attribute is part of a static function's
// trace: were it assignable, a change between calls would be ignored by every replay. Such options
// are fixed at construction (read through accessors, or const).
template <typename M>
concept AssignablePaddingIdx = requires(M& m) {
  m.padding_idx = 1;
};
template <typename M>
concept AssignableEps = requires(M& m) {
  m.eps = 10.0;
};
template <typename M>
concept AssignableNormalizedShape = requires(M& m) {
  m.normalized_shape = std::vector<int64_t>{4};
};
template <typename M>
concept AssignableOptions = requires(M& m) {
  m.options = m.options;
};

TEST_CASE("module options a trace holds as op attributes cannot be changed after construction",
          "[static][nn]") {
  CHECK_FALSE(AssignablePaddingIdx<nn::Embedding>);
  CHECK_FALSE(AssignableEps<nn::LayerNorm>);
  CHECK_FALSE(AssignableNormalizedShape<nn::LayerNorm>);
  CHECK_FALSE(AssignableOptions<nn::LSTM>);
  CHECK_FALSE(AssignableOptions<nn::MultiheadAttention>);
  CHECK_FALSE(AssignableOptions<nn::TransformerBlock>);
}

TEST_CASE("an optimizer copied, then destroyed, is not read by the guards of its steps",
          "[static]") {
  // The copy has its own identity: the step traced with the original traces again with the copy
  // (under the address sanitizer, reading the destroyed original would be reported).
  manual_seed(11);
  auto model = nn::mlp(5, 6, 3);
  auto first = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.1});
  optim::SGD* opt = first.get();
  auto step =
      static_graph([&](const Tensor& x, const Tensor& t) { return train_step(*model, *opt, x, t); },
                   {.name = "step", .modules = {model}});
  const Tensor x = randn({4, 5});
  const Tensor t = tensor({0, 1, 2, 0}, {4}, DType::Int32);
  step(x, t);
  step(x, t);
  auto second = std::make_unique<optim::SGD>(*first);
  opt = second.get();
  first.reset();
  step(x, t);
  CHECK(step.stats().traces == 2);
  CHECK_THAT(last_reason(step.stats()), Contains("SGD optimizer was replaced"));
  step(x, t);
  CHECK(step.stats().hits == 2);
}

namespace {
// An optimizer defined outside encore: plain SGD through the protected dispatch, without saying
// its attributes (update_attrs).
class OwnSgd : public optim::Optimizer {
 public:
  OwnSgd(std::vector<Tensor> params, double lr) : Optimizer(std::move(params)), lr_(lr) {}
  void step() override {
    NoGradGuard no_grad;
    dispatch_updates(Op::SgdUpdate, AttrBlob::of(SgdAttrs{lr_, 0.0, 0.0}), false,
                     [&](size_t i, const Tensor& g, std::vector<Tensor>& in) {
                       in.insert(in.end(), {params_[i], g});
                     });
    count_step();
  }

 private:
  double lr_;
};
}  // namespace

// An optimizer defined outside encore that says its attributes (update_attrs): watched (a new
// rate traces again) unless it lets the replays read them; one that dispatches other attributes
// than it says is watched even then.
class WatchedSgd : public optim::Optimizer {
 public:
  enum class Mode { Watched, ReplaysRead, ReplaysReadOtherAttrs };
  WatchedSgd(std::vector<Tensor> params, Mode mode) : Optimizer(std::move(params)), mode_(mode) {}
  double lr = 0.1;
  void step() override {
    NoGradGuard no_grad;
    const double scale = mode_ == Mode::ReplaysReadOtherAttrs ? 0.5 : 1.0;
    dispatch_updates(Op::SgdUpdate, AttrBlob::of(SgdAttrs{lr * scale, 0.0, 0.0}), false,
                     [&](size_t i, const Tensor& g, std::vector<Tensor>& in) {
                       in.insert(in.end(), {params_[i], g});
                     });
    count_step();
  }

 protected:
  AttrBlob update_attrs() const override { return AttrBlob::of(SgdAttrs{lr, 0.0, 0.0}); }
  bool replays_read_hyper_parameters() const override { return mode_ != Mode::Watched; }

 private:
  Mode mode_;
};

TEST_CASE("an optimizer defined outside encore has its rate read by replays only if it says so",
          "[static]") {
  using Mode = WatchedSgd::Mode;
  const auto [mode, traces] = GENERATE(table<Mode, int64_t>(
      {{Mode::Watched, 4}, {Mode::ReplaysRead, 1}, {Mode::ReplaysReadOtherAttrs, 4}}));
  INFO("mode " << static_cast<int>(mode));
  manual_seed(11);
  auto model = nn::mlp(5, 6, 3);
  manual_seed(11);
  auto twin = nn::mlp(5, 6, 3);
  WatchedSgd opt(model->parameters(), mode), twin_opt(twin->parameters(), mode);
  auto step =
      static_graph([&](const Tensor& x, const Tensor& t) { return train_step(*model, opt, x, t); },
                   {.name = "step", .modules = {model}});
  const Tensor x = randn({4, 5});
  const Tensor t = tensor({0, 1, 2, 0}, {4}, DType::Int32);
  for (int i = 0; i < 4; ++i) {
    opt.lr = twin_opt.lr = 0.1 / (i + 1);
    INFO("call " << i + 1);
    CHECK(bit_diff(step(x, t), train_step(*twin, twin_opt, x, t)) == "");
    check_same_parameters(*model, *twin, "after the call");
  }
  CHECK(step.stats().traces == traces);
}

TEST_CASE("verify mode checks replays whose hyper-parameters changed since the trace", "[static]") {
  manual_seed(11);
  auto model = nn::mlp(5, 6, 3);
  optim::MomentumSGD opt(model->parameters(), {.lr = 0.1});
  auto step =
      static_graph([&](const Tensor& x, const Tensor& t) { return train_step(*model, opt, x, t); },
                   {.name = "step", .verify_every = 1, .modules = {model}});
  const Tensor x = randn({4, 5});
  const Tensor t = tensor({0, 1, 2, 0}, {4}, DType::Int32);
  for (int i = 0; i < 4; ++i) {
    opt.options.lr = 0.1 / (i + 1);
    opt.options.momentum = 0.9 - 0.1 * i;
    INFO("call " << i + 1);
    CHECK(error_of([&] { step(x, t); }) == "");
  }
  CHECK(step.stats().traces == 1);
  CHECK(step.stats().hits == 3);
}

TEST_CASE("a step with an optimizer defined outside encore replays", "[static]") {
  manual_seed(11);
  auto model = nn::mlp(5, 6, 3);
  OwnSgd opt(model->parameters(), 0.1);
  auto step =
      static_graph([&](const Tensor& x, const Tensor& t) { return train_step(*model, opt, x, t); },
                   {.name = "step", .modules = {model}});
  const Tensor x = randn({4, 5});
  const Tensor t = tensor({0, 1, 2, 0}, {4}, DType::Int32);
  for (int i = 0; i < 4; ++i) step(x, t);
  CHECK(step.stats().traces == 1);
  CHECK(step.stats().hits == 3);
}

TEST_CASE("a parameter replaced while the optimizer keeps the old one traces again", "[static]") {
  StaticEnabled on;
  // Eagerly, the optimizer goes on updating (and zeroing) the tensor it holds, no longer the
  // model's; the model's new weight only collects gradients.
  struct Twin {
    std::shared_ptr<nn::Linear> lin;
    std::unique_ptr<optim::SGD> opt;
    std::vector<Tensor> old;
    Twin() {
      manual_seed(7);
      lin = std::make_shared<nn::Linear>(4, 2);
      opt = std::make_unique<optim::SGD>(lin->parameters(), optim::SGDOptions{.lr = 0.1});
      old = lin->parameters();
    }
    Tensor step(const Tensor& x) {
      Tensor loss = F::sum((*lin)(x) * (*lin)(x));
      opt->zero_grad();
      loss.backward();
      opt->step();
      return loss;
    }
  } eager, traced;
  auto step = static_graph([&traced](const Tensor& x) { return traced.step(x); },
                           {.name = "kept_optimizer", .modules = {traced.lin}});
  manual_seed(3);
  const Tensor x = randn({3, 4});
  for (int call = 0; call < 5; ++call) {
    CAPTURE(call);
    if (call == 2)
      for (Twin* t : {&eager, &traced}) {
        t->lin->weight = full({2, 4}, 0.5);
        t->lin->weight.set_requires_grad(true);
      }
    CHECK(bit_diff(step(x), eager.step(x)) == "");
    CHECK(bit_diff(traced.lin->weight, eager.lin->weight) == "");
    CHECK(bit_diff(traced.lin->weight.grad(), eager.lin->weight.grad()) == "");
    CHECK(bit_diff(traced.old[0], eager.old[0]) == "");
  }
  // Replaced, then the new weight's first .grad (made by the first call after).
  const StaticStats s = step.stats();
  CHECK(s.traces == 3);
  REQUIRE(s.traces_history.size() == 3);
  CHECK_THAT(s.traces_history[1].reason,
             Contains("parameter 'weight' was replaced by another tensor; the trace updated the "
                      "one it had in place"));
}

TEST_CASE("a step that reads an optimizer's steps() on the host is never replayed", "[static]") {
  // A schedule made from the step count (lr = 0.1 / (1 + steps())): a replay would keep the
  // trace's rate. The read is unsafe, as a host read of a tensor's values.
  manual_seed(12);
  auto model = nn::mlp(5, 6, 3);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  auto body = [&](const Tensor& x, const Tensor& t) {
    opt.options.lr = 0.1 / (1.0 + static_cast<double>(opt.steps()));
    return train_step(*model, opt, x, t);
  };
  const Tensor x = randn({4, 5});
  const Tensor t = tensor({0, 1, 2, 0}, {4}, DType::Int32);
  SECTION("an Error by default") {
    auto step = static_graph(body, {.name = "scheduled", .modules = {model}});
    CHECK_THROWS_WITH(step(x, t),
                      Contains("scheduled: the traced function reads SGD's steps() on the host") &&
                          Contains("add_(count, 1.0)"));
  }
  SECTION("eager calls with OnUnsafe::Eager, eager's rates") {
    auto step =
        static_graph(body, {.name = "scheduled", .on_unsafe = OnUnsafe::Eager, .modules = {model}});
    for (int c = 0; c < 3; ++c) step(x, t);
    CHECK(step.stats().hits == 0);
    CHECK(opt.steps() == 3);
    CHECK(opt.options.lr == 0.1 / 3.0);
  }
}

namespace {
// Momentum SGD as PyTorch's optimizers are often written: its velocities made on the first
// step() (lazily), not in the constructor.
class LazyMomentum : public optim::Optimizer {
 public:
  explicit LazyMomentum(std::vector<Tensor> params) : Optimizer(std::move(params)) {}
  void step() override {
    NoGradGuard no_grad;
    if (velocity_.empty())
      for (const Tensor& p : params_) velocity_.push_back(zeros_like(p));
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].grad().defined()) continue;
      copy_(velocity_[i], F::add(F::mul(velocity_[i], 0.9), params_[i].grad()));
      add_(params_[i], F::mul(velocity_[i], -0.05));
    }
    count_step();
  }
  std::vector<Tensor> velocity_;
};
}  // namespace

TEST_CASE("a tensor the traced call makes and keeps without returning it is never replayed",
          "[static]") {
  // The replays would write arena buffers, not the tensor the trace left behind: a velocity made
  // on the first step() would stay as the trace left it, a tensor kept for later would keep the
  // trace's values. Each is unsafe; with OnUnsafe::Eager the calls run eagerly, as eager.
  const Tensor x = randn({4, 5});
  const Tensor t = tensor({0, 1, 2, 0}, {4}, DType::Int32);
  SECTION("state made on the first call") {
    for (const OnUnsafe mode : {OnUnsafe::Error, OnUnsafe::Eager}) {
      manual_seed(13);
      auto model = nn::mlp(5, 6, 3);
      manual_seed(13);
      auto twin = nn::mlp(5, 6, 3);
      LazyMomentum opt(model->parameters()), twin_opt(twin->parameters());
      auto step = static_graph(
          [&](const Tensor& a, const Tensor& b) { return train_step(*model, opt, a, b); },
          {.name = "lazy", .on_unsafe = mode, .modules = {model}});
      if (mode == OnUnsafe::Error) {
        CHECK_THROWS_WITH(step(x, t), Contains("lazy: a tensor [6,5] the traced call made (first "
                                               "written by fill_) is still held after the call") &&
                                          Contains("Make state before the first call"));
        continue;
      }
      for (int c = 0; c < 4; ++c)
        CHECK(bit_diff(step(x, t), train_step(*twin, twin_opt, x, t)) == "");
      CHECK(step.stats().hits == 0);
      for (size_t i = 0; i < opt.velocity_.size(); ++i)
        CHECK(bit_diff(opt.velocity_[i], twin_opt.velocity_[i]) == "");
    }
  }
  SECTION("a result kept for later instead of returned") {
    Tensor kept;
    auto f = static_graph(
        [&kept](const Tensor& a) {
          kept = F::tanh(a);
          return F::sum(kept);
        },
        {.name = "keeps"});
    CHECK_THROWS_WITH(f(x), Contains("keeps: a tensor [4,5] the traced call made (first written "
                                     "by tanh) is still held after the call, and not returned"));
  }
}

TEST_CASE("a constant cached on the first call replays as the trace's copy", "[static]") {
  // A table made from constants alone and kept for later calls (a mask, positions): the replays
  // bind its trace value, the same values the cache holds, so keeping it is no escape.
  Tensor cache;
  auto body = [&cache](const Tensor& x) {
    if (!cache.defined()) cache = F::mul(arange(3), 3.0);
    return F::add(x, cache);
  };
  auto f = static_graph(body, {.name = "cached"});
  for (int c = 0; c < 3; ++c) {
    const Tensor x = tensor({1.0 * c, 2, 3}, {3});
    CHECK(bit_diff(f(x), body(x)) == "");
  }
  CHECK(f.stats().hits == 2);
}

TEST_CASE("tables computed from constants alone and cached are allowed, folded or not",
          "[static]") {
  // A softmax or a reduction of constants is not folded (its bits may depend on the thread
  // count), but every replay computes it again from the same constants: caching it is no escape,
  // with constant folding on or off.
  for (const bool fold : {true, false}) {
    INFO("fold " << fold);
    SwitchScope<set_static_fold_constants_enabled> folding(fold);
    Tensor window, mask;
    auto body = [&](const Tensor& x) {
      if (!window.defined()) window = F::softmax(F::mul(arange(3), 0.3), -1);
      if (!mask.defined()) mask = F::greater(arange(3), zeros({}));
      return F::where(mask, F::mul(x, window), x);
    };
    auto f = static_graph(body, {.name = "tables"});
    for (int c = 0; c < 3; ++c) {
      const Tensor x = tensor({1.0 * c, 2, 3}, {3});
      CHECK(bit_diff(f(x), body(x)) == "");
    }
    CHECK(f.stats().hits == 2);
  }
}

namespace {
// A module that keeps its output for later (PyTorch's self.last = y) and returns it too.
struct KeepsLast : nn::Module {
  Tensor forward(const Tensor& x) override {
    last = F::tanh(x);
    return last;
  }
  Tensor last;
  ENCORE_STATIC_GRAPH({.name = "keeps_last"});
};
}  // namespace

TEST_CASE("a result the traced code also assigned to a variable is never replayed", "[static]") {
  // A replay returns a new tensor and assigns nothing: `last` (or an RNN's state kept in members
  // and returned) would keep the trace's values.
  NoGradGuard no_grad;
  KeepsLast m;
  CHECK_THROWS_WITH(m(randn({2, 3})),
                    Contains("keeps_last: a tensor [2,3] the traced call returns is also held by "
                             "a variable its code assigned it to") &&
                        Contains("Use what each call returns"));
  // Returned only: the caller's to keep.
  auto f = static_graph([](const Tensor& x) { return F::tanh(x); }, {.name = "returns"});
  std::vector<Tensor> kept;
  for (int c = 0; c < 3; ++c) {
    const Tensor x = randn({2, 3});
    kept.push_back(f(x));
    CHECK(bit_diff(kept.back(), F::tanh(x)) == "");
  }
  CHECK(f.stats().hits == 2);
}
