// A linear's weight and bias gradients and their parameters' Adam updates in one step
// (WeightGradAdam, schedule/update_folds.cc): the scenario the cpu (static_update_fold_test.cc)
// and cuda:0 (cuda/cuda_small_gemm_test.cc, CUDA graphs on and off) both run. Whole Adam steps of
// linear, tanh, layer_norm, linear, static against eager on the device, bit for bit (losses,
// parameters, gradients), in float32 and float64, with Adam and AdamW (weight decay), a foreach
// update (one call for every parameter) and one call per parameter, a new learning rate at every
// step (the replays read it at the call), verify mode on every replay or none, the fold switch on
// and off (and the cpu's own switch, off by default, on). The dump shows the two linears' updates
// in their gradients' steps, and the layer norm's left in an update of their own (a foreach update
// split: verify mode compares its groups one by one with the eager call's).
#pragma once

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

namespace encore::testing {

// features -> 16 -> tanh -> layer_norm -> 10.
class NormNet : public nn::Module {
 public:
  NormNet(int64_t features, DType dtype, Device device) {
    const nn::LinearOptions o{.dtype = dtype};
    l1 = register_module("l1", std::make_shared<nn::Linear>(features, 16, o));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{16}, 1e-5,
                                                                   true, dtype, device));
    l2 = register_module("l2", std::make_shared<nn::Linear>(16, 10, o));
  }
  Tensor forward(const Tensor& x) override { return (*l2)((*norm)(F::tanh((*l1)(x)))); }
  std::shared_ptr<nn::Linear> l1, l2;
  std::shared_ptr<nn::LayerNorm> norm;
};

inline void check_update_folds(Device device) {
  StaticEnabled on;
  for (const DType dtype : {DType::Float32, DType::Float64})
    for (const bool adamw : {false, true})
      for (const bool foreach : {true, false})
        for (const int verify_every : {0, 1})
          for (const bool fold : {true, false}) {
            INFO(name(dtype) << (adamw ? ", AdamW" : ", Adam") << ", foreach " << foreach
                             << ", verify every " << verify_every << ", fold " << fold);
            const StaticFoldActivations setting(fold);
            const StaticFoldCpuUpdates cpu(true);  // (CUDA plans fold without it)
            auto make = [&] { return std::make_shared<NormNet>(24, dtype, device); };
            auto eager_model = seeded(8, device, make), model = seeded(8, device, make);
            const optim::AdamOptions options{.lr = 1e-2,
                                             .weight_decay = adamw ? 0.1 : 0.0,
                                             .decoupled = adamw,
                                             .foreach = foreach};
            optim::Adam eager_opt(eager_model->parameters(), options),
                opt(model->parameters(), options);
            auto train = [](nn::Module& m, optim::Adam& o, const Tensor& x, const Tensor& t) {
              o.zero_grad();
              Tensor loss = F::softmax_cross_entropy(m.forward(x), t);
              loss.backward();
              o.step();
              return loss;
            };
            auto step = static_graph(
                [&](const Tensor& x, const Tensor& t) { return train(*model, opt, x, t); },
                {.name = "update_fold", .verify_every = verify_every, .modules = {model}});
            const std::vector<Batch> batches = feature_batches(4, 12, 24, dtype, 3, device);
            for (size_t b = 0; b < batches.size(); ++b) {
              INFO("step " << b);
              eager_opt.options.lr = opt.options.lr = 1e-2 / static_cast<double>(b + 1);
              CHECK(bit_diff(step(batches[b].x, batches[b].t),
                             train(*eager_model, eager_opt, batches[b].x, batches[b].t)) == "");
              check_same_parameters(*eager_model, *model, cat("step ", b));
            }
            const StaticStats s = step.stats();
            CHECK(s.traces == 1);
            CHECK(s.verifications == (verify_every == 1 ? 3 : 0));
            const std::string text = step.schedule_text();
            INFO(text);
            CHECK(count_of(text, R"(weight_grad_adam\s+\[[^\]]*weight_bias_grad and adam_update )"
                                 R"(in one: recorded as steps)") == (fold ? 2 : 0));
            // The layer norm's two parameters: one update (foreach) or two; with all six
            // parameters unfolded, one or six.
            CHECK(count_of(text, R"(\d+  adam_update\b)") == (foreach ? 1 : fold ? 2 : 6));
          }
}

}  // namespace encore::testing
