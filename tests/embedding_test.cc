// F::embedding: op-harness cases (op_cases_sequence.h), argument errors, a gradient with the
// same bits at any thread count, and static replay of a small model giving eager's bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "op_cases_sequence.h"
#include "op_harness.h"
#include "runtime/parallel.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::optest;
using Catch::Matchers::Contains;
using testing::bit_diff;
using testing::StaticEnabled;

namespace {

Tensor ids_of(std::initializer_list<double> v, const Shape& s, DType dt = DType::Int64) {
  return tensor(v, s, dt);
}

// Uniform ids in [0, num).
Tensor random_ids(const Shape& s, int64_t num, DType dt = DType::Int64) {
  Tensor ids = empty(s, dt);
  copy_(ids, F::mul(rand(s, DType::Float64), static_cast<double>(num)));
  return ids;
}

}  // namespace

TEST_CASE("embedding through the op harness", "[ops][embedding]") {
  check_ops(embedding_cases());
}

TEST_CASE("embedding refuses bad arguments, naming the argument", "[errors][embedding]") {
  const Tensor w = randn({5, 3});
  const Tensor ids = ids_of({0, 4, 2}, {3});
  CHECK_THROWS_WITH(
      F::embedding(tensor({0, 1}, {2}), w),
      Contains("embedding: argument 'ids' must be int32 or int64, it is float32 [2]"));
  CHECK_THROWS_WITH(F::embedding(ids, randn({5})),
                    Contains("embedding: argument 'weight' must be 2-D [num, dim], it is [5]"));
  CHECK_THROWS_WITH(F::embedding(ids, randn({5, 3, 2})), Contains("it is [5,3,2]"));
  CHECK_THROWS_WITH(F::embedding(ids, zeros({5, 3}, DType::Int64)),
                    Contains("embedding: argument 'weight' must be float32 or float64"));
  CHECK_THROWS_WITH(F::embedding(ids, w, 5),
                    Contains("embedding: argument 'padding_idx' is 5, outside [-5, 5)"));
  CHECK_THROWS_WITH(F::embedding(ids, w, -6),
                    Contains("embedding: argument 'padding_idx' is -6, outside [-5, 5)"));
  CHECK_THROWS_WITH(F::embedding(Tensor(), w), Contains("embedding: argument 'ids'"));
  // Ids outside [0, V): checked on the cpu when the kernel runs, forward and backward.
  for (DType dt : {DType::Int32, DType::Int64}) {
    CAPTURE(name(dt));
    CHECK_THROWS_WITH(F::embedding(ids_of({0, 5, 1}, {3}, dt), w),
                      Contains("embedding: argument 'ids' holds 5 at flat index 1") &&
                          Contains("outside [0, 5)"));
    CHECK_THROWS_WITH(F::embedding(ids_of({0, 1, -1}, {3}, dt), w),
                      Contains("embedding: argument 'ids' holds -1 at flat index 2"));
  }
  CHECK_NOTHROW(F::embedding(ids, w, -5));
}

TEST_CASE("embedding gives its ids' rows and no gradient to the padding row", "[ops][embedding]") {
  Tensor w = tensor({0, 1, 10, 11, 20, 21}, {3, 2}, DType::Float64);
  w.set_requires_grad();
  const Tensor ids = ids_of({2, 1, 2, 0}, {2, 2}, DType::Int32);
  const Tensor y = F::embedding(ids, w, 1);
  CHECK(y.shape() == Shape{2, 2, 2});
  CHECK(y.to_vector<double>() == std::vector<double>{20, 21, 10, 11, 20, 21, 0, 1});
  F::sum(F::mul(y, tensor({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2}, DType::Float64))).backward();
  // Row 2 sums the gradient rows of ids 0 and 2 (1,2 and 5,6); row 1 is padding.
  CHECK(w.grad().to_vector<double>() == std::vector<double>{7, 8, 0, 0, 6, 8});
  // -2 is the same row, counted from the end as PyTorch counts it; none: every row's gradient.
  Tensor w2 = w.detach().set_requires_grad();
  Tensor w3 = w.detach().set_requires_grad();
  const Tensor gy = tensor({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2}, DType::Float64);
  F::sum(F::mul(F::embedding(ids, w2, -2), gy)).backward();
  CHECK(bit_diff(w2.grad(), w.grad()) == "");
  F::sum(F::mul(F::embedding(ids, w3), gy)).backward();
  CHECK(w3.grad().to_vector<double>() == std::vector<double>{7, 8, 3, 4, 6, 8});
}

TEST_CASE("embedding's weight gradient has the same bits at any thread count", "[ops][embedding]") {
  manual_seed(11);
  const Tensor ids = random_ids({64, 97}, 300);  // many repeats
  const Tensor w0 = randn({300, 129});
  const Tensor gy = randn({64, 97, 129});
  auto grad_with = [&](int threads) {
    const testing::ThreadCount scope(threads);
    Tensor w = w0.detach().set_requires_grad();
    F::sum(F::mul(F::embedding(ids, w, 7), gy)).backward();
    return w.grad();
  };
  const Tensor one = grad_with(1);
  CHECK(bit_diff(one, grad_with(2)) == "");
  CHECK(bit_diff(one, grad_with(4)) == "");
  CHECK(bit_diff(one, grad_with(1)) == "");
}

TEST_CASE("a static model with an embedding replays eager's bits", "[static][embedding]") {
  StaticEnabled on;
  for (DType ids_dtype : {DType::Int32, DType::Int64}) {
    CAPTURE(name(ids_dtype));
    manual_seed(5);
    const Tensor table = randn({20, 8});
    const Tensor proj = randn({4, 8});
    auto body = [&](const Tensor& ids, const Tensor& w, const Tensor& p) {
      const Tensor e = F::embedding(ids, w, 0);           // [B, T, 8]
      const Tensor h = F::gelu(F::linear(e, p), "tanh");  // [B, T, 4]
      return F::mean(F::mul(h, h));
    };
    auto f = static_graph(body, {.name = "embedding_model", .arg_names = {"ids", "w", "p"}});
    for (int call = 0; call < 4; ++call) {  // trace, then replays on fresh ids
      const Tensor ids = random_ids({3, 5}, 20, ids_dtype);
      Tensor ws = table.detach().set_requires_grad(), ps = proj.detach().set_requires_grad();
      Tensor we = table.detach().set_requires_grad(), pe = proj.detach().set_requires_grad();
      const Tensor ys = f(ids, ws, ps);
      ys.backward();
      const Tensor ye = body(ids, we, pe);
      ye.backward();
      CHECK(bit_diff(ys, ye) == "");
      CHECK(bit_diff(ws.grad(), we.grad()) == "");
      CHECK(bit_diff(ps.grad(), pe.grad()) == "");
    }
    CHECK(f.stats().traces == 1);
  }
}

TEST_CASE("nn::Embedding starts N(0, 1) with a zero padding row", "[nn][embedding]") {
  manual_seed(2);
  nn::Embedding emb(1000, 16, 3);
  REQUIRE(emb.weight.shape() == Shape{1000, 16});
  CHECK(emb.weight.requires_grad());
  CHECK(emb.parameters().size() == 1);
  const std::vector<float> w = emb.weight.to_vector<float>();
  double sum = 0, sq = 0;
  for (float v : w) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(w.size()), mean = sum / n;
  CHECK(std::abs(mean) < 0.03);
  CHECK(std::abs(sq / n - mean * mean - 1) < 0.05);
  for (int d = 0; d < 16; ++d) CHECK(w[3 * 16 + d] == 0.0f);
  CHECK(emb.describe() == "Embedding(1000, 16, padding_idx 3)");
  CHECK(emb.padding_idx() == 3);
  const Tensor y = emb(random_ids({2, 7}, 1000));
  CHECK(y.shape() == Shape{2, 7, 16});
  CHECK_THROWS_WITH(nn::Embedding(4, 2, 4),
                    Contains("Embedding: padding_idx 4 is outside [-4, 4)"));
  CHECK_THROWS_WITH(nn::Embedding(4, 2, -5), Contains("Embedding: padding_idx -5"));
  CHECK_THROWS_WITH(nn::Embedding(0, 2), Contains("Embedding: num and dim must be positive"));
  // As PyTorch's: a negative padding_idx counts from the end.
  CHECK(nn::Embedding(4, 2, -3).padding_idx() == 1);
  CHECK(nn::Embedding(4, 2, -3).describe() == "Embedding(4, 2, padding_idx 1)");
  CHECK_FALSE(nn::Embedding(4, 2).padding_idx().has_value());
}
