// The module tree as PyTorch keeps it: modules() lists a shared child once, a module cannot hold
// itself (every walk over the tree would never end), and a parameter that cannot be one is refused
// naming the module and the parameter.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

TEST_CASE("modules() lists a shared child once, at its first place", "[nn]") {
  auto shared = std::make_shared<nn::Linear>(2, 2);
  nn::Sequential seq({shared, std::make_shared<nn::ReLU>(), shared});
  const std::vector<nn::Module*> all = seq.modules();
  REQUIRE(all.size() == 3);
  CHECK(all[0] == &seq);
  CHECK(all[1] == shared.get());
  // A loop scaling every Linear's weight scales the shared one once.
  const Tensor before = clone(shared->weight.detach());
  {
    NoGradGuard no_grad;
    for (nn::Module* m : all)
      if (auto* lin = dynamic_cast<nn::Linear*>(m)) copy_(lin->weight, lin->weight * 0.5);
  }
  CHECK(bit_diff(shared->weight, before * 0.5) == "");
}

TEST_CASE("a module cannot be added below itself", "[nn]") {
  auto outer = std::make_shared<nn::Sequential>();
  auto inner = std::make_shared<nn::Sequential>();
  outer->add(inner);
  CHECK_THAT(error_of([&] { outer->add(outer); }),
             Contains("holds this module; a module cannot be its own descendant"));
  CHECK_THAT(error_of([&] { inner->add(outer); }),
             Contains("holds this module; a module cannot be its own descendant"));
  CHECK(outer->modules().size() == 2);  // left as it was
  CHECK(inner->modules().size() == 1);
  CHECK(outer->named_parameters().empty());
}

TEST_CASE("a parameter that cannot be one is refused naming the module and the parameter", "[nn]") {
  struct Holder : nn::Module {
    Tensor w;
    void param(Tensor t) {
      w = std::move(t);
      register_parameter("w", &w);
    }
    std::string describe() const override { return "Holder"; }
  };
  Holder h;
  CHECK_THAT(error_of([&] { h.param(zeros({2}, DType::Int64)); }),
             Contains("Holder: parameter 'w' [2] is int64; parameters must be floating"));
  Tensor leaf = zeros({2});
  leaf.set_requires_grad(true);
  CHECK_THAT(error_of([&] { h.param(F::mul(leaf, 2.0)); }),
             Contains("Holder: parameter 'w' [2] is not a leaf"));
  CHECK(h.named_parameters().empty());
  CHECK_THAT(error_of([] { nn::Linear(3, 2, {.dtype = DType::Int64}); }),
             Contains("Linear: dtype must be float32 or float64, it is int64"));
  nn::MultiheadAttention mha(4, 2);
  CHECK_THAT(error_of([&] {
               mha(randn({1, 3, 4}, DType::Float64));
             }),
             Contains("MultiheadAttention: x is float64 but the module's weights are float32"));
}
