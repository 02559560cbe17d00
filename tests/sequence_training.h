// Whole training steps of the sequence models, eager against a static function, shared by the
// cpu tests (sequence_models_test.cc) and the CUDA tests (cuda/cuda_sequence_test.cc): token
// batches from a seed, and a check that trains an eager and a static copy of a model on the same
// batches and compares losses, parameters and gradients bit for bit after every step.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <utility>

#include "encore/encore.h"
#include "tests/test_util.h"

namespace encore::testing {

inline constexpr int64_t kSequenceVocab = 11;

// Token ids [batch, steps] in [0, kSequenceVocab) and their next tokens, from a seed, made on the
// host and moved to `device`.
inline std::pair<Tensor, Tensor> sequence_tokens(int64_t batch, int64_t steps, uint64_t seed,
                                                 Device device = Device::cpu()) {
  Tensor x = empty({batch, steps}, DType::Int64), t = empty({batch, steps}, DType::Int64);
  uint64_t s = seed * 2654435761u + 1;
  for (int64_t i = 0; i < batch * steps; ++i) {
    s = s * 6364136223846793005u + 1442695040888963407u;
    x.data<int64_t>()[i] = static_cast<int64_t>((s >> 33) % kSequenceVocab);
    t.data<int64_t>()[i] = static_cast<int64_t>((s >> 41) % kSequenceVocab);
  }
  // Some ignored targets: their positions get no loss and no gradient.
  t.data<int64_t>()[1] = -100;
  return {x.to(device), t.to(device)};
}

// A model made from seed 7 on the host, then moved to `device`.
template <typename M, typename... A>
std::shared_ptr<M> seeded_on(Device device, A... args) {
  manual_seed(7);
  auto m = std::make_shared<M>(args...);
  if (device != Device::cpu()) m->to(device);
  return m;
}

// One training step of a language model: cross entropy of m(x) against t, zero_grad, backward,
// the optimizer's update; returns the loss.
inline Tensor lm_train_step(nn::Module& m, optim::Optimizer& opt, const Tensor& x,
                            const Tensor& t) {
  Tensor loss = F::cross_entropy(m(x), t);
  m.zero_grad();
  loss.backward();
  opt.step();
  return loss;
}

// Trains an eager and a static copy of a model (two calls of `make`, made from one seed) for
// `train_steps` steps on the same batches on `device` and checks losses, parameters and
// gradients bit for bit after every step; one trace, the other calls replayed (and verified
// when `verify_every` > 0). Returns the static function's statistics.
template <typename M, typename Opt, typename Make>
StaticStats check_static_training(Make make, int64_t batch, int64_t steps, int verify_every,
                                  int train_steps = 4, Device device = Device::cpu()) {
  StaticEnabled on;
  std::shared_ptr<M> eager = make(), traced = make();
  Opt opt_e(eager->parameters()), opt_s(traced->parameters());
  const auto step = lm_train_step;
  auto fn =
      static_graph([&](const Tensor& x, const Tensor& t) { return step(*traced, opt_s, x, t); },
                   {.name = "lm_step", .verify_every = verify_every, .modules = {traced}});
  for (int i = 0; i < train_steps; ++i) {
    INFO("step " << i);
    auto [x, t] = sequence_tokens(batch, steps, static_cast<uint64_t>(i), device);
    const Tensor le = step(*eager, opt_e, x, t);
    const Tensor ls = fn(x, t);
    CHECK(bit_diff(le, ls) == "");
    check_same_parameters(*eager, *traced, "after the step");
  }
  const StaticStats st = fn.stats();
  CHECK(st.traces == 1);
  CHECK(st.hits == train_steps - 1);
  if (verify_every > 0) CHECK(st.verifications == train_steps - 1);
  return st;
}

}  // namespace encore::testing
