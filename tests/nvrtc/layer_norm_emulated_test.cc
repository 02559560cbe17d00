// The layer-norm kernels (kernels/cuda/layer_norm.cuh) run on the host (emulated_kernel.h: each
// CUDA thread a fiber, blocks one after another, shared memory, __syncthreads and the warp
// shuffles) on layer_norm.cu's grids, against a reference computed here in double: the forward
// (a warp per row up to 1,024 elements, a block per row past it) and both gradients, in one
// launch and in two, over rows that leave warps and column blocks partly idle, with and without
// gamma and beta. The one-launch gradient must give the two launches' bits (the same trees).
// The [cuda] tests check the device's bits against eager.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "tests/nvrtc/emulated_kernel.h"

using namespace encore;

namespace {

constexpr const char* kSource = R"cuda(
#include "kernels/cuda/layer_norm.cuh"
using namespace encore::kernels::cuda;
// layer_norm.cu's launches; `two` takes the gradient's two launches where it would take one.
template <typename T>
void forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, long long rows,
             long long cols, double eps) {
  with_row_group(cols, [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    emulate_launch(row_blocks<kGroup>(rows), kBlockThreads<kGroup>, [&] {
      layer_norm_kernel<kGroup, T>(x, gamma, beta, y, mean, rstd, rows, cols, eps);
    });
  });
}
template <typename T>
bool backward(const T* x, const T* mean, const T* rstd, const T* gy, const T* gamma, T* gx,
              T* ggamma, T* gbeta, long long rows, long long cols, bool two) {
  const LayerNormGradGrid grid = layer_norm_grad_grid(rows, cols);
  if (grid.one_launch && !two) {
    emulate_launch(grid.param_blocks + grid.x_blocks, kParamThreads, [&] {
      layer_norm_grad_kernel<T>(x, mean, rstd, gy, gamma, gx, ggamma, gbeta, rows, cols,
                                grid.param_blocks, grid.x_blocks);
    });
    return true;
  }
  with_row_group(cols, [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    emulate_launch(row_blocks<kGroup>(rows), kBlockThreads<kGroup>, [&] {
      layer_norm_grad_x_kernel<kGroup, T>(x, mean, rstd, gy, gamma, gx, rows, cols);
    });
  });
  emulate_launch(grid.param_blocks, kParamThreads, [&] {
    layer_norm_grad_params_kernel<T>(x, mean, rstd, gy, ggamma, gbeta, rows, cols);
  });
  return false;
}
#define ENTRIES(T, suffix)                                                                  \
  extern "C" void forward_##suffix(const T* x, const T* gamma, const T* beta, T* y, T* mean, \
                                   T* rstd, long long rows, long long cols, double eps) {   \
    forward<T>(x, gamma, beta, y, mean, rstd, rows, cols, eps);                             \
  }                                                                                         \
  extern "C" bool backward_##suffix(const T* x, const T* mean, const T* rstd, const T* gy,  \
                                    const T* gamma, T* gx, T* ggamma, T* gbeta,             \
                                    long long rows, long long cols, bool two) {             \
    return backward<T>(x, mean, rstd, gy, gamma, gx, ggamma, gbeta, rows, cols, two);       \
  }
ENTRIES(float, f32)
ENTRIES(double, f64)
)cuda";

const testing::HostObject& layer_norm_kernels() {
  static const testing::HostObject object({}, kSource);
  return object;
}

template <typename T>
struct Entries {
  using Forward = void (*)(const T*, const T*, const T*, T*, T*, T*, long long, long long, double);
  using Backward = bool (*)(const T*, const T*, const T*, const T*, const T*, T*, T*, T*, long long,
                            long long, bool);
  Forward forward = layer_norm_kernels().function<Forward>(testing::typed_name<T>("forward"));
  Backward backward = layer_norm_kernels().function<Backward>(testing::typed_name<T>("backward"));
};

// |got - want| within a few ulps of T per term of the sums it came from, of their magnitude.
template <typename T>
bool near(double got, double want, double magnitude, int64_t terms) {
  return testing::within_ulps<T>(got, want, magnitude, 4 * static_cast<double>(terms + 4));
}

template <typename T>
void check_layer_norm(int64_t rows, int64_t cols, bool affine, std::mt19937& rng) {
  INFO(rows << " rows of " << cols << (affine ? ", gamma and beta" : ", no gamma nor beta"));
  const Entries<T> k;
  std::uniform_real_distribution<double> u(-2, 2);
  auto fill = [&](int64_t n) {
    std::vector<T> v(n);
    for (T& e : v) e = static_cast<T>(u(rng));
    return v;
  };
  const std::vector<T> x = fill(rows * cols), gy = fill(rows * cols);
  const std::vector<T> gamma = fill(cols), beta = fill(cols);
  const T* g = affine ? gamma.data() : nullptr;
  const double eps = 1e-5;

  std::vector<T> y(rows * cols), mean(rows), rstd(rows);
  k.forward(x.data(), g, affine ? beta.data() : nullptr, y.data(), mean.data(), rstd.data(), rows,
            cols, eps);
  std::vector<double> xhat(rows * cols);  // from the kernel's mean and rstd, as the gradient's
  int64_t wrong = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0, a = 0, q = 0;
    for (int64_t c = 0; c < cols; ++c) s += x[r * cols + c], a += std::abs(double(x[r * cols + c]));
    const double m = s / cols;
    for (int64_t c = 0; c < cols; ++c) q += (x[r * cols + c] - m) * (x[r * cols + c] - m);
    const double rs = 1 / std::sqrt(q / cols + eps);
    wrong += !near<T>(mean[r], m, a / cols, 1) + !near<T>(rstd[r], rs, rs, 1);
    for (int64_t c = 0; c < cols; ++c) {
      const double v = x[r * cols + c], h = (v - m) * rs;
      const double want = affine ? h * gamma[c] + beta[c] : h;
      const double size = (std::abs(v) + a / cols) * rs * (affine ? std::abs(gamma[c]) + 1 : 1) +
                          (affine ? std::abs(beta[c]) : 0);
      wrong += !near<T>(y[r * cols + c], want, size, 2);
      xhat[r * cols + c] = (v - mean[r]) * rstd[r];
    }
  }
  CHECK(wrong == 0);

  // The gradients, against double sums of the same terms.
  std::vector<T> gx(rows * cols), ggamma(cols), gbeta(cols);
  const bool one = k.backward(x.data(), mean.data(), rstd.data(), gy.data(), g, gx.data(),
                              ggamma.data(), gbeta.data(), rows, cols, false);
  CHECK(one == (cols <= 1024 && rows <= 4096));
  for (int64_t r = 0; r < rows; ++r) {
    double sg = 0, sgh = 0, size = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double v = gy[r * cols + c] * (affine ? double(gamma[c]) : 1.0);
      sg += v, sgh += v * xhat[r * cols + c],
          size += std::abs(v) * (1 + std::abs(xhat[r * cols + c]));
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double v = gy[r * cols + c] * (affine ? double(gamma[c]) : 1.0);
      const double want = rstd[r] * (v - sg / cols - xhat[r * cols + c] * sgh / cols);
      wrong += !near<T>(gx[r * cols + c], want, rstd[r] * (std::abs(v) + size / cols), cols);
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    double sgh = 0, sg = 0, size = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double v = gy[r * cols + c];
      sgh += v * xhat[r * cols + c], sg += v,
          size += std::abs(v) * (1 + std::abs(xhat[r * cols + c]));
    }
    wrong += !near<T>(ggamma[c], sgh, size, rows) + !near<T>(gbeta[c], sg, size, rows);
  }
  CHECK(wrong == 0);

  // The two launches, where the grid takes one: the same bits.
  if (one) {
    std::vector<T> gx2(rows * cols), ggamma2(cols), gbeta2(cols);
    k.backward(x.data(), mean.data(), rstd.data(), gy.data(), g, gx2.data(), ggamma2.data(),
               gbeta2.data(), rows, cols, true);
    CHECK(std::memcmp(gx.data(), gx2.data(), gx.size() * sizeof(T)) == 0);
    CHECK(std::memcmp(ggamma.data(), ggamma2.data(), cols * sizeof(T)) == 0);
    CHECK(std::memcmp(gbeta.data(), gbeta2.data(), cols * sizeof(T)) == 0);
  }
}

}  // namespace

TEST_CASE("layer norm and its gradients compute each row and column (emulated)",
          "[nvrtc][emulated]") {
  std::mt19937 rng(5);
  // Rows of 5 (most lanes idle), 100 (lanes take 3 or 4 elements), 1,024 (a warp's most) and
  // 1,100 (a block per row); 1 to 70 rows (the one-launch gradient's warps and column blocks
  // partly idle, its rows past one block's 8), 600 (gamma's and beta's lanes load their rows in
  // three batches, the last partly past the rows).
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 5}, {37, 5}, {70, 100}, {3, 1024}, {4, 1100}, {600, 13}})
    for (const bool affine : {true, false}) {
      check_layer_norm<float>(rows, cols, affine, rng);
      check_layer_norm<double>(rows, cols, affine, rng);
    }
}
