// What a whole static training step checks of the state around it before replaying: gradients
// made to share one tensor after the trace (or no longer sharing one), a post-accumulate hook
// added or removed since, and the hyper-parameters an optimizer defined outside encore lists.
// Each changes what eager computes, so the next call traces again and says why; every step
// equals eager's bits.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/autograd.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

// RMSprop written with encore's functions: an optimizer defined outside encore, whose step()
// calls count_step() and whose hyper_parameters() lists its learning rate.
class Rms final : public optim::Optimizer {
 public:
  double lr;
  Rms(std::vector<Tensor> ps, double lr_) : Optimizer(std::move(ps)), lr(lr_) {
    for (const Tensor& p : params_) sq_.push_back(zeros(p.shape(), p.dtype()));
  }
  void step() override {
    NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor g = params_[i].grad();
      if (!g.defined()) continue;
      copy_(sq_[i], sq_[i] * 0.9 + g * g * 0.1);
      copy_(params_[i], params_[i] - g * lr / (F::sqrt(sq_[i]) + 1e-8));
    }
    count_step();
  }
  std::vector<std::pair<std::string, double>> hyper_parameters() const override {
    return {{"lr", lr}};
  }

 private:
  std::vector<Tensor> sq_;
};

// A two-layer model trained by one step, twice: through a static step and eagerly.
template <typename Opt>
struct Twin {
  std::shared_ptr<nn::Linear> a, b;
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<Opt> opt;
  std::function<std::unique_ptr<Opt>(std::vector<Tensor>)> make;
  explicit Twin(std::function<std::unique_ptr<Opt>(std::vector<Tensor>)> m) : make(std::move(m)) {
    manual_seed(4);
    a = std::make_shared<nn::Linear>(6, 6);
    b = std::make_shared<nn::Linear>(6, 6);
    model = std::make_shared<nn::Sequential>(
        std::vector<std::shared_ptr<nn::Module>>{a, std::make_shared<nn::Tanh>(), b});
    opt = make(model->parameters());
  }
  Tensor step(const Tensor& x, const Tensor& t) {
    Tensor loss = F::softmax_cross_entropy((*model)(x), t);
    opt->zero_grad(false);
    loss.backward();
    opt->step();
    return loss;
  }
};

// Runs `calls` steps through a static step and eagerly, calling `between(i, twin)` on both
// twins before step i, and checks every parameter and .grad after each; returns the stats.
template <typename Opt>
StaticStats run(const std::function<std::unique_ptr<Opt>(std::vector<Tensor>)>& make, int calls,
                const std::function<void(int, Twin<Opt>&)>& between) {
  Twin<Opt> s(make), e(make);
  auto step = static_graph([&](const Tensor& x, const Tensor& t) { return s.step(x, t); },
                           {.name = "step", .modules = {s.model}});
  for (int i = 0; i < calls; ++i) {
    between(i, s);
    between(i, e);
    manual_seed(100 + i);
    const Tensor x = randn({5, 6});
    const Tensor t = tensor({0, 1, 2, 0, 1}, {5}, DType::Int32);
    CHECK(bit_diff(step(x, t), e.step(x, t)) == "");
    const std::vector<Tensor> ps = s.model->parameters(), pe = e.model->parameters();
    for (size_t k = 0; k < ps.size(); ++k) {
      INFO("call " << i << ", parameter " << k);
      CHECK(bit_diff(ps[k], pe[k]) == "");
      CHECK(bit_diff(ps[k].grad(), pe[k].grad()) == "");
    }
  }
  return step.stats();
}

std::unique_ptr<optim::SGD> sgd(std::vector<Tensor> ps) {
  return std::make_unique<optim::SGD>(std::move(ps), optim::SGDOptions{.lr = 0.1});
}

}  // namespace

TEST_CASE("two gradients made one tensor after the trace trace again, and apart again",
          "[static][guards]") {
  // PyTorch's b.weight.grad = a.weight.grad: eager then accumulates both layers' gradients into
  // one tensor. The schedule took them for two buffers.
  const StaticStats st = run<optim::SGD>(sgd, 7, [](int i, Twin<optim::SGD>& t) {
    if (i == 2) {
      const Tensor g = zeros({6, 6});
      t.a->weight.set_grad(g);
      t.b->weight.set_grad(g);
    }
    if (i == 5) t.b->weight.set_grad(zeros({6, 6}));
  });
  // The first call, zero_grad(false) filling the new .grads, and 2; at 5 the trace of the
  // separate gradients serves again.
  CHECK(st.traces == 3);
  CHECK(st.hits == 4);
  REQUIRE(st.traces_history.size() == 3);
  CHECK(st.traces_history[2].reason ==
        "the gradients of parameter '0.weight' and parameter '2.weight' share storage now and "
        "did not when traced");
}

TEST_CASE("gradients that shared one tensor when traced trace again once they do not",
          "[static][guards]") {
  const StaticStats st = run<optim::SGD>(sgd, 5, [](int i, Twin<optim::SGD>& t) {
    if (i == 0) {
      const Tensor g = zeros({6, 6});
      t.a->weight.set_grad(g);
      t.b->weight.set_grad(g);
    }
    if (i == 2) t.b->weight.set_grad(zeros({6, 6}));
  });
  CHECK(st.traces == 3);  // the first call, the biases' new .grads, and 2
  REQUIRE(st.traces_history.size() == 3);
  CHECK(st.traces_history[2].reason ==
        "the gradients of parameter '0.weight' and parameter '2.weight' shared storage when "
        "traced and do not now");
}

TEST_CASE("a post-accumulate hook added or removed after the trace traces again",
          "[static][guards]") {
  // The schedule runs the ops the traced hooks dispatched, not the hooks.
  auto halve = [](const Tensor& leaf) {
    NoGradGuard no_grad;
    copy_(leaf.grad(), leaf.grad() * 0.5);
  };
  std::vector<uint64_t> ids;
  const StaticStats st = run<optim::SGD>(sgd, 7, [&](int i, Twin<optim::SGD>& t) {
    if (i == 2) ids.push_back(autograd::add_post_accumulate_grad_hook(t.a->weight, halve));
    if (i == 5) {
      autograd::remove_post_accumulate_grad_hook(t.a->weight, ids.front());
      ids.erase(ids.begin());
    }
  });
  // At 5 the trace without the hook serves again.
  CHECK(st.traces == 3);
  CHECK(st.hits == 4);
  REQUIRE(st.traces_history.size() == 3);
  CHECK(st.traces_history[2].reason ==
        "the post-accumulate-grad hooks of parameter '0.weight' changed (a hook added or "
        "removed; the schedule runs the ops of the hooks it traced)");
}

TEST_CASE("a hook on a tensor the step does not touch traces nothing", "[static][guards]") {
  Tensor other = randn({2});
  other.set_requires_grad(true);
  std::vector<uint64_t> ids;
  const StaticStats st = run<optim::SGD>(sgd, 5, [&](int i, Twin<optim::SGD>&) {
    if (i == 2) ids.push_back(autograd::add_post_accumulate_grad_hook(other, [](const Tensor&) {}));
    if (i == 3) autograd::remove_post_accumulate_grad_hook(other, ids.back());
  });
  CHECK(st.traces == 2);  // the first call, and zero_grad(false)'s new .grads
  CHECK(st.hits == 3);
}

TEST_CASE("an optimizer defined outside encore is watched through its hyper_parameters()",
          "[static][guards]") {
  auto rms = [](std::vector<Tensor> ps) { return std::make_unique<Rms>(std::move(ps), 0.01); };
  const StaticStats st = run<Rms>(rms, 6, [](int i, Twin<Rms>& t) {
    if (i == 2 || i == 4) t.opt->lr *= 0.5;  // a schedule between calls
  });
  CHECK(st.traces == 4);  // the first call, zero_grad(false)'s new .grads, 2 and 4
  REQUIRE(st.traces_history.size() == 4);
  CHECK(st.traces_history[2].reason == "the optimizer's lr 0.01 -> 0.005");
  CHECK(st.traces_history[3].reason == "the optimizer's lr 0.005 -> 0.0025");
}
