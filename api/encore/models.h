// Small reference models used by the samples, the benchmarks and the tests.
//
//   auto net = std::make_shared<models::SeedCnn>();
//   Tensor logits = (*net)(x);   // x [N,784] or [N,1,28,28] -> [N,10]
//
// To make one static, derive and add the one line:
//
//   struct StaticSeedCnn : models::SeedCnn {
//     ENCORE_STATIC_GRAPH({.name = "seed_cnn"});
//   };
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "encore/nn.h"
#include "encore/nn_sequence.h"

namespace encore::models {

// Chainer's MNISTCONV from its static-subgraph example (the "seed CNN"): three 3x3 convolutions
// with `channels` channels and padding 1, ReLU after the third, 2x2 max pooling and a linear
// layer to 10 classes. Takes 28x28 single-channel images as [N,784] or [N,1,28,28].
class SeedCnn : public nn::Module {
 public:
  explicit SeedCnn(int64_t channels = 8);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

  std::shared_ptr<nn::Conv2d> c1, c2, c3;
  std::shared_ptr<nn::Linear> l1;
};

// A small VGG-style network for images of any height and width: blocks of 3x3 convolutions
// (padding 1) with ReLU, each block followed by 2x2 max pooling, then global average pooling
// and a linear layer. `widths` gives the channels of each block's two convolutions.
class VggSmall : public nn::Module {
 public:
  explicit VggSmall(int64_t in_channels = 3, std::vector<int64_t> widths = {8, 16, 32},
                    int64_t classes = 10);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 private:
  std::vector<std::shared_ptr<nn::Conv2d>> convs_;
  std::shared_ptr<nn::Linear> head_;
};

// A character language model: an embedding of `embed` per symbol, an LSTM of `hidden` units
// (`layers` deep) stepping through time, and a linear layer to next-symbol logits.
// tokens [B, T] (int32/int64 in [0, vocab)) -> logits [B, T, vocab].
class CharLstm : public nn::Module {
 public:
  explicit CharLstm(int64_t vocab, int64_t embed = 64, int64_t hidden = 256, int64_t layers = 1);
  Tensor forward(const Tensor& tokens) override;
  // From a state h0, c0 [layers, B, hidden] (undefined: zeros): (logits, h_n, c_n). Generating
  // text feeds one symbol at a time with the state of the previous call.
  std::tuple<Tensor, Tensor, Tensor> forward(const Tensor& tokens, const Tensor& h0,
                                             const Tensor& c0);
  std::string describe() const override;

  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::LSTM> lstm;
  std::shared_ptr<nn::Linear> head;
};

// A small GPT: token and learned position embeddings, `blocks` pre-norm transformer blocks
// (causal self-attention with `heads` heads, a GELU MLP of 4 x width), a final layer norm and a
// linear layer to logits. tokens [B, T] with T <= context -> logits [B, T, vocab].
class TinyGpt : public nn::Module {
 public:
  explicit TinyGpt(int64_t vocab, int64_t context = 64, int64_t width = 128, int64_t heads = 4,
                   int64_t blocks = 2);
  Tensor forward(const Tensor& tokens) override;
  std::string describe() const override;
  int64_t context() const { return position->weight.size(0); }

  std::shared_ptr<nn::Embedding> token, position;
  std::vector<std::shared_ptr<nn::TransformerBlock>> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> head;
};

}  // namespace encore::models
