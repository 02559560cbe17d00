// The batch-norm kernels (kernels/cuda/batch_norm.cuh) run on the host (emulated_kernel.h: each
// CUDA thread a fiber, blocks one after another, shared memory, __syncthreads and the warp
// shuffles) on batch_norm.cu's grids, against a reference computed here in double: the batch
// statistics, the normalisation (batch and running statistics, with and without gamma and beta),
// the gradient and the running-statistics update, over channels of fewer elements than a block
// has threads, of more (a thread's elements crossing from one batch to the next), and of one
// element per batch. Each kernel also runs on fewer blocks than channels (a block's loop over
// them, its shared memory used again) and must give the same bits. The [cuda] tests check the
// device against the CPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tests/nvrtc/emulated_kernel.h"

using namespace encore;

namespace {

constexpr const char* kSource = R"cuda(
#include "kernels/cuda/batch_norm.cuh"
using namespace encore::kernels::cuda;
// batch_norm.cu's launches, on its grids, or on `blocks` blocks (channels in y for the
// normalisation) when not 0.
template <typename T>
void forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* var, long long n,
             long long c, long long s, double eps, unsigned blocks) {
  const ChannelLayout l{n, c, s};
  emulate_launch(blocks != 0 ? blocks : channel_blocks(c), kChannelThreads,
                 [&] { stats_kernel<T>(x, mean, var, l); });
  if (l.count() == 0) return;
  const dim3 grid = blocks != 0 ? dim3(1, blocks) : normalize_grid(l);
  emulate_launch(grid, dim3(kThreads),
                 [&] { normalize_kernel<T>(x, y, mean, var, gamma, beta, eps, l); });
}
template <typename T>
void backward(const T* x, const T* mean, const T* var, const T* gy, const T* gamma, T* gx,
              T* ggamma, T* gbeta, long long n, long long c, long long s, double eps,
              unsigned blocks) {
  const ChannelLayout l{n, c, s};
  emulate_launch(blocks != 0 ? blocks : channel_blocks(c), kChannelThreads, [&] {
    grad_kernel<T>(x, mean, var, gy, gamma, gx, ggamma, gbeta, eps, l);
  });
}
template <typename T>
void update(T* rm, T* rv, const T* bm, const T* bv, double momentum, double unbias, long long c) {
  emulate_launch(blocks_for(c), kThreads,
                 [&] { stats_update_kernel<T>(rm, rv, bm, bv, momentum, unbias, c); });
}
#define ENTRIES(T, suffix)                                                                       \
  extern "C" void forward_##suffix(const T* x, const T* gamma, const T* beta, T* y, T* mean,      \
                                   T* var, long long n, long long c, long long s, double eps,     \
                                   unsigned blocks) {                                            \
    forward<T>(x, gamma, beta, y, mean, var, n, c, s, eps, blocks);                              \
  }                                                                                              \
  extern "C" void backward_##suffix(const T* x, const T* mean, const T* var, const T* gy,        \
                                    const T* gamma, T* gx, T* ggamma, T* gbeta, long long n,     \
                                    long long c, long long s, double eps, unsigned blocks) {     \
    backward<T>(x, mean, var, gy, gamma, gx, ggamma, gbeta, n, c, s, eps, blocks);               \
  }                                                                                              \
  extern "C" void update_##suffix(T* rm, T* rv, const T* bm, const T* bv, double momentum,       \
                                  double unbias, long long c) {                                  \
    update<T>(rm, rv, bm, bv, momentum, unbias, c);                                              \
  }
ENTRIES(float, f32)
ENTRIES(double, f64)
)cuda";

const testing::HostObject& batch_norm_kernels() {
  static const testing::HostObject object({}, kSource);
  return object;
}

template <typename T>
struct Entries {
  using Forward = void (*)(const T*, const T*, const T*, T*, T*, T*, long long, long long,
                           long long, double, unsigned);
  using Backward = void (*)(const T*, const T*, const T*, const T*, const T*, T*, T*, T*, long long,
                            long long, long long, double, unsigned);
  using Update = void (*)(T*, T*, const T*, const T*, double, double, long long);
  Forward forward = batch_norm_kernels().function<Forward>(testing::typed_name<T>("forward"));
  Backward backward = batch_norm_kernels().function<Backward>(testing::typed_name<T>("backward"));
  Update update = batch_norm_kernels().function<Update>(testing::typed_name<T>("update"));
};

// |got - want| within a few ulps of T per term of the sums it came from, of their magnitude.
template <typename T>
bool near(double got, double want, double magnitude, int64_t terms) {
  return testing::within_ulps<T>(got, want, magnitude, 4 * static_cast<double>(terms + 4));
}

struct Dims {
  int64_t n, c, s;
  int64_t at(int64_t b, int64_t ch, int64_t j) const { return (b * c + ch) * s + j; }
};

template <typename T>
void check_batch_norm(const Dims d, bool affine, std::mt19937& rng) {
  INFO("x [" << d.n << ", " << d.c << ", " << d.s << "]"
             << (affine ? ", gamma and beta" : ", no gamma nor beta"));
  const Entries<T> k;
  std::uniform_real_distribution<double> u(-2, 2);
  auto fill = [&](int64_t size, double offset) {
    std::vector<T> v(size);
    for (T& e : v) e = static_cast<T>(u(rng) + offset);
    return v;
  };
  const int64_t size = d.n * d.c * d.s, count = d.n * d.s;
  const std::vector<T> x = fill(size, 3), gy = fill(size, 0);  // a mean away from 0
  const std::vector<T> gamma = fill(d.c, 0), beta = fill(d.c, 0);
  const T* g = affine ? gamma.data() : nullptr;
  const T* b = affine ? beta.data() : nullptr;
  const double eps = 1e-5;

  std::vector<T> y(size), mean(d.c), var(d.c);
  k.forward(x.data(), g, b, y.data(), mean.data(), var.data(), d.n, d.c, d.s, eps, 0);
  std::vector<T> gx(size), ggamma(d.c), gbeta(d.c);
  k.backward(x.data(), mean.data(), var.data(), gy.data(), g, gx.data(), ggamma.data(),
             gbeta.data(), d.n, d.c, d.s, eps, 0);
  int64_t wrong = 0;
  for (int64_t ch = 0; ch < d.c; ++ch) {
    INFO("channel " << ch);
    double sum = 0, squares = 0;
    for (int64_t bi = 0; bi < d.n; ++bi)
      for (int64_t j = 0; j < d.s; ++j) sum += x[d.at(bi, ch, j)];
    const double m = sum / static_cast<double>(count);
    for (int64_t bi = 0; bi < d.n; ++bi)
      for (int64_t j = 0; j < d.s; ++j)
        squares += (x[d.at(bi, ch, j)] - m) * (x[d.at(bi, ch, j)] - m);
    const double v = squares / static_cast<double>(count);
    CHECK(near<T>(mean[ch], m, std::abs(m), 1));
    CHECK(near<T>(var[ch], v, v, 1));
    // The normalisation and the gradient from the kernel's statistics, as they use them.
    const double is = 1 / std::sqrt(static_cast<double>(var[ch]) + eps);
    const double gm = affine ? static_cast<double>(gamma[ch]) : 1.0;
    const double bt = affine ? static_cast<double>(beta[ch]) : 0.0;
    double sum_gy = 0, sum_gy_xhat = 0;
    for (int64_t bi = 0; bi < d.n; ++bi)
      for (int64_t j = 0; j < d.s; ++j) {
        const int64_t i = d.at(bi, ch, j);
        const double xhat = (x[i] - static_cast<double>(mean[ch])) * is;
        wrong += !near<T>(y[i], xhat * gm + bt, std::abs(xhat * gm) + std::abs(bt), 2);
        sum_gy += gy[i];
        sum_gy_xhat += gy[i] * xhat;
      }
    CHECK(near<T>(gbeta[ch], sum_gy, std::abs(sum_gy), count));
    CHECK(near<T>(ggamma[ch], sum_gy_xhat, std::abs(sum_gy_xhat), count));
    const double mm = static_cast<double>(count);
    for (int64_t bi = 0; bi < d.n; ++bi)
      for (int64_t j = 0; j < d.s; ++j) {
        const int64_t i = d.at(bi, ch, j);
        const double xhat = (x[i] - static_cast<double>(mean[ch])) * is;
        const double want = gm * is * (gy[i] - sum_gy / mm - xhat * sum_gy_xhat / mm);
        const double magnitude = std::abs(gm * is) * (std::abs(gy[i]) + std::abs(sum_gy / mm) +
                                                      std::abs(xhat * sum_gy_xhat / mm));
        wrong += !near<T>(gx[i], want, magnitude, 4);
      }
  }
  CHECK(wrong == 0);

  // Fewer blocks than channels: each block loops over channels, its shared memory used again.
  for (const unsigned blocks : {1u, 2u}) {
    INFO(blocks << " blocks");
    std::vector<T> y2(size), mean2(d.c), var2(d.c), gx2(size), ggamma2(d.c), gbeta2(d.c);
    k.forward(x.data(), g, b, y2.data(), mean2.data(), var2.data(), d.n, d.c, d.s, eps, blocks);
    k.backward(x.data(), mean.data(), var.data(), gy.data(), g, gx2.data(), ggamma2.data(),
               gbeta2.data(), d.n, d.c, d.s, eps, blocks);
    CHECK(testing::same_bits(mean2, mean));
    CHECK(testing::same_bits(var2, var));
    CHECK(testing::same_bits(y2, y));
    CHECK(testing::same_bits(gx2, gx));
    CHECK(testing::same_bits(ggamma2, ggamma));
    CHECK(testing::same_bits(gbeta2, gbeta));
  }
}

}  // namespace

TEST_CASE("batch norm's statistics, normalisation and gradient per channel block (emulated)",
          "[nvrtc][emulated]") {
  std::mt19937 rng(53);
  // 111 elements a channel (fewer than a block's 512 threads), 1,400 (a thread's elements cross
  // batches), 5 (one per batch: a [N, C] input).
  for (const Dims d : {Dims{3, 4, 37}, Dims{2, 3, 700}, Dims{5, 6, 1}}) {
    check_batch_norm<float>(d, true, rng);
    check_batch_norm<double>(d, d.s != 37, rng);
  }
}

TEST_CASE("batch norm's running statistics take the batch's, the variance unbiased (emulated)",
          "[nvrtc][emulated]") {
  const Entries<float> k;
  const int64_t c = 300;  // two blocks of 256 threads
  std::vector<float> rm(c), rv(c), bm(c), bv(c);
  for (int64_t i = 0; i < c; ++i) {
    rm[i] = static_cast<float>(i) * 0.5f;
    rv[i] = 1.0f + static_cast<float>(i % 7);
    bm[i] = -static_cast<float>(i);
    bv[i] = 0.25f * static_cast<float>(i % 5);
  }
  const std::vector<float> rm0 = rm, rv0 = rv;
  const double momentum = 0.1, unbias = 10.0 / 9.0;
  k.update(rm.data(), rv.data(), bm.data(), bv.data(), momentum, unbias, c);
  int64_t wrong = 0;
  for (int64_t i = 0; i < c; ++i) {
    const double want_m = (1 - momentum) * rm0[i] + momentum * bm[i];
    const double want_v = (1 - momentum) * rv0[i] + momentum * bv[i] * unbias;
    wrong += rm[i] != static_cast<float>(want_m);
    wrong += rv[i] != static_cast<float>(want_v);
  }
  CHECK(wrong == 0);
}
