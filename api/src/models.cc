#include "encore/models.h"

#include "api/src/routine.h"

namespace encore::models {

SeedCnn::SeedCnn(int64_t channels) {
  ENCORE_CHECK(channels > 0, "SeedCnn: channels must be positive, got ", channels);
  const nn::Conv2dOptions same{.padding = 1};
  c1 = register_module("c1", std::make_shared<nn::Conv2d>(1, channels, 3, same));
  c2 = register_module("c2", std::make_shared<nn::Conv2d>(channels, channels, 3, same));
  c3 = register_module("c3", std::make_shared<nn::Conv2d>(channels, channels, 3, same));
  l1 = register_module("l1", std::make_shared<nn::Linear>(14 * 14 * channels, 10));
}

Tensor SeedCnn::forward(const Tensor& x) {
  detail::check_defined("SeedCnn", "x", x);
  ENCORE_CHECK(x.numel() % 784 == 0 && x.rank() >= 2 && x.size(0) * 784 == x.numel(),
               "SeedCnn: x must hold 28x28 images as [N,784] or [N,1,28,28], it is ", x.shape());
  Tensor h = F::reshape(x, {x.size(0), 1, 28, 28});
  h = (*c3)((*c2)((*c1)(h)));
  h = F::max_pool2d(F::relu(h), 2);
  return (*l1)(F::flatten(h, 1));
}

std::string SeedCnn::describe() const {
  return cat("SeedCnn(3 x conv3x3 ", c1->weight.size(0), " ch, relu, maxpool 2, ", l1->describe(),
             ")");
}

VggSmall::VggSmall(int64_t in_channels, std::vector<int64_t> widths, int64_t classes) {
  ENCORE_CHECK(!widths.empty(), "VggSmall: needs at least one block");
  const nn::Conv2dOptions same{.padding = 1};
  int64_t c = in_channels;
  for (size_t b = 0; b < widths.size(); ++b) {
    for (int k = 0; k < 2; ++k) {
      convs_.push_back(register_module(cat("conv", b + 1, "_", k + 1),
                                       std::make_shared<nn::Conv2d>(c, widths[b], 3, same)));
      c = widths[b];
    }
  }
  head_ = register_module("head", std::make_shared<nn::Linear>(c, classes));
}

Tensor VggSmall::forward(const Tensor& x) {
  Tensor h = x;
  for (size_t i = 0; i < convs_.size(); ++i) {
    h = F::relu((*convs_[i])(h));
    if (i % 2 == 1) h = F::max_pool2d(h, 2);
  }
  return (*head_)(F::global_avg_pool2d(h));
}

std::string VggSmall::describe() const {
  std::string s = "VggSmall(";
  for (size_t i = 0; i < convs_.size(); i += 2)
    s += cat(i ? ", " : "", "2 x conv3x3 ", convs_[i]->weight.size(0));
  return s + ", global avg pool, " + head_->describe() + ")";
}

}  // namespace encore::models
