// Collectives between two ranks: all-reduce (sum, max, min) on every reducible dtype and several
// shapes, split into start and wait around other work, broadcast and barrier, and the errors.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "encore/dist.h"
#include "encore/encore.h"

using namespace encore;
using Catch::Matchers::Contains;

namespace {

// Values that differ by rank: element i of rank r is i * 3 + r (as T).
template <typename T>
Tensor ranked(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(i * 3 + dist::rank());
  return t;
}

template <typename T>
void check_reductions(DType dtype) {
  for (const Shape& shape : {Shape{}, Shape{7}, Shape{3, 5}, Shape{2, 3, 4}}) {
    INFO(shape.str() << " " << name(dtype));
    Tensor sum = ranked<T>(shape, dtype), max = ranked<T>(shape, dtype),
           min = ranked<T>(shape, dtype);
    dist::all_reduce(sum);
    dist::all_reduce(max, ReduceOp::Max);
    dist::all_reduce(min, ReduceOp::Min);
    const std::vector<T> s = sum.to_vector<T>(), hi = max.to_vector<T>(), lo = min.to_vector<T>();
    for (int64_t i = 0; i < sum.numel(); ++i) {
      CHECK(s[i] == static_cast<T>(i * 3) + static_cast<T>(i * 3 + 1));
      CHECK(hi[i] == static_cast<T>(i * 3 + 1));
      CHECK(lo[i] == static_cast<T>(i * 3));
    }
  }
}

}  // namespace

TEST_CASE("two ranks", "[dist]") {
  CHECK(dist::initialized());
  CHECK(dist::world_size() == 2);
  CHECK((dist::rank() == 0 || dist::rank() == 1));
}

TEST_CASE("all_reduce sums, maxes and mins every reducible dtype", "[dist]") {
  check_reductions<float>(DType::Float32);
  check_reductions<double>(DType::Float64);
  check_reductions<int32_t>(DType::Int32);
  check_reductions<int64_t>(DType::Int64);
}

TEST_CASE("an all-reduce started before other work completes at its wait", "[dist]") {
  Tensor a = full({1000}, 1.0 + dist::rank()), b = full({10}, 2.0);
  Tensor ha = dist::start_all_reduce(a);
  Tensor hb = dist::start_all_reduce(b, ReduceOp::Max);
  Tensor other = F::matmul(full({64, 64}, 1.0), full({64, 64}, 1.0));  // work in between
  dist::wait_all_reduce(b, hb);
  dist::wait_all_reduce(a, ha);
  CHECK(a.to_vector<float>() == std::vector<float>(1000, 3.0f));
  CHECK(b.to_vector<float>() == std::vector<float>(10, 2.0f));
  CHECK(other.to_vector<float>()[0] == 64.0f);
}

TEST_CASE("broadcast copies the root's tensor; barrier returns on both ranks", "[dist]") {
  Tensor t = full({2, 3}, 10.0 * (dist::rank() + 1));
  dist::broadcast(t, 1);
  CHECK(t.to_vector<float>() == std::vector<float>(6, 20.0f));
  Tensor i = full({4}, static_cast<double>(dist::rank()), DType::Int64);
  dist::broadcast(i, 0);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>(4, 0));
  dist::barrier();
}

TEST_CASE("collectives refuse what they cannot do, naming it", "[dist]") {
  Tensor b = full({3}, 1.0, DType::Bool);
  CHECK_THROWS_WITH(dist::all_reduce(b), Contains("all_reduce") && Contains("bool"));
  Tensor t = full({3}, 1.0);
  CHECK_THROWS_WITH(dist::broadcast(t, 2), Contains("root 2") && Contains("world of 2"));
  Tensor w = full({3}, 1.0).set_requires_grad();
  CHECK_THROWS_WITH(dist::all_reduce(w), Contains("start_all_reduce") && Contains("requires grad"));
  dist::barrier();
}
