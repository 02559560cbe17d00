// A replayed training step that fails on a bad input value (a label out of range, an id beyond
// the embedding's rows) leaves the parameters, the optimizer's state and .grad as eager leaves
// them: eagerly the check fails before zero_grad, backward and step run, while a replay may have
// run updates ahead (two lanes, early updates) and dropped the .grad its step replaces. The next
// good call then continues as eager does.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

// The parameters, their .grad and Adam's state, copied.
std::vector<Tensor> snapshot(nn::Module& model, optim::Adam& opt) {
  std::vector<Tensor> out;
  for (const Tensor& p : model.parameters()) {
    out.push_back(clone(p.detach()));
    out.push_back(p.grad().defined() ? clone(p.grad()) : Tensor());
  }
  for (const optim::StateSlot& s : opt.state_slots())
    out.push_back(s.tensor->defined() ? clone(*s.tensor) : Tensor());
  return out;
}

void check_same(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    REQUIRE(a[i].defined() == b[i].defined());
    if (a[i].defined()) CHECK(bit_diff(a[i], b[i]) == "");
  }
}

// A step whose loss reads its labels as handed (or a copy made in the call: `copied`), and
// which also measures the accuracy of other logits against other labels before its update.
struct Step {
  std::shared_ptr<nn::Sequential> model;
  optim::Adam opt;
  bool copied;
  Step(bool copied_labels)
      : model((manual_seed(5), nn::mlp(4, 16, 3))),
        opt(model->parameters(), {.lr = 0.05}),
        copied(copied_labels) {}
  std::pair<Tensor, Tensor> operator()(const Tensor& x, const Tensor& t, const Tensor& logits,
                                       const Tensor& labels) {
    Tensor loss = F::softmax_cross_entropy((*model)(x), copied ? clone(t) : t);
    Tensor acc = F::accuracy(logits, copied ? clone(labels) : labels);
    opt.zero_grad();
    loss.backward();
    opt.step();
    return {loss, acc};
  }
};

}  // namespace

TEST_CASE("a replayed step that fails on a bad label leaves parameters, state and .grad as eager",
          "[static]") {
  StaticEnabled on;
  const bool copied = GENERATE(false, true);
  const int threads = GENERATE(1, 2);
  INFO((copied ? "labels copied in the call" : "labels as handed") << ", threads " << threads);
  ThreadCount use(threads);
  StaticRedzones redzones(false);  // (two lanes need them off)
  manual_seed(6);
  const Tensor x = randn({64, 4}), t = full({64}, 1, DType::Int32), logits = randn({5, 3});
  const Tensor good = tensor({0, 1, 2, 1, 0}, {5}, DType::Int32);
  const Tensor bad_acc = tensor({0, 1, 2, 1, 9}, {5}, DType::Int32);
  Tensor bad_loss = clone(t);
  bad_loss.data<int32_t>()[7] = 3;

  Step eager(copied), traced(copied);
  auto step = static_graph([&](const Tensor& a, const Tensor& b, const Tensor& c,
                               const Tensor& d) { return traced(a, b, c, d); },
                           {.name = "step", .modules = {traced.model}});
  auto both = [&](const Tensor& tt, const Tensor& labels) {
    std::string eager_error, static_error;
    const std::vector<Tensor> before = snapshot(*traced.model, traced.opt);
    try {
      eager(x, tt, logits, labels);
    } catch (const Error& e) {
      eager_error = e.what();
    }
    try {
      step(x, tt, logits, labels);
    } catch (const Error& e) {
      static_error = e.what();
      check_same(snapshot(*traced.model, traced.opt), before);
    }
    CHECK(static_error == eager_error);
    check_same(snapshot(*traced.model, traced.opt), snapshot(*eager.model, eager.opt));
    return static_error;
  };
  both(t, good);
  both(t, good);
  both(t, good);
  CHECK_THAT(both(t, bad_acc), Contains("accuracy: label 9 of sample 4 is out of range [0, 3)"));
  both(t, good);
  CHECK_THAT(both(bad_loss, good),
             Contains("softmax_cross_entropy: label 3 of sample 7 is out of range [0, 3)"));
  both(t, good);
  CHECK(step.stats().hits >= 4);
}

TEST_CASE("a replay that fails on a bad label runs nothing: statistics and generator as they were",
          "[static]") {
  // Eagerly the dropout has drawn its numbers and the batch norm updated its statistics before
  // the loss finds the label; a replay checks the labels before any step runs.
  StaticEnabled on;
  manual_seed(8);
  auto bn = std::make_shared<nn::BatchNorm2d>(2);
  auto fn = static_graph(
      [&](const Tensor& x, const Tensor& t) {
        const Tensor h = F::dropout((*bn)(x), 0.5);
        return F::softmax_cross_entropy(F::reshape(h, {4, 2}), t);
      },
      {.name = "bn_dropout_loss", .modules = {bn}});
  NoGradGuard no_grad;
  const Tensor x = randn({4, 2, 1, 1});
  const Tensor good = tensor({0, 1, 1, 0}, {4}, DType::Int32);
  const Tensor bad = tensor({0, 1, 2, 0}, {4}, DType::Int32);
  for (int call = 0; call < 3; ++call) fn(x, good);
  REQUIRE(fn.stats().hits == 2);
  const Tensor mean = clone(bn->running_mean), var = clone(bn->running_var);
  manual_seed(21);
  CHECK_THROWS_WITH(fn(x, bad), Contains("label 2 of sample 2 is out of range [0, 2)"));
  CHECK(fn.stats().hits == 3);
  CHECK(bit_diff(bn->running_mean, mean) == "");
  CHECK(bit_diff(bn->running_var, var) == "");
  const Tensor drawn = randn({4});
  manual_seed(21);
  CHECK(bit_diff(drawn, randn({4})) == "");
}
