// The sequence models on cuda:0: whole training steps of CharLstm (Adam) and TinyGpt (AdamW)
// replayed by a static function equal eager on the device bit for bit, with CUDA graphs and
// without, and the device's losses follow the cpu's.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>

#include "encore/encore.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/sequence_training.h"

using namespace encore;
using namespace encore::testing;

namespace {

constexpr int kTrainSteps = 4;

// With graphs on every replay launched graphs and none fell back; with graphs off none did.
void check_replays(const StaticStats& st, bool graphs) {
  REQUIRE(st.cache.size() == 1);
  const EntryReport& e = st.cache[0];
  INFO("entry " << e.signature << ": " << e.graph_text());
  if (graphs) {
    CHECK(e.graph_fallback == "");
    CHECK(e.stream_replays == 0);
    CHECK(e.graph_launches >= kTrainSteps - 1);
  } else {
    CHECK(e.graph_launches == 0);
    CHECK(e.stream_replays >= kTrainSteps - 1);
  }
}

// One eager training step's loss on `device` from the same seed and batch.
template <typename M, typename Opt, typename Make>
float first_loss(Make make, Device device) {
  std::shared_ptr<M> m = make(device);
  Opt opt(m->parameters());
  auto [x, t] = sequence_tokens(3, 9, 0, device);
  const Tensor loss = lm_train_step(*m, opt, x, t);
  return loss.item<float>();
}

}  // namespace

TEST_CASE("CharLstm trained by a static step on cuda equals eager bit for bit",
          "[cuda][static][models]") {
  with_graphs_on_and_off([](bool graphs) {
    const StaticStats st = check_static_training<models::CharLstm, optim::Adam>(
        [] { return seeded_on<models::CharLstm>(kCuda, kSequenceVocab, 8, 16); }, 4, 7, 0,
        kTrainSteps, kCuda);
    check_replays(st, graphs);
  });
}

TEST_CASE("TinyGpt trained by a static step on cuda equals eager bit for bit",
          "[cuda][static][models]") {
  with_graphs_on_and_off([](bool graphs) {
    const StaticStats st = check_static_training<models::TinyGpt, optim::AdamW>(
        [] { return seeded_on<models::TinyGpt>(kCuda, kSequenceVocab, 16, 32, 4, 2); }, 3, 16, 0,
        kTrainSteps, kCuda);
    check_replays(st, graphs);
  });
}

TEST_CASE("the sequence models' losses on cuda follow the cpu's", "[cuda][models]") {
  const auto lstm = [](Device d) { return seeded_on<models::CharLstm>(d, kSequenceVocab, 8, 16); };
  const auto gpt = [](Device d) {
    return seeded_on<models::TinyGpt>(d, kSequenceVocab, 16, 32, 4, 2);
  };
  const float lstm_cpu = first_loss<models::CharLstm, optim::Adam>(lstm, Device::cpu());
  const float lstm_cuda = first_loss<models::CharLstm, optim::Adam>(lstm, kCuda);
  const float gpt_cpu = first_loss<models::TinyGpt, optim::AdamW>(gpt, Device::cpu());
  const float gpt_cuda = first_loss<models::TinyGpt, optim::AdamW>(gpt, kCuda);
  CHECK(std::isfinite(lstm_cuda));
  CHECK(lstm_cuda == Approx(lstm_cpu).epsilon(1e-5));
  CHECK(std::isfinite(gpt_cuda));
  CHECK(gpt_cuda == Approx(gpt_cpu).epsilon(1e-5));
}
