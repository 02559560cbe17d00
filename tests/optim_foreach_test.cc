// Optimizer updates with foreach on the cpu (tests/optim_foreach.h): the same bits as one call per
// parameter, in eager steps and in a static whole step (verify mode too); parameters sharing a
// storage are updated one call each; a bad call is an Error that leaves every parameter as it was.
#include <catch2/catch.hpp>

#include <vector>

#include "tests/optim_foreach.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

TEST_CASE("foreach optimizer updates equal one call per parameter bit for bit", "[optim]") {
  check_foreach_equals_loop(Device::cpu());
}

TEST_CASE("a static whole step with a foreach update replays eager's bits", "[optim][static]") {
  for (const bool fold : {false, true}) {
    INFO("fold " << fold);
    check_foreach_whole_step(Device::cpu(), 0, fold);
    const StaticStats verified = check_foreach_whole_step(Device::cpu(), /*verify_every=*/1, fold);
    CHECK(verified.verifications == 5);
  }
}

TEST_CASE("foreach is off by default on the cpu, and for parameters sharing a storage", "[optim]") {
  Tensor p = randn({4}, DType::Float32).set_requires_grad();
  Tensor q = randn({3}, DType::Float32).set_requires_grad();
  Tensor p_view = p.detach().set_requires_grad();  // another parameter on p's storage
  optim::Adam by_default({p, q});
  optim::Adam shared({p, p_view, q}, {.foreach = true});
  for (optim::Optimizer* opt : std::vector<optim::Optimizer*>{&by_default, &shared}) {
    p.set_grad(ones({4}));
    p_view.set_grad(ones({4}));
    q.set_grad(ones({3}));
    UpdateCounter counter;
    opt->step();
    CHECK(counter.parameters_per_call == std::vector<int>(opt == &shared ? 3 : 2, 1));
  }
  Tensor r = randn({2}, DType::Float32).set_requires_grad();
  r.set_grad(ones({2}));
  UpdateCounter counter;
  optim::Adam({p, q, r}, {.foreach = true}).step();
  CHECK(counter.parameters_per_call == std::vector<int>{3});
}

TEST_CASE("a bad optimizer update call is an Error and leaves every parameter as it was",
          "[optim]") {
  NoGradGuard no_grad;
  const AttrBlob attrs = AttrBlob::of(AdamAttrs{1e-2, 0.9, 0.999, 1e-8, 0, false});
  auto group = [](Tensor p, Tensor g) {
    return std::vector<Tensor>{p, g, zeros_like(p), zeros_like(p), zeros({}, DType::Int64)};
  };
  Tensor p = ones({3}), q = ones({2});
  std::vector<Tensor> in = group(p, ones({3}));
  const std::vector<Tensor> second = group(q, ones({2}));
  in.insert(in.end(), second.begin(), second.end());
  auto call = [&](std::vector<Tensor> inputs) {
    return error_of([&] { dispatch(Op::AdamUpdate, inputs, {}, attrs); });
  };
  // A group cut short.
  CHECK_THAT(call({in.begin(), in.end() - 1}),
             Contains("adam_update: called with 9 inputs; it takes groups of 5"));
  // A gradient of another size than its parameter (argument 6: the second group's gradient).
  std::vector<Tensor> bad = in;
  bad[6] = ones({5});
  CHECK_THAT(call(bad), Contains("adam_update: argument 6 is float32[5] but its parameter "
                                 "(argument 5) is float32[2]"));
  // Parameters of two dtypes in one call.
  bad = in;
  const std::vector<Tensor> wide = group(ones({2}, DType::Float64), ones({2}, DType::Float64));
  std::copy(wide.begin(), wide.end(), bad.begin() + 5);
  CHECK_THAT(call(bad), Contains("adam_update: parameter 1 (argument 5) is float64[2] but "
                                 "parameter 0 is float32[3]"));
  // A step counter that is not one int64.
  bad = in;
  bad[9] = zeros({2}, DType::Int64);
  CHECK_THAT(call(bad), Contains("argument 9, the step counter of parameter 1, must be one int64"));
  // Nothing was written, the first group's parameter included.
  CHECK(p.to_vector<float>() == std::vector<float>(3, 1.0f));
  CHECK(in[4].item<int64_t>() == 0);
  CHECK(call(in) == "");
  CHECK(p.to_vector<float>() != std::vector<float>(3, 1.0f));
  CHECK(in[4].item<int64_t>() == 1);
  CHECK(in[9].item<int64_t>() == 1);
}
