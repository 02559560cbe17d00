// DataParallel between two ranks: each rank trains on its half of every batch; after the steps
// both ranks hold the same parameters bit for bit, and the parameters of one process that sums
// the two half-batch gradients (then halves them) in the same order; the static whole step gives
// eager's bits with the all-reduce steps in its schedule; tied and unused parameters are learned
// from the first backward; ranks that build different modules (parameters or buffers), or use a
// parameter differently, get an Error naming the parameter or buffer.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "encore/dist.h"
#include "encore/encore.h"
#include "encore/static_graph.h"

using namespace encore;
using Catch::Matchers::Contains;

namespace {

constexpr int kSteps = 6;
constexpr int64_t kBatch = 32;  // per step, both halves

struct Batch {
  Tensor x, t;
};

std::vector<Batch> batches() {
  const auto ds = data::synthetic_classification(kSteps * kBatch, 20, 10, /*seed=*/5);
  data::BatchIterator it(ds, kBatch, /*shuffle=*/false);
  std::vector<Batch> out;
  Batch b;
  while (it.next(b.x, b.t)) out.push_back(b);
  return out;
}

Batch half(const Batch& b, int which) {
  const int64_t h = kBatch / 2;
  return {F::slice(b.x, 0, which * h, (which + 1) * h),
          F::slice(b.t, 0, which * h, (which + 1) * h)};
}

std::shared_ptr<nn::Module> model(uint64_t seed) {
  manual_seed(seed);
  return nn::mlp(20, 64, 10);
}

// A parameter's bytes.
std::vector<unsigned char> bytes(const Tensor& t) {
  std::vector<unsigned char> out(t.nbytes());
  std::memcpy(out.data(), t.raw_data(), t.nbytes());
  return out;
}

// Whether every parameter equals rank 0's bit for bit.
bool equal_across_ranks(const nn::Module& m) {
  for (const Tensor& p : m.parameters()) {
    Tensor theirs = clone(p.detach());
    dist::broadcast(theirs, 0);
    if (bytes(theirs) != bytes(p)) return false;
  }
  return true;
}

void check_same_bits(const nn::Module& a, const nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(bytes(pa[i].second) == bytes(pb[i].second));
  }
}

// One process's reference: per step the gradients of the two halves, g0 + g1, times 0.5.
void train_reference(nn::Module& m, const std::vector<Batch>& data) {
  optim::SGD opt(m.parameters(), {.lr = 0.1});
  for (const Batch& b : data) {
    std::vector<Tensor> sums;
    for (int w = 0; w < 2; ++w) {
      opt.zero_grad();
      const Batch h = half(b, w);
      F::softmax_cross_entropy(m(h.x), h.t).backward();
      std::vector<Tensor> grads;
      for (const Tensor& p : m.parameters()) grads.push_back(p.grad());
      if (w == 0) {
        sums = grads;
      } else {
        for (size_t i = 0; i < sums.size(); ++i) sums[i] = F::add(sums[i], grads[i]);
      }
    }
    std::vector<Tensor> params = m.parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(F::mul(sums[i], 0.5));
    opt.step();
  }
}

}  // namespace

TEST_CASE("eager data-parallel steps equal one process summing the half-batch gradients",
          "[dist]") {
  const std::vector<Batch> data = batches();
  // Rank 1 starts from other parameters: DataParallel copies rank 0's.
  auto m = model(dist::rank() == 0 ? 1 : 2);
  dist::DataParallel ddp(*m, {.bucket_bytes = 4096});
  CHECK(ddp.buckets().size() > 1);
  CHECK(ddp.buckets().front().front() == "4.bias");  // the last parameter's gradient comes first
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  for (const Batch& b : data) {
    opt.zero_grad();
    const Batch h = half(b, dist::rank());
    F::softmax_cross_entropy((*m)(h.x), h.t).backward();
    opt.step();
  }
  CHECK(equal_across_ranks(*m));
  auto reference = model(1);
  train_reference(*reference, data);
  check_same_bits(*m, *reference);
}

TEST_CASE("a static data-parallel whole step equals eager, with the all-reduce in its schedule",
          "[dist]") {
  const std::vector<Batch> data = batches();
  auto eager = model(3), traced = model(3);
  dist::DataParallel ddp_eager(*eager, {.bucket_bytes = 4096}),
      ddp_traced(*traced, {.bucket_bytes = 4096});
  optim::SGD opt_eager(eager->parameters(), {.lr = 0.1}),
      opt_traced(traced->parameters(), {.lr = 0.1});
  const auto train = [](nn::Module& m, optim::Optimizer& opt, const Tensor& x, const Tensor& t) {
    opt.zero_grad();
    Tensor loss = F::softmax_cross_entropy(m(x), t);
    loss.backward();
    opt.step();
    return loss;
  };
  auto step = static_graph(
      [&](const Tensor& x, const Tensor& t) { return train(*traced, opt_traced, x, t); },
      {.name = "dp_step", .verify_every = 2, .modules = {traced}});
  for (const Batch& b : data) {
    const Batch h = half(b, dist::rank());
    train(*eager, opt_eager, h.x, h.t);
    step(h.x, h.t);
  }
  check_same_bits(*eager, *traced);
  CHECK(equal_across_ranks(*traced));
  // The first call is DataParallel's first backward, which learns the parameters' uses: its
  // trace is dropped and the second call traces the step as every later backward runs it.
  const StaticStats s = step.stats();
  CHECK(s.traces == 2);
  REQUIRE(s.traces_history.size() == 2);
  CHECK_THAT(s.traces_history[1].reason,
             Contains("one-time set-up") && Contains("DataParallel's first backward"));
  CHECK(s.hits == kSteps - 2);
  CHECK(s.verifications == (kSteps - 2) / 2);  // replays checked against eager, collectives too
  const std::string text = step.schedule_text();
  CHECK_THAT(text, Contains("all_reduce_start") && Contains("all_reduce_wait"));
}

namespace {

// An MLP whose forward alone is static: its backward runs through the subgraph's node, whose
// contributions reach the parameters' .grad through the engine (and their hooks) eagerly.
struct StaticForwardMlp : nn::Module {
  StaticForwardMlp() : net(register_module("net", nn::mlp(20, 64, 10))) {}
  Tensor forward(const Tensor& x) override { return (*net)(x); }
  std::shared_ptr<nn::Sequential> net;
  ENCORE_STATIC_GRAPH({.name = "dp_forward", .arg_names = {"x"}});
};

}  // namespace

TEST_CASE("data parallelism over a static forward equals eager", "[dist]") {
  const std::vector<Batch> data = batches();
  manual_seed(4);
  auto eager = nn::mlp(20, 64, 10);
  manual_seed(4);
  auto traced = std::make_shared<StaticForwardMlp>();
  dist::DataParallel ddp_eager(*eager, {.bucket_bytes = 4096}),
      ddp_traced(*traced, {.bucket_bytes = 4096});
  optim::SGD opt_eager(eager->parameters(), {.lr = 0.1}),
      opt_traced(traced->parameters(), {.lr = 0.1});
  for (const Batch& b : data) {
    const Batch h = half(b, dist::rank());
    for (auto [m, opt] : {std::pair<nn::Module*, optim::Optimizer*>{eager.get(), &opt_eager},
                          {traced.get(), &opt_traced}}) {
      opt->zero_grad();
      F::softmax_cross_entropy((*m)(h.x), h.t).backward();
      opt->step();
    }
  }
  check_same_bits(*eager, *traced);
  CHECK(equal_across_ranks(*traced));
  const StaticStats s = static_stats(*traced);
  CHECK(s.traces == 1);
  CHECK(s.hits == kSteps - 1);
}

TEST_CASE("ranks with different parameters get an Error naming the parameter", "[dist]") {
  manual_seed(0);
  auto m = nn::mlp(20, dist::rank() == 0 ? 64 : 65, 10);
  CHECK_THROWS_WITH(dist::DataParallel(*m), Contains("'0.weight'") && Contains("differs"));
  std::shared_ptr<nn::Module> fewer = nn::mlp(20, 8, 10);
  if (dist::rank() == 1) fewer = std::make_shared<nn::Linear>(20, 10);
  CHECK_THROWS_WITH(dist::DataParallel(*fewer), Contains("numbers of parameters"));
}

TEST_CASE("ranks with different buffers get an Error naming the buffer, and nothing is copied",
          "[dist]") {
  // The same parameters on both ranks; batch norms without affine parameters hold buffers only.
  const int r = dist::rank();
  auto build = [&](int64_t channels, DType dtype, bool norm) {
    manual_seed(1);
    auto m = std::make_shared<nn::Sequential>();
    m->add(std::make_shared<nn::Linear>(4, 4));
    if (norm)
      m->add(std::make_shared<nn::BatchNorm2d>(
          channels, nn::BatchNormOptions{.affine = false, .dtype = dtype}));
    for (auto& [name, slot] : m->named_buffer_slots()) {
      NoGradGuard no_grad;
      fill_(*slot, r + 2.0);  // each rank's own statistics
    }
    return m;
  };
  // Each rank's buffers keep their values after the Error: it comes before any copy.
  auto unchanged = [&](const nn::Module& m) {
    for (auto& [name, slot] : m.named_buffer_slots()) {
      INFO(name);
      CHECK(slot->to_vector<double>() == std::vector<double>(slot->numel(), r + 2.0));
    }
  };
  auto wider = build(r == 1 ? 8 : 4, DType::Float32, true);
  const std::string mine = r == 1 ? "Tensor[8]" : "Tensor[4]";
  CHECK_THROWS_WITH(dist::DataParallel(*wider),
                    Contains("DataParallel: buffer '1.running_mean' differs across ranks (in its "
                             "shape or dtype): on rank " +
                             std::to_string(r) + " of 2 it is " + mine + " float32 cpu"));
  unchanged(*wider);
  auto wider_dtype = build(4, r == 1 ? DType::Float64 : DType::Float32, true);
  CHECK_THROWS_WITH(
      dist::DataParallel(*wider_dtype),
      Contains("buffer '1.running_mean' differs across ranks (in its shape or dtype)"));
  unchanged(*wider_dtype);
  auto more = build(4, DType::Float32, r == 1);
  CHECK_THROWS_WITH(dist::DataParallel(*more),
                    Contains("DataParallel: the ranks' modules have different numbers of buffers "
                             "(0 to 2)"));
  unchanged(*more);
  // Buffers that agree are copied from rank 0.
  auto same = build(4, DType::Float32, true);
  dist::DataParallel ddp(*same);
  for (auto& [name, slot] : same->named_buffer_slots()) {
    INFO(name);
    CHECK(slot->to_vector<double>() == std::vector<double>(slot->numel(), 2.0));
  }
}

namespace {

// y = x w + b, plus a parameter the forward may leave out, and w used twice on request.
struct Misused : nn::Module {
  Misused() {
    register_parameter("w", &w);
    register_parameter("b", &b);
    register_parameter("spare", &spare);
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = F::add(F::matmul(x, w), b);
    if (twice) y = F::add(y, F::matmul(x, w));
    return use_spare ? F::add(y, spare) : y;
  }
  Tensor w = full({4, 3}, 0.5), b = full({3}, 0.1), spare = full({3}, 0.0);
  bool twice = false, use_spare = true;
};

}  // namespace

TEST_CASE("a weight used twice and an unused parameter: the first backward learns their uses",
          "[dist]") {
  Misused m;
  m.twice = true;
  m.use_spare = false;
  dist::DataParallel ddp(m, {.bucket_bytes = 1});  // a bucket per parameter
  const Tensor x = full({2, 4}, 1.0 + dist::rank());
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    m.zero_grad();
    F::sum(m(x)).backward();
    // Per rank d/dw = 2 (uses) x 2 (rows) x (1 + rank): 4 and 8, averaged 6; d/db = 2.
    CHECK(m.w.grad().to_vector<float>() == std::vector<float>(12, 6.0f));
    CHECK(m.b.grad().to_vector<float>() == std::vector<float>(3, 2.0f));
    CHECK_FALSE(m.spare.grad().defined());
  }
  CHECK(ddp.buckets() == std::vector<std::vector<std::string>>{{"b"}, {"w"}});
  // A later backward that uses a parameter differently is an Error naming it.
  m.twice = false;
  m.zero_grad();
  CHECK_THROWS_WITH(F::sum(m(x)).backward(),
                    Contains("'w'") && Contains("got 1 gradients") && Contains("gave it 2"));
  m.twice = true;
  m.use_spare = true;
  m.zero_grad();
  CHECK_THROWS_WITH(F::sum(m(x)).backward(), Contains("'spare'") && Contains("gave it 0"));
  // The requests of the failed steps completed: a good step averages as before.
  m.use_spare = false;
  m.zero_grad();
  F::sum(m(x)).backward();
  CHECK(m.w.grad().to_vector<float>() == std::vector<float>(12, 6.0f));
  dist::barrier();
}

TEST_CASE("ranks that use a parameter differently in the first backward get an Error naming it",
          "[dist]") {
  Misused m;
  m.use_spare = dist::rank() == 0;
  dist::DataParallel ddp(m, {.bucket_bytes = 1});
  const Tensor x = full({2, 4}, 1.0);
  CHECK_THROWS_WITH(F::sum(m(x)).backward(),
                    Contains("'spare'") && Contains("every rank must use each parameter"));
  // Nothing was learned: the next first backward, the same on both ranks, learns.
  m.use_spare = true;
  m.zero_grad();
  F::sum(m(x)).backward();
  CHECK(m.spare.grad().to_vector<float>() == std::vector<float>(3, 2.0f));
  dist::barrier();
}

TEST_CASE("a static step with a weight used twice equals eager, and learns as eager does",
          "[dist]") {
  Misused eager, traced;
  for (Misused* m : {&eager, &traced}) {
    m->twice = true;
    m->use_spare = false;
  }
  dist::DataParallel ddp_eager(eager, {.bucket_bytes = 1}), ddp_traced(traced, {.bucket_bytes = 1});
  optim::SGD opt_eager(eager.parameters(), {.lr = 0.01}),
      opt_traced(traced.parameters(), {.lr = 0.01});
  const auto train = [](nn::Module& m, optim::Optimizer& opt, const Tensor& x) {
    opt.zero_grad();
    Tensor loss = F::sum(F::mul(m(x), m(x)));
    loss.backward();
    opt.step();
    return loss;
  };
  // The first call is the first backward: it learns, and the second call traces the step.
  auto step = static_graph([&](const Tensor& x) { return train(traced, opt_traced, x); },
                           {.name = "dp_tied", .verify_every = 2});
  manual_seed(10 + static_cast<uint64_t>(dist::rank()));
  for (int i = 0; i < kSteps; ++i) {
    const Tensor x = rand({3, 4});
    train(eager, opt_eager, x);
    step(x);
  }
  check_same_bits(eager, traced);
  CHECK(equal_across_ranks(traced));
  CHECK(step.stats().traces == 2);
  CHECK(step.stats().hits == kSteps - 2);
  CHECK_FALSE(traced.spare.grad().defined());
}

TEST_CASE("sharded batch iterators read disjoint halves with as many batches", "[dist]") {
  const auto ds = data::synthetic_classification(101, 4, 3, /*seed=*/1);
  data::BatchIterator it(ds, 8, /*shuffle=*/true, /*seed=*/7);
  it.set_shard(dist::rank(), dist::world_size());
  CHECK(it.batches_per_epoch() == 7);  // 50 samples each
  std::vector<float> mine;
  Tensor x, t;
  while (it.next(x, t)) {
    const std::vector<float> v = x.to_vector<float>();
    mine.insert(mine.end(), v.begin(), v.end());
  }
  REQUIRE(mine.size() == 50 * 4);
  Tensor ours = Tensor::empty({50 * 4});
  std::memcpy(ours.raw_data(), mine.data(), mine.size() * sizeof(float));
  Tensor theirs = clone(ours);
  dist::broadcast(theirs, 1);  // rank 1's rows
  if (dist::rank() == 0) {
    // rank 1's rows are not rank 0's (distinct samples of a continuous distribution)
    const std::vector<float> other = theirs.to_vector<float>();
    for (size_t r = 0; r < 50; ++r)
      for (size_t q = 0; q < 50; ++q)
        CHECK_FALSE(std::memcmp(&mine[r * 4], &other[q * 4], 4 * sizeof(float)) == 0);
  } else {
    CHECK(bytes(theirs) == bytes(ours));
  }
}
