// Autograd engine: accumulation, explicit gradients, no-grad, retain_graph, version counter.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "encore/encore.h"
#include "tests/test_util.h"

using namespace encore;
using Catch::Matchers::Contains;

namespace {
std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}
Tensor leaf(std::initializer_list<double> v, const Shape& s, DType d = DType::Float64) {
  Tensor t = tensor(v, s, d);
  t.set_requires_grad();
  return t;
}
}  // namespace

TEST_CASE("backward from a scalar fills leaf gradients", "[autograd]") {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = F::sum(x * x);  // dy/dx = 2x
  CHECK_FALSE(y.is_leaf());
  CHECK(y.requires_grad());
  y.backward();
  CHECK(values(x.grad()) == std::vector<double>{2, 4, 6});
}

TEST_CASE("gradients accumulate across backward calls until cleared", "[autograd]") {
  Tensor x = leaf({1, 2}, {2});
  F::sum(x * 3.0).backward();
  F::sum(x * 3.0).backward();
  CHECK(values(x.grad()) == std::vector<double>{6, 6});
  x.set_grad(Tensor());
  F::sum(x).backward();
  CHECK(values(x.grad()) == std::vector<double>{1, 1});
}

TEST_CASE("a value used twice sums both gradient paths", "[autograd]") {
  Tensor x = leaf({2, -1}, {2});
  Tensor h = F::exp(x);
  Tensor y = F::sum(h * h + h);  // d/dx = 2 e^{2x} + e^x
  y.backward();
  const auto g = values(x.grad());
  for (int i = 0; i < 2; ++i) {
    const double xi = i == 0 ? 2.0 : -1.0;
    CHECK(g[i] == Approx(2 * std::exp(2 * xi) + std::exp(xi)).epsilon(1e-12));
  }
}

TEST_CASE("backward with an explicit output gradient", "[autograd]") {
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  Tensor y = x * 2.0;
  y.backward(tensor({1, 0, 0, 10}, {2, 2}, DType::Float64));
  CHECK(values(x.grad()) == std::vector<double>{2, 0, 0, 20});
}

TEST_CASE("a gradient that must not be stolen is copied into .grad", "[autograd]") {
  // add's backward hands the same tensor to both inputs; each leaf must get its own buffer.
  Tensor a = leaf({1, 2}, {2});
  Tensor b = leaf({3, 4}, {2});
  Tensor gy = tensor({5, 6}, {2}, DType::Float64);
  (a + b).backward(gy);
  CHECK_FALSE(a.grad().shares_storage(b.grad()));
  CHECK_FALSE(a.grad().shares_storage(gy));
  F::sum(a * 1.0).backward();
  CHECK(values(a.grad()) == std::vector<double>{6, 7});
  CHECK(values(b.grad()) == std::vector<double>{5, 6});
  CHECK(values(gy) == std::vector<double>{5, 6});
}

TEST_CASE("no-grad scope records nothing", "[autograd]") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y;
  {
    NoGradGuard guard;
    CHECK_FALSE(GradMode::enabled());
    y = F::exp(x);
  }
  CHECK(GradMode::enabled());
  CHECK_FALSE(y.requires_grad());
  CHECK(y.is_leaf());
  CHECK_THROWS_WITH(y.backward(tensor({1, 1}, {2}, DType::Float64)),
                    Contains("does not require grad"));
}

TEST_CASE("inputs that do not require grad get no gradient", "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  Tensor b = tensor({3, 4}, {2}, DType::Float64);
  F::sum(a * b).backward();
  CHECK(values(a.grad()) == std::vector<double>{3, 4});
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("saved tensors are released after backward unless retained", "[autograd]") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = F::sum(F::exp(x));
  y.backward({}, /*retain_graph=*/true);
  y.backward();  // allowed: the first one retained the graph
  const auto g = values(x.grad());
  CHECK(g[0] == Approx(2 * std::exp(1.0)));
  CHECK_THROWS_WITH(y.backward(), Contains("retain_graph") && Contains("exp"));
}

TEST_CASE("releasing saved tensors frees their memory", "[autograd][memory]") {
  Allocator& alloc = allocator_for(Device::cpu());
  Tensor x = rand({256, 256}, DType::Float32);
  x.set_requires_grad();
  Tensor loss = F::sum(F::tanh(F::exp(x)));
  const int64_t held = alloc.stats().bytes_in_use;
  loss.backward();
  // exp's output and tanh's output were held for backward; only x.grad was added.
  CHECK(alloc.stats().bytes_in_use < held);
}

TEST_CASE("in-place modification of a saved tensor is detected", "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  Tensor b = tensor({3, 4}, {2}, DType::Float64);
  Tensor y = F::sum(a * b);
  const uint32_t v = b.version();
  add_(b, ones({2}, DType::Float64));
  CHECK(b.version() == v + 1);
  CHECK_THROWS_WITH(y.backward(),
                    Contains("mul") && Contains("modified in place") && Contains("[2]"));
}

TEST_CASE("a backward that fails a graph check leaves leaf gradients as they were", "[autograd]") {
  // The `+ x` path reaches x before exp's node, which is the one that cannot run.
  SECTION("released saved tensors") {
    Tensor x = leaf({0.5, -1.25}, {2});
    Tensor y = F::sum(F::add(F::exp(x), x));
    y.backward();
    const Tensor before = clone(x.grad());
    CHECK_THROWS_WITH(y.backward(), Contains("released") && Contains("exp"));
    CHECK(testing::bit_diff(x.grad(), before) == "");
  }
  SECTION("a saved tensor modified in place") {
    Tensor x = leaf({0.5, -1.25}, {2});
    Tensor b = tensor({3, 4}, {2}, DType::Float64);
    F::sum(x).backward();
    const Tensor before = clone(x.grad());
    Tensor y = F::sum(F::add(F::mul(x, b), x));
    add_(b, ones({2}, DType::Float64));
    CHECK_THROWS_WITH(y.backward(), Contains("mul") && Contains("modified in place"));
    CHECK(testing::bit_diff(x.grad(), before) == "");
  }
  SECTION("a node reached by two paths is checked once and the pass still runs") {
    Tensor x = leaf({0.5, -1.25}, {2});
    Tensor e = F::exp(x);
    F::sum(F::add(F::mul(e, e), e)).backward();
    const auto g = values(x.grad());
    CHECK(g[0] == Approx(2 * std::exp(1.0) + std::exp(0.5)));
  }
}

TEST_CASE("in-place update of a tensor requiring grad is refused in grad mode", "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  CHECK_THROWS_WITH(fill_(a, 0.0), Contains("fill_") && Contains("NoGradGuard"));
  NoGradGuard g;
  fill_(a, 5.0);
  CHECK(values(a) == std::vector<double>{5, 5});
}

TEST_CASE("views share storage and carry gradients back", "[autograd]") {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor v = F::reshape(x, {3, 2});
  CHECK(v.shares_storage(x));
  Tensor f = F::flatten(x);
  CHECK(f.shares_storage(x));
  CHECK(f.shape() == Shape{6});
  F::sum(v * tensor({1, 2}, {2}, DType::Float64)).backward();
  CHECK(values(x.grad()) == std::vector<double>{1, 2, 1, 2, 1, 2});
}

TEST_CASE("backward through a deep chain matches the analytic derivative", "[autograd]") {
  Tensor x = leaf({0.3}, {1});
  Tensor y = x;
  for (int i = 0; i < 200; ++i) y = F::tanh(y) * 1.01 + 0.001;
  F::sum(y).backward();
  double v = 0.3, d = 1;
  for (int i = 0; i < 200; ++i) {
    const double t = std::tanh(v);
    d *= (1 - t * t) * 1.01;
    v = t * 1.01 + 0.001;
  }
  CHECK(values(x.grad())[0] == Approx(d).epsilon(1e-10));
}

TEST_CASE("the graph is freed when its outputs go out of scope", "[autograd][memory]") {
  Allocator& alloc = allocator_for(Device::cpu());
  Tensor w = rand({64, 64}).set_requires_grad();
  const int64_t before = alloc.stats().bytes_in_use;
  {
    Tensor h = F::relu(F::matmul(rand({8, 64}), w));
    Tensor loss = F::mean(F::sigmoid(h));
    CHECK(alloc.stats().bytes_in_use > before);
  }  // never backpropagated: nodes and saved tensors die with the outputs
  CHECK(alloc.stats().bytes_in_use == before);
}

TEST_CASE("a rejected multi-output backward leaves the graph usable", "[autograd]") {
  Tensor w = leaf({1, 2}, {2});
  Tensor y = F::sum(w * 2.0);
  Tensor z = w * 3.0;
  const Tensor roots[] = {y, z};
  const Tensor bad[] = {ones({}, DType::Float64), ones({5}, DType::Float64)};
  CHECK_THROWS_WITH(autograd::backward(roots, bad, true), Contains("gradient 1"));
  y.backward();  // y's node must not be left queued by the failed call
  CHECK(values(w.grad()) == std::vector<double>{2, 2});
}

TEST_CASE("dropping a very deep graph does not recurse", "[autograd][memory]") {
  Tensor x = leaf({0}, {1});
  Tensor h = x;
  for (int i = 0; i < 300000; ++i) h = F::add(h, 1.0);
  h = Tensor();  // frees 300k nodes; a recursive teardown overflows the stack
  Tensor m = F::mul(x, x);
  for (int i = 0; i < 100000; ++i) m = F::mul(m, 1.0);  // nodes that save their inputs
  m = Tensor();
  // Nodes whose two edges reach one producer (x + x, x * x): neither edge alone owns it.
  Tensor d = x;
  for (int i = 0; i < 300000; ++i) d = F::add(d, d);
  d = Tensor();
  Tensor s = x;
  for (int i = 0; i < 100000; ++i) s = F::mul(s, s);
  s = Tensor();
  // A producer reached directly and through a child (a residual step, y = tanh(y) + y).
  Tensor r = x;
  for (int i = 0; i < 300000; ++i) r = F::add(F::tanh(r), r);
  r = Tensor();
  SUCCEED();
}

TEST_CASE("a leaf whose requires_grad was turned off after the forward gets no gradient",
          "[autograd]") {
  // As PyTorch's AccumulateGrad: a parameter frozen between forward and backward stays frozen.
  Tensor w = leaf({1, 2}, {2}), v = leaf({3, 4}, {2});
  int calls = 0;
  autograd::add_post_accumulate_grad_hook(w, [&calls](const Tensor&) { ++calls; });
  const Tensor y = F::sum(F::mul(w, v));
  w.set_requires_grad(false);
  y.backward();
  CHECK_FALSE(w.grad().defined());
  CHECK(calls == 0);
  CHECK(values(v.grad()) == std::vector<double>{1, 2});
}

TEST_CASE("add_ and copy_ refuse, in grad mode, an operand whose gradient they would drop",
          "[autograd]") {
  const Tensor w = leaf({1, 2}, {2});
  Tensor acc = zeros({2}, DType::Float64), buf = zeros({2}, DType::Float64);
  CHECK_THROWS_WITH(add_(acc, F::mul(w, 3.0)),
                    Contains("add_: other [2] requires grad, and add_ is not differentiable"));
  CHECK_THROWS_WITH(copy_(buf, w), Contains("copy_: src [2] requires grad"));
  CHECK(values(acc) == std::vector<double>{0, 0});  // left as they were
  CHECK(values(buf) == std::vector<double>{0, 0});
  add_(acc, w.detach());
  {
    NoGradGuard no_grad;
    add_(acc, w);
    copy_(buf, w);
  }
  CHECK(values(acc) == std::vector<double>{2, 4});
  CHECK(values(buf) == std::vector<double>{1, 2});
}

TEST_CASE("set_grad rejects gradients that would alias or form a cycle", "[autograd]") {
  Tensor w = leaf({1, 2}, {2});
  CHECK_THROWS_WITH(w.set_grad(w), Contains("shares storage"));
  CHECK_THROWS_WITH(w.set_grad(F::mul(w, w)), Contains("detach"));
  w.set_grad(F::mul(w, w).detach());
  CHECK(values(w.grad()) == std::vector<double>{1, 4});
}

TEST_CASE("detach is a dispatched view cut from the graph", "[autograd]") {
  Tensor w = leaf({1, 2}, {2});
  Tensor d = (w * 2.0).detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  CHECK(values(d) == std::vector<double>{2, 4});
}

TEST_CASE("pow with exponent 0 has a zero gradient everywhere", "[autograd]") {
  Tensor x = leaf({0, 2}, {2});
  F::sum(F::pow(x, 0.0)).backward();
  CHECK(values(x.grad()) == std::vector<double>{0, 0});
}

TEST_CASE("matmul and linear handle zero-sized dimensions", "[autograd]") {
  Tensor a = zeros({2, 3, 0}, DType::Float64).set_requires_grad();
  Tensor b = zeros({0, 5}, DType::Float64).set_requires_grad();
  Tensor y = F::matmul(a, b);
  CHECK(y.shape() == Shape{2, 3, 5});
  CHECK(F::sum(y).item<double>() == 0.0);
  F::sum(y).backward();
  CHECK(a.grad().shape() == Shape{2, 3, 0});
  CHECK(b.grad().shape() == Shape{0, 5});
  Tensor x = ones({2, 3, 4}, DType::Float64).set_requires_grad();
  Tensor w = zeros({0, 4}, DType::Float64).set_requires_grad();
  Tensor out = F::linear(x, w);
  CHECK(out.shape() == Shape{2, 3, 0});
  out.backward(zeros({2, 3, 0}, DType::Float64));
  CHECK(values(F::sum(x.grad())) == std::vector<double>{0});
}

TEST_CASE("a post-accumulate hook that removes itself does not skip the next hook", "[autograd]") {
  // Removing a hook shifted the list under the loop's index: the hook after it was skipped.
  Tensor w = leaf({1, 2}, {2});
  std::vector<std::string> calls;
  uint64_t id_a = 0;
  id_a = autograd::add_post_accumulate_grad_hook(w, [&](const Tensor& l) {
    calls.push_back("a");
    autograd::remove_post_accumulate_grad_hook(l, id_a);  // one-shot
  });
  uint64_t id_c = 0;
  autograd::add_post_accumulate_grad_hook(w, [&](const Tensor& l) {
    calls.push_back("b");
    autograd::remove_post_accumulate_grad_hook(l, id_c);  // removed before its turn: not run
  });
  id_c = autograd::add_post_accumulate_grad_hook(w, [&](const Tensor&) { calls.push_back("c"); });
  bool added = false;
  autograd::add_post_accumulate_grad_hook(w, [&](const Tensor& l) {
    calls.push_back("d");
    if (!std::exchange(added, true))  // added during the pass: runs in it
      autograd::add_post_accumulate_grad_hook(l, [&](const Tensor&) { calls.push_back("e"); });
  });
  F::sum(w * 2.0).backward();
  CHECK(calls == std::vector<std::string>{"a", "b", "d", "e"});
  calls.clear();
  F::sum(w * 2.0).backward();
  CHECK(calls == std::vector<std::string>{"b", "d", "e"});
  CHECK(values(w.grad()) == std::vector<double>{4, 4});
}

TEST_CASE("identity permute, transpose, broadcast_to and sum_to return a new tensor",
          "[autograd]") {
  // They returned x itself: a leaf, whose fill_ or set_requires_grad changed x.
  const Tensor x = tensor({1, 2, 3, 4}, {2, 2}, DType::Float64);
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops = {
      {"transpose(x, 1, 1)", [](const Tensor& t) { return F::transpose(t, 1, 1); }},
      {"transpose(x, -1, 1)", [](const Tensor& t) { return F::transpose(t, -1, 1); }},
      {"permute(x, {0, 1})",
       [](const Tensor& t) {
         return F::permute(t, {0, 1});
       }},
      {"broadcast_to(x, x.shape())", [](const Tensor& t) { return F::broadcast_to(t, t.shape()); }},
      {"sum_to(x, x.shape())", [](const Tensor& t) { return F::sum_to(t, t.shape()); }},
  };
  for (const auto& [what, op] : ops) {
    CAPTURE(what);
    Tensor y = op(x);
    CHECK_FALSE(y.is_same(x));
    CHECK_FALSE(y.shares_storage(x));  // a copy, as every op but reshape and flatten gives
    CHECK(y.shape() == x.shape());
    CHECK(values(y) == std::vector<double>{1, 2, 3, 4});
    fill_(y, 0);
    CHECK(values(x) == std::vector<double>{1, 2, 3, 4});
    y.set_requires_grad();
    CHECK_FALSE(x.requires_grad());

    // From a leaf that requires grad: a non-leaf whose gradient reaches the leaf.
    Tensor w = leaf({1, 2, 3, 4}, {2, 2});
    Tensor v = op(w);
    CHECK_FALSE(v.is_leaf());
    CHECK(v.requires_grad());
    CHECK_THROWS_WITH(v.set_requires_grad(false), Contains("only a leaf tensor can be marked"));
    F::sum(v * tensor({1, 2, 3, 4}, {2, 2}, DType::Float64)).backward();
    CHECK(values(w.grad()) == std::vector<double>{1, 2, 3, 4});
  }
}

namespace {
// The bytes of t's elements (bit-for-bit comparisons).
std::vector<unsigned char> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.raw_data());
  return {p, p + t.nbytes()};
}
}  // namespace

TEST_CASE("mul, linear and matmul keep an operand only for the other operand's gradient",
          "[autograd]") {
  // Both operands were kept: writing the one whose gradient no one needs (a parameter updated
  // before the backward of a loss that reads it as data) was a version-counter Error, as PyTorch
  // does not raise, and it was held in memory for nothing.
  SECTION("mul") {
    Tensor w = leaf({1, 2}, {2});
    const Tensor x = tensor({3, 4}, {2}, DType::Float64);
    const Tensor loss = F::sum(F::mul(x, w));
    {
      NoGradGuard no_grad;
      add_(w, ones({2}, DType::Float64));  // w is not kept: x's gradient is not needed
    }
    loss.backward();
    CHECK(values(w.grad()) == std::vector<double>{3, 4});
    // x is kept for w's gradient: writing it is still caught.
    Tensor x2 = tensor({3, 4}, {2}, DType::Float64);
    const Tensor loss2 = F::sum(F::mul(w, x2));
    {
      NoGradGuard no_grad;
      add_(x2, ones({2}, DType::Float64));
    }
    CHECK_THROWS_WITH(loss2.backward(), Contains("modified in place"));
  }
  SECTION("linear") {
    Tensor x = leaf({1, 2, 3, 4, 5, 6}, {3, 2});
    Tensor w = tensor({1, 0, 0, 1}, {2, 2}, DType::Float64);
    const Tensor loss = F::sum(F::linear(x, w));
    {
      NoGradGuard no_grad;
      add_(x, ones({3, 2}, DType::Float64));  // x is not kept: w needs no gradient
    }
    loss.backward();
    CHECK(values(x.grad()) == std::vector<double>{1, 1, 1, 1, 1, 1});
    Tensor b = leaf({0, 0}, {2});
    const Tensor data = tensor({1, 2, 3, 4, 5, 6}, {3, 2}, DType::Float64);
    const Tensor only_bias = F::sum(F::linear(data, w, b));
    {
      NoGradGuard no_grad;
      add_(w, ones({2, 2}, DType::Float64));  // neither is kept for the bias's gradient
    }
    only_bias.backward();
    CHECK(values(b.grad()) == std::vector<double>{3, 3});
  }
  SECTION("matmul") {
    Tensor a = tensor({1, 2, 3, 4}, {2, 2}, DType::Float64);
    Tensor b = leaf({1, 0, 0, 1}, {2, 2});
    const Tensor loss = F::sum(F::matmul(a, b));
    {
      NoGradGuard no_grad;
      add_(b, ones({2, 2}, DType::Float64));  // b is not kept: a needs no gradient
    }
    loss.backward();
    CHECK(values(b.grad()) == std::vector<double>{4, 4, 6, 6});
    const Tensor loss2 = F::sum(F::matmul(a, b));
    {
      NoGradGuard no_grad;
      add_(a, ones({2, 2}, DType::Float64));  // a is kept for b's gradient
    }
    CHECK_THROWS_WITH(loss2.backward(), Contains("modified in place"));
  }
}

TEST_CASE("the gradients of mul, linear and matmul do not depend on which operands need one",
          "[autograd]") {
  // Each input's gradient, bit for bit, whichever other inputs require grad.
  struct Case {
    const char* name;
    std::vector<Shape> shapes;
    std::function<Tensor(const std::vector<Tensor>&)> fn;
  };
  const std::vector<Case> cases = {
      {"mul", {{3, 4}, {3, 4}}, [](const auto& in) { return F::mul(in[0], in[1]); }},
      {"mul broadcast", {{3, 1}, {2, 1, 4}}, [](const auto& in) { return F::mul(in[0], in[1]); }},
      {"linear", {{5, 3}, {4, 3}}, [](const auto& in) { return F::linear(in[0], in[1]); }},
      {"linear 3-D with bias",
       {{2, 5, 3}, {4, 3}, {4}},
       [](const auto& in) { return F::linear(in[0], in[1], in[2]); }},
      {"matmul", {{5, 3}, {3, 4}}, [](const auto& in) { return F::matmul(in[0], in[1]); }},
      {"matmul batched",
       {{2, 1, 5, 3}, {3, 3, 4}},
       [](const auto& in) { return F::matmul(in[0], in[1]); }},
      {"matmul shared b",
       {{2, 5, 3}, {3, 4}},
       [](const auto& in) { return F::matmul(in[0], in[1]); }},
  };
  for (const DType dt : {DType::Float32, DType::Float64}) {
    for (const Case& k : cases) {
      CAPTURE(name(dt), k.name);
      const int n = static_cast<int>(k.shapes.size());
      std::vector<Tensor> values_in;
      for (const Shape& s : k.shapes) values_in.push_back(randn(s, dt));
      const Tensor gy = randn(k.fn(values_in).shape(), dt);
      // The gradients with every input requiring grad, then with each other subset.
      auto grads = [&](unsigned subset) {
        std::vector<Tensor> in;
        for (int i = 0; i < n; ++i) {
          in.push_back(clone(values_in[i]));
          if (subset >> i & 1) in.back().set_requires_grad();
        }
        k.fn(in).backward(gy);
        std::vector<Tensor> g;
        for (const Tensor& t : in) g.push_back(t.grad());
        return g;
      };
      const unsigned all = (1u << n) - 1;
      const std::vector<Tensor> want = grads(all);
      for (unsigned subset = 1; subset < all; ++subset) {
        CAPTURE(subset);
        const std::vector<Tensor> got = grads(subset);
        for (int i = 0; i < n; ++i) {
          CAPTURE(i);
          CHECK(got[i].defined() == bool(subset >> i & 1));
          if (got[i].defined()) CHECK(bytes_of(got[i]) == bytes_of(want[i]));
        }
      }
    }
  }
}
