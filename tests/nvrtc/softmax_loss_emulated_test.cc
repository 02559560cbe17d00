// The softmax and loss kernels (kernels/cuda/softmax_loss.cuh) run on the host
// (emulated_kernel.h: each CUDA thread a fiber, blocks one after another, shared memory,
// __syncthreads and the warp shuffles) on softmax_loss.cu's grids, against references computed
// here in double: softmax and log-softmax and their gradients on each thread group (a thread, a
// warp, a block, 1,024 threads per lane); the cross-entropy loss (a warp on four rows at once,
// over one block or several that join their sums in a scratch, whichever block finishes last) and
// its gradient, with ignored rows and an out-of-range label (NaN, reported); accuracy's
// first maximum (ties, NaN); the mean squared error. The [cuda] tests check the device's bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/cuda.h"
#include "runtime/ops.h"
#include "tests/nvrtc/emulated_kernel.h"

using namespace encore;

namespace {

constexpr const char* kSource = R"cuda(
#include "kernels/cuda/softmax_loss.cuh"
using namespace encore::kernels::cuda;
using encore::cuda::DeviceErrorKind;
using encore::cuda::DeviceErrorSlot;
// softmax_loss.cu's launches: `grad` runs the gradient of y (gy in, gx out); returns the group.
template <typename T>
int softmax(bool log, bool grad, const T* y, const T* gy, T* out, long long outer, long long n,
            long long inner) {
  const encore::kernels::AxisSplit l{outer, n, inner};
  const long long lanes = outer * inner;
  int used = 0;
  with_group(l, [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    constexpr int kBlock = kBlockThreads<kGroup>;
    used = kGroup;
    emulate_launch(blocks_for(lanes, kBlock / kGroup), kBlock, [&] {
      if (grad && log) softmax_grad_kernel<true, kGroup>(y, gy, out, lanes, n, inner);
      if (grad && !log) softmax_grad_kernel<false, kGroup>(y, gy, out, lanes, n, inner);
      if (!grad && log) softmax_kernel<true, kGroup>(y, out, lanes, n, inner);
      if (!grad && !log) softmax_kernel<false, kGroup>(y, out, lanes, n, inner);
    });
  });
  return used;
}
// Returns 0 where the loss's blocks each counted themselves once in its scratch (the count is
// set to 0 before the kernel, as softmax_loss.cu's memset does; the rest starts as NaN).
template <typename T>
unsigned losses(const T* x, const long long* labels, const T* gy, T* loss, T* gx, T* accuracy,
                long long rows, long long classes, long long ignore, DeviceErrorSlot errors) {
  LossParts parts;
  std::memset(&parts, 0xff, sizeof(parts));
  parts.done = 0;
  const unsigned blocks = cross_entropy_blocks(rows);
  emulate_launch(blocks, kCrossEntropyThreads, [&] {
    cross_entropy_kernel<T, long long>(x, labels, loss, rows, classes, ignore,
                                       blocks > 1 ? &parts : nullptr, errors,
                                       DeviceErrorKind::Label);
  });
  emulate_launch(cross_entropy_grad_blocks(rows), kThreads, [&] {
    cross_entropy_grad_kernel<T, long long>(x, labels, gy, gx, rows, classes, ignore, errors,
                                            DeviceErrorKind::Label,
                                            encore::Op::SoftmaxCrossEntropyGrad);
  });
  emulate_launch(1, kLossThreads, [&] {
    accuracy_kernel<T, long long>(x, labels, accuracy, rows, classes, ignore, errors);
  });
  return blocks > 1 ? parts.done != blocks : parts.done != 0;
}
template <typename T>
void mse(const T* a, const T* b, T* out, long long n) {
  emulate_launch(1, kLossThreads, [&] { mean_squared_error_kernel<T>(a, b, out, n); });
}
#define ENTRIES(T, s)                                                                          \
  extern "C" int softmax_##s(bool log, bool grad, const T* y, const T* gy, T* out,            \
                             long long outer, long long n, long long inner) {                 \
    return softmax<T>(log, grad, y, gy, out, outer, n, inner);                                \
  }                                                                                            \
  extern "C" unsigned losses_##s(const T* x, const long long* labels, const T* gy, T* loss, T* gx, \
                             T* accuracy, long long rows, long long classes, long long ignore, \
                             DeviceErrorSlot errors) {                                         \
    return losses<T>(x, labels, gy, loss, gx, accuracy, rows, classes, ignore, errors);               \
  }                                                                                            \
  extern "C" void mse_##s(const T* a, const T* b, T* out, long long n) { mse<T>(a, b, out, n); }
ENTRIES(float, f32)
ENTRIES(double, f64)
)cuda";

const testing::HostObject& softmax_loss_kernels() {
  static const testing::HostObject object({}, kSource);
  return object;
}

template <typename T>
struct Entries {
  using Softmax = int (*)(bool, bool, const T*, const T*, T*, long long, long long, long long);
  using Losses = unsigned (*)(const T*, const long long*, const T*, T*, T*, T*, long long,
                              long long, long long, cuda::DeviceErrorSlot);
  using Mse = void (*)(const T*, const T*, T*, long long);
  Softmax softmax = softmax_loss_kernels().function<Softmax>(testing::typed_name<T>("softmax"));
  Losses losses = softmax_loss_kernels().function<Losses>(testing::typed_name<T>("losses"));
  Mse mse = softmax_loss_kernels().function<Mse>(testing::typed_name<T>("mse"));
};

// Whether got is within a few ulps of T per term of the sums it came from, of their magnitude.
template <typename T>
bool near(double got, double want, double magnitude, int64_t terms) {
  return testing::within_ulps<T>(got, want, magnitude, 8 * static_cast<double>(terms + 4));
}

template <typename T>
std::vector<T> uniform(size_t n, double lo, double hi, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (T& e : v) e = static_cast<T>(u(rng));
  return v;
}

template <typename T>
void check_softmax(int64_t outer, int64_t n, int64_t inner, int want_group, std::mt19937& rng) {
  INFO("[" << outer << ", " << n << ", " << inner << "], " << sizeof(T) * 8 << "-bit");
  const Entries<T> k;
  const size_t size = outer * n * inner;
  const std::vector<T> x = uniform<T>(size, -4, 4, rng), gy = uniform<T>(size, -1, 1, rng);
  for (const bool log : {false, true}) {
    INFO((log ? "log_softmax" : "softmax"));
    std::vector<T> y(size), gx(size);
    CHECK(k.softmax(log, false, x.data(), nullptr, y.data(), outer, n, inner) == want_group);
    CHECK(k.softmax(log, true, y.data(), gy.data(), gx.data(), outer, n, inner) == want_group);
    int64_t wrong = 0;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        auto at = [&](int64_t i) { return (o * n + i) * inner + in; };
        double m = -INFINITY, s = 0, dot = 0, dsize = 0;
        for (int64_t i = 0; i < n; ++i) m = std::max(m, double(x[at(i)]));
        for (int64_t i = 0; i < n; ++i) s += std::exp(x[at(i)] - m);
        for (int64_t i = 0; i < n; ++i) {
          const double want = log ? x[at(i)] - m - std::log(s) : std::exp(x[at(i)] - m) / s;
          wrong += !near<T>(y[at(i)], want, std::abs(x[at(i)]) + std::abs(m) + 1, n);
          const double term = log ? double(gy[at(i)]) : double(gy[at(i)]) * y[at(i)];
          dot += term, dsize += std::abs(term);
        }
        for (int64_t i = 0; i < n; ++i) {
          const double yi = y[at(i)], g = gy[at(i)];
          const double want = log ? g - std::exp(yi) * dot : yi * (g - dot);
          wrong += !near<T>(gx[at(i)], want, std::abs(g) + dsize, n);
        }
      }
    CHECK(wrong == 0);
  }
}

template <typename T>
void check_losses(int64_t rows, int64_t classes, std::mt19937& rng) {
  INFO(rows << " rows of " << classes << " classes, " << sizeof(T) * 8 << "-bit");
  const Entries<T> k;
  const int64_t ignore = -100;
  std::vector<T> x = uniform<T>(rows * classes, -3, 3, rng);
  std::vector<long long> labels(rows);
  std::uniform_int_distribution<long long> pick(0, classes - 1);
  for (int64_t i = 0; i < rows; ++i) labels[i] = i % 7 == 3 ? ignore : pick(rng);
  if (rows > 5) {  // a tie: accuracy's first maximum is the first of them
    for (int64_t j = 0; j < classes; ++j) x[5 * classes + j] = 1;
    labels[5] = 0;
  }
  const T gy = T(0.75);
  T loss = 0, accuracy = 0;
  std::vector<T> gx(rows * classes);
  testing::HostErrorSlot errors;
  const unsigned done = k.losses(x.data(), labels.data(), &gy, &loss, gx.data(), &accuracy, rows,
                                 classes, ignore, errors.slot());
  CHECK(errors.claim == 0);
  CHECK(done == 0);

  // The first maximum of a row (a NaN before any number, as torch.argmax).
  auto first_max = [&](const std::vector<T>& v, int64_t i) {
    int64_t arg = 0;
    for (int64_t j = 1; j < classes; ++j) {
      const T a = v[i * classes + j], best = v[i * classes + arg];
      if (!std::isnan(best) && (std::isnan(a) || a > best)) arg = j;
    }
    return arg;
  };
  double total = 0, size = 0;
  int64_t count = 0, correct = 0, wrong = 0;
  for (int64_t i = 0; i < rows; ++i)
    if (labels[i] != ignore) ++count;
  for (int64_t i = 0; i < rows; ++i) {
    const T* row = &x[i * classes];
    const T* grow = &gx[i * classes];
    if (labels[i] == ignore) {
      for (int64_t j = 0; j < classes; ++j) wrong += grow[j] != 0;
      continue;
    }
    correct += first_max(x, i) == labels[i];
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < classes; ++j) m = std::max(m, double(row[j]));
    for (int64_t j = 0; j < classes; ++j) s += std::exp(row[j] - m);
    total += m + std::log(s) - row[labels[i]];
    size += std::abs(m) + std::log(s) + std::abs(row[labels[i]]);
    for (int64_t j = 0; j < classes; ++j) {
      const double want = (std::exp(row[j] - m) / s - (j == labels[i])) * gy / count;
      wrong += !near<T>(grow[j], want, 1, classes);
    }
  }
  CHECK(wrong == 0);
  CHECK(near<T>(loss, total / count, size / count, rows));
  CHECK(accuracy == static_cast<T>(double(correct) / double(count)));

  // A NaN in a row: that row's first maximum, and the loss NaN.
  if (rows > 5 && classes > 3) {
    std::vector<T> with_nan = x;
    with_nan[4 * classes + 2] = NAN;
    std::vector<long long> l = labels;
    l[4] = 2;
    int64_t hits = 0;
    for (int64_t i = 0; i < rows; ++i) hits += l[i] != ignore && first_max(with_nan, i) == l[i];
    k.losses(with_nan.data(), l.data(), &gy, &loss, gx.data(), &accuracy, rows, classes, ignore,
             errors.slot());
    CHECK(std::isnan(loss));
    CHECK(accuracy == static_cast<T>(double(hits) / double(count)));
    k.losses(x.data(), labels.data(), &gy, &loss, gx.data(), &accuracy, rows, classes, ignore,
             errors.slot());  // gx as before, for the comparison below
  }

  // A label out of range: the loss and accuracy NaN, its gradient row NaN, the others as before,
  // and the report names the label, its row and the classes.
  std::vector<long long> bad = labels;
  bad[rows - 1] = classes;
  std::vector<T> gx_bad(rows * classes);
  testing::HostErrorSlot e;
  k.losses(x.data(), bad.data(), &gy, &loss, gx_bad.data(), &accuracy, rows, classes, ignore,
           e.slot());
  CHECK(std::isnan(loss));
  CHECK(std::isnan(accuracy));
  CHECK(e.claim == 1);
  CHECK(e.record[1] == classes);
  CHECK(e.record[2] == rows - 1);
  CHECK(e.record[3] == classes);
  for (int64_t j = 0; j < classes; ++j) CHECK(std::isnan(gx_bad[(rows - 1) * classes + j]));
  for (int64_t i = 0; i + 1 < rows; ++i)
    for (int64_t j = 0; j < classes; ++j) wrong += gx_bad[i * classes + j] != gx[i * classes + j];
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("softmax and log-softmax and their gradients on each thread group (emulated)",
          "[nvrtc][emulated]") {
  std::mt19937 rng(3);
  for (int dtype = 0; dtype < 2; ++dtype) {
    auto check = [&](int64_t outer, int64_t n, int64_t inner, int group) {
      dtype == 0 ? check_softmax<float>(outer, n, inner, group, rng)
                 : check_softmax<double>(outer, n, inner, group, rng);
    };
    check(3, 20, 5, 1);       // lanes across the inner axis, a thread each
    check(2, 9000, 1, 1024);  // few long lanes: a whole block of 1,024 each
    check(3, 1500, 1, 256);   // past a warp's 1,024: a block of 256
    check(37, 100, 1, 32);    // a warp per row, some lanes with one element fewer
    check(5, 7, 1, 32);       // rows shorter than a warp
  }
}

TEST_CASE("cross-entropy, its gradient and accuracy over ignored and bad labels (emulated)",
          "[nvrtc][emulated]") {
  std::mt19937 rng(17);
  // The loss: 300 rows, ten blocks of 8 warps over four rows each, the last partly idle; 9 and 3,
  // one block (no scratch); 96 classes (three elements a lane), 5 (most lanes idle), 1.
  for (const auto& [rows, classes] :
       std::vector<std::pair<int64_t, int64_t>>{{300, 96}, {300, 5}, {9, 40}, {3, 1}}) {
    check_losses<float>(rows, classes, rng);
    check_losses<double>(rows, classes, rng);
  }
  check_losses<float>(1100, 3, rng);  // the gradient's 128 blocks (its cap) take rows twice
  check_losses<float>(4200, 3, rng);  // the loss's 128 blocks (its cap) take rows twice
}

TEST_CASE("the mean squared error sums in double over one block (emulated)", "[nvrtc][emulated]") {
  std::mt19937 rng(23);
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{5000}}) {
    INFO(n << " elements");
    const Entries<float> k;
    const std::vector<float> a = uniform<float>(n, -2, 2, rng), b = uniform<float>(n, -2, 2, rng);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    float out = 0;
    k.mse(a.data(), b.data(), &out, n);
    CHECK(near<float>(out, sum / n, sum / n, n));
  }
}
