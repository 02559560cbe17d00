// Padded layouts: a cpu plan lays a convolution's output out padded where only stride-1
// convolutions (the next layer's forward and weight gradient) read it, and still gives eager's
// bits: whole training steps of the seed CNN, VGG-small and chains of grouped, dilated and
// odd-sized convolutions, in float32 and float64, at one and two threads (two lanes), with the
// switch off, in verify mode and with red zones. A buffer some other step reads, or that two
// readers would pad differently, stays dense; the dump shows which buffers are padded.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/static_models.h"
#include "tests/static_scenarios.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

using StaticPadded = SwitchScope<set_static_padded_layouts_enabled>;

// For a test's scope: static graphs on, padded layouts on or off, red zones as given (off: two
// threads replay on two lanes), `threads` threads.
struct PaddedSettings {
  PaddedSettings(bool padded_on, int threads, bool redzones = false)
      : padded(padded_on), redzones_scope(redzones), threads_scope(threads) {}
  StaticEnabled on;
  StaticPadded padded;
  StaticRedzones redzones_scope;
  ThreadCount threads_scope;
};

auto sgd = [](nn::Module& m) { return optim::SGD(m.parameters(), {.lr = 0.05}); };

// One convolution of a chain: output channels, kernel, options (the dtype is the chain's).
struct ConvSpec {
  int64_t out;
  int kernel;
  nn::Conv2dOptions options = {.padding = 1};
};

// What else reads the first convolution's output: nothing, a relu, or a 5x5 convolution padded
// by 2 (the chain's second convolution pads by 1); the mean of what it computes joins the logits.
enum class Tap { None, Relu, Conv };

// Convolutions one after the other, a relu, then a linear layer to 10 classes.
class ConvChain : public nn::Module {
 public:
  ConvChain(int64_t channels, int64_t h, int64_t w, std::vector<ConvSpec> specs, DType dtype,
            Tap tap = Tap::None)
      : tap_(tap) {
    for (size_t i = 0; i < specs.size(); ++i) {
      ConvSpec& s = specs[i];
      s.options.dtype = dtype;
      convs_.push_back(register_module(
          cat("conv", i), std::make_shared<nn::Conv2d>(channels, s.out, s.kernel, s.options)));
      const auto& o = s.options;
      h = (h + 2 * o.padding.h - o.dilation.h * (s.kernel - 1) - 1) / o.stride.h + 1;
      w = (w + 2 * o.padding.w - o.dilation.w * (s.kernel - 1) - 1) / o.stride.w + 1;
      channels = s.out;
      if (i == 0 && tap == Tap::Conv)
        side_ = register_module(
            "side", std::make_shared<nn::Conv2d>(channels, 2, 5,
                                                 nn::Conv2dOptions{.padding = 2, .dtype = dtype}));
    }
    head_ = register_module("head", std::make_shared<nn::Linear>(
                                        channels * h * w, 10, nn::LinearOptions{.dtype = dtype}));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x, first;
    for (size_t i = 0; i < convs_.size(); ++i) {
      h = (*convs_[i])(h);
      if (i == 0) first = h;
    }
    Tensor logits = (*head_)(F::flatten(F::relu(h), 1));
    if (tap_ == Tap::Relu) return logits + F::mean(F::relu(first));
    if (tap_ == Tap::Conv) return logits + F::mean((*side_)(first));
    return logits;
  }

 private:
  Tap tap_;
  std::shared_ptr<nn::Conv2d> side_;
  std::vector<std::shared_ptr<nn::Conv2d>> convs_;
  std::shared_ptr<nn::Linear> head_;
};

std::vector<Batch> batches_of(int count, const Shape& image, DType dtype, uint64_t seed) {
  manual_seed(seed);
  std::vector<Batch> out;
  for (int i = 0; i < count; ++i) {
    out.push_back({randn(image, dtype), cyclic_labels(image[0], 3 + i, 10, Device::cpu())});
  }
  return out;
}

// The dump of an SGD training step of `model` static against `eager` (verify mode every
// `verify_every` replays), checked by check_whole_steps.
std::string check_sgd_steps(std::shared_ptr<nn::Module> eager, std::shared_ptr<nn::Module> model,
                            const std::vector<Batch>& batches, int verify_every = 0) {
  return check_whole_steps(eager, model, batches, sgd,
                           {.name = "padded_step", .verify_every = verify_every})
      .schedule;
}

// A chain trained eagerly and static with the same seed: the static step's dump.
std::string check_chain(int64_t channels, const Shape& image, const std::vector<ConvSpec>& specs,
                        DType dtype, Tap tap = Tap::None, int verify_every = 0) {
  auto make = [&] {
    return std::make_shared<ConvChain>(channels, image[2], image[3], specs, dtype, tap);
  };
  auto eager = seeded(21, Device::cpu(), make);
  auto model = seeded(21, Device::cpu(), make);
  return check_sgd_steps(eager, model, batches_of(4, image, dtype, 9), verify_every);
}

int occurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The buffers of a dump's operand lines that are marked padded ("b12 ... padded 1,1 (..)").
int padded_buffers(const std::string& text) {
  std::vector<std::string> seen;
  size_t line = 0;
  while (line < text.size()) {
    size_t end = text.find('\n', line);
    if (end == std::string::npos) end = text.size();
    const std::string l = text.substr(line, end - line);
    const size_t b = l.find(" b");
    if (l.find(", padded ") != std::string::npos && b != std::string::npos) {
      const std::string id = l.substr(b + 1, l.find(' ', b + 1) - b - 1);
      if (std::find(seen.begin(), seen.end(), id) == seen.end()) seen.push_back(id);
    }
    line = end + 1;
  }
  return static_cast<int>(seen.size());
}

}  // namespace

TEST_CASE("padded layouts: the seed CNN's whole step gives eager's bits at one and two threads",
          "[static][padded]") {
  for (const int threads : {1, 2})
    for (const bool padded : {true, false}) {
      INFO("threads " << threads << ", padded layouts " << padded);
      const PaddedSettings settings(padded, threads);
      auto eager = seeded(3, Device::cpu(), [] { return std::make_shared<models::SeedCnn>(); });
      auto model = seeded(3, Device::cpu(), [] { return std::make_shared<models::SeedCnn>(); });
      const std::string text =
          check_sgd_steps(eager, model, batches_of(4, {16, 1, 28, 28}, DType::Float32, 8));
      INFO(text);
      // c1's and c2's outputs (each read by the next convolution and its weight gradient); c3's
      // goes to a relu.
      CHECK(padded_buffers(text) == (padded ? 2 : 0));
      if (padded) CHECK_THAT(text, Contains("padded 1,1 (30x30 planes)"));
      if (threads == 2) CHECK_THAT(text, Contains("two lanes"));
    }
}

TEST_CASE("padded layouts: seed-CNN-shaped chains in float64 and float32 give eager's bits",
          "[static][padded]") {
  const std::vector<ConvSpec> specs = {{6, 3}, {6, 3}, {6, 3}};
  for (const DType dtype : {DType::Float64, DType::Float32})
    for (const int threads : {1, 2})
      for (const bool padded : {true, false}) {
        INFO(name(dtype) << ", threads " << threads << ", padded layouts " << padded);
        const PaddedSettings settings(padded, threads);
        const std::string text = check_chain(1, {8, 1, 12, 12}, specs, dtype);
        INFO(text);
        CHECK(padded_buffers(text) == (padded ? 2 : 0));
        CHECK((occurrences(text, "padded 1,1 (14x14 planes)") > 0) == padded);
      }
}

TEST_CASE("padded layouts: VGG-small's whole step gives eager's bits", "[static][padded]") {
  for (const int threads : {1, 2}) {
    INFO("threads " << threads);
    const PaddedSettings settings(true, threads);
    auto make = [] { return std::make_shared<models::VggSmall>(3, std::vector<int64_t>{8, 16}); };
    auto eager = seeded(5, Device::cpu(), make);
    auto model = seeded(5, Device::cpu(), make);
    const std::string text =
        check_sgd_steps(eager, model, batches_of(3, {4, 3, 16, 16}, DType::Float32, 2));
    INFO(text);
    // A relu reads every convolution's output: nothing is padded.
    CHECK(padded_buffers(text) == 0);
  }
}

TEST_CASE("padded layouts: verify mode and red zones pass", "[static][padded]") {
  const std::vector<ConvSpec> specs = {{4, 3}, {5, 3}, {4, 3}};
  for (const DType dtype : {DType::Float32, DType::Float64}) {
    INFO(name(dtype));
    {
      const PaddedSettings settings(true, 1);
      const std::string text = check_chain(2, {5, 2, 9, 9}, specs, dtype, Tap::None, 1);
      INFO(text);
      CHECK_THAT(text, Contains("red zones"));  // verify mode has them
      CHECK(padded_buffers(text) == 2);
    }
    {
      const PaddedSettings settings(true, 1, /*redzones=*/true);
      const std::string text = check_chain(2, {5, 2, 9, 9}, specs, dtype);
      INFO(text);
      CHECK_THAT(text, Contains("red zones"));
      CHECK(padded_buffers(text) == 2);
    }
  }
}

TEST_CASE("padded layouts: grouped, dilated, odd-sized and padding-2 convolutions",
          "[static][padded]") {
  const nn::Conv2dOptions pad2{.padding = 2};
  const nn::Conv2dOptions dilated{.padding = 2, .dilation = 2};
  const nn::Conv2dOptions grouped{.padding = 1, .groups = 2};
  const nn::Conv2dOptions wide{.padding = {1, 2}};
  for (const int threads : {1, 2}) {
    INFO("threads " << threads);
    const PaddedSettings settings(true, threads);
    {
      // 13x11 images; the second convolution pads by 2 (a 5x5 kernel), the third is dilated.
      const std::string text =
          check_chain(2, {6, 2, 13, 11}, {{4, 3}, {4, 5, pad2}, {3, 3, dilated}}, DType::Float32);
      INFO(text);
      CHECK_THAT(text, Contains("padded 2,2 (17x15 planes)"));
      CHECK(padded_buffers(text) == 2);
    }
    {
      // Grouped convolutions, a 3x5 kernel padded 1,2, odd sizes, float64.
      const std::string text = check_chain(
          2, {5, 2, 7, 9}, {{4, 3, grouped}, {6, 3, grouped}, {4, 3}, {2, 3}}, DType::Float64);
      INFO(text);
      CHECK(padded_buffers(text) == 3);
      // A 3x3 kernel padded 1 and 2 (rows and columns of different pads).
      const std::string wide_text =
          check_chain(3, {3, 3, 11, 7}, {{4, 3}, {4, 3, wide}, {3, 3}}, DType::Float64);
      INFO(wide_text);
      CHECK_THAT(wide_text, Contains("padded 1,2 (13x11 planes)"));
      CHECK(padded_buffers(wide_text) == 2);
    }
  }
}

TEST_CASE(
    "padded layouts: a buffer another step reads, or readers padding it differently, "
    "stays dense",
    "[static][padded]") {
  const PaddedSettings settings(true, 1);
  {
    // The first convolution's output also goes to a relu: only the second one's is padded.
    const std::string text =
        check_chain(2, {4, 2, 10, 10}, {{4, 3}, {4, 3}, {4, 3}}, DType::Float32, Tap::Relu);
    INFO(text);
    CHECK(padded_buffers(text) == 1);
  }
  {
    // A convolution padded by 2 reads it beside the second one, padded by 1: one layout cannot
    // serve both.
    const std::string text =
        check_chain(2, {4, 2, 10, 10}, {{4, 3}, {4, 3}, {4, 3}}, DType::Float32, Tap::Conv);
    INFO(text);
    CHECK(padded_buffers(text) == 1);
  }
  {
    // A stride-2 reader (im2col) and a 1x1 unpadded one (a plain product) read their input as it
    // is: nothing before them is padded.
    const nn::Conv2dOptions stride2{.stride = 2, .padding = 1};
    const nn::Conv2dOptions pointwise{.padding = 0};
    const std::string text = check_chain(
        2, {4, 2, 10, 10}, {{4, 3}, {4, 3, stride2}, {4, 1, pointwise}}, DType::Float32);
    INFO(text);
    CHECK(padded_buffers(text) == 0);
  }
}

TEST_CASE("padded layouts: an eval forward folds each relu into its convolution and pads its output",
          "[static][padded][fold]") {
  // Without a backward nothing reads a relu's output but the next convolution, so the plan makes
  // each convolution and its relu one step (rewrites.cc) and lays that step's output out padded
  // for the next convolution: both at once.
  for (const int threads : {1, 2})
    for (const bool padded : {true, false}) {
      INFO("threads " << threads << ", padded layouts " << padded);
      const PaddedSettings settings(padded, threads);
      const StaticFoldActivations fold(true);
      auto make = [] { return std::make_shared<models::VggSmall>(3, std::vector<int64_t>{8, 16}); };
      auto eager = seeded(6, Device::cpu(), make);
      auto model = seeded(6, Device::cpu(), make);
      eager->eval();
      model->eval();
      NoGradGuard no_grad;
      auto f = static_graph([&](const Tensor& x) { return (*model)(x); },
                            {.name = "vgg_eval", .verify_every = 2, .modules = {model}});
      for (const Batch& b : batches_of(5, {4, 3, 16, 16}, DType::Float32, 4))
        CHECK(bit_diff((*eager)(b.x), f(b.x)) == "");
      const std::string text = f.schedule_text();
      INFO(text);
      CHECK(f.stats().verifications > 0);
      // The first convolution of each block and its relu are one step whose output feeds the
      // second (whose relu runs after the block's max pooling instead).
      CHECK(occurrences(text, "conv2d and relu in one") == 2);
      CHECK(occurrences(text, "max_pool2d before relu") == 2);
      CHECK(padded_buffers(text) == (padded ? 2 : 0));
    }
}
