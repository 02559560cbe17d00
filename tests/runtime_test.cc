// Shapes, dtypes, devices, the caching allocator and the RNG.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "encore/encore.h"

using namespace encore;
using Catch::Matchers::Contains;

TEST_CASE("shapes hold up to eight dimensions inline", "[runtime]") {
  Shape s{2, 3, 4};
  CHECK(s.rank() == 3);
  CHECK(s.numel() == 24);
  CHECK(s.str() == "[2,3,4]");
  CHECK(s.at(-1) == 4);
  CHECK(s.strides()[0] == 12);
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{}.str() == "[]");
  static_assert(sizeof(Shape) <= 8 * sizeof(int64_t) + 8, "Shape must stay inline");
  CHECK_NOTHROW(Shape{1, 1, 1, 1, 1, 1, 1, 1});
  CHECK_THROWS_WITH((Shape{1, 1, 1, 1, 1, 1, 1, 1, 1}), Contains("rank 9"));
  CHECK(broadcast_shapes({2, 1, 3}, {4, 1}, "t") == Shape{2, 4, 3});
  CHECK_THROWS_WITH(broadcast_shapes({2, 3}, {4}, "add"),
                    Contains("add: shapes do not broadcast: a is [2,3], b is [4]"));
}

TEST_CASE("dtypes and devices", "[runtime]") {
  CHECK(itemsize(DType::Float32) == 4);
  CHECK(itemsize(DType::Int64) == 8);
  CHECK(itemsize(DType::Bool) == 1);
  CHECK(name(DType::Float64) == "float64");
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda:1") == Device::cuda(1));
  CHECK(Device::cuda(2).str() == "cuda:2");
  CHECK_THROWS_WITH(Device::parse("tpu"), Contains("tpu"));
}

TEST_CASE("record_stream is for CUDA tensors; to() of a cpu tensor to the cpu is itself",
          "[runtime]") {
  const Tensor t = rand({3}).set_requires_grad();
  CHECK_THROWS_WITH(t.record_stream(nullptr),
                    Contains("record_stream: the tensor is on cpu; only CUDA tensors"));
  CHECK(t.to(Device::cpu()).is_same(t));  // nothing copied, nothing recorded
}

TEST_CASE("tensors share storage on copy and views", "[runtime]") {
  Tensor a = arange(6);
  Tensor b = a;
  CHECK(b.is_same(a));
  Tensor v = F::reshape(a, {2, 3});
  CHECK(v.shares_storage(a));
  CHECK_FALSE(v.is_same(a));
  v.data<float>()[4] = 42;
  CHECK(a.to_vector<float>()[4] == 42);
  Tensor c = clone(a);
  CHECK_FALSE(c.shares_storage(a));
  CHECK_THROWS_WITH(a.data<double>(), Contains("float32"));
  CHECK(F::sum(a).item<double>() == Approx(0 + 1 + 2 + 3 + 42 + 5));
  CHECK(to_string(F::reshape(arange(3), {3})).find("{0, 1, 2}") != std::string::npos);
}

TEST_CASE("shares_storage throws Error on an undefined tensor, as every accessor", "[runtime]") {
  const Tensor x = ones({2}).set_requires_grad();
  CHECK_FALSE(x.grad().defined());
  CHECK_THROWS_AS(x.shares_storage(x.grad()), Error);  // it dereferenced null
  CHECK_THROWS_WITH(x.grad().shares_storage(x), Contains("use of an undefined tensor"));
  CHECK_THROWS_AS(Tensor().shares_storage(Tensor()), Error);
  CHECK(x.shares_storage(x));
}

TEST_CASE("to_string prints integers exactly, bools as such, floats to the last digit",
          "[runtime]") {
  // Integers went through double and 6 significant digits: 123456789 printed as 1.23457e+08.
  CHECK(to_string(tensor({123456789, 16777217, -7}, {3}, DType::Int64)) ==
        "Tensor[3] int64 cpu {123456789, 16777217, -7}");
  Tensor big = empty({2}, DType::Int64);
  big.data<int64_t>()[0] = std::numeric_limits<int64_t>::max();
  big.data<int64_t>()[1] = std::numeric_limits<int64_t>::min();
  CHECK(to_string(big) == "Tensor[2] int64 cpu {9223372036854775807, -9223372036854775808}");
  CHECK(to_string(tensor({1000001, 1000002}, {2}, DType::Int32)) ==
        "Tensor[2] int32 cpu {1000001, 1000002}");
  CHECK(to_string(tensor({1, 0, 1}, {3}, DType::Bool)) == "Tensor[3] bool cpu {true, false, true}");
  // The fewest digits that read back as the value of the tensor's dtype.
  CHECK(to_string(tensor({0.1, 1.0000001, 16777216, -2.5}, {4}, DType::Float32)) ==
        "Tensor[4] float32 cpu {0.1, 1.0000001, 16777216, -2.5}");
  CHECK(to_string(tensor({0.1, 1.0000000000000002, 1e300}, {3}, DType::Float64)) ==
        "Tensor[3] float64 cpu {0.1, 1.0000000000000002, 1e+300}");
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(to_string(tensor({std::nan(""), -inf}, {2})) == "Tensor[2] float32 cpu {nan, -inf}");
  // max_elements: the first values, then ", ..."; a negative count is an Error (it threw
  // std::length_error).
  CHECK(to_string(arange(5, DType::Int32), 2) == "Tensor[5] int32 cpu {0, 1, ...}");
  CHECK(to_string(arange(5, DType::Int32), 0) == "Tensor[5] int32 cpu {...}");
  CHECK(to_string(arange(0, DType::Int32), 0) == "Tensor[0] int32 cpu {}");
  CHECK_THROWS_WITH(to_string(ones({2}), -1),
                    Contains("to_string: max_elements must be >= 0, it is -1"));
  CHECK(to_string(Tensor()) == "Tensor(undefined)");
}

TEST_CASE("item and to_vector convert floating values to integers as copy_ does", "[runtime]") {
  // A bare static_cast before: undefined behaviour (3e9 and NaN gave INT_MIN on x86).
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const std::vector<double> values = {3e9, nan,  -3e9,         1e20,          -1e20,  inf,    -inf,
                                      2.5, -2.5, 2147483647.9, -2147483648.9, 0x1p63, -0x1p63};
  const Shape shape{static_cast<int64_t>(values.size())};
  for (const DType from : {DType::Float32, DType::Float64}) {
    CAPTURE(name(from));
    const Tensor f = tensor(values, shape, from);
    Tensor i32 = empty(shape, DType::Int32), i64 = empty(shape, DType::Int64);
    copy_(i32, f);
    copy_(i64, f);
    const std::vector<int32_t> want32 = i32.to_vector<int32_t>();
    const std::vector<int64_t> want64 = i64.to_vector<int64_t>();
    CHECK(want32[0] == std::numeric_limits<int32_t>::max());
    CHECK(want32[1] == 0);
    CHECK(f.to_vector<int32_t>() == want32);
    CHECK(f.to_vector<int64_t>() == want64);
    for (int64_t k = 0; k < shape.numel(); ++k) {
      CAPTURE(k);
      const Tensor one = F::slice(f, 0, k, k + 1);
      CHECK(one.item<int32_t>() == want32[k]);
      CHECK(one.item<int64_t>() == want64[k]);
    }
  }
}

TEST_CASE("the caching allocator reuses blocks and keeps statistics", "[runtime][memory]") {
  Allocator& alloc = allocator_for(Device::cpu());
  const AllocatorStats s0 = alloc.stats();
  { Tensor t = empty({1000}); }  // warm the size class
  const AllocatorStats s1 = alloc.stats();
  CHECK(s1.bytes_in_use == s0.bytes_in_use);
  {
    Tensor t = empty({1000});
    const AllocatorStats s2 = alloc.stats();
    CHECK(s2.bytes_in_use >= s0.bytes_in_use + 4000);
    CHECK(s2.live_blocks == s0.live_blocks + 1);
    CHECK(s2.allocation_count == s1.allocation_count + 1);
    CHECK(s2.system_allocations == s1.system_allocations);  // served from the cache
    CHECK(s2.peak_bytes >= s2.bytes_in_use);
    CHECK(reinterpret_cast<uintptr_t>(t.raw_data()) % 64 == 0);
  }
  CHECK(alloc.stats().bytes_in_use == s0.bytes_in_use);
  alloc.empty_cache();
  CHECK(alloc.stats().bytes_cached == 0);
  alloc.reset_peak();
  CHECK(alloc.stats().peak_bytes == alloc.stats().bytes_in_use);
}

TEST_CASE("a failed allocation leaves the allocator's statistics as they were",
          "[runtime][memory]") {
  Allocator& alloc = allocator_for(Device::cpu());
  alloc.reset_peak();
  const AllocatorStats s0 = alloc.stats();
  CHECK_THROWS_WITH(empty({int64_t{1} << 40}), Contains("out of memory"));  // 4 TiB
  const AllocatorStats s1 = alloc.stats();
  CHECK(s1.peak_bytes == s0.peak_bytes);
  CHECK(s1.bytes_in_use == s0.bytes_in_use);
  CHECK(s1.live_blocks == s0.live_blocks);
}

TEST_CASE("the runtime RNG is seeded and reproducible", "[runtime]") {
  manual_seed(7);
  const auto a = rand({64}).to_vector<float>();
  const auto b = rand({64}).to_vector<float>();
  manual_seed(7);
  CHECK(rand({64}).to_vector<float>() == a);
  CHECK(a != b);
  for (float v : a) {
    CHECK(v >= 0.0f);
    CHECK(v < 1.0f);
  }
  manual_seed(11);
  const auto n = randn({20000}, DType::Float64).to_vector<double>();
  double mean = 0, var = 0;
  for (double v : n) mean += v;
  mean /= n.size();
  for (double v : n) var += (v - mean) * (v - mean);
  var /= n.size();
  CHECK(std::abs(mean) < 0.03);
  CHECK(std::abs(var - 1.0) < 0.05);
}

TEST_CASE("element counts that would overflow are rejected", "[runtime]") {
  CHECK_THROWS_WITH(empty({(int64_t{1} << 61) + 1}, DType::Float64),
                    Contains("Shape [2305843009213693953]: more than 2^59 elements"));
  CHECK_THROWS_WITH(F::reshape(ones({4}), {int64_t{1} << 32, int64_t{1} << 32, 4}),
                    Contains("too many elements"));
  const int64_t big = int64_t{1} << 32;
  CHECK_THROWS(F::reshape(ones({4}), {big + 1, big - 1, big + 1, big - 1, 4}));
  CHECK(F::slice(ones({2, 3}), 1, 0, 3, std::numeric_limits<int64_t>::max()).shape() ==
        Shape{2, 1});
  CHECK(F::slice(ones({2, 3}), 1, 2, 1).shape() == Shape{2, 0});
}

TEST_CASE("an undefined tensor raises instead of crashing", "[runtime]") {
  Tensor u;
  CHECK_FALSE(u.defined());
  CHECK_THROWS_WITH(u.shape(), Contains("undefined tensor"));
  CHECK_THROWS_WITH(u.set_grad(ones({1})), Contains("undefined tensor"));
  CHECK_THROWS_WITH(u.grad(), Contains("undefined tensor"));
  CHECK_THROWS_WITH(u.detach(), Contains("undefined tensor"));
  CHECK_THROWS_WITH(ones({2, 3}).size(-3), Contains("axis -3 is out of range for [2,3]"));
  CHECK(ones({2, 3}).size(-2) == 2);
  CHECK_THROWS_WITH(arange(-1), Contains("arange"));
}

TEST_CASE("dispatch checks how many operands an op takes", "[runtime]") {
  Tensor x = ones({2}), y = empty({2});
  CHECK_THROWS_WITH(dispatch(Op::Add, {x}, {y}),
                    Contains("add: called with 1 inputs and 1 outputs; it takes 2 inputs"));
  CHECK_THROWS_WITH(dispatch(Op::Exp, {x}, {}), Contains("exp: called with 1 inputs and 0"));
  CHECK_THROWS_WITH(dispatch(Op::Linear, {x}, {y}), Contains("2 to 3 inputs"));
}

TEST_CASE("allocator size classes waste at most a quarter", "[runtime][memory]") {
  Allocator& alloc = allocator_for(Device::cpu());
  for (int64_t n : {1025, 4097, 262145, 1000001}) {  // floats, just past a power of two
    const int64_t before = alloc.stats().bytes_in_use;
    Tensor t = empty({n});
    const int64_t used = alloc.stats().bytes_in_use - before;
    INFO(n);
    CHECK(used >= 4 * n);
    CHECK(used <= 4 * n + 4 * n / 4 + 64);
  }
}

TEST_CASE("parallel_for covers every element exactly once", "[runtime]") {
  const int saved = num_threads();
  for (int threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    CHECK(num_threads() == threads);
    for (int64_t n : {0, 1, 999, 100000}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      parallel_for(n, 100, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
      });
      INFO("threads " << threads << " n " << n);
      CHECK(std::count(hits.begin(), hits.end(), 1) == n);
    }
  }
  set_num_threads(saved);
}

TEST_CASE("a multi-threaded optimizer update equals the single-threaded one bit for bit",
          "[runtime][optim]") {
  const int saved = num_threads();
  std::vector<float> results[2];
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    manual_seed(5);
    Tensor p = rand({300000}, DType::Float32, Device::cpu(), -1, 1).set_requires_grad();
    optim::Adam adam({p}, {.weight_decay = 0.01});
    for (int step = 0; step < 3; ++step) {
      p.set_grad(rand({300000}, DType::Float32, Device::cpu(), -1, 1));
      adam.step();
    }
    results[threads - 1] = p.to_vector<float>();
  }
  set_num_threads(saved);
  CHECK(results[0] == results[1]);
}
