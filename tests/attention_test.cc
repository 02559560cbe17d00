// Attention: matmul over broadcast batch dimensions, masked_fill and scaled_dot_product_attention
// through the op harness (op_cases_attention.h), their argument errors, causal semantics, and a
// static attention block (the causal mask made inside the traced function) replaying eager's bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "op_cases_attention.h"
#include "op_harness.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::optest;
using Catch::Matchers::Contains;
using testing::bit_diff;
using testing::StaticEnabled;

TEST_CASE("matmul over broadcast batch dimensions through the op harness", "[ops][matmul]") {
  check_ops(batched_matmul_cases());
}

TEST_CASE("masked_fill through the op harness", "[ops][masked_fill]") {
  check_ops(masked_fill_cases());
}

TEST_CASE("scaled_dot_product_attention through the op harness", "[ops][attention]") {
  check_ops(attention_cases());
}

TEST_CASE("masked_fill and attention refuse bad arguments, naming the shapes",
          "[errors][attention]") {
  const Tensor x = randn({2, 3, 4});
  CHECK_THROWS_WITH(F::masked_fill(x, zeros({3, 4}), 0),
                    Contains("masked_fill: argument 'mask' must be bool, it is float32 [3,4]"));
  const Tensor bad_mask = F::greater(randn({2, 4}), zeros({}));
  CHECK_THROWS_WITH(F::masked_fill(x, bad_mask, 0),
                    Contains("masked_fill: argument 'mask' [2,4] does not broadcast to x [2,3,4]"));
  CHECK_THROWS_WITH(F::masked_fill(randn({3}), F::greater(randn({2, 3}), zeros({})), 0),
                    Contains("mask' [2,3] does not broadcast to x [3]"));
  CHECK_THROWS_WITH(F::masked_fill(Tensor(), bad_mask, 0), Contains("masked_fill: argument 'x'"));

  const Tensor q = randn({2, 3, 5, 4}), k = randn({2, 3, 6, 4}), v = randn({2, 3, 6, 8});
  CHECK_NOTHROW(F::scaled_dot_product_attention(q, k, v));
  CHECK_THROWS_WITH(F::scaled_dot_product_attention(q, randn({2, 3, 6, 5}), v),
                    Contains("scaled_dot_product_attention: head sizes differ: q is [2,3,5,4], k "
                             "is [2,3,6,5]"));
  CHECK_THROWS_WITH(F::scaled_dot_product_attention(q, k, randn({2, 3, 7, 8})),
                    Contains("scaled_dot_product_attention: key and value lengths differ: k is "
                             "[2,3,6,4], v is [2,3,7,8]"));
  CHECK_THROWS_WITH(F::scaled_dot_product_attention(q, randn({4, 3, 6, 4}), randn({4, 3, 6, 8})),
                    Contains("scaled_dot_product_attention: batch dimensions do not broadcast: q "
                             "is [2,3,5,4], k is [4,3,6,4], v is [4,3,6,8]"));
  CHECK_THROWS_WITH(F::scaled_dot_product_attention(q, k, randn({2, 2, 6, 8})),
                    Contains("batch dimensions do not broadcast"));
  CHECK_THROWS_WITH(F::scaled_dot_product_attention(randn({4}), k, v),
                    Contains("q, k and v must be at least 2-D"));
  CHECK_THROWS_WITH(F::scaled_dot_product_attention(q, k, randn({2, 3, 6, 8}, DType::Float64)),
                    Contains("scaled_dot_product_attention: dtypes differ"));
  CHECK_THROWS_WITH(F::scaled_dot_product_attention(q, k, v, false, zeros({5, 6}, DType::Int64)),
                    Contains("argument 'attn_mask' must be bool or float32 (as q), it is int64"));
  CHECK_THROWS_WITH(F::scaled_dot_product_attention(q, k, v, false, zeros({5, 7})),
                    Contains("argument 'attn_mask' [5,7] does not broadcast to the scores "
                             "[2,3,5,6]"));
}

TEST_CASE("MultiheadAttention refuses key and value batches or lengths that differ from query's",
          "[errors][attention]") {
  manual_seed(1);
  nn::MultiheadAttention mha(6, 2);
  const Tensor q2 = randn({2, 3, 6}), k2 = randn({2, 4, 6}), v2 = randn({2, 4, 6});
  const Tensor q1 = randn({1, 3, 6}), k1 = randn({1, 4, 6}), v1 = randn({1, 4, 6});
  CHECK(mha.forward(q2, k2, v2).shape() == Shape{2, 3, 6});
  CHECK_THROWS_WITH(mha.forward(q2, k1, v1),
                    Contains("MultiheadAttention: key [1,4,6] and value [1,4,6] must be [2,S,6] "
                             "for query [2,3,6]"));
  CHECK_THROWS_WITH(mha.forward(q2, k2, v1),
                    Contains("MultiheadAttention: key [2,4,6] and value [1,4,6] must be [2,S,6]"));
  CHECK_THROWS_WITH(mha.forward(q2, k1, v2),
                    Contains("MultiheadAttention: key [1,4,6] and value [2,4,6] must be [2,S,6]"));
  CHECK_THROWS_WITH(mha.forward(q1, k2, v2),
                    Contains("MultiheadAttention: key [2,4,6] and value [2,4,6] must be [1,S,6] "
                             "for query [1,3,6]"));
  CHECK_THROWS_WITH(mha.forward(q2, k2, randn({2, 5, 6})),
                    Contains("MultiheadAttention: key [2,4,6] and value [2,5,6] must be [2,S,6]"));
}

TEST_CASE("causal attention: a query sees only itself and earlier keys", "[ops][attention]") {
  manual_seed(6);
  const Tensor q = randn({2, 5, 4}, DType::Float64), k = randn({2, 5, 4}, DType::Float64);
  const Tensor v = randn({2, 5, 3}, DType::Float64);
  const Tensor y = F::scaled_dot_product_attention(q, k, v, true);
  // Changing the last key and value changes only the last query's output.
  const Tensor k2 = F::concat({F::slice(k, 1, 0, 4), randn({2, 1, 4}, DType::Float64)}, 1);
  const Tensor v2 = F::concat({F::slice(v, 1, 0, 4), randn({2, 1, 3}, DType::Float64)}, 1);
  const Tensor y2 = F::scaled_dot_product_attention(q, k2, v2, true);
  CHECK(bit_diff(F::slice(y, 1, 0, 4), F::slice(y2, 1, 0, 4)) == "");
  CHECK(bit_diff(F::slice(y, 1, 4, 5), F::slice(y2, 1, 4, 5)) != "");
  // The first query attends to the first key alone: its output is v's first row.
  CHECK(bit_diff(F::slice(y, 1, 0, 1), F::slice(v, 1, 0, 1)) == "");
  // The same as a bool mask that lets query i see keys j <= i.
  std::vector<double> tril(25);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j <= i; ++j) tril[i * 5 + j] = 1;
  const Tensor keep = F::greater(tensor(tril, {5, 5}, DType::Float64), zeros({}, DType::Float64));
  CHECK(bit_diff(y, F::scaled_dot_product_attention(q, k, v, false, keep)) == "");
}

TEST_CASE("a query the mask lets see no key gets 0, and no NaN reaches any gradient",
          "[ops][attention]") {
  // Key 0 is padding and the mask is causal: query 0 sees no key. PyTorch (since 2.5) gives its
  // row 0; softmax alone would give NaN, and its backward NaN in every row of v's gradient.
  manual_seed(3);
  const int64_t t = 4;
  std::vector<double> keep_values(t * t);
  for (int i = 0; i < t; ++i)
    for (int j = 1; j <= i; ++j) keep_values[i * t + j] = 1;
  const Tensor keep =
      F::greater(tensor(keep_values, {t, t}, DType::Float64), zeros({}, DType::Float64));
  std::vector<double> add_values(t * t);
  for (size_t i = 0; i < add_values.size(); ++i)
    add_values[i] = keep_values[i] != 0 ? 0.0 : -INFINITY;
  const Tensor additive = tensor(add_values, {t, t}, DType::Float64);
  for (const Tensor& mask : {keep, additive}) {
    INFO("mask " << name(mask.dtype()));
    Tensor q = randn({2, t, 3}, DType::Float64).set_requires_grad();
    Tensor k = randn({2, t, 3}, DType::Float64).set_requires_grad();
    Tensor v = randn({2, t, 2}, DType::Float64).set_requires_grad();
    const Tensor y = F::scaled_dot_product_attention(q, k, v, false, mask);
    CHECK(F::slice(y, 1, 0, 1).to_vector<double>() == std::vector<double>(4, 0.0));
    // The other queries attend as if query 0 were not there.
    const Tensor rest =
        F::scaled_dot_product_attention(F::slice(q, 1, 1, t), k, v, false, F::slice(mask, 0, 1, t));
    const auto yv = F::slice(y, 1, 1, t).to_vector<double>(), rv = rest.to_vector<double>();
    REQUIRE(yv.size() == rv.size());
    for (size_t i = 0; i < yv.size(); ++i) CHECK(yv[i] == Approx(rv[i]).epsilon(1e-12));
    // A loss over the later queries only: every gradient is finite, and query 0 gets none.
    F::sum(F::mul(F::slice(y, 1, 1, t), F::slice(y, 1, 1, t))).backward();
    for (const Tensor* g : {&q, &k, &v})
      for (double x : g->grad().to_vector<double>()) CHECK(std::isfinite(x));
    CHECK(F::slice(q.grad(), 1, 0, 1).to_vector<double>() == std::vector<double>(6, 0.0));
  }
}

TEST_CASE("MultiheadAttention made causal is causal through either forward", "[attention]") {
  manual_seed(4);
  nn::MultiheadAttention mha(8, 2, {.causal = true});
  const Tensor x = randn({2, 5, 8});
  CHECK(bit_diff(mha.forward(x), mha.forward(x, x, x)) == "");
  nn::MultiheadAttention plain(8, 2);
  plain.in_proj_weight = mha.in_proj_weight;
  plain.in_proj_bias = mha.in_proj_bias;
  plain.out_proj->weight = mha.out_proj->weight;
  plain.out_proj->bias = mha.out_proj->bias;
  CHECK(bit_diff(plain.forward(x, x, x), mha.forward(x)) != "");
  CHECK(bit_diff(plain.forward(x, x, x, Tensor(), true), mha.forward(x)) == "");
  CHECK_THROWS_WITH(mha.forward(x, randn({2, 5, 6}), x),
                    Contains("MultiheadAttention: key must be [B,S,8], it is [2,5,6]"));
  CHECK_THROWS_WITH(mha.forward(randn({2, 5}), x, x),
                    Contains("MultiheadAttention: query must be [B,T,8], it is [2,5]"));
}

namespace {

// A causal self-attention block of a small GPT: x [B, T, C] -> layer_norm(x + attention(x)).
struct Block {
  Tensor wqkv, wo, gamma, beta;
  int64_t heads;
  Tensor operator()(const Tensor& x) const {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads;
    const Tensor qkv = F::linear(x, wqkv);  // [B, T, 3C]
    auto head = [&](int i) {                // [B, H, T, D]
      return F::permute(F::reshape(F::slice(qkv, 2, i * c, (i + 1) * c), {b, t, heads, d}),
                        {0, 2, 1, 3});
    };
    const Tensor y = F::scaled_dot_product_attention(head(0), head(1), head(2), true);
    const Tensor merged = F::reshape(F::permute(y, {0, 2, 1, 3}), {b, t, c});
    return F::layer_norm(F::add(x, F::linear(merged, wo)), {c}, gamma, beta);
  }
  std::vector<Tensor*> params() { return {&wqkv, &wo, &gamma, &beta}; }
};

}  // namespace

TEST_CASE("a static causal attention block replays eager's bits, forward and gradients",
          "[static][attention]") {
  StaticEnabled on;
  for (DType dt : {DType::Float32, DType::Float64}) {
    CAPTURE(name(dt));
    manual_seed(9);
    const int64_t c = 8;
    Block init{F::mul(randn({3 * c, c}, dt), 0.3), F::mul(randn({c, c}, dt), 0.3), rand({c}, dt),
               randn({c}, dt), 2};
    auto copy_block = [&] {
      Block b = init;
      for (Tensor* p : b.params()) *p = p->detach().set_requires_grad();
      return b;
    };
    Block bs = copy_block(), be = copy_block();
    const Tensor head = randn({c, 5}, dt);
    auto loss = [&](const Block& blk, const Tensor& x, const Tensor& targets) {
      return F::cross_entropy(F::matmul(blk(x), head), targets);
    };
    auto f = static_graph([&](const Tensor& x, const Tensor& t) { return loss(bs, x, t); },
                          {.name = "attention_block", .arg_names = {"x", "targets"}});
    for (int call = 0; call < 4; ++call) {
      Tensor x = randn({2, 6, c}, dt);
      x.set_requires_grad();
      const Tensor xe = x.detach().set_requires_grad();
      Tensor targets = empty({2, 6}, DType::Int64);
      copy_(targets, F::mul(rand({2, 6}, DType::Float64), 5.0));
      for (Block* blk : {&bs, &be})
        for (Tensor* p : blk->params()) p->set_grad(Tensor());
      const Tensor ys = f(x, targets);
      ys.backward();
      const Tensor ye = loss(be, xe, targets);
      ye.backward();
      CAPTURE(call);
      CHECK(bit_diff(ys, ye) == "");
      CHECK(bit_diff(x.grad(), xe.grad()) == "");
      for (size_t i = 0; i < bs.params().size(); ++i) {
        CAPTURE(i);
        CHECK(bit_diff(bs.params()[i]->grad(), be.params()[i]->grad()) == "");
      }
    }
    CHECK(f.stats().traces == 1);
    CHECK(f.stats().hits >= 2);
  }
}

TEST_CASE("batched matmul of small heads gives the same bits at any thread count",
          "[ops][matmul]") {
  manual_seed(12);
  const Tensor a0 = randn({4, 8, 33, 16}), b0 = randn({4, 1, 16, 33}), gy = randn({4, 8, 33, 33});
  auto run = [&](int threads) {
    const testing::ThreadCount scope(threads);
    Tensor a = a0.detach().set_requires_grad(), b = b0.detach().set_requires_grad();
    const Tensor y = F::matmul(a, b);
    F::sum(F::mul(y, gy)).backward();
    return std::vector<Tensor>{y, a.grad(), b.grad()};
  };
  const std::vector<Tensor> one = run(1);
  for (int threads : {2, 3}) {
    const std::vector<Tensor> other = run(threads);
    for (size_t i = 0; i < one.size(); ++i) {
      CAPTURE(threads, i);
      CHECK(bit_diff(one[i], other[i]) == "");
    }
  }
}

TEST_CASE("static attention with mask arguments and a new length replays eager's bits",
          "[static][attention]") {
  StaticEnabled on;
  manual_seed(13);
  auto body = [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep,
                 const Tensor& bias) {
    const Tensor a = F::scaled_dot_product_attention(q, k, v, false, keep);
    const Tensor b = F::scaled_dot_product_attention(q, k, v, true, bias, 0.3);
    return F::sum(F::mul(a, b));
  };
  auto f = static_graph(body, {.name = "masked_attention"});
  for (int64_t t : {4, 4, 6, 6, 4}) {  // a new length traces again; each replays
    CAPTURE(t);
    const Tensor q0 = randn({2, t, 3}), k0 = randn({2, t, 3}), v0 = randn({2, t, 5});
    std::vector<double> m(static_cast<size_t>(t * t));  // every query keeps key 0
    for (int64_t i = 0; i < t * t; ++i) m[i] = i % t == 0 || (i * 7) % 3 == 1 ? 1 : 0;
    const Tensor keep = F::greater(tensor(m, {t, t}), zeros({}));
    const Tensor bias = randn({1, t, t});
    std::vector<Tensor> s, e;
    for (std::vector<Tensor>* in : {&s, &e})
      for (const Tensor& x : {q0, k0, v0}) in->push_back(x.detach().set_requires_grad());
    const Tensor ys = f(s[0], s[1], s[2], keep, bias);
    ys.backward();
    const Tensor ye = body(e[0], e[1], e[2], keep, bias);
    ye.backward();
    CHECK(bit_diff(ys, ye) == "");
    for (int i = 0; i < 3; ++i) CHECK(bit_diff(s[i].grad(), e[i].grad()) == "");
  }
  CHECK(f.stats().traces == 2);
}
