// The reduction kernels (kernels/cuda/reduce.cuh) run on the host (emulated_kernel.h: each CUDA
// thread a fiber, blocks one after another, shared memory, __syncthreads and the warp shuffles)
// on reduce.cu's plans, against references computed here: sum and mean (in double, within a few
// ulps) and max (exact, a NaN winning) over rows folded by a warp, a block and 1,024 threads,
// over columns split 1 to 32 ways, and over reduced and kept spaces of two groups; the sums again
// on one block, whose loops come round, with the same bits. A column's sum
// has the bits of column_sum_in_order, which the small GEMM kernel's bias gradient repeats.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/ops.h"
#include "tests/nvrtc/emulated_kernel.h"

using namespace encore;

namespace {

constexpr const char* kSource = R"cuda(
#include "kernels/cuda/reduce.cuh"
using namespace encore;
using namespace encore::kernels::cuda;
// reduce.cu's launches over x of `shape` folding the axes of `mask` (at least one of size > 1,
// no empty axis) into y, or on one block (its loops come round); returns the threads per row
// (rows), or 0 (columns).
template <typename R, bool kMean, typename T>
int reduce(const T* x, const long long* shape, int rank, unsigned mask, T* y, bool one_block) {
  Shape s(std::span<const int64_t>(reinterpret_cast<const int64_t*>(shape), rank));
  long long outputs = 1, count = 1;
  for (int d = 0; d < rank; ++d) (mask >> d & 1 ? count : outputs) *= shape[d];
  const ReducePlan p = make_reduce_plan(s, static_cast<uint8_t>(mask));
  if (p.inner_reduced) {
    int used = 0;
    with_reduce_group(outputs, count, [&](auto group) {
      constexpr int kGroup = decltype(group)::value;
      constexpr int kBlock = kBlockThreads<kGroup>;
      used = kGroup;
      emulate_launch(one_block ? 1 : blocks_for(outputs, kBlock / kGroup), kBlock, [&] {
        reduce_rows<R, kMean, kGroup>(x, y, p.kept, p.reduced, outputs, count);
      });
    });
    return used;
  }
  const int split = column_split(count), width = column_width(outputs, split);
  emulate_launch(EmulatedDim3{one_block ? 1 : blocks_for(outputs, width), 1, 1},
                 EmulatedDim3{static_cast<unsigned>(width), static_cast<unsigned>(split), 1},
                 [&] { reduce_columns<R, kMean>(x, y, p.kept, p.reduced, outputs, count); });
  return 0;
}
#define ENTRY(name, R, kMean, T)                                                      \
  extern "C" int name(const T* x, const long long* shape, int rank, unsigned mask, T* y, \
                      bool one_block) {                                                \
    return reduce<R, kMean, T>(x, shape, rank, mask, y, one_block);                   \
  }
ENTRY(sum_f32, SumOp, false, float)
ENTRY(mean_f32, SumOp, true, float)
ENTRY(max_f32, MaxOp, false, float)
ENTRY(sum_f64, SumOp, false, double)
ENTRY(max_i32, MaxOp, false, int)
extern "C" float column_sum_f32(const float* p, long long stride, long long n) {
  return column_sum_in_order(p, stride, n);
}
)cuda";

const testing::HostObject& reduce_kernels() {
  static const testing::HostObject object({}, kSource);
  return object;
}

template <typename T>
using Reduce = int (*)(const T*, const long long*, int, unsigned, T*, bool);

template <typename T>
Reduce<T> entry(const char* name) {
  return reduce_kernels().function<Reduce<T>>(name);
}

struct Case {
  std::vector<long long> shape;
  unsigned mask;
  int group;  // the threads per row, or 0: columns
};

// Each output's input elements (row-major over the kept axes; each output's elements in
// row-major order over the reduced axes).
std::vector<std::vector<int64_t>> folds_of(const Case& c) {
  const int rank = static_cast<int>(c.shape.size());
  std::vector<int64_t> strides(rank, 1);
  for (int d = rank - 2; d >= 0; --d) strides[d] = strides[d + 1] * c.shape[d + 1];
  int64_t total = 1;
  for (long long s : c.shape) total *= s;
  std::vector<std::vector<int64_t>> folds;
  std::vector<int64_t> out_of(total);
  // Output index of each element: its kept coordinates, row-major.
  for (int64_t e = 0; e < total; ++e) {
    int64_t o = 0;
    for (int d = 0; d < rank; ++d)
      if (!(c.mask >> d & 1)) o = o * c.shape[d] + e / strides[d] % c.shape[d];
    out_of[e] = o;
  }
  int64_t outputs = 1;
  for (int d = 0; d < rank; ++d)
    if (!(c.mask >> d & 1)) outputs *= c.shape[d];
  folds.resize(outputs);
  for (int64_t e = 0; e < total; ++e) folds[out_of[e]].push_back(e);
  return folds;
}

const Case kCases[] = {
    {{7, 300}, 0b10, 32},             // rows of 300: a warp each
    {{3, 9000}, 0b10, 1024},          // three long rows: 1,024 threads each
    {{100, 700}, 0b10, 256},          // past a warp's 512: a block each
    {{40, 50}, 0b01, 0},              // columns of 40: split 2
    {{600, 37}, 0b01, 0},             // columns of 600: split 32, a partial tile of 32
    {{4, 5, 6}, 0b101, 32},           // a reduced space of two groups
    {{4, 5, 6}, 0b010, 0},            // a kept space of two groups
    {{2, 1, 3, 1, 70}, 0b11101, 32},  // size-1 axes dropped
    {{2, 40000}, 0b10, 1024},         // rows of 40,000: 3 batches of loads per thread
    {{3, 16400}, 0b01, 0},            // 16,400 columns: tiles of 32
    {{100, 300}, 0b01, 0},            // split 4: tiles of 8
};

}  // namespace

TEST_CASE("sum, mean and max fold rows and columns on each plan (emulated)", "[nvrtc][emulated]") {
  std::mt19937 rng(43);
  std::uniform_real_distribution<double> u(-1, 1);
  for (const Case& c : kCases) {
    INFO("rank " << c.shape.size() << ", mask " << c.mask << ", last " << c.shape.back());
    const std::vector<std::vector<int64_t>> folds = folds_of(c);
    const int64_t outputs = static_cast<int64_t>(folds.size()), count = folds[0].size();
    std::vector<double> xd(outputs * count);
    for (double& v : xd) v = u(rng);
    std::vector<float> xf(xd.begin(), xd.end());
    std::vector<int> xi(xd.size());
    for (size_t i = 0; i < xd.size(); ++i) xi[i] = static_cast<int>(xd[i] * 1000);
    xf[folds[outputs - 1][count / 2]] = NAN;  // the last output's max and sum are NaN

    std::vector<float> sum(outputs), mean(outputs), max(outputs), sum_one_block(outputs);
    std::vector<double> sum64(outputs);
    std::vector<int> maxi(outputs);
    const int rank = static_cast<int>(c.shape.size());
    CHECK(entry<float>("sum_f32")(xf.data(), c.shape.data(), rank, c.mask, sum.data(), false) ==
          c.group);
    entry<float>("mean_f32")(xf.data(), c.shape.data(), rank, c.mask, mean.data(), false);
    entry<float>("max_f32")(xf.data(), c.shape.data(), rank, c.mask, max.data(), false);
    entry<double>("sum_f64")(xd.data(), c.shape.data(), rank, c.mask, sum64.data(), false);
    entry<int>("max_i32")(xi.data(), c.shape.data(), rank, c.mask, maxi.data(), false);
    entry<float>("sum_f32")(xf.data(), c.shape.data(), rank, c.mask, sum_one_block.data(), true);
    CHECK(std::memcmp(sum.data(), sum_one_block.data(), outputs * sizeof(float)) == 0);
    int64_t wrong = 0;
    for (int64_t o = 0; o < outputs; ++o) {
      double s = 0, s64 = 0, size = 0, m = -INFINITY;
      int mi = INT32_MIN;
      for (int64_t e : folds[o]) {
        s += xf[e], s64 += xd[e], size += std::abs(xd[e]), m = std::max(m, double(xf[e]));
        mi = std::max(mi, xi[e]);
      }
      const double ulps = 4.0 * static_cast<double>(count + 4);
      if (o == outputs - 1) {
        wrong += !std::isnan(sum[o]) + !std::isnan(mean[o]) + !std::isnan(max[o]);
      } else {
        wrong += !testing::within_ulps<float>(sum[o], s, size, ulps);
        wrong += !testing::within_ulps<float>(mean[o], s / count, size / count, ulps);
        wrong += max[o] != static_cast<float>(m);
      }
      wrong += !testing::within_ulps<double>(sum64[o], s64, size, ulps);
      wrong += maxi[o] != mi;
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("a column's sum has the bits of column_sum_in_order (emulated)", "[nvrtc][emulated]") {
  const auto sum = entry<float>("sum_f32");
  const auto in_order =
      reduce_kernels().function<float (*)(const float*, long long, long long)>("column_sum_f32");
  std::mt19937 rng(47);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const long long rows : {1LL, 31LL, 32LL, 100LL, 513LL, 1500LL}) {  // splits 1 to 32
    INFO(rows << " rows");
    const long long cols = 45;
    std::vector<float> x(rows * cols);
    for (float& v : x) v = u(rng);
    std::vector<float> y(cols);
    const long long shape[2] = {rows, cols};
    sum(x.data(), shape, 2, 0b01, y.data(), false);
    int64_t wrong = 0;
    for (long long c = 0; c < cols; ++c) {
      const float want = in_order(x.data() + c, cols, rows);
      wrong += std::memcmp(&y[c], &want, sizeof(float)) != 0;
    }
    CHECK(wrong == 0);
  }
}
