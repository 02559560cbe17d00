// Modules and optimizers.
#include <catch2/catch.hpp>

#include <cmath>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "test_util.h"

using namespace encore;
using Catch::Matchers::Contains;

TEST_CASE("modules name their parameters and children", "[nn]") {
  auto model = nn::mlp(6, 5, 3);
  std::vector<std::string> names;
  for (auto& [name, p] : model->named_parameters()) names.push_back(name);
  CHECK(names ==
        std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"});
  for (const Tensor& p : model->parameters()) CHECK(p.requires_grad());
  CHECK(model->parameters()[0].shape() == Shape{5, 6});
  CHECK(model->describe() ==
        "Sequential(Linear(6 -> 5), ReLU, Linear(5 -> 5), ReLU, "
        "Linear(5 -> 3))");
  CHECK((*model)(rand({4, 6})).shape() == Shape{4, 3});
}

TEST_CASE("train and eval propagate to submodules", "[nn]") {
  auto model = nn::mlp(2, 2, 2);
  CHECK(model->is_training());
  model->eval();
  for (auto& [name, child] : model->named_children()) CHECK_FALSE(child->is_training());
  model->train();
  CHECK((*model)[0].is_training());
}

TEST_CASE("parameters() lists a shared child's and a tied weight's tensors once", "[nn]") {
  struct Tied : nn::Module {
    std::shared_ptr<nn::Linear> a = register_module("a", std::make_shared<nn::Linear>(2, 2));
    std::shared_ptr<nn::Linear> b = register_module("b", a);  // the same child twice
    Tensor forward(const Tensor& x) override { return (*b)((*a)(x)); }
  };
  Tied m;
  CHECK(m.named_parameters().size() == 4);  // every name, as PyTorch's state_dict
  const std::vector<Tensor> ps = m.parameters();
  REQUIRE(ps.size() == 2);
  CHECK(ps[0].is_same(m.a->weight));
  CHECK(ps[1].is_same(m.a->bias));
  optim::SGD opt(m.parameters(), {.lr = 0.1});  // no "listed twice" Error
  F::sum(m(ones({1, 2}))).backward();
  CHECK_NOTHROW(opt.step());
}

TEST_CASE("registering a null child or a name taken or malformed is an Error", "[nn]") {
  struct Holder : nn::Module {
    Tensor w = zeros({2});
    Tensor running = zeros({2});
    void child(const std::string& name, std::shared_ptr<Module> m) { register_module(name, m); }
    void param(const std::string& name) { register_parameter(name, &w); }
    void buffer(const std::string& name) { register_buffer(name, &running); }
  };
  Holder h;
  CHECK_THAT(testing::error_of([&] { h.child("c", nullptr); }), Contains("module 'c' is null"));
  h.child("c", std::make_shared<nn::ReLU>());
  CHECK_THAT(testing::error_of([&] { h.child("c", std::make_shared<nn::ReLU>()); }),
             Contains("module name 'c' is already registered"));
  h.param("w");
  CHECK_THAT(testing::error_of([&] { h.buffer("w"); }),
             Contains("buffer name 'w' is already registered"));
  CHECK_THAT(testing::error_of([&] { h.param("a.b"); }),
             Contains("parameter name 'a.b' must be non-empty and hold no '.'"));
  CHECK_THAT(testing::error_of([&] { h.buffer(""); }), Contains("must be non-empty"));
  CHECK(h.named_parameters().size() == 1);
  CHECK(h.named_buffer_slots().empty());
}

namespace {
struct StaticLinear : nn::Linear {
  using nn::Linear::Linear;
  ENCORE_STATIC_GRAPH({.name = "static_linear"});
};
}  // namespace

TEST_CASE("a Sequential calls its children's static forwards", "[nn][static]") {
  testing::StaticEnabled on;
  auto lin = std::make_shared<StaticLinear>(3, 3);
  nn::Sequential seq({lin, std::make_shared<nn::ReLU>()});
  NoGradGuard no_grad;
  for (int i = 0; i < 3; ++i) seq(rand({2, 3}));
  CHECK(static_stats(*lin).calls == 3);
  CHECK(static_stats(*lin).hits == 2);
}

TEST_CASE("a replaced parameter is seen through the module", "[nn]") {
  nn::Linear lin(3, 2);
  Tensor w2 = zeros({2, 3});
  w2.set_requires_grad();
  lin.weight = w2;
  CHECK(lin.named_parameters()[0].second.is_same(w2));
}

TEST_CASE("Linear initialisation follows PyTorch and Chainer", "[nn]") {
  manual_seed(3);
  nn::Linear torch_like(400, 300);
  const double bound = 1.0 / std::sqrt(400.0);
  for (float v : torch_like.weight.to_vector<float>()) CHECK(std::abs(v) <= bound);
  for (float v : torch_like.bias.to_vector<float>()) CHECK(std::abs(v) <= bound);
  const auto w = torch_like.weight.to_vector<float>();
  double var = 0;
  for (float v : w) var += v * v;
  var /= w.size();
  CHECK(var == Approx(bound * bound / 3).epsilon(0.05));  // U(-b, b) has variance b^2/3

  nn::Linear chainer_like(400, 300, {.init = nn::Init::Chainer});
  const auto wc = chainer_like.weight.to_vector<float>();
  double varc = 0;
  for (float v : wc) varc += v * v;
  varc /= wc.size();
  CHECK(varc == Approx(1.0 / 400).epsilon(0.05));  // LeCunNormal
  for (float v : chainer_like.bias.to_vector<float>()) CHECK(v == 0.0f);
  manual_seed(3);
  nn::Linear again(400, 300);
  CHECK(again.weight.to_vector<float>() == w);  // seeded
}

TEST_CASE("zero_grad drops or zeroes gradients", "[nn]") {
  nn::Linear lin(3, 2);
  F::sum(lin(ones({1, 3}))).backward();
  REQUIRE(lin.weight.grad().defined());
  lin.zero_grad(/*set_to_none=*/false);
  for (float v : lin.weight.grad().to_vector<float>()) CHECK(v == 0.0f);
  lin.zero_grad();
  CHECK_FALSE(lin.weight.grad().defined());
}

namespace {
Tensor param(std::initializer_list<double> v) {
  Tensor p = tensor(v, {static_cast<int64_t>(v.size())}, DType::Float64);
  p.set_requires_grad();
  return p;
}
void set_grad(Tensor& p, std::initializer_list<double> g) {
  p.set_grad(tensor(g, {static_cast<int64_t>(g.size())}, DType::Float64));
}
}  // namespace

TEST_CASE("SGD and MomentumSGD follow their update rules", "[optim]") {
  Tensor p = param({1.0, -2.0});
  optim::SGD sgd({p}, {.lr = 0.5, .weight_decay = 0.1});
  set_grad(p, {0.2, 0.4});
  sgd.step();
  auto v = p.to_vector<double>();
  CHECK(v[0] == Approx(1.0 - 0.5 * (0.2 + 0.1 * 1.0)));
  CHECK(v[1] == Approx(-2.0 - 0.5 * (0.4 + 0.1 * -2.0)));

  Tensor q = param({1.0});
  optim::MomentumSGD msgd({q}, {.lr = 0.1, .momentum = 0.9});
  set_grad(q, {1.0});
  msgd.step();  // v = -0.1; q = 0.9
  msgd.step();  // v = 0.9 * -0.1 - 0.1 = -0.19; q = 0.71
  CHECK(q.to_vector<double>()[0] == Approx(0.71));
  CHECK(msgd.steps() == 2);
}

TEST_CASE("Adam follows PyTorch's update rule, with and without weight decay", "[optim]") {
  for (bool decoupled : {false, true}) {
    INFO("decoupled " << decoupled);
    const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
    Tensor p = param({0.5, -1.5});
    optim::Adam adam({p}, {.lr = lr, .weight_decay = wd, .decoupled = decoupled});
    double ref[2] = {0.5, -1.5}, m[2] = {}, s[2] = {};
    const double grads[3][2] = {{0.1, -0.3}, {0.2, 0.05}, {-0.4, 0.7}};
    for (int t = 1; t <= 3; ++t) {
      set_grad(p, {grads[t - 1][0], grads[t - 1][1]});
      adam.step();
      for (int i = 0; i < 2; ++i) {
        double g = grads[t - 1][i];
        if (decoupled)
          ref[i] *= 1 - lr * wd;
        else
          g += wd * ref[i];
        m[i] = b1 * m[i] + (1 - b1) * g;
        s[i] = b2 * s[i] + (1 - b2) * g * g;
        const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
        ref[i] -= lr / bc1 * m[i] / (std::sqrt(s[i]) / std::sqrt(bc2) + eps);
      }
    }
    const auto v = p.to_vector<double>();
    CHECK(v[0] == Approx(ref[0]).epsilon(1e-12));
    CHECK(v[1] == Approx(ref[1]).epsilon(1e-12));
  }
}

TEST_CASE("AdamW is Adam with decoupled weight decay 0.01 by default", "[optim]") {
  Tensor p = param({0.5, -1.5}), q = param({0.5, -1.5});
  optim::AdamW adamw({p});
  optim::Adam adam({q}, {.weight_decay = 0.01, .decoupled = true});
  CHECK(adamw.options.weight_decay == 0.01);
  CHECK(adamw.options.decoupled);
  for (int t = 0; t < 3; ++t) {
    set_grad(p, {0.1 * t - 0.2, 0.3});
    set_grad(q, {0.1 * t - 0.2, 0.3});
    adamw.step();
    adam.step();
  }
  CHECK(p.to_vector<double>() == q.to_vector<double>());
  // The decay is applied: without it the parameters end elsewhere.
  Tensor r = param({0.5, -1.5});
  optim::AdamW plain({r}, {.weight_decay = 0});
  for (int t = 0; t < 3; ++t) {
    set_grad(r, {0.1 * t - 0.2, 0.3});
    plain.step();
  }
  CHECK(r.to_vector<double>() != p.to_vector<double>());
}

TEST_CASE("optimizers skip parameters without gradients and reject bad ones", "[optim]") {
  Tensor p = param({1.0});
  optim::Adam adam({p});
  adam.step();
  CHECK(p.to_vector<double>()[0] == 1.0);
  CHECK_THROWS_WITH(optim::SGD({Tensor()}), Contains("undefined"));
  CHECK_THROWS_WITH(optim::Adam({p}, {.beta1 = 1.5}),
                    Contains("Adam: beta1 must be in [0, 1), got 1.5"));
}

TEST_CASE("optimizers refuse a parameter listed twice and bad SGD options", "[optim]") {
  Tensor p = param({1.0, 2.0});
  Tensor q = param({3.0});
  const std::string twice = ": parameter 2 [2] is parameter 0 listed again";
  CHECK_THAT(testing::error_of([&] { optim::Adam({p, q, p}); }), Contains("Adam" + twice));
  CHECK_THAT(testing::error_of([&] { optim::SGD({p, q, p}); }), Contains("SGD" + twice));
  CHECK_THAT(testing::error_of([&] {
               optim::MomentumSGD({p, q, p});
             }),
             Contains("MomentumSGD" + twice));
  // Views of one storage are distinct parameters, as before.
  CHECK_NOTHROW(optim::SGD({p, p.detach()}));

  const double nan = std::nan("");
  for (const double lr : {nan, -0.1}) {
    CAPTURE(lr);
    CHECK_THAT(testing::error_of([&] { optim::SGD({p}, {.lr = lr}); }),
               Contains("SGD: lr must be non-negative, got"));
    CHECK_THAT(testing::error_of([&] { optim::MomentumSGD({p}, {.lr = lr}); }),
               Contains("MomentumSGD: lr must be non-negative, got"));
  }
  CHECK_THAT(testing::error_of([&] { optim::MomentumSGD({p}, {.momentum = -0.5}); }),
             Contains("MomentumSGD: momentum must be non-negative, got -0.5"));
  CHECK_THAT(testing::error_of([&] { optim::MomentumSGD({p}, {.momentum = nan}); }),
             Contains("MomentumSGD: momentum must be non-negative, got nan"));
  CHECK_NOTHROW(optim::MomentumSGD({p}, {.lr = 0, .momentum = 0}));
  // set_hyper_parameters checks the same, and a refused call changes nothing.
  optim::MomentumSGD m({p}, {.lr = 0.1, .momentum = 0.9});
  CHECK_THAT(testing::error_of([&] {
               m.set_hyper_parameters({{"lr", 0.2}, {"momentum", -1}});
             }),
             Contains("MomentumSGD: momentum must be non-negative, got -1"));
  CHECK((m.options.lr == 0.1 && m.options.momentum == 0.9));
  optim::SGD s({p}, {.lr = 0.1});
  CHECK_THAT(testing::error_of([&] {
               s.set_hyper_parameters({{"lr", nan}});
             }),
             Contains("SGD: lr must be non-negative, got nan"));
  CHECK(s.options.lr == 0.1);
}

TEST_CASE("optimizers refuse a negative or NaN weight_decay, at construction and when set",
          "[optim]") {
  Tensor p = param({1.0, 2.0});
  using testing::error_of;
  for (const double wd : {-1.0, std::nan("")}) {
    CAPTURE(wd);
    const std::string got = wd < 0 ? "got -1" : "got nan";
    CHECK_THAT(error_of([&] { optim::SGD({p}, {.weight_decay = wd}); }),
               Contains("SGD: weight_decay must be non-negative, " + got));
    CHECK_THAT(error_of([&] { optim::MomentumSGD({p}, {.weight_decay = wd}); }),
               Contains("MomentumSGD: weight_decay must be non-negative, " + got));
    CHECK_THAT(error_of([&] { optim::Adam({p}, {.weight_decay = wd}); }),
               Contains("Adam: weight_decay must be non-negative, " + got));
    CHECK_THAT(error_of([&] { optim::AdamW({p}, {.weight_decay = wd}); }),
               Contains("AdamW: weight_decay must be non-negative, " + got));
  }
  CHECK_NOTHROW(optim::SGD({p}, {.weight_decay = 0}));

  // set_hyper_parameters (and so a checkpoint load) checks the same and changes nothing.
  optim::SGD sgd({p}, {.lr = 0.1});
  optim::MomentumSGD momentum({p}, {.lr = 0.1});
  optim::Adam adam({p}, {.lr = 0.1});
  optim::AdamW adamw({p}, {.lr = 0.1});
  const std::vector<std::pair<std::string, double>> bad = {{"lr", 0.5}, {"weight_decay", -5}};
  CHECK_THAT(error_of([&] { sgd.set_hyper_parameters(bad); }),
             Contains("SGD: weight_decay must be non-negative, got -5"));
  CHECK_THAT(error_of([&] { momentum.set_hyper_parameters(bad); }),
             Contains("MomentumSGD: weight_decay must be non-negative, got -5"));
  CHECK_THAT(error_of([&] { adam.set_hyper_parameters(bad); }),
             Contains("Adam: weight_decay must be non-negative, got -5"));
  CHECK_THAT(error_of([&] { adamw.set_hyper_parameters(bad); }),
             Contains("AdamW: weight_decay must be non-negative, got -5"));
  CHECK((sgd.options.lr == 0.1 && sgd.options.weight_decay == 0));
  CHECK((momentum.options.lr == 0.1 && momentum.options.weight_decay == 0));
  CHECK((adam.options.lr == 0.1 && adam.options.weight_decay == 0));
  CHECK((adamw.options.lr == 0.1 && adamw.options.weight_decay == 0.01));
  // With a zero gradient the parameter stays where it is (a decay of -5 would grow it).
  set_grad(p, {0.0, 0.0});
  sgd.step();
  CHECK(p.to_vector<double>() == std::vector<double>{1.0, 2.0});
}

TEST_CASE("an optimizer's option errors name its kind, the option and its value", "[optim]") {
  Tensor p = param({1.0});
  using testing::error_of;
  const double nan = std::nan("");
  // AdamW's were Adam's, and "lr and eps must be non-negative" named neither value.
  CHECK_THAT(error_of([&] { optim::AdamW({p}, {.lr = -1}); }),
             Contains("AdamW: lr must be non-negative, got -1"));
  CHECK_THAT(error_of([&] { optim::AdamW({p}, {.eps = -0.5}); }),
             Contains("AdamW: eps must be non-negative, got -0.5"));
  CHECK_THAT(error_of([&] { optim::AdamW({p}, {.beta1 = 1}); }),
             Contains("AdamW: beta1 must be in [0, 1), got 1"));
  CHECK_THAT(error_of([&] { optim::AdamW({p}, {.beta2 = nan}); }),
             Contains("AdamW: beta2 must be in [0, 1), got nan"));
  CHECK_THAT(error_of([&] { optim::Adam({p}, {.lr = nan}); }),
             Contains("Adam: lr must be non-negative, got nan"));
  CHECK_THAT(error_of([&] { optim::Adam({p}, {.eps = -0.5}); }),
             Contains("Adam: eps must be non-negative, got -0.5"));
  CHECK_THAT(error_of([&] { optim::Adam({p}, {.beta2 = -0.5}); }),
             Contains("Adam: beta2 must be in [0, 1), got -0.5"));
  CHECK_THAT(error_of([&] { optim::MomentumSGD({p}, {.lr = -1}); }),
             Contains("MomentumSGD: lr must be non-negative, got -1"));
  optim::AdamW adamw({p});
  CHECK_THAT(error_of([&] {
               adamw.set_hyper_parameters({{"eps", -0.5}});
             }),
             Contains("AdamW: eps must be non-negative, got -0.5"));
  CHECK_THAT(error_of([&] {
               adamw.set_hyper_parameters({{"beta1", 2}});
             }),
             Contains("AdamW: beta1 must be in [0, 1), got 2"));
}

TEST_CASE("AdamW refuses a decoupled other than its own, so stays AdamW", "[optim]") {
  Tensor p = param({1.0, 2.0});
  using testing::error_of;
  optim::AdamW adamw({p}, {.lr = 0.1, .weight_decay = 0.5});
  // decoupled 0 made it Adam with L2 decay while its kind() stayed "AdamW".
  for (const double decoupled : {0.0, 2.0, std::nan("")}) {
    CAPTURE(decoupled);
    CHECK_THAT(error_of([&] {
                 adamw.set_hyper_parameters({{"lr", 0.2}, {"decoupled", decoupled}});
               }),
               Contains("AdamW: decoupled must be 1"));
    CHECK((adamw.options.decoupled && adamw.options.lr == 0.1));
  }
  CHECK_NOTHROW(adamw.set_hyper_parameters({{"decoupled", 1}, {"lr", 0.1}}));
  CHECK(adamw.hyper_parameters().back().first == "decoupled");
  CHECK(adamw.hyper_parameters().back().second == 1);
  // With a zero gradient AdamW only decays: p *= 1 - lr * wd (coupled, p would be 0.9, 1.9).
  set_grad(p, {0.0, 0.0});
  adamw.step();
  const auto v = p.to_vector<double>();
  CHECK(v[0] == Approx(0.95));
  CHECK(v[1] == Approx(1.9));
  // Adam's decay may still be set either way.
  optim::Adam adam({p});
  adam.set_hyper_parameters({{"decoupled", 1}});
  CHECK(adam.options.decoupled);
  adam.set_hyper_parameters({{"decoupled", 0}});
  CHECK_FALSE(adam.options.decoupled);
}

TEST_CASE("optimizers refuse an empty parameter list", "[optim]") {
  using testing::error_of;
  // As PyTorch's "optimizer got an empty parameter list": a filter left nothing to train.
  const std::string empty = ": the parameter list is empty";
  CHECK_THAT(error_of([] { optim::SGD({}); }), Contains("SGD" + empty));
  CHECK_THAT(error_of([] { optim::MomentumSGD({}); }), Contains("MomentumSGD" + empty));
  CHECK_THAT(error_of([] { optim::Adam({}); }), Contains("Adam" + empty));
  CHECK_THAT(error_of([] { optim::AdamW(std::vector<Tensor>{}); }), Contains("AdamW" + empty));
}

TEST_CASE("optimizers refuse a parameter that is not a leaf", "[optim]") {
  using testing::error_of;
  Tensor w = param({1.0, 2.0});
  Tensor q = param({3.0});
  const Tensor scaled = w * 2.0;  // computed: it never gets a .grad, so it was never updated
  REQUIRE_FALSE(scaled.is_leaf());
  const std::string not_leaf = ": parameter 1 [2] is not a leaf";
  CHECK_THAT(error_of([&] { optim::SGD({q, scaled}); }), Contains("SGD" + not_leaf));
  CHECK_THAT(error_of([&] {
               optim::MomentumSGD({q, scaled});
             }),
             Contains("MomentumSGD" + not_leaf));
  CHECK_THAT(error_of([&] { optim::Adam({q, scaled}); }), Contains("Adam" + not_leaf));
  CHECK_THAT(error_of([&] { optim::AdamW({q, scaled}); }), Contains("AdamW" + not_leaf));
  // Its detached copy, and a leaf that needs no gradient, are leaves.
  CHECK_NOTHROW(optim::SGD({q, scaled.detach()}));
  CHECK_NOTHROW(optim::SGD({tensor({1.0}, {1})}));
}

TEST_CASE("a copied optimizer has its own step count and state", "[optim]") {
  Tensor w = param({1.0, 2.0, 3.0});
  optim::Adam a({w}, {.lr = 0.1});
  set_grad(w, {1.0, 1.0, 1.0});
  a.step();
  auto values = [](optim::Optimizer& o) {
    std::vector<std::vector<double>> out;
    for (const optim::StateSlot& s : o.state_slots())
      out.push_back(s.tensor->dtype() == DType::Int64
                        ? std::vector<double>{static_cast<double>(s.tensor->item<int64_t>())}
                        : s.tensor->to_vector<double>());
    return out;
  };
  const auto a_state = values(a);
  optim::Adam b = a;
  CHECK(b.steps() == 1);
  CHECK(values(b) == a_state);
  for (size_t i = 0; i < a.state_slots().size(); ++i)
    CHECK_FALSE(a.state_slots()[i].tensor->shares_storage(*b.state_slots()[i].tensor));
  b.step();
  b.step();
  // Stepping the copy moved the original's counters and moments (they were shared).
  CHECK(a.steps() == 1);
  CHECK(b.steps() == 3);
  CHECK(values(a) == a_state);
  CHECK(b.state_slots()[2].tensor->item<int64_t>() == 3);
  b.set_steps(7);
  CHECK(a.steps() == 1);

  // An assignment copies the same way, and a copied AdamW stays AdamW.
  Tensor u = param({4.0});
  optim::AdamW c({u});
  optim::AdamW d = c;
  set_grad(u, {1.0});
  c.step();
  d = c;
  CHECK(d.kind() == "AdamW");
  CHECK(d.steps() == 1);
  CHECK(values(d) == values(c));
  d.step();
  CHECK(c.steps() == 1);
  CHECK(c.state_slots()[2].tensor->item<int64_t>() == 1);

  // MomentumSGD's velocity, and plain SGD's count.
  Tensor q = param({1.0});
  optim::MomentumSGD m({q}, {.lr = 0.1, .momentum = 0.9});
  set_grad(q, {1.0});
  m.step();  // v = -0.1
  optim::MomentumSGD n = m;
  n.step();  // n's v = -0.19
  CHECK(m.state_slots()[0].tensor->to_vector<double>()[0] == Approx(-0.1));
  CHECK(n.state_slots()[0].tensor->to_vector<double>()[0] == Approx(-0.19));
  optim::SGD s({w});
  optim::SGD s2 = s;
  s.set_steps(5);
  CHECK(s2.steps() == 0);
}

// A replay runs no user code, so no step() call: the step count is a host counter that the
// schedule advances on every replay, as many times per call as the traced code stepped.
TEST_CASE("Optimizer::steps counts the steps of static replays", "[optim][static]") {
  testing::StaticEnabled on;
  auto model = nn::mlp(4, 3, 2);
  optim::Adam adam(model->parameters(), {.lr = 1e-2});
  optim::SGD sgd(model->parameters(), {.lr = 1e-2});
  auto body = [&](const Tensor& x) {
    Tensor y = (*model)(x);
    Tensor loss = F::mean(F::mul(y, y));
    adam.zero_grad();
    loss.backward();
    adam.step();
    sgd.step();
    sgd.step();  // two steps in one call: two per replay
    return loss;
  };
  auto step = static_graph(body, {.name = "counted", .modules = {model}});
  const int calls = 5;
  for (int i = 0; i < calls; ++i) step(randn({8, 4}));
  CHECK(step.stats().traces == 1);
  CHECK(step.stats().hits == calls - 1);
  CHECK(adam.steps() == calls);
  CHECK(sgd.steps() == 2 * calls);
  // Verify mode reruns the user code eagerly beside each replay: it counts once, not twice.
  auto verified =
      static_graph(body, {.name = "counted_verified", .verify_every = 1, .modules = {model}});
  adam.set_steps(0);
  for (int i = 0; i < 3; ++i) verified(randn({8, 4}));
  CHECK(verified.stats().verifications == 2);
  CHECK(adam.steps() == 3);
}

TEST_CASE("options set out of range through the public field are refused at the next step",
          "[optim]") {
  Tensor w = ones({2});
  w.set_requires_grad(true);
  w.set_grad(ones({2}));
  optim::SGD sgd({w}, {.lr = 0.1});
  sgd.options.weight_decay = -5;
  CHECK_THROWS_WITH(sgd.step(),
                    Catch::Matchers::Contains("SGD: weight_decay must be non-negative"));
  CHECK(testing::bit_diff(w, ones({2})) == "");
  optim::AdamW adamw({w}, {});
  adamw.options.decoupled = false;
  CHECK_THROWS_WITH(adamw.step(),
                    Catch::Matchers::Contains("AdamW: options.decoupled must be true"));
  CHECK(testing::bit_diff(w, ones({2})) == "");
  // Assigned a plain Adam, an AdamW would stay AdamW in name only.
  optim::Adam adam({w}, {});
  optim::Adam& as_adam = adamw;
  CHECK_THROWS_WITH(as_adam = adam,
                    Catch::Matchers::Contains("AdamW: cannot be assigned a copy of Adam"));
}
