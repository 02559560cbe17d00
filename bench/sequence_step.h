// The training steps timed by CharLstm/*, TinyGpt/* and LstmCellChain/*: each model, its
// optimizer and its fixed data, made from seed 0 at construction; a step as a plain call and as
// one static function over the data. On a CUDA device (the /cuda cases) model and data are made
// on the host as for the CPU, then moved, so both devices train the same weights on the same data.
#pragma once

#include <cstdint>
#include <memory>
#include <tuple>

#include "encore/encore.h"
#include "encore/static_graph.h"

namespace encore::bench {

// CharLstm: vocabulary 96, embedding 64, LSTM 256, batch 32, 35 time steps, Adam.
// TinyGpt: vocabulary 96, 2 blocks, width 128, 4 heads, context 64, batch 16, AdamW.
inline constexpr int64_t kCharVocab = 96;
inline constexpr int64_t kCharLstmBatch = 32, kCharLstmSteps = 35, kCharLstmEmbed = 64,
                         kCharLstmHidden = 256;
inline constexpr int64_t kTinyGptBatch = 16, kTinyGptContext = 64, kTinyGptWidth = 128,
                         kTinyGptHeads = 4, kTinyGptBlocks = 2;
// LstmCellChain: one LSTMCell (input and hidden 64) stepped 35 times at batch 1.
inline constexpr int64_t kChainHidden = 64, kChainSteps = 35;

// Token ids (i * 31 + 7) % vocab as [batch, steps] int64, and their next ids as targets.
inline std::pair<Tensor, Tensor> token_batch(int64_t batch, int64_t steps) {
  Tensor x = Tensor::empty({batch, steps}, DType::Int64),
         t = Tensor::empty({batch, steps}, DType::Int64);
  for (int64_t i = 0; i < batch * steps; ++i) {
    x.data<int64_t>()[i] = (i * 31 + 7) % kCharVocab;
    t.data<int64_t>()[i] = ((i + 1) * 31 + 7) % kCharVocab;
  }
  return {x, t};
}

// A language model's training step: forward, cross entropy over [B,T,V], zero_grad, backward,
// update.
template <typename Model, typename Opt>
class LanguageModelStep {
 public:
  template <typename... ModelArgs>
  LanguageModelStep(Device device, int64_t batch, int64_t steps, ModelArgs... args)
      : model_(seeded<Model>(device, args...)), opt_(model_->parameters()) {
    std::tie(x_, t_) = token_batch(batch, steps);
    x_ = x_.to(device);
    t_ = t_.to(device);
  }
  Tensor operator()(const Tensor& x, const Tensor& t) {
    Tensor loss = F::cross_entropy((*model_)(x), t);
    model_->zero_grad();
    loss.backward();
    opt_.step();
    return loss;
  }
  Tensor run() { return (*this)(x_, t_); }
  auto make_static() {
    return static_graph([this](const Tensor& x, const Tensor& t) { return (*this)(x, t); },
                        {.name = "lm_step", .arg_names = {"x", "t"}, .modules = {model_}});
  }
  // One call of a static function from make_static() on the fixed data.
  template <typename Static>
  void replay(Static& fn) {
    fn(x_, t_);
  }

 private:
  template <typename M, typename... A>
  static std::shared_ptr<M> seeded(Device device, A... args) {
    manual_seed(0);
    auto model = std::make_shared<M>(args...);
    if (device != Device::cpu()) model->to(device);
    return model;
  }
  std::shared_ptr<Model> model_;
  Opt opt_;
  Tensor x_, t_;
};

using CharLstmStep = LanguageModelStep<models::CharLstm, optim::Adam>;
using TinyGptStep = LanguageModelStep<models::TinyGpt, optim::AdamW>;

inline std::unique_ptr<CharLstmStep> make_char_lstm_step(Device device = Device::cpu()) {
  return std::make_unique<CharLstmStep>(device, kCharLstmBatch, kCharLstmSteps, kCharVocab,
                                        kCharLstmEmbed, kCharLstmHidden);
}
inline std::unique_ptr<TinyGptStep> make_tiny_gpt_step(Device device = Device::cpu()) {
  return std::make_unique<TinyGptStep>(device, kTinyGptBatch, kTinyGptContext, kCharVocab,
                                       kTinyGptContext, kTinyGptWidth, kTinyGptHeads,
                                       kTinyGptBlocks);
}

// LstmCellChain: forward through 35 steps of one cell from a zero state, the sum of the last h
// as the loss, backward (gradients of the cell's parameters; no update).
class CellChain {
 public:
  explicit CellChain(Device device = Device::cpu()) : cell_(seeded(device)) {
    for (int64_t t = 0; t < kChainSteps; ++t) xs_.push_back(randn({1, kChainHidden}).to(device));
    h0_ = zeros({1, kChainHidden}).to(device);
    c0_ = zeros({1, kChainHidden}).to(device);
  }
  Tensor operator()(std::span<const Tensor> xs, const Tensor& h0, const Tensor& c0) {
    Tensor h = h0, c = c0;
    for (const Tensor& x : xs) std::tie(h, c) = (*cell_)(x, h, c);
    Tensor loss = F::sum(h);
    cell_->zero_grad();
    loss.backward();
    return loss;
  }
  Tensor run() { return (*this)(xs_, h0_, c0_); }
  // Static over (h0, c0); the inputs are bound tensors of the closure.
  auto make_static() {
    return static_graph([this](const Tensor& h0, const Tensor& c0) { return (*this)(xs_, h0, c0); },
                        {.name = "cell_chain", .arg_names = {"h0", "c0"}, .modules = {cell_}});
  }
  // One call of a static function from make_static() on the zero state.
  template <typename Static>
  void replay(Static& fn) {
    fn(h0_, c0_);
  }

 private:
  static std::shared_ptr<nn::LSTMCell> seeded(Device device) {
    manual_seed(0);
    auto cell = std::make_shared<nn::LSTMCell>(kChainHidden, kChainHidden);
    if (device != Device::cpu()) cell->to(device);
    return cell;
  }
  std::shared_ptr<nn::LSTMCell> cell_;
  std::vector<Tensor> xs_;
  Tensor h0_, c0_;
};

inline std::unique_ptr<CellChain> make_cell_chain(Device device = Device::cpu()) {
  return std::make_unique<CellChain>(device);
}

}  // namespace encore::bench
