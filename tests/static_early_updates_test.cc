// Early optimizer updates in whole-step static functions: each update step moves to right after
// the last step it depends on (its gradient's last write, the last read of the old parameter),
// and replays still give eager's bits with SGD, momentum SGD and Adam, with the pass on and off;
// an update never passes a step that reads the parameter it writes; verify mode checks a
// reordered plan. A gradient zeroed by zero_grad(false) gets its first contribution in one step
// (fill_ and add_ folded), with eager's +0.0 where the contribution is -0.0.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/static_models.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

using StaticEarlyUpdates = SwitchScope<set_static_early_updates_enabled>;

bool is_update(const std::string& op) {
  return op == "sgd_update" || op == "momentum_sgd_update" || op == "adam_update";
}

// A step of the first entry's forward schedule as the dump shows it: its op, its marks, and the
// buffers it reads and writes (an input written in place counts as both).
struct DumpStep {
  std::string op, marks;
  std::set<int> reads, writes;
};

std::vector<DumpStep> forward_steps(const std::string& text) {
  std::vector<DumpStep> steps;
  const std::regex step(R"(^\s+(\d+)\s+([a-z_0-9]+)(\s.*)?$)");
  const std::regex operand(R"(^\s+(in|out)\s+\d+\s+b(\d+)\s.*$)");
  std::istringstream in(text);
  bool forward = false;
  for (std::string line; std::getline(in, line);) {
    if (line.find("forward: ") != std::string::npos) {
      forward = true;
      continue;
    }
    if (!forward) continue;
    if (line.find("backward: ") != std::string::npos) break;
    std::smatch m;
    if (std::regex_match(line, m, step)) {
      CHECK(std::stoi(m[1]) == static_cast<int>(steps.size()));
      steps.push_back({m[2], m[3], {}, {}});
    } else if (std::regex_match(line, m, operand) && !steps.empty()) {
      const int b = std::stoi(m[2]);
      if (m[1] == "in") steps.back().reads.insert(b);
      if (m[1] == "out" || line.find("(written in place)") != std::string::npos)
        steps.back().writes.insert(b);
    }
  }
  return steps;
}

bool shares(const std::set<int>& a, const std::set<int>& b) {
  return std::any_of(a.begin(), a.end(), [&](int x) { return b.contains(x); });
}

// Whether step `s` must stay before update `u` (it writes what u reads or writes, or reads what
// u writes).
bool must_precede(const DumpStep& s, const DumpStep& u) {
  return shares(s.writes, u.reads) || shares(s.writes, u.writes) || shares(s.reads, u.writes);
}

// Trains an eager MLP and a whole-step static twin for `steps` steps with optimizers made by
// `make_opt`: losses and parameters equal bit for bit after every step. Returns the schedule dump.
template <typename MakeOpt>
std::string check_whole_steps(MakeOpt make_opt, int steps,
                              StaticOptions options = {.name = "whole_step"}) {
  StaticEnabled on;
  const auto mlps = twin_mlps<MlpNet>(Device::cpu(), /*seed=*/7, 24, 16, steps, 8,
                                      /*data_seed=*/3);
  TrainStep eager(mlps.eager, make_opt);
  TrainStep model(mlps.model, make_opt);
  auto step = model.make_static(options);
  for (int i = 0; i < steps; ++i) {
    INFO("step " << i);
    const Batch& b = mlps.batches[i];
    CHECK(bit_diff(eager(b.x, b.t), step(b.x, b.t)) == "");
    check_same_parameters(*mlps.eager, *mlps.model, cat("step ", i));
  }
  check_one_trace_then_replays(step.stats(), steps);
  return step.schedule_text();
}

auto sgd = [](nn::Module& m) { return optim::SGD(m.parameters(), {.lr = 0.05}); };
auto momentum = [](nn::Module& m) {
  return optim::MomentumSGD(m.parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
};
auto adam = [](nn::Module& m) { return optim::Adam(m.parameters(), {.lr = 1e-2}); };

// The MLP has three linear layers: six parameters, six updates.
constexpr int kUpdates = 6;

// `expected_updates` update steps, each after every step it depends on and (fusion off) right
// after the last of them or behind updates moved there before it; the first update is not after
// the last other step (the updates run inside the backward). Returns how many are marked moved.
int check_early_positions(const std::vector<DumpStep>& steps, int expected_updates) {
  int updates = 0, moved = 0, last_other = -1, first_update = -1;
  for (int p = 0; p < static_cast<int>(steps.size()); ++p) {
    const DumpStep& u = steps[p];
    if (!is_update(u.op)) {
      last_other = p;
      continue;
    }
    ++updates;
    if (first_update < 0) first_update = p;
    moved += u.marks.find("moved early: recorded as step") != std::string::npos;
    INFO("update at " << p << ": " << u.op << u.marks);
    // Nothing after it depends on what it changes, nor writes what it reads.
    for (int q = p + 1; q < static_cast<int>(steps.size()); ++q)
      if (!is_update(steps[q].op)) CHECK_FALSE(must_precede(u, steps[q]));
    // As early as allowed: the nearest non-update step before it is one it depends on.
    int q = p - 1;
    while (q >= 0 && is_update(steps[q].op)) --q;
    if (q >= 0) CHECK(must_precede(steps[q], u));
  }
  CHECK(updates == expected_updates);
  CHECK(first_update < last_other);
  return moved;
}

}  // namespace

TEST_CASE("whole-step SGD, momentum SGD and Adam replay eager's bits with early updates on and off",
          "[early_updates]") {
  for (const bool early : {true, false}) {
    for (const bool fuse : {true, false}) {
      INFO("early updates " << early << ", fusion " << fuse);
      const StaticEarlyUpdates setting(early);
      const StaticFusion fusion(fuse);
      for (const std::string& text : {check_whole_steps(sgd, 6), check_whole_steps(momentum, 6),
                                      check_whole_steps(adam, 6)}) {
        INFO(text);
        const std::vector<DumpStep> steps = forward_steps(text);
        const auto moved = std::count_if(steps.begin(), steps.end(), [](const DumpStep& s) {
          return s.marks.find("moved early") != std::string::npos;
        });
        if (early) {
          // The last gradients (the first linear's weight and bias, in one weight_bias_grad
          // step) may be the backward's last step.
          CHECK(moved >= kUpdates - 2);
        } else {
          // As recorded: every update after the whole backward.
          CHECK(moved == 0);
          const auto first = std::find_if(steps.begin(), steps.end(),
                                          [](const DumpStep& s) { return is_update(s.op); });
          CHECK(std::all_of(first, steps.end(), [](const DumpStep& s) { return is_update(s.op); }));
          CHECK(steps.end() - first == kUpdates);
        }
      }
    }
  }
}

TEST_CASE("each update runs right after the last step it depends on", "[early_updates]") {
  const StaticEarlyUpdates early(true);
  const StaticFusion unfused(false);  // every op its own step
  for (const std::string& text :
       {check_whole_steps(sgd, 3), check_whole_steps(momentum, 3), check_whole_steps(adam, 3)}) {
    INFO(text);
    CHECK(check_early_positions(forward_steps(text), kUpdates) >= kUpdates - 2);
  }
}

TEST_CASE("an update does not move past a step that reads the old parameter", "[early_updates]") {
  const StaticEarlyUpdates early(true);
  const StaticFusion unfused(false);
  StaticEnabled on;
  manual_seed(9);
  const auto make = [] { return std::make_shared<nn::Linear>(5, 3); };
  auto eager_lin = make();
  manual_seed(9);
  auto lin = make();
  // After the backward, a step still reads the old weight (its doubled sum is returned); only
  // then does the optimizer write it.
  auto body = [](nn::Linear& l, optim::SGD& opt, const Tensor& x) {
    opt.zero_grad();
    F::sum(l(x)).backward();
    Tensor old_sum;
    {
      NoGradGuard no_grad;
      old_sum = F::sum(F::mul(l.weight, 2.0));
    }
    opt.step();
    return old_sum;
  };
  optim::SGD eager_opt(eager_lin->parameters()), opt(lin->parameters());
  auto step = static_graph([&](const Tensor& x) { return body(*lin, opt, x); },
                           {.name = "reads_old_weight", .modules = {lin}});
  for (int i = 0; i < 4; ++i) {
    INFO("step " << i);
    const Tensor x = rand({2, 5});
    CHECK(bit_diff(body(*eager_lin, eager_opt, x), step(x)) == "");
    check_same_parameters(*eager_lin, *lin, cat("step ", i));
  }
  const std::string text = step.schedule_text();
  INFO(text);
  const std::vector<DumpStep> steps = forward_steps(text);
  int read_old = -1, update = -1, old_sum = -1;
  for (int p = 0; p < static_cast<int>(steps.size()); ++p) {
    if (steps[p].op == "mul_scalar") read_old = p;
    if (steps[p].op == "sum" && read_old >= 0 && p > read_old) old_sum = p;
    if (is_update(steps[p].op) && read_old >= 0 && shares(steps[p].writes, steps[read_old].reads))
      update = p;
  }
  REQUIRE(read_old >= 0);
  REQUIRE(update >= 0);
  CHECK(update == read_old + 1);  // right after the read, not before it
  CHECK(old_sum > update);        // ahead of the sum recorded before it
  CHECK_THAT(steps[update].marks, Contains("moved early"));
  check_early_positions(steps, 2);
}

TEST_CASE("verify mode checks a whole step whose updates were moved", "[early_updates]") {
  const StaticEarlyUpdates early(true);
  for (const bool fuse : {true, false}) {
    INFO("fusion " << fuse);
    const StaticFusion fusion(fuse);
    const std::string text =
        check_whole_steps(adam, 4, {.name = "verified_whole_step", .verify_every = 1});
    INFO(text);
    CHECK_THAT(text, Contains("moved early: recorded as step"));
  }
  // The verifications ran (every replay): check_whole_steps compared the bits; count them here.
  // Activations and constants stay unfolded, so the plan has the recorded number of steps.
  StaticEnabled on;
  const StaticFoldActivations unfolded(false);
  const StaticFoldConstants constants(false);
  const auto mlps = twin_mlps<MlpNet>(Device::cpu(), 7, 24, 16, 3, 8, 3);
  TrainStep model(mlps.model, momentum);
  auto step = model.make_static({.name = "verified_count", .verify_every = 1});
  for (const Batch& b : mlps.batches) step(b.x, b.t);
  CHECK(step.stats().verifications == 2);
  CHECK_THAT(step.schedule_text(), Contains("moved early"));
  // The optimizer switched to one update call for all parameters, which no guard watches (the
  // values are the same either way): the first update in the function's order is named, though
  // the replay runs a later one first. The updates are the last recorded steps, and no step was
  // dropped or added.
  const int recorded = step.stats().cache[0].forward_steps;
  model.optimizer().options.foreach = true;
  const std::string error = error_of([&] { step(mlps.batches[0].x, mlps.batches[0].t); });
  CHECK_THAT(error, Contains(cat("verify: verified_count: forward op ", recorded - kUpdates,
                                 " differs: the schedule has momentum_sgd_update")));
}

TEST_CASE("the early-updates switch is read when a signature is traced", "[early_updates]") {
  const bool before = static_early_updates_enabled();
  {
    const StaticEarlyUpdates off(false);
    CHECK_FALSE(static_early_updates_enabled());
    CHECK_THAT(check_whole_steps(sgd, 2), !Contains("moved early"));
  }
  CHECK(static_early_updates_enabled() == before);
}

namespace {

// loss = sum(x * scale) + sum(fc(x)) for a 1-D x: scale's gradient is x itself, -0.0 included.
class ScaleNet : public nn::Module {
 public:
  ScaleNet() : fc(register_module("fc", std::make_shared<nn::Linear>(6, 3))) {
    scale = ones({6});
    register_parameter("scale", &scale);
  }
  Tensor forward(const Tensor& x) override {
    return F::sum(F::mul(x, scale)) + F::sum((*fc)(F::reshape(x, {1, 6})));
  }
  Tensor scale;
  std::shared_ptr<nn::Linear> fc;
};

}  // namespace

TEST_CASE("a zeroed gradient's first contribution is written at once with eager's bits",
          "[early_updates]") {
  for (const bool early : {true, false}) {
    INFO("early updates " << early);
    const StaticEarlyUpdates setting(early);
    StaticEnabled on;
    auto eager = seeded(4, Device::cpu(), [] { return std::make_shared<ScaleNet>(); });
    auto model = seeded(4, Device::cpu(), [] { return std::make_shared<ScaleNet>(); });
    for (auto* m : {eager.get(), model.get()})  // defined gradients: zero_grad fills them
      for (Tensor& p : m->parameters()) p.set_grad(zeros(p.shape()));
    optim::SGD opt_e(eager->parameters()), opt_s(model->parameters());
    // zero_grad(false) keeps each .grad and fills it with zeros; the backward adds into it.
    auto body = [](ScaleNet& m, optim::SGD& opt, const Tensor& x) {
      opt.zero_grad(/*set_to_none=*/false);
      Tensor loss = m(x);
      loss.backward();
      opt.step();
      return loss;
    };
    auto step = static_graph([&](const Tensor& x) { return body(*model, opt_s, x); },
                             {.name = "zero_filled", .verify_every = 1, .modules = {model}});
    for (int i = 0; i < 4; ++i) {
      INFO("step " << i);
      Tensor x = Tensor::empty({6}, DType::Float32);
      const float values[] = {-0.0f, 1.5f, -2.0f, 0.0f, -0.0f, 0.25f * static_cast<float>(i)};
      std::copy(std::begin(values), std::end(values), x.data<float>());
      CHECK(bit_diff(body(*eager, opt_e, x), step(x)) == "");
      check_same_parameters(*eager, *model, cat("step ", i));
      // 0 + (-0.0) is +0.0: a copy of the contribution would have kept the sign.
      CHECK_FALSE(std::signbit(model->scale.grad().data<float>()[0]));
    }
    const StaticStats st = step.stats();
    check_one_trace_then_replays(st, 4);
    CHECK(st.verifications == 3);  // every replay, the folded step compared with eager's add_
    const std::string text = step.schedule_text();
    INFO(text);
    const std::regex zero_fill(R"(fill_\s+\[scalar 0;)");
    if (early) {
      CHECK_FALSE(std::regex_search(text, zero_fill));
      CHECK_THAT(text, Contains("add_scalar") && Contains("fill_ and add_ in one: recorded as"));
    } else {
      CHECK(std::regex_search(text, zero_fill));
      CHECK_THAT(text, !Contains("fill_ and add_ in one"));
    }
  }
}
