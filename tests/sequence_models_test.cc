// models::CharLstm and models::TinyGpt: shapes, state carried across calls, causality, errors,
// and whole training steps (Adam, AdamW) replayed by a static function equal to eager bit for bit,
// at one and two threads and in verify mode.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "encore/encore.h"
#include "tests/sequence_training.h"
#include "tests/test_util.h"

using namespace encore;
using Catch::Matchers::Contains;
using testing::bit_diff;
using testing::check_static_training;
using testing::error_of;
using testing::StaticEnabled;
using testing::ThreadCount;

namespace {

constexpr int64_t kVocab = testing::kSequenceVocab;

std::pair<Tensor, Tensor> tokens(int64_t batch, int64_t steps, uint64_t seed) {
  return testing::sequence_tokens(batch, steps, seed);
}

template <typename M, typename... A>
std::shared_ptr<M> seeded(A... args) {
  return testing::seeded_on<M>(Device::cpu(), args...);
}

// A CharLstm whose forward (tokens, h0, c0) -> (logits, h, c) is static.
struct StaticCharLstm : models::CharLstm {
  using CharLstm::CharLstm;
  ENCORE_STATIC_GRAPH({.name = "char_lstm"});
};

}  // namespace

TEST_CASE("CharLstm maps tokens to next-token logits and carries its state", "[models][lstm]") {
  auto m = seeded<models::CharLstm>(kVocab, 8, 12, 2);
  auto [x, t] = tokens(3, 6, 1);
  const Tensor logits = (*m)(x);
  CHECK(logits.shape() == Shape({3, 6, kVocab}));
  // Feeding the same tokens one at a time with the returned state gives the same logits.
  Tensor h, c, step_logits;
  for (int64_t i = 0; i < 6; ++i) {
    std::tie(step_logits, h, c) = m->forward(F::slice(x, 1, i, i + 1), h, c);
    CHECK(h.shape() == Shape({2, 3, 12}));
    const auto want = F::slice(logits, 1, i, i + 1).to_vector<float>();
    const auto got = step_logits.to_vector<float>();
    for (size_t k = 0; k < want.size(); ++k) CHECK(got[k] == Approx(want[k]).margin(1e-5));
  }
  CHECK_THAT(error_of([&] { (*m)(zeros({3})); }), Contains("CharLstm: tokens must be [B,T]"));
}

TEST_CASE("TinyGpt is causal: a later token never changes earlier logits", "[models][gpt]") {
  auto m = seeded<models::TinyGpt>(kVocab, 16, 32, 4, 2);
  auto [x, t] = tokens(2, 10, 3);
  const Tensor before = (*m)(x);
  CHECK(before.shape() == Shape({2, 10, kVocab}));
  x.data<int64_t>()[7] = (x.data<int64_t>()[7] + 1) % kVocab;  // row 0, position 7
  const Tensor after = (*m)(x);
  CHECK(bit_diff(F::slice(before, 1, 0, 7), F::slice(after, 1, 0, 7)) == "");
  CHECK(bit_diff(F::slice(before, 1, 7, 8), F::slice(after, 1, 7, 8)) != "");
  CHECK(m->named_parameters().size() == 2 + 2 * 12 + 2 + 2);
  CHECK_THAT(error_of([&] { (*m)(zeros({1, 17}, DType::Int64)); }),
             Contains("TinyGpt: tokens [B,T] need 1 <= T <= context 16"));
}

TEST_CASE("CharLstm trained by a static step (Adam) equals eager bit for bit", "[models][lstm][static]") {
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    ThreadCount tc(threads);
    check_static_training<models::CharLstm, optim::Adam>(
        [] { return seeded<models::CharLstm>(kVocab, 8, 16); }, 4, 7, 0);
  }
}

TEST_CASE("TinyGpt trained by a static step (AdamW) equals eager bit for bit", "[models][gpt][static]") {
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    ThreadCount tc(threads);
    check_static_training<models::TinyGpt, optim::AdamW>(
        [] { return seeded<models::TinyGpt>(kVocab, 16, 32, 4, 2); }, 3, 16, 0);
  }
}

TEST_CASE("TinyGpt trained over varying lengths: one dynamic family serves them all",
          "[models][gpt][static]") {
  // The causal mask is made from arange at each length: two traces make the length dynamic, and
  // every later length is planned from them, mask included, with eager's bits.
  StaticEnabled on;
  auto make = [] { return seeded<models::TinyGpt>(kVocab, 16, 16, 2, 1); };
  std::shared_ptr<models::TinyGpt> eager = make(), traced = make();
  optim::AdamW opt_e(eager->parameters()), opt_s(traced->parameters());
  auto fn =
      static_graph([&](const Tensor& x,
                       const Tensor& t) { return testing::lm_train_step(*traced, opt_s, x, t); },
                   {.name = "gpt_step", .modules = {traced}});
  const int64_t lengths[] = {6, 7, 9, 5, 12, 7, 16, 1, 9};
  for (size_t i = 0; i < std::size(lengths); ++i) {
    INFO("step " << i << ", length " << lengths[i]);
    auto [x, t] = tokens(3, lengths[i], i);
    const Tensor le = testing::lm_train_step(*eager, opt_e, x, t);
    CHECK(bit_diff(le, fn(x, t)) == "");
    testing::check_same_parameters(*eager, *traced, "after the step");
  }
  const StaticStats st = fn.stats();
  CHECK(st.static_dims.empty());
  REQUIRE(st.dynamic.size() == 1);
  // 6 and 7 trace; a length of 1 traces once of its own (a broadcast needs no op there).
  CHECK(st.traces == 3);
  // 9, 5, 12 and 16; then 9 again, from the family the trace at 1 extended.
  CHECK(st.sizes_planned == 5);
}

TEST_CASE("the sequence models' static steps pass verify mode", "[models][static]") {
  check_static_training<models::CharLstm, optim::Adam>(
      [] { return seeded<models::CharLstm>(kVocab, 8, 16); }, 2, 5, 1, 3);
  check_static_training<models::TinyGpt, optim::AdamW>(
      [] { return seeded<models::TinyGpt>(kVocab, 8, 16, 2, 1); }, 2, 8, 1, 3);
}

TEST_CASE("a static CharLstm forward with a state in and out (module form)", "[models][lstm][static]") {
  StaticEnabled on;
  manual_seed(3);
  auto eager = std::make_shared<models::CharLstm>(kVocab, 8, 12);
  manual_seed(3);
  auto traced = std::make_shared<StaticCharLstm>(kVocab, 8, 12);
  NoGradGuard no_grad;
  Tensor he = zeros({1, 2, 12}), ce = zeros({1, 2, 12}), hs = he, cs = ce, le, ls;
  for (int i = 0; i < 6; ++i) {
    const Tensor x = tokens(2, 1, static_cast<uint64_t>(i)).first;
    std::tie(le, he, ce) = eager->forward(x, he, ce);
    std::tie(ls, hs, cs) = (*traced)(x, hs, cs);
    CHECK(bit_diff(le, ls) == "");
    CHECK(bit_diff(he, hs) == "");
    CHECK(bit_diff(ce, cs) == "");
  }
  CHECK(static_stats(*traced).traces == 1);
  CHECK(static_stats(*traced).hits == 5);
}
