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
#include <vector>

#include "encore/nn.h"

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

}  // namespace encore::models
