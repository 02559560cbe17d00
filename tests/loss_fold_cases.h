// A loss's gradient and the input gradient of the classifier's last linear in one step
// (LossGradMatmul, schedule/loss_folds.cc): the scenario the cpu (static_loss_fold_test.cc) and
// cuda:0 (cuda/cuda_small_gemm_test.cc, CUDA graphs on and off) both run. Whole Adam steps of a
// linear, an optional tanh and the head, static against eager on the device, bit for bit
// (losses, parameters, gradients), in float32 and float64, with softmax_cross_entropy (int64
// labels, ignore -1) and cross_entropy (int32 targets, ignore -100), some rows ignored and one
// batch all ignored (a zero gradient), the fold switch on and off; the dump shows the folds where
// the device takes them (the cpu always; CUDA where its small GEMM kernel computes the gradient:
// k of at most 124 float32 or 62 float64 classes, and the logits too where the head's weight and
// rows fit beside it, runtime/small_gemm.h). A bad label in a replay is the cpu's Error, and the
// next call replays with eager's bits again.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/small_gemm.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

namespace encore::testing {

// features -> hidden (then tanh, or nothing) -> classes.
class HeadNet : public nn::Module {
 public:
  HeadNet(int64_t features, int64_t hidden, int64_t classes, bool tanh, DType dtype) : tanh_(tanh) {
    const nn::LinearOptions o{.dtype = dtype};
    l1 = register_module("l1", std::make_shared<nn::Linear>(features, hidden, o));
    l2 = register_module("l2", std::make_shared<nn::Linear>(hidden, classes, o));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = (*l1)(x);
    return (*l2)(tanh_ ? F::tanh(h) : h);
  }
  std::shared_ptr<nn::Linear> l1, l2;

 private:
  bool tanh_;
};

// The batch sizes: rows, features, hidden units, classes. The second has four rows of the
// gradient per CUDA block and three blocks across its columns; the third and fourth 100 classes
// (past float64's limit on CUDA), the fourth with a head too large for CUDA's kernel to compute
// the logits as well.
struct LossFoldCase {
  int64_t rows, features, hidden, classes;
};
inline constexpr LossFoldCase kLossFoldCases[] = {
    {12, 24, 16, 10}, {64, 20, 300, 10}, {8, 16, 12, 100}, {8, 16, 100, 100}};

// Labels (i * (b + 1)) % classes on `device`, as `dtype`, with rows i % 4 == 1 `ignore`d (all
// rows where `all_ignored`).
inline Tensor fold_labels(int64_t rows, int64_t classes, int b, int64_t ignore, DType dtype,
                          bool all_ignored, Device device) {
  std::vector<double> v(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i)
    v[static_cast<size_t>(i)] = all_ignored || i % 4 == 1
                                    ? static_cast<double>(ignore)
                                    : static_cast<double>((i * (b + 1)) % classes);
  return tensor(v, {rows}, dtype, device);
}

// The product g w of case c, and the head's linear: whether a plan on `device` folds the loss's
// gradient into the product, and the head's logits into that step too.
inline GemmShape head_input_grad(const LossFoldCase& c) {
  return {.m = c.rows,
          .n = c.hidden,
          .k = c.classes,
          .lda = c.classes,
          .ldb = c.hidden,
          .ldc = c.hidden};
}
inline bool folds_loss_grad(const LossFoldCase& c, DType dtype, Device device) {
  return device.type != DeviceType::CUDA ||
         cuda_small_gemm_computes_loss_grad(head_input_grad(c), dtype);
}
inline bool folds_logits(const LossFoldCase& c, DType dtype, Device device) {
  const GemmShape product = head_input_grad(c);
  return device.type != DeviceType::CUDA ||
         cuda_small_gemm_computes_logits(product, loss_logits_linear(product, c.hidden), dtype);
}

// One training step of m with optimizer o: zero_grad, the loss loss_of(m, x, t), backward, step;
// returns the loss.
template <typename LossOf>
Tensor adam_step(nn::Module& m, optim::Adam& o, const Tensor& x, const Tensor& t, LossOf& loss_of) {
  o.zero_grad();
  Tensor loss = loss_of(m, x, t);
  loss.backward();
  o.step();
  return loss;
}

inline void check_loss_grad_folds(Device device) {
  StaticEnabled on;
  for (const LossFoldCase& c : kLossFoldCases)
    for (const DType dtype : {DType::Float32, DType::Float64})
      for (const bool cross_entropy : {false, true})
        for (const bool tanh : {false, true})
          for (const bool fold : {true, false}) {
            INFO(name(dtype) << ", rows " << c.rows << ", hidden " << c.hidden << ", classes "
                             << c.classes << (cross_entropy ? ", cross_entropy" : "")
                             << (tanh ? ", tanh" : "") << ", fold " << fold);
            const StaticFoldActivations setting(fold);
            auto make = [&] {
              return std::make_shared<HeadNet>(c.features, c.hidden, c.classes, tanh, dtype);
            };
            auto eager_model = seeded(8, device, make), model = seeded(8, device, make);
            const optim::AdamOptions adam{.lr = 1e-2};
            optim::Adam eager_opt(eager_model->parameters(), adam), opt(model->parameters(), adam);
            const int64_t ignore = cross_entropy ? -100 : -1;
            auto loss_of = [&](nn::Module& m, const Tensor& x, const Tensor& t) {
              const Tensor logits = m.forward(x);
              return cross_entropy ? F::cross_entropy(logits, t, ignore)
                                   : F::softmax_cross_entropy(logits, t, ignore);
            };
            auto train = [&](nn::Module& m, optim::Adam& o, const Tensor& x, const Tensor& t) {
              return adam_step(m, o, x, t, loss_of);
            };
            auto step = static_graph(
                [&](const Tensor& x, const Tensor& t) { return train(*model, opt, x, t); },
                {.name = "loss_fold", .modules = {model}});
            const DType labels = cross_entropy ? DType::Int32 : DType::Int64;
            manual_seed(9);
            for (int b = 0; b < 4; ++b) {
              INFO("step " << b);
              const Tensor x = randn({c.rows, c.features}, dtype).to(device);
              const Tensor t = fold_labels(c.rows, c.classes, b, ignore, labels, b == 2, device);
              CHECK(bit_diff(step(x, t), train(*eager_model, eager_opt, x, t)) == "");
              check_same_parameters(*eager_model, *model, cat("step ", b));
            }
            CHECK(step.stats().traces == 1);
            const std::string text = step.schedule_text();
            INFO(text);
            const bool folds = fold && folds_loss_grad(c, dtype, device);
            const bool logits = folds && folds_logits(c, dtype, device);
            CHECK(
                count_of(text, cat(R"(loss_grad_matmul\s+\[[^\]]*softmax_cross_entropy_grad and )",
                                   tanh ? "matmul_act_grad" : "matmul", " in one")) == folds);
            CHECK(count_of(text, R"(\d+  softmax_cross_entropy_grad\b)") == !folds);
            CHECK(count_of(text,
                           R"(loss_grad_matmul\s+\[[^\]]*linear and )"
                           R"(softmax_cross_entropy_grad in one: recorded as steps)") == logits);
            // The head's linear, and the first one where its tanh does not fold into it.
            CHECK(count_of(text, R"(\d+  linear\b)") == (tanh && fold ? 1 : 2) - logits);
          }
}

// The message of the Error `fn` raises, at once or at the next wait for the device (its result's
// item()); "" when none.
template <typename Fn>
std::string loss_error(Fn&& fn) {
  try {
    fn().template item<float>();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A label out of range in a replay of a folded step: eager's Error, the loss's (eagerly the loss
// meets it first, and the folded step, which runs before the loss, checks the labels as it does),
// when the call ends on the cpu and at the next wait on CUDA; then a good batch replays with
// eager's bits. With softmax_cross_entropy and cross_entropy (its 'targets' wording), the labels
// handed to the call (the cpu checks those before the replay) or computed in it (the step's own
// check).
inline void check_loss_grad_fold_bad_label(Device device) {
  StaticEnabled on;
  const StaticFoldActivations fold(true);
  for (const bool cross_entropy : {false, true})
    for (const bool computed : {false, true}) {
      INFO((cross_entropy ? "cross_entropy" : "softmax_cross_entropy")
           << (computed ? ", labels computed in the call" : ""));
      auto make = [] { return std::make_shared<HeadNet>(24, 16, 10, true, DType::Float32); };
      auto eager_model = seeded(10, device, make), model = seeded(10, device, make);
      auto train = [&](nn::Module& m, const Tensor& x, const Tensor& t) {
        m.zero_grad();
        const Tensor labels = computed ? clone(t) : t;
        const Tensor logits = m.forward(x);
        Tensor loss = cross_entropy ? F::cross_entropy(logits, labels, -1)
                                    : F::softmax_cross_entropy(logits, labels);
        loss.backward();
        return loss;
      };
      auto step =
          static_graph([&](const Tensor& x, const Tensor& t) { return train(*model, x, t); },
                       {.name = "loss_fold_bad_label", .modules = {model}});
      manual_seed(11);
      const Tensor x = randn({12, 24}).to(device);
      const Tensor good = fold_labels(12, 10, 0, -1, DType::Int64, false, device);
      CHECK(bit_diff(step(x, good), train(*eager_model, x, good)) == "");
      const Tensor bad = tensor({0, 1, 2, 3, 4, 5, 6, 13, 8, 9, 0, 1}, {12}, DType::Int64, device);
      const std::string eager = loss_error([&] { return train(*eager_model, x, bad); });
      CHECK_THAT(eager, Catch::Matchers::Contains(
                            cross_entropy ? "cross_entropy: argument 'targets': label 13 at flat "
                                            "index 7 is out of range [0, 10)"
                                          : "softmax_cross_entropy: label 13 of sample 7 is out "
                                            "of range [0, 10)"));
      CHECK(loss_error([&] { return step(x, bad); }) == eager);
      CHECK(bit_diff(step(x, good), train(*eager_model, x, good)) == "");
      check_same_parameters(*eager_model, *model, "after the bad label");
      CHECK(step.stats().traces == 1);
      CHECK_THAT(
          step.schedule_text(),
          Catch::Matchers::Contains("softmax_cross_entropy_grad and matmul_act_grad in one") &&
              Catch::Matchers::Contains("linear and softmax_cross_entropy_grad in one"));
    }
}

}  // namespace encore::testing
