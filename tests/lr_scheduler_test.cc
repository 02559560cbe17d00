// Learning-rate schedulers (encore/lr_scheduler.h): each one's rates against PyTorch's documented
// examples or its closed form, the optimizer's rate set at construction and at each step, moving
// to an epoch, refused arguments and rates, and a schedule over a static training step.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "encore/encore.h"
#include "tests/static_clip_schedule_scenarios.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

std::vector<Tensor> one_parameter() {
  return {zeros({3}).set_requires_grad(true)};
}

// The rates a scheduler sets at epochs 0 .. count - 1 (stepping once per epoch), each checked to
// be the optimizer's rate and last_lr().
std::vector<double> rates(optim::LRScheduler& s, const optim::Optimizer& opt, int count) {
  std::vector<double> out;
  for (int e = 0; e < count; ++e) {
    if (e > 0) s.step();
    CHECK(s.last_epoch() == e);
    double lr = -1;
    for (const auto& [name, value] : opt.hyper_parameters())
      if (name == "lr") lr = value;
    CHECK(lr == s.last_lr());
    CHECK(s.lr_at(e) == s.last_lr());
    out.push_back(s.last_lr());
  }
  return out;
}

}  // namespace

TEST_CASE("StepLR and MultiStepLR give PyTorch's documented rates", "[optim][lr_scheduler]") {
  // torch.optim.lr_scheduler.StepLR and MultiStepLR: 0.05 until 30, 0.005 until 60 (StepLR) or
  // 80 (MultiStepLR), then 0.0005.
  {
    optim::SGD opt(one_parameter(), {.lr = 0.05});
    optim::StepLR s(opt, /*step_size=*/30, /*gamma=*/0.1);
    const std::vector<double> r = rates(s, opt, 91);
    CHECK(r[0] == 0.05);
    CHECK(r[29] == 0.05);
    CHECK(r[30] == Approx(0.005));
    CHECK(r[59] == Approx(0.005));
    CHECK(r[60] == Approx(0.0005));
    CHECK(r[90] == Approx(0.00005));
  }
  {
    optim::SGD opt(one_parameter(), {.lr = 0.05});
    optim::MultiStepLR s(opt, {30, 80}, 0.1);
    const std::vector<double> r = rates(s, opt, 100);
    CHECK(r[29] == 0.05);
    CHECK(r[30] == Approx(0.005));
    CHECK(r[79] == Approx(0.005));
    CHECK(r[80] == Approx(0.0005));
    CHECK(r[99] == Approx(0.0005));
  }
}

TEST_CASE("ExponentialLR, CosineAnnealingLR, LinearLR and LambdaLR follow their closed forms",
          "[optim][lr_scheduler]") {
  {
    optim::Adam opt(one_parameter(), {.lr = 0.1});
    optim::ExponentialLR s(opt, 0.5);
    const std::vector<double> r = rates(s, opt, 5);
    CHECK(r == std::vector<double>{0.1, 0.05, 0.025, 0.0125, 0.00625});
  }
  {
    optim::Adam opt(one_parameter(), {.lr = 0.1});
    optim::CosineAnnealingLR s(opt, /*t_max=*/10, /*eta_min=*/0.001);
    const std::vector<double> r = rates(s, opt, 21);
    CHECK(r[0] == 0.1);
    CHECK(r[5] == Approx((0.1 + 0.001) / 2));
    CHECK(s.lr_at(40) == 0.1);  // back at the base rate every 2 t_max
    CHECK(r[10] == 0.001);  // cos(pi) is -1 exactly
    CHECK(r[15] == Approx((0.1 + 0.001) / 2));
    CHECK(r[20] == Approx(0.1));  // up again, as PyTorch's
    for (int e = 1; e <= 10; ++e) CHECK(r[e] < r[e - 1]);
  }
  {
    // PyTorch's LinearLR example: 0.025, 0.03125, 0.0375, 0.04375, then 0.05.
    optim::MomentumSGD opt(one_parameter(), {.lr = 0.05});
    optim::LinearLR s(opt, /*start_factor=*/0.5, /*end_factor=*/1.0, /*total_iters=*/4);
    const std::vector<double> r = rates(s, opt, 7);
    const std::vector<double> expected{0.025, 0.03125, 0.0375, 0.04375, 0.05, 0.05, 0.05};
    for (size_t e = 0; e < expected.size(); ++e) CHECK(r[e] == Approx(expected[e]));
    CHECK(r[4] == 0.05);  // end_factor 1 at total_iters: the base rate exactly
    // A decay: 1 to 0.1 of the base over 3 epochs.
    optim::LinearLR down(opt, 1.0, 0.1, 3);
    CHECK(down.lr_at(0) == 0.05);
    CHECK(down.lr_at(1) == Approx(0.05 * 0.7));
    CHECK(down.lr_at(3) == Approx(0.005));
    CHECK(down.lr_at(9) == down.lr_at(3));
  }
  {
    // With eta_min, epoch 0 is the base rate itself, though eta_min + (base - eta_min) rounds.
    const double base = 0.010745170000902466, eta_min = 0.0014899130696207795;
    REQUIRE(eta_min + (base - eta_min) != base);
    optim::Adam opt(one_parameter(), {.lr = base});
    optim::CosineAnnealingLR s(opt, 7, eta_min);
    CHECK(opt.options.lr == base);
  }
  {
    // A linear warm-up over 4 epochs, then halving every 2.
    optim::AdamW opt(one_parameter(), {.lr = 0.08});
    optim::LambdaLR s(opt, [](int64_t e) {
      return e < 4 ? static_cast<double>(e + 1) / 4 : std::pow(0.5, (e - 4) / 2);
    });
    const std::vector<double> r = rates(s, opt, 8);
    CHECK(r == std::vector<double>{0.02, 0.04, 0.06, 0.08, 0.08, 0.08, 0.04, 0.04});
    CHECK(s.base_lr() == 0.08);
    CHECK(s.kind() == "LambdaLR");
  }
}

TEST_CASE("set_last_epoch moves a scheduler to an epoch, as a resumed run needs",
          "[optim][lr_scheduler]") {
  optim::Adam first(one_parameter(), {.lr = 0.1});
  optim::StepLR a(first, 2, 0.5);
  for (int e = 0; e < 5; ++e) a.step();
  // A resumed run: the optimizer made at its base rate, the scheduler too, then moved.
  optim::Adam resumed(one_parameter(), {.lr = 0.1});
  optim::StepLR b(resumed, 2, 0.5);
  b.set_last_epoch(5);
  CHECK(b.last_epoch() == 5);
  CHECK(resumed.options.lr == first.options.lr);
  CHECK(resumed.options.lr == 0.025);
  b.step();
  a.step();
  CHECK(resumed.options.lr == first.options.lr);
  CHECK_THROWS_WITH(b.set_last_epoch(-1), Contains("StepLR::set_last_epoch") && Contains("-1"));
  CHECK(b.last_epoch() == 6);
}

TEST_CASE("schedulers refuse bad arguments, and a refused rate changes nothing",
          "[optim][lr_scheduler]") {
  optim::SGD opt(one_parameter(), {.lr = 0.1});
  CHECK_THROWS_WITH(optim::StepLR(opt, 0), Contains("StepLR: step_size must be positive, got 0"));
  CHECK_THROWS_WITH(optim::StepLR(opt, 3, -0.5), Contains("StepLR: gamma must be positive"));
  CHECK_THROWS_WITH(optim::MultiStepLR(opt, {5, 5}),
                    Contains("MultiStepLR: the milestones must increase, got 5 then 5"));
  CHECK_THROWS_WITH(optim::ExponentialLR(opt, std::nan("")), Contains("ExponentialLR: gamma"));
  CHECK_THROWS_WITH(optim::CosineAnnealingLR(opt, 0), Contains("CosineAnnealingLR: t_max"));
  CHECK_THROWS_WITH(optim::CosineAnnealingLR(opt, 5, -1), Contains("CosineAnnealingLR: eta_min"));
  CHECK_THROWS_WITH(optim::LinearLR(opt, 0.0), Contains("LinearLR: start_factor"));
  CHECK_THROWS_WITH(optim::LinearLR(opt, 0.5, 1.5), Contains("LinearLR: end_factor"));
  CHECK_THROWS_WITH(optim::LinearLR(opt, 0.5, 1.0, 0), Contains("LinearLR: total_iters"));
  CHECK_THROWS_WITH(optim::LambdaLR(opt, nullptr), Contains("LambdaLR: the factor function"));
  // None of those set a rate.
  CHECK(opt.options.lr == 0.1);

  // A factor that turns negative at epoch 3: the optimizer refuses it; the epoch and rate stay.
  optim::LambdaLR s(opt, [](int64_t e) { return 1.0 - 0.4 * static_cast<double>(e); });
  s.step();
  s.step();
  REQUIRE(s.last_epoch() == 2);
  const double at_two = opt.options.lr;
  CHECK(at_two == Approx(0.02));
  CHECK_THROWS_WITH(s.step(), Contains("LambdaLR: the optimizer refuses the rate at epoch 3") &&
                                  Contains("SGD: lr must be non-negative"));
  CHECK(s.last_epoch() == 2);
  CHECK(s.last_lr() == at_two);
  CHECK(opt.options.lr == at_two);
  optim::LambdaLR nan_factor(opt, [](int64_t e) { return e == 0 ? 1.0 : std::nan(""); });
  CHECK_THROWS_WITH(nan_factor.step(), Contains("LambdaLR: the rate at epoch 1 is nan"));
  CHECK(nan_factor.last_epoch() == 0);
  CHECK_THROWS_WITH(s.lr_at(-1), Contains("LambdaLR::lr_at: the epoch must be non-negative"));
  optim::StepLR far(opt, 10);
  far.set_last_epoch(std::numeric_limits<int64_t>::max());
  CHECK_THROWS_WITH(far.step(), Contains("StepLR::step: the epoch is"));

  // An optimizer defined outside encore that has no "lr".
  struct NoRate : optim::Optimizer {
    using optim::Optimizer::Optimizer;
    void step() override {}
  };
  NoRate plain(one_parameter());
  CHECK_THROWS_WITH(optim::StepLR(plain, 2),
                    Contains("StepLR: the optimizer has no hyper-parameter 'lr'"));
}

TEST_CASE("a scheduler stepped inside a static function is refused at the trace",
          "[static][lr_scheduler]") {
  // Its step() is host code: a replay would keep the trace's rate.
  StaticEnabled on;
  manual_seed(3);
  auto model = nn::mlp(4, 5, 3);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  optim::ExponentialLR sched(opt, 0.5);
  auto step = static_graph(
      [&](const Tensor& x, const Tensor& t) {
        Tensor loss = train_step(*model, opt, x, t);
        sched.step();
        return loss;
      },
      {.name = "step_with_schedule", .modules = {model}});
  CHECK_THROWS_WITH(step(randn({6, 4}), cyclic_labels(6, 1, 3, Device::cpu())),
                    Contains("step_with_schedule") && Contains("ExponentialLR's epoch"));
  CHECK(sched.last_epoch() == 0);
  CHECK(opt.options.lr == 0.1);
}

TEST_CASE("a cosine schedule over a static training step replays eager's steps with one trace",
          "[static][lr_scheduler]") {
  const StaticRun run = check_cosine_schedule_steps(Device::cpu());
  CHECK_THAT(run.schedule, Contains("hyper-parameters read at each call"));
}
